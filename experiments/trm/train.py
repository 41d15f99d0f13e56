"""TRM on the shared trainer: the experiment's state, steps, data and evaluation (what differs).

The trainer (experiments/common/trainer.py) runs it: `python -m experiments.trm.main --config=...`.
What is TRM's own: the ACT carry stays on the devices across optimizer steps (one optimizer step =
one ACT step for every slot); per-device RNG from (seed, step, global device index), all passed in;
AdamATan2 for the model and sparse SignSGD for the puzzle-embedding table (replicated, or its rows
sharded over all devices: config.shard_puzzle_table); EMA of the Adam parameters every step,
evaluation with the EMA weights; the test pass of exactly halt_max_steps ACT steps and its
evaluators (experiments/trm/evaluators.py: ACT metrics, ARC pass@K and submission.json).

Synopsis (tests call it with a tiny config):

  from experiments.trm import train
  from experiments.trm.configs import cpu_demo
  config = cpu_demo.get_config("smoke")
  results = train.train_and_evaluate(config, "/tmp/trm_demo")     # {"test": {"exact_accuracy": ...}}
"""

from __future__ import annotations

import dataclasses

import functools
from typing import Any, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.common import device_step
from experiments.common import errors
from experiments.common import experiment
from experiments.common import layout as layout_lib
from experiments.common import lazy_import
from experiments.common import metrics as metrics_lib
from experiments.common import parallel
from experiments.common import trainer
from experiments.trm import cpu_tuning
from experiments.trm import evaluators as evaluators_lib
from experiments.trm import flops as flops_lib
from experiments.trm import losses
from experiments.trm import optim
from experiments.trm import reference_checkpoint
from experiments.trm import sharded_table
from experiments.trm import sizes
from experiments.trm.configs import base as base_config
from modules import trm
from modules.kernels import dispatch

# The data and metric libraries (TensorFlow, TFDS, CLU) load where data is read and the parameter
# table written, not with the step (lazy_import).
parameter_overview = lazy_import.module("clu.parameter_overview")
data_source = lazy_import.module("input_pipeline.data_source")

PROGRESS = ("train/lm_loss", "train/accuracy", "train/exact_accuracy")
# Order in which a non-finite step's metrics are named (the first non-finite one is reported).
NONFINITE_ORDER = ("lm_loss", "q_halt_loss", "grad_norm")


class TrainState(NamedTuple):
  """Everything that is the same on every device; replicated on the devices, saved in checkpoints."""
  step: jax.Array                 # [] int32, optimizer steps done
  params: Any                     # Adam parameters (float32)
  opt_state: Any                  # AdamATan2 state
  ema: Any                        # EMA of params (== params when config.ema is off)
  puzzle_table: Optional[jax.Array]  # [N, E] float32, trained by sparse SignSGD (None if E = 0)
  sign_state: Any                 # SignSGD state (step count), None if E = 0
  model_state: Any                # {"trm": {"H_init", "L_init"}} fixed vectors


class DeviceState(NamedTuple):
  """What differs per device; pmapped along the device axis, saved per device in checkpoints."""
  carry: trm.ACTCarry              # the ACT carry of this device's batch slots
  puzzle_shard: Optional[jax.Array]  # [R, E] this device's rows of the puzzle table when it is
                                     # sharded (config.shard_puzzle_table), else None


# --------------------------------------------------------------------------------------------------
# Configuration.

def validate_config(config: ml_collections.ConfigDict) -> None:
  """TRM's value checks (field names are checked by the trainer against configs/base.py)."""
  E = errors.ConfigError
  layout_lib.check_no_accum(config, "TRM has no gradient accumulation (one optimizer step is one "
                            "ACT step of every slot)")
  if config.eval_every_steps <= 0 and config.eval_interval_epochs <= 0:
    raise E("eval_every_steps", config.eval_every_steps,
            "no evaluation interval: eval_interval_epochs is also <= 0",
            "set --config.eval_every_steps=N or --config.eval_interval_epochs=N")
  if not 0.0 <= config.ema_rate < 1.0:
    raise E("ema_rate", config.ema_rate, "must be in [0, 1)", "use 0.999 (the reference)")
  if config.batch_slices < 0:
    raise E("batch_slices", config.batch_slices, "must be >= 0",
            "use 0 (automatic), 1 (the whole batch at once) or a divisor of the per-device batch")
  if config.eval_subset < 0:
    raise E("eval_subset", config.eval_subset, "must be >= 0", "use 0 (full test set) or a size")
  evaluators_lib.names(config)


