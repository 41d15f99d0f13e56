"""The language models' optimizer: global-norm clipping, then AdamW (nanoGPT's and the
masked-diffusion recipe's; TRM has its own: experiments/trm/optim.py).

Synopsis:

  from experiments.common import optim
  tx = optim.adamw(schedule, config, mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params))
  # reads config.beta1, beta2, weight_decay, grad_clip (<= 0: no clipping)
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
  """`optax.clip_by_global_norm(max_norm)`, with the norm the caller passes as `global_norm=`
  (device_step.accumulated_update passes the whole gradient's: under fsdp the update sees blocks of
  it, whose own norm is not the gradient's); without one, the norm of the updates it gets."""

  def update_fn(updates, state, params=None, *, global_norm: Optional[jax.Array] = None,
                **extra_args):
    del params, extra_args
    g_norm = optax.tree.norm(updates) if global_norm is None else global_norm
    trigger = jnp.squeeze(g_norm < max_norm)

    def clip(t):
      return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * max_norm)
    return jax.tree.map(clip, updates), state

  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


def adamw(learning_rate: Any, config: Any, *, mask: Callable[[Any], Any]
          ) -> optax.GradientTransformation:
  """clip_by_global_norm(config.grad_clip) (when > 0) -> AdamW(learning_rate, config.beta1,
  config.beta2, eps 1e-8, config.weight_decay on the leaves `mask` marks)."""
  tx = optax.adamw(learning_rate, b1=config.beta1, b2=config.beta2, eps=1e-8,
                   weight_decay=config.weight_decay, mask=mask)
  if config.grad_clip > 0:
    return optax.chain(clip_by_global_norm(config.grad_clip), tx)
  return tx
