r"""Fault injection: kill TRM training at random moments, restart it, compare with an unbroken run.

`make faults` (R trials, default 4; `make faults FAULT_ARGS='--trials=20'`):

  python -m experiments.trm.tools.faults --trials=20 [--processes=2 --devices=2] [--seed=0]
      [--sharding=fsdp]          # the state split over the devices (experiments/common/parallel.py)

One uninterrupted reference run first; then every trial trains the same config in a fresh workdir as
the same command a user types (`python -m experiments.trm.main ...`; with --processes > 1 through
`launch/local.sh`), injects one fault, restarts the identical command until it finishes, and
compares with the reference:

  kill        SIGKILL (every process) at a random step
  kill-save   SIGKILL the moment a checkpoint save starts (the save is in flight)
  term        SIGTERM at a random step (process 0 only: the others learn it from JAX's preemption
              service); the run must save that step and exit 143, the restart redo nothing

The table: per trial the step the run had reached when it died, the step it resumed from, the steps
redone (reached - resumed), interrupted saves (started after the newest checkpoint that completed:
in flight when the run died, discarded by the restart, never restored), complete checkpoints lost (must be 0), whether the final replicated state
(parameters, optimizer state, EMA, puzzle table, metric window) is bitwise identical to the
reference, whether every training metric logged from the resume point on is identical, and errors.
The smoke config trains a tiny TRM-MLP on 256 generated Sudoku puzzles with a checkpoint every 4 of
its 24 steps and a metric line every step.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from absl import app
from absl import flags

from experiments.common import console

console.quiet_native_logs()     # before TensorFlow and XLA load (they read it once)

import jax  # noqa: E402  pylint: disable=g-import-not-at-top
import numpy as np  # noqa: E402  pylint: disable=g-import-not-at-top
import tensorflow as tf  # noqa: E402  pylint: disable=g-import-not-at-top

from experiments.common import checkpointing  # noqa: E402  pylint: disable=g-import-not-at-top
from experiments.common import distributed  # noqa: E402  pylint: disable=g-import-not-at-top
from experiments.common import workdir as workdir_lib  # noqa: E402  pylint: disable=g-import-not-at-top

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOTAL_STEPS = 24
CHECKPOINT_EVERY = 4
STEP_LINE = re.compile(r"\[(\d+)\] .*train/accuracy=")
SAVE_LINE = re.compile(r"checkpointing: saving step (\d+)")
RESUME_LINE = re.compile(r"Resumed from \S+ at step (\d+)")
KINDS = ("kill", "kill-save", "term")
RUN_TIMEOUT_S = 600


def train_args(workdir: str, data_dir: str) -> List[str]:
  """The experiment's flags for every run (reference, faulty and restarted)."""
  return [f"--config={os.path.join(REPO_ROOT, 'experiments/trm/configs/cpu_demo.py')}:smoke",
          f"--workdir={workdir}", f"--config.dataset.data_dir={data_dir}",
          f"--config.total_steps={TOTAL_STEPS}", f"--config.checkpoint_every_steps={CHECKPOINT_EVERY}",
          "--config.log_every_steps=1", "--config.eval_every_steps=12", "--config.keep_checkpoints=3"]


def command(workdir: str, data_dir: str, processes: int, devices: int, log_dir: str,
            extra: Sequence[str] = ()) -> List[str]:
  """The user's command: python -m experiments.trm.main (or launch/local.sh for processes > 1)
  with `train_args` and then `extra` (later flags override earlier ones)."""
  args = train_args(workdir, data_dir) + list(extra)
  if processes == 1:
    return [sys.executable, "-m", "experiments.trm.main"] + args
  return [os.path.join(REPO_ROOT, "launch", "local.sh"), "-n", str(processes), "-d", str(devices),
          "--config", "", "--workdir", "", "--log-dir", log_dir, "--"] + args


def environment(processes: int, devices: int) -> Dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith("PODLAB_")}
  # PODLAB_VERBOSE: the tool reads the runs' INFO lines (steps logged, checkpoints saved, resumes).
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT,
             PYTHON=sys.executable, PODLAB_STOP_GRACE_S="5", PODLAB_VERBOSE="1")
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  return env


@dataclasses.dataclass
class RunResult:
  returncode: int
  output: str
  reached: int                  # last step whose metric line was printed
  saves_started: List[int]
  resumed_from: int


