r"""The one trainer: runs any experiment (experiments/common/experiment.py) from start to final table.

  train_and_evaluate(experiment, config, workdir)   train, evaluate, print the final table
  evaluate(experiment, config, workdir)             --mode=eval: evaluate a model, no training
  build(experiment, config)                         (layout, Build) for tools (bench, sample, faults)
  init_state(b, config) / abstract_state(b, config) the fresh state, or its shapes (jax.eval_shape)
  restore_params(experiment, config, workdir)       (step, params) of a workdir's newest checkpoint

What it owns, in the order of a run:

1. Checks: the config's field names against the experiment's base config (a misspelled field is one
   line naming the closest valid one), the run section's values, the experiment's own checks, the
   batch layout (experiments/common/layout.py), and the workdir (writable, locked, its config
   fingerprint; a run that fails before it starts leaves no empty workdir behind:
   experiments/common/workdir_claim.py).
2. The start: the newest checkpoint in `<workdir>/checkpoints` (resume: state, per-device state and
   the open metric window, so a resumed run logs what an unbroken one would), else
   `config.init_from` (the weights of a podlab checkpoint or of a file of another format, read by
   `Experiment.load_init`; a fresh optimizer and step 0: fine-tuning), else `Build.init(rng)`
   (rng = key(config.seed)). Before the build, `Experiment.prepare` readies the data.
3. The loop: one step per update on every device (experiments/common/device_step.py
   `parallel_train_step`: `parallel.compile_step` of the experiment's step with its rng (`step_rng`:
   seed, step, device index) and the non-finite guard (`guarded_step`), the state laid out by the
   run's rules (`layout.rules`: replicated, or split in blocks), donated; with the
   Build's XLA `compiler_options`, a CPU target's, the step is lowered once at start and compiled
   in a background thread while the checkpoint manager, the writers and the input pipeline
   start); metric sums stay on the devices and are read once per
   log interval;
   the non-finite guard (config.nonfinite: "stop" ends the run naming the first non-finite metric
   and the last good checkpoint; "skip" drops the update; "continue" as the references do) is checked
   one step late, so the host never waits on the device, and always before a log, an evaluation or
   a save (a non-finite state is never saved); checkpoints every `checkpoint_every_steps` and at the
   end (async, kept `keep_checkpoints`); evaluations on the evaluators' schedules; preemption
   (SIGTERM/SIGINT, agreed across hosts: the step is saved and `errors.Preempted` raised; rerunning
   resumes); profiling (`profile_steps`, CLU's periodic_actions.Profile, into `<workdir>/profile`).
4. Output: TensorBoard scalars (CLU writers, process 0), hparams and the parameter table; one
   progress line per log interval (experiments/common/console.py); `evals.json` after every
   evaluation (experiments/common/evaluations.py); the final evaluation's table printed once
   (process 0) and `final_eval.json`.

Checkpoint layout: replicated {"state": the experiment's state, "window": the open metric window}
and per-device the experiment's device state (experiments/common/checkpointing.py).

Synopsis: see experiments/common/experiment.py (a complete experiment trained by this module).
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.common import checkpointing
from experiments.common import config_utils
from experiments.common import console
from experiments.common import cpu_features
from experiments.common import device_step
from experiments.common import errors
from experiments.common import evaluations
from experiments.common import experiment as experiment_lib
from experiments.common import host_malloc
from experiments.common import layout as layout_lib
from experiments.common import lazy_import
from experiments.common import metrics as metrics_lib
from experiments.common import mfu
from experiments.common import parallel
from experiments.common import preemption
from experiments.common import workdir as workdir_lib
from experiments.common import workdir_claim

# CLU (and TensorFlow under it) load when a run starts, not with the step (lazy_import).
periodic_actions = lazy_import.module("clu.periodic_actions")

Experiment = experiment_lib.Experiment
Build = experiment_lib.Build
WINDOW = "window"
STATE = "state"


# --------------------------------------------------------------------------------------------------
# Checks and building.

def check_config(experiment: Experiment, config: ml_collections.ConfigDict) -> None:
  """Field names against the experiment's base config, the run section, the experiment's checks."""
  reference = experiment.base_config()
  config_utils.validate_config(config, reference)
  config_utils.validate_run_config(config)
  experiment.validate(config)


def run_layout(experiment: Experiment, config: ml_collections.ConfigDict,
               **kwargs) -> layout_lib.BatchLayout:
  """The run's layout (`layout_lib.batch_layout(config, **kwargs)`) with its state rules: config.
  sharding and config.model_parallel (> 1: the experiment's `model_axis_spec`; an experiment
  without one is a ConfigError naming the field)."""
  m = int(config.get("model_parallel", 1))
  spec = experiment.model_axis_spec(config) if m > 1 else None
  if m > 1 and spec is None:
    raise errors.ConfigError("model_parallel", m, f"the {experiment.name} experiment names no "
                             "split of its weights over a model axis", "use 1")
  return layout_lib.batch_layout(config, model_spec=spec, **kwargs)


def build(experiment: Experiment, config: ml_collections.ConfigDict, *,
          layout: Optional[layout_lib.BatchLayout] = None
          ) -> Tuple[layout_lib.BatchLayout, Build]:
  """Checks `config` and builds the experiment on this run's devices (or `layout`); reads no data
  (a real run calls `experiment.prepare(config)` first)."""
  check_config(experiment, config)
  layout = layout or run_layout(experiment, config)
  return layout, experiment.build(config, layout)


def init_rng(config: ml_collections.ConfigDict) -> jax.Array:
  """The key `Build.init` gets: jax.random.key(config.seed)."""
  return jax.random.key(int(config.seed))


def init_state(b: Build, config: ml_collections.ConfigDict) -> Tuple[Any, Any]:
  """(state, device_state) of a fresh run, with real values."""
  return b.init(init_rng(config))


def abstract_state(b: Build, config: ml_collections.ConfigDict) -> Tuple[Any, Any]:
  """(state, device_state) as jax.ShapeDtypeStructs: `jax.eval_shape` of the experiment's init
  (restore templates, dry runs, TPU compiles, benchmarks' compiles)."""
  return jax.eval_shape(b.init, init_rng(config))


def _per_device_specs(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)
                      if not isinstance(x, jax.ShapeDtypeStruct) else x, tree)


