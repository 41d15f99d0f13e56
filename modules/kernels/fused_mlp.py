"""A SwiGLU MLP in one TPU kernel: down(silu(x W_gate) * (x W_up)) without the [N, 2F] gate|up in HBM.

`swiglu_mlp(x, w_gate_up, w_down)` computes, for rows x [N, I], the layers' SwiGLU
(modules/layers.py `SwiGLU`): gate|up = x @ w_gate_up [I, 2F] on `dtype` operands with float32
accumulation, rounded to `dtype`; h = silu(gate) * up (`numerics.silu`: float32 inside, rounded
once, times up in `dtype`); y = h @ w_down [F, O], float32 accumulation, rounded to `dtype`. A
Pallas kernel runs it per block of rows with both weights in on-chip memory (VMEM), so HBM sees x,
the weights and y: TRM's token mix (97 positions -> 2F = 1024) writes and reads back a gate|up ten
times its input otherwise.

The backward pass keeps x only and recomputes the layer in XLA (`jax.vjp` of the same formula,
modules/kernels/xla.py's bfloat16 backward products): the kernel pays where no gradient is taken
(TRM's cycles without gradient, evaluation) and in the recomputation of a remat'd block.

Shapes: the feature axes I, F, O are whole in every block (aligned or not); rows are padded to a
block of BLOCK_ROWS. `interpret=True` runs the kernel through the Pallas interpreter on any backend
(tests on CPU).

Synopsis (the interpreter, on CPU):

  import jax, jax.numpy as jnp
  from modules.kernels import fused_mlp
  x = jax.random.normal(jax.random.key(0), (64, 96))
  wgu = jax.random.normal(jax.random.key(1), (96, 2 * 256)) * 0.1
  wd = jax.random.normal(jax.random.key(2), (256, 96)) * 0.1
  y = fused_mlp.swiglu_mlp(x, wgu, wd, dtype="float32", interpret=True)   # [64, 96]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from modules import numerics
from modules.kernels import xla

BLOCK_ROWS = 256
"""Rows per kernel step: the float32 [rows, 2F] gate|up of TRM's channel MLP (2F = 3072) is 3 MiB."""
VMEM_LIMIT = 16 * 2 ** 20
"""The kernel's scoped VMEM (both weights resident, double-buffered row blocks): a v4 core's limit;
TRM's sizes need less."""


def reference(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, dtype) -> jax.Array:
  """The layer in XLA (what the kernel computes): x [N, I] -> [N, O] in `dtype`."""
  gate_up = xla.matmul(x, w_gate_up, dtype).astype(dtype)         # [N, 2F]
  h = numerics.swiglu_activation(gate_up)                          # [N, F]
  return xla.matmul(h, w_down, dtype).astype(dtype)                # [N, O]


def _kernel(x_ref, wgu_ref, wd_ref, y_ref, *, dtype):
  x = x_ref[...]
  gate_up = jax.lax.dot_general(x, wgu_ref[...], (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32).astype(dtype)   # [bn, 2F]
  f = gate_up.shape[1] // 2
  gate, up = gate_up[:, :f], gate_up[:, f:]
  g32 = gate.astype(jnp.float32)
  h = (g32 * jax.nn.sigmoid(g32)).astype(dtype) * up                # numerics.silu, then * up
  y_ref[...] = jax.lax.dot_general(h, wd_ref[...], (((1,), (0,)), ((), ())),
                                   preferred_element_type=jnp.float32).astype(y_ref.dtype)


def _forward(x, w_gate_up, w_down, dtype, interpret):
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  N, I = x.shape
  F2, O = w_gate_up.shape[1], w_down.shape[1]
  bn = min(BLOCK_ROWS, -(-N // 8) * 8)
  # Feature axes stay whole (a block may span an array's full dimension, aligned or not: padding
  # TRM's 97 positions to 128 cost the v4-64 step 0.2 GB of pad copies); rows padded to a block.
  xp = xla.pad_to(x.astype(dtype), 0, bn)                            # [Np, I]
  wgu, wd = w_gate_up.astype(dtype), w_down.astype(dtype)          # [I, 2F], [F, O]
  Np, Ip, Op = xp.shape[0], I, O
  item = jnp.dtype(dtype).itemsize
  y = pl.pallas_call(
      functools.partial(_kernel, dtype=jnp.dtype(dtype)),
      grid=(Np // bn,),
      in_specs=[pl.BlockSpec((bn, Ip), lambda i: (i, 0)),
                pl.BlockSpec((Ip, F2), lambda i: (0, 0)),
                pl.BlockSpec((F2 // 2, Op), lambda i: (0, 0))],
      out_specs=pl.BlockSpec((bn, Op), lambda i: (i, 0)),
      out_shape=jax.ShapeDtypeStruct((Np, Op), jnp.dtype(dtype)),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                           vmem_limit_bytes=VMEM_LIMIT),
      cost_estimate=pl.CostEstimate(
          flops=int(2 * N * I * F2 + 2 * N * (F2 // 2) * O), transcendentals=int(N * F2 // 2),
          bytes_accessed=int((N * I + I * F2 + F2 // 2 * O + N * O) * item)),
      interpret=interpret,
      name="fused_swiglu_mlp",
  )(xp, wgu, wd)
  return y[:N, :O]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _mlp(x, w_gate_up, w_down, dtype, interpret):
  return _forward(x, w_gate_up, w_down, dtype, interpret)


def _mlp_fwd(x, w_gate_up, w_down, dtype, interpret):
  return _forward(x, w_gate_up, w_down, dtype, interpret), (x, w_gate_up, w_down)


def _mlp_bwd(dtype, interpret, res, g):
  del interpret
  x, w_gate_up, w_down = res
  _, vjp = jax.vjp(lambda a, b, c: reference(a, b, c, dtype), x, w_gate_up, w_down)
  return vjp(g)


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def swiglu_mlp(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, *, dtype="bfloat16",
               interpret: bool = False) -> jax.Array:
  """down(silu(gate) * up) of rows x [N, I] (module doc) -> [N, O] in `dtype`."""
  return _mlp(x, w_gate_up, w_down, jnp.dtype(dtype).name, interpret)
