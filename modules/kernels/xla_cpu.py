"""XLA:CPU kernels: the forms of podlab's layers that XLA:CPU runs faster, behind one switch.

A model chooses them with one field, `kernels="xla_cpu"` (TRMConfig.kernels, GPTConfig.kernels; the
layers' `kernels` argument); the trainer sets it from `layout.cpu_tuning`, which the TARGET platform
decides, so a TPU or GPU compile (also one made from a CPU box) never carries them. The default
path of `modules/layers.py` is plain JAX. Every form here computes the same function as the plain
path: the same values, or the same products summed in another order (float32 rounding; the
tolerances are asserted in tests/test_layers.py, test_gpt_model.py and test_trm_model.py).

What `kernels="xla_cpu"` turns on is decided here, by `forms(kernels, dtype)`:

  fast_grad        every projection's gradient written out (`matmul`, `wt_matmul`): the weight
                   gradient reads a row-major copy of x^T (or g^T) instead of a transposed left
                   operand, which XLA:CPU runs on a slower path (float32: 52-100 vs 90-110 GFLOP/s
                   per core; bfloat16: ~125 vs ~255 GFLOP/s on 2 cores with AVX512-BF16), and
                   bfloat16 backward operands, as torch autocast. Token embeddings look up by a
                   gather (`embed_lookup`): XLA:CPU runs a gather and its scatter faster than the
                   one-hot matmul at every vocabulary size.
  seq_major        (TRM mlp_t models) the recursion holds its latents as [S, B, D]: the token mix
                   is a projection of feature-major rows (`wt_matmul`, no transposes).
  unroll           (TRM) the cycle with gradient's z_L updates written out instead of a loop.
  head_major       attention on head-major copies of q, k, v (`head_major_attention`) and q|k|v's
                   gradient from dq, dk, dv written out first (`split_qkv`).
  lean_swiglu      every SwiGLU's backward pass recomputes sigmoid(gate) from gate|up
                   (`swiglu_activation`): two [rows, F] buffers fewer per call.
  nograd_chunks    (TRM, bfloat16) the cycles without gradient run on chunks of the batch of at
                   most NOGRAD_CHUNK_ELEMENTS latent elements (`nograd_chunk`).
  pad_contraction  (bfloat16, with fast_grad) `wt_matmul`'s products over a short axis (TRM's 97
                   sequence positions) zero-pad it to a multiple of PAD_CONTRACTION_TO.
  split_gate_up    (bfloat16, with fast_grad and lean_swiglu) gate|up's projection and activation
                   as one `gate_up_swiglu`, whose gradient feeds d gate and d up in separately.

Each form's measurement is in docs/benchmarks.md under its name. A tuning tool turns single forms
off with `override`; tests pin an exact set with `exactly`; nothing else does. Both are read when a
function is traced: compile a fresh function inside the block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Dict, Iterator, Optional, Tuple

import jax
from jax.experimental import layout as jax_layout
import jax.numpy as jnp

from modules import kernels as kernels_lib
from modules import numerics

FORMS = ("fast_grad", "seq_major", "unroll", "head_major", "lean_swiglu", "nograd_chunks",
         "pad_contraction", "split_gate_up")
"""The forms `forms` decides (the names `override` takes, with the experiment's own: TRM's
experiments/trm/cpu_tuning.py adds split_reduce and batch_slices)."""

NOGRAD_CHUNK_ELEMENTS = 2 ** 19
"""nograd_chunks' budget: the cycles without gradient run on chunks of at most this many latent
elements (examples x positions x hidden): 8 examples of the recipes (97 x 512). Measured on the
Intel/AMX CPU (docs/benchmarks.md, "nograd_chunks"): the bfloat16 steps at batch 64 16% (TRM-MLP)
and 7.6% (TRM-Att) shorter with chunks of 8 examples, less with chunks of 4 or 16; the float32
steps no faster (TRM-MLP 3.5% slower), so a float32 forward keeps the whole batch."""

PAD_CONTRACTION_TO = 32
"""`pad_contraction`'s multiple: a bfloat16 product's contracted axis is zero-padded up to it."""


@dataclasses.dataclass(frozen=True)
class Forms:
  """The XLA:CPU forms one model or layer carries (`forms`); all off = the default path."""
  fast_grad: bool = False
  seq_major: bool = False
  unroll: bool = False
  head_major: bool = False
  lean_swiglu: bool = False
  nograd_chunk_elements: int = 0      # nograd_chunks' budget; 0 = the whole batch at once
  pad_contraction: bool = False
  split_gate_up: bool = False

  def __post_init__(self):
    if self.nograd_chunk_elements < 0:
      raise ValueError(f"Forms.nograd_chunk_elements={self.nograd_chunk_elements}: use 0 (the "
                       "whole batch) or a positive number of elements per chunk")


_overrides: Dict[str, bool] = {}
_exactly: Optional[Forms] = None


@contextlib.contextmanager
def override(**enabled: bool) -> Iterator[None]:
  """Within the block, the named forms (FORMS, or an experiment's own) are on or off as given when
  kernels="xla_cpu" (the rest stay on): for the tuning tools (make bench, make profile,
  compare_forms), which time one form against another. Read at trace time."""
  global _overrides
  saved = _overrides
  _overrides = {**saved, **{name: bool(on) for name, on in enabled.items()}}
  try:
    yield
  finally:
    _overrides = saved


@contextlib.contextmanager
def exactly(f: Forms) -> Iterator[None]:
  """Within the block, kernels="xla_cpu" carries exactly the forms `f` at every dtype, whatever
  `forms`' rules say: for tests that compare one form with the default path. Read at trace time."""
  global _exactly
  saved = _exactly
  _exactly = f
  try:
    yield
  finally:
    _exactly = saved


def enabled(name: str) -> bool:
  """Whether form `name` is on (all are, unless an `override` block turned it off)."""
  return _overrides.get(name, True)


def forms(kernels: str, dtype) -> Forms:
  """The forms of a model or layer with this `kernels` choice computing in `dtype`: none for
  "default"; for "xla_cpu" every form, those marked bfloat16 only for a bfloat16 `dtype` (float32
  was measured no faster with them)."""
  kernels_lib.check(kernels)
  if kernels == "default":
    return Forms()
  if _exactly is not None:
    return _exactly
  bf16 = jnp.dtype(dtype) == jnp.bfloat16
  fast, lean = enabled("fast_grad"), enabled("lean_swiglu")
  return Forms(fast_grad=fast, seq_major=enabled("seq_major"), unroll=enabled("unroll"),
               head_major=enabled("head_major"), lean_swiglu=lean,
               nograd_chunk_elements=(NOGRAD_CHUNK_ELEMENTS if bf16 and enabled("nograd_chunks")
                                      else 0),
               pad_contraction=bf16 and enabled("pad_contraction"),
               split_gate_up=bf16 and fast and lean and enabled("split_gate_up"))


def nograd_chunk(f: Forms, batch: int, per_example: int) -> int:
  """Examples per chunk of the cycles without gradient for `batch` examples of `per_example`
  latent elements each: the largest power of two dividing `batch` whose chunk holds at most
  f.nograd_chunk_elements, at least 1; `batch` itself (one chunk) when that is 0."""
  if not f.nograd_chunk_elements:
    return batch
  chunk = 1
  while batch % (2 * chunk) == 0 and 2 * chunk * per_example <= f.nograd_chunk_elements:
    chunk *= 2
  return chunk


def embed_lookup(kernels: str, dtype) -> str:
  """`layers.Embed`'s automatic lookup under `kernels`: "gather" with fast_grad (XLA:CPU runs the
  gather and its scatter faster at every size), else "auto"."""
  return "gather" if forms(kernels, dtype).fast_grad else "auto"


# --------------------------------------------------------------------------------------------------
# The custom VJPs.

_dot = numerics.dot


def _swiglu(gate_up: jax.Array, axis: int) -> jax.Array:
  return numerics.swiglu_activation(gate_up, axis=axis)


def _row_major(a: jax.Array) -> jax.Array:
  """a materialised in row-major order (its logical axes are its memory order)."""
  layout = jax_layout.Layout(major_to_minor=tuple(range(a.ndim)))
  return jax_layout.with_layout_constraint(a, layout)


def _row_major_transpose(a: jax.Array) -> jax.Array:
  """a.T [N, M] materialised row-major, so a matmul reads it as a plain (non-transposed) operand."""
  return _row_major(jnp.asarray(a).T)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x: jax.Array, w: jax.Array, dtype: str, w_transposed: bool) -> jax.Array:
  return _dot(x.astype(dtype), w.astype(dtype), int(w_transposed))


