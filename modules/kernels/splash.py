"""Attention on a TPU without the [B, H, Sq, Sk] scores in HBM: the Pallas splash kernel.

`attention(q, k, v, causal=...)` is `xla.attention`'s function (softmax(q k^T / sqrt(Dh)) v,
grouped KV heads, optional causal mask) computed by JAX's splash-attention kernel
(jax.experimental.pallas.ops.tpu.splash_attention), forward and backward: each block of queries
streams the keys and values through on-chip memory with an online softmax, so HBM sees q, k, v, the
output, and a [B, H, Sq] log-sum-exp per query, never the scores or probabilities. It compiles for
a TPU ahead of time with libtpu (`--dry_run --target=v4-32` on a CPU machine); `interpret=True`
runs the same kernel through the Pallas interpreter on any backend (the tests compare its values
with `xla.attention` on CPU).

Numerics: scores and the softmax in float32 as `xla.attention`; the probabilities stay float32 for
the value product (the XLA path rounds them to the operand dtype first, as torch's math attention
does), and the sum over keys runs blockwise (online softmax). bfloat16 results agree to bfloat16
rounding; float32 to float32 rounding (tests/test_kernels.py).

Layout: with a head size that is not a multiple of 128 (GPT-2's and TRM's 64) the kernel reads q,
k and v sequence-minor ([..., Dh, S] in HBM, `QKVLayout.SEQ_MINOR`): the 128-lane tiles hold 128
positions instead of 64 head features and 64 of padding, and the projection's output, which the
compiler lays out sequence-minor, reaches the kernel without a transposing copy. The same values
(the kernel transposes its blocks on chip; tests/test_kernels.py). GPT-2 124M's v4-32 step, two
layers, by the TPU compiler: 9.33 GB accessed head-minor, 8.71 GB sequence-minor.

Shapes: q [B, Sq, H, Dh], k, v [B, Sk, K, Dh] with H a multiple of K. Sequence lengths that are not
a multiple of 128 are zero-padded to one, the padded keys masked out and the padded queries dropped.
What it does not take: a boolean mask other than causal (Dream's padding; `supports` says no and
the dispatch keeps XLA), dropout on the probabilities (nanoGPT with dropout > 0 keeps XLA).

Synopsis (the interpreter, on CPU):

  import jax, jax.numpy as jnp
  from modules.kernels import splash
  q = jax.random.normal(jax.random.key(0), (2, 128, 4, 64), jnp.float32)
  out = splash.attention(q, q, q, causal=True, interpret=True)   # [2, 128, 4, 64]
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np

from modules.kernels import xla

BLOCK = 128
"""Sequence lengths are padded to a multiple of this (the kernel's smallest block)."""

MIN_AUTO_LENGTH = 512
"""`dispatch.attention_for`'s "auto" takes splash on a TPU from this sequence length on. Below it
the scores are small and XLA's attention moves fewer bytes than the kernel with its padding and
transposes (TRM Sudoku-Att, 97 positions, v4-64 step by the TPU compiler: 22.96 GB accessed with
XLA's attention, 31.19 GB with splash)."""

MAX_BLOCK = 512
"""The largest block of queries or keys a kernel step takes (maxtext's default for v4/v5)."""


def supports(mask, dropout: float = 0.0) -> bool:
  """Whether the kernel computes this call: no mask other than `causal`, no dropout."""
  return mask is None and not dropout


def _block(length: int) -> int:
  """The largest of 512, 256, 128 dividing the padded `length`."""
  for b in (MAX_BLOCK, 256, BLOCK):
    if length % b == 0:
      return b
  raise ValueError(f"splash: sequence length {length} is not a multiple of {BLOCK}")


def seq_minor(head_dim: int) -> bool:
  """Whether the kernel reads q, k, v sequence-minor (module doc): head sizes off the lane tile."""
  return head_dim % xla.LANES != 0


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, sq: int, sk: int, sq_valid: int, sk_valid: int, causal: bool, mqa: bool,
            interpret: bool, seq_minor_layout: bool = False):
  """The splash kernel for one example (built once per shape; the mask is static)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as sk_lib, splash_attention_mask as mask_lib)
  keep = np.ones((sq, sk), bool)
  keep[:, sk_valid:] = False                        # padded keys attend to nothing
  if causal:
    keep &= np.tril(np.ones((sq, sk), bool), k=sk_valid - sq_valid)
  keep[sq_valid:] = False
  keep[sq_valid:, 0] = True                         # padded queries: one key, never NaN
  if causal and sq_valid == sq and sk_valid == sk:
    head_mask = mask_lib.CausalMask((sq, sk), offset=sk - sq)
  elif keep.all():
    head_mask = mask_lib.FullMask((sq, sk))
  else:
    head_mask = mask_lib.NumpyMask(keep)
  mask = mask_lib.MultiHeadMask([head_mask] * heads)
  bq, bkv = _block(sq), _block(sk)
  layout = (sk_lib.QKVLayout.SEQ_MINOR if seq_minor_layout else
            sk_lib.QKVLayout.HEAD_DIM_MINOR)
  sizes = sk_lib.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                            block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                            use_fused_bwd_kernel=True, q_layout=layout, k_layout=layout,
                            v_layout=layout)
  make = sk_lib.make_splash_mqa if mqa else sk_lib.make_splash_mha
  return make(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = False,
              interpret: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v by the splash kernel (module doc).

  q: [B, Sq, H, Dh]; k, v: [B, Sk, K, Dh] (H a multiple of K). Returns [B, Sq, H, Dh] in q's dtype.
  `causal`: query i attends to keys <= i + Sk - Sq. `interpret`: the Pallas interpreter (any
  backend; for tests), else the TPU kernel (Mosaic).
  """
  B, Sq, H, Dh = q.shape
  Sk, K = k.shape[1], k.shape[2]
  G = H // K
  pad_q, pad_k = -Sq % BLOCK, -Sk % BLOCK
  # The score scale on q (exact for a power-of-two Dh: 64, 128 in bfloat16 is exact only for 64;
  # XLA scales the float32 scores instead, the same to the operand's rounding).
  q = (q.astype(jnp.float32) * (1.0 / math.sqrt(Dh))).astype(q.dtype)
  if pad_q:
    q = jnp.pad(q, ((0, 0), (0, pad_q), (0, 0), (0, 0)))
  if pad_k:
    k = jnp.pad(k, ((0, 0), (0, pad_k), (0, 0), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, pad_k), (0, 0), (0, 0)))
  sq, sk = Sq + pad_q, Sk + pad_k
  qh = jnp.transpose(q, (0, 2, 1, 3))                            # [B, H, sq, Dh]
  kh = jnp.transpose(k, (0, 2, 1, 3))                            # [B, K, sk, Dh]
  vh = jnp.transpose(v, (0, 2, 1, 3))
  if K == H:                                                     # multi-head: one kernel per example
    kernel = _kernel(H, sq, sk, Sq, Sk, causal, False, interpret, seq_minor(Dh))
    out = jax.vmap(kernel)(qh, kh, vh)                           # [B, H, sq, Dh]
  else:                                                          # grouped: G query heads per KV head
    kernel = _kernel(G, sq, sk, Sq, Sk, causal, True, interpret, seq_minor(Dh))
    qg = qh.reshape(B, K, G, sq, Dh)
    out = jax.vmap(jax.vmap(kernel))(qg, kh, vh).reshape(B, H, sq, Dh)
  out = jnp.transpose(out, (0, 2, 1, 3))[:, :Sq]                 # [B, Sq, H, Dh]
  return out.astype(q.dtype)