def model_config(config: ml_collections.ConfigDict, metadata: Dict[str, Any],
                 kernels: str = "default", platform: str = "cpu") -> trm.TRMConfig:
  """TRMConfig from the config's model fields and the dataset's metadata; `kernels` from the
  target (`cpu_tuning.kernels(layout.cpu_tuning)`), model.attention "auto" for the target
  `platform` (modules/kernels/dispatch.py)."""
  fields = config.model.to_dict()
  try:
    choice = fields.pop("attention", "auto")
    mlp_choice = fields.pop("mlp", "auto")
    config_ = trm.TRMConfig(seq_len=int(metadata["seq_len"]), vocab_size=int(metadata["vocab_size"]),
                            num_puzzle_identifiers=int(metadata["num_puzzle_identifiers"]),
                            kernels=kernels, **fields)
    attention = dispatch.attention_for(platform, config_.forward_dtype, choice,
                                       seq_len=config_.total_len)
    mlp = dispatch.mlp_for(platform, mlp_choice)
    return dataclasses.replace(config_, attention=attention, mlp=mlp)
  except ValueError as e:   # TRMConfig names the field, the value and the fix
    raise errors.ConfigError("model", "", str(e), "change the named model field") from None


def num_train_steps(config: ml_collections.ConfigDict, layout: layout_lib.BatchLayout,
                    num_train_examples: int) -> int:
  """docs/trm.md section 4.5: int(epochs * total_groups * mean_puzzle_examples / global batch)."""
  if config.total_steps > 0:
    return int(config.total_steps)
  return layout.updates_for(config.epochs * num_train_examples)


def eval_every_steps(config: ml_collections.ConfigDict, layout: layout_lib.BatchLayout,
                     num_train_examples: int) -> int:
  if config.eval_every_steps > 0:
    return int(config.eval_every_steps)
  return max(1, layout.updates_for(config.eval_interval_epochs * num_train_examples))


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


def init_state(model: trm.TRMModel, adam, sign, rng: jax.Array,
               shard_table: bool = False) -> TrainState:
  """The replicated state; with `shard_table` the puzzle table lives in DeviceState instead."""
  params, model_state = model.init(rng)
  has_table = model.config.prefix_len > 0
  table = model.init_puzzle_table() if has_table and not shard_table else None
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=adam.init(params),
                    ema=optim.ema_init(params), puzzle_table=table,
                    sign_state=sign.init(table) if has_table else None, model_state=model_state)


def init_device_state(model: trm.TRMModel, per_device_batch: int, local_device_count: int,
                      num_devices: int, shard_table: bool = False) -> DeviceState:
  """Host numpy DeviceState stacked over this host's devices: fresh carries [n, ...] and, with
  `shard_table`, this host's zero shards [n, R, E] of the puzzle table (never the whole table)."""
  with jax.ensure_compile_time_eval():    # host values under jax.eval_shape (the abstract state)
    carry = model.initial_carry(model.example_batch(per_device_batch))
  carry = jax.tree.map(lambda x: np.stack([np.asarray(x)] * local_device_count), carry)
  shard = None
  if shard_table and model.config.prefix_len > 0:
    shard = sharded_table.init_host_shards(model.config.num_puzzle_identifiers,
                                           model.config.emb_ndim, num_devices, local_device_count)
  return DeviceState(carry=carry, puzzle_shard=shard)


def host_puzzle_table(state_table: Optional[Any], device_state: DeviceState,
                      num_rows: int) -> Optional[np.ndarray]:
  """The whole puzzle table [N, E] as host numpy, replicated or sharded (gathers across hosts)."""
  if device_state.puzzle_shard is not None:
    return sharded_table.gather_table(evaluators_lib.local_rows(device_state.puzzle_shard), num_rows)
  return None if state_table is None else np.asarray(parallel.unreplicate(state_table))