def _matmul_fwd(x, w, dtype, w_transposed):
  xc, wc = x.astype(dtype), w.astype(dtype)
  # Zero-size arrays carry the input dtypes (residuals must be arrays).
  return _dot(xc, wc, int(w_transposed)), (xc, wc, jnp.zeros((0,), x.dtype),
                                           jnp.zeros((0,), w.dtype))


def _at_b(a: jax.Array, b: jax.Array) -> jax.Array:
  """a^T b for a [N, I], b [N, J] -> float32 [I, J], through a row-major copy of the NARROWER of a^T
  and b^T (a transposed copy costs ~ its size, and far more than linearly once it leaves the caches:
  on the dev CPU [10368, 256] -> [256, 10368] took 10-16 ms, [10368, 64] 0.6 ms)."""
  if b.shape[1] < a.shape[1]:
    at_b_t = _dot(_row_major_transpose(b), a, 0)               # [J, N] [N, I]
    if a.dtype != jnp.float32:
      # Keeps XLA from folding the transpose into the dot: a bfloat16 dot of that form has no CPU
      # kernel in XLA 0.10.2 ("Unsupported element type for DotThunk").
      at_b_t = jax.lax.optimization_barrier(at_b_t)
    return at_b_t.T
  return _dot(_row_major_transpose(a), b, 0)                   # [I, N] [N, J]


