"""A worker's state on disk (launch/worker.py's docstring: the states and the journal): the run
records, replaced atomically under their locks, the append-only journal, and what they say now: a
record's state, the stop request that applies to a run, which launch holds the slice.
"""
import glob
import os
import shutil
import time

from worker_common import Fail, HOST, STATE_DIR, as_float, identity, is_process, say

CLAIM_TTL_S = float(os.environ.get("PODLAB_CLAIM_TTL_S", "1200"))
PREPARED_TTL_S = float(os.environ.get("PODLAB_PREPARED_TTL_S", "600"))
LIVE = ("shipping", "prepared", "starting", "running")     # states that hold the worker


def record_path(i):
  return os.path.join(STATE_DIR, f"worker-{i}.run")


def read_record(path):
  """{key: value} of a record file; {} when there is none."""
  try:
    with open(path, errors="replace") as f:
      text = f.read()
  except OSError:
    return {}
  rec = {}
  for line in text.splitlines():
    key, eq, value = line.partition("=")
    if eq and key not in rec:
      rec[key] = value
  return rec


def write_record(path, rec):
  """Replaces PATH atomically (a temporary file, synced, renamed); OSError when it cannot."""
  tmp = f"{path}.tmp.{os.getpid()}"
  text = "".join(f"{k}={str(v).replace(chr(10), ' ')}\n" for k, v in rec.items())
  try:
    with open(tmp, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise


def update_record(path, lock, **changes):
  """Read-modify-write of a record under its lock (a supervisor and `stop` both write it)."""
  lock_acquire(lock, 30, "updating " + path)
  try:
    rec = read_record(path)
    rec.update({k: v for k, v in changes.items() if v is not None})
    for k, v in changes.items():
      if v is None:
        rec.pop(k, None)
    write_record(path, rec)
    return rec
  finally:
    lock_release(lock)


def record_lock(i):
  return os.path.join(STATE_DIR, f"worker-{i}.rec.lock")


def journal_path():
  return os.path.join(STATE_DIR, "journal")


def journal():
  """The journal's entries, each a list of fields."""
  try:
    with open(journal_path(), errors="replace") as f:
      return [line.split() for line in f if line.split()]
  except OSError:
    return []


def journal_append(*fields):
  """One line, appended atomically (O_APPEND, one write of less than PIPE_BUF)."""
  os.makedirs(STATE_DIR, exist_ok=True)
  fd = os.open(journal_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())
  finally:
    os.close(fd)


def stop_request(entries, run_id, attempt, claimed_at):
  """The stop entry that applies to run_id attempt: one naming that attempt, or one for every
  launch recorded after the run's claim (claimed_at, the claim's time on worker 0); else None."""
  for e in entries:
    if e[0] != "stop" or len(e) < 2:
      continue
    if len(e) >= 5:
      if e[3] == run_id and e[4] == str(attempt):
        return e
    elif claimed_at is not None and as_float(e[1]) > claimed_at:
      return e
  return None


def _gone(entries, run_id, attempt, at):
  """A claimed launch given up (released) or stopped since its claim at `at`."""
  for e in entries:
    if e[0] == "release" and len(e) > 1 and e[1] == run_id:
      return True
  return stop_request(entries, run_id, attempt, at) is not None


def arbitrate(entries, run_id, now, phase_of):
  """The earlier launch that holds the slice before run_id's first claim, as (run, attempt,
  state, claimed at, by), or None. Claims are ordered by the journal: of two launches, exactly one
  is first. An earlier claim holds while its run is in a live state here (phase_of(run)), or, not
  yet prepared here (phase_of: None), for PODLAB_CLAIM_TTL_S after the claim, unless released or
  stopped."""
  mine = next((n for n, e in enumerate(entries) if e[0] == "claim" and e[1:2] == [run_id]),
              len(entries))
  seen = set()
  for e in reversed(entries[:mine]):
    if e[0] != "claim" or len(e) < 5 or e[1] == run_id or e[1] in seen:
      continue
    seen.add(e[1])
    at = as_float(e[3])
    if _gone(entries, e[1], e[2], at):
      continue
    state = phase_of(e[1])
    if state is None and now - at < CLAIM_TTL_S:
      state = "shipping"
    if state in LIVE:
      return e[1], e[2], state, at, e[4]
  return None


def pending_claim(entries, rec, now):
  """The newest claim here of a run that has no record yet (it is being shipped), or None."""
  for e in reversed(entries):
    if e[0] != "claim" or len(e) < 5:
      continue
    if e[1] == rec.get("run_id") or now - as_float(e[3]) >= CLAIM_TTL_S:
      return None
    return None if _gone(entries, e[1], e[2], as_float(e[3])) else e
  return None


def proc_alive(rec, which):
  """The recorded supervisor (pid), command (cmd) or prepare process of a record is alive."""
  pid, start = {"pid": ("pid", "pid_start"), "cmd": ("cmd_pid", "cmd_start"),
                "prepare": ("prepare_pid", "prepare_start")}[which]
  return is_process(rec.get(pid, ""), rec.get(start, ""), rec.get("boot_id", ""))


def phase(rec, entries=None):
  """A record's state now (the module doc's table)."""
  if not rec:
    return "none"
  if "rc" in rec:
    return "stopped" if rec.get("stopped_by_user") == "1" else "ended"
  state = rec.get("state", "running")
  if state == "stopped":
    return "stopped"
  if state in ("shipping", "prepared"):
    claimed = as_float(rec.get("claimed_at"), None)
    entries = journal() if entries is None else entries
    if stop_request(entries, rec.get("run_id"), rec.get("attempt"), claimed):
      return "stopped"
    if any(e[0] == "release" and e[1:3] == [rec.get("run_id"), rec.get("attempt")]
           for e in entries):
      return "lost"                         # its launcher gave it up before it started
    if state == "shipping":
      return "shipping" if proc_alive(rec, "prepare") else "lost"
    return "prepared" if time.time() - as_float(rec.get("prepared")) < PREPARED_TTL_S else "lost"
  if proc_alive(rec, "pid") or proc_alive(rec, "cmd"):
    return "running" if state == "running" else "starting"
  return "lost"


def run_phrase(rec):
  """E.g. "run 2025-x attempt 0 (pid 123, started ..., log ...)"."""
  started = rec.get("started", "")
  if started.isdigit():
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(started)))
  return (f"run {rec.get('run_id')} attempt {rec.get('attempt')} (pid {rec.get('pid', '-')}, "
          f"started {started or '-'}, log {rec.get('log', '-')})")