def make_train_step(model: trm.TRMModel, adam, sign, config: ml_collections.ConfigDict,
                    per_device_batch: int, slices: int = 1):
  """The per-device training step (pmapped by the caller).

  (state, device_state, batch, rng) -> (state, device_state, metric sums psummed over all devices,
  finite) as experiments/common/experiment.py describes; `rng` folds in the 1-based step
  (`TRM.rng_step_offset`), as the reference's; the sharded table reads this device's global index
  (parallel.device_index()). The gradients and the Adam update are the trainer's
  (`device_step.accumulated_update`, `summed`): with `slices` > 1 (config.batch_slices) its
  micro-batches are that many equal slices of the device's batch, forward and backward one slice
  after another, each slice's loss over the whole batch's divisor and its gradients added in order.
  Every example's recursion is independent of the others', so the recursion's values, the halting
  (`trm.act_halt` on the whole batch after the update: the loss never reads it), the loss and the
  metrics are the whole batch's; the weight gradients are the same sums over the examples added up
  slice by slice (float32 rounding). The step's activation memory shrinks to about one slice's.
  """
  cfg = model.config
  if slices < 1 or per_device_batch % slices:
    raise errors.ConfigError("batch_slices", slices,
                             f"must divide the per-device batch ({per_device_batch})",
                             "use 1 (the whole batch at once) or a divisor of the per-device batch")

  def train_step(state: TrainState, device_state: DeviceState, batch, rng):
    carry, shard = device_state
    step = state.step + 1                                        # 1-based optimizer step
    device_index = parallel.device_index() if shard is not None else None
    # The model state and table whole (their blocks gathered under fsdp; the trainer's update
    # gathers the parameters).
    model_state, puzzle_table = parallel.gather_state((state.model_state, state.puzzle_table))
    carry = trm.act_reset(carry, batch, *model.latents(model_state))
    data = carry.current_data
    if shard is not None and cfg.prefix_len:                     # [B, E] from the sharded table
      rows = sharded_table.lookup(shard, data["puzzle_identifiers"], device_index, parallel.AXIS)
    else:
      rows = model.puzzle_rows(puzzle_table, data)               # [B, E] or None

    def slice_loss(params, micro_batch, key):
      """One slice's part of the batch's loss, and its outputs; the loss never reads halting."""
      del key                                                    # the halting's rng is rng, after
      (z_H, z_L, inputs, labels), slice_rows = micro_batch
      z_H, z_L, logits, q_halt, q_cont = model.inner(params, model_state, z_H, z_L, inputs,
                                                     slice_rows)
      no_halt = jnp.zeros(q_halt.shape, jnp.bool_)
      loss, _ = losses.act_loss_and_metrics(logits, labels, q_halt, q_cont, no_halt,
                                            jnp.zeros(q_halt.shape, jnp.int32),
                                            loss_divisor=per_device_batch)
      return loss, ({}, (z_H, z_L, logits, q_halt, q_cont))

    split = lambda x: x.reshape((slices, per_device_batch // slices) + x.shape[1:])  # noqa: E731
    micro_batches = jax.tree.map(split, ((carry.z_H, carry.z_L, data["inputs"], data["labels"]),
                                         rows))
    u = device_step.accumulated_update(slice_loss, adam, state.params, state.opt_state,
                                       micro_batches, slices, rng, outputs=True, input_grads=True,
                                       summed=True)
    whole = lambda x: x.reshape((per_device_batch,) + x.shape[2:])  # noqa: E731
    z_H, z_L, logits, q_halt, q_cont = jax.tree.map(whole, u.outputs)
    carry = trm.act_halt(cfg, carry._replace(z_H=z_H, z_L=z_L), q_halt, training=True, rng=rng)
    _, sums = losses.act_loss_and_metrics(logits, data["labels"], q_halt, q_cont, carry.halted,
                                          carry.steps, loss_divisor=per_device_batch)
    table, sign_state = puzzle_table, state.sign_state
    rows_finite = jnp.array(True)
    if rows is not None:
      g_rows = whole(u.input_grads)
      ids, grads = optim.all_gather_rows(data["puzzle_identifiers"], g_rows, parallel.AXIS)
      if shard is not None:     # each device updates the rows it owns; the others are dropped
        shard, sign_state = sign.update(
            shard, sharded_table.local_ids(ids, device_index, shard.shape[0]), grads, sign_state)
      else:
        table, sign_state = sign.update(table, ids, grads, sign_state)
      rows_finite = jnp.all(jnp.isfinite(grads))                 # gathered: same on every device
    ema = optim.ema_update(state.ema, u.params, config.ema_rate) if config.ema else u.params
    sums = jax.lax.psum(sums, parallel.AXIS)
    sums["grad_norm"] = u.grad_norm
    # Identical on every device (psummed / pmeaned / gathered values), so every device decides alike;
    # the trainer adds the new state's check and the skip policy (device_step.guarded_step).
    finite = (jnp.isfinite(sums["lm_loss"]) & jnp.isfinite(sums["q_halt_loss"])
              & jnp.isfinite(sums["grad_norm"]) & rows_finite)
    new_state = TrainState(step=step, params=u.params, opt_state=u.opt_state, ema=ema,
                           puzzle_table=table, sign_state=sign_state, model_state=state.model_state)
    return new_state, DeviceState(carry=carry, puzzle_shard=shard), sums, finite

  return train_step


def train_scalars(config: ml_collections.ConfigDict, global_batch: int, total_steps: int,
                  sums: Dict[str, float], n: int, step: int) -> Dict[str, float]:
  """The log window's train/ scalars: ratios per example, losses per example, mean grad norm, lr."""
  sums = dict(sums)
  grad_norm = sums.pop("grad_norm", 0.0) / max(n, 1)
  scalars = metrics_lib.ratios(sums, count_key="count", ratio_keys=evaluators_lib.RATIO_METRICS,
                               divisors={k: global_batch * n for k in evaluators_lib.LOSS_METRICS},
                               prefix="train/")
  scalars["train/grad_norm"] = grad_norm
  scalars["train/lr"] = float(optim.warmup_cosine_lr(step, config.lr, config.lr_warmup_steps,
                                                     total_steps, config.lr_min_ratio))
  return scalars


def parameter_table(state: TrainState, model: Optional[trm.TRMModel] = None,
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
  return text


def _summary(state: Any, model: trm.TRMModel, layout: layout_lib.BatchLayout,
             num_train: Optional[int], total_steps: int, slices: int = 1) -> str:
  n_adam = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  rows, width = model.config.num_puzzle_identifiers, model.config.emb_ndim
  if model.config.prefix_len == 0:
    table = "no puzzle-embedding table"
  elif state.puzzle_table is None:
    table = (f"puzzle table ({rows:,}, {width}) sharded: "
             f"{sharded_table.rows_per_device(rows, layout.devices):,} rows per device")
  else:
    table = f"puzzle table ({rows:,}, {width}) replicated"
  if num_train is None:
    steps = ("train examples unknown here (the dataset is not prepared here; prepare it, or set "
             "total_steps, for the run's length)")
  else:
    steps = (f"{num_train:,} train examples per epoch, {total_steps:,} updates "
             f"({max(1, num_train // layout.global_batch):,} per epoch)")
  sliced = (f", {slices} batch slices of {layout.per_device_batch // slices}" if slices > 1 else "")
  return (f"{steps}; {n_adam:,} Adam parameters, {model.config.forward_dtype}, "
          f"remat {'on' if model.config.remat else 'off'}{sliced}; {table}")


# --------------------------------------------------------------------------------------------------
# The experiment.

class TRM(experiment.Experiment):
  """Tiny Recursive Models (docs/trm.md) on the shared trainer."""

  name = "trm"
  rng_step_offset = 1        # the reference folds the 1-based step into the halting exploration

  def base_config(self) -> ml_collections.ConfigDict:
    reference = base_config.get_config()
    reference.dataset.builder_kwargs = ml_collections.ConfigDict()   # builder-specific: free-form
    return reference

  def validate(self, config: ml_collections.ConfigDict) -> None:
    validate_config(config)

  def prepare(self, config: ml_collections.ConfigDict) -> None:
    data_source.DataSource.from_config(config.dataset, seed=config.seed)   # prepares when asked

  def describe_inputs(self, config: ml_collections.ConfigDict):
    try:
      return (("data", data_source.describe_data(config.dataset)),)
    except ModuleNotFoundError:          # no TFDS (an accelerator image): nothing to say here
      return ()

  def build(self, config: ml_collections.ConfigDict,
            layout: layout_lib.BatchLayout) -> experiment.Build:
    n_local, b = layout.devices_per_host, layout.per_device_batch
    meta, num_train = sizes.dataset_sizes(config)
    model = trm.TRMModel(model_config(config, meta, cpu_tuning.kernels(layout.cpu_tuning),
                                      layout.platform))
    if num_train is None:      # a dry run of an unprepared dataset without size knobs
      total_steps, eval_every = max(int(config.total_steps), 0), 1
    else:
      total_steps = num_train_steps(config, layout, num_train)
      eval_every = eval_every_steps(config, layout, num_train)
    adam, sign = make_optimizers(config, max(total_steps, 1))
    shard = bool(config.shard_puzzle_table)

    def init(rng):
      return (init_state(model, adam, sign, rng, shard_table=shard),
              init_device_state(model, b, n_local, layout.devices, shard_table=shard))

    state = jax.eval_shape(lambda: init_state(model, adam, sign, jax.random.key(0), shard))
    example_batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((n_local,) + x.shape, x.dtype),
                                 jax.eval_shape(lambda: model.example_batch(b)))
    flops = flops_lib.analytic_flops(model.config)
    options = cpu_tuning.compiler_options(layout.cpu_tuning)
    slices = cpu_tuning.batch_slices(config.batch_slices, model.config, b, layout.cpu_tuning)
    data = functools.cache(lambda: data_source.DataSource.from_config(config.dataset,
                                                                   seed=config.seed))

    def batches(start_step: int):
      it = data().train_iterator(layout=layout, start_step=start_step)
      return ({k: batch[k] for k in ("inputs", "labels", "puzzle_identifiers")} for batch in it)

    return experiment.Build(
        init=init, train_step=make_train_step(model, adam, sign, config, b, slices),
        batches=batches, example_batch=example_batch, total_steps=total_steps,
        evaluators=[evaluators_lib.test_evaluator(config, layout, model, data, eval_every, options, state,
                                   example_batch, flops.forward)],
        flops_per_step=flops.total * layout.global_batch, model_config=model.config,
        weights=experiment.Weights(get=functools.partial(get_params, config),
                                   set=functools.partial(_set_params, config, layout, model)),
        compiler_options=options, display=experiment.Display(
            parameters=lambda state: parameter_table(state, model, layout.devices),
            summary=_summary(state, model, layout, num_train, total_steps, slices),
            progress=PROGRESS, items_per_step=layout.global_batch,
            train_scalars=functools.partial(train_scalars, config, layout.global_batch,
                                            total_steps),
            nonfinite_order=NONFINITE_ORDER, final_table=evaluators_lib.final_table,
            nonfinite_other="the puzzle-embedding row gradients (SignSGD) are not finite",
            results=lambda final, history: dict(final)))

  def fit_variants(self, config: ml_collections.ConfigDict):
    """--dry_run's fixes for a step too big for the chip: recompute activations (same numbers)."""
    if config.model.remat:
      return ()
    return (("remat (recompute activations in the backward pass; the same numbers)",
             "--config.model.remat=True", lambda c: setattr(c.model, "remat", True)),)

  def load_init(self, path: str, build: experiment.Build,
                config: ml_collections.ConfigDict) -> Dict[str, Any]:
    """A reference TRM PyTorch checkpoint (.pt state_dict, plain or `_orig_mod.` keys) of this
    run's model (docs/trm.md, "Checkpoint format")."""
    if not path.endswith(".pt"):
      raise errors.ConfigError("init_from", path, "neither a podlab checkpoint nor a reference .pt",
                               "pass a podlab workdir, its checkpoints/ folder, or a reference .pt")
    try:
      sd = reference_checkpoint.load_state_dict(path)
    except FileNotFoundError:
      raise errors.ConfigError("init_from", path, "no such file", "check the path") from None
    try:
      params, model_state, table = reference_checkpoint.import_reference(sd, build.model_config)
    except reference_checkpoint.ReferenceCheckpointError as e:
      raise errors.FormatError(f"--config.init_from={path}: {e}. Fix: set the --config.model.* "
                               "fields of the run that saved it") from None
    return {"params": params, "model_state": model_state, "puzzle_table": table}


def get_params(config: ml_collections.ConfigDict, state: TrainState) -> Dict[str, Any]:
  """The weights a state evaluates with (the EMA's when config.ema) and its puzzle table."""
  return {"params": state.ema if config.ema else state.params,
          "model_state": state.model_state, "puzzle_table": state.puzzle_table}


def _set_params(config, layout, model, state: TrainState, device_state: DeviceState,
                p: Dict[str, Any]):
  """A fresh run's state with imported weights: params = EMA = the weights, a fresh optimizer."""
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), p["params"])
  want = jax.tree.map(np.shape, state.params)
  got = jax.tree.map(np.shape, params)
  if want != got:
    raise errors.FormatError(
        f"--config.init_from: the weights' shapes {got} differ from this config's model {want}. "
        "Fix: set the --config.model.* fields of the run that saved them")
  state = state._replace(params=params, ema=params,
                         model_state=p.get("model_state") or state.model_state)
  table = p.get("puzzle_table")
  if table is not None and model.config.prefix_len > 0:
    table = np.asarray(table, np.float32)
    want_table = (model.config.num_puzzle_identifiers, model.config.emb_ndim)
    if table.shape != want_table:
      raise errors.FormatError(
          f"--config.init_from: the puzzle-embedding table has shape {table.shape}, this dataset "
          f"needs {want_table}. Fix: evaluate on the dataset the model was trained on")
    if device_state is not None and device_state.puzzle_shard is not None:
      device_state = device_state._replace(puzzle_shard=sharded_table.shard_host_table(
          table, layout.devices, layout.devices_per_host, layout.process_index))
    else:
      state = state._replace(puzzle_table=table)
  return state, device_state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Dict[str, float]]:
  """Trains TRM as configured on the shared trainer; returns the final evaluation table
  ({"test": {metric: value}}). See experiments/common/trainer.py for what it raises."""
  return trainer.train_and_evaluate(TRM(), config, workdir)
