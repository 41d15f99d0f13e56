"""The plain-XLA kernels: what a TPU or GPU compiles well, and the reference for every other form.

Matmuls take operands cast to a compute dtype with float32 accumulation; a low-precision dtype
(bfloat16) runs the gradient's two products on operands of that dtype too, as torch autocast and
the reference's CastedLinear do (`einsum`). Attention is softmax(q k^T / sqrt(Dh)) v with grouped
KV heads, scores and softmax in float32 (`attention`).

Shape glossary:
  B: batch   Sq, Sk: query and key lengths   H: query heads   K: KV heads   G = H // K   Dh: head dim
  N: rows    I, O: a projection's input and output features

Synopsis:

  import jax.numpy as jnp
  from modules.kernels import xla
  x, w = jnp.ones((4, 8)), jnp.ones((8, 3))
  y = xla.matmul(x, w, "bfloat16")                         # [4, 3] float32, bfloat16 products
  q = jnp.ones((2, 5, 4, 16), jnp.bfloat16)                # [B, S, H, Dh]
  out = xla.attention(q, q[:, :, :2], q[:, :, :2], causal=True)   # [2, 5, 4, 16] bfloat16
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from modules import numerics

_dot = numerics.dot


LANES = 128
"""A TPU vector register's lanes: a minor dimension is padded to a multiple of this in HBM and
VMEM (the Pallas kernels' block widths and layouts follow it)."""


def pad_to(a: jax.Array, axis: int, multiple: int) -> jax.Array:
  """`a` zero-padded at the end of `axis` to a multiple of `multiple` (kernels' whole blocks)."""
  extra = -a.shape[axis] % multiple
  if not extra:
    return a
  pad = [(0, 0)] * a.ndim
  pad[axis] = (0, extra)
  return jnp.pad(a, pad)


def is_low_precision(dtype) -> bool:
  return jnp.dtype(dtype) != jnp.float32


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _einsum(spec: str, a: jax.Array, b: jax.Array, dtype: str) -> jax.Array:
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _einsum_fwd(spec, a, b, dtype):
  ac, bc = a.astype(dtype), b.astype(dtype)
  # Zero-size arrays carry the input dtypes (residuals must be arrays).
  return _einsum(spec, ac, bc, dtype), (ac, bc, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _einsum_bwd(spec, dtype, res, g):                          # g: float32, the output's shape
  ac, bc, a_like, b_like = res
  ins, out = spec.split("->")
  sa, sb = ins.split(",")
  gc = g.astype(dtype)
  # Each product returns its operand's dtype directly, accumulated in float32 (the MXU's and
  # cuBLAS's accumulator; XLA:CPU's too): the same values as a float32 result rounded after, without
  # writing a float32 gradient of every bfloat16 activation (TRM Sudoku-MLP's v4-64 step: 6.79 -> 5.47
  # GB accessed, the TPU compiler's count with each loop body once).
  da = jnp.einsum(f"{out},{sb}->{sa}", gc, bc, preferred_element_type=a_like.dtype)
  db = jnp.einsum(f"{sa},{out}->{sb}", ac, gc, preferred_element_type=b_like.dtype)
  return da, db


_einsum.defvjp(_einsum_fwd, _einsum_bwd)


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
  """jnp.einsum(spec, a, b) on operands cast to `dtype`, float32 accumulation -> float32 result.

  A low-precision `dtype` (bfloat16) runs the gradient's two products on `dtype` operands with
  float32 accumulation too, as torch autocast and the reference's CastedLinear do: the float32
  output gradient is rounded to `dtype` first. (Autodiff would differentiate the float32-result
  product with the float32 gradient, i.e. run both backward products in float32 on converted
  operands.) The gradients come back in a's and b's own dtypes: a float32 weight cast to bfloat16
  here gets its float32 product unrounded. float32 is plain autodiff. Every index of `a` must
  appear in the output or in `b` (and so for `b`): no index is summed within one operand.
  """
  name = jnp.dtype(dtype).name
  if not is_low_precision(name):
    return jnp.einsum(spec, a.astype(name), b.astype(name), preferred_element_type=jnp.float32)
  return _einsum(spec, a, b, name)


def matmul(x: jax.Array, w: jax.Array, dtype, w_transposed: bool = False) -> jax.Array:
  """x [..., I] @ w [I, O] (or w [O, I] transposed: `w_transposed`) -> float32 [..., O], operands
  cast to `dtype`, float32 accumulation; a low-precision `dtype` runs the gradient's products on
  `dtype` operands too (`einsum`)."""
  name = jnp.dtype(dtype).name
  if is_low_precision(name):
    rows = x.reshape(-1, x.shape[-1])                            # [N, I]
    y = einsum("ni,oi->no" if w_transposed else "ni,io->no", rows, w, name)
    return y.reshape(x.shape[:-1] + y.shape[-1:])
  return _dot(x.astype(name), w.astype(name), int(w_transposed))


def projection(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
  """`Linear`'s product x [..., I] @ w [I, O] -> float32 [..., O]: `matmul` for a low-precision
  dtype, a plain float32 dot otherwise."""
  if is_low_precision(dtype):
    return matmul(x, w, dtype)                                   # bfloat16 backward products
  return jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def wt_matmul(w: jax.Array, x: jax.Array, dtype) -> jax.Array:
  """w^T [O, I] @ x [I, N] -> float32 [O, N] for w [I, O]: a projection of FEATURE-MAJOR
  activations (features on the rows, the N tokens contiguous), operands cast to `dtype`, float32
  accumulation. The same products as `matmul(x.T, w).T`."""
  name = jnp.dtype(dtype).name
  return jax.lax.dot_general(w.astype(name), x.astype(name), (((0,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)


def heads_projection(x: jax.Array, w: jax.Array, parts: int, heads: int, dtype) -> jax.Array:
  """x [B, S, D] @ w [D, parts * heads * Dh] -> float32 [parts, B, heads, S, Dh]: a fused q|k|v
  projection written head-major (what an attention kernel reads), `einsum`'s products."""
  D = x.shape[-1]
  w4 = w.reshape(D, parts, heads, -1)                             # [D, P, H, Dh]
  return einsum("bsc,cphd->pbhsd", x, w4, dtype)


def heads_out_projection(o: jax.Array, w: jax.Array, dtype) -> jax.Array:
  """o [B, H, S, Dh] (head-major) @ w [H * Dh, D] -> float32 [B, S, D], `einsum`'s products."""
  H, Dh = o.shape[1], o.shape[3]
  return einsum("bhsd,hdc->bsc", o, w.reshape(H, Dh, -1), dtype)


def qkv_parts(qkv: jax.Array, H: int, K: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """q, k, v = the [B, S, H | K | K, Dh] parts of qkv."""
  return qkv[:, :, :H], qkv[:, :, H:H + K], qkv[:, :, H + K:]


swiglu_activation = numerics.swiglu_activation


def full_mask(q_len: int, k_len: int, batch: int, heads: int, mask: Optional[jax.Array],
              causal: bool) -> Optional[jax.Array]:
  """`mask` (broadcastable to [B, H, Sq, Sk], True = attend) and the causal mask combined, or None."""
  if causal:
    causal_mask = jnp.tril(jnp.ones((q_len, k_len), bool), k=k_len - q_len)
    mask = causal_mask if mask is None else jnp.logical_and(mask, causal_mask)
  if mask is None:
    return None
  return jnp.broadcast_to(mask, (batch, heads, q_len, k_len))


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask: Optional[jax.Array] = None,
              causal: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v with grouped KV heads: `dtype` operands with float32
  accumulation (bfloat16 backward products: `einsum`), the softmax in float32, the probabilities
  rounded to q's dtype for the value product.

  q: [B, Sq, H, Dh]; k, v: [B, Sk, K, Dh]; mask broadcastable to [B, H, Sq, Sk] (True = attend).
  Returns [B, Sq, H, Dh] in q's dtype. A query row with nothing to attend to gets uniform weights.
  """
  B, Sq, H, Dh = q.shape
  Sk, K = k.shape[1], k.shape[2]
  G = H // K
  qg = q.reshape(B, Sq, K, G, Dh)                               # head h -> (h // G, h % G)
  mask = full_mask(Sq, Sk, B, H, mask, causal)
  scores = einsum("bqkgd,bskd->bkgqs", qg, k, q.dtype) * (1.0 / math.sqrt(Dh))  # [B, K, G, Sq, Sk]
  if mask is not None:
    scores = jnp.where(mask.reshape(B, K, G, Sq, Sk), scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = einsum("bkgqs,bskd->bqkgd", probs, v, q.dtype)          # [B, Sq, K, G, Dh] float32
  return out.reshape(B, Sq, H, Dh).astype(q.dtype)
