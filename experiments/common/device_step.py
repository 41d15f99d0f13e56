r"""The trainer's step on the devices: one experiment update with its rng and the non-finite guard.

  step_rng(seed, step, device_index)        the rng of one device's update (the one place)
  guarded_step(train_step, nonfinite, ...)  the experiment's step with its rng and the guard
  parallel_train_step(train_step, ...)      `guarded_step` compiled on every device
  accumulated_update(loss_fn, tx, ...)      one data-parallel optimizer update from micro-batches:
                                            the project's one gradient-accumulation loop (nanoGPT's
                                            and DiffuCoder's grad_accum, TRM's batch slices)

The trainer (experiments/common/trainer.py) compiles the experiment's step with
`parallel_train_step` and calls it once per update; an experiment's step
(experiments/common/experiment.py) calls `accumulated_update` for its gradients and optimizer
update.

Synopsis: see experiments/common/experiment.py (a complete experiment whose step calls
`accumulated_update`, trained by the trainer).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from experiments.common import parallel


def _floating_leaves_finite(tree: Any) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def step_rng(seed: int, step: jax.Array, device_index: jax.Array) -> jax.Array:
  """The rng of one device's update: fold_in(fold_in(key(seed), step), device_index). The one place
  a step's rng is derived (jaxline: the trainer passes it in); `step` is the update's number as the
  experiment counts it (`Experiment.rng_step_offset`)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), device_index)


def guarded_step(train_step: Callable[..., Any], nonfinite: str, *, seed: int,
                 rng_step_offset: int = 0) -> Callable[..., Any]:
  """The experiment's per-device step with its rng and the non-finite guard: (state, device_state,
  batch, device_index) -> (state, device_state, metrics + {"nonfinite_steps", "nonfinite_state"}).

  The experiment's `train_step(state, device_state, batch, rng)` gets `step_rng(seed, state.step +
  rng_step_offset, device_index)`; the device index itself is `parallel.device_index()` inside it.

  A step is finite when the experiment says so (loss and gradients) and every floating leaf of the
  new state is finite (an update can overflow with finite gradients); the per-device state is
  checked on every device (pmin), so all devices decide alike. With nonfinite == "skip" a non-finite
  update is dropped: everything but the state's step counter keeps its old value (data and RNG are
  indexed by the step, so the next update sees new data).
  """
  def step(state, device_state, batch, device_index):
    count = state.step + rng_step_offset if rng_step_offset else state.step
    with parallel.step_device_index(device_index):
      new_state, new_device_state, metrics, finite = train_step(
          state, device_state, batch, step_rng(seed, count, device_index))
    state_finite = parallel.all_devices(_floating_leaves_finite(new_state))
    if jax.tree.leaves(new_device_state):
      local = _floating_leaves_finite(new_device_state).astype(jnp.int32)
      state_finite &= jax.lax.pmin(local, parallel.AXIS) > 0
    ok = jnp.asarray(finite) & state_finite
    metrics = dict(metrics)
    metrics["nonfinite_steps"] = 1.0 - ok.astype(jnp.float32)
    metrics["nonfinite_state"] = 1.0 - state_finite.astype(jnp.float32)
    if nonfinite == "skip":
      keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
      new_state = jax.tree.map(keep, new_state, state)._replace(step=new_state.step)
      new_device_state = jax.tree.map(keep, new_device_state, device_state)
    return new_state, new_device_state, metrics
  return step


class Update(NamedTuple):
  """What `accumulated_update` returns: the new params and optimizer state, the loss and gradient
  norm (means over every device), the experiment's sums (over every device), whether the loss and
  the gradient are finite (the guard of `guarded_step` adds the state's own check), and, when asked
  for, the micro-batches' outputs and input gradients (leaves [A, ...]; else None)."""
  params: Any
  opt_state: Any
  loss: jax.Array
  grad_norm: jax.Array
  sums: Any
  finite: jax.Array
  outputs: Any = None
  input_grads: Any = None


