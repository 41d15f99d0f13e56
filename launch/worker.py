"""One worker of a podlab run: set up its environment, prepare a run's code, start the run detached,
follow it, stop it, report it. Standard library only (Python >= 3.8): it runs with a TPU VM's own
python3, before any environment exists. `launch/worker.sh` (`python3 launch/worker.py "$@"`) is the
command: launch/pod.py runs it on every worker of a slice (`gcloud ... ssh --worker=all`) and
launch/local.sh once per local process, so a pod and a local pod share this code path.

  worker.sh setup [--python PATH] [--venv DIR] [--jax tpu|cpu]
      Idempotent. Without --python: create DIR (default ~/podlab-venv) with Python 3.11 and install
      the pinned stack (constraints.txt; on TPU jax[tpu], so libtpu at the version jax pins) unless
      DIR's stamp says it is current. Python 3.11 missing (Ubuntu 22.04 TPU images ship 3.10):
      `apt-get install python3.11 python3.11-venv` from Ubuntu's own archive, after waiting for the
      dpkg lock. With --python: use that interpreter as is, only check the pinned versions. Prints
      `PODLAB_PYTHON=<interpreter>` last. One setup of a venv at a time (the lock DIR.setup.lock).
  worker.sh claim --run-id ID
      Worker 0 of a slice, right after launch/pod.py appended the launch's claim line to the
      journal: `PODLAB_CLAIM granted run=ID at=T` when no earlier launch holds the slice, else
      `PODLAB_CLAIM refused run=ID holder=H attempt=A state=S at=T by=WHO` (and a release line).
  worker.sh prepare --run-id ID --attempt A [--claimed-at T] [--stop-others] [setup options]
      Run from the run's code freshly unpacked into <runs>/<ID>.new: refuses while another run is
      alive here or when a stop request came after the claim; records the run as `shipping`, stops
      podlab's own stale TPU holders (`clean`), moves the code to <runs>/<ID> (~/podlab: a link to
      it), runs `setup`, records `prepared`. Output prefixed `[worker <i>] `, then
      `PODLAB_WORKER_EXIT worker=<i> rc=<code> phase=prepare`.
  worker.sh clean [--stop-others]
      On a TPU VM: stops podlab's own stale processes that still hold a TPU device (found with
      `lsof`, installed if missing: a recorded run's processes, by identity, or a process carrying
      a recorded PODLAB_RUN_ID) and removes the libtpu lockfile, with sudo when not root. Other
      holders are listed (user, pid, command) and make it fail (exit 2), leaving them and the
      lockfile alone; --stop-others stops them too. Refuses while a podlab run is alive here.
  worker.sh run --run-id ID [--attempt A] [--claimed-at T] --log-dir DIR [--detach]
                [--follow [--numbered]] [--from-line N | --from I:N,...] [--alive-every S] -- CMD...
      Records the run (`starting`) before anything starts, then starts CMD (argv, never re-parsed
      by a shell) under a supervisor that appends its output to DIR/worker-<i>.log (never
      truncated), records its processes (`running`) and exit code (`ended`, or `stopped` after a
      user's stop) and exports PODLAB_RUN_ID=ID, PODLAB_RUN_ATTEMPT=A. A record or log that cannot
      be written (disk full, read-only) refuses with the reason (exit 2) and starts nothing; a
      supervisor that does not confirm its start within 20 s is stopped. --detach: the run gets
      its own session, so it outlives this shell, its ssh connection and its launcher.
      Idempotent: run ID attempt A alive here attaches to it (never a second process); ended, it
      reports its exit code (never reruns it); another run alive refuses, naming it
      (`PODLAB_WORKER_REFUSED ...`, exit 2); a stop request for it refuses
      (`PODLAB_WORKER_STOPPED ...`). Then (unless --detach without --follow) follows it like
      `attach`.
  worker.sh attach [--run-id ID [--attempt A]] [--follow [--numbered]] [--from-line N | --from LIST]
      Waits for this worker's current run (or run ID attempt A) to end; --follow prints its log,
      each line prefixed `[worker <i>] ` (--numbered: `[worker <i> <line number>] `) from line N+1
      on, and `PODLAB_ALIVE worker=<i>` after S quiet seconds (--alive-every S); ends with
      `PODLAB_WORKER_EXIT worker=<i> rc=<exit code|lost> run=ID attempt=A log=<file>` and exits
      with the run's exit code.
  worker.sh status
      One line per recorded run here: `PODLAB_STATUS worker=<i> state=<state> run=ID attempt=A
      pid=P rc=R step=S stopped=0|1 log=<file> last=<last log line>`.
  worker.sh logs [-f] [-n LINES] [--prefix]
      The current run's log (-f: follow it until the run ends; --prefix: `[worker <i>] ` lines).
  worker.sh stop [--grace S] [--run-id ID [--attempt A]] [--by-user] [--by WHO]
      Records a stop request in the journal (so that a launch being shipped or started does not
      start), marks a run being prepared `stopped`, and stops this machine's live podlab runs (or
      only run ID): SIGTERM to the run's process group (the trainer saves a checkpoint and exits
      143), SIGKILL after S seconds (default $PODLAB_STOP_GRACE_S, else 10). --by-user records
      it, so that `pod.sh --watch` does not relaunch a run its user stopped.
  worker.sh tpu-pin [--python PATH]
      Prints the libtpu requirement that PATH's jax pins for jax[tpu], e.g. `libtpu==0.0.42.*`.

A run's states, in the record `$PODLAB_STATE_DIR/worker-<i>.run` (default ~/.podlab; `key=value`
lines, replaced atomically). Each is written before what it names happens, so status, stop,
attach and pod.sh --watch read one truth:

  shipping   prepare has begun (its process is recorded); before it, worker 0's journal holds the
             launch's claim: a claim not yet prepared is `shipping` too (pod.sh copies the code)
  prepared   the code and environment are in place; the run may start (for PODLAB_PREPARED_TTL_S,
             default 600 s)
  starting   written before the supervisor is spawned
  running    the supervisor started the command (both processes recorded)
  ended      the exit code is recorded
  stopped    stopped before it started (nothing will start: by its user, or by its launcher when
             another worker failed), or its exit after a user's stop
  lost       (derived) not ended, and no recorded process is alive with its recorded start time in
             this boot, or a prepare that died: never signalled, no obstacle to a new launch

The journal `$PODLAB_STATE_DIR/journal` is append-only, one line per event: `claim RUN ATTEMPT T
WHO` (worker 0, written by launch/pod.py's claim one-liner), `release RUN ATTEMPT T` (a launch that
gave up before running), `stop T WHO [RUN ATTEMPT]` (a stop request: for every launch claimed
before T, or for that run attempt only). T is the worker's clock (`date +%s.%N`).

The worker index <i> is $PODLAB_PROCESS_ID when set (local runs, tests), else the TPU VM's
`agent-worker-number` from the metadata server, else the `-w-<i>` suffix of the hostname.

Environment knobs: PODLAB_STATE_DIR, PODLAB_STOP_GRACE_S, PODLAB_CLAIM_TTL_S (1200: how long a
claim not yet prepared holds the slice), PODLAB_PREPARED_TTL_S, PODLAB_DPKG_LOCK_TIMEOUT_S (600:
how long apt-get waits for the dpkg lock), PODLAB_SETUP_LOCK_TIMEOUT_S (3600: how long a setup
waits for another setup of the same venv), PODLAB_SUDO (the sudo command; default `sudo -n` when
not root, none as root). Test hooks: PODLAB_ACCEL_GLOB (the TPU device files, default
`/dev/accel* /dev/vfio/[0-9]*`), PODLAB_LIBTPU_LOCKFILE (/tmp/libtpu_lockfile), PODLAB_LSOF (lsof),
PODLAB_DPKG_LOCK_POLL_S (10).
"""
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

