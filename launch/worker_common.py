"""What every command of launch/worker.py shares: its settings from the environment, its errors and
output, the worker's index, the command-line options of a subcommand, and process identity (a pid,
its start time and the boot it runs in). Standard library only, like worker.py.
"""
import os
import re
import socket
import subprocess
import sys
import time

LAUNCH = os.path.dirname(os.path.abspath(__file__))
WORKER_PY = os.path.join(LAUNCH, "worker.py")   # what worker.py re-runs (`_prepare`, `_supervise`)
STATE_DIR = os.environ.get("PODLAB_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".podlab")
STOP_GRACE_S = os.environ.get("PODLAB_STOP_GRACE_S", "10")
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
HOST = socket.gethostname()


class Fail(Exception):
  """Ends the command: `worker.sh: error: <message>` on stderr and exit `code`."""

  def __init__(self, message, code=2):
    super().__init__(message)
    self.code = code


def say(*parts):
  print(" ".join(str(p) for p in parts), flush=True)


def warn(*parts):
  print(" ".join(str(p) for p in parts), file=sys.stderr, flush=True)


def worker_index():
  if os.environ.get("PODLAB_PROCESS_ID"):
    return os.environ["PODLAB_PROCESS_ID"]
  try:
    import urllib.request  # pylint: disable=g-import-not-at-top
    req = urllib.request.Request(METADATA_URL + "/agent-worker-number",
                                 headers={"Metadata-Flavor": "Google"})
    n = urllib.request.urlopen(req, timeout=5).read().decode().strip()
    if n.isdigit():
      return n
  except Exception:  # pylint: disable=broad-except
    pass
  m = re.search(r"-w-(\d+)$", HOST)
  return m.group(1) if m else "0"


def now_epoch():
  return f"{time.time():.6f}"


def as_float(value, default=0.0):
  try:
    return float(value)
  except (TypeError, ValueError):
    return default


def parse_opts(args, spec, sub):
  """{flag: value} for `--flag V`, `--flag=V` and flags without a value (spec: flag -> arity)."""
  out = {}
  it = iter(args)
  for a in it:
    key, eq, value = a.partition("=")
    if key in spec and (spec[key] == 1):
      if not eq:
        value = next(it, None)
        if value is None:
          raise Fail(f"{sub}: {key} needs a value")
      out[key] = value
    elif a in spec:
      out[a] = True
    else:
      raise Fail(f"{sub}: unknown option '{a}' (expected {', '.join(spec)})")
  return out


# --------------------------------------------------------------------------------------------------
# Process identity: a pid, its start time and the boot it runs in. A pid alone is reused (after a
# hard kill, an OOM-killed supervisor, a reboot that keeps the disk) and must never make a run look
# alive, nor get a signal meant for it.

def _boot_id():
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:
    out = subprocess.run(["sysctl", "-n", "kern.boottime"], capture_output=True, text=True)
    return out.stdout.replace(" ", "").strip()


BOOT_ID = _boot_id()


def proc_start(pid):
  """PID's start time (Linux: clock ticks since boot, else `ps -o lstart`); None when there is no
  such process, or only its zombie."""
  pid = str(pid)
  if not pid.isdigit():
    return None
  if os.path.isdir("/proc/self"):
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(") ", 1)[-1].split()   # after the name, which may hold ') '
    except OSError:
      return None
    return None if len(fields) < 20 or fields[0] == "Z" else fields[19]
  out = subprocess.run(["ps", "-o", "lstart=", "-p", pid], capture_output=True, text=True).stdout
  return "_".join(out.split()) or None


def is_process(pid, start, boot):
  """PID is alive and is the process recorded with START in boot BOOT."""
  return bool(start) and bool(BOOT_ID) and boot == BOOT_ID and proc_start(pid) == start


def identity(pid):
  return f"{pid} {proc_start(pid) or ''} {BOOT_ID}"
