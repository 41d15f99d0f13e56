"""Reading gcloud's merged output of one command on the workers (Follower): the worker logs shown
once and copied here, the protocol lines of launch/worker.py recorded, fail-fast, and the check of
a worker that went quiet; and the local log files it writes.
"""
import os
import queue
import re
import subprocess
import sys
import threading
import time

from pod_common import (CONNECTION_FAILED, FAILFAST_GRACE_S, GCLOUD, RECONNECT_DELAY_S,
                        SSH_TIMEOUT_S, emit, shell_rc, show, warn)


def lost_reason(s):
  if s["state"] in ("prepared", "shipping"):
    return f"its run never started there (state {s['state']}): no process and no exit code"
  if s["state"] == "stopped":
    return "its run was stopped there before it started"
  return "its processes are gone without an exit code"


def count_lines(path):
  try:
    with open(path, "rb") as f:
      return f.read().count(b"\n")
  except OSError:
    return 0


def last_line(path):
  try:
    with open(path, "rb") as f:
      lines = [l for l in f.read().decode(errors="replace").splitlines() if l.strip()]
  except OSError:
    return ""
  return lines[-1][:200] if lines else ""


def tail(path, n=15):
  try:
    with open(path, "rb") as f:
      lines = f.read().decode(errors="replace").splitlines()[-n:]
  except OSError:
    return
  for line in lines:
    print("    " + line, file=sys.stderr)
  sys.stderr.flush()


