"""TRM training and evaluation: `train_and_evaluate(config, workdir)`.

The loop: a `pmap` step over this host's devices with `lax.pmean` of gradients across every device of
every host; the ACT carry stays on the devices across optimizer steps (one optimizer step = one ACT step
for every slot); per-device RNG is derived from (seed, step, global device index), all passed in; EMA of
the Adam parameters every step; periodic evaluation with the EMA weights; CLU writers (TensorBoard on
process 0), `ReportProgress` (steps/s, ETA), hparams; orbax checkpoints (periodic, keep N, async, final
save forced) resumed automatically from the workdir; a final evaluation table printed and written to
`<workdir>/final_eval.json`.

Synopsis (tests call it with a tiny config):

  from experiments.trm import train
  from experiments.trm.configs import cpu_demo
  config = cpu_demo.get_config("smoke")
  results = train.train_and_evaluate(config, "/tmp/trm_demo")     # {"test": {"exact_accuracy": ...}}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any, Dict, Iterator, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import optax
import tensorflow as tf
from absl import logging
from clu import parameter_overview
from clu import periodic_actions

from experiments.common import checkpointing
from experiments.common import config_utils
from experiments.common import loop
from experiments.common import metrics as metrics_lib
from experiments.common import optim
from experiments.common import parallel
from experiments.common import preemption
from experiments.common import sharded_table
from experiments.trm import arc_eval
from experiments.trm import losses
from experiments.trm.configs import base as base_config
from input_pipeline import datasets
from input_pipeline import pipeline
from input_pipeline.datasets import arc_agi
from modules import trm

RATIO_METRICS = ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps")
LOSS_METRICS = ("lm_loss", "q_halt_loss")
EVAL_COLUMNS = ("exact_accuracy", "accuracy", "q_halt_accuracy", "steps", "lm_loss", "q_halt_loss",
                "count")


class TrainState(NamedTuple):
  """Everything that is the same on every device; replicated on the devices, saved in checkpoints."""
  step: jax.Array                 # [] int32, optimizer steps done
  params: Any                     # Adam parameters (float32)
  opt_state: Any                  # AdamATan2 state
  ema: Any                        # EMA of params (== params when config.ema is off)
  puzzle_table: Optional[jax.Array]  # [N, E] float32, trained by sparse SignSGD (None if E = 0)
  sign_state: Any                 # SignSGD state (step count), None if E = 0
  model_state: Any                # {"trm": {"H_init", "L_init"}} fixed vectors


# --------------------------------------------------------------------------------------------------
# Configuration.

def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks field names against the base config and the values against each other.

  Raises config_utils.ConfigError with the field, the value and the fix. Dataset-dependent checks
  happen in `model_config` and `_check_devices`.
  """
  reference = base_config.get_config()
  reference.dataset.builder_kwargs = ml_collections.ConfigDict()   # builder-specific: free-form
  config_utils.validate_config(config, reference)
  E = config_utils.ConfigError
  if config.global_batch_size <= 0:
    raise E("global_batch_size", config.global_batch_size, "must be positive", "use e.g. 768")
  for field in ("log_every_steps", "checkpoint_every_steps"):
    if config[field] <= 0:
      raise E(field, config[field], "must be positive", "use e.g. 100")
  if config.eval_every_steps <= 0 and config.eval_interval_epochs <= 0:
    raise E("eval_every_steps", config.eval_every_steps,
            "no evaluation interval: eval_interval_epochs is also <= 0",
            "set --config.eval_every_steps=N or --config.eval_interval_epochs=N")
  if not 0.0 <= config.ema_rate < 1.0:
    raise E("ema_rate", config.ema_rate, "must be in [0, 1)", "use 0.999 (the reference)")
  if config.nonfinite not in ("stop", "skip", "continue"):
    raise E("nonfinite", config.nonfinite, "must be 'stop', 'skip' or 'continue'",
            "use 'stop' (default: end the run at the first NaN/Inf step, keeping the last checkpoint)")
  if config.eval_subset < 0:
    raise E("eval_subset", config.eval_subset, "must be >= 0", "use 0 (full test set) or a size")