if "PODLAB_CALLER_PATH" in os.environ:     # worker.sh's PATH, before its python3's shim changed it
  os.environ["PATH"] = os.environ.pop("PODLAB_CALLER_PATH")
STATE_DIR = os.environ.get("PODLAB_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".podlab")
STOP_GRACE_S = os.environ.get("PODLAB_STOP_GRACE_S", "10")
CLAIM_TTL_S = float(os.environ.get("PODLAB_CLAIM_TTL_S", "1200"))
PREPARED_TTL_S = float(os.environ.get("PODLAB_PREPARED_TTL_S", "600"))
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"
ACCEL_GLOB = os.environ.get("PODLAB_ACCEL_GLOB", "/dev/accel* /dev/vfio/[0-9]*")
LIBTPU_LOCKFILE = os.environ.get("PODLAB_LIBTPU_LOCKFILE", "/tmp/libtpu_lockfile")
LSOF = os.environ.get("PODLAB_LSOF", "lsof")
DPKG_LOCK_TIMEOUT_S = int(os.environ.get("PODLAB_DPKG_LOCK_TIMEOUT_S", "600"))
DPKG_LOCK_POLL_S = float(os.environ.get("PODLAB_DPKG_LOCK_POLL_S", "10"))
SETUP_LOCK_TIMEOUT_S = int(os.environ.get("PODLAB_SETUP_LOCK_TIMEOUT_S", "3600"))
if "PODLAB_SUDO" in os.environ:
  SUDO = shlex.split(os.environ["PODLAB_SUDO"])
else:
  SUDO = [] if os.geteuid() == 0 else ["sudo", "-n"]
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LIVE = ("shipping", "prepared", "starting", "running")     # states that hold the worker
START_TIMEOUT_S = 20
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


# --------------------------------------------------------------------------------------------------
# Records and the journal

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


def now_epoch():
  return f"{time.time():.6f}"


def _float(value, default=0.0):
  try:
    return float(value)
  except (TypeError, ValueError):
    return default


def stop_request(entries, run_id, attempt, claimed_at):
  """The stop entry that applies to run_id attempt: one naming that attempt, or one for every
  launch recorded after the run's claim (claimed_at, the claim's time on worker 0); else None."""
  for e in entries:
    if e[0] != "stop" or len(e) < 2:
      continue
    if len(e) >= 5:
      if e[3] == run_id and e[4] == str(attempt):
        return e
    elif claimed_at is not None and _float(e[1]) > claimed_at:
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
    at = _float(e[3])
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
    if e[1] == rec.get("run_id") or now - _float(e[3]) >= CLAIM_TTL_S:
      return None
    return None if _gone(entries, e[1], e[2], _float(e[3])) else e
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
    claimed = _float(rec.get("claimed_at"), None)
    entries = journal() if entries is None else entries
    if stop_request(entries, rec.get("run_id"), rec.get("attempt"), claimed):
      return "stopped"
    if any(e[0] == "release" and e[1:3] == [rec.get("run_id"), rec.get("attempt")]
           for e in entries):
      return "lost"                         # its launcher gave it up before it started
    if state == "shipping":
      return "shipping" if proc_alive(rec, "prepare") else "lost"
    return "prepared" if time.time() - _float(rec.get("prepared")) < PREPARED_TTL_S else "lost"
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


# --------------------------------------------------------------------------------------------------
# setup

def as_root(args, **kwargs):
  return subprocess.run(SUDO + list(args), **kwargs)


def apt_get(args, out=sys.stdout):
  """`apt-get ARGS` as root; while another apt/dpkg holds the dpkg lock (unattended-upgrades on a
  fresh VM), waits up to PODLAB_DPKG_LOCK_TIMEOUT_S with a message instead of failing at once."""
  start, announced = time.monotonic(), False
  while True:
    proc = as_root(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", *args],
                   capture_output=True, text=True)
    if proc.returncode == 0:
      return 0
    text = proc.stdout + proc.stderr
    if re.search("Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock",
                 text):
      if time.monotonic() - start < DPKG_LOCK_TIMEOUT_S:
        if not announced:
          print("waiting for the dpkg lock: another apt/dpkg process holds it (on a fresh VM "
                "usually unattended-upgrades); waiting up to "
                f"{DPKG_LOCK_TIMEOUT_S} s (PODLAB_DPKG_LOCK_TIMEOUT_S)", file=out, flush=True)
          announced = True
        time.sleep(DPKG_LOCK_POLL_S)
        continue
      warn("\n".join(text.splitlines()[-5:]))
      warn(f"worker.sh: the dpkg lock was still held after {DPKG_LOCK_TIMEOUT_S} s "
           f"(PODLAB_DPKG_LOCK_TIMEOUT_S); see `ps aux | grep -E 'apt|dpkg'` on {HOST}")
      return proc.returncode
    warn("\n".join(text.splitlines()[-20:]))
    return proc.returncode


def find_python311():
  for p in ("python3.11", "/usr/bin/python3.11", "/usr/local/bin/python3.11"):
    found = shutil.which(p)
    if found:
      return found
  return None


# Run by the interpreter being checked: the libtpu constraint jax's metadata declares for its `tpu`
# extra, printed as a requirement (`libtpu==0.0.42.*`).
TPU_PIN = r"""
import re, sys
from importlib import metadata
try:
  requires = metadata.requires("jax") or []
except metadata.PackageNotFoundError:
  sys.exit(f"{sys.executable} has no jax installed; cannot read its libtpu pin")
for r in requires:
  req, _, marker = r.partition(";")
  m = re.match(r"\s*(libtpu(?:-nightly)?)\s*(\[[^\]]*\])?\s*(.*)$", req)
  if m and re.search(r'''extra\s*==\s*['"]tpu['"]''', marker):
    print(m.group(1) + m.group(3).strip().replace(" ", ""))
    sys.exit(0)
sys.exit(f"jax {metadata.version('jax')} declares no libtpu requirement for its tpu extra")
"""

# Run by the interpreter being checked: the versions constraints.txt pins for the packages
# pyproject.toml depends on (and with `tpu`, libtpu at jax's pin); names every mismatch.
CHECK_PINS = r"""
import re, sys, tomllib
from importlib import metadata
constraints, pyproject, tpu = sys.argv[1], sys.argv[2], sys.argv[3] == "tpu"
pins = {}
for line in open(constraints):
  m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
  if m:
    pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
deps = tomllib.load(open(pyproject, "rb"))["project"]["dependencies"]
names = [re.sub(r"[-_.]+", "-", re.match(r"^[A-Za-z0-9_.\-]+", d).group(0)).lower() for d in deps]

def have(name):
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None

def satisfies(version, spec):
  for clause in filter(None, spec.split(",")):
    op, want = re.match(r"(==|!=|>=|<=|~=|>|<)?(.*)", clause).groups()
    if op in (None, "=="):
      ok = (version == want[:-2] or version.startswith(want[:-1])) if want.endswith(".*") \
          else version == want
    elif op == "!=":
      ok = not (version.startswith(want[:-1]) if want.endswith(".*") else version == want)
    else:
      try:
        from packaging.specifiers import SpecifierSet
      except ImportError:
        from pip._vendor.packaging.specifiers import SpecifierSet
      ok = version in SpecifierSet(clause)
    if not ok:
      return False
  return True

bad = []
for name in names:
  want = pins.get(name)
  if want is not None and have(name) != want:
    bad.append(f"{name}: installed {have(name) or 'nothing'}, pinned {want}")
checked = len(names)
if tpu:
  spec = None
  for r in metadata.requires("jax") or []:
    req, _, marker = r.partition(";")
    m = re.match(r"\s*libtpu\s*(.*)$", req)
    if m and re.search(r'''extra\s*==\s*['"]tpu['"]''', marker):
      spec = m.group(1).replace(" ", "")
  if spec is None:
    bad.append(f"jax {have('jax')} declares no libtpu pin for jax[tpu]")
  else:
    libtpu = have("libtpu")
    if libtpu is None or not satisfies(libtpu, spec):
      bad.append(f"libtpu: installed {libtpu or 'nothing'}, jax {have('jax')} pins libtpu{spec}")
    checked += 1
if bad:
  sys.exit(f"{sys.executable} does not have the pinned stack:\n  " + "\n  ".join(bad)
           + "\nFix: pip install -c constraints.txt -e . (on TPU also the libtpu above) with that "
             "interpreter, or drop --python so that launch/worker.sh setup creates the "
             "environment.")
extra = f", libtpu {have('libtpu')}" if tpu else ""
print(f"pinned stack present in {sys.executable} ({checked} packages checked{extra})")
"""


def check_pins(repo, python, tpu):
  rc = subprocess.run([python, "-c", CHECK_PINS, os.path.join(repo, "constraints.txt"),
                       os.path.join(repo, "pyproject.toml"), "tpu" if tpu else ""]).returncode
  if rc:
    raise Fail("", 2)


def accel_devices():
  return [d for pattern in ACCEL_GLOB.split() for d in sorted(glob.glob(pattern))
          if os.path.exists(d)]


def setup(repo, args):
  python = venv = jax = None
  venv = os.path.join(os.path.expanduser("~"), "podlab-venv")
  opts = parse_opts(args, {"--python": 1, "--venv": 1, "--jax": 1}, "setup")
  python, venv, jax = opts.get("--python"), opts.get("--venv", venv), opts.get("--jax")
  jax = jax or ("tpu" if accel_devices() else "cpu")
  if jax not in ("tpu", "cpu"):
    raise Fail(f"setup: --jax '{jax}' must be tpu or cpu")
  if python:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
      raise Fail(f"setup: --python '{python}' is not an executable interpreter on {HOST}")
    check_pins(repo, python, jax == "tpu")
    say(f"PODLAB_PYTHON={python}")
    return 0
  # One setup of a venv at a time: a dropped prepare, re-run while the first still installs, waits
  # for it (and then finds the venv current) instead of running a second pip into the same venv.
  lock = venv.rstrip("/") + ".setup.lock"
  try:
    os.makedirs(os.path.dirname(lock) or ".", exist_ok=True)
  except OSError as e:
    raise Fail(f"setup: cannot create the folder of {venv}: {e.strerror}") from e
  lock_acquire(lock, SETUP_LOCK_TIMEOUT_S, f"setting up {venv} (PODLAB_SETUP_LOCK_TIMEOUT_S)")
  try:
    import hashlib  # pylint: disable=g-import-not-at-top
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
      with open(os.path.join(repo, name), "rb") as f:
        digest.update(f.read())
    stamp_want, stamp_file = f"{digest.hexdigest()[:16]}-{jax}", os.path.join(venv, ".podlab-stamp")
    venv_python = os.path.join(venv, "bin", "python")
    try:
      current = open(stamp_file).read().strip() == stamp_want
    except OSError:
      current = False
    if os.access(venv_python, os.X_OK) and current:
      say(f"environment {venv} is current ({stamp_want}); nothing to install")
      say(f"PODLAB_PYTHON={venv_python}")
      return 0
    base = find_python311()
    if base is None:
      # Ubuntu 22.04 (the TPU VM images) ships Python 3.10; its own archive (jammy-updates,
      # universe) has python3.11 and python3.11-venv: signed Ubuntu packages from the mirror the
      # VM already uses, no third-party PPA and no download outside apt (docs/pod.md).
      say("Python 3.11 not found; installing python3.11 and python3.11-venv from Ubuntu's archive "
          "with apt-get")
      if apt_get(["update", "-qq"]) or apt_get(["install", "-y", "-qq", "python3.11",
                                                "python3.11-venv"]):
        raise Fail(f"could not install Python 3.11 with apt-get on {HOST}. Fix: use a TPU VM image "
                   "that has it (e.g. tpu-ubuntu2204-base plus python3.11), or pass --python with "
                   "a 3.11 interpreter")
      base = find_python311()
      if base is None:
        raise Fail(f"python3.11 still missing after apt-get install on {HOST}")
    if (not os.access(venv_python, os.X_OK)
        and subprocess.run([base, "-m", "venv", venv]).returncode):
      raise Fail(f"could not create the venv {venv}")
    pip = [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if subprocess.run(pip + ["-U", "pip"]).returncode:
      raise Fail(f"pip upgrade failed in {venv}")
    constraints = os.path.join(repo, "constraints.txt")
    if jax == "tpu":
      # jax[tpu] at the pinned jax: its extra brings libtpu at exactly the version that jax
      # release pins (jax 0.10.2: libtpu==0.0.42.*), which check_pins then verifies. A `tpu`
      # extra in pyproject.toml, when the project declares one, is installed as well.
      pin = re.search(r"^jax==([^\s;#]+)", open(constraints).read(), re.M)
      if pin is None:
        raise Fail("constraints.txt pins no jax version (a line jax==X)")
      project = repo
      if re.search(r"^\s*tpu\s*=", open(os.path.join(repo, "pyproject.toml")).read(), re.M):
        project = repo + "[tpu]"
      if subprocess.run(pip + ["-c", constraints, "-e", project, f"jax[tpu]=={pin.group(1)}",
                               "-f", LIBTPU_FIND_LINKS]).returncode:
        raise Fail(f"installing the pinned stack with jax[tpu]=={pin.group(1)} failed (see pip's "
                   "output above)")
      versions = subprocess.run([venv_python, "-c", "from importlib import metadata as m; "
                                 "print('jax', m.version('jax'), 'libtpu', m.version('libtpu'))"],
                                capture_output=True, text=True).stdout.strip()
      pinned = subprocess.run([venv_python, "-c", TPU_PIN], capture_output=True, text=True)
      say(f"installed {versions} (jax[tpu] pins {pinned.stdout.strip()})")
    elif subprocess.run(pip + ["-c", constraints, "-e", repo]).returncode:
      raise Fail("installing the pinned stack failed")
    check_pins(repo, venv_python, jax == "tpu")
    with open(stamp_file, "w") as f:
      f.write(stamp_want + "\n")
    say(f"PODLAB_PYTHON={venv_python}")
    return 0
  finally:
    lock_release(lock)


# --------------------------------------------------------------------------------------------------
# clean: stale TPU holders and the libtpu lockfile

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


# --------------------------------------------------------------------------------------------------
# claim and prepare

def claim(args, i):
  opts = parse_opts(args, {"--run-id": 1}, "claim")
  run_id = opts.get("--run-id", "")
  entries = journal()
  now = time.time()
  recs = [read_record(path) for _, path in records()]

  def phase_of(run):
    for rec in recs:
      if rec.get("run_id") == run:
        return phase(rec, entries)
    prev = read_record(os.path.join(STATE_DIR, f"worker-{i}.prev.run"))
    return "ended" if prev.get("run_id") == run else None

  mine = next((e for e in entries if e[0] == "claim" and e[1:2] == [run_id]), None)
  if mine is None:
    raise Fail(f"claim: no claim of run {run_id} in {journal_path()}")
  holder = arbitrate(entries, run_id, now, phase_of)
  if holder is None:
    for rec in recs:                      # a run started another way (local, an older launcher)
      state = phase(rec, entries)
      if state in LIVE and rec.get("run_id") != run_id:
        holder = (rec.get("run_id"), rec.get("attempt"), state, _float(rec.get("started")), "-")
  if holder is None:
    say(f"PODLAB_CLAIM granted run={run_id} at={mine[3]}")
    return 0
  journal_append("release", run_id, mine[2], now_epoch())
  run, attempt, state, at, who = holder
  say(f"PODLAB_CLAIM refused run={run_id} holder={run} attempt={attempt} state={state} "
      f"at={at:.0f} by={who}")
  return 1


def prepare(args, i):
  """Runs _prepare with its output prefixed `[worker <i>] ` (protocol lines as they are)."""
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_prepare", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  for raw in proc.stdout:
    if raw.startswith((b"PODLAB_WORKER_REFUSED", b"PODLAB_WORKER_STOPPED")):
      sys.stdout.buffer.write(raw)
    else:
      sys.stdout.buffer.write(b"[worker %s] " % i.encode() + raw.rstrip(b"\n") + b"\n")
    sys.stdout.flush()
  rc = proc.wait()
  say(f"PODLAB_WORKER_EXIT worker={i} rc={rc} phase=prepare")
  return rc


def _install_code(src, dest):
  """Moves the unpacked code SRC to DEST (a run's folder), points ~/podlab at it, and removes the
  folders and archives of older runs (the 3 newest are kept)."""
  runs = os.path.dirname(dest)
  home = os.path.dirname(runs)
  if os.path.lexists(dest):
    old = f"{dest}.old.{os.getpid()}"
    os.rename(dest, old)
    shutil.rmtree(old, ignore_errors=True)
  os.rename(src, dest)
  link = os.path.join(home, "podlab")
  if os.path.isdir(link) and not os.path.islink(link):     # an older launcher's copy
    shutil.rmtree(link + ".old", ignore_errors=True)
    os.rename(link, link + ".old")
  tmp = f"{link}.tmp.{os.getpid()}"
  os.symlink(os.path.relpath(dest, home), tmp)
  os.replace(tmp, link)
  folders = sorted((d for d in os.listdir(runs) if os.path.isdir(os.path.join(runs, d))
                    and d != os.path.basename(dest)),
                   key=lambda d: os.path.getmtime(os.path.join(runs, d)), reverse=True)
  keep = {os.path.basename(dest)} | set(d for d in folders[:3] if not d.endswith(".new"))
  for d in folders:
    if d not in keep:
      shutil.rmtree(os.path.join(runs, d), ignore_errors=True)
  for archive in glob.glob(os.path.join(home, "podlab-code-*.tgz")):
    if os.path.basename(archive)[len("podlab-code-"):-len(".tgz")] not in keep:
      os.unlink(archive)


def _prepare(args):
  i = worker_index()
  opts, setup_args = {}, []
  it = iter(args)
  for a in it:
    if a in ("--run-id", "--attempt", "--claimed-at"):
      opts[a] = next(it, "")
    elif a == "--stop-others":
      opts[a] = True
    else:
      setup_args.append(a)
  run_id, attempt = opts.get("--run-id", ""), opts.get("--attempt", "0")
  claimed_at = _float(opts.get("--claimed-at"), None)
  src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if not src.endswith(".new") or not RUN_ID_RE.fullmatch(run_id):
    raise Fail(f"prepare: run it from a run's unpacked code <runs>/<run id>.new with --run-id, "
               f"not {src}")
  dest = src[:-len(".new")]
  f, lock = record_path(i), os.path.join(STATE_DIR, f"worker-{i}.lock")
  os.makedirs(STATE_DIR, exist_ok=True)
  lock_acquire(lock, 60, f"worker {i}: preparing run {run_id}")
  try:
    entries = journal()
    stop = stop_request(entries, run_id, attempt, claimed_at)
    if stop is not None:
      say(f"PODLAB_WORKER_STOPPED worker={i} run={run_id} attempt={attempt} at={stop[1]} "
          f"by={stop[2] if len(stop) > 2 else '-'}")
      shutil.rmtree(src, ignore_errors=True)
      raise Fail(f"run {run_id} was stopped by its user before it started; nothing was prepared")
    refuse_if_live(i, f"not preparing run {run_id} next to it", run_id)
    rec = read_record(f)
    if rec and (rec.get("run_id"), rec.get("attempt")) != (run_id, attempt) and "rc" in rec:
      os.replace(f, os.path.join(STATE_DIR, f"worker-{i}.prev.run"))
    me = os.getpid()
    write_record(f, {"run_id": run_id, "attempt": attempt, "state": "shipping",
                     "claimed_at": opts.get("--claimed-at", ""), "prepare_pid": me,
                     "prepare_start": proc_start(me) or "", "boot_id": BOOT_ID, "host": HOST,
                     "started": int(time.time())})
    try:
      clean(["--stop-others"] if opts.get("--stop-others") else [], i)
      say(f"installing the code in {dest} on {HOST} (~/podlab links to it)")
      _install_code(src, dest)
    except (Fail, OSError) as e:
      update_record(f, record_lock(i), state="ended", rc=2, reason=f"prepare failed: {e}")
      raise
  finally:
    lock_release(lock)
  try:
    setup(dest, setup_args)
  except Fail:
    update_record(f, record_lock(i), state="ended", rc=2, reason="setup failed")
    raise
  update_record(f, record_lock(i), state="prepared", prepared=now_epoch())
  return 0


# --------------------------------------------------------------------------------------------------
# run, the supervisor, attach

def _supervise(args):
  """The supervisor: records itself, runs COMMAND with its output appended to the log, records it,
  waits, records the exit code. Signals to the supervisor itself are ignored (a SIGTERM to the
  process group reaches COMMAND, which decides; the supervisor only reports). Its start is
  confirmed (or refused, with the reason) on the file descriptor it is given."""
  f, log, run_id, attempt, i, status_fd = args[:6]
  cmd = args[7:] if args[6:7] == ["--"] else args[6:]
  for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, lambda *_: None)
  status = os.fdopen(int(status_fd), "w")
  lock = record_lock(i)

  def report(text):
    try:
      status.write(text + "\n")
      status.close()
    except OSError:
      pass

  me = os.getpid()
  try:
    update_record(f, lock, pid=me, pid_start=proc_start(me) or "", boot_id=BOOT_ID)
  except (OSError, Fail) as e:
    report(f"error: cannot write the run record {f}: {getattr(e, 'strerror', None) or e}")
    return 2
  env = dict(os.environ, PODLAB_RUN_ID=run_id, PODLAB_RUN_ATTEMPT=attempt, PYTHONUNBUFFERED="1")
  try:
    logf = open(log, "ab")
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             env=env)        # exec resets the handlers above to the defaults
  except OSError as e:
    try:
      logf.write(f"worker.sh: cannot start {cmd[0]}: {e.strerror}\n".encode())
      logf.close()
      update_record(f, lock, state="ended", rc=127)
    except (OSError, Fail):
      pass
    report("ok")
    return 0
  pid_file = os.path.join(STATE_DIR, f"worker-{i}.pid")
  try:
    with open(pid_file, "w") as pf:
      pf.write(f"{child.pid}\n")
    update_record(f, lock, state="running", cmd_pid=child.pid,
                  cmd_start=proc_start(child.pid) or "")
  except (OSError, Fail) as e:
    child.kill()                          # a command nobody could see or stop: never left running
    child.wait()
    report(f"error: cannot write the run record {f}: {getattr(e, 'strerror', None) or e}")
    return 2
  report("ok")
  rc = child.wait()
  rc = 128 - rc if rc < 0 else rc
  # The pid file goes first: once rc is recorded the run counts as ended (stop, status), and by
  # then nothing of it may be left.
  try:
    if open(pid_file).read().strip() == str(child.pid):
      os.unlink(pid_file)
  except OSError:
    pass
  for _ in range(50):                     # a full disk may free up; the exit code matters
    try:
      rec = update_record(f, lock, rc=rc)
      update_record(f, lock, state="stopped" if rec.get("stopped_by_user") == "1" else "ended")
      break
    except (OSError, Fail):
      time.sleep(1)
  return 0


