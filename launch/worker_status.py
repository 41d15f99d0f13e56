"""What a worker reports: `worker.sh status` (one PODLAB_STATUS line per recorded run) and
`worker.sh logs` (the current run's log).
"""
import os
import re
import sys
import time

from worker_attach import attach_run
from worker_common import Fail, STATE_DIR, parse_opts, say
from worker_record import (journal, pending_claim, phase, read_record, record_path, records,
                           run_phrase)


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