def model_config(config: ml_collections.ConfigDict, metadata: Dict[str, Any]) -> trm.TRMConfig:
  """TRMConfig from the config's model fields and the dataset's metadata."""
  fields = dict(config.model.to_dict())
  try:
    return trm.TRMConfig(seq_len=int(metadata["seq_len"]), vocab_size=int(metadata["vocab_size"]),
                         num_puzzle_identifiers=int(metadata["num_puzzle_identifiers"]), **fields)
  except ValueError as e:   # TRMConfig names the field, the value and the fix
    raise config_utils.ConfigError("model", "", str(e), "change the named model field") from None


def _check_devices(config: ml_collections.ConfigDict) -> Tuple[int, int]:
  """(local device count, per-device batch): `loop.check_devices` (clear errors on a mismatch)."""
  return loop.check_devices(config)


def epoch_examples(metadata: Dict[str, Any], num_train_rows: int) -> int:
  """Examples per epoch (reference 4.5: total_groups * mean_puzzle_examples). For a dataset of
  materialised augmentations (ARC: up to 1001 puzzles per task) that is one augmentation's examples
  per task, not every stored row; otherwise every training row."""
  if "train_groups" in metadata and "mean_puzzle_examples" in metadata:
    return max(1, int(round(metadata["train_groups"] * metadata["mean_puzzle_examples"])))
  return num_train_rows


def num_train_steps(config: ml_collections.ConfigDict, num_train_examples: int) -> int:
  """Reference 4.5: int(epochs * total_groups * mean_puzzle_examples / global_batch_size)."""
  if config.total_steps > 0:
    return int(config.total_steps)
  return int(config.epochs * num_train_examples / config.global_batch_size)


def eval_every_steps(config: ml_collections.ConfigDict, num_train_examples: int) -> int:
  if config.eval_every_steps > 0:
    return int(config.eval_every_steps)
  return max(1, int(config.eval_interval_epochs * num_train_examples / config.global_batch_size))


# --------------------------------------------------------------------------------------------------
# State, optimizers and the parallel steps.

def make_optimizers(config: ml_collections.ConfigDict, total_steps: int):
  """(AdamATan2 for the model, sparse SignSGD for the puzzle table), each with its warm-up + cosine."""
  schedule = functools.partial(optim.warmup_cosine_schedule, warmup_steps=config.lr_warmup_steps,
                               total_steps=total_steps, min_ratio=config.lr_min_ratio)
  adam = optim.adam_atan2(schedule(config.lr), b1=config.beta1, b2=config.beta2,
                          weight_decay=config.weight_decay)
  sign = optim.sparse_signsgd(schedule(config.puzzle_emb_lr), config.puzzle_emb_weight_decay)
  return adam, sign


class DeviceState(NamedTuple):
  """What differs per device; pmapped along the device axis, saved per device in checkpoints."""
  carry: trm.ACTCarry              # the ACT carry of this device's batch slots
  puzzle_shard: Optional[jax.Array]  # [R, E] this device's rows of the puzzle table when it is
                                     # sharded (config.shard_puzzle_table), else None


def init_state(model: trm.TRMModel, adam, sign, seed: int, shard_table: bool = False) -> TrainState:
  """The replicated state; with `shard_table` the puzzle table lives in DeviceState instead."""
  params, model_state = model.init(jax.random.key(seed))
  has_table = model.config.prefix_len > 0
  table = model.init_puzzle_table() if has_table and not shard_table else None
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=adam.init(params),
                    ema=optim.ema_init(params), puzzle_table=table,
                    sign_state=sign.init(table) if has_table else None, model_state=model_state)


def init_device_state(model: trm.TRMModel, per_device_batch: int, local_device_count: int,
                      num_devices: int, shard_table: bool = False) -> DeviceState:
  """Host numpy DeviceState stacked over this host's devices: fresh carries [n, ...] and, with
  `shard_table`, this host's zero shards [n, R, E] of the puzzle table (never the whole table)."""
  carry = jax.tree.map(lambda x: np.stack([np.asarray(x)] * local_device_count),
                       model.initial_carry(model.example_batch(per_device_batch)))
  shard = None
  if shard_table and model.config.prefix_len > 0:
    shard = sharded_table.init_host_shards(model.config.num_puzzle_identifiers,
                                           model.config.emb_ndim, num_devices, local_device_count)
  return DeviceState(carry=carry, puzzle_shard=shard)