def from_for(value, i):
  """This worker's N in `--from I:N,...` (pod.py passes one list for every worker)."""
  for item in value.split(","):
    k, _, n = item.partition(":")
    if k == str(i):
      return n
  return "0"


def attach_run(f, i, mode, start_line, alive_every=0.0):
  """Waits for the run of record F to end; MODE raw|prefix|numbered also prints its log from line
  START_LINE+1 on (as is, `[worker <i>] ` or `[worker <i> <n>] ` before each line), MODE wait only
  waits. Then prints the exit line; returns the run's exit code (1 when lost)."""
  rec = read_record(f)
  log = rec.get("log", "")
  out = sys.stdout.buffer
  n, pending, quiet_since = 0, b"", time.monotonic()
  fh = None
  if mode != "wait":
    try:
      fh = open(log, "rb")
    except OSError:
      fh = None

  def emit(line):
    nonlocal n
    n += 1
    if n <= start_line:
      return
    if mode == "numbered":
      out.write(b"[worker %s %d] " % (str(i).encode(), n) + line + b"\n")
    elif mode == "prefix":
      out.write(b"[worker %s] " % str(i).encode() + line + b"\n")
    else:
      out.write(line + b"\n")

  try:
    while True:
      running = phase(read_record(f)) in ("starting", "running")
      if fh is not None:
        data = fh.read()
        if data:
          lines = (pending + data).split(b"\n")
          pending = lines.pop()
          for line in lines:
            emit(line)
          out.flush()
          quiet_since = time.monotonic()
      if not running:
        if fh is not None:
          data = fh.read()
          lines = (pending + data).split(b"\n")
          for line in lines[:-1]:
            emit(line)
          if lines[-1]:
            emit(lines[-1])
        break
      if alive_every and time.monotonic() - quiet_since >= alive_every:
        out.write(b"PODLAB_ALIVE worker=%s\n" % str(i).encode())
        out.flush()
        quiet_since = time.monotonic()
      time.sleep(0.2)
    rec = read_record(f)
    rc = rec.get("rc", "lost")
    stopped = " stopped_by_user=1" if rec.get("stopped_by_user") == "1" else ""
    out.write((f"PODLAB_WORKER_EXIT worker={i} rc={rc} run={rec.get('run_id')} "
               f"attempt={rec.get('attempt')}{stopped} log={rec.get('log')}\n").encode())
    out.flush()
  except BrokenPipeError:             # the connection that followed it is gone; the run is not
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141
  return int(rc) if rc.isdigit() else 1


