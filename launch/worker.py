"""One worker of a podlab run: set up its environment, prepare a run's code, start the run detached,
follow it, stop it, report it. Standard library only (Python >= 3.8): it runs with a TPU VM's own
python3, before any environment exists. `launch/worker.sh` (`python3 launch/worker.py "$@"`) is the
command: launch/pod.py runs it on every worker of a slice (`gcloud ... ssh --worker=all`) and
launch/local.sh once per local process, so a pod and a local pod share this code path.

  worker.sh setup [--python PATH] [--venv DIR] [--jax tpu|cpu]
      Idempotent. Without --python: create DIR (default ~/podlab-venv) with Python 3.11 and install
      the pinned stack (constraints.txt; on TPU jax[tpu], so libtpu at the version jax pins) unless
      DIR's stamp says it is current. Python 3.11 missing (Ubuntu 22.04 TPU images ship 3.10):
      `apt-get install python3.11 python3.11-venv` from Ubuntu's own archive, after waiting for the
      dpkg lock. With --python: use that interpreter as is, only check the pinned versions. Prints
      `PODLAB_PYTHON=<interpreter>` last. One setup of a venv at a time (the lock DIR.setup.lock).
  worker.sh claim --run-id ID
      Worker 0 of a slice, right after launch/pod.py appended the launch's claim line to the
      journal: `PODLAB_CLAIM granted run=ID at=T` when no earlier launch holds the slice, else
      `PODLAB_CLAIM refused run=ID holder=H attempt=A state=S at=T by=WHO` (and a release line).
  worker.sh prepare --run-id ID --attempt A [--claimed-at T] [--stop-others] [setup options]
      Run from the run's code freshly unpacked into <runs>/<ID>.new: refuses while another run is
      alive here or when a stop request came after the claim; records the run as `shipping`, stops
      podlab's own stale TPU holders (`clean`), moves the code to <runs>/<ID> (~/podlab: a link to
      it), runs `setup`, records `prepared`. Output prefixed `[worker <i>] `, then
      `PODLAB_WORKER_EXIT worker=<i> rc=<code> phase=prepare`.
  worker.sh clean [--stop-others]
      On a TPU VM: stops podlab's own stale processes that still hold a TPU device (found with
      `lsof`, installed if missing: a recorded run's processes, by identity, or a process carrying
      a recorded PODLAB_RUN_ID) and removes the libtpu lockfile, with sudo when not root. Other
      holders are listed (user, pid, command) and make it fail (exit 2), leaving them and the
      lockfile alone; --stop-others stops them too. Refuses while a podlab run is alive here.
  worker.sh run --run-id ID [--attempt A] [--claimed-at T] --log-dir DIR [--detach]
                [--follow [--numbered]] [--from-line N | --from I:N,...] [--alive-every S] -- CMD...
      Records the run (`starting`) before anything starts, then starts CMD (argv, never re-parsed
      by a shell) under a supervisor that appends its output to DIR/worker-<i>.log (never
      truncated), records its processes (`running`) and exit code (`ended`, or `stopped` after a
      user's stop) and exports PODLAB_RUN_ID=ID, PODLAB_RUN_ATTEMPT=A. A record or log that cannot
      be written (disk full, read-only) refuses with the reason (exit 2) and starts nothing; a
      supervisor that does not confirm its start within 20 s is stopped. --detach: the run gets
      its own session, so it outlives this shell, its ssh connection and its launcher.
      Idempotent: run ID attempt A alive here attaches to it (never a second process); ended, it
      reports its exit code (never reruns it); another run alive refuses, naming it
      (`PODLAB_WORKER_REFUSED ...`, exit 2); a stop request for it refuses
      (`PODLAB_WORKER_STOPPED ...`). Then (unless --detach without --follow) follows it like
      `attach`.
  worker.sh attach [--run-id ID [--attempt A]] [--follow [--numbered]] [--from-line N | --from LIST]
      Waits for this worker's current run (or run ID attempt A) to end; --follow prints its log,
      each line prefixed `[worker <i>] ` (--numbered: `[worker <i> <line number>] `) from line N+1
      on, and `PODLAB_ALIVE worker=<i>` after S quiet seconds (--alive-every S); ends with
      `PODLAB_WORKER_EXIT worker=<i> rc=<exit code|lost> run=ID attempt=A log=<file>` and exits
      with the run's exit code.
  worker.sh status
      One line per recorded run here: `PODLAB_STATUS worker=<i> state=<state> run=ID attempt=A
      pid=P rc=R step=S stopped=0|1 log=<file> last=<last log line>`.
  worker.sh logs [-f] [-n LINES] [--prefix]
      The current run's log (-f: follow it until the run ends; --prefix: `[worker <i>] ` lines).
  worker.sh stop [--grace S] [--run-id ID [--attempt A]] [--by-user] [--by WHO]
      Records a stop request in the journal (so that a launch being shipped or started does not
      start), marks a run being prepared `stopped`, and stops this machine's live podlab runs (or
      only run ID): SIGTERM to the run's process group (the trainer saves a checkpoint and exits
      143), SIGKILL after S seconds (default $PODLAB_STOP_GRACE_S, else 10). --by-user records
      it, so that `pod.sh --watch` does not relaunch a run its user stopped.
  worker.sh tpu-pin [--python PATH]
      Prints the libtpu requirement that PATH's jax pins for jax[tpu], e.g. `libtpu==0.0.42.*`.

A run's states, in the record `$PODLAB_STATE_DIR/worker-<i>.run` (default ~/.podlab; `key=value`
lines, replaced atomically). Each is written before what it names happens, so status, stop,
attach and pod.sh --watch read one truth:

  shipping   prepare has begun (its process is recorded); before it, worker 0's journal holds the
             launch's claim: a claim not yet prepared is `shipping` too (pod.sh copies the code)
  prepared   the code and environment are in place; the run may start (for PODLAB_PREPARED_TTL_S,
             default 600 s)
  starting   written before the supervisor is spawned
  running    the supervisor started the command (both processes recorded)
  ended      the exit code is recorded
  stopped    stopped before it started (nothing will start: by its user, or by its launcher when
             another worker failed), or its exit after a user's stop
  lost       (derived) not ended, and no recorded process is alive with its recorded start time in
             this boot, or a prepare that died: never signalled, no obstacle to a new launch

The journal `$PODLAB_STATE_DIR/journal` is append-only, one line per event: `claim RUN ATTEMPT T
WHO` (worker 0, written by launch/pod.py's claim one-liner), `release RUN ATTEMPT T` (a launch that
gave up before running), `stop T WHO [RUN ATTEMPT]` (a stop request: for every launch claimed
before T, or for that run attempt only). T is the worker's clock (`date +%s.%N`).

The worker index <i> is $PODLAB_PROCESS_ID when set (local runs, tests), else the TPU VM's
`agent-worker-number` from the metadata server, else the `-w-<i>` suffix of the hostname.

Environment knobs: PODLAB_STATE_DIR, PODLAB_STOP_GRACE_S, PODLAB_CLAIM_TTL_S (1200: how long a
claim not yet prepared holds the slice), PODLAB_PREPARED_TTL_S, PODLAB_DPKG_LOCK_TIMEOUT_S (600:
how long apt-get waits for the dpkg lock), PODLAB_SETUP_LOCK_TIMEOUT_S (3600: how long a setup
waits for another setup of the same venv), PODLAB_SUDO (the sudo command; default `sudo -n` when
not root, none as root). Test hooks: PODLAB_ACCEL_GLOB (the TPU device files, default
`/dev/accel* /dev/vfio/[0-9]*`), PODLAB_LIBTPU_LOCKFILE (/tmp/libtpu_lockfile), PODLAB_LSOF (lsof),
PODLAB_DPKG_LOCK_POLL_S (10).
"""
import os
import sys

