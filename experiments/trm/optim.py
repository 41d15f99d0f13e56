"""TRM's optimisers, learning-rate schedule and EMA (nanoGPT and the masked-diffusion model use
optax's AdamW).

This module reproduces the optimisation of the TRM reference (docs/trm.md, section 4):

* `warmup_cosine_lr` / `warmup_cosine_schedule`: linear warm-up then cosine decay to
  `min_ratio * base_lr`, as a function of the 1-BASED optimizer step (the first optimizer step uses
  step 1).
* `adam_atan2`: the reference's AdamATan2 (Adam with `atan2` instead of `m / (sqrt(v) + eps)`, no
  epsilon, decoupled weight decay scaled by the SCHEDULED learning rate), as an
  `optax.GradientTransformation`.
* `sparse_signsgd` + `all_gather_rows`: SignSGD with decoupled weight decay for the rows of the puzzle
  embedding table that appear in the (global) batch; the table is not an Adam parameter.
* `ema_init` / `ema_update`: exponential moving average of the Adam parameters.

Synopsis (runs as is on a CPU):

  import jax, jax.numpy as jnp, optax
  from experiments.trm import optim

  sched = optim.warmup_cosine_schedule(1e-4, warmup_steps=2000, total_steps=65104)
  tx = optim.adam_atan2(sched, b1=0.9, b2=0.95, weight_decay=0.1)
  params = {"w": jnp.ones((3, 2))}
  opt_state = tx.init(params)
  grads = {"w": jnp.full((3, 2), 0.5)}
  updates, opt_state = tx.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)

  emb = optim.sparse_signsgd(optim.warmup_cosine_schedule(1e-2, 2000, 65104), weight_decay=0.1)
  table = jnp.zeros((10, 4))                                   # [num_puzzle_ids, D]
  emb_state = emb.init(table)
  ids = jnp.array([3, 5, 3])                                   # [N]
  row_grads = jnp.ones((3, 4))                                 # [N, D]
  table, emb_state = emb.update(table, ids, row_grads, emb_state)

  ema = optim.ema_init(params)
  ema = optim.ema_update(ema, params, rate=0.999)
"""
import math
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

ScalarOrSchedule = float | optax.Schedule


# --------------------------------------------------------------------------------------------------
# Learning-rate schedule.
# --------------------------------------------------------------------------------------------------


def warmup_cosine_lr(
    step: Any,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float = 1.0,
    num_cycles: float = 0.5,
) -> Any:
  """The reference learning rate of the 1-BASED optimizer step `step`.

  step < warmup_steps:  base_lr * step / max(1, warmup_steps)
  otherwise:            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
                        base_lr * (min_ratio + max(0, (1 - min_ratio) * 0.5
                                                   * (1 + cos(pi * num_cycles * 2 * progress))))

  With the default `min_ratio=1.0` the rate is constant after the warm-up. The first optimizer step
  uses `step=1` (not 0), as in the reference.

  Args:
    step: 1-based optimizer step; a Python/NumPy number (returns a Python float) or a JAX array or
      tracer (returns a float32 JAX array of the same shape).
    base_lr: peak learning rate.
    warmup_steps: number of linear warm-up steps.
    total_steps: total number of optimizer steps of the run.
    min_ratio: final learning rate as a fraction of `base_lr`.
    num_cycles: number of cosine cycles over the decay phase (0.5: a half cosine, decreasing).

  Returns:
    The learning rate of that step.
  """
  warm = max(1, warmup_steps)
  decay = max(1, total_steps - warmup_steps)
  if isinstance(step, numbers.Real) and not isinstance(step, jax.Array):
    if step < warmup_steps:
      return base_lr * float(step) / float(warm)
    progress = float(step - warmup_steps) / float(decay)
    cosine = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return base_lr * (min_ratio + max(0.0, (1.0 - min_ratio) * cosine))
  step = jnp.asarray(step, jnp.float32)
  warmup_lr = base_lr * step / warm
  progress = (step - warmup_steps) / decay
  cosine = 0.5 * (1.0 + jnp.cos(math.pi * float(num_cycles) * 2.0 * progress))
  decay_lr = base_lr * (min_ratio + jnp.maximum(0.0, (1.0 - min_ratio) * cosine))
  return jnp.where(step < warmup_steps, warmup_lr, decay_lr).astype(jnp.float32)


def warmup_cosine_schedule(
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float = 1.0,
    num_cycles: float = 0.5,
) -> optax.Schedule:
  """`warmup_cosine_lr` as an `optax.Schedule` of optax's 0-based update count.

  Optax calls a schedule with the number of updates applied BEFORE the current one (0 on the first
  update); this schedule maps that count `c` to `warmup_cosine_lr(c + 1, ...)`, so the first update gets
  the reference's step-1 rate. `adam_atan2` and `sparse_signsgd` call schedules the same way.
  """

  def schedule(count: Any) -> Any:
    return warmup_cosine_lr(count + 1, base_lr, warmup_steps, total_steps, min_ratio, num_cycles)

  return schedule