def follow_mode(follow, numbered):
  return "wait" if not follow else ("numbered" if numbered else "prefix")


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


def run(args, i):
  spec = {"--run-id": 1, "--attempt": 1, "--claimed-at": 1, "--log-dir": 1, "--from-line": 1,
          "--from": 1, "--alive-every": 1, "--detach": 0, "--follow": 0, "--stream": 0,
          "--numbered": 0}
  cmd = []
  if "--" in args:
    cmd = args[args.index("--") + 1:]
    args = args[:args.index("--")]
  opts = parse_opts(args, spec, "run")
  log_dir, detach = opts.get("--log-dir"), "--detach" in opts
  follow = "--follow" in opts or "--stream" in opts
  if not log_dir:
    raise Fail("run: --log-dir is required")
  if not cmd:
    raise Fail("run: no command given after --")
  run_id = opts.get("--run-id") or time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}"
  attempt = opts.get("--attempt", "0")
  claimed_at = _float(opts.get("--claimed-at"), None)
  if not RUN_ID_RE.fullmatch(run_id):
    raise Fail(f"run: --run-id '{run_id}' is not a run id (letters, digits, '.', '_', '-')")
  if not attempt.isdigit():
    raise Fail(f"run: --attempt '{attempt}' is not a non-negative integer")
  start_line = opts.get("--from-line", "0")
  if "--from" in opts:
    start_line = from_for(opts["--from"], i)
  if not start_line.isdigit():
    raise Fail(f"run: --from-line '{start_line}' is not a line count")
  mode = follow_mode(follow, "--numbered" in opts)
  alive = _float(opts.get("--alive-every"), 0.0)
  try:
    os.makedirs(log_dir, exist_ok=True)
    os.makedirs(STATE_DIR, exist_ok=True)
  except OSError as e:
    raise Fail(f"cannot create {log_dir} or {STATE_DIR}: {e.strerror}; nothing was started") from e
  log = os.path.join(os.path.abspath(log_dir), f"worker-{i}.log")
  f = record_path(i)
  # A lock around "look at the record, then start": concurrent `run`s with the same run id
  # (gcloud re-running the command after an ssh failure) must not both start it.
  lock = os.path.join(STATE_DIR, f"worker-{i}.lock")
  lock_acquire(lock, 60, f"worker {i}: starting run {run_id}")
  try:
    entries = journal()
    rec = read_record(f)
    state = phase(rec, entries)
    same = (rec.get("run_id"), rec.get("attempt")) == (run_id, attempt)
    never_started = rec.get("state") in ("shipping", "prepared", "stopped") and "rc" not in rec
    if same and not never_started:
      lock_release(lock)
      if state in ("starting", "running"):
        warn(f"worker.sh: worker {i}: {run_phrase(rec)} is already running; attaching to it "
             "instead of starting it again")
      else:
        warn(f"worker.sh: worker {i}: {run_phrase(rec)} already ended (exit code "
             f"{rec.get('rc', 'lost')}); not starting it again")
      if detach and not follow:
        say(f"PODLAB_RUN_STARTED worker={i} run={run_id} attempt={attempt} pid={rec.get('pid')} "
            f"log={rec.get('log')}")
        return 0
      return attach_run(f, i, mode, int(start_line), alive)
    stop = stop_request(entries, run_id, attempt, claimed_at)
    if stop is not None or (same and rec.get("state") == "stopped"):
      by = stop[2] if stop is not None and len(stop) > 2 else rec.get("stopped_by", "-")
      say(f"PODLAB_WORKER_STOPPED worker={i} run={run_id} attempt={attempt} by={by}")
      if same:
        update_record(f, record_lock(i), state="stopped", stopped_by_user="1")
      raise Fail(f"worker {i}: run {run_id} attempt {attempt} was stopped (by {by}) before it "
                 "started; not starting it")
    for _, path in records():
      other = read_record(path)
      other_state = phase(other, entries)
      if other_state in ("starting", "running") and not (
          (other.get("run_id"), other.get("attempt")) == (run_id, attempt)):
        say(f"PODLAB_WORKER_REFUSED worker={i} running={other.get('run_id')} "
            f"attempt={other.get('attempt')} pid={other.get('pid')} state={other_state}")
        raise Fail(f"worker {i} already runs {run_phrase(other)}; not starting run {run_id} "
                   f"attempt {attempt} next to it. Fix: follow it (launch/pod.sh NAME attach) or "
                   "stop it first (launch/pod.sh NAME stop)")
    if rec and not same:                  # the earlier record stays as worker-<i>.prev.run
      try:
        os.replace(f, os.path.join(STATE_DIR, f"worker-{i}.prev.run"))
      except OSError:
        pass
    new = {"run_id": run_id, "attempt": attempt, "state": "starting",
           "claimed_at": opts.get("--claimed-at", ""), "boot_id": BOOT_ID,
           "detached": int(detach), "log": log, "started": int(time.time()), "host": HOST}
    try:
      write_record(f, new)
    except OSError as e:
      raise Fail(f"worker {i}: cannot write the run record {f}: {e.strerror}; nothing was "
                 f"started. Fix: free space on (or make writable) {STATE_DIR} "
                 "(PODLAB_STATE_DIR)") from e
    header = (f"podlab: run {run_id} attempt {attempt} on {HOST} (worker {i}), started "
              f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: {' '.join(cmd)}\n")
    try:
      with open(log, "ab") as lf:
        lf.write(header.encode(errors="surrogateescape"))
    except OSError as e:
      _abandon(f, new, f"cannot write the log {log}: {e.strerror}")
      raise Fail(f"worker {i}: cannot write the log {log}: {e.strerror}; nothing was started. "
                 f"Fix: free space on (or make writable) {log_dir}") from e
    read_end, write_end = os.pipe()
    supervisor = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "_supervise", f, log, run_id, attempt, str(i),
         str(write_end), "--", *cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, pass_fds=(write_end,), start_new_session=detach)
    os.close(write_end)
    answer = _read_with_timeout(read_end, START_TIMEOUT_S)
    if answer != "ok":
      if answer is None:                  # a timeout stops what it spawned
        _kill_supervisor(supervisor, detach)
        reason = f"the supervisor did not confirm the start within {START_TIMEOUT_S} s; stopped it"
      else:
        supervisor.wait()
        reason = answer[len("error: "):]
      _abandon(f, new, reason)
      raise Fail(f"worker {i}: {reason}; nothing was started")
  finally:
    lock_release(lock)
  if detach and not follow:
    say(f"PODLAB_RUN_STARTED worker={i} run={run_id} attempt={attempt} pid={supervisor.pid} "
        f"log={log}")
    return 0
  rc = attach_run(f, i, mode, int(start_line), alive)
  supervisor.wait()                       # our child: gone before we report
  return rc