def records():
  """[(worker index, record path)] of the current records here."""
  out = []
  for path in sorted(glob.glob(os.path.join(STATE_DIR, "worker-*.run"))):
    if not path.endswith(".prev.run"):
      out.append((os.path.basename(path)[len("worker-"):-len(".run")], path))
  return out


# --------------------------------------------------------------------------------------------------
# Locks: a symlink whose target is its owner's identity (`PID START BOOT`), created atomically and
# taken over when its owner is no longer that process.

def lock_acquire(path, limit, what):
  me = identity(os.getpid())
  start, announced = time.monotonic(), False
  while True:
    try:
      os.symlink(me, path)
      return
    except FileExistsError:
      pass
    except OSError as e:
      raise Fail(f"cannot create the lock {path}: {e.strerror}. Fix: free space on (or make "
                 f"writable) {os.path.dirname(path)}") from e
    try:
      owner = os.readlink(path)
    except OSError:
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)         # an older worker.sh's lock folder
      continue                                          # released meanwhile: try again
    parts = owner.split(" ")
    if len(parts) != 3 or not is_process(*parts):
      try:                                              # its owner is gone: take it over
        if os.readlink(path) == owner:
          os.unlink(path)
      except OSError:
        pass
      continue
    if time.monotonic() - start >= limit:
      raise Fail(f"{what}: {path} is held by pid {parts[0]} for {limit} s; wait for it, or "
                 "remove it if that process is not podlab's")
    if not announced and limit > 60:
      say(f"waiting for {path} (pid {parts[0]}): {what} (up to {limit} s)")
      announced = True
    time.sleep(0.1)


def lock_release(path):
  try:
    if os.readlink(path) == identity(os.getpid()):
      os.unlink(path)
  except OSError:
    pass


def refuse_if_live(i, what, run_id=None, states=("starting", "running")):
  """Fails (exit 2, after a `PODLAB_WORKER_REFUSED` line) when another run here is in `states`."""
  entries = journal()
  for _, path in records():
    rec = read_record(path)
    state = phase(rec, entries)
    if state in states and rec.get("run_id") != run_id:
      say(f"PODLAB_WORKER_REFUSED worker={i} running={rec.get('run_id')} "
          f"attempt={rec.get('attempt')} pid={rec.get('pid', '-')} state={state}")
      raise Fail(f"{HOST} still runs {run_phrase(rec)}; {what}. Fix: follow it (launch/pod.sh NAME "
                 "attach) or stop it first (launch/pod.sh NAME stop)")
