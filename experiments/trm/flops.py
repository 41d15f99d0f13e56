"""Analytic FLOPs of a TRM training step (what MFU and the dry runs' predictions are measured against).

Counted from the architecture (experiments/trm/flops.py is the one home of this arithmetic; the bench,
the dry run and the TPU compile report read it): per example of one training step = one ACT step,
the gradient-free cycles forward only, the cycle with gradient and the heads 3x (forward + backward).

Synopsis:

  from experiments.trm import flops
  from modules import trm
  cfg = trm.TRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, puzzle_emb_ndim=0,
                      hidden_size=64, num_heads=1, H_cycles=2, L_cycles=2, L_layers=2, mlp_t=True,
                      pos_encodings="none", halt_max_steps=4, forward_dtype="float32")
  f = flops.analytic_flops(cfg)
  print(f"{f.total / 1e9:.3f} GFLOP per example per step")
"""

from __future__ import annotations

from typing import NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp

from modules import layers
from modules import trm


class FlopCount(NamedTuple):
  """Per example per optimizer step (matmul FLOPs, 2 per multiply-add)."""
  block: float          # one block (token mixer + channel SwiGLU)
  net_call: float       # one call of the shared net (L_layers blocks)
  heads: float          # lm_head + q_head, one forward
  forward: float        # T (n + 1) net calls + heads
  backward: float       # 2 x ((n + 1) net calls + heads)

  @property
  def total(self) -> float:
    return self.forward + self.backward


def analytic_flops(cfg: trm.TRMConfig) -> FlopCount:
  """Model FLOPs per example of one training step (one ACT step) of `cfg`.

  S = P + L tokens of width D. Per block:
    token mixer  mlp_t: SwiGLU over the sequence, inner F_t = swiglu_width(S): 6 D S F_t
                 attention: fused qkv 2 S D (H + 2K) Dh, scores and values 2 x 2 S^2 H Dh,
                 output 2 S H Dh D
    channel SwiGLU, inner F = swiglu_width(D): 6 S D F
  Heads: lm_head 2 L D V on the puzzle tokens, q_head 2 D 2 on slot 0. Embedding lookups: 0.
  The T - 1 gradient-free cycles run forward only; the cycle with gradient (n + 1 net calls) and the
  heads cost 2x their forward in the backward pass. Remat's recomputation is not counted.
  """
  S, L, D, V = cfg.total_len, cfg.seq_len, cfg.hidden_size, cfg.vocab_size
  if cfg.mlp_t:
    mixer = 6.0 * D * S * layers.swiglu_width(S, cfg.expansion)
  else:
    H = K = cfg.num_heads
    Dh = cfg.head_dim
    mixer = 2.0 * S * D * (H + 2 * K) * Dh + 4.0 * S * S * H * Dh + 2.0 * S * H * Dh * D
  channel = 6.0 * S * D * layers.swiglu_width(D, cfg.expansion)
  block = mixer + channel
  net_call = cfg.L_layers * block
  heads = 2.0 * L * D * V + 2.0 * D * 2
  calls_per_cycle = cfg.L_cycles + 1
  forward = cfg.H_cycles * calls_per_cycle * net_call + heads
  backward = 2.0 * (calls_per_cycle * net_call + heads)
  return FlopCount(block=block, net_call=net_call, heads=heads, forward=forward, backward=backward)


def xla_net_call_flops(cfg: trm.TRMConfig) -> float:
  """XLA `cost_analysis` FLOPs of ONE forward call of the shared net, per example (batch 1, no loop).

  A cross-check of `analytic_flops(cfg).net_call`; XLA also counts elementwise work (norms, SiLU,
  softmax, RoPE), so it reads a few percent higher.
  """

  def net(h, inj):
    rope = None
    if cfg.pos_encodings == "rope" and not cfg.mlp_t:
      rope = layers.rope_tables(jnp.arange(cfg.total_len), head_dim=cfg.head_dim,
                                theta=cfg.rope_theta)
    return trm.ReasoningNet(cfg, name="L_level")(h, inj, rope)

  f = hk.without_apply_rng(hk.transform(net))
  z = jnp.zeros((1, cfg.total_len, cfg.hidden_size), cfg.dtype)
  params = jax.eval_shape(f.init, jax.random.key(0), z, z)
  cost = jax.jit(f.apply).lower(params, z, z).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost["flops"])