def run(cmd: List[str], env: Dict[str, str], *, kill_at_step: Optional[int] = None,
        kill_on_save: int = 0, kill_on_resume: bool = False, sig: int = signal.SIGKILL,
        log_path: str, pid_file: Optional[str] = None) -> RunResult:
  """Runs `cmd`; sends `sig` once step `kill_at_step` is logged, when save number `kill_on_save`
  (1-based) starts, or (`kill_on_resume`) once the run says it resumed from a checkpoint.
  `pid_file`: where launch/local.sh records process 0's pid (the SIGTERM target)."""
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, reached, saves, resumed, sent = [], 0, [], 0, False
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for line in proc.stdout:
      log.write(line)
      lines.append(line)
      if (m := STEP_LINE.search(line)):
        reached = max(reached, int(m.group(1)))
      if (m := SAVE_LINE.search(line)):
        saves.append(int(m.group(1)))
      if (m := RESUME_LINE.search(line)):
        resumed = int(m.group(1))
      fire = (not sent and ((kill_at_step is not None and reached >= kill_at_step)
                            or (kill_on_save and len(saves) >= kill_on_save)
                            or (kill_on_resume and resumed > 0)))
      if fire:
        sent = True
        _signal(proc, sig, pid_file)
      if time.monotonic() > deadline:
        _signal(proc, signal.SIGKILL)
    proc.wait()
  return RunResult(proc.returncode, "".join(lines), reached, saves, resumed)


def _signal(proc: subprocess.Popen, sig: int, pid_file: Optional[str]) -> None:
  if sig == signal.SIGKILL:          # a lost machine: every process of the run dies at once
    os.killpg(proc.pid, signal.SIGKILL)
    return
  # A preemption notice reaches one host: with launch/local.sh, process 0's Python.
  target = proc.pid
  if pid_file is not None:
    with open(pid_file) as f:
      target = int(f.read().strip())
  os.kill(target, sig)


def replicated_state(workdir: str, step: int) -> Dict[str, np.ndarray]:
  """The replicated item of checkpoint `step` as {tree path: numpy array} (no templates needed)."""
  tree = checkpointing.read_tree(workdir_lib.Workdir(workdir).replicated(step))
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(p): v for p, v in flat}


def train_scalars(workdir: str) -> Dict[str, Dict[int, float]]:
  """{tag: {step: value}} of the train/ scalars over all event files (later files win)."""
  out: Dict[str, Dict[int, float]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, "events.out.tfevents.*")),
                     key=os.path.getmtime):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag.startswith("train/") and value.tag not in ("train/steps_per_sec",):
          out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return out


def complete_steps(workdir: str) -> List[int]:
  """The steps of the workdir's complete checkpoints (checkpointing.find_checkpoint's test)."""
  run = workdir_lib.Workdir(workdir)
  if not os.path.isdir(run.checkpoints):
    return []
  steps = sorted(int(n) for n in os.listdir(run.checkpoints) if n.isdigit())
  return [s for s in steps if checkpointing.find_checkpoint(run.checkpoint(s)) == (run.checkpoints, s)]


def same_arrays(a, b) -> bool:
  return a.keys() == b.keys() and all(
      np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
      and np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=True) for k in a)


