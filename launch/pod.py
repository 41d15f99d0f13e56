r"""Runs podlab on every worker of a Cloud TPU pod slice. The run is detached from this terminal: it
outlives Ctrl-C, a lost connection or a sleeping laptop; re-attach, watch or stop it from anywhere.

  launch/pod.sh NAME [options] [-- EXPERIMENT ARGS]   start a run, then follow its logs until it ends
  launch/pod.sh NAME --watch [options] [-- ARGS]      ... and relaunch it after a preemption
  launch/pod.sh NAME status                           per worker: run id, state, pid, alive, exit
                                                      code, step, last log line
  launch/pod.sh NAME logs [-f] [-n N] [--worker=K]    the current run's log (every worker, or K)
  launch/pod.sh NAME attach                           follow the current run again until it ends
  launch/pod.sh NAME stop [--grace S]                 SIGTERM (the trainer saves a checkpoint and
                                                      exits 143), SIGKILL after S s (default 120);
                                                      a launch being shipped does not start

  launch/pod.sh stable-1 --bucket my-bucket                    # TRM v4_64 on the v4-64 "stable-1"
  launch/pod.sh stable-1 --bucket my-bucket -- --config.lr=3e-4
  launch/pod.sh stable-1 --bucket my-bucket --dry-run          # print the gcloud commands only

First (docs/pod.md): `gcloud auth login`; the slice exists and is READY (`gcloud compute tpus
tpu-vm list`); `ssh-add ~/.ssh/google_compute_engine`: gcloud's --worker=all needs the key in
ssh-agent; --zone/--project or `gcloud config set compute/zone Z` / `core/project P`.

Options (flag, or environment variable, default):
  --zone Z            $PODLAB_ZONE     gcloud's default (`gcloud config get compute/zone`)
  --project P         $PODLAB_PROJECT  gcloud's default (`gcloud config get core/project`)
  --bucket B          $PODLAB_BUCKET   none; needed unless --workdir and --data_dir are both given
  --workdir W         gs://B/podlab/NAME/<config name>, plus `-<hash>` of the EXPERIMENT ARGS when
                      there are any: checkpoints, TensorBoard, results. The same command resumes
                      from it (a relaunch continues a preempted run); other args, other workdir.
  --data_dir D        gs://B/podlab/tfds: the TFDS data dir (TFDS_DATA_DIR on the workers)
  --module M          experiments.trm.main
  --config C          configs/v4_64.py (resolved inside the experiment's folder; a path in the
                      checkout is sent relative to it)
  --python PATH       an interpreter already on the workers with the pinned stack; setup then only
                      checks the versions instead of creating ~/podlab-venv
  --log-dir L         logs/pod/NAME/<run id> here: a copy of every worker's log, the code archive
  --internal-ip       reach the workers by their internal IPs (from a VM in the same network)
  --gcloud-flag F     added to every `gcloud ... ssh` and `scp` (repeatable), e.g.
                      --gcloud-flag=--tunnel-through-iap
  --ssh-flag F        added to ssh (repeatable). Always: -oServerAliveInterval=$PODLAB_SSH_KEEPALIVE_S
                      (30) -oServerAliveCountMax=4 -oConnectTimeout=$PODLAB_SSH_CONNECT_TIMEOUT_S (30)
  --watch             when the slice was preempted or went through maintenance (or the run died
                      another way than exit 2 or 3), wait until it is READY and relaunch: the run
                      resumes from its last checkpoint; never after a stop
  --max-relaunches N  $PODLAB_MAX_RELAUNCHES (5): --watch gives up after N relaunches
  --lost-after S      $PODLAB_LOST_AFTER_S (120): a worker silent for S s while the others run is
                      asked for its run; without a live process or an exit code it is lost: the
                      others are stopped and the launch exits 1 naming it (start, attach)
  --include PATH      also ship PATH (a file or folder of the checkout that git does not track;
                      repeatable); never .git/, key files or *.env (launch/pack.py's deny list)
  --stop-tpu-holders  stop the processes that are not podlab's but hold the TPU on a worker (they
                      are listed, and the launch stops before starting, without it)
  --dry-run           run the checks of step 0, then print the gcloud commands (one per line,
                      shell-quoted) and run nothing
  EXPERIMENT ARGS     appended to the command on every worker (after --config and --workdir)

Local python: $PYTHON, default .venv/bin/python (`make venv`), for the checks of step 0.

What starting does, in order (steps 1-5 each a `gcloud compute tpus tpu-vm` command):
  0. checks here, before any gcloud TPU call: the module's file exists; the code is packed
     (launch/pack.py: the files git tracks, as in the work tree, plus each --include PATH; it
     names the commit and the tracked files modified and not committed), and for a podlab program
     (experiments/common/entry.py) `python -m M --check_only --config=C --workdir=W ARGS` runs in
     an extraction of that archive: the config loads with its overrides and passes the
     experiment's checks on exactly the code that ships. A failure: one line, exit 2, nothing
     copied or started.
  1. describe NAME: the slice must be READY (--watch waits for it); its worker count. Transient
     gcloud errors are retried ($PODLAB_GCLOUD_TRIES, 3, every $PODLAB_GCLOUD_RETRY_S, 10 s).
  2. claim (`ssh --worker=0`): the launch's claim line in worker 0's journal. Of two launches the
     first claim holds the slice; the other stops here naming it (exit 1), nothing copied.
  3. copies the code to every worker (`scp --worker=all`, ~/podlab-code-<run id>.tgz).
  4. `ssh --worker=all`: launch/worker.sh prepare: refuses while a podlab run is alive there or when
     a stop request came after the claim; stops podlab's own stale processes holding the TPU (sudo
     lsof; other holders are listed and stop the launch unless --stop-tpu-holders); unpacks the
     code into ~/podlab-runs/<run id> (~/podlab links to it); sets up the pinned environment (only
     when pyproject.toml or constraints.txt changed; one setup at a time).
  5. `ssh --worker=all`: starts `python -m M --config=C --workdir=W ARGS` from the run's own code on
     every worker through launch/worker.sh run: recorded before it starts, its own session, its log
     on the worker (~/podlab-logs/<run id>/worker-<i>.log), so ssh dying does not touch it. The
     same connection streams the logs here (`[worker <i>]`, copied to the local log dir) until the
     run ends. A gcloud retry of that command (after an ssh failure) attaches to the run.
Ctrl-C detaches (the run goes on) and prints how to re-attach; before every worker started, it
stops those that did and says so. A lost connection triggers a status check on the workers, then
a re-attach: never a stop. Fail-fast: when a worker's run exits with an error (not 0, 130 or 143)
or is lost, every worker's run is stopped and this exits 1 naming the worker and its log. Exit 0
when every worker finished with exit code 0; 1 when the run failed or could not be started or
reached (or was stopped); 2 for bad input; 130 after Ctrl-C.

Arguments are passed to the workers single-quoted: spaces, quotes, `$(...)` or `;` in names or
arguments reach the experiment literally and never run as commands. Names are validated.
"""
import getpass
import glob
import hashlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker as workerlib  # noqa: E402  pylint: disable=g-import-not-at-top

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENV = os.environ
GCLOUD = ENV.get("GCLOUD", "gcloud")
SSH_TIMEOUT_S = int(ENV.get("PODLAB_SSH_TIMEOUT_S", "300"))        # status, logs, short commands
SCP_TIMEOUT_S = int(ENV.get("PODLAB_SCP_TIMEOUT_S", "900"))
PREPARE_TIMEOUT_S = int(ENV.get("PODLAB_PREPARE_TIMEOUT_S", "3600"))  # a first setup installs jax
KEEPALIVE_S = ENV.get("PODLAB_SSH_KEEPALIVE_S", "30")
CONNECT_TIMEOUT_S = ENV.get("PODLAB_SSH_CONNECT_TIMEOUT_S", "30")
RECONNECT_TRIES = int(ENV.get("PODLAB_RECONNECT_TRIES", "5"))
RECONNECT_DELAY_S = float(ENV.get("PODLAB_RECONNECT_DELAY_S", "30"))
REATTACH_MAX = int(ENV.get("PODLAB_REATTACH_MAX", "20"))
WATCH_POLL_S = float(ENV.get("PODLAB_WATCH_POLL_S", "60"))
WATCH_MAX_WAIT_S = float(ENV.get("PODLAB_WATCH_MAX_WAIT_S", "86400"))
FAILFAST_GRACE_S = int(ENV.get("PODLAB_STOP_GRACE_S", "10"))
GCLOUD_TRIES = int(ENV.get("PODLAB_GCLOUD_TRIES", "3"))
GCLOUD_RETRY_S = float(ENV.get("PODLAB_GCLOUD_RETRY_S", "10"))
FORMAT = "value(state,acceleratorType,networkEndpoints.len())"
SUBCOMMANDS = ("status", "logs", "attach", "stop")
BAD_INPUT = re.compile(r"NOT_FOUND|was not found|PERMISSION_DENIED|INVALID_ARGUMENT")
CONNECTION_FAILED = re.compile(r"^##### Command execution on worker (\d+) failed with exit status")
ALL = "all"