def _checkpoint_items(state: Any, acc: metrics_lib.SumAccumulator, keys: Sequence[str]):
  return {STATE: state, WINDOW: acc.state(keys)}


# --------------------------------------------------------------------------------------------------
# The start: resume, init_from, or random init.

def _state_template(state: Any, rules: parallel.Rules) -> Any:
  """The state's restore template: where `rules` split it, ShapeDtypeStructs with their shardings,
  so each process reads only its blocks (whichever layout saved the checkpoint); else the state."""
  if not rules.split:
    return state
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                      state, rules.shardings(state))


def _restore_own(ckpt: checkpointing.CheckpointManager, abstract: Tuple[Any, Any],
                 keys: Sequence[str], fallback: bool, rules: parallel.Rules):
  state, device_state = abstract
  template = {STATE: _state_template(state, rules),
              WINDOW: metrics_lib.SumAccumulator().state(keys)}
  return ckpt.restore_latest(replicated_like=template,
                             per_device_like=device_state if device_state is not None else {},
                             fallback=fallback)


def load_init(experiment: Experiment, b: Build, config: ml_collections.ConfigDict,
              path: str, *, layout: Optional[layout_lib.BatchLayout] = None) -> Any:
  """The model weights at `config.init_from`: a podlab checkpoint (a workdir, its checkpoints/
  folder or one step's folder) through the experiment's own state template, else the experiment's
  reader of another format. `layout`: the run's (default: this run's devices)."""
  found = checkpointing.find_checkpoint(path)
  if found is None:
    return experiment.load_init(path, b, config)
  directory, step = found
  manager = checkpointing.CheckpointManager(directory, layout=layout, save_interval_steps=1)
  try:
    restored = manager.restore(step, replicated_like={STATE: abstract_state(b, config)[0]},
                               per_device_like={}, partial=True)
  finally:
    manager.close()
  logging.info("init_from: params of %s step %d", directory, restored[0])
  return b.weights.get(restored[1][STATE])