def host_puzzle_table(state_table: Optional[Any], device_state: DeviceState,
                      num_rows: int) -> Optional[np.ndarray]:
  """The whole puzzle table [N, E] as host numpy, replicated or sharded (gathers across hosts)."""
  if device_state.puzzle_shard is not None:
    return sharded_table.gather_table(_local_rows(device_state.puzzle_shard), num_rows)
  return None if state_table is None else np.asarray(parallel.unreplicate(state_table))


def _local_rows(x: Any) -> np.ndarray:
  """This host's [n, ...] rows of a per-device (pmapped) array, in local device order."""
  if isinstance(x, jax.Array):
    shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.concatenate([np.asarray(s.data) for s in shards], axis=0)
  return np.asarray(x)


def make_train_step(model: trm.TRMModel, adam, sign, config: ml_collections.ConfigDict,
                    per_device_batch: int):
  """The per-device training step (pmapped by the caller).

  (state, device_state, batch, device_index) -> (state, device_state, metric sums psummed over all
  devices). `device_index`: this device's global index (parallel.device_indices()).
  """
  cfg = model.config

  def train_step(state: TrainState, device_state: DeviceState, batch, device_index):
    old_device_state = device_state
    carry, shard = device_state
    step = state.step + 1                                        # 1-based optimizer step
    rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), step), device_index)
    carry = trm.act_reset(carry, batch, *model.latents(state.model_state))
    data = carry.current_data
    if shard is not None and cfg.prefix_len:                     # [B, E] from the sharded table
      rows = sharded_table.lookup(shard, data["puzzle_identifiers"], device_index, parallel.AXIS)
    else:
      rows = model.puzzle_rows(state.puzzle_table, data)         # [B, E] or None

    def loss_fn(params, rows):
      z_H, z_L, logits, q_halt, q_cont = model.inner(params, state.model_state, carry.z_H, carry.z_L,
                                                     data["inputs"], rows)
      new_carry = trm.act_halt(cfg, carry._replace(z_H=z_H, z_L=z_L), q_halt, training=True, rng=rng)
      loss, sums = losses.act_loss_and_metrics(logits, data["labels"], q_halt, q_cont,
                                               new_carry.halted, new_carry.steps,
                                               loss_divisor=per_device_batch)
      return loss, (new_carry, sums)

    (_, (carry, sums)), (g_params, g_rows) = jax.value_and_grad(
        loss_fn, argnums=(0, 1), has_aux=True)(state.params, rows)
    g_params = jax.lax.pmean(g_params, parallel.AXIS)
    updates, opt_state = adam.update(g_params, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    table, sign_state = state.puzzle_table, state.sign_state
    rows_finite = jnp.array(True)
    if rows is not None:
      ids, grads = optim.all_gather_rows(data["puzzle_identifiers"], g_rows, parallel.AXIS)
      if shard is not None:     # each device updates the rows it owns; the others are dropped
        shard, sign_state = sign.update(
            shard, sharded_table.local_ids(ids, device_index, shard.shape[0]), grads, sign_state)
      else:
        table, sign_state = sign.update(table, ids, grads, sign_state)
      rows_finite = jnp.all(jnp.isfinite(grads))                 # gathered: same on every device
    ema = optim.ema_update(state.ema, params, config.ema_rate) if config.ema else params
    sums = jax.lax.psum(sums, parallel.AXIS)
    sums["grad_norm"] = optax.global_norm(g_params)
    # Identical on every device (psummed / pmeaned / gathered values), so every device decides alike.
    metrics_finite = (jnp.isfinite(sums["lm_loss"]) & jnp.isfinite(sums["q_halt_loss"])
                      & jnp.isfinite(sums["grad_norm"]) & rows_finite)
    # A finite loss and gradient can still overflow the update (e.g. a huge learning rate).
    state_finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(
        (params, opt_state, table))]))
    if shard is not None:       # per-device rows: agree across devices
      state_finite &= jax.lax.pmin(jnp.all(jnp.isfinite(shard)).astype(jnp.int32),
                                   parallel.AXIS) > 0
    finite = metrics_finite & state_finite
    sums["nonfinite_steps"] = 1.0 - finite.astype(jnp.float32)
    sums["nonfinite_state"] = 1.0 - state_finite.astype(jnp.float32)
    new_state = TrainState(step=step, params=params, opt_state=opt_state, ema=ema,
                           puzzle_table=table, sign_state=sign_state, model_state=state.model_state)
    new_device_state = DeviceState(carry=carry, puzzle_shard=shard)
    if config.nonfinite == "skip":
      # Drop the update: everything but the step counter (data and RNG are step-indexed) stays.
      keep = lambda new, old: jnp.where(finite, new, old)   # pylint: disable=unnecessary-lambda-assignment
      new_state = jax.tree.map(keep, new_state, state._replace(step=step))
      new_device_state = jax.tree.map(keep, new_device_state, old_device_state)
    return new_state, new_device_state, sums

  return train_step


