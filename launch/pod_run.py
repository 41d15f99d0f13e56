"""Following a run until every worker is accounted for (RunFollowing, a part of launch/pod.py's
Pod): status checks and re-attaches when the connection is lost, lost workers, the fail-fast stop,
and how the run ended (Outcome) reported.
"""
import glob
import os
import re
import subprocess
import time

from pod_common import (ALL, FAILFAST_GRACE_S, REATTACH_MAX, RECONNECT_DELAY_S, RECONNECT_TRIES,
                        SSH_TIMEOUT_S, say, warn)
from pod_follow import Follower, count_lines, last_line, lost_reason, tail


class Outcome:
  """How following a run ended: ok | failed | refused | stopped | preempted | unreachable."""

  def __init__(self, kind, worker=None, rc=None, stopped=False, other=None, by=None, missing=()):
    self.kind, self.worker, self.rc, self.stopped = kind, worker, rc, stopped
    self.other, self.by, self.missing = other, by, list(missing)


class RunFollowing:
  """Following run attempts on the workers, a part of pod.Pod (sets exits, arrivals, refused,
  stopped_by, lost, follower)."""

  def follow(self, command, phase, attempt, mirror, timeout=0, worker=ALL):
    """Runs COMMAND on the workers and follows it (Follower); returns gcloud's exit code."""
    self.follower = Follower(self, phase, attempt, mirror)
    return self.follower.run(self.ssh_args_for(worker, command), timeout)

  def attempt_dirs(self, base, attempt):
    mirror, rdir = base, f"podlab-logs/{self.run_id}"
    if attempt > 0:
      mirror, rdir = os.path.join(base, f"relaunch-{attempt}"), f"{rdir}/relaunch-{attempt}"
    return mirror, rdir

  def from_list(self, mirror):
    return ",".join(f"{w}:{count_lines(os.path.join(mirror, f'worker-{w}.log'))}"
                    for w in range(self.num_workers))

  def follow_run(self, kind, a, mirror, rdir):
    """Follows run attempt A (KIND start: starts it first) until every worker is accounted for
    (an exit code, or lost), with status checks and re-attaches when the connection is lost."""
    cmd = self.run_cmd(a, rdir) if kind == "start" else self.attach_cmd(a, self.from_list(mirror))
    self.exits, self.arrivals, self.refused, self.stopped_by = {}, [], {}, {}
    rc = self.follow(cmd, "run", a, mirror)
    tries = reattaches = 0
    while True:
      missing = [w for w in range(self.num_workers) if w not in self.exits]
      if not missing:
        break
      warn(f"no exit report from worker(s) {' '.join(map(str, missing))} (gcloud exit code {rc}): "
           "the connection was lost; checking the run's status on the workers (the run is not "
           "stopped)")
      st = self.query_status()
      if not self.complete(st):
        error = self.describe()
        if error is None and self.state == "READY":
          if tries >= RECONNECT_TRIES:
            return Outcome("unreachable", missing=[w for w in missing if w not in st])
          tries += 1
          warn(f"could not reach every worker; asking again in {RECONNECT_DELAY_S:g} s ({tries} of "
               f"{RECONNECT_TRIES})")
          time.sleep(RECONNECT_DELAY_S)
          continue
        if error is not None:
          self.state = "not found"
        return Outcome("preempted")
      tries, running, lost = 0, [], []
      for w in missing:
        s = st[w]
        if (s["run"], s["attempt"]) != (self.run_id, str(a)):
          lost.append((w, f"its current run is {s['run']} attempt {s['attempt']}, not "
                          f"{self.run_id} attempt {a}" if s["state"] != "none" else
                       f"no run of {self.run_id} was ever recorded there"))
        elif s["state"] in ("running", "starting"):
          running.append(w)
        elif s["rc"] != "-":
          warn(f"worker {w}: run {self.run_id} attempt {a} ended while disconnected (exit code "
               f"{s['rc']})")
          self.record_exit(w, s["rc"], s["stopped"] == "1")
        else:
          lost.append((w, lost_reason(s)))
      for w, reason in lost:
        self.declare_lost(w, reason, mirror, stop_now=False)
      if lost and (running or any(w not in self.exits for w in range(self.num_workers))):
        self.stop_run(a, mirror, wait=True)
        continue
      if not running:
        continue
      if reattaches >= REATTACH_MAX:
        return Outcome("unreachable", missing=running)
      reattaches += 1
      say(f"run {self.run_id} attempt {a} is still running on worker(s) "
          f"{' '.join(map(str, running))}; re-attaching")
      rc = self.follow(self.attach_cmd(a, self.from_list(mirror)), "run", a, mirror)
    return self.outcome()

  def record_exit(self, w, rc, stopped=False):
    if w not in self.exits:
      self.exits[w] = (rc, stopped)
      self.arrivals.append((w, rc, stopped))

  def declare_lost(self, w, reason, mirror, stop_now=True):
    if w in self.exits:
      return
    self.lost[w] = reason
    warn(f"worker {w} is lost: {reason}; stopping the run on every worker")
    if stop_now:
      self.follower.exit(w, "lost")
    else:
      self.record_exit(w, "lost")

  def stop_run(self, a, mirror, wait):
    """Fail-fast: stops run attempt A on every worker (and records the stop there, so that a
    worker whose start is late does not start alone)."""
    cmd = self.ssh_args_for(ALL, self.stop_cmd(FAILFAST_GRACE_S, self.run_id, a))
    with open(os.path.join(mirror, "stop.log"), "ab") as log:
      proc = self.gc.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    self.stoppers.append(proc)
    if wait:
      try:
        proc.wait(timeout=FAILFAST_GRACE_S + SSH_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        self.gc.end(proc)

  def outcome(self):
    """The first failure in arrival order is the cause."""
    for w, rc, stopped in self.arrivals:
      if rc == "0":
        continue
      if rc == "refused":
        return Outcome("refused", worker=w, rc=rc, other=self.refused.get(w))
      if rc == "stopped":
        return Outcome("stopped", worker=w, rc=rc, by=self.stopped_by.get(w))
      return Outcome("failed", worker=w, rc=rc, stopped=stopped)
    return Outcome("ok")

  def last_checkpoint(self, mirror):
    steps = []
    for log in glob.glob(os.path.join(mirror, "worker-*.log")):
      with open(log, errors="replace") as f:
        steps += [int(s) for s in re.findall(
            r"checkpoint (\d+) saved|checkpointing: saving step (\d+)", f.read()) for s in s if s]
    return max(steps) if steps else None

  def checkpoint_phrase(self, mirror):
    step = self.last_checkpoint(mirror)
    if step is not None:
      return f"its last checkpoint is step {step} (the last one its logs name), in {self.o.workdir}"
    return f"its logs here name no checkpoint of this attempt; {self.o.workdir} holds any it saved"

  def fetch_tail(self, a, mirror):
    """The rest of attempt A's worker logs, after the connection dropped before their end."""
    say(f"fetching the rest of run {self.run_id} attempt {a}'s worker logs (the connection "
        "dropped before their end)")
    saved = (self.exits, self.arrivals)
    self.exits, self.arrivals = {}, []
    self.follow(self.attach_cmd(a, self.from_list(mirror)), "tail", a, mirror, SSH_TIMEOUT_S)
    self.exits, self.arrivals = saved

  def report_failure(self, outcome, mirror, rdir):
    name = self.o.name
    if outcome.kind == "refused":
      other, other_attempt = outcome.other or ("?", "?")
      warn(f"FAILED (run): worker {outcome.worker} already runs run {other} attempt "
           f"{other_attempt}; run {self.run_id} was stopped on the workers where it had started. "
           f"Fix: follow it ({self.later('attach')}) or stop it ({self.later('stop')})")
    elif outcome.kind == "stopped":
      warn(f"run {self.run_id} was stopped by its user (by {outcome.by}) before it started on "
           f"worker {outcome.worker}; the workers that had started were stopped")
    elif outcome.kind == "failed":
      w = outcome.worker
      log = os.path.join(mirror, f"worker-{w}.log")
      if outcome.rc == "lost":
        reason = self.lost.get(w, "no live process and no exit code")
        warn(f"FAILED (run): worker {w} is lost ({reason}); the other workers were stopped.")
        warn(f"its last log line: {last_line(log) or '(none: it logged nothing)'}")
      elif outcome.stopped:
        warn(f"run {self.run_id} was stopped by its user (exit {outcome.rc} on worker {w})")
      else:
        warn(f"FAILED (run): worker {w} exited with code {outcome.rc}; the other workers were "
             "stopped.")
      warn(f"its log: {log} (on the worker: ~/{rdir}/worker-{w}.log)")
      tail(log)
    elif outcome.kind == "preempted":
      warn(f"the slice {name} is {self.state or 'unreachable'} (preempted or in maintenance): run "
           f"{self.run_id} ended with it; {self.checkpoint_phrase(mirror)}")
    elif outcome.kind == "unreachable":
      ended = [f"worker {w} exit {rc}" for w, (rc, _) in sorted(self.exits.items())]
      warn(f"could not reach worker(s) {' '.join(map(str, outcome.missing))} of {name}: their run "
           f"{self.run_id} may still be going"
           + (f" ({', '.join(ended)} known ended)" if ended else "")
           + f". Check with {self.later('status')}; follow with {self.later('attach')}")