class Exit(Exception):
  """Ends pod.sh with `code` (the message is printed already)."""

  def __init__(self, code):
    super().__init__(code)
    self.code = code


class Interrupted(BaseException):
  """Ctrl-C or SIGTERM."""


def _out(stream, text):
  stream.buffer.write(text.encode(errors="surrogateescape") + b"\n")
  stream.flush()


def say(text):
  _out(sys.stdout, f"pod.sh: {text}")


def warn(text):
  _out(sys.stderr, f"pod.sh: {text}")


def die(text, code=2):
  warn(f"error: {text}")
  raise Exit(code)


def q(s):
  """POSIX single-quoting: the remote shell sees exactly one word with this content."""
  return "'" + str(s).replace("'", "'\\''") + "'"


def show(args):
  """One command line, each argument shell-quoted only when it needs it (copy-pasteable)."""
  out = []
  for a in map(str, args):
    m = re.fullmatch(r"(--[a-z-]+=)(.*)", a, re.S)
    if re.fullmatch(r"[-A-Za-z0-9_./:=,@%+]+", a):
      out.append(a)
    elif m:
      out.append(m.group(1) + q(m.group(2)))
    else:
      out.append(q(a))
  return " ".join(out)


def shell_rc(rc):
  """A child's exit status as a shell reports it (a signal N: 128 + N)."""
  return 128 - rc if rc is not None and rc < 0 else rc


def who():
  user = re.sub(r"[^A-Za-z0-9._-]", "_", getpass.getuser() or "user")
  return f"{user}@{re.sub(r'[^A-Za-z0-9._-]', '_', socket.gethostname())}"


# --------------------------------------------------------------------------------------------------
# Arguments

VALUE_OPTS = {"--zone", "--project", "--bucket", "--workdir", "--data_dir", "--data-dir",
              "--module", "--config", "--python", "--log-dir", "--gcloud-flag", "--ssh-flag", "--include",
              "--max-relaunches", "--worker", "--grace", "-n", "--lines", "--lost-after"}
APPLIES = {"-f": ("logs",), "-n": ("logs",), "--worker": ("logs", "status"), "--grace": ("stop",),
           "--watch": ("start",), "--max-relaunches": ("start",), "--dry-run": ("start",),
           "--include": ("start",), "--stop-tpu-holders": ("start",),
           "--lost-after": ("start", "attach")}


class Options:
  """The command line, validated (bash's rules and messages)."""

  def __init__(self, argv):
    self.name = self.sub = ""
    self.zone, self.project = ENV.get("PODLAB_ZONE", ""), ENV.get("PODLAB_PROJECT", "")
    self.zone_given, self.project_given = bool(self.zone), bool(self.project)
    self.bucket = ENV.get("PODLAB_BUCKET", "")
    self.workdir = self.data_dir = self.python = self.log_dir = self.worker = self.grace = ""
    self.lines = ""
    self.module, self.config = "experiments.trm.main", "configs/v4_64.py"
    self.dry_run = self.internal_ip = self.watch = self.follow = self.stop_tpu_holders = False
    self.max_relaunches = ENV.get("PODLAB_MAX_RELAUNCHES", "5")
    self.lost_after = ENV.get("PODLAB_LOST_AFTER_S", "120")
    self.gcloud_flags, self.ssh_flags, self.includes, used = [], [], [], []
    args = list(argv)
    while args:
      a = args.pop(0)
      if a in ("-h", "--help"):
        print(__doc__.rstrip())
        raise Exit(0)
      if a in ("--dry-run", "--dry_run"):
        self.dry_run = True
        used.append("--dry-run")
      elif a == "--watch":
        self.watch = True
        used.append(a)
      elif a == "--internal-ip":
        self.internal_ip = True
      elif a == "--stop-tpu-holders":
        self.stop_tpu_holders = True
        used.append(a)
      elif a in ("-f", "--follow"):
        self.follow = True
        used.append("-f")
      elif a in VALUE_OPTS:
        if not args:
          die(f"{a} needs a value")
        used += self._set(a, args.pop(0))
      elif a.startswith("--") and "=" in a:
        used += self._set(*a.split("=", 1))
      elif a == "--":
        break
      elif a.startswith("-"):
        die(f"unknown option '{a}' (see launch/pod.sh --help; experiment args go after --)")
      elif not self.name:
        self.name = a
      elif not self.sub:
        if a not in SUBCOMMANDS:
          die(f"unknown subcommand '{a}' after the TPU name '{self.name}': expected status, logs, "
              "attach or stop (nothing starts a run); experiment args go after --")
        self.sub = a
      else:
        die(f"unexpected argument '{a}' (the subcommand is already '{self.sub}'; experiment args "
            "go after --)")
    self.extra = args
    self.sub = self.sub or "start"
    self._validate(used)

  def _set(self, flag, value):
    simple = {"--zone": "zone", "--project": "project", "--bucket": "bucket",
              "--workdir": "workdir", "--data_dir": "data_dir", "--data-dir": "data_dir",
              "--module": "module", "--config": "config", "--python": "python",
              "--log-dir": "log_dir"}
    if flag in simple:
      setattr(self, simple[flag], value)
      if flag in ("--zone", "--project"):
        setattr(self, flag[2:] + "_given", True)
      return []
    if flag == "--gcloud-flag":
      self.gcloud_flags.append(value)
    elif flag == "--ssh-flag":
      self.ssh_flags.append(value)
    elif flag == "--include":
      self.includes.append(value)
    elif flag in ("--max-relaunches", "--worker", "--grace", "--lost-after"):
      setattr(self, flag[2:].replace("-", "_"), value)
    elif flag in ("-n", "--lines"):
      self.lines = value
      return ["-n"]
    else:
      die(f"unknown option '{flag}' (see launch/pod.sh --help; experiment args go after --)")
    return [flag] if flag not in ("--gcloud-flag", "--ssh-flag") else []

  def _validate(self, used):
    if not self.name:
      print(__doc__.rstrip(), file=sys.stderr)
      die("missing the TPU name, e.g. launch/pod.sh stable-1")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", self.name):
      die(f"TPU name '{self.name}' is not a valid Cloud TPU name (lowercase letters, digits, '-')")
    for opt in used:
      if self.sub not in APPLIES.get(opt, ()):
        die(f"option {opt} does not apply to `{self.sub}` (see launch/pod.sh --help)")
    if self.sub != "start" and self.extra:
      die(f"experiment args ({' '.join(self.extra)}) only apply when starting a run, not to "
          f"`{self.sub}`")
    if self.worker and self.worker != ALL and not self.worker.isdigit():
      die(f"--worker '{self.worker}' is not a worker index: pass --worker=K with K a number (0 is "
          "the first worker) or --worker=all")
    if self.grace and not self.grace.isdigit():
      die(f"--grace '{self.grace}' is not a number of seconds")
    if self.lines and not self.lines.isdigit():
      die(f"-n '{self.lines}' is not a number of lines")
    if not self.max_relaunches.isdigit():
      die(f"--max-relaunches '{self.max_relaunches}' is not a count (flag --max-relaunches or "
          "PODLAB_MAX_RELAUNCHES)")
    if not re.fullmatch(r"\d+(\.\d+)?", self.lost_after):
      die(f"--lost-after '{self.lost_after}' is not a number of seconds (flag --lost-after or "
          "PODLAB_LOST_AFTER_S)")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", self.module):
      die(f"--module '{self.module}' is not a Python module name like experiments.trm.main")
    if self.python and not self.python.startswith("/"):
      die(f"--python '{self.python}' is not an absolute path: it names an interpreter on the "
          "workers, e.g. /usr/bin/python3.11")


# --------------------------------------------------------------------------------------------------
# gcloud

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


# --------------------------------------------------------------------------------------------------
# The launcher