def accumulated_update(loss_fn: Callable[..., Any], tx: optax.GradientTransformation, params: Any,
                       opt_state: Any, micro_batches: Any, accum: int, key: jax.Array, *,
                       outputs: bool = False, input_grads: bool = False,
                       summed: bool = False) -> Update:
  """One data-parallel optimizer update from `accum` micro-batches (inside the trainer's step).

  loss_fn(params, micro_batch, key) -> (loss, sums): the micro-batch's mean loss and a pytree of
  per-device sums ({} for none). `micro_batches`: a pytree whose leaves are [A, ...] (A = accum);
  micro-batch i gets fold_in(key, i). Gradients and loss are averaged over the micro-batches (each
  added as g / A, in order) and then over every device; sums are added, then psum'd. With A == 1
  no loop is built. `tx.update` gets `global_norm=` (the whole gradient's norm, also returned), so
  a clipping transform that takes it (`optim.clip_by_global_norm`) clips alike in every layout.

  `outputs`: loss_fn returns (loss, (sums, outputs)) and `Update.outputs` holds every
  micro-batch's outputs, stacked [A, ...] (e.g. the forward values a step reads after the update:
  TRM's recursion state). `input_grads`: each micro-batch is a pair (data, inputs) and
  `Update.input_grads` holds the gradient of the update's loss (the mean over the micro-batches)
  with respect to each micro-batch's `inputs`, stacked [A, ...], on this device, not averaged over
  devices (e.g. embedding rows that another optimizer updates: TRM's puzzle table). `summed`:
  loss_fn returns the micro-batch's part of the update's loss (its sum over the whole batch's
  divisor) instead of its mean, and gradients, loss and input gradients are added as they come,
  not divided by A: the same sums in the same order as one loop over slices of a whole-batch loss
  (TRM's batch slices keep the numbers of their own loop so, bit for bit; a gradient / A, even a
  power of two, changes the compiled program and with it float32 rounding).

  With the state in blocks (fsdp, `parallel.holds_blocks`) each micro-batch's forward pass reads
  the parameters whole (`parallel.gather_state`: an all-gather per micro-batch) and its gradient is
  averaged over the devices onto this device's blocks at once (`parallel.mean_state`: a
  reduce-scatter), so the accumulator, the optimizer state and the update are blocks; the numbers
  are those of the whole state to float32 rounding. Otherwise the mean is taken once, after the
  loop.
  """
  blocks = parallel.holds_blocks()

  def split(aux):
    return aux if outputs else (aux, None)                             # (sums, outputs)

  def value_and_grads(p, batch, k):
    """((loss, (sums, outputs)), param grads, input grads) of one micro-batch."""
    if not input_grads:
      (l, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(p, batch, k)
      return (l, split(aux)), g, None
    data, inputs = batch
    (l, aux), (g, g_in) = jax.value_and_grad(
        lambda p, x: loss_fn(p, (data, x), k), argnums=(0, 1), has_aux=True)(p, inputs)
    return (l, split(aux)), g, jax.tree.map(lambda x: x if summed else x / accum, g_in)

  def micro(carry, inputs):
    grads, loss, sums = carry
    batch, i = inputs
    p = parallel.gather_state(params)
    (l, (s, out)), g, g_in = value_and_grads(p, batch, jax.random.fold_in(key, i))
    if blocks:
      g = parallel.mean_state(g, like=params)
      l = jax.lax.pmean(l, parallel.AXIS)
    share = (lambda x: x) if summed else (lambda x: x / accum)  # noqa: E731
    return (jax.tree.map(lambda a, b: a + share(b), grads, g), loss + share(l),
            jax.tree.map(jnp.add, sums, s)), (out, g_in)

  first = jax.tree.map(lambda x: x[0], micro_batches)
  sums_shape = jax.eval_shape(lambda p: split(loss_fn(p, first, key)[1])[0],
                              parallel.whole_shapes(params))
  zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32),
           jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), sums_shape))
  if accum == 1:
    (grads, loss, sums), stacked = micro(zeros, (first, 0))
    stacked = jax.tree.map(lambda x: x[None], stacked)
  else:
    (grads, loss, sums), stacked = jax.lax.scan(micro, zeros, (micro_batches, jnp.arange(accum)))
  if not blocks:
    grads = jax.lax.pmean(grads, parallel.AXIS)
    loss = jax.lax.pmean(loss, parallel.AXIS)
  sums = jax.lax.psum(sums, parallel.AXIS)
  grad_norm = parallel.global_norm(grads, like=params)
  updates, opt_state = optax.with_extra_args_support(tx).update(grads, opt_state, params,
                                                                global_norm=grad_norm)
  return Update(optax.apply_updates(params, updates), opt_state, loss, grad_norm, sums,
                jnp.isfinite(loss) & jnp.isfinite(grad_norm), *stacked)


def parallel_train_step(train_step: Callable[..., Any], nonfinite: str, *, seed: int,
                        rules: parallel.Rules = parallel.REPLICATED,
                        rng_step_offset: int = 0,
                        devices: Optional[Sequence[Any]] = None,
                        donate: bool = True,
                        compiler_options: Optional[Mapping[str, str]] = None
                        ) -> parallel.Step:
  """`guarded_step` on every device (`parallel.compile_step`, the state in blocks where `rules`
  split it): (state, device_state, batch, parallel.device_indices(rules) sharded) -> (state,
  device_state, metrics); per-device state and batch as rows, state and per-device state donated
  (`donate=False` keeps the inputs, e.g. for tests that reuse them); `seed`, `rng_step_offset`: the
  step rng (`guarded_step`); `compiler_options`: the Build's XLA options."""
  return parallel.compile_step(
      guarded_step(train_step, nonfinite, seed=seed, rng_step_offset=rng_step_offset), rules,
      state_in=(0,), out_axes=(None, 0, 0), donate_argnums=(0, 1) if donate else (),
      devices=devices, compiler_options=dict(compiler_options or {}), blocks=True)