def _read_with_timeout(fd, timeout):
  import select  # pylint: disable=g-import-not-at-top
  data, deadline = b"", time.monotonic() + timeout
  while b"\n" not in data:
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
      os.close(fd)
      return None
    chunk = os.read(fd, 4096)
    if not chunk:
      break
    data += chunk
  os.close(fd)
  return data.decode(errors="replace").strip() or "error: the supervisor ended without a word"


def _kill_supervisor(proc, detached):
  try:
    if detached:
      os.killpg(proc.pid, signal.SIGKILL)
    else:
      proc.kill()
  except OSError:
    pass
  proc.wait()


def _abandon(f, rec, reason):
  """A start that did not happen: the record says so (ended, rc 2, the reason), or goes."""
  try:
    write_record(f, dict(rec, state="ended", rc=2, reason=reason))
  except OSError:
    try:
      os.unlink(f)
    except OSError:
      pass


def attach(args, i):
  opts = parse_opts(args, {"--run-id": 1, "--attempt": 1, "--from-line": 1, "--from": 1,
                           "--alive-every": 1, "--follow": 0, "--numbered": 0}, "attach")
  f = record_path(i)
  start_line = opts.get("--from-line", "0")
  if "--from" in opts:
    start_line = from_for(opts["--from"], i)
  if not start_line.isdigit():
    raise Fail(f"attach: --from-line '{start_line}' is not a line count")
  rec = read_record(f)
  if not rec:
    say(f"PODLAB_WORKER_EXIT worker={i} rc=none run=none attempt=none log=none")
    warn(f"worker.sh: worker {i}: no podlab run recorded in {STATE_DIR}")
    return 1
  run_id, attempt = opts.get("--run-id"), opts.get("--attempt")
  if run_id and (rec.get("run_id") != run_id or (attempt and rec.get("attempt") != attempt)):
    say(f"PODLAB_WORKER_EXIT worker={i} rc=other run={rec.get('run_id')} "
        f"attempt={rec.get('attempt')} log={rec.get('log')}")
    warn(f"worker.sh: worker {i}: its current run is {run_phrase(rec)}, not run {run_id}"
         + (f" attempt {attempt}" if attempt else ""))
    return 1
  return attach_run(f, i, follow_mode("--follow" in opts, "--numbered" in opts), int(start_line),
                    _float(opts.get("--alive-every"), 0.0))


