"""The language-model head and its softmax cross-entropy in one TPU kernel: no [N, V] logits in HBM.

`loss_rows(x, w, targets)` is, per row n, logsumexp(z_n) - z_n[targets_n] for the logits
z = round(x @ w^T), x [N, C], w [V, C] (the tied token embedding), the product on `dtype` operands
with float32 accumulation and rounded to `logits_dtype` (bfloat16: torch autocast's logits), the
softmax in float32. Its gradient is ((softmax(z) - onehot(targets)) * g), rounded to
`logits_dtype` (the cotangent of a bfloat16 logits tensor), times w (for x) and x (for w), float32
accumulation: the same function and products as the head `x @ w^T` followed by
`gpt.cross_entropy`, without its [N, V] tensors. Three Pallas kernels stream w (or x) through on-chip
memory in blocks:

  forward   grid (row block i, vocab block j): the logits block in VMEM, a running max and sum of
            exponentials per row (online softmax) and the target's logit; writes lse [N] and the
            target logit [N].
  dx        grid (i, j): recomputes the block, d = (exp(z - lse) - onehot) * g, dx_i += d w_j.
  dw        grid (j, i), on the transposed block (w_j x_i^T): dw_j += d^T x_i.

HBM traffic: x and w are read once per block of the other (w N / block_rows times, x V /
block_vocab times), the [N] statistics, and the gradients written once: ~1.4 GB for GPT-2 124M's
6 x 1024 tokens per device, where the logits path writes and reads its [6144, 50304] logits and
their float32 log-probabilities (7.5 GB by the HLO breakdown, docs/tpu.md). The kernels carry a
`pl.CostEstimate` of their real FLOPs (the forward's 2 N V C, each backward kernel's recomputation
and product, 4 N V C) and of those block re-reads, so the TPU compiler's cost analysis counts them
(it counts no FLOPs for a custom call without one). The recomputation costs FLOPs: 5 x 2 N V C
against the unfused 3 x.

Numerics: the same products and roundings as the unfused head; sums over the vocabulary run
blockwise (online logsumexp) and the loss's mean is taken over rows outside. float32 results
agree to float32 rounding (tests/test_kernels.py, Pallas interpreter on CPU). `interpret=True`
runs the kernels through the Pallas interpreter on any backend.

Synopsis (the interpreter, on CPU):

  import jax, jax.numpy as jnp
  from modules.kernels import fused_ce
  x = jax.random.normal(jax.random.key(0), (256, 128))
  w = jax.random.normal(jax.random.key(1), (1000, 128)) * 0.05
  t = jnp.arange(256) % 1000
  rows = fused_ce.loss_rows(x, w, t, dtype="float32", logits_dtype="float32", interpret=True)
  rows.shape                                                  # (256,): lse - target logit
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from modules.kernels import xla

BLOCK_ROWS = 1024
"""Rows per block in the forward and dx kernels (w is read N / BLOCK_ROWS times)."""
BLOCK_VOCAB = 512
"""Vocabulary rows per block in the forward kernel."""
DX_BLOCK_VOCAB = 256
"""Vocabulary rows per block in the dx kernel (its float32 [rows, C] result, double-buffered,
shares the 16 MiB of VMEM)."""
DW_BLOCK_ROWS = 512
"""Rows per block in the dw kernel."""
DW_BLOCK_VOCAB = 1024
"""Vocabulary rows per block in the dw kernel (x is read V / DW_BLOCK_VOCAB times)."""
VMEM_BUDGET = 14 * 2**20
"""What a kernel's blocks may take of a TPU core's 16 MiB of VMEM (estimate below). The blocks above
fit it for GPT-2 124M (C = 768); a wider model halves the block that multiplies C until they fit
(GPT-2 XL, C = 1600: the dx kernel's double-buffered float32 [1024, C] result alone is 13 MB)."""


def _fits(block: int, vmem: Callable[[int], int], floor: int = 8) -> int:
  """`block` halved until `vmem(block)` (bytes) is within VMEM_BUDGET, not below `floor`."""
  while block > floor and vmem(block) > VMEM_BUDGET:
    block //= 2
  return block
_NEG = -1e30


def _round(z: jax.Array, logits_dtype) -> jax.Array:
  return z.astype(logits_dtype).astype(jnp.float32)


def _forward_kernel(x_ref, w_ref, t_ref, lse_ref, tgt_ref, m_sc, l_sc, t_sc, *, vocab,
                    block_vocab, logits_dtype):
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    m_sc[...] = jnp.full(m_sc.shape, _NEG, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    t_sc[...] = jnp.zeros(t_sc.shape, jnp.float32)

  z = jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32)           # [bn, bv]
  z = _round(z, logits_dtype)
  col = j * block_vocab + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
  z = jnp.where(col < vocab, z, _NEG)          # the last block's rows past V are not w's
  m_prev = m_sc[...][:, :1]                                             # [bn, 1]
  m_new = jnp.maximum(m_prev, jnp.max(z, axis=1, keepdims=True))
  l_new = l_sc[...][:, :1] * jnp.exp(m_prev - m_new) + jnp.sum(jnp.exp(z - m_new), axis=1,
                                                                keepdims=True)
  hit = jnp.sum(jnp.where(col == t_ref[...], z, 0.0), axis=1, keepdims=True)
  m_sc[...] = jnp.broadcast_to(m_new, m_sc.shape)
  l_sc[...] = jnp.broadcast_to(l_new, l_sc.shape)
  t_sc[...] = t_sc[...] + jnp.broadcast_to(hit, t_sc.shape)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    lse_ref[...] = m_sc[...][:, :1] + jnp.log(l_sc[...][:, :1])
    tgt_ref[...] = t_sc[...][:, :1]


def _dx_kernel(x_ref, w_ref, s_ref, dx_ref, *, vocab, block_vocab, logits_dtype):
  # dx_ref (float32) stays in VMEM over the vocabulary axis: the accumulator itself.
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    dx_ref[...] = jnp.zeros(dx_ref.shape, jnp.float32)

  w = w_ref[...]
  w_row = j * block_vocab + jax.lax.broadcasted_iota(jnp.int32, (w.shape[0], 1), 0)
  w = jnp.where(w_row < vocab, w, jnp.zeros((), w.dtype))   # past V: read out of bounds, unset
  z = _round(jax.lax.dot_general(x_ref[...], w, (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32), logits_dtype)
  col = j * block_vocab + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
  stats = s_ref[...]                                                   # [bn, 3]: t, lse, g
  t, lse, g = stats[:, 0:1].astype(jnp.int32), stats[:, 1:2], stats[:, 2:3]
  p = jnp.where(col < vocab, jnp.exp(z - lse), 0.0)
  d = ((p - (col == t).astype(jnp.float32)) * g).astype(logits_dtype)
  dx_ref[...] += jax.lax.dot_general(d.astype(w.dtype), w, (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)


def _dw_kernel(w_ref, x_ref, s_ref, dw_ref, *, vocab, block_vocab, logits_dtype):
  # dw_ref (float32) stays in VMEM over the row axis: the accumulator itself.
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  j, i = pl.program_id(0), pl.program_id(1)

  @pl.when(i == 0)
  def _():
    dw_ref[...] = jnp.zeros(dw_ref.shape, jnp.float32)

  x = x_ref[...]
  zt = _round(jax.lax.dot_general(w_ref[...], x, (((1,), (1,)), ((), ())),
                                  preferred_element_type=jnp.float32), logits_dtype)  # [bv, bn]
  row = j * block_vocab + jax.lax.broadcasted_iota(jnp.int32, zt.shape, 0)
  stats = s_ref[...]                                                   # [3, bn]: t, lse, g
  t, lse, g = stats[0:1].astype(jnp.int32), stats[1:2], stats[2:3]
  p = jnp.where(row < vocab, jnp.exp(zt - lse), 0.0)
  dt = ((p - (row == t).astype(jnp.float32)) * g).astype(logits_dtype)
  dw_ref[...] += jax.lax.dot_general(dt.astype(x.dtype), x, (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)   # [bv, C]


def _cost(flops: int, transcendentals: int, nbytes: int):
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals),
                         bytes_accessed=int(nbytes))


def _shapes(x, w):
  N, C = x.shape
  V = w.shape[0]
  bn = min(BLOCK_ROWS, -(-N // 8) * 8)
  return N, C, V, bn


def _forward(xc, wc, targets, logits_dtype, interpret):
  """(lse [N], target logit [N]) float32 of cast operands xc [N, C], wc [V, C]."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  N, C, V, bn = _shapes(xc, wc)
  bv = BLOCK_VOCAB
  item = xc.dtype.itemsize
  # Double-buffered x and w blocks, the float32 logits block and its exponential, the three
  # [bn, lanes] accumulators.
  bn = _fits(bn, lambda b: 2 * (b + bv) * C * item + 2 * b * bv * 4 + 3 * b * xla.LANES * 4)
  xp = xla.pad_to(xc, 0, bn)
  tp = xla.pad_to(targets.astype(jnp.int32)[:, None], 0, bn)
  Np, Vp = xp.shape[0], -(-V // bv) * bv       # w is not padded: its last block reads past V
  kernel = functools.partial(_forward_kernel, vocab=V, block_vocab=bv, logits_dtype=logits_dtype)
  lse, tgt = pl.pallas_call(
      kernel,
      grid=(Np // bn, Vp // bv),
      in_specs=[pl.BlockSpec((bn, C), lambda i, j: (i, 0)),
                pl.BlockSpec((bv, C), lambda i, j: (j, 0)),
                pl.BlockSpec((bn, 1), lambda i, j: (i, 0))],
      out_specs=[pl.BlockSpec((bn, 1), lambda i, j: (i, 0)),
                 pl.BlockSpec((bn, 1), lambda i, j: (i, 0))],
      out_shape=[jax.ShapeDtypeStruct((Np, 1), jnp.float32)] * 2,
      scratch_shapes=[pltpu.VMEM((bn, xla.LANES), jnp.float32)] * 3,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=_cost(2 * N * V * C, N * V,
                          N * C * item + (Np // bn) * V * C * item + 3 * N * 4),
      interpret=interpret,
      name="fused_ce_forward",
  )(xp, wc, tp)
  return lse[:N, 0], tgt[:N, 0]


def _backward(xc, wc, targets, lse, g_rows, logits_dtype, interpret):
  """(dx [N, C], dw [V, C]) float32: d = (softmax - onehot) * g_rows, rounded to logits_dtype."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  N, C, V, bn = _shapes(xc, wc)
  bv = DX_BLOCK_VOCAB
  item = xc.dtype.itemsize
  # Double-buffered x and w blocks and float32 [bn, C] result, the float32 logits block and its
  # exponential.
  bn = _fits(bn, lambda b: 2 * (b + bv) * C * item + 2 * b * C * 4 + 2 * b * bv * 4)
  # The per-row statistics in one float32 array (targets < 2^24 are exact): t, lse, g.
  stats = jnp.stack([targets.astype(jnp.float32), lse, g_rows.astype(jnp.float32)], axis=1)
  # dx: rows in blocks of bn, the vocabulary in blocks of bv (reduced over).
  xp = xla.pad_to(xc, 0, bn)
  sp = xla.pad_to(stats, 0, bn)                                   # padded rows: g = 0
  Np, Vp = xp.shape[0], -(-V // bv) * bv
  dx = pl.pallas_call(
      functools.partial(_dx_kernel, vocab=V, block_vocab=bv, logits_dtype=logits_dtype),
      grid=(Np // bn, Vp // bv),
      in_specs=[pl.BlockSpec((bn, C), lambda i, j: (i, 0)),
                pl.BlockSpec((bv, C), lambda i, j: (j, 0)),
                pl.BlockSpec((bn, 3), lambda i, j: (i, 0))],
      out_specs=pl.BlockSpec((bn, C), lambda i, j: (i, 0)),
      out_shape=jax.ShapeDtypeStruct((Np, C), jnp.float32),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=_cost(4 * N * V * C, N * V,
                          N * C * item + (Np // bn) * V * C * item + N * C * 4 + 3 * N * 4),
      interpret=interpret,
      name="fused_ce_dx",
  )(xp, wc, sp)[:N]
  # dw: the vocabulary in blocks of dbv, rows in blocks of dbn (reduced over), transposed blocks.
  dbn = min(DW_BLOCK_ROWS, -(-N // xla.LANES) * xla.LANES)
  # Double-buffered w and x blocks and float32 [dbv, C] result, the float32 logits block.
  dbv = _fits(DW_BLOCK_VOCAB, lambda b: 2 * (b + dbn) * C * item + 2 * b * C * 4 + b * dbn * 4)
  xq = xla.pad_to(xc, 0, dbn)
  Nq, Vq = xq.shape[0], -(-V // dbv) * dbv
  dw = pl.pallas_call(
      functools.partial(_dw_kernel, vocab=V, block_vocab=dbv, logits_dtype=logits_dtype),
      grid=(Vq // dbv, Nq // dbn),
      in_specs=[pl.BlockSpec((dbv, C), lambda j, i: (j, 0)),
                pl.BlockSpec((dbn, C), lambda j, i: (i, 0)),
                pl.BlockSpec((3, dbn), lambda j, i: (0, i))],
      out_specs=pl.BlockSpec((dbv, C), lambda j, i: (j, 0)),
      out_shape=jax.ShapeDtypeStruct((V, C), jnp.float32),     # the last block's rows past V dropped
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=_cost(4 * N * V * C, N * V,
                          V * C * item + (Vq // dbv) * N * C * item + V * C * 4 + 3 * N * 4),
      interpret=interpret,
      name="fused_ce_dw",
  )(wc, xq, xla.pad_to(stats.T, 1, dbn))
  return dx, dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _loss_rows(x, w, targets, dtype, logits_dtype, interpret):
  lse, tgt = _forward(x.astype(dtype), w.astype(dtype), targets, logits_dtype, interpret)
  return lse - tgt


def _loss_rows_fwd(x, w, targets, dtype, logits_dtype, interpret):
  xc, wc = x.astype(dtype), w.astype(dtype)
  lse, tgt = _forward(xc, wc, targets, logits_dtype, interpret)
  # Zero-size arrays carry the input dtypes (residuals must be arrays).
  return lse - tgt, (xc, wc, targets, lse, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))


def _loss_rows_bwd(dtype, logits_dtype, interpret, res, g):       # g: [N] float32
  xc, wc, targets, lse, x_like, w_like = res
  dx, dw = _backward(xc, wc, targets, lse, g, logits_dtype, interpret)
  return dx.astype(x_like.dtype), dw.astype(w_like.dtype), None


_loss_rows.defvjp(_loss_rows_fwd, _loss_rows_bwd)


def loss_rows(x: jax.Array, w: jax.Array, targets: jax.Array, *, dtype="bfloat16",
              logits_dtype="bfloat16", interpret: bool = False) -> jax.Array:
  """Per-row cross-entropy [N] float32 of the head z = x @ w^T (module doc): x [N, C], w [V, C],
  targets [N] int in [0, V). `dtype`: the product's operands; `logits_dtype`: the logits' rounding
  (float32: none). C is zero-padded to a multiple of 128 (the TPU's lanes; exact)."""
  C = x.shape[1]
  xp, wp = xla.pad_to(x, 1, xla.LANES), xla.pad_to(w, 1, xla.LANES)
  if xp.shape[1] == C:
    return _loss_rows(x, w, targets, jnp.dtype(dtype).name, jnp.dtype(logits_dtype), interpret)
  return _loss_rows(xp, wp, targets, jnp.dtype(dtype).name, jnp.dtype(logits_dtype), interpret)
