"""A stand-in trainer for the launcher tests: prints `step N` lines slowly, checkpoints, resumes.

launch/pod.sh runs it on the fake gcloud's workers as `python -m tests.fake_gcloud.steps_worker`
where a TRM run would take a minute: the launcher's behaviour (detach, attach, retries, stop,
--watch) does not depend on what the command computes.

  python -m tests.fake_gcloud.steps_worker --steps=20 --interval=0.2 --workdir=/tmp/w [--exit-code=2]

Every process appends `<pid> <PODLAB_RUN_ID> <PODLAB_RUN_ATTEMPT>` to $HOME/steps-starts.txt when it
starts (so a test counts the processes a run really had). Worker $PODLAB_PROCESS_ID's progress is
`--workdir/progress-<worker>.txt` (the last step done): a restart resumes after it, like a trainer
resuming from its checkpoint. SIGTERM saves the progress, prints `checkpoint N saved` as the
trainer does, and exits 143 (a preempted trainer);
--exit-code C exits with C after the last step (--fail-at K: at step K instead). --quiet-others:
workers other than 0 print no `step N` lines, as the trainer's processes other than 0 (a
"Training from step S to N" line and a Gloo line instead). --hold-at K
--release-file F: after step K it waits until file F exists, so that a test can act on a live run
however slow the machine is.
"""
import argparse
import os
import signal
import sys
import time


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--interval", type=float, default=0.2)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--exit-code", type=int, default=0)
  parser.add_argument("--fail-at", type=int, default=0)
  parser.add_argument("--hold-at", type=int, default=0)
  parser.add_argument("--release-file", default="")
  parser.add_argument("--quiet-others", action="store_true")
  args, _ = parser.parse_known_args()
  worker = os.environ.get("PODLAB_PROCESS_ID", "0")
  run_id = os.environ.get("PODLAB_RUN_ID", "-")
  attempt = os.environ.get("PODLAB_RUN_ATTEMPT", "-")
  with open(os.path.join(os.environ["HOME"], "steps-starts.txt"), "a") as f:
    f.write(f"{os.getpid()} {run_id} {attempt}\n")
  os.makedirs(args.workdir, exist_ok=True)
  progress = os.path.join(args.workdir, f"progress-{worker}.txt")
  start = int(open(progress).read()) if os.path.exists(progress) else 0
  step = start

  def save():
    with open(progress + ".tmp", "w") as f:
      f.write(str(step))
    os.replace(progress + ".tmp", progress)

  def on_term(signum, frame):  # pylint: disable=unused-argument
    save()
    print(f"preempted by SIGTERM after step {step}: checkpoint {step} saved", flush=True)
    sys.exit(143)

  signal.signal(signal.SIGTERM, on_term)
  print(f"worker {worker}: run {run_id} attempt {attempt}: from step {start} to {args.steps}",
        flush=True)
  quiet = args.quiet_others and worker != "0"
  if quiet:          # as the trainer on processes other than 0: no progress lines, Gloo chatter
    print(f"Training from step {start} to {args.steps}", flush=True)
    print(f"[Gloo] Rank {worker} is connected to 1 peer ranks. Expected number of connected peer "
          "ranks is : 1", flush=True)
  while step < args.steps:
    time.sleep(args.interval)
    step += 1
    save()
    if not quiet:
      print(f"step {step}", flush=True)
    if step == args.hold_at and args.release_file:
      while not os.path.exists(args.release_file):
        time.sleep(0.05)
    if step == args.fail_at:
      print(f"failing at step {step} with exit code {args.exit_code}", flush=True)
      sys.exit(args.exit_code)
  print(f"done at step {step}", flush=True)
  sys.exit(args.exit_code if not args.fail_at else 0)


if __name__ == "__main__":
  main()