# --------------------------------------------------------------------------------------------------
# status, logs, stop

def last_step(text):
  """The last training step named in TEXT (`[12] train/...=`, `step 12`, `step 12/40`), else -.
  "from step N" is where a run starts, not its progress: it does not count."""
  text = re.sub(r"from step [0-9]+", "", text)
  found = re.findall(r"\[([0-9]+)\] [A-Za-z_./]+=|\bstep ([0-9]+)\b", text)
  return next((a or b for a, b in reversed(found)), "-") if found else "-"


def status_line(rec, i, entries):
  state = phase(rec, entries)
  if state == "none":
    return (f"PODLAB_STATUS worker={i} state=none run=- attempt=- pid=- rc=- step=- stopped=0 "
            "log=- last=")
  log = rec.get("log", "")
  try:
    with open(log, "rb") as fh:
      fh.seek(max(0, os.path.getsize(log) - 2000000))
      text = fh.read().decode(errors="replace")
  except OSError:
    text = ""
  # The last line, without absl's `I1123 22:18:42.514158 140312454085504 file.py:49] ` prefix and
  # without the collective library's `[Gloo] Rank 1 is connected to ...` chatter.
  lines = [l for l in text.splitlines() if l.strip() and not l.startswith("[Gloo] ")]
  last = re.sub(r"^[IWEF][0-9]{4} [0-9:.]+ +[0-9]+ [^]]+\] ", "", lines[-1])[:200] if lines else ""
  if not last and rec.get("reason"):
    last = rec["reason"][:200]
  stopped = "1" if rec.get("stopped_by_user") == "1" else "0"
  return (f"PODLAB_STATUS worker={i} state={state} run={rec.get('run_id')} "
          f"attempt={rec.get('attempt')} pid={rec.get('pid', '-')} rc={rec.get('rc', '-')} "
          f"step={last_step(text)} stopped={stopped} log={log or '-'} last={last}")