def attention_heads(qh: jax.Array, kh: jax.Array, vh: jax.Array, *, causal: bool = False,
                    interpret: bool = False) -> jax.Array:
  """`attention` on head-major operands: qh [B, H, S, Dh], kh, vh [B, K, S, Dh] (S a multiple of
  128) -> [B, H, S, Dh]; no transposes around the kernel."""
  B, H, S, Dh = qh.shape
  K, Sk = kh.shape[1], kh.shape[2]
  if S % BLOCK or Sk % BLOCK:
    raise ValueError(f"splash.attention_heads: lengths {S}, {Sk} must be multiples of {BLOCK}")
  qh = (qh.astype(jnp.float32) * (1.0 / math.sqrt(Dh))).astype(qh.dtype)
  if K == H:
    return jax.vmap(_kernel(H, S, Sk, S, Sk, causal, False, interpret, seq_minor(Dh)))(qh, kh, vh)
  G = H // K
  out = jax.vmap(jax.vmap(_kernel(G, S, Sk, S, Sk, causal, True, interpret, seq_minor(Dh))))(
      qh.reshape(B, K, G, S, Dh), kh, vh)
  return out.reshape(B, H, S, Dh)


def check_shapes(q_shape, k_shape) -> Optional[str]:
  """Why the kernel cannot take these shapes (None when it can)."""
  if len(q_shape) != 4 or len(k_shape) != 4:
    return f"splash: q and k must be [B, S, heads, Dh], got {q_shape} and {k_shape}"
  if q_shape[2] % k_shape[2]:
    return f"splash: {q_shape[2]} query heads are not a multiple of {k_shape[2]} KV heads"
  return None


_interpret = [False]


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
  """Within the block, `Ops.attention`'s splash calls run through the Pallas interpreter (tests on
  CPU: the same kernel, any backend). Read at trace time: compile a fresh function inside."""
  saved = _interpret[0]
  _interpret[0] = True
  try:
    yield
  finally:
    _interpret[0] = saved


def interpreting() -> bool:
  """Whether an `interpreted()` block is open."""
  return _interpret[0]