def make_eval_step(model: trm.TRMModel, per_device_batch: int, sharded: bool = False,
                   predictions: bool = False):
  """Per-device evaluation of one padded batch: a fresh carry, exactly halt_max_steps ACT steps, metric
  sums of the LAST step over non-padding rows (psummed over all devices).

  (params, model_state, table, batch, device_index) -> sums; `table` is the replicated puzzle table,
  or with `sharded` this device's shard [R, E] (pmap it along the device axis). With `predictions`
  -> (sums, {"predictions": [B, S] int32 argmax tokens, "q_halt": [B] float32}) of the last step
  (what the ARC evaluator votes with).
  """
  cfg = model.config

  def eval_step(params, model_state, table, batch, device_index):
    mask = batch["mask"]
    data = {k: v for k, v in batch.items() if k != "mask"}
    carry = model.initial_carry(data)
    rows = None
    if sharded and cfg.prefix_len:      # the same rows at every ACT step: look them up once
      rows = sharded_table.lookup(table, data["puzzle_identifiers"], device_index, parallel.AXIS)

    def body(_, c):
      c, _ = model.act_step(params, model_state, table, c, data, training=False, puzzle_rows=rows)
      return c
    carry = jax.lax.fori_loop(0, cfg.halt_max_steps - 1, body, carry)
    carry, out = model.act_step(params, model_state, table, carry, data, training=False,
                                puzzle_rows=rows)
    _, sums = losses.act_loss_and_metrics(
        out["logits"], carry.current_data["labels"], out["q_halt_logits"], out["q_continue_logits"],
        carry.halted & mask, carry.steps, loss_divisor=per_device_batch, row_mask=mask)
    sums = jax.lax.psum(sums, parallel.AXIS)
    if predictions:
      return sums, {"predictions": jnp.argmax(out["logits"], axis=-1).astype(jnp.int32),
                    "q_halt": out["q_halt_logits"].astype(jnp.float32)}
    return sums

  return eval_step


def evaluate(p_eval_step, state: TrainState, eval_batches, use_ema: bool, *,
             table: Any = None, device_index: Any = None,
             on_predictions: Optional[Any] = None) -> Dict[str, float]:
  """Runs the padded evaluation batches; returns ratios (losses per evaluated example).

  `table`: the puzzle shards of a sharded table (DeviceState.puzzle_shard), else state.puzzle_table
  is used; `device_index`: parallel.shard(parallel.device_indices()) (default: computed here);
  `on_predictions(batch, predictions)`: called per batch with the host batch and this host's
  predictions ([n, B, ...] numpy) of a step made with `make_eval_step(..., predictions=True)`.
  """
  acc = metrics_lib.SumAccumulator()
  params = state.ema if use_ema else state.params
  table = state.puzzle_table if table is None else table
  if device_index is None:
    device_index = parallel.shard(parallel.device_indices())
  for batch in eval_batches:
    out = p_eval_step(params, state.model_state, table, parallel.shard(
        {k: v for k, v in batch.items() if k in ("inputs", "labels", "puzzle_identifiers", "mask")}),
                      device_index)
    if on_predictions is not None:
      out, preds = out
      on_predictions(batch, jax.tree.map(_local_rows, preds))
    acc.add(out)
  sums = acc.pop()
  count = sums.get("count", 0.0)
  return metrics_lib.ratios(sums, count_key="count", ratio_keys=RATIO_METRICS,
                            divisors={k: count for k in LOSS_METRICS})