def _lr_at(learning_rate: ScalarOrSchedule, count: jax.Array) -> jax.Array:
  """The learning rate for the update whose 0-based count is `count`, as float32."""
  lr = learning_rate(count) if callable(learning_rate) else learning_rate
  return jnp.asarray(lr, jnp.float32)


def _safe_increment(count: jax.Array) -> jax.Array:
  """count + 1, saturating at the int32 maximum instead of wrapping."""
  max_int = jnp.iinfo(jnp.int32).max
  return jnp.where(count < max_int, count + 1, max_int).astype(jnp.int32)


# --------------------------------------------------------------------------------------------------
# AdamATan2.
# --------------------------------------------------------------------------------------------------


class AdamAtan2State(NamedTuple):
  """State of `adam_atan2`: `count` updates applied so far (int32), first/second moments (float32)."""
  count: jax.Array  # []
  mu: optax.Params
  nu: optax.Params


def adam_atan2(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.95,
    weight_decay: float = 0.1,
) -> optax.GradientTransformation:
  """The reference's AdamATan2 with decoupled weight decay, as an optax transformation.

  With t the 1-based step (t = count + 1) and lr_t the (scheduled) learning rate of that step:

    p <- p * (1 - lr_t * wd)
    m <- b1 * m + (1 - b1) * g
    v <- b2 * v + (1 - b2) * g^2
    p <- p - lr_t * atan2(m / (1 - b1^t), sqrt(v) / sqrt(1 - b2^t))

  There is no epsilon: `atan2` is bounded, and atan2(0, 0) = 0. The weight decay is multiplied by the
  SCHEDULED learning rate (so it is also warmed up). The returned updates are
  u = -lr_t * (wd * p + atan2(...)), so that `optax.apply_updates(p, u)` gives the new parameters;
  `update` therefore requires `params`. A schedule is called with the 0-based count (optax
  convention; see `warmup_cosine_schedule`).

  Third-party "adam-atan2" ports (e.g. the `adam-atan2-pytorch` package) scale the step as
  a * atan2(m, b * sqrt(v)) with a = 1.27 (and b = 1) by default; they are NOT this optimiser and give
  different trajectories.

  Args:
    learning_rate: a constant or an `optax.Schedule` of the 0-based update count.
    b1: decay of the first moment.
    b2: decay of the second moment.
    weight_decay: decoupled weight-decay coefficient (multiplied by lr_t).

  Returns:
    An `optax.GradientTransformation` whose state is an `AdamAtan2State` (moments in float32).
  """

  def init_fn(params: optax.Params) -> AdamAtan2State:
    zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)
    return AdamAtan2State(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(zeros, params),
        nu=jax.tree.map(zeros, params),
    )

  def update_fn(
      updates: optax.Updates,
      state: AdamAtan2State,
      params: optax.Params | None = None,
  ) -> tuple[optax.Updates, AdamAtan2State]:
    if params is None:
      raise ValueError("adam_atan2 needs `params` (decoupled weight decay).")
    lr = _lr_at(learning_rate, state.count)
    count = _safe_increment(state.count)
    t = count.astype(jnp.float32)
    bias1 = 1.0 - jnp.asarray(b1, jnp.float32) ** t
    sqrt_bias2 = jnp.sqrt(1.0 - jnp.asarray(b2, jnp.float32) ** t)

    mu = jax.tree.map(
        lambda m, g: b1 * m + (1.0 - b1) * g.astype(jnp.float32), state.mu, updates)
    nu = jax.tree.map(
        lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g.astype(jnp.float32)), state.nu, updates)

    def step(m: jax.Array, v: jax.Array, p: jax.Array) -> jax.Array:
      direction = jnp.arctan2(m / bias1, jnp.sqrt(v) / sqrt_bias2)
      return (-lr * (weight_decay * p.astype(jnp.float32) + direction)).astype(p.dtype)

    new_updates = jax.tree.map(step, mu, nu, params)
    return new_updates, AdamAtan2State(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------------------------------
# Sparse SignSGD for the puzzle-embedding table.
# --------------------------------------------------------------------------------------------------


class SparseSignSGDState(NamedTuple):
  """State of `sparse_signsgd`: `count` updates applied so far (int32)."""
  count: jax.Array  # []


class SparseSignSGD(NamedTuple):
  """An optax-flavoured pair of pure functions; see `sparse_signsgd`.

  init(table) -> SparseSignSGDState
  update(table, ids, row_grads, state) -> (new_table, new_state)
  """
  init: Callable[[jax.Array], SparseSignSGDState]
  update: Callable[
      [jax.Array, jax.Array, jax.Array, SparseSignSGDState],
      tuple[jax.Array, SparseSignSGDState]]


def sparse_signsgd(learning_rate: ScalarOrSchedule, weight_decay: float) -> SparseSignSGD:
  """Sparse SignSGD with decoupled weight decay for an embedding table (docs/trm.md section 4.2).

  Given the GLOBAL list of ids in the batch, `ids` [N], and the gradient of each looked-up row,
  `row_grads` [N, D] (one row per batch element; gather them from every device of every host with
  `all_gather_rows`), the gradients of duplicate ids are summed and, for each distinct id,

    row <- row * (1 - lr_t * wd) - lr_t * sign(summed_grad)

  Rows absent from `ids` are untouched (no decay). An id whose summed gradient is exactly 0 gets only
  the decay (sign(0) = 0), as in the reference.

  The API mirrors optax (`init`/`update`, a schedule is called with the 0-based count), but `update`
  returns the NEW TABLE rather than updates: a dense update would be as large as the table (up to
  ~1M x 512). Only [N, D] temporaries are built; the table is written with a scatter, which is in place
  when the caller donates the table buffer to the jitted/pmapped step. Static shapes, jittable.

  Args:
    learning_rate: a constant or an `optax.Schedule` of the 0-based update count.
    weight_decay: decoupled weight-decay coefficient (multiplied by lr_t).

  Returns:
    A `SparseSignSGD` (init, update) pair.
  """

  def init_fn(table: jax.Array) -> SparseSignSGDState:
    del table
    return SparseSignSGDState(count=jnp.zeros([], jnp.int32))

  def update_fn(
      table: jax.Array,  # [R, D]
      ids: jax.Array,  # [N]
      row_grads: jax.Array,  # [N, D]
      state: SparseSignSGDState,
  ) -> tuple[jax.Array, SparseSignSGDState]:
    num_rows = table.shape[0]
    ids = ids.reshape(-1)
    n = ids.shape[0]
    row_grads = row_grads.reshape(n, -1)
    lr = _lr_at(learning_rate, state.count)
    # Distinct ids, padded with an out-of-range id (dropped by the scatter below).
    unique_ids, inverse = jnp.unique(
        ids, size=n, fill_value=num_rows, return_inverse=True)  # [N], [N]
    summed = jax.ops.segment_sum(
        row_grads.astype(jnp.float32), inverse.reshape(-1), num_segments=n)  # [N, D]
    rows = table.at[unique_ids].get(mode="fill", fill_value=0).astype(jnp.float32)  # [N, D]
    new_rows = rows * (1.0 - lr * weight_decay) - lr * jnp.sign(summed)  # [N, D]
    new_table = table.at[unique_ids].set(new_rows.astype(table.dtype), mode="drop")  # [R, D]
    return new_table, SparseSignSGDState(count=_safe_increment(state.count))

  return SparseSignSGD(init_fn, update_fn)


def all_gather_rows(
    ids: jax.Array,  # [n]
    row_grads: jax.Array,  # [n, D]
    axis_name: str,
) -> tuple[jax.Array, jax.Array]:
  """Gathers the ids and row gradients of every device along the mapped axis `axis_name`.

  Use inside `jax.pmap` (or `shard_map`); with a multi-host pmap the axis spans every device of every
  host, so the result is the global batch's ids [devices * n] and gradients [devices * n, D], in device
  order, identical on every device. Feed them to `sparse_signsgd(...).update`.
  """
  all_ids = jax.lax.all_gather(ids, axis_name, tiled=True)  # [devices * n]
  all_grads = jax.lax.all_gather(row_grads, axis_name, tiled=True)  # [devices * n, D]
  return all_ids, all_grads


# --------------------------------------------------------------------------------------------------
# EMA.
# --------------------------------------------------------------------------------------------------


def ema_init(params: optax.Params) -> optax.Params:
  """A float32 copy of `params` (new buffers, so donating `params` later leaves the EMA intact)."""
  return jax.tree.map(lambda p: jnp.array(p, dtype=jnp.float32, copy=True), params)


def ema_update(ema: optax.Params, params: optax.Params, rate: float = 0.999) -> optax.Params:
  """ema <- rate * ema + (1 - rate) * params, in float32 (reference: after every optimizer step)."""
  return jax.tree.map(
      lambda e, p: (rate * e.astype(jnp.float32)
                    + (1.0 - rate) * p.astype(jnp.float32)).astype(jnp.float32),
      ema, params)
