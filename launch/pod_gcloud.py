"""The launcher's gcloud transport: gcloud's children (each ended when pod.sh is interrupted or
exits), gcloud's defaults, and the slice's connection (Connection, a part of launch/pod.py's Pod):
the zone and project, the ssh arguments, and describe, with transient errors retried.
"""
import re
import shutil
import subprocess
import sys
import time

from pod_common import (ALL, BAD_INPUT, CONNECT_TIMEOUT_S, Exit, FORMAT, GCLOUD, GCLOUD_RETRY_S,
                        GCLOUD_TRIES, KEEPALIVE_S, die, q, shell_rc, show, warn)


class Gcloud:
  """Runs gcloud; every child is ended when pod.sh is interrupted or exits."""

  def __init__(self):
    self.children = set()

  def popen(self, args, **kwargs):
    proc = subprocess.Popen([GCLOUD, *map(str, args)], stdin=subprocess.DEVNULL, **kwargs)
    self.children.add(proc)
    return proc

  def run(self, args, timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT):
    """(exit code, output); after `timeout` s (0: none) SIGTERM, SIGKILL 10 s later: 124."""
    proc = self.popen(args, stdout=stdout, stderr=stderr)
    try:
      out, _ = proc.communicate(timeout=timeout or None)
    except subprocess.TimeoutExpired:
      self.end(proc)
      out, _ = proc.communicate()
      warn(f"'{show([GCLOUD, *args[:6]])} ...' timed out after {timeout} s")
      return 124, (out or b"").decode(errors="surrogateescape")
    finally:
      self.children.discard(proc)
    return shell_rc(proc.returncode), (out or b"").decode(errors="surrogateescape")

  def end(self, proc, grace=10):
    if proc.poll() is None:
      proc.terminate()
      try:
        proc.wait(timeout=grace)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    self.children.discard(proc)

  def end_all(self):
    for proc in list(self.children):
      try:
        proc.kill()
        proc.wait(timeout=5)
      except (OSError, subprocess.TimeoutExpired):
        pass
    self.children.clear()


def gcloud_config(key):
  for verb in ("get", "get-value"):
    try:
      proc = subprocess.run([GCLOUD, "config", verb, key], capture_output=True, text=True)
    except OSError:
      return ""
    if proc.returncode == 0:
      lines = proc.stdout.strip().splitlines()
      return lines[-1] if lines else ""
  return ""