class Pod:
  """One invocation of pod.sh for the slice `opts.name`."""

  def __init__(self, opts):
    self.o = opts
    self.gc = Gcloud()
    self.phase = ""
    self.run_id = ""
    self.attempt = 0
    self.claimed_at = None
    self.claimed = False
    self.follower = None
    self.exits, self.arrivals, self.refused, self.stopped_by, self.lost = {}, [], {}, {}, {}
    self.stoppers = []
    self.state, self.accel, self.num_workers = "", "", 0
    self.lost_after = float(opts.lost_after)
    # PODLAB_ALIVE lines from a quiet worker, often enough for --lost-after (0: no such check).
    self.alive_every = max(1.0, min(30.0, self.lost_after / 4)) if self.lost_after else 30.0
    self.scratch = tempfile.mkdtemp(prefix="podlab-pod.")
    self.watch_file = None

  # Connection ----------------------------------------------------------------------------------

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

  # Remote commands ------------------------------------------------------------------------------

  def with_worker(self, args):
    """WORKER.SH ARGS from ~/podlab (a link to the current run's code) when the code is there."""
    return ("if [ -f podlab/launch/worker.sh ]; then cd podlab && exec bash launch/worker.sh "
            f"{args}; else echo \"PODLAB_STATUS worker=? state=nocode host=$(hostname)\"; "
            "echo \"no podlab code in ~/podlab on $(hostname)\" >&2; exit 1; fi")

  def remote_python(self):
    return q(self.o.python) if self.o.python else '"$HOME"/podlab-venv/bin/python'

  def claim_cmd(self, attempt):
    return ("cd && mkdir -p .podlab && printf 'claim %s %s %s %s\\n' "
            f"{self.run_id} {attempt} \"$(date +%s.%N)\" {who()} >> .podlab/journal && "
            "if [ -f podlab/launch/worker.py ]; then exec bash podlab/launch/worker.sh claim "
            f"--run-id {self.run_id}; else echo PODLAB_JOURNAL; cat .podlab/journal; fi")

  def release_cmd(self, attempt):
    return ("cd && printf 'release %s %s %s\\n' "
            f"{self.run_id} {attempt} \"$(date +%s.%N)\" >> .podlab/journal")

  def prepare_cmd(self, attempt):
    setup = f" --python {q(self.o.python)}" if self.o.python else ""
    holders = " --stop-others" if self.o.stop_tpu_holders else ""
    new = f"podlab-runs/{self.run_id}.new"
    return (f"set -e; cd; mkdir -p podlab-runs; rm -rf {new}; mkdir {new}; tar -xzf "
            f"podlab-code-{self.run_id}.tgz -C {new}; exec bash {new}/launch/worker.sh prepare "
            f"--run-id {self.run_id} --attempt {attempt} --claimed-at {self.claimed_at_arg()}"
            f"{setup}{holders}")

  def claimed_at_arg(self):
    return f"{self.claimed_at:.6f}" if self.claimed_at is not None else "CLAIMED_AT"

  def run_cmd(self, attempt, rdir):
    o = self.o
    cmd = (f"cd ~/podlab-runs/{self.run_id} && exec bash launch/worker.sh run --run-id "
           f"{self.run_id} --attempt {attempt} --claimed-at {self.claimed_at_arg()} --log-dir "
           f"~/{rdir} --detach --follow --numbered --alive-every {self.alive_every:g} -- env "
           f"TFDS_DATA_DIR={q(o.data_dir)} {self.remote_python()} -m {o.module} "
           f"{q('--config=' + self.config_sent)} {q('--workdir=' + o.workdir)}")
    return cmd + "".join(" " + q(a) for a in o.extra)

  def attach_cmd(self, attempt, from_list):
    return self.with_worker(f"attach --run-id {self.run_id} --attempt {attempt} --follow "
                            f"--numbered --from {from_list} --alive-every {self.alive_every:g}")

  def stop_cmd(self, grace, run_id="", attempt=None, by_user=False):
    args = f"stop --grace {grace} --by {who()}"
    if run_id:
      args += f" --run-id {q(run_id)} --attempt {attempt}"
    if by_user:
      args += " --by-user"
    if not by_user:
      return self.with_worker(args)
    # A slice that never had podlab code: the stop request still goes into the journal.
    return ("cd && if [ -f podlab/launch/worker.sh ]; then cd podlab && exec bash launch/worker.sh "
            f"{args}; else mkdir -p .podlab && printf 'stop %s %s\\n' \"$(date +%s.%N)\" {who()} "
            ">> .podlab/journal && echo \"no podlab code in ~/podlab on $(hostname): nothing to "
            "stop; the stop request is recorded (a launch being shipped now will not start)\"; fi")

  # Local state: stop requests a --watch on this machine honours, and the watches running here.

  def local_dir(self):
    base = ENV.get("PODLAB_STATE_HOME") or os.path.join(
        ENV.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"),
        "podlab")
    return os.path.join(base, "pod", self.o.project or "-", self.o.zone, self.o.name)

  def record_local_stop(self):
    os.makedirs(self.local_dir(), exist_ok=True)
    path = os.path.join(self.local_dir(), "stop-request")
    with open(path + ".tmp", "w") as f:
      f.write(f"{time.time():.6f} {who()}\n")
    os.replace(path + ".tmp", path)

  def local_stop_after(self, t0):
    """The local stop request (time, by) when it is newer than t0, else None."""
    try:
      with open(os.path.join(self.local_dir(), "stop-request")) as f:
        at, by = f.read().split()[:2]
    except (OSError, ValueError):
      return None
    return (float(at), by) if float(at) > t0 else None

  def register_watch(self):
    os.makedirs(self.local_dir(), exist_ok=True)
    self.watch_file = os.path.join(self.local_dir(), f"watch-{os.getpid()}")
    with open(self.watch_file, "w") as f:
      f.write(f"{self.run_id} {workerlib.identity(os.getpid())}\n")

  def local_watches(self):
    """[(run id, pid)] of the --watch launches of this slice alive on this machine."""
    found = []
    for path in glob.glob(os.path.join(self.local_dir(), "watch-*")):
      try:
        run_id, pid, start, boot = open(path).read().split()
      except (OSError, ValueError):
        continue
      if workerlib.is_process(pid, start, boot):
        found.append((run_id, pid))
    return found

  # Following gcloud's merged output --------------------------------------------------------------

  def follow(self, command, phase, attempt, mirror, timeout=0, worker=ALL):
    """Runs COMMAND on the workers and follows it (Follower); returns gcloud's exit code."""
    self.follower = Follower(self, phase, attempt, mirror)
    return self.follower.run(self.ssh_args_for(worker, command), timeout)

  def query_status(self, worker=ALL, timeout=SSH_TIMEOUT_S):
    """{worker: status fields} of those that answered (the raw output: status_out)."""
    _, out = self.ssh(worker, timeout, self.with_worker("status"))
    st = {}
    for line in out.splitlines():
      m = re.match(r"PODLAB_STATUS worker=(\d+) state=(\S+) run=(\S+) attempt=(\S+) pid=(\S+) "
                   r"rc=(\S+) step=(\S+) stopped=(\S+) log=(\S*) last=(.*)$", line)
      if m:
        st[int(m.group(1))] = dict(zip(("state", "run", "attempt", "pid", "rc", "step", "stopped",
                                        "log", "last"), m.groups()[1:]))
    self.status_out = out
    return st

  def complete(self, st, worker=ALL):
    wanted = range(self.num_workers) if worker == ALL else [int(worker)]
    return all(w in st for w in wanted)

  def print_status(self, st):
    w0 = self.o.worker
    workers = range(self.num_workers) if not w0 or w0 == ALL else [int(w0)]
    fmt = "{:<6}  {:<24}  {:<7}  {:<9}  {:<8}  {:<5}  {:<12}  {:<6}  {}"
    print(fmt.format("worker", "run", "attempt", "state", "pid", "alive", "exit", "step",
                     "last log line"))
    quiet = []
    for w in workers:
      s = st.get(w)
      if s is None:
        print(f"{w:<6}  no answer (ssh failed: see below)")
        continue
      alive = {"running": "yes", "starting": "yes", "none": "-"}.get(s["state"], "no")
      last = "(no podlab run recorded on this worker)" if s["state"] == "none" else s["last"]
      rc = "lost" if s["state"] == "lost" else s["rc"]
      if s["stopped"] == "1":
        rc += " (stop)"
      print(fmt.format(w, s["run"], s["attempt"], s["state"], s["pid"], alive, rc, s["step"],
                       last[:100]))
      first = st.get(0, {})
      if (w > 0 and s["step"] == "-" and first.get("step", "-") != "-"
          and (s["run"], s["attempt"]) == (first.get("run"), first.get("attempt"))):
        quiet.append(str(w))
    if quiet:
      print(f"(step -: worker(s) {' '.join(quiet)} log no training progress of their own; process "
            "0 logs it for the whole run)")
    sys.stdout.flush()

  def status_tail(self):
    lines = [l for l in self.status_out.splitlines() if not l.startswith("PODLAB_STATUS")]
    if lines:
      print("\n".join(lines[-20:]), file=sys.stderr)

  # Subcommands ----------------------------------------------------------------------------------

  def cmd_status(self):
    self.require_gcloud()
    self.describe_or_die()
    self.check_worker_flag()
    print(f"TPU {self.o.name}: {self.state}, {self.accel}, {self.num_workers} workers, zone "
          f"{self.o.zone}", flush=True)
    self.require_ready()
    worker = self.o.worker or ALL
    st = self.query_status(worker)
    self.print_status(st)
    if not self.complete(st, worker):
      self.status_tail()
      return 1
    return 0

  def cmd_logs(self):
    self.require_gcloud()
    self.describe_or_die()
    self.check_worker_flag()
    self.require_ready()
    worker, args = self.o.worker or ALL, ""
    if self.o.follow:
      args += " -f"
    if self.o.lines:
      args += f" -n {self.o.lines}"
    if worker == ALL:
      args += " --prefix"
    self.phase = "logs"
    rc, _ = self.gc.run(self.ssh_args_for(worker, self.with_worker("logs" + args)),
                        0 if self.o.follow else SSH_TIMEOUT_S, stdout=None, stderr=None)
    return rc

  def current_run(self):
    """The run on the workers now (worker 0's): sets run_id and attempt."""
    st = self.query_status()
    if not self.complete(st):
      self.status_tail()
      self.print_status(st)
      warn(f"could not ask every worker of {self.o.name} for its run")
      raise Exit(1)
    for w in range(self.num_workers):
      if (st[w]["run"], st[w]["attempt"], st[w]["state"]) != (st[0]["run"], st[0]["attempt"],
                                                             st[0]["state"]):
        warn(f"the workers disagree (worker {w}: run {st[w]['run']} attempt {st[w]['attempt']}, "
             f"worker 0: run {st[0]['run']} attempt {st[0]['attempt']}); following worker 0's")
        break
    if st[0]["state"] == "none":
      warn(f"no podlab run recorded on {self.o.name}")
      raise Exit(1)
    if st[0]["state"] in ("shipping", "prepared"):
      warn(f"run {st[0]['run']} is being started ({st[0]['state']}) on {self.o.name}: attach once "
           f"it runs ({self.later('status')})")
      raise Exit(1)
    self.run_id, self.attempt = st[0]["run"], int(st[0]["attempt"])
    return st

  def attempt_dirs(self, base, attempt):
    mirror, rdir = base, f"podlab-logs/{self.run_id}"
    if attempt > 0:
      mirror, rdir = os.path.join(base, f"relaunch-{attempt}"), f"{rdir}/relaunch-{attempt}"
    return mirror, rdir

  def cmd_attach(self):
    self.require_gcloud()
    self.describe_or_die()
    self.require_ready()
    self.current_run()
    base = self.o.log_dir or os.path.join(REPO, "logs", "pod", self.o.name, self.run_id)
    mirror, rdir = self.attempt_dirs(base, self.attempt)
    try:
      os.makedirs(mirror, exist_ok=True)
    except OSError:
      die(f"cannot create the log dir {mirror}")
    self.exits = {}
    say(f"following run {self.run_id} attempt {self.attempt} on {self.o.name} ({self.num_workers} "
        f"workers); log copies in {mirror}")
    self.phase = "attach"
    outcome = self.follow_run("attach", self.attempt, mirror, rdir)
    if outcome.kind == "ok":
      say(f"run {self.run_id} attempt {self.attempt} finished on all {self.num_workers} workers "
          "(exit code 0)")
      return 0
    self.report_failure(outcome, mirror, rdir)
    return 1

  def cmd_stop(self):
    self.require_gcloud()
    self.describe_or_die()
    g = self.o.grace or "120"
    self.record_local_stop()
    if self.state != "READY":
      watches = self.local_watches()
      if watches:
        for run_id, pid in watches:
          say(f"TPU '{self.o.name}' is {self.state}: its workers cannot be reached; the stop "
              f"request is recorded here: the --watch of run {run_id} (pid {pid}) on this machine "
              "will not relaunch it")
        return 0
      warn(f"TPU '{self.o.name}' is {self.state}, not READY: its workers cannot be reached. The "
           "stop request is recorded on this machine only (a --watch running here would honour "
           f"it); run {self.later('stop')} again once {self.o.name} is READY")
      return 1
    say(f"stopping the podlab run on every worker of {self.o.name}: SIGTERM (the trainer saves a "
        f"checkpoint and exits), SIGKILL after {g} s; a launch being shipped will not start")
    self.phase = "stop"
    rc, out = self.ssh(ALL, int(g) + SSH_TIMEOUT_S, self.stop_cmd(g, by_user=True))
    print("\n".join(l for l in out.splitlines() if not l.startswith("PODLAB_STATUS")), flush=True)
    st = self.query_status()
    if self.complete(st):
      self.print_status(st)
    return 1 if rc else 0

  # Start ---------------------------------------------------------------------------------------

  def preship(self, out=None):
    """Step 0 (the module doc): the module, the config and the code that ships, checked here
    before any gcloud TPU call; the code packed into OUT (the dry run: a temporary archive).
    Fails (exit 2) with one line."""
    o = self.o
    py = ENV.get("PYTHON") or os.path.join(REPO, ".venv", "bin", "python")
    base = o.module.replace(".", "/")
    mod_file = next((c for c in (f"{base}.py", f"{base}/__main__.py")
                     if os.path.isfile(os.path.join(REPO, c))), None)
    if mod_file is None:
      die(f"--module '{o.module}': there is no {base}.py (nor {base}/__main__.py) in {REPO}. Fix: "
          "pass the module that runs the experiment, e.g. experiments.trm.main")
    path, colon, arg = o.config.partition(":")
    self.config_sent = o.config
    if os.path.isabs(path):
      real, repo = os.path.realpath(path), os.path.realpath(REPO)
      if not real.startswith(repo + os.sep):
        die(f"--config '{o.config}' is outside the repository {REPO}: the workers would not have "
            "it. Fix: put it in the repository (tracked by git, or --include it) and pass it "
            "relative to the repository")
      self.config_sent = os.path.relpath(real, repo) + colon + arg
    archive = out or os.path.join(self.scratch, "check-code.tgz")
    pack_py = py if os.access(py, os.X_OK) else sys.executable
    proc = subprocess.run([pack_py, os.path.join(HERE, "pack.py"), REPO, "--out", archive,
                           *[x for i in o.includes for x in ("--include", i)],
                           "--require", mod_file], capture_output=True, text=True)
    if proc.returncode:
      die((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1])
    code_lines = proc.stdout.splitlines()
    with open(os.path.join(REPO, mod_file), errors="replace") as f:
      is_program = re.search(r"\bentry\.run(_program)?\(", f.read()) is not None
    if is_program:
      if not os.access(py, os.X_OK):
        die(f"the config is checked here before anything is shipped, with {py}, which is missing. "
            "Fix: make venv (or set PYTHON to an interpreter with the pinned stack)")
      self.check_shipped(py, archive)
      say(f"checked here: --config={o.config} loads with the experiment args and passes "
          f"{o.module}'s checks")
    else:
      say(f"--module {o.module} does not run through experiments/common/entry.py: its arguments "
          "are not checked here")
    for line in code_lines:
      say(f"code: {line}")
    if self.config_sent != o.config:
      say(f"--config {o.config} is sent to the workers as {self.config_sent} (relative to the "
          "code)")

  def check_shipped(self, py, archive):
    """`python -m M --check_only` in an extraction of the archive: the code that ships."""
    o = self.o
    where = tempfile.mkdtemp(prefix="podlab-check.", dir=self.scratch)
    with tarfile.open(archive) as tar:
      tar.extractall(where)                                # our own archive, just written
    env = dict(ENV, JAX_PLATFORMS="cpu", PYTHONPATH=where)
    proc = subprocess.run([py, "-m", o.module, "--check_only", f"--config={self.config_sent}",
                           f"--workdir={o.workdir}", *o.extra], cwd=where, env=env,
                          capture_output=True, text=True)
    shutil.rmtree(where, ignore_errors=True)
    if proc.returncode == 0:
      return
    text = (proc.stdout + proc.stderr).replace(where + "/", "<the code that ships>/")
    lines = [l for l in text.splitlines() if l.strip()]
    line = next((l for l in reversed(lines) if l.startswith("error: ")), lines[-1] if lines else "")
    if re.search(r"ModuleNotFoundError|ImportError|No module named", line):
      die(f"checking the config here failed (exit {proc.returncode}; nothing was copied or "
          f"started): {line}; the check ran on the code that ships (the files git tracks, and "
          "--include): a module it imports is not among them. Fix: git add it, or pass --include "
          "with its path")
    if proc.returncode == 2:
      die("checked before shipping (nothing was copied or started): "
          + (line[len("error: "):] if line.startswith("error: ") else line))
    die(f"checking the config here failed (exit {proc.returncode}; nothing was copied or "
        f"started): {line}. Fix: run `cd {REPO} && {py} -m {o.module} --check_only "
        f"--config={o.config}` to see why; a local environment without the pinned stack: make "
        "venv, or set PYTHON")

  def defaults(self):
    o = self.o
    config_name = os.path.basename(o.config.split(":")[0])
    if config_name.endswith(".py"):
      config_name = config_name[:-3]
    if not o.workdir or not o.data_dir:
      if not o.bucket:
        die("no bucket: pass --bucket B (or set PODLAB_BUCKET) for the default gs://B/podlab/... "
            "workdir and data dir, or give both --workdir and --data_dir")
      bucket = o.bucket[len("gs://"):] if o.bucket.startswith("gs://") else o.bucket
      bucket = bucket.rstrip("/")
      if not re.fullmatch(r"[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]", bucket):
        die(f"--bucket '{bucket}' is not a bucket name (lowercase letters, digits, '-', '_', '.')")
      if not o.workdir:
        o.workdir = f"gs://{bucket}/podlab/{o.name}/{config_name}"
        if o.extra:       # other experiment args, another run: its own workdir
          o.workdir += "-" + hashlib.sha256(
              b"".join(a.encode(errors="surrogateescape") + b"\0" for a in o.extra)).hexdigest()[:8]
      o.data_dir = o.data_dir or f"gs://{bucket}/podlab/tfds"

  def dry_run(self):
    o = self.o
    self.preship()
    ssh = lambda cmd: show([GCLOUD, *self.ssh_args_for(ALL, cmd)])   # noqa: E731
    print("# launch/pod.sh --dry-run: the commands it would run (TensorBoard: tensorboard "
          f"--logdir {o.workdir})")
    print(show([GCLOUD, "compute", "tpus", "tpu-vm", "describe", o.name, *self.tpu_args,
                f"--format={FORMAT}"]))
    print(show([GCLOUD, *self.ssh_args_for(0, self.claim_cmd(0))]))
    print(f"# packs the code above (launch/pack.py {q(REPO)}"
          + "".join(f" --include {i}" for i in o.includes)
          + f") into {q(os.path.join(self.log_dir, 'podlab-code.tgz'))}")
    print(show([GCLOUD, "compute", "tpus", "tpu-vm", "scp",
                os.path.join(self.log_dir, "podlab-code.tgz"),
                f"{o.name}:podlab-code-{self.run_id}.tgz", "--worker=all", *self.conn_args,
                *self.scp_args]))
    print("# CLAIMED_AT: the time the claim above prints (worker 0's clock)")
    print(ssh(self.prepare_cmd(0)))
    print(ssh(self.run_cmd(0, f"podlab-logs/{self.run_id}")))
    print(f"# {self.later('status')}, {self.later('attach')}, {self.later('stop')} run:")
    print(ssh(self.with_worker("status")))
    print(ssh(self.attach_cmd(0, "0:0")))
    print(ssh(self.stop_cmd(120, by_user=True)))
    return 0

  def claim(self, attempt):
    """Step 2: the slice for this launch, or exit 1 naming the launch that holds it."""
    self.phase = "claim"
    for n in range(GCLOUD_TRIES):
      rc, out = self.ssh(0, SSH_TIMEOUT_S, self.claim_cmd(attempt))
      m = re.search(r"^PODLAB_CLAIM (granted|refused) run=\S+ (.*)$", out, re.M)
      if m or "PODLAB_JOURNAL" in out:
        break
      if n < GCLOUD_TRIES - 1:
        warn(f"could not reach worker 0 of {self.o.name} to claim it (gcloud exit code {rc}); "
             f"trying again in {GCLOUD_RETRY_S:g} s")
        time.sleep(GCLOUD_RETRY_S)
    else:
      print("\n".join(out.splitlines()[-10:]), file=sys.stderr)
      warn(f"FAILED: could not reach worker 0 of {self.o.name} (gcloud exit code {rc}, "
           f"{GCLOUD_TRIES} tries); nothing was started")
      raise Exit(1)
    if m:
      fields = dict(f.split("=", 1) for f in m.group(2).split() if "=" in f)
      if m.group(1) == "granted":
        at = float(fields["at"])
      else:
        holder = (fields.get("holder"), fields.get("attempt"), fields.get("state"),
                  float(fields.get("at", 0)), fields.get("by", "-"))
        self.refused_claim(holder, None)
    else:
      entries = [l.split() for l in out.split("PODLAB_JOURNAL", 1)[1].splitlines() if l.split()]
      mine = next(e for e in entries if e[0] == "claim" and e[1:3] == [self.run_id, str(attempt)])
      holder = workerlib.arbitrate(entries, self.run_id, float(mine[3]), lambda run: None)
      if holder is not None:
        self.ssh(0, SSH_TIMEOUT_S, self.release_cmd(attempt))
        self.refused_claim(holder, float(mine[3]))
      at = float(next(e for e in entries if e[0] == "claim" and e[1] == self.run_id)[3])
    self.claimed = True
    if self.claimed_at is None:
      self.claimed_at = at

  def refused_claim(self, holder, now):
    run, attempt, state, at, by = holder
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "-"
    warn(f"FAILED (claim): run {run} attempt {attempt} holds {self.o.name} (state {state} on "
         f"worker 0; launched by {by}, since {since}); nothing was started. Fix: follow it "
         f"({self.later('attach')}) or stop it ({self.later('stop')}), then relaunch")
    raise Exit(1)

  def release(self, attempt):
    """Gives the claim up (best effort): the launch stops before its run started."""
    if self.claimed:
      self.claimed = False
      self.gc.run(self.ssh_args_for(0, self.release_cmd(attempt)), 60)

  def copy(self, archive, attempt):
    """Step 3, with retries; 'preempted' or None."""
    self.phase = "copy"
    size = os.path.getsize(archive)
    say(f"copying the code ({size / 1e6:.1f} MB) to every worker")
    for n in range(GCLOUD_TRIES):
      rc, out = self.gc.run(["compute", "tpus", "tpu-vm", "scp", archive,
                             f"{self.o.name}:podlab-code-{self.run_id}.tgz", "--worker=all",
                             *self.conn_args, *self.scp_args], SCP_TIMEOUT_S)
      if rc == 0:
        return None
      if out.strip():
        print(out.rstrip(), flush=True)
      if self.o.watch and self.describe() is None and self.state != "READY":
        return "preempted"
      if n < GCLOUD_TRIES - 1:
        warn(f"copying the code failed (gcloud exit code {rc}); trying again in "
             f"{GCLOUD_RETRY_S:g} s ({n + 1} of {GCLOUD_TRIES} tries)")
        time.sleep(GCLOUD_RETRY_S)
    self.release(attempt)
    warn(f"FAILED: copying the code to the workers of {self.o.name} failed (gcloud scp, "
         f"{GCLOUD_TRIES} tries, last exit code {rc}): the workers could not be reached; nothing "
         "was started")
    raise Exit(1)

  def prepare(self, attempt, mirror):
    """Step 4; 'preempted' or None (or exit 1)."""
    self.phase = "prepare"
    say("preparing every worker (unpack, stop stale TPU processes, environment)")
    rc = self.follow(self.prepare_cmd(attempt), "prepare", attempt, mirror, PREPARE_TIMEOUT_S)
    f = self.follower
    stopped = [w for w in f.stopped]
    if stopped:
      self.claimed = False
      self.report_stopped_before_start(f.stopped[stopped[0]])
    bad = next(((w, r) for w, r, _ in f.arrivals if r != "0"), None)
    if bad is not None:
      self.release(attempt)
      w, code = bad
      if w in f.refused:
        other, other_attempt = f.refused[w]
        warn(f"FAILED (prepare): worker {w} still runs run {other} attempt {other_attempt}; "
             f"nothing was started. Fix: follow it ({self.later('attach')}) or stop it "
             f"({self.later('stop')}), then relaunch")
      else:
        warn(f"FAILED (prepare): worker {w} exited with code {code}; the run was not started.")
        log = os.path.join(mirror, f"prepare-worker-{w}.log")
        warn(f"its output: {log}")
        tail(log)
      raise Exit(1)
    missing = [w for w in range(self.num_workers) if w not in f.exits]
    if missing:
      if self.o.watch and self.describe() is None and self.state != "READY":
        return "preempted"
      self.release(attempt)
      warn(f"FAILED (prepare): no exit report from worker(s) {' '.join(map(str, missing))} "
           f"(gcloud exit code {rc}): the ssh connection or the VM failed; nothing was started; "
           f"see {mirror}")
      raise Exit(1)
    return None

  def report_stopped_before_start(self, info):
    warn(f"run {self.run_id} was stopped by its user (launch/pod.sh {self.o.name} stop, by "
         f"{info}) before it started: nothing was started")
    raise Exit(1)

  def cmd_start(self):
    o = self.o
    self.defaults()
    self.run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.urandom(2).hex()}"
    self.log_dir = o.log_dir or os.path.join(REPO, "logs", "pod", o.name, self.run_id)
    self.phase = "check"
    if o.dry_run:
      return self.dry_run()
    scratch_archive = os.path.join(self.scratch, "podlab-code.tgz")
    self.preship(scratch_archive)
    self.require_gcloud()
    self.t0 = time.time()
    self.phase = "describe"
    self.describe_or_die()
    if self.state != "READY":
      if not o.watch:
        die(f"TPU '{o.name}' is {self.state}, not READY; wait for it or recreate it (--watch "
            "waits)")
      self.wait_ready()
    try:
      os.makedirs(self.log_dir, exist_ok=True)
      self.log_dir = os.path.abspath(self.log_dir)
      shutil.move(scratch_archive, os.path.join(self.log_dir, "podlab-code.tgz"))
    except OSError as e:
      die(f"cannot write the log dir {self.log_dir}: {e}")
    archive = os.path.join(self.log_dir, "podlab-code.tgz")
    say(f"{o.name}: {self.accel}, {self.num_workers} workers, zone {o.zone}; run {self.run_id}; "
        f"logs in {self.log_dir}")
    say(f"workdir {o.workdir}, TFDS data {o.data_dir}")
    say(f"TensorBoard: tensorboard --logdir {o.workdir}")
    if o.watch:
      self.register_watch()
    attempt = relaunches = 0
    while True:
      self.attempt = attempt
      mirror, rdir = self.attempt_dirs(self.log_dir, attempt)
      os.makedirs(mirror, exist_ok=True)
      self.claim(attempt)
      outcome = None
      kind = self.copy(archive, attempt) or self.prepare(attempt, mirror)
      if kind is None:
        self.phase = "run"
        say(f"starting run {self.run_id} attempt {attempt} on every worker (detached: Ctrl-C "
            f"leaves it running): python -m {o.module} --config={self.config_sent} --workdir={o.workdir}"
            + "".join(" " + a for a in o.extra))
        outcome = self.follow_run("start", attempt, mirror, rdir)
        self.claimed = False
      else:
        outcome = Outcome(kind)
      self.phase = "watch"
      if outcome.kind == "ok":
        say(f"all {self.num_workers} workers finished run {self.run_id} (attempt {attempt}); logs "
            f"in {self.log_dir}")
        say(f"TensorBoard: tensorboard --logdir {o.workdir}")
        return 0
      if outcome.kind in ("refused", "unreachable", "stopped"):
        self.report_failure(outcome, mirror, rdir)
        return 1
      self.report_failure(outcome, mirror, rdir)
      if outcome.kind == "failed":
        if not o.watch:
          return 1
        if outcome.stopped:
          warn("stopped by its user: --watch does not relaunch it")
          return 1
        if outcome.rc in ("2", "3"):
          warn(f"exit {outcome.rc} is not a preemption (2: bad input, 3: non-finite training): "
               "--watch does not relaunch it")
          return 1
      elif not o.watch:           # preempted
        warn("when it is READY again, rerun this command to resume from that checkpoint (--watch "
             "does it by itself)")
        return 1
      if relaunches >= int(o.max_relaunches):
        warn(f"FAILED: --watch gave up after {relaunches} relaunches (--max-relaunches "
             f"{o.max_relaunches})")
        return 1
      self.check_local_stop()
      relaunches, attempt = relaunches + 1, attempt + 1
      say(f"relaunch {relaunches} of at most {o.max_relaunches}: once {o.name} is READY, run "
          f"{self.run_id} resumes from its last checkpoint")
      self.wait_ready()
      if outcome.kind == "preempted":
        self.fetch_tail(attempt - 1, mirror)
        say(f"run {self.run_id} attempt {attempt - 1}: {self.checkpoint_phrase(mirror)}")

  def check_local_stop(self):
    stop = self.local_stop_after(self.t0)
    if stop is not None:
      warn(f"run {self.run_id} was stopped by its user (launch/pod.sh {self.o.name} stop, by "
           f"{stop[1]}): --watch does not relaunch it")
      raise Exit(1)

  def wait_ready(self):
    """Waits until the slice is READY (polling describe); gives up on states it does not leave by
    itself, and on a stop request recorded here."""
    start, last = time.monotonic(), ""
    while True:
      if self.o.watch:
        self.check_local_stop()
      if self.describe() is None:
        if self.state == "READY":
          return
        if self.state in ("STOPPING", "STOPPED", "DELETING", "TERMINATED", "HIDDEN"):
          warn(f"FAILED: the slice {self.o.name} is {self.state}: it does not come back by itself; "
               "start or recreate it, then rerun")
          raise Exit(1)
      else:
        self.state = "not found"
      if self.state != last:
        say(f"the slice {self.o.name} is {self.state}; waiting until it is READY (every "
            f"{WATCH_POLL_S:g} s, up to {WATCH_MAX_WAIT_S:g} s)")
      last = self.state
      if time.monotonic() - start >= WATCH_MAX_WAIT_S:
        warn(f"FAILED: {self.o.name} was not READY within {WATCH_MAX_WAIT_S:g} s "
             "(PODLAB_WATCH_MAX_WAIT_S)")
        raise Exit(1)
      time.sleep(WATCH_POLL_S)

  # Following a run ------------------------------------------------------------------------------

  def from_list(self, mirror):
    return ",".join(f"{w}:{count_lines(os.path.join(mirror, f'worker-{w}.log'))}"
                    for w in range(self.num_workers))

  def follow_run(self, kind, a, mirror, rdir):
    """Follows run attempt A (KIND start: starts it first) until every worker is accounted for
    (an exit code, or lost), with status checks and re-attaches when the connection is lost."""
    cmd = self.run_cmd(a, rdir) if kind == "start" else self.attach_cmd(a, self.from_list(mirror))
    self.exits, self.arrivals, self.refused, self.stopped_by = {}, [], {}, {}
    rc = self.follow(cmd, "run", a, mirror)
    tries = reattaches = 0
    while True:
      missing = [w for w in range(self.num_workers) if w not in self.exits]
      if not missing:
        break
      warn(f"no exit report from worker(s) {' '.join(map(str, missing))} (gcloud exit code {rc}): "
           "the connection was lost; checking the run's status on the workers (the run is not "
           "stopped)")
      st = self.query_status()
      if not self.complete(st):
        error = self.describe()
        if error is None and self.state == "READY":
          if tries >= RECONNECT_TRIES:
            return Outcome("unreachable", missing=[w for w in missing if w not in st])
          tries += 1
          warn(f"could not reach every worker; asking again in {RECONNECT_DELAY_S:g} s ({tries} of "
               f"{RECONNECT_TRIES})")
          time.sleep(RECONNECT_DELAY_S)
          continue
        if error is not None:
          self.state = "not found"
        return Outcome("preempted")
      tries, running, lost = 0, [], []
      for w in missing:
        s = st[w]
        if (s["run"], s["attempt"]) != (self.run_id, str(a)):
          lost.append((w, f"its current run is {s['run']} attempt {s['attempt']}, not "
                          f"{self.run_id} attempt {a}" if s["state"] != "none" else
                       f"no run of {self.run_id} was ever recorded there"))
        elif s["state"] in ("running", "starting"):
          running.append(w)
        elif s["rc"] != "-":
          warn(f"worker {w}: run {self.run_id} attempt {a} ended while disconnected (exit code "
               f"{s['rc']})")
          self.record_exit(w, s["rc"], s["stopped"] == "1")
        else:
          lost.append((w, lost_reason(s)))
      for w, reason in lost:
        self.declare_lost(w, reason, mirror, stop_now=False)
      if lost and (running or any(w not in self.exits for w in range(self.num_workers))):
        self.stop_run(a, mirror, wait=True)
        continue
      if not running:
        continue
      if reattaches >= REATTACH_MAX:
        return Outcome("unreachable", missing=running)
      reattaches += 1
      say(f"run {self.run_id} attempt {a} is still running on worker(s) "
          f"{' '.join(map(str, running))}; re-attaching")
      rc = self.follow(self.attach_cmd(a, self.from_list(mirror)), "run", a, mirror)
    return self.outcome()

  def record_exit(self, w, rc, stopped=False):
    if w not in self.exits:
      self.exits[w] = (rc, stopped)
      self.arrivals.append((w, rc, stopped))

  def declare_lost(self, w, reason, mirror, stop_now=True):
    if w in self.exits:
      return
    self.lost[w] = reason
    warn(f"worker {w} is lost: {reason}; stopping the run on every worker")
    if stop_now:
      self.follower.exit(w, "lost")
    else:
      self.record_exit(w, "lost")

  def stop_run(self, a, mirror, wait):
    """Fail-fast: stops run attempt A on every worker (and records the stop there, so that a
    worker whose start is late does not start alone)."""
    cmd = self.ssh_args_for(ALL, self.stop_cmd(FAILFAST_GRACE_S, self.run_id, a))
    with open(os.path.join(mirror, "stop.log"), "ab") as log:
      proc = self.gc.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    self.stoppers.append(proc)
    if wait:
      try:
        proc.wait(timeout=FAILFAST_GRACE_S + SSH_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        self.gc.end(proc)

  def outcome(self):
    """The first failure in arrival order is the cause."""
    for w, rc, stopped in self.arrivals:
      if rc == "0":
        continue
      if rc == "refused":
        return Outcome("refused", worker=w, rc=rc, other=self.refused.get(w))
      if rc == "stopped":
        return Outcome("stopped", worker=w, rc=rc, by=self.stopped_by.get(w))
      return Outcome("failed", worker=w, rc=rc, stopped=stopped)
    return Outcome("ok")

  def last_checkpoint(self, mirror):
    steps = []
    for log in glob.glob(os.path.join(mirror, "worker-*.log")):
      with open(log, errors="replace") as f:
        steps += [int(s) for s in re.findall(
            r"checkpoint (\d+) saved|checkpointing: saving step (\d+)", f.read()) for s in s if s]
    return max(steps) if steps else None

  def checkpoint_phrase(self, mirror):
    step = self.last_checkpoint(mirror)
    if step is not None:
      return f"its last checkpoint is step {step} (the last one its logs name), in {self.o.workdir}"
    return f"its logs here name no checkpoint of this attempt; {self.o.workdir} holds any it saved"

  def fetch_tail(self, a, mirror):
    """The rest of attempt A's worker logs, after the connection dropped before their end."""
    say(f"fetching the rest of run {self.run_id} attempt {a}'s worker logs (the connection "
        "dropped before their end)")
    saved = (self.exits, self.arrivals)
    self.exits, self.arrivals = {}, []
    self.follow(self.attach_cmd(a, self.from_list(mirror)), "tail", a, mirror, SSH_TIMEOUT_S)
    self.exits, self.arrivals = saved

  def report_failure(self, outcome, mirror, rdir):
    name = self.o.name
    if outcome.kind == "refused":
      other, other_attempt = outcome.other or ("?", "?")
      warn(f"FAILED (run): worker {outcome.worker} already runs run {other} attempt "
           f"{other_attempt}; run {self.run_id} was stopped on the workers where it had started. "
           f"Fix: follow it ({self.later('attach')}) or stop it ({self.later('stop')})")
    elif outcome.kind == "stopped":
      warn(f"run {self.run_id} was stopped by its user (by {outcome.by}) before it started on "
           f"worker {outcome.worker}; the workers that had started were stopped")
    elif outcome.kind == "failed":
      w = outcome.worker
      log = os.path.join(mirror, f"worker-{w}.log")
      if outcome.rc == "lost":
        reason = self.lost.get(w, "no live process and no exit code")
        warn(f"FAILED (run): worker {w} is lost ({reason}); the other workers were stopped.")
        warn(f"its last log line: {last_line(log) or '(none: it logged nothing)'}")
      elif outcome.stopped:
        warn(f"run {self.run_id} was stopped by its user (exit {outcome.rc} on worker {w})")
      else:
        warn(f"FAILED (run): worker {w} exited with code {outcome.rc}; the other workers were "
             "stopped.")
      warn(f"its log: {log} (on the worker: ~/{rdir}/worker-{w}.log)")
      tail(log)
    elif outcome.kind == "preempted":
      warn(f"the slice {name} is {self.state or 'unreachable'} (preempted or in maintenance): run "
           f"{self.run_id} ended with it; {self.checkpoint_phrase(mirror)}")
    elif outcome.kind == "unreachable":
      ended = [f"worker {w} exit {rc}" for w, (rc, _) in sorted(self.exits.items())]
      warn(f"could not reach worker(s) {' '.join(map(str, outcome.missing))} of {name}: their run "
           f"{self.run_id} may still be going"
           + (f" ({', '.join(ended)} known ended)" if ended else "")
           + f". Check with {self.later('status')}; follow with {self.later('attach')}")

  # Interruption ---------------------------------------------------------------------------------

  def on_interrupt(self):
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    self.gc.end_all()
    print(file=sys.stderr)
    f = self.follower
    if self.phase == "run" and f is not None and f.phase == "run":
      started = set(f.started) | set(self.exits)
      if len(started) < self.num_workers:
        waiting = [w for w in range(self.num_workers) if w not in started]
        warn(f"interrupted while run {self.run_id} attempt {self.attempt} was starting: worker(s) "
             f"{' '.join(map(str, sorted(started))) or 'none'} had started, worker(s) "
             f"{' '.join(map(str, waiting))} had not; stopping it on every worker (a partial run "
             "would wait for the missing ones)")
        rc, out = self.gc.run(self.ssh_args_for(ALL, self.stop_cmd(
            FAILFAST_GRACE_S, self.run_id, self.attempt)), FAILFAST_GRACE_S + SSH_TIMEOUT_S)
        with open(os.path.join(f.mirror, "stop.log"), "a") as log:
          log.write(out)
        if rc == 0:
          warn(f"stopped: run {self.run_id} runs on no worker now (its stop is recorded, so a "
               "late start refuses)")
        else:
          warn(f"the stop failed on some worker (gcloud exit code {rc}; see {f.mirror}/stop.log); "
               f"check with {self.later('status')}")
        return 130
    if self.phase in ("run", "watch"):
      warn(f"detached: run {self.run_id} goes on on the workers (Ctrl-C does not stop it).")
      warn(f"  follow it again: {self.later('attach')}")
      warn(f"  its status:      {self.later('status')}")
      warn(f"  stop it:         {self.later('stop')}")
      if self.o.watch:
        warn("  (the --watch relaunching ended with this pod.sh)")
    elif self.phase in ("attach", "logs"):
      warn(f"detached; the run goes on on the workers. Stop it with {self.later('stop')}")
    else:
      if self.claimed:
        self.release(self.attempt)
      warn("interrupted before the run started; nothing was started on the workers")
    return 130

  def close(self):
    self.gc.end_all()
    shutil.rmtree(self.scratch, ignore_errors=True)
    if self.watch_file:
      try:
        os.unlink(self.watch_file)
      except OSError:
        pass


class Outcome:
  """How following a run ended: ok | failed | refused | stopped | preempted | unreachable."""

  def __init__(self, kind, worker=None, rc=None, stopped=False, other=None, by=None, missing=()):
    self.kind, self.worker, self.rc, self.stopped = kind, worker, rc, stopped
    self.other, self.by, self.missing = other, by, list(missing)


def lost_reason(s):
  if s["state"] in ("prepared", "shipping"):
    return f"its run never started there (state {s['state']}): no process and no exit code"
  if s["state"] == "stopped":
    return "its run was stopped there before it started"
  return "its processes are gone without an exit code"


def count_lines(path):
  try:
    with open(path, "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return 0


def last_line(path):
  try:
    with open(path, "rb") as f:
      lines = [l for l in f.read().decode(errors="replace").splitlines() if l.strip()]
  except OSError:
    return ""
  return lines[-1][:200] if lines else ""


def tail(path, n=15):
  try:
    with open(path, "rb") as f:
      lines = f.read().decode(errors="replace").splitlines()[-n:]
  except OSError:
    return
  for line in lines:
    print("    " + line, file=sys.stderr)
  sys.stderr.flush()


class Follower:
  """Reads gcloud's merged output of one command on the workers. `[worker <i> <n>] line` is line n
  of worker i's run log: shown once (a re-attach or a gcloud retry repeats lines) and appended to
  MIRROR/worker-<i>.log; `[worker <i>]` lines (prepare) go to MIRROR/<phase>-worker-<i>.log; the
  protocol lines (worker.py's docstring) are recorded. While a run is followed, every worker is
  accounted for: the first failure stops every worker's run (fail-fast), and a worker whose
  connection ended, or that was silent for --lost-after s, is asked for its run; without a live
  process or an exit code it is lost."""

  def __init__(self, pod, phase, attempt, mirror):
    self.pod, self.phase, self.attempt, self.mirror = pod, phase, attempt, mirror
    self.got = {w: count_lines(os.path.join(mirror, f"worker-{w}.log"))
                for w in range(pod.num_workers)}
    run = phase == "run"
    self.exits = pod.exits if run else {}
    self.arrivals = pod.arrivals if run else []
    self.refused = pod.refused if run else {}
    self.stopped = pod.stopped_by if run else {}
    self.started = set()
    self.failfast = False
    now = time.monotonic()
    self.last_seen = {w: now for w in range(pod.num_workers)}
    self.next_check = {}
    self.unreachable_since = {}
    self.conn_ended = set()

  def run(self, args, timeout):
    pod = self.pod
    proc = pod.gc.popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = queue.Queue()

    def read():
      for raw in proc.stdout:
        lines.put(raw.decode(errors="surrogateescape").rstrip("\n"))
      lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout if timeout else None
    while True:
      try:
        line = lines.get(timeout=1.0)
      except queue.Empty:
        line = ""
      if line is None:
        break
      if line:
        self.handle(line)
      if deadline and time.monotonic() > deadline:
        warn(f"'{show([GCLOUD, *args[:6]])} ...' timed out after {timeout} s")
        pod.gc.end(proc)
        break
      if self.phase == "run":
        self.account()
        if all(w in self.exits for w in range(pod.num_workers)):
          try:                           # every worker accounted for: a hung connection is moot
            proc.wait(timeout=10)
          except subprocess.TimeoutExpired:
            pod.gc.end(proc)
          while True:                    # what is left of the output
            try:
              line = lines.get(timeout=1.0)
            except queue.Empty:
              break
            if line is None:
              break
            self.handle(line)
          break
    rc = shell_rc(proc.wait())
    pod.gc.children.discard(proc)
    for stopper in pod.stoppers:
      try:
        stopper.wait(timeout=FAILFAST_GRACE_S + SSH_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        pod.gc.end(stopper)
      pod.gc.children.discard(stopper)
    pod.stoppers = []
    return rc

  def seen(self, w):
    self.last_seen[w] = time.monotonic()
    self.unreachable_since.pop(w, None)

  def handle(self, line):
    pod = self.pod
    m = re.match(r"\[worker (\d+) (\d+)\] ?(.*)$", line, re.S)
    if m:
      w, n, text = int(m.group(1)), int(m.group(2)), m.group(3)
      self.seen(w)
      self.started.add(w)
      if n > self.got.get(w, 0):
        with open(os.path.join(self.mirror, f"worker-{w}.log"), "ab") as f:
          f.write(text.encode(errors="surrogateescape") + b"\n")
        self.got[w] = n
        _out(sys.stdout, f"[worker {w}] {text}")
      return
    m = re.match(r"\[worker (\d+)\] ?(.*)$", line, re.S)
    if m:
      with open(os.path.join(self.mirror, f"{self.phase}-worker-{m.group(1)}.log"), "ab") as f:
        f.write(m.group(2).encode(errors="surrogateescape") + b"\n")
      self.seen(int(m.group(1)))
    elif line.startswith("PODLAB_ALIVE "):
      m = re.match(r"PODLAB_ALIVE worker=(\d+)", line)
      if m:
        self.seen(int(m.group(1)))
      return
    m = re.search(r"PODLAB_WORKER_EXIT worker=(\d+) rc=(\S+)", line)
    if m:
      self.seen(int(m.group(1)))
      self.exit(int(m.group(1)), m.group(2), "stopped_by_user=1" in line)
      if self.phase == "tail":
        return
    m = re.search(r"PODLAB_WORKER_REFUSED worker=(\d+) running=(\S+) attempt=(\S+)", line)
    if m:
      self.refused[int(m.group(1))] = (m.group(2), m.group(3))
      self.exit(int(m.group(1)), "refused")
    m = re.search(r"PODLAB_WORKER_STOPPED worker=(\d+) .*by=(\S+)", line)
    if m:
      self.stopped[int(m.group(1))] = m.group(2)
      self.exit(int(m.group(1)), "stopped")
    m = CONNECTION_FAILED.match(line)
    if m and int(m.group(1)) not in self.exits:
      self.conn_ended.add(int(m.group(1)))
    _out(sys.stdout, line)

  def exit(self, w, rc, stopped=False):
    """Worker W's result (its first one counts). In a run, the first failure stops every worker's
    run (fail-fast), with its stop recorded there: a worker whose start is late does not start."""
    if w in self.exits:
      return
    self.exits[w] = (rc, stopped)
    self.arrivals.append((w, rc, stopped))
    if self.phase == "run" and rc not in ("0", "130", "143") and not self.failfast:
      self.failfast = True
      if rc not in ("stopped", "refused", "lost"):
        warn(f"worker {w} failed (exit {rc}); stopping the run on every worker")
      self.pod.stop_run(self.attempt, self.mirror, wait=False)

  def account(self):
    """Asks a worker whose connection ended, or that was silent for --lost-after s, for its run;
    declares it lost when it has no live process and no exit code (module doc)."""
    pod = self.pod
    if not pod.lost_after:
      return
    now = time.monotonic()
    for w in range(pod.num_workers):
      if w in self.exits:
        continue
      due = self.next_check.get(w)
      silent = now - self.last_seen[w] >= pod.lost_after
      if due is None and not silent and w not in self.conn_ended:
        continue
      if due is not None and now < due:
        continue
      st = pod.query_status(str(w), timeout=max(30, min(SSH_TIMEOUT_S, pod.lost_after)))
      s = st.get(w)
      if s is None:
        since = self.unreachable_since.setdefault(w, now)
        if now - since >= pod.lost_after:
          pod.declare_lost(w, f"unreachable for {now - since:.0f} s", self.mirror)
        else:
          self.next_check[w] = now + min(RECONNECT_DELAY_S, pod.lost_after)
        continue
      self.unreachable_since.pop(w, None)
      if (s["run"], s["attempt"]) == (pod.run_id, str(self.attempt)) and s["state"] in (
          "running", "starting"):
        self.last_seen[w] = now
        self.next_check[w] = now + pod.lost_after if w in self.conn_ended else None
      elif (s["run"], s["attempt"]) == (pod.run_id, str(self.attempt)) and s["rc"] != "-":
        warn(f"worker {w}: run {pod.run_id} attempt {self.attempt} ended (exit code {s['rc']}); "
             "its connection had ended before it said so")
        self.exit(w, s["rc"], s["stopped"] == "1")
      elif (s["run"], s["attempt"]) != (pod.run_id, str(self.attempt)):
        pod.declare_lost(w, f"run {pod.run_id} attempt {self.attempt} never started there (its "
                            f"current run is {s['run']} attempt {s['attempt']}, state {s['state']})"
                         if s["state"] != "none" else
                         f"run {pod.run_id} never started there (no run recorded)", self.mirror)
      else:
        pod.declare_lost(w, lost_reason(s), self.mirror)


def main(argv):
  try:
    opts = Options(argv)
  except Exit as e:
    return e.code
  pod = Pod(opts)

  def interrupted(signum, frame):
    del signum, frame
    raise Interrupted()

  signal.signal(signal.SIGINT, interrupted)
  signal.signal(signal.SIGTERM, interrupted)
  try:
    pod.resolve()
    return {"start": pod.cmd_start, "status": pod.cmd_status, "logs": pod.cmd_logs,
            "attach": pod.cmd_attach, "stop": pod.cmd_stop}[opts.sub]()
  except Exit as e:
    return e.code
  except Interrupted:
    return pod.on_interrupt()
  finally:
    pod.close()


if __name__ == "__main__":
  try:
    sys.exit(main(sys.argv[1:]))
  except BrokenPipeError:                 # `pod.sh --help | head`: the reader is gone
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(141)
