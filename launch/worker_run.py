"""`worker.sh run`: a run recorded before it starts, then started (detached or not) under a
supervisor that logs its output and records its processes and exit code; never started twice.
"""
import os
import signal
import subprocess
import sys
import time

from worker_attach import attach_run, follow_mode, from_for
from worker_common import (BOOT_ID, Fail, HOST, RUN_ID_RE, STATE_DIR, WORKER_PY, as_float,
                           parse_opts, proc_start, say, warn)
from worker_record import (journal, lock_acquire, lock_release, phase, read_record, record_lock,
                           record_path, records, run_phrase, stop_request, update_record,
                           write_record)

START_TIMEOUT_S = 20


def supervise(args):
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
  claimed_at = as_float(opts.get("--claimed-at"), None)
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
  alive = as_float(opts.get("--alive-every"), 0.0)
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
        [sys.executable, WORKER_PY, "_supervise", f, log, run_id, attempt, str(i),
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