def _matmul_bwd(dtype, w_transposed, res, g):                  # g: [N, O] float32
  xc, wc, x_like, w_like = res
  gc = g.astype(dtype)
  if w_transposed:                                             # w [O, I]
    dx = _dot(gc, wc, 0)                                       # [N, O] [O, I]
    dw = _at_b(gc, xc)                                         # [O, N] [N, I]
  else:                                                        # w [I, O]
    dx = _dot(gc, wc, 1)                                       # [N, O] [I, O]^T
    dw = _at_b(xc, gc)                                         # [I, N] [N, O]
  return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _dot_nn(a: jax.Array, b: jax.Array, pad: bool) -> jax.Array:
  """a [N, K] @ b [K, M] -> float32 [N, M]; with `pad`, a bfloat16 K that is not a multiple of
  PAD_CONTRACTION_TO is zero-padded to the next one first (the added products are exact zeros)."""
  extra = -a.shape[1] % PAD_CONTRACTION_TO
  if pad and extra and a.dtype == jnp.bfloat16:
    a = jnp.pad(a, ((0, 0), (0, extra)))
    b = jnp.pad(b, ((0, extra), (0, 0)))
  return _dot(a, b, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _wt_matmul(w: jax.Array, x: jax.Array, dtype: str, pad: bool) -> jax.Array:
  return _dot_nn(_row_major_transpose(w.astype(dtype)), x.astype(dtype), pad)


def _wt_matmul_fwd(w, x, dtype, pad):
  wc, xc = w.astype(dtype), x.astype(dtype)
  return (_dot_nn(_row_major_transpose(wc), xc, pad),
          (wc, xc, jnp.zeros((0,), w.dtype), jnp.zeros((0,), x.dtype)))


def _wt_matmul_bwd(dtype, pad, res, g):                        # g: [O, N] float32
  wc, xc, w_like, x_like = res
  gc = g.astype(dtype)
  dx = _dot_nn(wc, gc, pad)                                    # [I, O] [O, N] -> [I, N]
  dw_t = _dot(gc, xc, 1)                                       # [O, N] [I, N]^T -> [O, I]
  return dw_t.T.astype(w_like.dtype), dx.astype(x_like.dtype)


_wt_matmul.defvjp(_wt_matmul_fwd, _wt_matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _lean_swiglu(gate_up: jax.Array, axis: int) -> jax.Array:
  return _swiglu(gate_up, axis)


def _lean_swiglu_fwd(gate_up, axis):
  return _lean_swiglu(gate_up, axis), gate_up                  # residual: gate|up only


def _lean_swiglu_grads(gate_up: jax.Array, g: jax.Array, a: int) -> Tuple[jax.Array, jax.Array]:
  """(d gate, d up), each [..., 1, F] in gate_up's dtype: the halves of gate_up's gradient viewed as
  [..., 2, F] (a new axis of 2 at `a`, a non-negative axis), from g [..., F]."""
  pair = gate_up.reshape(gate_up.shape[:a] + (2, gate_up.shape[a] // 2) + gate_up.shape[a + 1:])
  gate = jax.lax.index_in_dim(pair, 0, a, keepdims=True)        # [..., 1, F]
  up = jax.lax.index_in_dim(pair, 1, a, keepdims=True)
  g = jnp.expand_dims(g, a)
  d_up = g * numerics.silu(gate)                                # the forward's value, same rounding
  # torch's SiLU backward, in float32:
  d_silu = numerics.to_precision(g.astype(jnp.float32) * up.astype(jnp.float32), gate_up.dtype)
  s = jax.nn.sigmoid(gate.astype(jnp.float32))
  d_gate = d_silu * s * (1.0 + gate.astype(jnp.float32) * (1.0 - s))
  return d_gate.astype(gate_up.dtype), d_up


def _lean_swiglu_bwd(axis, gate_up, g):                         # g: [..., F], gate_up's dtype
  # Written on gate and up as the two halves of gate_up, XLA merges this recomputation with the
  # forward pass's sigmoid and silu (common subexpressions) and so keeps those after all; and along
  # the last axis it does not fuse the concatenation of d gate and d up, so sigmoid(gate) becomes a
  # buffer of its own. Viewed as [..., 2, F] (a new axis of 2 at `axis`), the gradient is one
  # elementwise expression whose halves meet along that axis: one fused pass, nothing kept.
  a = axis % gate_up.ndim
  d_gate, d_up = _lean_swiglu_grads(gate_up, g, a)
  d_pair = jnp.concatenate([d_gate, d_up], axis=a)              # [..., 2, F]
  return (d_pair.reshape(gate_up.shape),)


_lean_swiglu.defvjp(_lean_swiglu_fwd, _lean_swiglu_bwd)


def _gate_up(xc: jax.Array, wc: jax.Array, feature_major: bool, pad: bool) -> jax.Array:
  """gate|up = x @ w ([N, 2F]) or, feature-major, w^T x ([2F, N]), rounded to the operands' dtype:
  the products `matmul` and `wt_matmul` compute."""
  if feature_major:
    return _dot_nn(_row_major_transpose(wc), xc, pad).astype(xc.dtype)
  return _dot(xc, wc, 0).astype(xc.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _gate_up_swiglu(x: jax.Array, w: jax.Array, dtype: str, feature_major: bool,
                    pad: bool) -> jax.Array:
  gate_up = _gate_up(x.astype(dtype), w.astype(dtype), feature_major, pad)
  return _swiglu(gate_up, 0 if feature_major else -1)


def _gate_up_swiglu_fwd(x, w, dtype, feature_major, pad):
  xc, wc = x.astype(dtype), w.astype(dtype)
  gate_up = _gate_up(xc, wc, feature_major, pad)
  return (_swiglu(gate_up, 0 if feature_major else -1),
          (xc, wc, gate_up, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype)))


def _gate_up_swiglu_bwd(dtype, feature_major, pad, res, g):   # g: [N, F] (feature-major [F, N])
  xc, wc, gate_up, x_like, w_like = res
  a = 0 if feature_major else 1
  d_gate, d_up = (jnp.squeeze(d, a) for d in _lean_swiglu_grads(gate_up, g, a))
  F = wc.shape[1] // 2
  w_gate, w_up = wc[:, :F], wc[:, F:]                           # [I, F] each
  if feature_major:                                             # x [I, N], d [F, N]
    dx = _dot_nn(w_gate, d_gate, pad) + _dot_nn(w_up, d_up, pad)                  # [I, N]
    dw = jnp.concatenate([_dot(d_gate, xc, 1), _dot(d_up, xc, 1)], axis=0).T     # [I, 2F]
  else:                                                         # x [N, I], d [N, F]
    dx = _dot(d_gate, w_gate, 1) + _dot(d_up, w_up, 1)                            # [N, I]
    dw = jnp.concatenate([_at_b(xc, d_gate), _at_b(xc, d_up)], axis=1)           # [I, 2F]
  return dx.astype(x_like.dtype), dw.astype(w_like.dtype)


_gate_up_swiglu.defvjp(_gate_up_swiglu_fwd, _gate_up_swiglu_bwd)


def gate_up_swiglu(x: jax.Array, w: jax.Array, dtype: jnp.dtype | str, *,
                   feature_major: bool = False, pad_contraction: bool = False) -> jax.Array:
  """silu(gate) * up of the projection gate|up = x @ w, x [N, I], w [I, 2F] -> [N, F] in `dtype`
  (feature-major: x [I, N] -> [F, N], as `wt_matmul`): `matmul` (or `wt_matmul`) followed by
  `swiglu_activation`, the same values bit for bit, with one gradient for both (split_gate_up).

  The gradient never forms the [N, 2F] gradient of gate|up: d gate and d up go into the
  projection's gradient products separately (dx = d_gate w_gate^T + d_up w_up^T, dw = [x^T d_gate |
  x^T d_up]). XLA:CPU writes a concatenated gradient in one fused pass per half, each recomputing
  sigmoid(gate) (its loop fusions have one output); split, it computes the sigmoid once into a
  buffer that both halves read. The weight gradient is bit for bit the concatenated form's; dx adds
  the two halves' float32 products (float32 rounding apart; a bfloat16 dx at most one rounding of
  the result apart) (docs/benchmarks.md, "split_gate_up").
  """
  return _gate_up_swiglu(x, w, jnp.dtype(dtype).name, bool(feature_major), bool(pad_contraction))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _split_qkv(qkv: jax.Array, H: int, K: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`_qkv_parts`, whose gradient is the three parts' gradients, each materialised first, then
  concatenated (head_major's form; see `Attention`)."""
  return qkv[:, :, :H], qkv[:, :, H:H + K], qkv[:, :, H + K:]


def _split_qkv_fwd(qkv, H, K):
  return _split_qkv(qkv, H, K), None


def _split_qkv_bwd(H, K, res, g):
  # Autodiff's gradient of the three slices is pad(dq) + pad(dk) + pad(dv), which XLA:CPU fuses,
  # with RoPE's backward pass and the copies back from head-major order, into ONE loop that pads
  # and adds in every element (TRM-Att bfloat16: ~5% of the step in `make profile`). The barrier
  # has dq, dk and dv written by their own loops first; the concatenation is then a plain copy.
  dq, dk, dv = jax.lax.optimization_barrier(g)
  return (jnp.concatenate([dq, dk, dv], axis=2),)


_split_qkv.defvjp(_split_qkv_fwd, _split_qkv_bwd)


def _exp_minus_tree_max(scores: jax.Array) -> jax.Array:
  """exp(scores - the row max) over the last axis, the max taken as a tree of elementwise maxima
  over halves of the row (exact; no gradient flows through it). XLA:CPU's own max over a short last
  axis (TRM-Att's 97 positions) is 3x slower than its sum when reductions stay out of YNNPACK
  (cpu_features.CPU_DOTS_ONLY, split_reduce)."""
  m = scores
  while m.shape[-1] > 1:
    n = m.shape[-1]
    half = jnp.maximum(m[..., :n // 2], m[..., n // 2:2 * (n // 2)])      # [..., n // 2]
    m = jnp.concatenate([half, m[..., 2 * (n // 2):]], axis=-1) if n % 2 else half
  return jnp.exp(scores - jax.lax.stop_gradient(m))                       # m: [..., 1]


def _softmax_tree_max(scores: jax.Array) -> jax.Array:
  """softmax over the last axis with `_exp_minus_tree_max`'s row max (head_major's form in
  bfloat16). The max is exact, so the forward values are jax.nn.softmax's bit for bit; the gradient
  is autodiff's of exp(s - max) / sum, the same to float32 rounding. With it TRM-Att's step was
  1.5% (float32) and 3.2% (bfloat16) shorter on the AMX machine (docs/benchmarks.md,
  "head_major")."""
  e = _exp_minus_tree_max(scores)
  return e / jnp.sum(e, axis=-1, keepdims=True)


def _head_major_bf16_forward(qh, kh, vh, mask=None):
  """head_major's attention in bfloat16 (qh [B, K, G, Sq, Dh], kh, vh [B, K, Sk, Dh]; mask None or
  [B, K, G, Sq, Sk], True = attend) -> (float32 output [B, K, G, Sq, Dh], float32 probabilities):
  the probabilities are cast to bfloat16 for the value product."""
  scores = jnp.einsum("bkgqd,bksd->bkgqs", qh, kh,
                      preferred_element_type=jnp.float32) * (1.0 / math.sqrt(qh.shape[-1]))
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = _softmax_tree_max(scores)                             # [B, K, G, Sq, Sk] float32
  out = jnp.einsum("bkgqs,bksd->bkgqd", probs.astype(qh.dtype), vh,
                   preferred_element_type=jnp.float32)         # [B, K, G, Sq, Dh]
  return out, probs


def _t_last2(a: jax.Array, shape) -> jax.Array:
  """[B, K, G, S, D] -> row-major [B, K, D, G * S] (G and S merged as one contracted axis)."""
  return _row_major(jnp.transpose(a, (0, 1, 4, 2, 3))).reshape(shape)


@jax.custom_vjp
def _head_major_attention(qh: jax.Array, kh: jax.Array, vh: jax.Array) -> jax.Array:
  """softmax(qh kh^T / sqrt(Dh)) vh on head-major bfloat16 operands (qh [B, K, G, Sq, Dh], kh, vh
  [B, K, Sk, Dh]) -> float32 [B, K, G, Sq, Dh], with the backward pass written out."""
  return _head_major_bf16_forward(qh, kh, vh)[0]


def _head_major_attention_fwd(qh, kh, vh):
  out, probs = _head_major_bf16_forward(qh, kh, vh)
  return out, (qh, kh, vh, probs)


def _head_major_attention_bwd(res, g):                         # g: [B, K, G, Sq, Dh] float32
  qh, kh, vh, probs = res
  B, K, G, Sq, Dh = qh.shape
  dt = qh.dtype
  gc = g.astype(dt)
  pc = probs.astype(dt)
  # dv^T = g^T p and dk^T = q^T ds: row-major [Dh, G*Sq] left operands (XLA:CPU runs a batched
  # matmul with a transposed left operand far slower), the small results transposed back.
  dv_t = jnp.einsum("bkdn,bkns->bkds", _t_last2(gc, (B, K, Dh, G * Sq)),
                    pc.reshape(B, K, G * Sq, -1), preferred_element_type=jnp.float32)
  d_probs = jnp.einsum("bkgqd,bksd->bkgqs", gc, vh, preferred_element_type=jnp.float32)
  # softmax's backward: ds = p * (dp - sum(dp * p)), in float32, times the score scale.
  ds = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
  ds = (ds * (1.0 / math.sqrt(Dh))).astype(dt)
  dq = jnp.einsum("bkgqs,bksd->bkgqd", ds, kh, preferred_element_type=jnp.float32)
  dk_t = jnp.einsum("bkdn,bkns->bkds", _t_last2(qh, (B, K, Dh, G * Sq)),
                    ds.reshape(B, K, G * Sq, -1), preferred_element_type=jnp.float32)
  # The barriers keep XLA from folding the transposes into the matmuls (a bfloat16 matmul with a
  # transposed result has no XLA:CPU kernel: "Unsupported element type for DotThunk").
  dk = _row_major(jnp.swapaxes(jax.lax.optimization_barrier(dk_t), -1, -2))
  dv = _row_major(jnp.swapaxes(jax.lax.optimization_barrier(dv_t), -1, -2))
  return dq.astype(dt), dk.astype(dt), dv.astype(dt)


_head_major_attention.defvjp(_head_major_attention_fwd, _head_major_attention_bwd)


# --------------------------------------------------------------------------------------------------
# The forms, as the layers call them.

def matmul(x: jax.Array, w: jax.Array, dtype: str, w_transposed: bool = False) -> jax.Array:
  """fast_grad's `layers.matmul`: x [N, I] @ w [I, O] (or w [O, I]: `w_transposed`) -> float32
  [N, O] on `dtype` operands, whose gradient's products are written out: bfloat16 operands for a
  bfloat16 `dtype` (as torch autocast), and the weight gradient through a row-major copy of the
  narrower of x^T and g^T (`_at_b`). Float32 results are the same products summed in another
  order."""
  return _matmul(x, w, jnp.dtype(dtype).name, bool(w_transposed))


def wt_matmul(w: jax.Array, x: jax.Array, dtype: str, pad_contraction: bool = False) -> jax.Array:
  """fast_grad's `layers.wt_matmul`: w^T [O, I] @ x [I, N] -> float32 [O, N] for w [I, O], every
  product of the value and the gradient on row-major operands, never a transposed left one: w^T is
  materialised ([O, I], small), dx = w @ g, dw^T = g @ x^T, bfloat16 backward operands stay
  bfloat16. With N large and I, O small (TRM's token mix: I = the sequence) no activation is ever
  transposed.

  `pad_contraction` (bfloat16 only): the two products that contract over I or O (the value, and
  dx) zero-pad that axis to a multiple of PAD_CONTRACTION_TO first. XLA:CPU's bfloat16 kernel runs
  TRM's K = 97 sequence positions at a third to a half of K = 128's rate (docs/benchmarks.md,
  "pad_contraction"). The padded products are exact zeros; the sums may be blocked in another
  order (float32 accumulation). float32 is never padded (slower there)."""
  return _wt_matmul(w, x, jnp.dtype(dtype).name, bool(pad_contraction))


def swiglu_activation(gate_up: jax.Array, *, axis: int = -1) -> jax.Array:
  """lean_swiglu's `layers.swiglu_activation`: silu(gate) * up, whose gradient keeps only gate|up
  (the projection's output, stored anyway) and recomputes sigmoid(gate) and silu(gate) in the
  backward pass with torch's SiLU backward formula (d gate = d silu * s * (1 + gate * (1 - s)),
  s = sigmoid(gate), in float32). Autodiff's gradient of `silu(gate) * up` keeps sigmoid(gate) and
  silu(gate) as two more [..., F] buffers per call (XLA:CPU then writes sigmoid, silu and the
  product in three passes instead of one). The same values; the gradient agrees to rounding."""
  return _lean_swiglu(gate_up, axis)


def split_qkv(qkv: jax.Array, H: int, K: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """head_major's q, k, v = the [B, S, H | K | K, Dh] parts of qkv (`_split_qkv`). The same values
  but for float32 rounding in RoPE's backward pass (in a test 4 of 596k entries, all nearly
  cancelled sums, came out 1-2 bfloat16 ulps apart); TRM-Att's bfloat16 step 7.9% shorter
  (docs/benchmarks.md, "head_major")."""
  return _split_qkv(qkv, H, K)


def head_major_attention(qg: jax.Array, k: jax.Array, v: jax.Array,
                         mask=None) -> jax.Array:
  """head_major's `layers.dot_product_attention` on qg [B, Sq, K, G, Dh], k, v [B, Sk, K, Dh] and
  mask None or [B, K, G, Sq, Sk] (True = attend) -> [B, Sq, H, Dh] in q's dtype.

  q, k and v are first copied head-major ([B, K, G, Sq, Dh] and [B, K, Sk, Dh], row-major), so the
  two batched matmuls read their operands in place, and the output is copied back once. XLA:CPU
  otherwise picks the copies itself around each batched matmul and their gradients, which cost more
  at TRM-Att's shapes (B 64, 8 heads of 64, 97 positions): its bfloat16 training step is 6% shorter
  this way (docs/benchmarks.md, "head_major"). The same products, summed in another order; the
  softmax's row max is taken as a tree of elementwise maxima (`_exp_minus_tree_max`: the same
  values). In float32 the row sum divides the value product's [.., Sq, Dh] result instead of the
  [.., Sq, Sk] probabilities (softmax(s) v = (exp(s - max) v) / sum: the same quantity, rounded in
  another order), which makes the backward pass's row reduction one over Dh, not Sk: TRM-Att's
  float32 step was 1.3% and 3.0% shorter in two runs. bfloat16 keeps the normalised probabilities
  (cast to bfloat16 for the value product, as the default path): there the change gave nothing and
  took 6% more scratch. In bfloat16 without a mask (TRM-Att) the backward pass is written out
  (`_head_major_attention`): it keeps the float32 probabilities, takes the softmax's gradient as
  p * (dp - sum(dp * p)), and reads q and the output gradient transposed as [Dh, Sq] copies for dk
  and dv (XLA:CPU runs a batched matmul with a transposed left operand slowly): the same gradient,
  rounded in another order; TRM-Att's bfloat16 step 3.0% shorter in 15% less scratch.
  """
  B, Sq, K, G, Dh = qg.shape
  H = K * G
  qh = _row_major(jnp.transpose(qg, (0, 2, 3, 1, 4)))            # [B, K, G, Sq, Dh]
  kh = _row_major(jnp.transpose(k, (0, 2, 1, 3)))                # [B, K, Sk, Dh]
  vh = _row_major(jnp.transpose(v, (0, 2, 1, 3)))                # [B, K, Sk, Dh]
  if qg.dtype != jnp.float32:                                    # [B, K, G, Sq, Dh] float32:
    out = (_head_major_attention(qh, kh, vh) if mask is None     # TRM-Att's, written-out backward
           else _head_major_bf16_forward(qh, kh, vh, mask)[0])
    out = jnp.transpose(out.astype(qg.dtype), (0, 3, 1, 2, 4))   # [B, Sq, K, G, Dh]
    return out.reshape(B, Sq, H, Dh)
  scores = jnp.einsum("bkgqd,bksd->bkgqs", qh, kh,
                      preferred_element_type=jnp.float32) * (1.0 / math.sqrt(Dh))
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  e = _exp_minus_tree_max(scores)                                # [B, K, G, Sq, Sk]
  out = jnp.einsum("bkgqs,bksd->bkgqd", e, vh, preferred_element_type=jnp.float32)
  out = out / jnp.sum(e, axis=-1, keepdims=True)                 # [B, K, G, Sq, Dh]
  return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, Sq, H, Dh)