def status(args, i):
  if args:
    raise Fail(f"status: unexpected argument '{args[0]}'")
  entries, now = journal(), time.time()
  found = records() or [(i, record_path(i))]
  for w, path in found:
    rec = read_record(path)
    claim_entry = pending_claim(entries, rec, now)
    if claim_entry is not None:          # worker 0 while a launch is being shipped
      rec = {"run_id": claim_entry[1], "attempt": claim_entry[2], "state": "shipping",
             "reason": f"being shipped (claimed by {claim_entry[4]})"}
      say(f"PODLAB_STATUS worker={w} state=shipping run={claim_entry[1]} attempt={claim_entry[2]} "
          f"pid=- rc=- step=- stopped=0 log=- last={rec['reason']}")
      continue
    say(status_line(rec, w, entries))
  return 0


def logs(args, i):
  opts = parse_opts(args, {"-f": 0, "--follow": 0, "-n": 1, "--lines": 1, "--prefix": 0}, "logs")
  lines = opts.get("-n", opts.get("--lines"))
  if lines is not None and not lines.isdigit():
    raise Fail(f"logs: -n '{lines}' is not a line count")
  f = record_path(i)
  rec = read_record(f)
  if not rec:
    raise Fail(f"worker {i}: no podlab run recorded in {STATE_DIR}")
  log = rec.get("log", "")
  if not os.path.isfile(log):
    raise Fail(f"worker {i}: the log {log} of {run_phrase(rec)} is gone")
  with open(log, "rb") as fh:
    total = fh.read().count(b"\n")
  start = max(0, total - int(lines)) if lines is not None else 0
  mode = "prefix" if "--prefix" in opts else "raw"
  if "-f" in opts or "--follow" in opts:
    return attach_run(f, i, mode, start)
  with open(log, "rb") as fh:
    for n, line in enumerate(fh.read().split(b"\n")[:total + 1]):
      if n < start or (n == total and not line):
        continue
      prefix = b"[worker %s] " % str(i).encode() if mode == "prefix" else b""
      sys.stdout.buffer.write(prefix + line + b"\n")
  return 0


