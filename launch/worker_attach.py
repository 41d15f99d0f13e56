"""Following a run on a worker: `worker.sh attach`, and the loop that `run --follow` and `logs -f`
share (waits for the run to end, prints its log, ends with the exit line).
"""
import os
import sys
import time

from worker_common import Fail, STATE_DIR, as_float, parse_opts, say, warn
from worker_record import phase, read_record, record_path, run_phrase


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
                    as_float(opts.get("--alive-every"), 0.0))
