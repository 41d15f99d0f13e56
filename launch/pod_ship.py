"""Shipping the code (Shipping, a part of launch/pod.py's Pod): step 0, the module, the config and
the code that ships, packed (launch/pack.py) and checked here before any gcloud TPU call; step 3,
the archive copied to every worker.
"""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

from pod_common import (ENV, Exit, GCLOUD_RETRY_S, GCLOUD_TRIES, HERE, REPO, SCP_TIMEOUT_S, die,
                        say, warn)


class Shipping:
  """Steps 0 and 3 of a start (launch/pod.py's docstring), a part of pod.Pod (sets config_sent)."""

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
