r"""Runs podlab on every worker of a Cloud TPU pod slice. The run is detached from this terminal: it
outlives Ctrl-C, a lost connection or a sleeping laptop; re-attach, watch or stop it from anywhere.

  launch/pod.sh NAME [options] [-- EXPERIMENT ARGS]   start a run, then follow its logs until it ends
  launch/pod.sh NAME --watch [options] [-- ARGS]      ... and relaunch it after a preemption
  launch/pod.sh NAME status                           per worker: run id, state, pid, alive, exit
                                                      code, step, last log line
  launch/pod.sh NAME logs [-f] [-n N] [--worker=K]    the current run's log (every worker, or K)
  launch/pod.sh NAME attach                           follow the current run again until it ends
  launch/pod.sh NAME stop [--grace S]                 SIGTERM (the trainer saves a checkpoint and
                                                      exits 143), SIGKILL after S s (default 120);
                                                      a launch being shipped does not start

  launch/pod.sh stable-1 --bucket my-bucket                    # TRM v4_64 on the v4-64 "stable-1"
  launch/pod.sh stable-1 --bucket my-bucket -- --config.lr=3e-4
  launch/pod.sh stable-1 --bucket my-bucket --dry-run          # print the gcloud commands only

First (docs/pod.md): `gcloud auth login`; the slice exists and is READY (`gcloud compute tpus
tpu-vm list`); `ssh-add ~/.ssh/google_compute_engine`: gcloud's --worker=all needs the key in
ssh-agent; --zone/--project or `gcloud config set compute/zone Z` / `core/project P`.

Options (flag, or environment variable, default):
  --zone Z            $PODLAB_ZONE     gcloud's default (`gcloud config get compute/zone`)
  --project P         $PODLAB_PROJECT  gcloud's default (`gcloud config get core/project`)
  --bucket B          $PODLAB_BUCKET   none; needed unless --workdir and --data_dir are both given
  --workdir W         gs://B/podlab/NAME/<config name>, plus `-<hash>` of the EXPERIMENT ARGS when
                      there are any: checkpoints, TensorBoard, results. The same command resumes
                      from it (a relaunch continues a preempted run); other args, other workdir.
  --data_dir D        gs://B/podlab/tfds: the TFDS data dir (TFDS_DATA_DIR on the workers)
  --module M          experiments.trm.main
  --config C          configs/v4_64.py (resolved inside the experiment's folder; a path in the
                      checkout is sent relative to it)
  --python PATH       an interpreter already on the workers with the pinned stack; setup then only
                      checks the versions instead of creating ~/podlab-venv
  --log-dir L         logs/pod/NAME/<run id> here: a copy of every worker's log, the code archive
  --internal-ip       reach the workers by their internal IPs (from a VM in the same network)
  --gcloud-flag F     added to every `gcloud ... ssh` and `scp` (repeatable), e.g.
                      --gcloud-flag=--tunnel-through-iap
  --ssh-flag F        added to ssh (repeatable). Always: -oServerAliveInterval=$PODLAB_SSH_KEEPALIVE_S
                      (30) -oServerAliveCountMax=4 -oConnectTimeout=$PODLAB_SSH_CONNECT_TIMEOUT_S (30)
  --watch             when the slice was preempted or went through maintenance (or the run died
                      another way than exit 2 or 3), wait until it is READY and relaunch: the run
                      resumes from its last checkpoint; never after a stop
  --max-relaunches N  $PODLAB_MAX_RELAUNCHES (5): --watch gives up after N relaunches
  --lost-after S      $PODLAB_LOST_AFTER_S (120): a worker silent for S s while the others run is
                      asked for its run; without a live process or an exit code it is lost: the
                      others are stopped and the launch exits 1 naming it (start, attach)
  --include PATH      also ship PATH (a file or folder of the checkout that git does not track;
                      repeatable); never .git/, key files or *.env (launch/pack.py's deny list)
  --stop-tpu-holders  stop the processes that are not podlab's but hold the TPU on a worker (they
                      are listed, and the launch stops before starting, without it)
  --dry-run           run the checks of step 0, then print the gcloud commands (one per line,
                      shell-quoted) and run nothing
  EXPERIMENT ARGS     appended to the command on every worker (after --config and --workdir)

Local python: $PYTHON, default .venv/bin/python (`make venv`), for the checks of step 0.

What starting does, in order (steps 1-5 each a `gcloud compute tpus tpu-vm` command):
  0. checks here, before any gcloud TPU call: the module's file exists; the code is packed
     (launch/pack.py: the files git tracks, as in the work tree, plus each --include PATH; it
     names the commit and the tracked files modified and not committed), and for a podlab program
     (experiments/common/entry.py) `python -m M --check_only --config=C --workdir=W ARGS` runs in
     an extraction of that archive: the config loads with its overrides and passes the
     experiment's checks on exactly the code that ships. A failure: one line, exit 2, nothing
     copied or started.
  1. describe NAME: the slice must be READY (--watch waits for it); its worker count. Transient
     gcloud errors are retried ($PODLAB_GCLOUD_TRIES, 3, every $PODLAB_GCLOUD_RETRY_S, 10 s).
  2. claim (`ssh --worker=0`): the launch's claim line in worker 0's journal. Of two launches the
     first claim holds the slice; the other stops here naming it (exit 1), nothing copied.
  3. copies the code to every worker (`scp --worker=all`, ~/podlab-code-<run id>.tgz).
  4. `ssh --worker=all`: launch/worker.sh prepare: refuses while a podlab run is alive there or when
     a stop request came after the claim; stops podlab's own stale processes holding the TPU (sudo
     lsof; other holders are listed and stop the launch unless --stop-tpu-holders); unpacks the
     code into ~/podlab-runs/<run id> (~/podlab links to it); sets up the pinned environment (only
     when pyproject.toml or constraints.txt changed; one setup at a time).
  5. `ssh --worker=all`: starts `python -m M --config=C --workdir=W ARGS` from the run's own code on
     every worker through launch/worker.sh run: recorded before it starts, its own session, its log
     on the worker (~/podlab-logs/<run id>/worker-<i>.log), so ssh dying does not touch it. The
     same connection streams the logs here (`[worker <i>]`, copied to the local log dir) until the
     run ends. A gcloud retry of that command (after an ssh failure) attaches to the run.
Ctrl-C detaches (the run goes on) and prints how to re-attach; before every worker started, it
stops those that did and says so. A lost connection triggers a status check on the workers, then
a re-attach: never a stop. Fail-fast: when a worker's run exits with an error (not 0, 130 or 143)
or is lost, every worker's run is stopped and this exits 1 naming the worker and its log. Exit 0
when every worker finished with exit code 0; 1 when the run failed or could not be started or
reached (or was stopped); 2 for bad input; 130 after Ctrl-C.

Arguments are passed to the workers single-quoted: spaces, quotes, `$(...)` or `;` in names or
arguments reach the experiment literally and never run as commands. Names are validated.
"""
import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
from pod_commands import RemoteCommands  # noqa: E402
from pod_common import ALL, Exit, FAILFAST_GRACE_S, Interrupted, SSH_TIMEOUT_S, warn  # noqa: E402
from pod_gcloud import Connection, Gcloud  # noqa: E402
from pod_local import LocalState  # noqa: E402
from pod_options import Options  # noqa: E402
from pod_run import RunFollowing  # noqa: E402
from pod_ship import Shipping  # noqa: E402
from pod_start import Start  # noqa: E402
from pod_status import Subcommands  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position


