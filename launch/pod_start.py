"""Starting a run (Start, a part of launch/pod.py's Pod): the default workdir and data dir, the dry
run, the claim on the slice, preparing every worker, and the start loop with --watch's relaunches.
"""
import hashlib
import os
import re
import shutil
import sys
import time

from pod_common import (ALL, Exit, FORMAT, GCLOUD, GCLOUD_RETRY_S, GCLOUD_TRIES, PREPARE_TIMEOUT_S,
                        REPO, SSH_TIMEOUT_S, WATCH_MAX_WAIT_S, WATCH_POLL_S, die, q, say, show,
                        warn)
from pod_follow import tail
from pod_run import Outcome
from worker_record import arbitrate


class Start:
  """`pod.sh NAME [options] [-- ARGS]`: steps 1, 2, 4 and 5 (launch/pod.py's docstring), a part of
  pod.Pod."""

  def defaults(self):
    o = self.o
    config_name = os.path.basename(o.config.split(":")[0])
    if config_name.endswith(".py"):
      config_name = config_name[:-3]
    if not o.workdir or not o.data_dir:
      if not o.bucket:
        die("no bucket: pass --bucket B (or set PODLAB_BUCKET) for the default gs://B/podlab/... "
            "workdir and data dir, or give both --workdir and --data_dir")
      bucket = o.bucket[len("gs://"):] if o.bucket.startswith("gs://") else o.bucket
      bucket = bucket.rstrip("/")
      if not re.fullmatch(r"[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]", bucket):
        die(f"--bucket '{bucket}' is not a bucket name (lowercase letters, digits, '-', '_', '.')")
      if not o.workdir:
        o.workdir = f"gs://{bucket}/podlab/{o.name}/{config_name}"
        if o.extra:       # other experiment args, another run: its own workdir
          o.workdir += "-" + hashlib.sha256(
              b"".join(a.encode(errors="surrogateescape") + b"\0" for a in o.extra)).hexdigest()[:8]
      o.data_dir = o.data_dir or f"gs://{bucket}/podlab/tfds"

  def dry_run(self):
    o = self.o
    self.preship()
    ssh = lambda cmd: show([GCLOUD, *self.ssh_args_for(ALL, cmd)])   # noqa: E731
    print("# launch/pod.sh --dry-run: the commands it would run (TensorBoard: tensorboard "
          f"--logdir {o.workdir})")
    print(show([GCLOUD, "compute", "tpus", "tpu-vm", "describe", o.name, *self.tpu_args,
                f"--format={FORMAT}"]))
    print(show([GCLOUD, *self.ssh_args_for(0, self.claim_cmd(0))]))
    print(f"# packs the code above (launch/pack.py {q(REPO)}"
          + "".join(f" --include {i}" for i in o.includes)
          + f") into {q(os.path.join(self.log_dir, 'podlab-code.tgz'))}")
    print(show([GCLOUD, "compute", "tpus", "tpu-vm", "scp",
                os.path.join(self.log_dir, "podlab-code.tgz"),
                f"{o.name}:podlab-code-{self.run_id}.tgz", "--worker=all", *self.conn_args,
                *self.scp_args]))
    print("# CLAIMED_AT: the time the claim above prints (worker 0's clock)")
    print(ssh(self.prepare_cmd(0)))
    print(ssh(self.run_cmd(0, f"podlab-logs/{self.run_id}")))
    print(f"# {self.later('status')}, {self.later('attach')}, {self.later('stop')} run:")
    print(ssh(self.with_worker("status")))
    print(ssh(self.attach_cmd(0, "0:0")))
    print(ssh(self.stop_cmd(120, by_user=True)))
    return 0

  def claim(self, attempt):
    """Step 2: the slice for this launch, or exit 1 naming the launch that holds it."""
    self.phase = "claim"
    for n in range(GCLOUD_TRIES):
      rc, out = self.ssh(0, SSH_TIMEOUT_S, self.claim_cmd(attempt))
      m = re.search(r"^PODLAB_CLAIM (granted|refused) run=\S+ (.*)$", out, re.M)
      if m or "PODLAB_JOURNAL" in out:
        break
      if n < GCLOUD_TRIES - 1:
        warn(f"could not reach worker 0 of {self.o.name} to claim it (gcloud exit code {rc}); "
             f"trying again in {GCLOUD_RETRY_S:g} s")
        time.sleep(GCLOUD_RETRY_S)
    else:
      print("\n".join(out.splitlines()[-10:]), file=sys.stderr)
      warn(f"FAILED: could not reach worker 0 of {self.o.name} (gcloud exit code {rc}, "
           f"{GCLOUD_TRIES} tries); nothing was started")
      raise Exit(1)
    if m:
      fields = dict(f.split("=", 1) for f in m.group(2).split() if "=" in f)
      if m.group(1) == "granted":
        at = float(fields["at"])
      else:
        holder = (fields.get("holder"), fields.get("attempt"), fields.get("state"),
                  float(fields.get("at", 0)), fields.get("by", "-"))
        self.refused_claim(holder, None)
    else:
      entries = [l.split() for l in out.split("PODLAB_JOURNAL", 1)[1].splitlines() if l.split()]
      mine = next(e for e in entries if e[0] == "claim" and e[1:3] == [self.run_id, str(attempt)])
      holder = arbitrate(entries, self.run_id, float(mine[3]), lambda run: None)
      if holder is not None:
        self.ssh(0, SSH_TIMEOUT_S, self.release_cmd(attempt))
        self.refused_claim(holder, float(mine[3]))
      at = float(next(e for e in entries if e[0] == "claim" and e[1] == self.run_id)[3])
    self.claimed = True
    if self.claimed_at is None:
      self.claimed_at = at

  def refused_claim(self, holder, now):
    run, attempt, state, at, by = holder
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "-"
    warn(f"FAILED (claim): run {run} attempt {attempt} holds {self.o.name} (state {state} on "
         f"worker 0; launched by {by}, since {since}); nothing was started. Fix: follow it "
         f"({self.later('attach')}) or stop it ({self.later('stop')}), then relaunch")
    raise Exit(1)

  def release(self, attempt):
    """Gives the claim up (best effort): the launch stops before its run started."""
    if self.claimed:
      self.claimed = False
      self.gc.run(self.ssh_args_for(0, self.release_cmd(attempt)), 60)

  def prepare(self, attempt, mirror):
    """Step 4; 'preempted' or None (or exit 1)."""
    self.phase = "prepare"
    say("preparing every worker (unpack, stop stale TPU processes, environment)")
    rc = self.follow(self.prepare_cmd(attempt), "prepare", attempt, mirror, PREPARE_TIMEOUT_S)
    f = self.follower
    stopped = [w for w in f.stopped]
    if stopped:
      self.claimed = False
      self.report_stopped_before_start(f.stopped[stopped[0]])
    bad = next(((w, r) for w, r, _ in f.arrivals if r != "0"), None)
    if bad is not None:
      self.release(attempt)
      w, code = bad
      if w in f.refused:
        other, other_attempt = f.refused[w]
        warn(f"FAILED (prepare): worker {w} still runs run {other} attempt {other_attempt}; "
             f"nothing was started. Fix: follow it ({self.later('attach')}) or stop it "
             f"({self.later('stop')}), then relaunch")
      else:
        warn(f"FAILED (prepare): worker {w} exited with code {code}; the run was not started.")
        log = os.path.join(mirror, f"prepare-worker-{w}.log")
        warn(f"its output: {log}")
        tail(log)
      raise Exit(1)
    missing = [w for w in range(self.num_workers) if w not in f.exits]
    if missing:
      if self.o.watch and self.describe() is None and self.state != "READY":
        return "preempted"
      self.release(attempt)
      warn(f"FAILED (prepare): no exit report from worker(s) {' '.join(map(str, missing))} "
           f"(gcloud exit code {rc}): the ssh connection or the VM failed; nothing was started; "
           f"see {mirror}")
      raise Exit(1)
    return None

  def report_stopped_before_start(self, info):
    warn(f"run {self.run_id} was stopped by its user (launch/pod.sh {self.o.name} stop, by "
         f"{info}) before it started: nothing was started")
    raise Exit(1)

  def cmd_start(self):
    o = self.o
    self.defaults()
    self.run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.urandom(2).hex()}"
    self.log_dir = o.log_dir or os.path.join(REPO, "logs", "pod", o.name, self.run_id)
    self.phase = "check"
    if o.dry_run:
      return self.dry_run()
    scratch_archive = os.path.join(self.scratch, "podlab-code.tgz")
    self.preship(scratch_archive)
    self.require_gcloud()
    self.t0 = time.time()
    self.phase = "describe"
    self.describe_or_die()
    if self.state != "READY":
      if not o.watch:
        die(f"TPU '{o.name}' is {self.state}, not READY; wait for it or recreate it (--watch "
            "waits)")
      self.wait_ready()
    try:
      os.makedirs(self.log_dir, exist_ok=True)
      self.log_dir = os.path.abspath(self.log_dir)
      shutil.move(scratch_archive, os.path.join(self.log_dir, "podlab-code.tgz"))
    except OSError as e:
      die(f"cannot write the log dir {self.log_dir}: {e}")
    archive = os.path.join(self.log_dir, "podlab-code.tgz")
    say(f"{o.name}: {self.accel}, {self.num_workers} workers, zone {o.zone}; run {self.run_id}; "
        f"logs in {self.log_dir}")
    say(f"workdir {o.workdir}, TFDS data {o.data_dir}")
    say(f"TensorBoard: tensorboard --logdir {o.workdir}")
    if o.watch:
      self.register_watch()
    attempt = relaunches = 0
    while True:
      self.attempt = attempt
      mirror, rdir = self.attempt_dirs(self.log_dir, attempt)
      os.makedirs(mirror, exist_ok=True)
      self.claim(attempt)
      outcome = None
      kind = self.copy(archive, attempt) or self.prepare(attempt, mirror)
      if kind is None:
        self.phase = "run"
        say(f"starting run {self.run_id} attempt {attempt} on every worker (detached: Ctrl-C "
            f"leaves it running): python -m {o.module} --config={self.config_sent} --workdir={o.workdir}"
            + "".join(" " + a for a in o.extra))
        outcome = self.follow_run("start", attempt, mirror, rdir)
        self.claimed = False
      else:
        outcome = Outcome(kind)
      self.phase = "watch"
      if outcome.kind == "ok":
        say(f"all {self.num_workers} workers finished run {self.run_id} (attempt {attempt}); logs "
            f"in {self.log_dir}")
        say(f"TensorBoard: tensorboard --logdir {o.workdir}")
        return 0
      if outcome.kind in ("refused", "unreachable", "stopped"):
        self.report_failure(outcome, mirror, rdir)
        return 1
      self.report_failure(outcome, mirror, rdir)
      if outcome.kind == "failed":
        if not o.watch:
          return 1
        if outcome.stopped:
          warn("stopped by its user: --watch does not relaunch it")
          return 1
        if outcome.rc in ("2", "3"):
          warn(f"exit {outcome.rc} is not a preemption (2: bad input, 3: non-finite training): "
               "--watch does not relaunch it")
          return 1
      elif not o.watch:           # preempted
        warn("when it is READY again, rerun this command to resume from that checkpoint (--watch "
             "does it by itself)")
        return 1
      if relaunches >= int(o.max_relaunches):
        warn(f"FAILED: --watch gave up after {relaunches} relaunches (--max-relaunches "
             f"{o.max_relaunches})")
        return 1
      self.check_local_stop()
      relaunches, attempt = relaunches + 1, attempt + 1
      say(f"relaunch {relaunches} of at most {o.max_relaunches}: once {o.name} is READY, run "
          f"{self.run_id} resumes from its last checkpoint")
      self.wait_ready()
      if outcome.kind == "preempted":
        self.fetch_tail(attempt - 1, mirror)
        say(f"run {self.run_id} attempt {attempt - 1}: {self.checkpoint_phrase(mirror)}")

  def check_local_stop(self):
    stop = self.local_stop_after(self.t0)
    if stop is not None:
      warn(f"run {self.run_id} was stopped by its user (launch/pod.sh {self.o.name} stop, by "
           f"{stop[1]}): --watch does not relaunch it")
      raise Exit(1)

  def wait_ready(self):
    """Waits until the slice is READY (polling describe); gives up on states it does not leave by
    itself, and on a stop request recorded here."""
    start, last = time.monotonic(), ""
    while True:
      if self.o.watch:
        self.check_local_stop()
      if self.describe() is None:
        if self.state == "READY":
          return
        if self.state in ("STOPPING", "STOPPED", "DELETING", "TERMINATED", "HIDDEN"):
          warn(f"FAILED: the slice {self.o.name} is {self.state}: it does not come back by itself; "
               "start or recreate it, then rerun")
          raise Exit(1)
      else:
        self.state = "not found"
      if self.state != last:
        say(f"the slice {self.o.name} is {self.state}; waiting until it is READY (every "
            f"{WATCH_POLL_S:g} s, up to {WATCH_MAX_WAIT_S:g} s)")
      last = self.state
      if time.monotonic() - start >= WATCH_MAX_WAIT_S:
        warn(f"FAILED: {self.o.name} was not READY within {WATCH_MAX_WAIT_S:g} s "
             "(PODLAB_WATCH_MAX_WAIT_S)")
        raise Exit(1)
      time.sleep(WATCH_POLL_S)