def stop(args, i):
  opts = parse_opts(args, {"--grace": 1, "--run-id": 1, "--attempt": 1, "--by-user": 0, "--by": 1},
                    "stop")
  grace, only = opts.get("--grace", STOP_GRACE_S), opts.get("--run-id")
  by_user = "--by-user" in opts
  who = opts.get("--by") or f"{os.environ.get('USER', 'user')}@{HOST}"
  if not str(grace).isdigit():
    raise Fail(f"stop: --grace '{grace}' is not a number of seconds")
  grace = int(grace)
  entries, now = journal(), time.time()
  shipping = [(w, pending_claim(entries, read_record(path), now)) for w, path in records()]
  try:                                     # first: a launch starting now must see it
    fields = ["stop", now_epoch(), re.sub(r"\s", "_", who)]
    if only:
      fields += [only, opts.get("--attempt", "0")]
    journal_append(*fields)
  except OSError as e:
    warn(f"worker {i}: could not record the stop request in {journal_path()}: {e.strerror}")
  entries, now = journal(), time.time()
  live, lost = [], []
  for w, path in records():
    rec = read_record(path)
    if only and rec.get("run_id") != only:
      continue
    state = phase(rec, entries)
    if state in ("starting", "running"):
      live.append((w, path))
    elif state == "lost":
      lost.append(rec)
      say(f"worker {w}: {run_phrase(rec)} is lost: no exit code recorded and its processes are "
          f"gone (pid {rec.get('pid', '-')} is not the recorded process); nothing signalled")
    elif rec.get("state") in ("shipping", "prepared") and "rc" not in rec:
      update_record(path, record_lock(w), state="stopped",
                    stopped_by_user="1" if by_user else None)
      say(f"worker {w}: run {rec.get('run_id')} attempt {rec.get('attempt')} was being prepared "
          f"({rec.get('state')}): stopped; it will not start")
  for w, claim_entry in shipping:
    if claim_entry is not None and not only:
      say(f"worker {w}: run {claim_entry[1]} attempt {claim_entry[2]} is being shipped (claimed by "
          f"{claim_entry[4]}): it will not start")
  if not live:
    say(f"no podlab run to stop on {HOST}" + (f" (run {only})" if only else "")
        + ("; the stop request is recorded: a launch being shipped now will not start"
           if not only else ""))
    return 0
  for w, path in live:
    rec = read_record(path)
    say(f"worker {w}: stopping {run_phrase(rec)} on {HOST}: SIGTERM, SIGKILL after {grace} s")
    if by_user:
      update_record(path, record_lock(w), stopped_by_user=1, stopped_by=re.sub(r"\s", "_", who))
    _signal_run(rec, signal.SIGTERM)
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline and any(
      phase(read_record(p), entries) in ("starting", "running") for _, p in live):
    time.sleep(0.1)
  for w, path in live:
    rec = read_record(path)
    if phase(rec, entries) not in ("starting", "running"):
      continue
    say(f"worker {w}: still running after {grace} s: SIGKILL to {run_phrase(rec)}")
    if proc_alive(rec, "cmd"):
      os.kill(int(rec["cmd_pid"]), signal.SIGKILL)        # the supervisor then records 137
    for _ in range(30):
      if phase(read_record(path), entries) not in ("starting", "running"):
        break
      time.sleep(0.1)
    rec = read_record(path)
    if rec.get("detached") == "1" and proc_alive(rec, "pid"):   # what is left of its group
      try:
        os.killpg(int(rec["pid"]), signal.SIGKILL)
      except OSError:
        pass
  for w, path in live:
    rec = read_record(path)
    say(f"worker {w}: {run_phrase(rec)} ended with exit code {rec.get('rc', 'lost')}")
  return 0


def _signal_run(rec, sig):
  """SIGNAL to a run's recorded processes only (their identity checked): the group of a live
  detached supervisor (it leads it), else the command."""
  try:
    if rec.get("detached") == "1" and proc_alive(rec, "pid"):
      os.killpg(int(rec["pid"]), sig)
    elif proc_alive(rec, "cmd"):
      os.kill(int(rec["cmd_pid"]), sig)
  except OSError:
    pass


def tpu_pin(args):
  python = parse_opts(args, {"--python": 1}, "tpu-pin").get("--python") or os.environ.get(
      "PYTHON", "python3")
  return 2 if subprocess.run([python, "-c", TPU_PIN]).returncode else 0


def main(argv):
  sub, args = (argv[0] if argv else ""), argv[1:]
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  commands = {
      "setup": lambda: setup(repo, args),
      "claim": lambda: claim(args, worker_index()),
      "prepare": lambda: prepare(args, worker_index()),
      "_prepare": lambda: _prepare(args),
      "clean": lambda: clean(args, worker_index()),
      "run": lambda: run(args, worker_index()),
      "_supervise": lambda: _supervise(args),
      "attach": lambda: attach(args, worker_index()),
      "status": lambda: status(args, worker_index()),
      "logs": lambda: logs(args, worker_index()),
      "stop": lambda: stop(args, worker_index()),
      "tpu-pin": lambda: tpu_pin(args),
  }
  if sub not in commands:
    warn(f"worker.sh: error: unknown subcommand '{sub}': expected prepare, setup, clean, stop, "
         "run, attach, status, logs or tpu-pin (see launch/worker.py's docstring)")
    return 2
  try:
    return commands[sub]()
  except Fail as e:
    if str(e):
      warn(f"worker.sh: error: {e}")
    return e.code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