class Pod(Connection, RemoteCommands, LocalState, Subcommands, Shipping, Start, RunFollowing):
  """One invocation of pod.sh for the slice `opts.name`: its parts, one concern each, are the
  classes it is made of (pod_gcloud, pod_commands, pod_local, pod_status, pod_ship, pod_start,
  pod_run); this one holds their state, the interruption and the clean-up."""

  def __init__(self, opts):
    self.o = opts
    self.gc = Gcloud()
    self.phase = ""
    self.run_id = ""
    self.attempt = 0
    self.claimed_at = None
    self.claimed = False
    self.follower = None
    self.exits, self.arrivals, self.refused, self.stopped_by, self.lost = {}, [], {}, {}, {}
    self.stoppers = []
    self.state, self.accel, self.num_workers = "", "", 0
    self.lost_after = float(opts.lost_after)
    # PODLAB_ALIVE lines from a quiet worker, often enough for --lost-after (0: no such check).
    self.alive_every = max(1.0, min(30.0, self.lost_after / 4)) if self.lost_after else 30.0
    self.scratch = tempfile.mkdtemp(prefix="podlab-pod.")
    self.watch_file = None

  def on_interrupt(self):
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    self.gc.end_all()
    print(file=sys.stderr)
    f = self.follower
    if self.phase == "run" and f is not None and f.phase == "run":
      started = set(f.started) | set(self.exits)
      if len(started) < self.num_workers:
        waiting = [w for w in range(self.num_workers) if w not in started]
        warn(f"interrupted while run {self.run_id} attempt {self.attempt} was starting: worker(s) "
             f"{' '.join(map(str, sorted(started))) or 'none'} had started, worker(s) "
             f"{' '.join(map(str, waiting))} had not; stopping it on every worker (a partial run "
             "would wait for the missing ones)")
        rc, out = self.gc.run(self.ssh_args_for(ALL, self.stop_cmd(
            FAILFAST_GRACE_S, self.run_id, self.attempt)), FAILFAST_GRACE_S + SSH_TIMEOUT_S)
        with open(os.path.join(f.mirror, "stop.log"), "a") as log:
          log.write(out)
        if rc == 0:
          warn(f"stopped: run {self.run_id} runs on no worker now (its stop is recorded, so a "
               "late start refuses)")
        else:
          warn(f"the stop failed on some worker (gcloud exit code {rc}; see {f.mirror}/stop.log); "
               f"check with {self.later('status')}")
        return 130
    if self.phase in ("run", "watch"):
      warn(f"detached: run {self.run_id} goes on on the workers (Ctrl-C does not stop it).")
      warn(f"  follow it again: {self.later('attach')}")
      warn(f"  its status:      {self.later('status')}")
      warn(f"  stop it:         {self.later('stop')}")
      if self.o.watch:
        warn("  (the --watch relaunching ended with this pod.sh)")
    elif self.phase in ("attach", "logs"):
      warn(f"detached; the run goes on on the workers. Stop it with {self.later('stop')}")
    else:
      if self.claimed:
        self.release(self.attempt)
      warn("interrupted before the run started; nothing was started on the workers")
    return 130

  def close(self):
    self.gc.end_all()
    shutil.rmtree(self.scratch, ignore_errors=True)
    if self.watch_file:
      try:
        os.unlink(self.watch_file)
      except OSError:
        pass


def main(argv):
  try:
    opts = Options(argv, __doc__)
  except Exit as e:
    return e.code
  pod = Pod(opts)

  def interrupted(signum, frame):
    del signum, frame
    raise Interrupted()

  signal.signal(signal.SIGINT, interrupted)
  signal.signal(signal.SIGTERM, interrupted)
  try:
    pod.resolve()
    return {"start": pod.cmd_start, "status": pod.cmd_status, "logs": pod.cmd_logs,
            "attach": pod.cmd_attach, "stop": pod.cmd_stop}[opts.sub]()
  except Exit as e:
    return e.code
  except Interrupted:
    return pod.on_interrupt()
  finally:
    pod.close()


if __name__ == "__main__":
  try:
    sys.exit(main(sys.argv[1:]))
  except BrokenPipeError:                 # `pod.sh --help | head`: the reader is gone
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(141)
