"""Preemption, exact resume, atomic/corrupt checkpoints, the non-finite guard, early validation.

The kill/resume test runs the real command (`python -m experiments.trm.main`) in subprocesses and
injects the faults with experiments/trm/tools/faults.py, the library behind `make faults` (which runs many
random trials; this is one fixed sequence of them).

  .venv/bin/python -m pytest tests/test_faults.py -q
"""
import os
import re
import shutil
import signal

import jax
import numpy as np
import pytest

from experiments.common import checkpointing
from experiments.common import config_utils
from experiments.common import errors
from experiments.common import trainer
from experiments.common import preemption
from experiments.trm.tools import faults
from experiments.trm import train
from experiments.trm.configs import cpu_demo

TOTAL = 12


EXTRA = [f"--config.total_steps={TOTAL}", "--config.log_every_steps=3", "--config.eval_every_steps=6"]


def _cmd(workdir, data_dir, processes=1):
  """faults' training command with 12 steps, a checkpoint every 4 and a metric line every 3."""
  return faults.command(str(workdir), str(data_dir), processes, 2, str(workdir / "logs"), EXTRA)


# ~125 s: `make faults` runs the same trials; kept out of `make test`'s 15-minute budget
@pytest.mark.slow
def test_kill_during_save_then_sigterm_then_resume_is_bitwise_identical(tmp_path):
  env = faults.environment(1, 2)
  data_dir = tmp_path / "tfds"
  cmd = lambda w: _cmd(w, data_dir)  # noqa: E731
  ref = faults.run(cmd(tmp_path / "ref"), env, log_path=str(tmp_path / "ref.log"))
  assert ref.returncode == 0, ref.output[-3000:]
  reference = faults.replicated_state(str(tmp_path / "ref"), TOTAL)
  ref_scalars = faults.train_scalars(str(tmp_path / "ref"))
  assert sorted(ref_scalars["train/lm_loss"]) == [3, 6, 9, 12]

  work = tmp_path / "run"
  # 1. SIGKILL the moment the second checkpoint (step 8) starts saving (asynchronously).
  first = faults.run(cmd(work), env, kill_on_save=2, log_path=str(tmp_path / "run1.log"))
  assert first.returncode == -signal.SIGKILL, first.output[-3000:]
  assert first.saves_started[:2] == [4, 8]
  complete = faults.complete_steps(str(work))
  assert 4 in complete, complete                 # the in-flight save of 8 may or may not be complete
  # 2. Restart; SIGTERM as soon as it has resumed: it finishes one step, saves it, exits 143.
  second = faults.run(cmd(work), env, kill_at_step=None, log_path=str(tmp_path / "run2.log"),
                      sig=signal.SIGTERM, kill_on_resume=True)
  assert second.resumed_from == max(complete), second.output[-3000:]
  assert second.returncode == 143, second.output[-3000:]
  stopped = second.resumed_from + 1
  assert f"preempted by SIGTERM after step {stopped}" in second.output
  assert max(faults.complete_steps(str(work))) == stopped
  # 3. Restart: resumes at that step and finishes; everything equals the unbroken run, bit for bit.
  third = faults.run(cmd(work), env, log_path=str(tmp_path / "run3.log"))
  assert third.returncode == 0 and third.resumed_from == stopped, third.output[-3000:]
  final = faults.replicated_state(str(work), TOTAL)
  assert faults.same_arrays(final, reference)
  assert any("params" in k for k in final) and any("window" in k for k in final)
  # Metrics from the resume point on, including the window that spans the SIGTERM stop (not a
  # multiple of 3: its sums were saved in the checkpoint and continued).
  scalars = faults.train_scalars(str(work))
  assert stopped % 3 != 0
  for tag, values in ref_scalars.items():
    for step, value in values.items():
      if step > stopped:
        assert scalars[tag][step] == value, (tag, step, scalars[tag][step], value)