def arc_results(meta: Any, host_parts: list, step: int, workdir: str, full: bool,
                final: bool) -> Dict[str, float]:
  """ARC pass@K of one evaluation: merges this host's votes, exchanges them through files in
  `<workdir>/arc_eval/step_<step>/` (every host writes votes_<i>.json; process 0 merges all once),
  writes submission.json there (and `<workdir>/submission.json` when `final`). Process 0 returns the
  metrics (pass@1..1000, counts); the other processes return {}. A subset evaluation scores only the
  tasks it reached."""
  out_dir = f"{workdir.rstrip('/')}/arc_eval/step_{step}"
  arc_eval.write_json(f"{out_dir}/votes_{jax.process_index()}.json", arc_eval.merge(host_parts))
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"podlab_arc_eval_{step}")
  if jax.process_index() != 0:
    return {}
  parts = [arc_eval.read_json(f"{out_dir}/votes_{i}.json") for i in range(jax.process_count())]
  merged = arc_eval.merge(parts)
  tasks = None if full else arc_eval.voted_tasks(merged)
  metrics, submission = arc_eval.finalize(meta, [merged], tasks=tasks)
  arc_eval.validate_submission(submission, meta)
  arc_eval.write_json(f"{out_dir}/submission.json", submission)
  if final:
    arc_eval.write_json(f"{workdir.rstrip('/')}/submission.json", submission)
  return {k: float(v) for k, v in metrics.items()}


# --------------------------------------------------------------------------------------------------
# The loop.

