"""The language models' optimizer: global-norm clipping, then AdamW (nanoGPT's and the
masked-diffusion recipe's; TRM has its own: experiments/trm/optim.py).

Synopsis:

  from experiments.common import optim
  tx = optim.adamw(schedule, config, mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params))
  # reads config.beta1, beta2, weight_decay, grad_clip (<= 0: no clipping)
"""

from __future__ import annotations

from typing import Any, Callable

import optax


def adamw(learning_rate: Any, config: Any, *, mask: Callable[[Any], Any]
          ) -> optax.GradientTransformation:
  """clip_by_global_norm(config.grad_clip) (when > 0) -> AdamW(learning_rate, config.beta1,
  config.beta2, eps 1e-8, config.weight_decay on the leaves `mask` marks)."""
  tx = optax.adamw(learning_rate, b1=config.beta1, b2=config.beta2, eps=1e-8,
                   weight_decay=config.weight_decay, mask=mask)
  if config.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), tx)
  return tx