def test_preemption_guard_single_process_stops_at_the_next_step():
  previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
  with preemption.PreemptionGuard() as guard:
    assert not guard.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.should_stop(2) and guard.signal_name == "SIGTERM"
  assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous


# --------------------------------------------------------------------------------------------------
# Checkpoints: a truncated file, an interrupted save.

def _manager(directory):
  return checkpointing.CheckpointManager(str(directory), max_to_keep=5, save_interval_steps=1,
                                         enable_async=False)


def _save_two(directory):
  n = jax.local_device_count()
  with _manager(directory) as ckpt:
    for step in (1, 2):
      ckpt.save(step, replicated={"w": np.full((3,), step, np.float32)},
                per_device={"c": np.full((n, 2), step, np.float32)})
  return n


def _truncate_array_files(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs
           if os.sep + "d" + os.sep in os.path.join(r, f) + os.sep]
  assert files, step_dir
  for path in files:
    with open(path, "r+b") as f:
      f.truncate(max(1, os.path.getsize(path) // 3))


def test_truncated_checkpoint_is_named_and_fallback_uses_the_previous(tmp_path):
  n = _save_two(tmp_path)
  _truncate_array_files(tmp_path / "2")
  like = dict(replicated_like={"w": np.zeros((3,), np.float32)},
              per_device_like={"c": np.zeros((n, 2), np.float32)})
  with _manager(tmp_path) as ckpt:
    with pytest.raises(checkpointing.CheckpointError) as e:
      ckpt.restore_latest(**like)
    assert str(tmp_path / "2") in str(e.value) and "restore_fallback=True" in str(e.value)
    step, rep, per = ckpt.restore_latest(**like, fallback=True)
  assert step == 1 and np.all(rep["w"] == 1) and np.all(per["c"] == 1)
  aside = [d for d in os.listdir(tmp_path) if d.startswith("2.unreadable-")]
  assert len(aside) == 1 and not (tmp_path / "2").exists()
  with _manager(tmp_path) as ckpt:               # no loop: the next start restores 1 directly
    assert ckpt.all_steps() == [1]
    assert ckpt.restore_latest(**like)[0] == 1


def test_interrupted_save_is_ignored(tmp_path):
  n = _save_two(tmp_path)
  # What a kill during the save of step 3 leaves: orbax's tmp dir (renamed only when complete).
  shutil.copytree(tmp_path / "2", tmp_path / "3.orbax-checkpoint-tmp-1234")
  _truncate_array_files(tmp_path / "3.orbax-checkpoint-tmp-1234")
  with _manager(tmp_path) as ckpt:
    assert ckpt.all_steps() == [1, 2]
    step, rep, _ = ckpt.restore_latest(replicated_like={"w": np.zeros((3,), np.float32)},
                                       per_device_like={"c": np.zeros((n, 2), np.float32)})
  assert step == 2 and np.all(rep["w"] == 2)


# --------------------------------------------------------------------------------------------------
# The non-finite guard and validation before compile (in process, 4 fake devices).

def _smoke(tmp_path, **overrides):
  c = cpu_demo.get_config("smoke")
  c.dataset.data_dir = str(tmp_path / "tfds")
  c.async_checkpoints = False
  for k, v in overrides.items():
    c[k] = v
  return c


def test_nonfinite_stops_keeping_the_last_good_checkpoint_or_skips(tmp_path):
  workdir, skipdir = str(tmp_path / "run"), str(tmp_path / "skip")
  train.train_and_evaluate(_smoke(tmp_path, total_steps=3, final_eval=False), workdir)
  shutil.copytree(workdir, skipdir)
  # A learning rate near the float32 maximum from step 4 on (constant: lr_min_ratio is 1): the
  # parameters blow up and the loss turns NaN at step 4 or 5; the run stops there, saving nothing.
  bad = _smoke(tmp_path, total_steps=6, lr=3e38, lr_warmup_steps=1, final_eval=False,
               allow_config_change=True)
  assert bad.lr_min_ratio == 1.0
  with pytest.raises(errors.NonFiniteError) as e:
    train.train_and_evaluate(bad, workdir)
  message = str(e.value)
  assert re.match(r"step [45]: non-finite training metric: (lm_loss = nan|the updated parameters)",
                  message), message
  assert "the last good checkpoint is step 3" in message and "nonfinite=skip" in message
  assert faults.complete_steps(workdir) == [3]
  # Skipping: the first non-finite step and every later one leave the state as it was.
  bad.nonfinite = "skip"
  bad.checkpoint_every_steps = 1
  bad.keep_checkpoints = 5
  train.train_and_evaluate(bad, skipdir)
  scalars = faults.train_scalars(skipdir)
  skipped = int(scalars["train/nonfinite_steps"][4] + scalars["train/nonfinite_steps"][6])
  assert skipped in (2, 3), scalars["train/nonfinite_steps"]
  last_applied = 6 - skipped
  kept = faults.replicated_state(skipdir, last_applied)
  final = faults.replicated_state(skipdir, 6)
  assert int(final["['state']['step']"]) == 6
  for key, value in kept.items():
    if key.startswith("['state']") and "step" not in key:
      np.testing.assert_array_equal(final[key], value, err_msg=key)
      assert np.all(np.isfinite(final[key])), key


def test_unwritable_workdir_fails_before_anything_is_compiled(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.raises(config_utils.WorkdirError) as e:
    train.train_and_evaluate(_smoke(tmp_path), str(blocker / "run"))
  assert f"--workdir='{blocker / 'run'}': cannot write there" in str(e.value)
  assert "Fix: pass a writable" in str(e.value)
  assert not (tmp_path / "tfds").exists()        # nothing was prepared or compiled


def test_nonfinite_option_is_validated(tmp_path):
  with pytest.raises(config_utils.ConfigError, match=r"config.nonfinite='ignore'.*'stop', 'skip'"):
    trainer.check_config(train.TRM(), _smoke(tmp_path, nonfinite="ignore"))


# ~110 s (two processes, twice); kept out of `make test`'s 15-minute budget
@pytest.mark.slow
def test_two_process_sigterm_stops_every_host_at_one_step_and_resumes_exactly(tmp_path):
  """2 processes x 2 devices through launch/local.sh: SIGTERM reaches process 0 only; JAX's
  preemption service makes both stop after the same step and save it; the rerun ends bitwise equal
  to an unbroken 2 x 2 run."""
  env = faults.environment(2, 2)
  data_dir = tmp_path / "tfds"

  cmd = lambda w: _cmd(w, data_dir, processes=2)  # noqa: E731

  ref = faults.run(cmd(tmp_path / "ref"), env, log_path=str(tmp_path / "ref.log"))
  assert ref.returncode == 0, ref.output[-3000:]
  work = tmp_path / "run"
  first = faults.run(cmd(work), env, kill_at_step=3, sig=signal.SIGTERM,
                     log_path=str(tmp_path / "run1.log"),
                     pid_file=str(work / "logs" / "state" / "worker-0.pid"))
  assert first.returncode == 1, first.output[-3000:]          # local.sh: the processes exited 143
  stops = [(work / "logs" / f"worker-{i}.log").read_text() for i in range(2)]
  steps = [int(re.search(r"preempted by SIGTERM after step (\d+)", log).group(1)) for log in stops]
  assert steps[0] == steps[1] >= 3, steps                      # the same step on both hosts
  assert "exited with code 143" in first.output
  assert max(faults.complete_steps(str(work))) == steps[0]
  second = faults.run(cmd(work), env, log_path=str(tmp_path / "run2.log"))
  assert second.returncode == 0 and second.resumed_from == steps[0], second.output[-3000:]
  assert faults.same_arrays(faults.replicated_state(str(work), TOTAL),
                            faults.replicated_state(str(tmp_path / "ref"), TOTAL))
