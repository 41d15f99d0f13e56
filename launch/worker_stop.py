"""`worker.sh stop`: the stop request recorded in the journal first, runs being prepared marked
stopped, live runs signalled (SIGTERM to the run's process group, SIGKILL after the grace).
"""
import os
import re
import signal
import time

from worker_common import Fail, HOST, STOP_GRACE_S, now_epoch, parse_opts, say, warn
from worker_record import (journal, journal_append, journal_path, pending_claim, phase, proc_alive,
                           read_record, record_lock, records, run_phrase, update_record)


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