def _model_batch(batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  return {k: batch[k] for k in ("inputs", "labels", "puzzle_identifiers")}


def log_parameter_table(state: TrainState, model: Optional[trm.TRMModel] = None,
                        num_devices: int = 1) -> str:
  """The parameter overview; `model` and `num_devices` describe a sharded puzzle table."""
  table = parameter_overview.get_parameter_overview(parallel.unreplicate(state.params))
  n_adam = trm.adam_param_count(state.params)
  text = f"{table}\nAdam parameters: {n_adam:,}\n"
  if state.puzzle_table is not None:
    text += (f"Puzzle-embedding table (SignSGD, not counted above): "
             f"{tuple(state.puzzle_table.shape)} = {int(np.prod(state.puzzle_table.shape)):,}")
  elif model is not None and model.config.prefix_len > 0:
    rows, width = model.config.num_puzzle_identifiers, model.config.emb_ndim
    text += (f"Puzzle-embedding table (SignSGD, not counted above): {(rows, width)} = "
             f"{rows * width:,}, sharded: {sharded_table.rows_per_device(rows, num_devices):,} rows "
             f"on each of {num_devices} devices")
  else:
    text += "Puzzle-embedding table: none (puzzle_emb_ndim = 0)"
  for line in text.splitlines():
    logging.info("%s", line)
  return text


_flat_hparams = loop.flat_hparams
Preempted = loop.Preempted            # the shared loop's exceptions (main maps them to exit codes)
NonFiniteError = loop.NonFiniteError

# Order in which a non-finite step's metrics are named (the first non-finite one is reported).
_NONFINITE_ORDER = ("lm_loss", "q_halt_loss", "grad_norm")


def _describe_nonfinite(host: Dict[str, float]) -> str:
  if host.get("nonfinite_state", 0.0):
    return ("the updated parameters, optimizer state or puzzle table (loss and gradient were "
            "finite: the update overflowed)")
  return "the puzzle-embedding row gradients (SignSGD) are not finite"


def check_finite(step: int, sums: Dict[str, Any], *, config: ml_collections.ConfigDict,
                 ckpt: checkpointing.CheckpointManager) -> None:
  """Raises NonFiniteError naming the step and the first non-finite metric (nonfinite = "stop")."""
  loop.check_finite(step, sums, nonfinite=config.nonfinite, ckpt=ckpt, order=_NONFINITE_ORDER,
                    describe_other=_describe_nonfinite)


TRAIN_METRICS = ("accuracy", "count", "exact_accuracy", "grad_norm", "lm_loss", "nonfinite_state",
                 "nonfinite_steps", "q_halt_accuracy", "q_halt_loss", "steps")
"""The metric sums a train step returns (saved with the running log window in checkpoints)."""


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Dict[str, float]]:
  """Trains TRM as configured, evaluates with the EMA weights, returns the final evaluation table.

  Raises:
    Preempted: SIGTERM/SIGINT (from the start on, compilation included): the run finished its
      current step, saved a checkpoint of it and stopped; the same call resumes.
    NonFiniteError: a NaN/Inf loss or gradient with config.nonfinite = "stop".
    config_utils.ConfigError, config_utils.WorkdirError, FileNotFoundError (dataset not prepared),
    checkpointing.CheckpointError: bad input, named with the fix, before any compute.
  """
  with preemption.PreemptionGuard() as guard:
    return _train_and_evaluate(config, workdir, guard)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        guard: preemption.PreemptionGuard) -> Dict[str, Dict[str, float]]:
  validate_config(config)
  config_utils.check_workdir(workdir)
  n_local, per_device_batch = _check_devices(config)
  ds = config.dataset
  data = pipeline.DataSource.from_config(ds, seed=config.seed)
  model = trm.TRMModel(model_config(config, data.metadata()))
  num_train = epoch_examples(data.metadata(), data.num_examples(ds.train_split))
  total_steps = num_train_steps(config, num_train)
  eval_every = eval_every_steps(config, num_train)
  adam, sign = make_optimizers(config, total_steps)
  logging.info("TRM: %d train examples, %d steps (%d per epoch), global batch %d = %d processes x %d "
               "devices x %d", num_train, total_steps, max(1, num_train // config.global_batch_size),
               config.global_batch_size, jax.process_count(), n_local, per_device_batch)

  shard_table = bool(config.shard_puzzle_table)
  state = init_state(model, adam, sign, config.seed, shard_table=shard_table)
  device_state = init_device_state(model, per_device_batch, n_local, jax.device_count(),
                                   shard_table=shard_table)
  acc = metrics_lib.SumAccumulator()
  ckpt = checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                         max_to_keep=config.keep_checkpoints,
                                         save_interval_steps=config.checkpoint_every_steps,
                                         enable_async=config.async_checkpoints)
  restored = ckpt.restore_latest(
      replicated_like={"state": state, "window": acc.state(TRAIN_METRICS)},
      per_device_like=device_state, fallback=config.restore_fallback)
  if restored is not None:
    start_step, saved, device_state = restored
    state = saved["state"]
    acc.restore(saved["window"], n_local)
    logging.info("Resumed from %s at step %d", ckpt.directory, start_step)
  else:
    start_step = 0
  param_text = log_parameter_table(state, model, jax.device_count())

  state = parallel.replicate(state)
  device_state = parallel.shard(device_state)
  device_index = parallel.shard(parallel.device_indices())
  p_train_step = parallel.pmap_step(make_train_step(model, adam, sign, config, per_device_batch),
                                    replicated_in=(0,), out_axes=(None, 0, 0),
                                    donate_argnums=(0, 1))
  is_arc = ds.name == "arc_agi"           # pass@K over augmentations, submission.json
  arc_meta = (arc_agi.load_metadata(datasets.get_builder(data.name, data.data_dir,
                                                         data.builder_kwargs)) if is_arc else None)
  p_eval_step = parallel.pmap_step(
      make_eval_step(model, per_device_batch, sharded=shard_table, predictions=is_arc),
      replicated_in=(0, 1) if shard_table else (0, 1, 2), out_axes=0)

  writer = metrics_lib.create_writer(workdir)
  if start_step == 0:
    writer.write_hparams(_flat_hparams(config))
    writer.write_texts(0, {"parameters": f"```\n{param_text}\n```"})
  hooks = [periodic_actions.ReportProgress(num_train_steps=total_steps, writer=writer,
                                           every_steps=config.log_every_steps)]
  train_iter = data.train_iterator(global_batch_size=config.global_batch_size,
                                   local_device_count=n_local, start_step=start_step)

  def run_eval(step: int, full: bool, final: bool = False) -> Dict[str, float]:
    subset = 0 if full else config.eval_subset
    batches = data.eval_batches(ds.test_split, global_batch_size=config.global_batch_size,
                                local_device_count=n_local, subset_size=subset)
    votes = []
    collect = None
    if is_arc:
      collect = lambda b, p: votes.append(arc_eval.collect(  # noqa: E731
          arc_meta, p["predictions"], p["q_halt"], b["puzzle_identifiers"], b["test_index"],
          b["mask"]))
    results = evaluate(p_eval_step, state, batches, use_ema=config.ema,
                       table=device_state.puzzle_shard if shard_table else None,
                       device_index=device_index, on_predictions=collect)
    if is_arc:
      results.update(arc_results(arc_meta, votes, step, workdir, full=full, final=final))
    writer.write_scalars(step, {f"eval/{k}": v for k, v in results.items()})
    logging.info("eval at step %d (%s): %s", step, "full test set" if full else f"subset {subset}",
                 {k: round(v, 4) for k, v in results.items()})
    return results

  def write_train_metrics(step: int) -> None:
    n = acc.num_steps
    sums = acc.pop()
    grad_norm = sums.pop("grad_norm", 0.0) / max(n, 1)
    scalars = metrics_lib.ratios(sums, count_key="count", ratio_keys=RATIO_METRICS,
                                 divisors={k: config.global_batch_size * n for k in LOSS_METRICS},
                                 prefix="train/")
    scalars["train/grad_norm"] = grad_norm
    scalars["train/nonfinite_steps"] = sums.get("nonfinite_steps", 0.0)
    scalars["train/lr"] = float(optim.warmup_cosine_lr(step, config.lr, config.lr_warmup_steps,
                                                       total_steps, config.lr_min_ratio))
    writer.write_scalars(step, scalars)

  def save(step: int, force: bool) -> bool:
    return ckpt.save(step, replicated={"state": state, "window": acc.state(TRAIN_METRICS)},
                     per_device=device_state, force=force)

  def train_step(step: int) -> Dict[str, Any]:
    nonlocal state, device_state
    batch = parallel.shard(_model_batch(next(train_iter)))
    state, device_state, sums = p_train_step(state, device_state, batch, device_index)
    return sums

  def on_preempt(step: int) -> None:
    writer.flush()
    ckpt.wait_until_finished()
    ckpt.close()

  logging.info("Training from step %d to %d", start_step, total_steps)
  loop.run_steps(
      start_step=start_step, total_steps=total_steps, train_step=train_step, acc=acc, guard=guard,
      log_every=config.log_every_steps, write_metrics=write_train_metrics, eval_every=eval_every,
      evaluate=lambda step: run_eval(step, full=config.eval_subset == 0),
      checkpoint_every=config.checkpoint_every_steps, save=save,
      check=functools.partial(check_finite, config=config, ckpt=ckpt), on_preempt=on_preempt,
      checkpoint_dir=ckpt.directory, hooks=hooks)

  results: Dict[str, Dict[str, float]] = {}
  if config.final_eval and total_steps > 0:
    results["test"] = run_eval(total_steps, full=True, final=True)
    columns = EVAL_COLUMNS + tuple(k for k in results["test"] if k.startswith("pass@"))
    table = metrics_lib.format_table(results, columns)
    logging.info("Final evaluation (EMA weights: %s) at step %d:\n%s", config.ema, total_steps, table)
    if jax.process_index() == 0:
      print(f"\nFinal evaluation at step {total_steps} ({'EMA' if config.ema else 'raw'} weights):\n"
            f"{table}\n", flush=True)
    metrics_lib.write_json(os.path.join(workdir, "final_eval.json"),
                           {"step": total_steps, **results})
  writer.flush()
  ckpt.wait_until_finished()
  ckpt.close()
  return results