class Connection:
  """The slice's connection, a part of pod.Pod (it sets tpu_args, conn_args, ssh_args, scp_args,
  again; describe sets state, accel and num_workers)."""

  def resolve(self):
    o = self.o
    if not o.zone:
      if not shutil.which(GCLOUD):
        die(f"no zone: pass --zone Z or set PODLAB_ZONE ('{GCLOUD}', whose default zone would be "
            "used, is not installed)")
      o.zone = gcloud_config("compute/zone")
      if not o.zone:
        die("no zone: pass --zone Z, set PODLAB_ZONE, or set gcloud's default zone (gcloud config "
            "set compute/zone us-central2-b)")
    if not o.project and shutil.which(GCLOUD):
      o.project = gcloud_config("core/project")
    if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z]", o.zone):
      die(f"--zone '{o.zone}' is not a zone name like us-central2-b (flag --zone, PODLAB_ZONE or "
          "gcloud's compute/zone)")
    if o.project and not re.fullmatch(r"([a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", o.project):
      die(f"--project '{o.project}' is not a project id (flag --project, PODLAB_PROJECT or "
          "gcloud's core/project)")
    self.tpu_args = [f"--zone={o.zone}"] + ([f"--project={o.project}"] if o.project else [])
    self.conn_args = self.tpu_args + (["--internal-ip"] if o.internal_ip else []) + o.gcloud_flags
    ssh_opts = [f"-oServerAliveInterval={KEEPALIVE_S}", "-oServerAliveCountMax=4",
                f"-oConnectTimeout={CONNECT_TIMEOUT_S}"]
    self.ssh_args = [f"--ssh-flag={f}" for f in ssh_opts + o.ssh_flags]
    self.scp_args = [f"--scp-flag={f}" for f in ssh_opts]
    again = ""
    if o.zone_given:
      again += f" --zone={o.zone}"
    if o.project_given:
      again += f" --project={o.project}"
    if o.internal_ip:
      again += " --internal-ip"
    for f in o.gcloud_flags:
      again += f" --gcloud-flag={q(f)}"
    self.again = again

  def later(self, sub):
    return f"launch/pod.sh {self.o.name} {sub}{self.again}"

  def require_gcloud(self):
    if not shutil.which(GCLOUD):
      die(f"'{GCLOUD}' not found: install the Google Cloud SDK "
          "(https://cloud.google.com/sdk/docs/install), then run gcloud auth login (or set GCLOUD "
          "to its path)")

  def ssh_args_for(self, worker, command):
    return ["compute", "tpus", "tpu-vm", "ssh", self.o.name, f"--worker={worker}", *self.conn_args,
            *self.ssh_args, f"--command={command}"]

  def ssh(self, worker, timeout, command):
    return self.gc.run(self.ssh_args_for(worker, command), timeout)

  def describe(self):
    """Sets state, accel, num_workers; returns None, or gcloud's error (its stderr)."""
    proc = self.gc.popen(["compute", "tpus", "tpu-vm", "describe", self.o.name, *self.tpu_args,
                          f"--format={FORMAT}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
      out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
      self.gc.end(proc)
      return "describe timed out after 120 s"
    finally:
      self.gc.children.discard(proc)
    if proc.returncode:
      return err.decode(errors="replace").strip() or f"gcloud exit code {proc.returncode}"
    fields = out.decode(errors="replace").split()
    if len(fields) != 3 or not fields[2].isdigit() or int(fields[2]) < 1:
      return f"unexpected describe output: {' '.join(fields)}"
    self.state, self.accel, self.num_workers = fields[0], fields[1], int(fields[2])
    return None

  def describe_retrying(self):
    """describe, with transient errors retried; None or the last error (a bad name: at once)."""
    error = None
    for n in range(GCLOUD_TRIES):
      error = self.describe()
      if error is None:
        return None
      if BAD_INPUT.search(error):
        return error
      if n < GCLOUD_TRIES - 1:
        warn(f"describe failed ({error.splitlines()[-1]}); trying again in {GCLOUD_RETRY_S:g} s "
             f"({n + 1} of {GCLOUD_TRIES} tries)")
        time.sleep(GCLOUD_RETRY_S)
    return error

  def describe_or_die(self):
    error = self.describe_retrying()
    if error is None:
      return
    print(error, file=sys.stderr)
    where = f"zone {self.o.zone}" + (f" of project {self.o.project}" if self.o.project else "")
    if BAD_INPUT.search(error):
      die(f"cannot describe TPU '{self.o.name}' in {where}; check the name, --zone and --project "
          f"(gcloud compute tpus tpu-vm list --zone={self.o.zone})")
    warn(f"FAILED: could not describe TPU '{self.o.name}' in {where} after {GCLOUD_TRIES} tries "
         "(gcloud or the network failed, not the name); nothing was started. Try again later "
         f"(PODLAB_GCLOUD_TRIES, PODLAB_GCLOUD_RETRY_S)")
    raise Exit(1)

  def check_worker_flag(self):
    w = self.o.worker
    if w and w != ALL and int(w) >= self.num_workers:
      die(f"--worker '{w}': TPU '{self.o.name}' has workers 0..{self.num_workers - 1}; pass "
          f"--worker=K with K in 0..{self.num_workers - 1}, or --worker=all")

  def require_ready(self):
    if self.state != "READY":
      warn(f"TPU '{self.o.name}' is {self.state}, not READY: its workers cannot be reached")
      raise Exit(1)
