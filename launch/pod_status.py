"""The subcommands on a run already on the slice (Subcommands, a part of launch/pod.py's Pod):
status, logs, attach and stop, and the status query that they and the follower share.
"""
import os
import re
import sys

from pod_common import ALL, Exit, REPO, SSH_TIMEOUT_S, die, say, warn


class Subcommands:
  """`pod.sh NAME status|logs|attach|stop`, a part of pod.Pod."""

  def query_status(self, worker=ALL, timeout=SSH_TIMEOUT_S):
    """{worker: status fields} of those that answered (the raw output: status_out)."""
    _, out = self.ssh(worker, timeout, self.with_worker("status"))
    st = {}
    for line in out.splitlines():
      m = re.match(r"PODLAB_STATUS worker=(\d+) state=(\S+) run=(\S+) attempt=(\S+) pid=(\S+) "
                   r"rc=(\S+) step=(\S+) stopped=(\S+) log=(\S*) last=(.*)$", line)
      if m:
        st[int(m.group(1))] = dict(zip(("state", "run", "attempt", "pid", "rc", "step", "stopped",
                                        "log", "last"), m.groups()[1:]))
    self.status_out = out
    return st

  def complete(self, st, worker=ALL):
    wanted = range(self.num_workers) if worker == ALL else [int(worker)]
    return all(w in st for w in wanted)

  def print_status(self, st):
    w0 = self.o.worker
    workers = range(self.num_workers) if not w0 or w0 == ALL else [int(w0)]
    fmt = "{:<6}  {:<24}  {:<7}  {:<9}  {:<8}  {:<5}  {:<12}  {:<6}  {}"
    print(fmt.format("worker", "run", "attempt", "state", "pid", "alive", "exit", "step",
                     "last log line"))
    quiet = []
    for w in workers:
      s = st.get(w)
      if s is None:
        print(f"{w:<6}  no answer (ssh failed: see below)")
        continue
      alive = {"running": "yes", "starting": "yes", "none": "-"}.get(s["state"], "no")
      last = "(no podlab run recorded on this worker)" if s["state"] == "none" else s["last"]
      rc = "lost" if s["state"] == "lost" else s["rc"]
      if s["stopped"] == "1":
        rc += " (stop)"
      print(fmt.format(w, s["run"], s["attempt"], s["state"], s["pid"], alive, rc, s["step"],
                       last[:100]))
      first = st.get(0, {})
      if (w > 0 and s["step"] == "-" and first.get("step", "-") != "-"
          and (s["run"], s["attempt"]) == (first.get("run"), first.get("attempt"))):
        quiet.append(str(w))
    if quiet:
      print(f"(step -: worker(s) {' '.join(quiet)} log no training progress of their own; process "
            "0 logs it for the whole run)")
    sys.stdout.flush()

  def status_tail(self):
    lines = [l for l in self.status_out.splitlines() if not l.startswith("PODLAB_STATUS")]
    if lines:
      print("\n".join(lines[-20:]), file=sys.stderr)

  # Subcommands ----------------------------------------------------------------------------------

  def cmd_status(self):
    self.require_gcloud()
    self.describe_or_die()
    self.check_worker_flag()
    print(f"TPU {self.o.name}: {self.state}, {self.accel}, {self.num_workers} workers, zone "
          f"{self.o.zone}", flush=True)
    self.require_ready()
    worker = self.o.worker or ALL
    st = self.query_status(worker)
    self.print_status(st)
    if not self.complete(st, worker):
      self.status_tail()
      return 1
    return 0

  def cmd_logs(self):
    self.require_gcloud()
    self.describe_or_die()
    self.check_worker_flag()
    self.require_ready()
    worker, args = self.o.worker or ALL, ""
    if self.o.follow:
      args += " -f"
    if self.o.lines:
      args += f" -n {self.o.lines}"
    if worker == ALL:
      args += " --prefix"
    self.phase = "logs"
    rc, _ = self.gc.run(self.ssh_args_for(worker, self.with_worker("logs" + args)),
                        0 if self.o.follow else SSH_TIMEOUT_S, stdout=None, stderr=None)
    return rc

  def current_run(self):
    """The run on the workers now (worker 0's): sets run_id and attempt."""
    st = self.query_status()
    if not self.complete(st):
      self.status_tail()
      self.print_status(st)
      warn(f"could not ask every worker of {self.o.name} for its run")
      raise Exit(1)
    for w in range(self.num_workers):
      if (st[w]["run"], st[w]["attempt"], st[w]["state"]) != (st[0]["run"], st[0]["attempt"],
                                                             st[0]["state"]):
        warn(f"the workers disagree (worker {w}: run {st[w]['run']} attempt {st[w]['attempt']}, "
             f"worker 0: run {st[0]['run']} attempt {st[0]['attempt']}); following worker 0's")
        break
    if st[0]["state"] == "none":
      warn(f"no podlab run recorded on {self.o.name}")
      raise Exit(1)
    if st[0]["state"] in ("shipping", "prepared"):
      warn(f"run {st[0]['run']} is being started ({st[0]['state']}) on {self.o.name}: attach once "
           f"it runs ({self.later('status')})")
      raise Exit(1)
    self.run_id, self.attempt = st[0]["run"], int(st[0]["attempt"])
    return st

  def cmd_attach(self):
    self.require_gcloud()
    self.describe_or_die()
    self.require_ready()
    self.current_run()
    base = self.o.log_dir or os.path.join(REPO, "logs", "pod", self.o.name, self.run_id)
    mirror, rdir = self.attempt_dirs(base, self.attempt)
    try:
      os.makedirs(mirror, exist_ok=True)
    except OSError:
      die(f"cannot create the log dir {mirror}")
    self.exits = {}
    say(f"following run {self.run_id} attempt {self.attempt} on {self.o.name} ({self.num_workers} "
        f"workers); log copies in {mirror}")
    self.phase = "attach"
    outcome = self.follow_run("attach", self.attempt, mirror, rdir)
    if outcome.kind == "ok":
      say(f"run {self.run_id} attempt {self.attempt} finished on all {self.num_workers} workers "
          "(exit code 0)")
      return 0
    self.report_failure(outcome, mirror, rdir)
    return 1

  def cmd_stop(self):
    self.require_gcloud()
    self.describe_or_die()
    g = self.o.grace or "120"
    self.record_local_stop()
    if self.state != "READY":
      watches = self.local_watches()
      if watches:
        for run_id, pid in watches:
          say(f"TPU '{self.o.name}' is {self.state}: its workers cannot be reached; the stop "
              f"request is recorded here: the --watch of run {run_id} (pid {pid}) on this machine "
              "will not relaunch it")
        return 0
      warn(f"TPU '{self.o.name}' is {self.state}, not READY: its workers cannot be reached. The "
           "stop request is recorded on this machine only (a --watch running here would honour "
           f"it); run {self.later('stop')} again once {self.o.name} is READY")
      return 1
    say(f"stopping the podlab run on every worker of {self.o.name}: SIGTERM (the trainer saves a "
        f"checkpoint and exits), SIGKILL after {g} s; a launch being shipped will not start")
    self.phase = "stop"
    rc, out = self.ssh(ALL, int(g) + SSH_TIMEOUT_S, self.stop_cmd(g, by_user=True))
    print("\n".join(l for l in out.splitlines() if not l.startswith("PODLAB_STATUS")), flush=True)
    st = self.query_status()
    if self.complete(st):
      self.print_status(st)
    return 1 if rc else 0