def trial(index: int, kind: str, rng: random.Random, root: str, data_dir: str, processes: int,
          devices: int, reference: Dict, reference_scalars: Dict,
          extra: Sequence[str] = ()) -> Dict:
  workdir = os.path.join(root, f"trial{index:03d}")
  cmd = command(workdir, data_dir, processes, devices, os.path.join(workdir, "logs"), extra)
  env = environment(processes, devices)
  os.makedirs(workdir, exist_ok=True)
  row = {"trial": index, "kind": kind, "error": ""}
  target = rng.randint(2, TOTAL_STEPS - 1)
  pid_file = (os.path.join(workdir, "logs", "state", "worker-0.pid") if processes > 1 else None)
  first = run(cmd, env, kill_at_step=None if kind == "kill-save" else target,
              kill_on_save=rng.randint(1, TOTAL_STEPS // CHECKPOINT_EVERY - 1)
              if kind == "kill-save" else 0,
              sig=signal.SIGTERM if kind == "term" else signal.SIGKILL,
              log_path=os.path.join(workdir, "run1.log"), pid_file=pid_file)
  before = complete_steps(workdir)
  row["reached"] = first.reached
  if kind == "term":
    ok_exit = first.returncode in (143, 1)   # 1: local.sh reporting the processes' 143
    stop = complete_steps(workdir)[-1] if complete_steps(workdir) else -1
    if not ok_exit or "preempted by SIGTERM" not in first.output:
      row["error"] += f"SIGTERM run exited {first.returncode} without the preemption message; "
    if stop != first.reached:
      row["error"] += f"SIGTERM: last checkpoint {stop} != step reached {first.reached}; "
  elif first.returncode == 0:
    row["error"] += "the fault came too late (run finished); "
  second = run(cmd, env, log_path=os.path.join(workdir, "run2.log"))
  if second.returncode != 0:
    row["error"] += f"restart exited {second.returncode} (see {workdir}/run2.log); "
  after = complete_steps(workdir)
  row["resumed_from"] = second.resumed_from
  row["redone"] = max(0, first.reached - second.resumed_from)
  # Saves newer than the newest complete checkpoint were in flight when the run died (older ones
  # missing from disk were deleted by keep_checkpoints, not lost).
  row["saves_interrupted"] = len([s for s in first.saves_started if s > max(before, default=0)])
  # The restart must resume from the newest checkpoint that was complete when the run died.
  row["ckpts_lost"] = 0 if second.resumed_from == (max(before) if before else 0) else 1
  identical = second.returncode == 0 and TOTAL_STEPS in after
  if identical:
    identical = same_arrays(replicated_state(workdir, TOTAL_STEPS), reference)
  row["identical_params"] = identical
  metrics_ok = False
  if second.returncode == 0:
    scalars = train_scalars(workdir)
    metrics_ok = all(
        scalars.get(tag, {}).get(step) == value
        for tag, values in reference_scalars.items() if tag != "train/steps_per_sec"
        for step, value in values.items() if step > second.resumed_from)
  row["identical_metrics"] = metrics_ok
  return row


def format_rows(rows: List[Dict]) -> str:
  cols = ("trial", "kind", "reached", "resumed_from", "redone", "saves_interrupted", "ckpts_lost",
          "identical_params", "identical_metrics", "error")
  table = [cols] + [tuple(str(r.get(c, "")) for c in cols) for r in rows]
  widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
  lines = ["  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip() for t in table]
  n = len(rows)
  summary = (f"trials {n}: identical final parameters {sum(r['identical_params'] for r in rows)}/{n}, "
             f"identical metrics {sum(r['identical_metrics'] for r in rows)}/{n}, steps redone "
             f"{sum(r['redone'] for r in rows)} (max {max((r['redone'] for r in rows), default=0)}), "
             f"interrupted saves {sum(r['saves_interrupted'] for r in rows)}, complete checkpoints "
             f"lost {sum(r['ckpts_lost'] for r in rows)}, errors {sum(bool(r['error']) for r in rows)}")
  return "\n".join(lines[:1] + ["-" * len(lines[0])] + lines[1:] + ["", summary])


_TRIALS = flags.DEFINE_integer("trials", 4, "Number of fault trials (kinds cycle kill, kill-save, term).")
_PROCESSES = flags.DEFINE_integer("processes", 1, "Processes per run (> 1: through launch/local.sh).")
_DEVICES = flags.DEFINE_integer("devices", 2, "Fake CPU devices per process.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random kill steps.")
_ROOT = flags.DEFINE_string("root", "workdirs/faults", "Where the runs go (deleted first).")
_KINDS = flags.DEFINE_list("kinds", list(KINDS), "Fault kinds to cycle through.")
_SHARDING = flags.DEFINE_enum("sharding", "replicated", ["replicated", "fsdp"],
                              "The runs' state layout (config.sharding).")


def main(argv):
  del argv
  console.quiet_libraries()
  distributed.choose_platforms()          # the runs it starts are CPU runs; no libtpu probing here
  root = os.path.abspath(_ROOT.value)
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  data_dir = os.path.join(root, "tfds")
  for kind in _KINDS.value:
    if kind not in KINDS:
      raise app.UsageError(f"--kinds: unknown kind {kind!r}; choose from {KINDS}")
  p, d = _PROCESSES.value, _DEVICES.value
  extra = [f"--config.sharding={_SHARDING.value}"]
  print(f"faults: {_TRIALS.value} trials, {p} process(es) x {d} device(s), {TOTAL_STEPS} steps, "
        f"checkpoint every {CHECKPOINT_EVERY}, state {_SHARDING.value}; runs in {root}", flush=True)
  start = time.monotonic()
  ref_dir = os.path.join(root, "reference")
  ref = run(command(ref_dir, data_dir, p, d, os.path.join(ref_dir, "logs"), extra),
            environment(p, d),
            log_path=os.path.join(root, "reference.log"))
  if ref.returncode != 0:
    sys.exit(f"faults: the reference run failed (exit {ref.returncode}); see {root}/reference.log")
  reference, reference_scalars = replicated_state(ref_dir, TOTAL_STEPS), train_scalars(ref_dir)
  print(f"faults: reference run done in {time.monotonic() - start:.0f} s", flush=True)
  rng = random.Random(_SEED.value)
  rows = []
  for i in range(_TRIALS.value):
    kind = _KINDS.value[i % len(_KINDS.value)]
    row = trial(i, kind, rng, root, data_dir, p, d, reference, reference_scalars, extra)
    rows.append(row)
    print(f"faults: trial {i} {kind}: reached {row['reached']}, resumed from "
          f"{row['resumed_from']}, identical {row['identical_params']}/{row['identical_metrics']}"
          f"{', ERROR ' + row['error'] if row['error'] else ''}", flush=True)
  print("\n" + format_rows(rows))
  print(f"\nwall time {time.monotonic() - start:.0f} s")
  if any(r["error"] or not r["identical_params"] or not r["identical_metrics"] for r in rows):
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
