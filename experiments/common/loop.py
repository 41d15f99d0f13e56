"""The training loop shared by every podlab experiment (TRM, nanoGPT): what is not model-specific.

`run_steps` drives optimizer steps `start_step + 1 .. total_steps` through callbacks that close over
the experiment's state: one train step, metrics writing, evaluation and checkpoint saving, with

* the non-finite guard checked one step late (no host sync per step) and always before a metrics
  write, an evaluation or a save (a non-finite state is never saved);
* CLU progress hooks (steps/s, ETA) every step;
* preemption: when `guard.should_stop(step)` (SIGTERM/SIGINT, agreed across hosts) the step is saved
  (forced), metrics flushed and `Preempted` raised; rerunning the command resumes from it.

Also here: the exceptions the mains map to exit codes (`Preempted` -> 143/130, `NonFiniteError` -> 3),
`check_finite` (the "stop" policy's error naming the first non-finite metric and the last good
checkpoint), `check_devices` (device count and batch divisibility), `flat_hparams`, and
`restore_or_init` (resume from the workdir's latest checkpoint).

Synopsis (a toy "experiment" whose step adds 1):

  from experiments.common import loop, metrics, preemption
  state = {"x": 0}
  acc = metrics.SumAccumulator()
  def train_step(step):
    state["x"] += 1
    return {"loss": 1.0, "nonfinite_steps": 0.0}
  with preemption.PreemptionGuard() as guard:
    loop.run_steps(start_step=0, total_steps=10, train_step=train_step, acc=acc, guard=guard,
                   log_every=5, write_metrics=lambda s: acc.pop(), eval_every=0, evaluate=None,
                   checkpoint_every=10, save=lambda s, force: False, check=lambda s, sums: None,
                   on_preempt=lambda s: None, checkpoint_dir="/tmp/ckpt")
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import jax
import ml_collections
import numpy as np

from experiments.common import config_utils
from experiments.common import parallel
from experiments.common import preemption


class Preempted(Exception):
  """The run stopped early on a signal after saving a checkpoint; rerunning the command resumes."""

  def __init__(self, step: int, signal_name: str, checkpoint_dir: str):
    self.step, self.signal_name, self.checkpoint_dir = step, signal_name, checkpoint_dir
    self.exit_code = preemption.EXIT_CODES.get(signal_name, 143)
    super().__init__(f"preempted by {signal_name} after step {step}: checkpoint {step} saved in "
                     f"{checkpoint_dir}. Rerun the same command to resume from it.")


class NonFiniteError(RuntimeError):
  """A training step produced a NaN/Inf loss or gradient (config.nonfinite = "stop")."""


def check_finite(step: int, sums: Dict[str, Any], *, nonfinite: str, ckpt: Any,
                 order: Sequence[str], describe_other: Optional[Callable[[Dict[str, float]], str]] = None
                 ) -> None:
  """Raises NonFiniteError when the step's `nonfinite_steps` flag is set and policy is "stop".

  Names the first non-finite metric of `order` (else `describe_other(host_sums)`, else "the update")
  and the last good checkpoint of `ckpt` (a CheckpointManager).
  """
  if nonfinite != "stop":
    return
  flag = float(np.asarray(parallel.first_local(sums["nonfinite_steps"])).reshape(-1)[0])
  if flag == 0.0:
    return
  host = {k: float(np.asarray(parallel.first_local(v)).reshape(-1)[0]) for k, v in sums.items()}
  names = [k for k in order if not math.isfinite(host.get(k, 0.0))]
  if names:
    what = f"{names[0]} = {host[names[0]]}"
  elif describe_other is not None:
    what = describe_other(host)
  else:
    what = "the updated parameters or optimizer state (the update overflowed)"
  ckpt.wait_until_finished()       # an earlier (good) save still in flight completes first
  steps = ckpt.all_steps()
  last = (f"the last good checkpoint is step {steps[-1]} in {ckpt.directory}" if steps
          else f"no checkpoint was saved yet in {ckpt.directory}")
  raise NonFiniteError(
      f"step {step}: non-finite training metric: {what}. Stopped without saving; {last}. Fix: lower "
      "the learning rate or check the data, or set --config.nonfinite=skip to skip such steps "
      "(--config.nonfinite=continue keeps going, as the reference does).")


def check_devices(config: ml_collections.ConfigDict, batch_field: str = "global_batch_size"
                  ) -> Tuple[int, int]:
  """(local device count, per-device batch); clear errors for a mismatching machine or batch.

  Uses config.num_devices (> 0: the device count the config was written for) and
  config[batch_field] (the global batch, divisible by the device count).
  """
  n_global, n_local = jax.device_count(), jax.local_device_count()
  batch = int(config[batch_field])
  if config.num_devices > 0 and config.num_devices != n_global:
    raise config_utils.ConfigError(
        "num_devices", config.num_devices,
        f"this config is written for {config.num_devices} JAX devices but this run has {n_global} "
        f"({jax.process_count()} process(es) x {n_local} {jax.devices()[0].platform} device(s))",
        f"run it on a matching slice, or override with --config.num_devices={n_global} (check "
        f"{batch_field}={batch} too), or compile it here with --dry_run")
  if batch % n_global:
    raise config_utils.ConfigError(
        batch_field, batch, f"not divisible by the {n_global} devices",
        f"use a multiple of {n_global}, e.g. {max(n_global, batch // n_global * n_global)}")
  return n_local, batch // n_global


def flat_hparams(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """The config as a flat {"a.b": scalar} dict for the hparams writer."""
  out = {}

  def walk(prefix, node):
    for k, v in node.items():
      if isinstance(v, (dict, ml_collections.ConfigDict)):
        walk(f"{prefix}{k}.", v)
      else:
        out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
  walk("", config.to_dict())
  return out


def run_steps(*, start_step: int, total_steps: int, train_step: Callable[[int], Dict[str, Any]],
              acc: Any, guard: preemption.PreemptionGuard, log_every: int,
              write_metrics: Callable[[int], None], eval_every: int,
              evaluate: Optional[Callable[[int], Any]], checkpoint_every: int,
              save: Callable[[int, bool], Any], check: Callable[[int, Dict[str, Any]], None],
              on_preempt: Callable[[int], None], checkpoint_dir: str,
              hooks: Iterable[Callable[[int], None]] = ()) -> None:
  """Runs steps start_step + 1 .. total_steps; see the module doc.

  Args:
    train_step: runs optimizer step `step` (updating the caller's state) and returns its metric
      sums (device values, with a `nonfinite_steps` flag); added to `acc` (a SumAccumulator).
    write_metrics: called every `log_every` steps and at the last step (pops `acc`).
    evaluate: called every `eval_every` steps (not at the last step; the caller's final evaluation
      handles it); eval_every <= 0 or None disables it.
    save: `save(step, force)`, every `checkpoint_every` steps and forced at the last step.
    check: `check(step, sums)` raises for a non-finite step (e.g. `check_finite` bound).
    on_preempt: called after the forced save on preemption (flush writers, close the manager),
      before `Preempted` is raised.
  """
  hooks = list(hooks)
  pending = None                        # (step, metric sums): checked one step late (no sync stall)
  for step in range(start_step + 1, total_steps + 1):
    sums = train_step(step)
    if pending is not None:
      check(*pending)
    pending = (step, sums)
    acc.add(sums)
    for hook in hooks:
      hook(step)
    if step % log_every == 0 or step == total_steps:
      check(*pending)
      write_metrics(step)
    if evaluate is not None and eval_every > 0 and step % eval_every == 0 and step != total_steps:
      check(*pending)
      evaluate(step)
    if step % checkpoint_every == 0 or step == total_steps:
      check(*pending)       # never save a non-finite state
      save(step, step == total_steps)
    if step < total_steps and guard.should_stop(step):
      check(*pending)
      save(step, True)
      on_preempt(step)
      raise Preempted(step, guard.signal_name, checkpoint_dir)