# --------------------------------------------------------------------------------------------------
# The run.

def _nonfinite_error(step: int, host: Dict[str, float], b: Build,
                     ckpt: checkpointing.CheckpointManager) -> errors.NonFiniteError:
  names = [k for k in b.display.nonfinite_order if not math.isfinite(host.get(k, 0.0))]
  if names:
    what = f"{names[0]} = {host[names[0]]}"
  elif host.get("nonfinite_state", 0.0):
    what = ("the updated state (parameters, optimizer state, ...) while loss and gradients were "
            "finite: the update overflowed")
  else:
    what = b.display.nonfinite_other
  ckpt.wait_until_finished()       # an earlier (good) save still in flight completes first
  steps = ckpt.all_steps()
  last = (f"the last good checkpoint is step {steps[-1]} in {ckpt.directory}" if steps
          else f"no checkpoint was saved yet in {ckpt.directory}")
  return errors.NonFiniteError(
      f"step {step}: non-finite training metric: {what}. Stopped without saving; {last}. Fix: lower "
      "the learning rate or check the data, or set --config.nonfinite=skip to skip such steps "
      "(--config.nonfinite=continue keeps going, as the reference does).")


def _host_first(x: Any) -> float:
  return float(np.asarray(parallel.first_local(x)).reshape(-1)[0])


def train_and_evaluate(experiment: Experiment, config: ml_collections.ConfigDict,
                       workdir: str) -> Dict[str, Any]:
  """Trains `experiment` as configured and returns its final results (see the module doc).

  Raises (experiments/common/errors.py): ConfigError, WorkdirError, CheckpointError, FormatError,
  input_pipeline DataError (bad input, named with the fix, before any compute); NonFiniteError
  (config.nonfinite = "stop"); Preempted (SIGTERM/SIGINT: the step was saved; the same call resumes).
  """
  check_config(experiment, config)
  layout = run_layout(experiment, config)
  existed = workdir_lib.exists(workdir)
  wd = workdir_lib.Workdir(workdir)
  with workdir_claim.cleanup_on_bad_input(workdir, existed):
    workdir_lib.check_writable(workdir)
    with workdir_claim.claim(wd, config) as lock, preemption.PreemptionGuard() as guard:
      return _Run(experiment, config, layout, wd, guard, lock=lock).train()


def evaluate(experiment: Experiment, config: ml_collections.ConfigDict,
             workdir: str) -> Dict[str, Any]:
  """`--mode=eval`: evaluates the workdir's newest checkpoint, else `config.init_from`, with every
  evaluator (final, full); writes the table (printed), `eval_results.json` and TensorBoard scalars."""
  check_config(experiment, config)
  layout = run_layout(experiment, config)
  existed = workdir_lib.exists(workdir)
  with workdir_claim.cleanup_on_bad_input(workdir, existed):
    workdir_lib.check_writable(workdir)
    with preemption.PreemptionGuard() as guard:
      return _Run(experiment, config, layout, workdir_lib.Workdir(workdir), guard).evaluate()


def restore_state(experiment: Experiment, config: ml_collections.ConfigDict, workdir: str, *,
                  per_device: bool = True, laid_out: bool = False) -> Tuple[int, Any, Any, Build]:
  """(step, state, per-device state, build) of the newest checkpoint in `workdir`, restored with the
  run's templates (the per-device state needs the saving run's device count; `per_device=False`
  skips it: None); for samplers and exports (e.g. TRM's sharded puzzle table). The arrays come
  whole, whatever layout the run had, or with `laid_out` as the config's run lays them out
  (config.sharding, config.model_parallel)."""
  check_config(experiment, config)
  if not laid_out:
    config = config.copy_and_resolve_references()
    config.sharding, config.model_parallel = "replicated", 1
  layout, b = build(experiment, config)
  state_like, device_like = abstract_state(b, config)
  found = checkpointing.find_checkpoint(workdir)
  if found is None:
    raise errors.CheckpointError(f"no checkpoint in {workdir}. Fix: train first, or pass the "
                                 "workdir of a run that saved one")
  directory, step = found
  with_device = per_device and device_like is not None
  manager = checkpointing.CheckpointManager(directory, layout=layout, save_interval_steps=1)
  try:
    step, saved, device_state = manager.restore(
        step, replicated_like={STATE: _state_template(state_like, layout.rules)}, partial=True,
        per_device_like=device_like if with_device else {})
  finally:
    manager.close()
  return step, saved[STATE], device_state if with_device else None, b