if "PODLAB_CALLER_PATH" in os.environ:     # worker.sh's PATH, before its python3's shim changed it
  os.environ["PATH"] = os.environ.pop("PODLAB_CALLER_PATH")

# pylint: disable=g-import-not-at-top,wrong-import-position
from worker_attach import attach  # noqa: E402
from worker_clean import clean  # noqa: E402
from worker_common import Fail, warn, worker_index  # noqa: E402
from worker_prepare import claim, prepare, prepare_steps  # noqa: E402
from worker_run import run, supervise  # noqa: E402
from worker_setup import setup, tpu_pin  # noqa: E402
from worker_status import logs, status  # noqa: E402
from worker_stop import stop  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position


def main(argv):
  sub, args = (argv[0] if argv else ""), argv[1:]
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  commands = {
      "setup": lambda: setup(repo, args),
      "claim": lambda: claim(args, worker_index()),
      "prepare": lambda: prepare(args, worker_index()),
      "_prepare": lambda: prepare_steps(args),
      "clean": lambda: clean(args, worker_index()),
      "run": lambda: run(args, worker_index()),
      "_supervise": lambda: supervise(args),
      "attach": lambda: attach(args, worker_index()),
      "status": lambda: status(args, worker_index()),
      "logs": lambda: logs(args, worker_index()),
      "stop": lambda: stop(args, worker_index()),
      "tpu-pin": lambda: tpu_pin(args),
  }
  if sub not in commands:
    warn(f"worker.sh: error: unknown subcommand '{sub}': expected prepare, setup, clean, stop, "
         "run, attach, status, logs or tpu-pin (see launch/worker.py's docstring)")
    return 2
  try:
    return commands[sub]()
  except Fail as e:
    if str(e):
      warn(f"worker.sh: error: {e}")
    return e.code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
