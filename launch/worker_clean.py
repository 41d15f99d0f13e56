"""`worker.sh clean`: podlab's own stale processes that still hold a TPU device are stopped and the
libtpu lockfile removed; other holders are listed (and stopped only with --stop-others).
"""
import glob
import os
import shutil
import subprocess
import sys
import time

from worker_common import (BOOT_ID, Fail, HOST, STATE_DIR, STOP_GRACE_S, is_process, parse_opts,
                           proc_start, say, warn)
from worker_record import read_record, refuse_if_live
from worker_setup import ACCEL_GLOB, SUDO, accel_devices, apt_get, as_root

LIBTPU_LOCKFILE = os.environ.get("PODLAB_LIBTPU_LOCKFILE", "/tmp/libtpu_lockfile")
LSOF = os.environ.get("PODLAB_LSOF", "lsof")


def is_podlab_process(pid):
  """PID is podlab's own: a recorded supervisor or command of a run here (its identity, not its
  pid alone), or a process whose environment carries the PODLAB_RUN_ID of a run recorded here."""
  ids = []
  for path in glob.glob(os.path.join(STATE_DIR, "worker-*.run")):
    rec = read_record(path)
    for p, s in (("pid", "pid_start"), ("cmd_pid", "cmd_start")):
      if rec.get(p) == str(pid) and is_process(pid, rec.get(s), rec.get("boot_id")):
        return True
    if rec.get("run_id"):
      ids.append(f"PODLAB_RUN_ID={rec['run_id']}")
  if not ids:
    return False
  env = as_root(["cat", f"/proc/{pid}/environ"], capture_output=True).stdout
  variables = env.decode(errors="replace").split("\0")
  return any(v in variables for v in ids)


def stop_pids(pids):
  """SIGTERM to PIDS (as root), SIGKILL after the grace to those still there (the same
  processes: their start times are taken first)."""
  starts = [proc_start(p) for p in pids]
  as_root(["kill", "-TERM", *map(str, pids)], stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + float(STOP_GRACE_S)
  while time.monotonic() < deadline and any(is_process(p, s, BOOT_ID)
                                            for p, s in zip(pids, starts)):
    time.sleep(0.1)
  left = [str(p) for p, s in zip(pids, starts) if is_process(p, s, BOOT_ID)]
  if left:
    as_root(["kill", "-KILL", *left], stderr=subprocess.DEVNULL)


def clean(args, i):
  stop_others = "--stop-others" in parse_opts(args, {"--stop-others": 0}, "clean")
  refuse_if_live(i, "nothing was cleaned")
  devices = accel_devices()
  if not devices:
    say(f"no TPU devices on {HOST} ({ACCEL_GLOB}); nothing to clean")
    return 0
  if SUDO and as_root(["true"], stderr=subprocess.DEVNULL).returncode:
    warn(f"warning: '{' '.join(SUDO)} true' failed on {HOST}: processes of other users holding the "
         "TPU cannot be seen")
  if shutil.which(LSOF) is None:
    say(f"lsof missing on {HOST}; installing it with apt-get (it finds processes holding the TPU)")
    apt_get(["install", "-y", "-qq", "lsof"], out=sys.stderr)
    if shutil.which(LSOF) is None:
      raise Fail(f"lsof is missing on {HOST} and could not be installed (apt-get install lsof "
                 "failed); without it processes holding the TPU cannot be found. Fix: sudo apt-get "
                 "install -y lsof on that worker (or use an image that has it), then relaunch")
  out = as_root([LSOF, "-t", *devices], capture_output=True, text=True).stdout
  holders = sorted({int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()})
  ours = [p for p in holders if is_podlab_process(p)]
  others = [p for p in holders if p not in ours]
  if ours:
    say(f"stopping podlab's stale processes holding the TPU on {HOST}: {' '.join(map(str, ours))} "
        f"(SIGTERM, SIGKILL after {STOP_GRACE_S} s)")
    stop_pids(ours)
  if others:
    say(f"other processes hold the TPU on {HOST} (user, pid, command):")
    for pid in others:
      try:
        import pwd  # pylint: disable=g-import-not-at-top
        user = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
      except (OSError, KeyError):
        user = "?"
      cmd = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True,
                           text=True).stdout.strip()[:200]
      say(f"  {user} {pid} {cmd}")
    if not stop_others:
      raise Fail(f"{len(others)} process(es) that are not podlab's hold the TPU on {HOST} (listed "
                 "above); not stopped. Fix: end them, or relaunch with launch/pod.sh NAME "
                 f"--stop-tpu-holders to stop them (SIGTERM, SIGKILL after {STOP_GRACE_S} s)")
    say(f"stopping them (--stop-tpu-holders): SIGTERM, SIGKILL after {STOP_GRACE_S} s")
    stop_pids(others)
  if not holders:
    say(f"no process holds the TPU on {HOST}")
  if os.path.exists(LIBTPU_LOCKFILE) and as_root(["rm", "-f", LIBTPU_LOCKFILE]).returncode == 0:
    say(f"removed the libtpu lockfile {LIBTPU_LOCKFILE}")
  return 0