class Follower:
  """Reads gcloud's merged output of one command on the workers. `[worker <i> <n>] line` is line n
  of worker i's run log: shown once (a re-attach or a gcloud retry repeats lines) and appended to
  MIRROR/worker-<i>.log; `[worker <i>]` lines (prepare) go to MIRROR/<phase>-worker-<i>.log; the
  protocol lines (worker.py's docstring) are recorded. While a run is followed, every worker is
  accounted for: the first failure stops every worker's run (fail-fast), and a worker whose
  connection ended, or that was silent for --lost-after s, is asked for its run; without a live
  process or an exit code it is lost."""

  def __init__(self, pod, phase, attempt, mirror):
    self.pod, self.phase, self.attempt, self.mirror = pod, phase, attempt, mirror
    self.got = {w: count_lines(os.path.join(mirror, f"worker-{w}.log"))
                for w in range(pod.num_workers)}
    run = phase == "run"
    self.exits = pod.exits if run else {}
    self.arrivals = pod.arrivals if run else []
    self.refused = pod.refused if run else {}
    self.stopped = pod.stopped_by if run else {}
    self.started = set()
    self.failfast = False
    now = time.monotonic()
    self.last_seen = {w: now for w in range(pod.num_workers)}
    self.next_check = {}
    self.unreachable_since = {}
    self.conn_ended = set()

  def run(self, args, timeout):
    pod = self.pod
    proc = pod.gc.popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = queue.Queue()

    def read():
      for raw in proc.stdout:
        lines.put(raw.decode(errors="surrogateescape").rstrip("\n"))
      lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout if timeout else None
    while True:
      try:
        line = lines.get(timeout=1.0)
      except queue.Empty:
        line = ""
      if line is None:
        break
      if line:
        self.handle(line)
      if deadline and time.monotonic() > deadline:
        warn(f"'{show([GCLOUD, *args[:6]])} ...' timed out after {timeout} s")
        pod.gc.end(proc)
        break
      if self.phase == "run":
        self.account()
        if all(w in self.exits for w in range(pod.num_workers)):
          try:                           # every worker accounted for: a hung connection is moot
            proc.wait(timeout=10)
          except subprocess.TimeoutExpired:
            pod.gc.end(proc)
          while True:                    # what is left of the output
            try:
              line = lines.get(timeout=1.0)
            except queue.Empty:
              break
            if line is None:
              break
            self.handle(line)
          break
    rc = shell_rc(proc.wait())
    pod.gc.children.discard(proc)
    for stopper in pod.stoppers:
      try:
        stopper.wait(timeout=FAILFAST_GRACE_S + SSH_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        pod.gc.end(stopper)
      pod.gc.children.discard(stopper)
    pod.stoppers = []
    return rc

  def seen(self, w):
    self.last_seen[w] = time.monotonic()
    self.unreachable_since.pop(w, None)

  def handle(self, line):
    pod = self.pod
    m = re.match(r"\[worker (\d+) (\d+)\] ?(.*)$", line, re.S)
    if m:
      w, n, text = int(m.group(1)), int(m.group(2)), m.group(3)
      self.seen(w)
      self.started.add(w)
      if n > self.got.get(w, 0):
        with open(os.path.join(self.mirror, f"worker-{w}.log"), "ab") as f:
          f.write(text.encode(errors="surrogateescape") + b"\n")
        self.got[w] = n
        emit(sys.stdout, f"[worker {w}] {text}")
      return
    m = re.match(r"\[worker (\d+)\] ?(.*)$", line, re.S)
    if m:
      with open(os.path.join(self.mirror, f"{self.phase}-worker-{m.group(1)}.log"), "ab") as f:
        f.write(m.group(2).encode(errors="surrogateescape") + b"\n")
      self.seen(int(m.group(1)))
    elif line.startswith("PODLAB_ALIVE "):
      m = re.match(r"PODLAB_ALIVE worker=(\d+)", line)
      if m:
        self.seen(int(m.group(1)))
      return
    m = re.search(r"PODLAB_WORKER_EXIT worker=(\d+) rc=(\S+)", line)
    if m:
      self.seen(int(m.group(1)))
      self.exit(int(m.group(1)), m.group(2), "stopped_by_user=1" in line)
      if self.phase == "tail":
        return
    m = re.search(r"PODLAB_WORKER_REFUSED worker=(\d+) running=(\S+) attempt=(\S+)", line)
    if m:
      self.refused[int(m.group(1))] = (m.group(2), m.group(3))
      self.exit(int(m.group(1)), "refused")
    m = re.search(r"PODLAB_WORKER_STOPPED worker=(\d+) .*by=(\S+)", line)
    if m:
      self.stopped[int(m.group(1))] = m.group(2)
      self.exit(int(m.group(1)), "stopped")
    m = CONNECTION_FAILED.match(line)
    if m and int(m.group(1)) not in self.exits:
      self.conn_ended.add(int(m.group(1)))
    emit(sys.stdout, line)

  def exit(self, w, rc, stopped=False):
    """Worker W's result (its first one counts). In a run, the first failure stops every worker's
    run (fail-fast), with its stop recorded there: a worker whose start is late does not start."""
    if w in self.exits:
      return
    self.exits[w] = (rc, stopped)
    self.arrivals.append((w, rc, stopped))
    if self.phase == "run" and rc not in ("0", "130", "143") and not self.failfast:
      self.failfast = True
      if rc not in ("stopped", "refused", "lost"):
        warn(f"worker {w} failed (exit {rc}); stopping the run on every worker")
      self.pod.stop_run(self.attempt, self.mirror, wait=False)

  def account(self):
    """Asks a worker whose connection ended, or that was silent for --lost-after s, for its run;
    declares it lost when it has no live process and no exit code (module doc)."""
    pod = self.pod
    if not pod.lost_after:
      return
    now = time.monotonic()
    for w in range(pod.num_workers):
      if w in self.exits:
        continue
      due = self.next_check.get(w)
      silent = now - self.last_seen[w] >= pod.lost_after
      if due is None and not silent and w not in self.conn_ended:
        continue
      if due is not None and now < due:
        continue
      st = pod.query_status(str(w), timeout=max(30, min(SSH_TIMEOUT_S, pod.lost_after)))
      s = st.get(w)
      if s is None:
        since = self.unreachable_since.setdefault(w, now)
        if now - since >= pod.lost_after:
          pod.declare_lost(w, f"unreachable for {now - since:.0f} s", self.mirror)
        else:
          self.next_check[w] = now + min(RECONNECT_DELAY_S, pod.lost_after)
        continue
      self.unreachable_since.pop(w, None)
      if (s["run"], s["attempt"]) == (pod.run_id, str(self.attempt)) and s["state"] in (
          "running", "starting"):
        self.last_seen[w] = now
        self.next_check[w] = now + pod.lost_after if w in self.conn_ended else None
      elif (s["run"], s["attempt"]) == (pod.run_id, str(self.attempt)) and s["rc"] != "-":
        warn(f"worker {w}: run {pod.run_id} attempt {self.attempt} ended (exit code {s['rc']}); "
             "its connection had ended before it said so")
        self.exit(w, s["rc"], s["stopped"] == "1")
      elif (s["run"], s["attempt"]) != (pod.run_id, str(self.attempt)):
        pod.declare_lost(w, f"run {pod.run_id} attempt {self.attempt} never started there (its "
                            f"current run is {s['run']} attempt {s['attempt']}, state {s['state']})"
                         if s["state"] != "none" else
                         f"run {pod.run_id} never started there (no run recorded)", self.mirror)
      else:
        pod.declare_lost(w, lost_reason(s), self.mirror)