def restore_params(experiment: Experiment, config: ml_collections.ConfigDict,
                   workdir: str, laid_out: bool = False) -> Tuple[int, Any]:
  """(step, params) of the newest checkpoint in `workdir` (samplers, exports); `laid_out` as for
  `restore_state`."""
  step, state, _, b = restore_state(experiment, config, workdir, per_device=False,
                                    laid_out=laid_out)
  return step, b.weights.get(state)


def compute_dtype(model_config: Any) -> str:
  """The model config's compute dtype name ("bfloat16", "float32"; "" when it has none): its `dtype`
  (a field or property of every model config: TRM, GPT, Dream)."""
  dtype = getattr(model_config, "dtype", None)
  try:
    return "" if dtype is None else jnp.dtype(dtype).name
  except TypeError:
    return str(dtype)


class _Run:
  """One training or evaluation run (the state of `train_and_evaluate` / `evaluate`)."""

  def __init__(self, experiment: Experiment, config: ml_collections.ConfigDict,
               layout: layout_lib.BatchLayout, wd: workdir_lib.Workdir,
               guard: preemption.PreemptionGuard, lock: Optional[Any] = None):
    self.experiment, self.config, self.layout, self.wd, self.guard = (experiment, config, layout,
                                                                      wd, guard)
    self.lock = lock
    if layout.cpu_tuning:
      host_malloc.keep_heap()     # CPU only: no page faults on XLA's per-step scratch
    experiment.prepare(config)
    self.b = experiment.build(config, layout)
    self.abstract = abstract_state(self.b, config)
    if layout.platform == "cpu":  # a bfloat16 config on a CPU without native bfloat16: say so once
      notice = cpu_features.bf16_notice(compute_dtype(self.b.model_config))
      if notice:
        logging.warning("%s", notice)
    self.rules = layout.rules
    self.p_step = device_step.parallel_train_step(
        self.b.train_step, config.nonfinite, seed=config.seed, rules=self.rules,
        rng_step_offset=experiment.rng_step_offset, compiler_options=self.b.compiler_options)
    self.device_index = parallel.shard(parallel.device_indices(self.rules), self.rules)
    self.ckpt = checkpointing.CheckpointManager(
        wd.checkpoints, layout=layout, max_to_keep=config.keep_checkpoints,
        save_interval_steps=config.checkpoint_every_steps, enable_async=config.async_checkpoints)
    self.acc = metrics_lib.SumAccumulator()
    self.metric_keys = self._metric_keys()

  def _metric_keys(self) -> Tuple[str, ...]:
    """The names of the step's metric sums (they fix the checkpoint's window layout)."""
    b = self.b
    batch = b.example_batch
    if batch is None:
      batch = _per_device_specs(next(iter(b.batches(0))))
    state, device_state = self.abstract
    args = (state, device_state, batch,
            jax.ShapeDtypeStruct((self.layout.devices_per_host,), jnp.int32))
    precompile = getattr(self.p_step, "precompile", None)
    if precompile is not None:   # one trace; XLA compiles the step while the run starts up
      return tuple(sorted(precompile(*args).out_info[2]))
    return tuple(sorted(jax.eval_shape(self.p_step, *args)[2]))

  # ----------------------------------------------------------------------------------------------
  def _start(self) -> Tuple[int, Any, Any, str]:
    """(start step, state, device state, where from)."""
    b, config = self.b, self.config
    restored = _restore_own(self.ckpt, self.abstract, self.metric_keys, config.restore_fallback,
                            self.rules)
    if restored is not None:
      step, saved, device_state = restored
      self.acc.restore(saved[WINDOW], self.layout.devices_per_host)
      console.say(f"Resumed from {self.ckpt.directory} at step {step}")
      return step, saved[STATE], device_state if self.abstract[1] is not None else None, "resume"
    if config.init_from:
      params = load_init(self.experiment, b, config, config.init_from, layout=self.layout)
      state, device_state = b.weights.set(*init_state(b, config), params)
      console.say(f"init_from {config.init_from}: model weights loaded (step 0, fresh optimizer "
                  "state)")
      return 0, state, device_state, "init_from"
    return (0, *init_state(b, config), "init")

  def _writer(self):
    return metrics_lib.create_writer(self.wd.root)

  def _log_parameters(self, writer, start_step: int, state: Any) -> None:
    d = self.b.display
    parameters = d.parameters(state) if callable(d.parameters) else d.parameters
    if parameters:
      for line in parameters.splitlines():
        logging.info("%s", line)
    if d.summary:
      console.say(f"{self.experiment.name}: {d.summary}")
    if start_step == 0:
      writer.write_hparams(config_utils.flat_hparams(self.config))
      if parameters:
        writer.write_texts(0, {"parameters": f"```\n{parameters}\n```"})

  def _final_table(self, final: Mapping[str, Any], title: str) -> None:
    if not final:
      return
    table = (self.b.display.final_table(final, self.history)
             if self.b.display.final_table is not None
             else evaluations.default_table(final))
    if jax.process_index() == 0:
      self.progress.close()
      print(f"\n{title}\n{table}\n", flush=True)

  # ----------------------------------------------------------------------------------------------
  def train(self) -> Dict[str, Any]:
    b, config, layout = self.b, self.config, self.layout
    start_step, state, device_state, source = self._start()
    total = int(b.total_steps)
    self.history = evaluations.load_history(self.wd, start_step)
    writer = self._writer()
    self._log_parameters(writer, start_step, state)
    self.progress = console.Progress(
        total_steps=total, start_step=start_step, items_per_step=b.display.items_per_step,
        item_name=b.display.item_name, keys=b.display.progress, enabled=jax.process_index() == 0)
    evals = evaluations.Evaluations(b, self.wd, writer, self.progress, self.history)
    if b.on_start is not None:
      b.on_start(self.wd, start_step)
    state = parallel.put_state(state, self.rules)
    device_state = (parallel.shard(device_state, self.rules) if device_state is not None
                    else None)
    batches = b.batches(start_step)
    peak = mfu.peak_flops_per_device(config.peak_flops) * layout.devices if b.flops_per_step else 0
    profile = (periodic_actions.Profile(num_profile_steps=config.profile_steps,
                                        logdir=self.wd.profile)
               if config.profile_steps > 0 and jax.process_index() == 0 else None)

    def save(step: int, force: bool) -> bool:
      if self.lock is not None:
        self.lock.check()            # another run took the workdir: never write into its checkpoints
      return self.ckpt.save(step, replicated=_checkpoint_items(state, self.acc, self.metric_keys),
                            per_device=device_state if device_state is not None else {},
                            force=force)

    def check(pending) -> None:
      if pending is None or config.nonfinite != "stop":
        return
      step, sums = pending
      if _host_first(sums["nonfinite_steps"]) == 0.0:
        return
      host = {k: _host_first(v) for k, v in sums.items()}
      raise _nonfinite_error(step, host, b, self.ckpt)

    if start_step == 0:
      for ev in b.evaluators:
        if ev.at_start:
          evals.run(ev, state, device_state, 0, final=False)
    split = (f"; state split over {layout.chips} devices (fsdp"
             + (f" x model_parallel={layout.model_parallel})" if layout.model_parallel > 1 else ")")
             if self.rules.split else "")
    console.say(f"Training from step {start_step} to {total} ({layout.describe()}{split})")
    pending = None              # (step, metric sums): checked one step late (no host sync)
    window_t, window_paused = time.perf_counter(), 0.0
    step_ms = []
    for step in range(start_step + 1, total + 1):
      batch = parallel.shard(next(batches), self.rules)
      state, device_state, sums = self.p_step(state, device_state, batch, self.device_index)
      check(pending)
      pending = (step, sums)
      self.acc.add(sums)
      if profile is not None:
        profile(step)
      if step % config.log_every_steps == 0 or step == total:
        check(pending)
        n = self.acc.num_steps
        host = self.acc.pop()
        now = time.perf_counter()
        seconds = max(now - window_t - window_paused, 1e-9)
        ms = 1000.0 * seconds / max(n, 1)
        step_ms.append(ms)
        scalars = dict(b.display.train_scalars(host, n, step))
        scalars["train/nonfinite_steps"] = host.get("nonfinite_steps", 0.0)
        scalars["perf/ms_per_step"] = ms
        scalars["steps_per_sec"] = 1000.0 / ms
        if peak and b.flops_per_step:
          scalars["perf/mfu"] = b.flops_per_step / (ms / 1000.0) / peak
        writer.write_scalars(step, scalars)
        if jax.process_index() == 0:
          self.progress.update(step, scalars, seconds=seconds)
        window_t, window_paused = time.perf_counter(), 0.0
      paused_from = time.perf_counter()
      for ev in b.evaluators:
        if ev.every > 0 and step % ev.every == 0 and step != total:
          check(pending)
          evals.run(ev, state, device_state, step, final=False)
      if step % config.checkpoint_every_steps == 0 or step == total:
        check(pending)         # never save a non-finite state
        save(step, step == total)
      if step < total and self.guard.should_stop(step):
        check(pending)
        save(step, True)
        writer.flush()
        self.ckpt.wait_until_finished()
        self.ckpt.close()
        self.progress.close()
        raise errors.Preempted(step, self.guard.signal_name, self.ckpt.directory)
      window_paused += time.perf_counter() - paused_from
    check(pending)
    if hasattr(batches, "close"):
      batches.close()          # the input pipeline's threads and buffers go now, not at exit

    final: Dict[str, Dict[str, float]] = {}
    if config.final_eval and total > 0:
      for ev in b.evaluators:
        if ev.at_end:
          final[ev.name] = {k: float(v) for k, v in
                            evals.run(ev, state, device_state, total, final=True).items()}
    results = (b.display.results(final, self.history) if b.display.results is not None
               else dict(final))
    self._final_table(final, f"Final evaluation at step {total}:")
    # final_eval.json holds results only (a resumed run writes the same file as an unbroken one);
    # the step time goes to TensorBoard (perf/) and into the returned dict.
    workdir_lib.write_json(self.wd.final_eval, {"step": total, **_jsonable(results)})
    if step_ms:
      results["median_ms_per_step"] = float(np.median(step_ms))
    writer.flush()
    self.ckpt.wait_until_finished()
    self.ckpt.close()
    self.progress.close()
    return results

  # ----------------------------------------------------------------------------------------------
  def evaluate(self) -> Dict[str, Any]:
    b, config = self.b, self.config
    start_step, state, device_state, source = self._start()
    self.ckpt.close()
    if source == "init":
      raise errors.ConfigError(
          "init_from", config.init_from, f"--mode=eval found no checkpoint in {self.wd.checkpoints}",
          "pass --config.init_from=<a podlab workdir or checkpoint, or a file of the experiment's "
          "reference format>, or the --workdir of a trained run")
    self.history = {}
    writer = self._writer()
    self.progress = console.Progress(total_steps=start_step, start_step=start_step,
                                     enabled=jax.process_index() == 0)
    evals = evaluations.Evaluations(b, self.wd, writer, self.progress, {})
    state = parallel.put_state(state, self.rules)
    device_state = (parallel.shard(device_state, self.rules) if device_state is not None
                    else None)
    final = {ev.name: {k: float(v) for k, v in
                       evals.run(ev, state, device_state, start_step, final=True).items()}
             for ev in b.evaluators}
    self.history = evals.history
    origin = config.init_from if source == "init_from" else self.wd.checkpoints
    self._final_table(final, f"Evaluation of {origin} (step {start_step}):")
    workdir_lib.write_json(self.wd.eval_results,
                           {"step": start_step, "source": origin, **_jsonable(final)})
    writer.flush()
    return final


def _jsonable(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {str(k): _jsonable(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_jsonable(v) for v in tree]
  if isinstance(tree, (np.floating, np.integer)):
    return tree.item()
  return tree
