"""Before a run starts: `worker.sh claim` (worker 0 arbitrates which launch holds the slice) and
`worker.sh prepare` (the shipped code installed, stale TPU holders cleaned, the environment set up,
each step recorded).
"""
import glob
import os
import shutil
import subprocess
import sys
import time

from worker_clean import clean
from worker_common import (BOOT_ID, Fail, HOST, RUN_ID_RE, STATE_DIR, WORKER_PY, as_float,
                           now_epoch, parse_opts, proc_start, say, worker_index)
from worker_record import (LIVE, arbitrate, journal, journal_append, journal_path, lock_acquire,
                           lock_release, phase, read_record, record_lock, record_path, records,
                           refuse_if_live, stop_request, update_record, write_record)
from worker_setup import setup


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
        holder = (rec.get("run_id"), rec.get("attempt"), state, as_float(rec.get("started")), "-")
  if holder is None:
    say(f"PODLAB_CLAIM granted run={run_id} at={mine[3]}")
    return 0
  journal_append("release", run_id, mine[2], now_epoch())
  run, attempt, state, at, who = holder
  say(f"PODLAB_CLAIM refused run={run_id} holder={run} attempt={attempt} state={state} "
      f"at={at:.0f} by={who}")
  return 1


def prepare(args, i):
  """Runs prepare_steps (the hidden subcommand `_prepare`) with its output prefixed `[worker <i>] `
  (protocol lines as they are)."""
  proc = subprocess.Popen([sys.executable, WORKER_PY, "_prepare", *args],
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


def prepare_steps(args):
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
  claimed_at = as_float(opts.get("--claimed-at"), None)
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
