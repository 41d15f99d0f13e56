"""Haiku layers shared by every podlab model family (TRM, GPT, Dream).

Each layer keeps its parameters in float32 and casts them to a compute `dtype` at use (bfloat16 by
default, float32 as an option), as the reference PyTorch models do with their "casted" layers.
Matmuls accumulate in float32 and round the result to the compute dtype.

Shape glossary:
  B: batch            S: sequence length     D: model width (input features)
  H: query heads      K: key/value heads     Dh: head dimension      G = H // K (query heads per KV head)
  F: feed-forward width                      V: vocabulary size

Synopsis:

  import haiku as hk, jax, jax.numpy as jnp
  from modules import layers

  def f(x):                                                     # x: [B, S, D]
    cos, sin = layers.rope_tables(jnp.arange(x.shape[1]), head_dim=16, theta=10000.0)
    h = layers.rms_norm(x + layers.Attention(num_heads=4, head_dim=16)(x, rope=(cos, sin)))
    return layers.rms_norm(h + layers.SwiGLU(expansion=4.0)(h))

  f = hk.without_apply_rng(hk.transform(f))
  x = jnp.ones((2, 8, 64), jnp.bfloat16)
  params = f.init(jax.random.key(0), x)
  y = f.apply(params, x)                                        # [2, 8, 64] bfloat16
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import haiku as hk
import jax
from jax.experimental import layout as jax_layout
import jax.numpy as jnp
import numpy as np

DTypeLike = jnp.dtype | type | str


def _std_of_unit_truncated_normal(lower: float = -2.0, upper: float = 2.0) -> float:
  """Std of a standard normal truncated to [lower, upper] (0.8796256610342398 for +-2)."""
  def pdf(x):
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)

  def cdf(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

  z = cdf(upper) - cdf(lower)
  var = 1.0 - (upper * pdf(upper) - lower * pdf(lower)) / z - ((pdf(upper) - pdf(lower)) / z) ** 2
  return math.sqrt(var)


TRUNCATED_NORMAL_STD = _std_of_unit_truncated_normal()


class TruncatedNormal(hk.initializers.Initializer):
  """Truncated normal whose samples have standard deviation exactly `stddev`.

  Samples a standard normal truncated at +-2 and multiplies by stddev / 0.87962566 so that the result's
  std is `stddev` (the reference's `trunc_normal_init_`). `TruncatedNormal(1/sqrt(fan_in))` equals
  VarianceScaling(1.0, "fan_in", "truncated_normal"); Haiku's own `hk.initializers.TruncatedNormal(s)`
  does not rescale and gives a std 12% too small.
  """

  def __init__(self, stddev: float = 1.0):
    self.stddev = float(stddev)

  def __call__(self, shape, dtype) -> jax.Array:
    unit = jax.random.truncated_normal(hk.next_rng_key(), -2.0, 2.0, shape, jnp.float32)
    return (unit * (self.stddev / TRUNCATED_NORMAL_STD)).astype(dtype)


def fan_in_init(fan_in: int) -> TruncatedNormal:
  """The corrected truncated-normal fan-in init: std 1/sqrt(fan_in)."""
  return TruncatedNormal(1.0 / math.sqrt(fan_in))


def _row_major(a: jax.Array) -> jax.Array:
  """a materialised in row-major order (its logical axes are its memory order)."""
  return jax_layout.with_layout_constraint(a, jax_layout.Layout(major_to_minor=tuple(range(a.ndim))))


def _row_major_transpose(a: jax.Array) -> jax.Array:
  """a.T [N, M] materialised row-major, so a matmul reads it as a plain (non-transposed) operand."""
  return _row_major(jnp.asarray(a).T)


def _dot(a: jax.Array, b: jax.Array, contract_b: int) -> jax.Array:
  """a [N, K] times b ([K, M] for contract_b=0, [M, K] for 1) -> float32 [N, M]."""
  return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                             preferred_element_type=jnp.float32)


def _is_low_precision(dtype: DTypeLike) -> bool:
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
  da = jnp.einsum(f"{out},{sb}->{sa}", gc, bc, preferred_element_type=jnp.float32)
  db = jnp.einsum(f"{sa},{out}->{sb}", ac, gc, preferred_element_type=jnp.float32)
  return da.astype(a_like.dtype), db.astype(b_like.dtype)


_einsum.defvjp(_einsum_fwd, _einsum_bwd)


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype: DTypeLike) -> jax.Array:
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
  if not _is_low_precision(name):
    return jnp.einsum(spec, a.astype(name), b.astype(name), preferred_element_type=jnp.float32)
  return _einsum(spec, a, b, name)


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


def matmul(x: jax.Array, w: jax.Array, dtype: DTypeLike, *, fast_grad: bool = False,
           w_transposed: bool = False) -> jax.Array:
  """x [N, I] @ w [I, O] (or w [O, I] transposed: `w_transposed`) -> float32 [N, O], operands cast
  to `dtype`, float32 accumulation; a low-precision `dtype` runs the gradient's products on `dtype`
  operands too (`einsum`). x may have more leading axes ([..., I] -> [..., O]).

  `fast_grad` (for programs compiled for the CPU: callers set it from `layout.cpu_tuning`, which is
  decided by the TARGET platform, so a TPU compile from a CPU box never carries it): the same
  bfloat16 backward, with the float32 gradient's products written out too, and the
  weight gradient reads a row-major copy of x^T (or g^T): XLA CPU runs a matmul whose left operand
  is transposed on a slower path (float32: 52-100 vs 90-110 GFLOP/s per core here; bfloat16:
  ~125 vs ~255 GFLOP/s on 2 cores with AVX512-BF16). Float32 results are the same products summed in
  another order; bfloat16 backward operands are what torch autocast uses.
  """
  name = jnp.dtype(dtype).name
  if fast_grad and x.ndim == 2:
    return _matmul(x, w, name, w_transposed)
  if _is_low_precision(name):
    rows = x.reshape(-1, x.shape[-1])                            # [N, I]
    y = einsum("ni,oi->no" if w_transposed else "ni,io->no", rows, w, name)
    return y.reshape(x.shape[:-1] + y.shape[-1:])
  return _dot(x.astype(name), w.astype(name), int(w_transposed))


PAD_CONTRACTION_TO = 32
"""`pad_contraction`'s multiple: a bfloat16 product's contracted axis is zero-padded up to it."""


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


def wt_matmul(w: jax.Array, x: jax.Array, dtype: DTypeLike, *, fast_grad: bool = False,
              pad_contraction: bool = False) -> jax.Array:
  """w^T [O, I] @ x [I, N] -> float32 [O, N] for w [I, O]: a projection of FEATURE-MAJOR
  activations (features on the rows, the N tokens contiguous), operands cast to `dtype`, float32
  accumulation. The same products as `matmul(x.T, w).T`.

  `fast_grad` (a CPU target only, as in `matmul`): every matmul of the value and the gradient reads
  row-major operands and never a transposed left one: w^T is materialised ([O, I], small), dx = w @ g,
  dw^T = g @ x^T (both operands' contracted axis contiguous), and bfloat16 backward operands stay
  bfloat16. With N large and I, O small (TRM's token mix: I = the sequence) no activation is ever
  transposed.

  `pad_contraction` (with fast_grad; a CPU target only): in bfloat16, the two products that contract
  over I or O (the value, and dx) zero-pad that axis to a multiple of PAD_CONTRACTION_TO first.
  XLA:CPU's bfloat16 kernel runs TRM's K = 97 sequence positions at a third to a half of K = 128's
  rate (docs/benchmarks.md, "pad_contraction"). The padded products are exact zeros; the sums may
  be blocked in another order (float32 accumulation). float32 is never padded (slower there).
  """
  name = jnp.dtype(dtype).name
  if fast_grad and x.ndim == 2:
    return _wt_matmul(w, x, name, bool(pad_contraction))
  return jax.lax.dot_general(w.astype(name), x.astype(name), (((0,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)


class Linear(hk.Module):
  """y = x @ w (+ b) with float32 parameters cast to `dtype` at use.

  Fields:
    output_size: number of output features.
    with_bias: adds a bias (initialised by `b_init`, zeros by default).
    dtype: compute dtype; the input and the weights are cast to it, the matmul accumulates in float32.
    w_init: weight initialiser, default: the corrected truncated normal with std 1/sqrt(fan_in).
    param_dtype: storage dtype of the parameters (float32 default; bfloat16 for Dream checkpoints).
    fast_grad: a gradient whose matmuls XLA:CPU runs on its fast paths (see `matmul`); set it only
      for a CPU target (`layout.cpu_tuning`); inputs of more than 2 dims are flattened to [N, D]
      first. False = plain autodiff.
    output_dtype: dtype of the result (and of the bias add); default `dtype`. float32 with a
      bfloat16 `dtype` = torch-autocast style: bfloat16 matmul operands, float32 activations.
    feature_major: the input is [D, N] (features on the rows) and the result [output_size, N]
      (`wt_matmul`); the same parameters and products as the default [N, D] -> [N, output_size].
    pad_contraction: `wt_matmul(pad_contraction=True)` (feature_major with fast_grad; a CPU target
      only): a bfloat16 contraction over D or output_size zero-padded to a multiple of 32.
  Parameters: `w` [D, output_size], `b` [output_size] (float32).
  """

  def __init__(self, output_size: int, *, with_bias: bool = False, dtype: DTypeLike = jnp.bfloat16,
               w_init: Optional[hk.initializers.Initializer] = None,
               b_init: Optional[hk.initializers.Initializer] = None, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32, fast_grad: bool = False,
               output_dtype: Optional[DTypeLike] = None, feature_major: bool = False,
               pad_contraction: bool = False):
    super().__init__(name=name)
    self.fast_grad = fast_grad
    self.feature_major = feature_major
    self.pad_contraction = pad_contraction
    self.output_dtype = jnp.dtype(output_dtype or dtype)
    self.output_size = output_size
    self.with_bias = with_bias
    self.dtype = jnp.dtype(dtype)
    self.w_init = w_init
    self.b_init = b_init or jnp.zeros
    self.param_dtype = jnp.dtype(param_dtype)

  def weight(self, fan_in: int) -> jax.Array:
    """The parameter `w` [fan_in, output_size] (created at init), for a caller that computes the
    projection itself (`SwiGLU` with split_grad)."""
    return hk.get_parameter("w", [fan_in, self.output_size], self.param_dtype,
                            init=self.w_init or fan_in_init(fan_in))

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., output_size]
    fan_in = x.shape[0] if self.feature_major else x.shape[-1]
    w = self.weight(fan_in)
    if self.feature_major:                                       # [D, N] -> [output_size, N]
      y = wt_matmul(w, x, self.dtype, fast_grad=self.fast_grad,
                    pad_contraction=self.pad_contraction)
      if self.with_bias:
        b = hk.get_parameter("b", [self.output_size], self.param_dtype, init=self.b_init)
        y = y.astype(self.output_dtype) + b.astype(self.output_dtype)[:, None]
      return y.astype(self.output_dtype)
    if self.fast_grad:
      y = matmul(x.reshape(-1, fan_in), w, self.dtype, fast_grad=True).reshape(
          x.shape[:-1] + (self.output_size,))
    elif _is_low_precision(self.dtype):
      y = matmul(x, w, self.dtype)                               # bfloat16 backward products
    else:
      y = jnp.dot(x.astype(self.dtype), w.astype(self.dtype), preferred_element_type=jnp.float32)
    if self.with_bias:
      b = hk.get_parameter("b", [self.output_size], self.param_dtype, init=self.b_init)
      y = y.astype(self.output_dtype) + b.astype(self.output_dtype)
    return y.astype(self.output_dtype)


ONE_HOT_MAX_VOCAB = 1024
"""`Embed`'s automatic lookup is a one-hot matmul for vocabularies up to this size (TRM's 11-12
tokens, shakespeare_char's 65) and a gather above it (GPT-2's 50,257, Dream's 151,936). A gather's
gradient is a scatter-add of every token's row into the table, which an accelerator serialises on
rows that collide: at TRM's 11 tokens every row does (the bfloat16 Sudoku step on an H200: 36% of
the step in that one scatter; issue 48). The one-hot lookup's forward pass is still the gather (the
rows exactly, no FLOPs: sampling and evaluation pay nothing); its gradient is the matmul
one_hot(ids)^T @ g (`_take_dense_grad`), 2 V D FLOPs per token: small beside a layer for V up to
here, the vocabulary projection's cost at GPT-2's size."""

LOOKUPS = ("auto", "one_hot", "gather")


def one_hot_lookup(vocab_size: int, lookup: str = "auto") -> bool:
  """Whether `Embed(vocab_size, lookup=lookup)` looks up by a one-hot matmul (else a gather)."""
  if lookup not in LOOKUPS:
    raise ValueError(f"Embed lookup={lookup!r}: use one of {LOOKUPS}")
  return lookup == "one_hot" or (lookup == "auto" and vocab_size <= ONE_HOT_MAX_VOCAB)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _take_dense_grad(vocab_size: int, dtype: DTypeLike, table: jax.Array,
                     ids: jax.Array) -> jax.Array:
  """Rows `ids` of `table` cast to `dtype` (a gather), whose table gradient is the one-hot matmul
  one_hot(ids)^T @ g with float32 accumulation, in the table's dtype: no scatter-add."""
  return jnp.take(table.astype(dtype), ids, axis=0)              # [..., D]


def _take_dense_grad_fwd(vocab_size, dtype, table, ids):
  return _take_dense_grad(vocab_size, dtype, table, ids), (ids, jnp.zeros((0,), table.dtype))


def _take_dense_grad_bwd(vocab_size, dtype, residuals, g):       # g [..., D]
  ids, table_dtype = residuals
  one_hot = jax.nn.one_hot(ids, vocab_size, dtype=g.dtype)       # [..., V], exact 0 / 1
  # HIGHEST: a TPU's default float32 product would round g to bfloat16.
  precision = None if _is_low_precision(g.dtype) else jax.lax.Precision.HIGHEST
  d_table = jnp.einsum("...v,...d->vd", one_hot, g, preferred_element_type=jnp.float32,
                       precision=precision)                      # [V, D] float32
  return d_table.astype(table_dtype.dtype), None


_take_dense_grad.defvjp(_take_dense_grad_fwd, _take_dense_grad_bwd)


class Embed(hk.Module):
  """Token embedding with a float32 table cast to `dtype` at lookup.

  Fields:
    vocab_size, embed_dim: the table is `embedding` [V, D] float32.
    init_std: std of the corrected truncated-normal init (e.g. 1/sqrt(D) for TRM).
    w_init: overrides the init (e.g. a plain normal for GPT).
    dtype: compute dtype of the returned vectors.
    param_dtype: storage dtype of the table (float32 default).
    lookup: "auto" (one-hot for vocab_size <= ONE_HOT_MAX_VOCAB, else gather), "one_hot" (the
      rows gathered, the table's gradient a one-hot matmul: `_take_dense_grad`), or "gather"
      (`jnp.take`: the gradient is a scatter-add). The same vectors; the table gradients are the same sums in another order.
      A CPU target passes "gather" (XLA:CPU runs the gather and its scatter faster at every size).
  """

  def __init__(self, vocab_size: int, embed_dim: int, *, init_std: float = 1.0,
               w_init: Optional[hk.initializers.Initializer] = None,
               dtype: DTypeLike = jnp.bfloat16, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32, lookup: str = "auto"):
    super().__init__(name=name)
    self.one_hot = one_hot_lookup(vocab_size, lookup)
    self.vocab_size = vocab_size
    self.embed_dim = embed_dim
    self.w_init = w_init or TruncatedNormal(init_std)
    self.dtype = jnp.dtype(dtype)
    self.param_dtype = jnp.dtype(param_dtype)

  @property
  def embeddings(self) -> jax.Array:                             # [V, D] param_dtype
    return hk.get_parameter("embedding", [self.vocab_size, self.embed_dim], self.param_dtype,
                            init=self.w_init)

  def __call__(self, ids: jax.Array) -> jax.Array:              # [...] int -> [..., D]
    if self.one_hot:
      return _take_dense_grad(self.vocab_size, self.dtype, self.embeddings, ids)
    return jnp.take(self.embeddings.astype(self.dtype), ids, axis=0)

  def attend(self, x: jax.Array, *, matmul_dtype: Optional[DTypeLike] = None,
             fast_grad: bool = False) -> jax.Array:              # [..., D] -> [..., V] (tied head)
    """x @ embeddings^T in `dtype`; `matmul_dtype` (default `dtype`) / `fast_grad` as in `matmul`."""
    y = matmul(x.reshape(-1, x.shape[-1]), self.embeddings, matmul_dtype or self.dtype,
               fast_grad=fast_grad, w_transposed=True)
    return y.reshape(x.shape[:-1] + (self.vocab_size,)).astype(self.dtype)


def rms_norm(x: jax.Array, *, axis: int = -1, eps: float = 1e-5) -> jax.Array:
  """RMSNorm without a learnable scale, computed in float32 over `axis`, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  variance = jnp.mean(jnp.square(x32), axis=axis, keepdims=True)
  return (x32 * jax.lax.rsqrt(variance + eps)).astype(x.dtype)


class RMSNorm(hk.Module):
  """RMSNorm with a learnable weight (Dream/Qwen style).

  Normalises in float32, casts back to x's dtype, then multiplies by the weight cast to that dtype.
  Parameter: `weight` [D] float32 (or `param_dtype`), initialised to ones.
  """

  def __init__(self, *, eps: float = 1e-6, axis: int = -1, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32):
    super().__init__(name=name)
    self.eps = eps
    self.axis = axis
    self.param_dtype = jnp.dtype(param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    weight = hk.get_parameter("weight", [x.shape[self.axis]], self.param_dtype, init=jnp.ones)
    return weight.astype(x.dtype) * rms_norm(x, axis=self.axis, eps=self.eps)


def rope_tables(positions: jax.Array, *, head_dim: int,
                theta: float = 10000.0) -> Tuple[jax.Array, jax.Array]:
  """cos/sin tables for rotary embeddings in the "rotate half" layout, in float32.

  positions: [S] or [B, S] (per-row positions, e.g. for left-padded batches).
  Returns cos, sin: [..., S, Dh] with the frequencies duplicated as [f, f].
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))  # [Dh/2]
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq                              # [..., S, Dh/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)                                           # [..., S, Dh]
  return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: jax.Array) -> jax.Array:
  """[x1, x2] -> [-x2, x1] on the last axis."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, S, H, Dh] by the tables ([S, Dh] or [B, S, Dh]); float32 inside, x's dtype out."""
  cos = cos[..., None, :]                                       # [(B,) S, 1, Dh]
  sin = sin[..., None, :]
  x32 = x.astype(jnp.float32)
  return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)


def swiglu_width(width: int, expansion: float, multiple: int = 256) -> int:
  """The inner width rule: round(expansion * width * 2 / 3) rounded UP to a multiple of 256."""
  inner = round(expansion * width * 2 / 3)
  return -(-inner // multiple) * multiple


def silu(x: jax.Array) -> jax.Array:
  """x * sigmoid(x) computed in float32 and rounded once to x's dtype: PyTorch's `F.silu` on a
  bfloat16 tensor, bit for bit (torch computes reduced-precision activations in float32).

  `jax.nn.silu` on bfloat16 rounds twice: XLA rounds the sigmoid to bfloat16, then the product;
  that equals torch's value for only ~61% of standard-normal inputs. Rounding once is also faster
  on XLA:CPU: one float32 pass instead of two bfloat16 ones (docs/benchmarks.md, "silu").
  Identical to `jax.nn.silu` in float32. The gradient of a bfloat16 silu is torch's SiLU backward,
  g * s * (1 + x * (1 - s)) in float32 with s = sigmoid(x), from g rounded to bfloat16 by
  reduce_precision, which XLA keeps in a jitted program (docs/trm.md section 1).
  """
  x32 = x.astype(jnp.float32)
  if x.dtype == jnp.float32:
    return x32 * jax.nn.sigmoid(x32)
  return _silu_rounded(x)


def to_precision(x32: jax.Array, dtype) -> jax.Array:
  """float32 x32 rounded to `dtype`'s precision (e.g. bfloat16), still float32. reduce_precision,
  which XLA keeps: a float32 -> bfloat16 -> float32 round trip it may drop under
  `xla_allow_excess_precision` (on by default), leaving the value unrounded in a jitted program."""
  fi = jnp.finfo(dtype)
  return jax.lax.reduce_precision(x32, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)


@jax.custom_vjp
def _silu_rounded(x: jax.Array) -> jax.Array:                   # x: bfloat16 (or float16)
  x32 = x.astype(jnp.float32)
  return (x32 * jax.nn.sigmoid(x32)).astype(x.dtype)


def _silu_rounded_fwd(x):
  return _silu_rounded(x), x


def _silu_rounded_bwd(x, g):
  # torch's SiLU backward in float32 from the incoming gradient as a `x.dtype` value: upstream,
  # autodiff's gradient of silu(gate) * up is g * up in bfloat16, whose rounding XLA would drop on
  # its way into this float32 formula (jitted: 25% of d gate one ulp off torch's).
  x32 = x.astype(jnp.float32)
  s = jax.nn.sigmoid(x32)
  g32 = to_precision(g.astype(jnp.float32), x.dtype)
  return ((g32 * s * (1.0 + x32 * (1.0 - s))).astype(x.dtype),)


_silu_rounded.defvjp(_silu_rounded_fwd, _silu_rounded_bwd)


def _swiglu(gate_up: jax.Array, axis: int) -> jax.Array:
  gate, up = jnp.split(gate_up, 2, axis=axis)
  return silu(gate) * up


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
  d_up = g * silu(gate)                                         # the forward's value, same rounding
  d_silu = to_precision(g.astype(jnp.float32) * up.astype(jnp.float32), gate_up.dtype)  # torch's
  s = jax.nn.sigmoid(gate.astype(jnp.float32))                  # SiLU backward, in float32:
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


def swiglu_activation(gate_up: jax.Array, *, axis: int = -1, lean_grad: bool = False) -> jax.Array:
  """silu(gate) * up for gate|up halves of `gate_up` along `axis` ([..., 2F] -> [..., F]).

  lean_grad: the gradient keeps only gate|up (the projection's output, stored anyway) and
    recomputes sigmoid(gate) and silu(gate) in the backward pass, with torch's SiLU backward formula
    (d gate = d silu * s * (1 + gate * (1 - s)), s = sigmoid(gate), in float32). Without it JAX's
    gradient of `silu(gate) * up` keeps sigmoid(gate) and silu(gate) as two more [..., F] buffers
    per call (XLA:CPU then writes sigmoid, silu and the product in three passes instead of one).
    The same values; the gradient agrees to rounding. Off by default.
  """
  return _lean_swiglu(gate_up, axis) if lean_grad else _swiglu(gate_up, axis)


def _gate_up(xc: jax.Array, wc: jax.Array, feature_major: bool, pad: bool) -> jax.Array:
  """gate|up = x @ w ([N, 2F]) or, feature-major, w^T x ([2F, N]), rounded to the operands' dtype:
  the products `Linear(fast_grad=True)` computes."""
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


def gate_up_swiglu(x: jax.Array, w: jax.Array, dtype: DTypeLike, *, feature_major: bool = False,
                   pad_contraction: bool = False) -> jax.Array:
  """silu(gate) * up of the projection gate|up = x @ w, x [N, I], w [I, 2F] -> [N, F] in `dtype`
  (feature-major: x [I, N] -> [F, N], as `wt_matmul`): `Linear(2F, fast_grad=True)` followed by
  `swiglu_activation(lean_grad=True)`, the same values bit for bit, with one gradient for both.

  The gradient never forms the [N, 2F] gradient of gate|up: d gate and d up go into the
  projection's gradient products separately (dx = d_gate w_gate^T + d_up w_up^T, dw = [x^T d_gate |
  x^T d_up]). XLA:CPU writes a concatenated gradient in one fused pass per half, each recomputing
  sigmoid(gate) (its loop fusions have one output); split, it computes the sigmoid once into a
  buffer that both halves read. The weight gradient is bit for bit the concatenated form's; dx adds
  the two halves' float32 products (float32 rounding apart; a bfloat16 dx at most one rounding of
  the result apart). For a CPU
  target only (TRMConfig.split_gate_up; docs/benchmarks.md, "split_gate_up").
  """
  return _gate_up_swiglu(x, w, jnp.dtype(dtype).name, bool(feature_major), bool(pad_contraction))


class SwiGLU(hk.Module):
  """down(silu(gate) * up) with a fused gate|up projection (no biases).

  Fields:
    expansion: sets the inner width F by `swiglu_width(D, expansion)` (ignored when `inner_size` is set).
    inner_size: explicit F (e.g. 18944 for Dream).
    dtype: compute dtype.
    param_dtype: storage dtype of the weights (float32 default).
    fast_grad: `Linear.fast_grad` for both projections (a CPU target only: `layout.cpu_tuning`).
    feature_major: x is [D, N] and so is the result (`Linear.feature_major`); same parameters.
    lean_grad: `swiglu_activation(lean_grad=True)`: the backward pass keeps gate|up only.
    pad_contraction: `Linear.pad_contraction` for both projections (feature_major, fast_grad).
    split_grad: (with fast_grad and lean_grad; a CPU target only) the gate|up projection and the
      activation are one `gate_up_swiglu`, whose gradient takes d gate and d up into the
      projection's gradient separately. The same values and parameters.
  Parameters: `gate_up_proj/w` [D, 2F] (first half gate, second half up), `down_proj/w` [F, D].
  """

  def __init__(self, *, expansion: float = 4.0, inner_size: Optional[int] = None,
               dtype: DTypeLike = jnp.bfloat16, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32, fast_grad: bool = False,
               feature_major: bool = False, lean_grad: bool = False,
               pad_contraction: bool = False, split_grad: bool = False):
    super().__init__(name=name)
    self.fast_grad = fast_grad
    self.feature_major = feature_major
    self.lean_grad = lean_grad
    self.split_grad = split_grad
    self.pad_contraction = pad_contraction
    self.expansion = expansion
    self.inner_size = inner_size
    self.dtype = jnp.dtype(dtype)
    self.param_dtype = jnp.dtype(param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., D]
    axis = 0 if self.feature_major else -1                       # feature_major: [D, N] -> [D, N]
    width = x.shape[axis]
    inner = self.inner_size or swiglu_width(width, self.expansion)
    gate_up_proj = Linear(2 * inner, dtype=self.dtype, param_dtype=self.param_dtype,
                          name="gate_up_proj", fast_grad=self.fast_grad,
                          feature_major=self.feature_major, pad_contraction=self.pad_contraction)
    if self.split_grad and self.fast_grad and self.lean_grad and (x.ndim == 2
                                                                  or not self.feature_major):
      w = gate_up_proj.weight(width)                             # [D, 2F]
      rows = x if self.feature_major else x.reshape(-1, width)   # [D, N] or [N, D]
      with jax.named_scope("gate_up_proj"):                     # profiles name it as Linear's
        h = gate_up_swiglu(rows, w, self.dtype, feature_major=self.feature_major,
                           pad_contraction=self.pad_contraction)
      h = h if self.feature_major else h.reshape(x.shape[:-1] + (inner,))   # [..., F] (or [F, N])
    else:
      gate_up = gate_up_proj(x)                                  # [..., 2F] (or [2F, N])
      h = swiglu_activation(gate_up, axis=axis, lean_grad=self.lean_grad)   # [..., F] (or [F, N])
    return Linear(width, dtype=self.dtype, param_dtype=self.param_dtype,
                  name="down_proj", fast_grad=self.fast_grad,
                  feature_major=self.feature_major, pad_contraction=self.pad_contraction)(h)


def _qkv_parts(qkv: jax.Array, H: int, K: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """q, k, v = the [B, S, H | K | K, Dh] parts of qkv."""
  return qkv[:, :, :H], qkv[:, :, H:H + K], qkv[:, :, H + K:]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _split_qkv(qkv: jax.Array, H: int, K: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`_qkv_parts`, whose gradient is the three parts' gradients, each materialised first, then
  concatenated (head_major's form; see `Attention`)."""
  return _qkv_parts(qkv, H, K)


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


class Attention(hk.Module):
  """Multi-head attention with a fused q|k|v projection, optional grouped KV heads and RoPE.

  Fields:
    num_heads: H query heads.  head_dim: Dh.  num_kv_heads: K (default H); query head h uses KV head
      h // (H // K).
    causal: adds a lower-triangular mask (TRM and Dream are non-causal, GPT is causal).
    qkv_bias / out_bias: biases on the fused projection / the output projection.
    dtype: compute dtype. Scores and softmax are float32; probabilities are cast to `dtype` for the
      value product.
  Parameters: `qkv_proj/w` [D, (H + 2K) Dh] ordered q | k | v, head-major within each; `o_proj/w`
  [H Dh, D].
  Masks: `mask` is boolean and broadcastable to [B, H, S, S] (True = attend). A query row with nothing
  to attend to gets uniform weights, never NaN.
  Cached keys (optional): `kv_context=(k, v)` [B, C, K, Dh] (RoPE already applied) are placed BEFORE
  this call's own S keys, so `mask` is then [.., S, C + S]; `return_kv=True` also returns this call's
  own (k, v) [B, S, K, Dh] after RoPE (used by Dream's block-wise KV cache).
  param_dtype: storage dtype of the weights (float32 default).
  fast_grad: `Linear.fast_grad` for the two projections (a CPU target only: `layout.cpu_tuning`).
  head_major: `dot_product_attention`'s head-major copies (a CPU target only); the gradient of
    q|k|v is then assembled from dq, dk and dv written out first (`_split_qkv`). The same values
    but for float32 rounding in RoPE's backward pass (in a test 4 of 596k entries, all nearly
    cancelled sums, came out 1-2 bfloat16 ulps apart); TRM-Att's bfloat16 step 7.9% shorter
    (docs/benchmarks.md, "head_major").
  """

  def __init__(self, *, num_heads: int, head_dim: int, num_kv_heads: Optional[int] = None,
               causal: bool = False, qkv_bias: bool = False, out_bias: bool = False,
               dtype: DTypeLike = jnp.bfloat16,
               qkv_w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None, param_dtype: DTypeLike = jnp.float32,
               fast_grad: bool = False, head_major: bool = False):
    super().__init__(name=name)
    self.fast_grad = fast_grad
    self.head_major = head_major
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.num_kv_heads = num_kv_heads or num_heads
    if num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads="
                       f"{self.num_kv_heads}")
    self.causal = causal
    self.qkv_bias = qkv_bias
    self.out_bias = out_bias
    self.dtype = jnp.dtype(dtype)
    self.qkv_w_init = qkv_w_init
    self.out_w_init = out_w_init
    self.param_dtype = jnp.dtype(param_dtype)

  def __call__(self, x: jax.Array, *, rope: Optional[Tuple[jax.Array, jax.Array]] = None,
               mask: Optional[jax.Array] = None,
               kv_context: Optional[Tuple[jax.Array, jax.Array]] = None,
               return_kv: bool = False):                         # [B, S, D] -> [B, S, D]
    B, S, D = x.shape
    H, K, Dh = self.num_heads, self.num_kv_heads, self.head_dim
    qkv = Linear((H + 2 * K) * Dh, with_bias=self.qkv_bias, dtype=self.dtype,
                 w_init=self.qkv_w_init, param_dtype=self.param_dtype,
                 name="qkv_proj", fast_grad=self.fast_grad)(x)   # [B, S, (H+2K) Dh]
    qkv = qkv.reshape(B, S, H + 2 * K, Dh)
    split = _split_qkv if self.head_major else _qkv_parts       # head_major: a CPU target's form
    q, k, v = split(qkv, H, K)                                   # [B, S, H|K, Dh]
    if rope is not None:
      q = apply_rope(q, *rope)
      k = apply_rope(k, *rope)
    k_all, v_all = k, v
    if kv_context is not None:
      k_all = jnp.concatenate([kv_context[0].astype(k.dtype), k], axis=1)  # [B, C + S, K, Dh]
      v_all = jnp.concatenate([kv_context[1].astype(v.dtype), v], axis=1)
    out = dot_product_attention(q, k_all, v_all, mask=mask, causal=self.causal,
                                head_major=self.head_major)      # [B, S, H, Dh]
    out = Linear(D, with_bias=self.out_bias, dtype=self.dtype, w_init=self.out_w_init,
                 param_dtype=self.param_dtype, name="o_proj",
                 fast_grad=self.fast_grad)(out.reshape(B, S, H * Dh))
    return (out, (k, v)) if return_kv else out


def _exp_minus_tree_max(scores: jax.Array) -> jax.Array:
  """exp(scores - the row max) over the last axis, the max taken as a tree of elementwise maxima
  over halves of the row (exact; no gradient flows through it). XLA:CPU's own max over a short last
  axis (TRM-Att's 97 positions) is 3x slower than its sum when reductions stay out of YNNPACK
  (parallel.CPU_DOTS_ONLY)."""
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


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          mask: Optional[jax.Array] = None, causal: bool = False,
                          head_major: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v with grouped KV heads.

  q: [B, Sq, H, Dh]; k, v: [B, Sk, K, Dh]; mask broadcastable to [B, H, Sq, Sk] (True = attend).
  Returns [B, Sq, H, Dh] in q's dtype.

  `head_major` (a CPU target only: TRM's CPU form of the same name, from `layout.cpu_tuning`): q, k
  and v are first copied head-major ([B, K, G, Sq, Dh] and [B, K, Sk, Dh], row-major), so the two
  batched matmuls read their operands in place, and the output is copied back once. XLA:CPU
  otherwise picks the copies itself around each batched matmul and their gradients, which cost more
  at TRM-Att's shapes (B 64, 8 heads of 64, 97 positions): its bfloat16 training step is 6% shorter
  this way (docs/benchmarks.md, "head_major"). The same products, summed in another order; the
  softmax's row max is taken as a tree of elementwise maxima (`_exp_minus_tree_max`: the same
  values). In float32 the row sum divides the value product's [.., Sq, Dh] result instead of the
  [.., Sq, Sk] probabilities (softmax(s) v = (exp(s - max) v) / sum: the same quantity, rounded in
  another order), which makes the backward pass's row reduction one over Dh, not Sk: TRM-Att's
  float32 step was 1.3% and 3.0% shorter in two runs (docs/benchmarks.md, "head_major"). bfloat16 keeps the normalised
  probabilities (cast to bfloat16 for the value product, as without head_major): there the change
  gave nothing and took 6% more scratch. In bfloat16 without a mask (TRM-Att) the backward pass is
  written out (`_head_major_attention`): it keeps the float32 probabilities, takes the softmax's
  gradient as p * (dp - sum(dp * p)), and reads q and the output gradient transposed as [Dh, Sq]
  copies for dk and dv (XLA:CPU runs a batched matmul with a transposed left operand slowly):
  the same gradient, rounded in another order; TRM-Att's bfloat16 step 3.0% shorter in 15% less
  scratch (docs/benchmarks.md, "head_major").
  """
  B, Sq, H, Dh = q.shape
  Sk, K = k.shape[1], k.shape[2]
  G = H // K
  qg = q.reshape(B, Sq, K, G, Dh)                               # head h -> (h // G, h % G)
  if causal:
    causal_mask = jnp.tril(jnp.ones((Sq, Sk), bool), k=Sk - Sq)
    mask = causal_mask if mask is None else jnp.logical_and(mask, causal_mask)
  if mask is not None:
    mask = jnp.broadcast_to(mask, (B, H, Sq, Sk)).reshape(B, K, G, Sq, Sk)
  if head_major:
    qh = _row_major(jnp.transpose(qg, (0, 2, 3, 1, 4)))          # [B, K, G, Sq, Dh]
    kh = _row_major(jnp.transpose(k, (0, 2, 1, 3)))              # [B, K, Sk, Dh]
    vh = _row_major(jnp.transpose(v, (0, 2, 1, 3)))              # [B, K, Sk, Dh]
    if q.dtype != jnp.float32:                                   # [B, K, G, Sq, Dh] float32:
      out = (_head_major_attention(qh, kh, vh) if mask is None   # TRM-Att's, written-out backward
             else _head_major_bf16_forward(qh, kh, vh, mask)[0])
      out = jnp.transpose(out.astype(q.dtype), (0, 3, 1, 2, 4))  # [B, Sq, K, G, Dh]
      return out.reshape(B, Sq, H, Dh)
    scores = jnp.einsum("bkgqd,bksd->bkgqs", qh, kh,
                        preferred_element_type=jnp.float32) * (1.0 / math.sqrt(Dh))
  else:
    scores = einsum("bqkgd,bskd->bkgqs", qg, k, q.dtype) * (1.0 / math.sqrt(Dh))  # [B, K, G, Sq, Sk]
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  if head_major:                                                 # float32
    e = _exp_minus_tree_max(scores)                              # [B, K, G, Sq, Sk]
    out = jnp.einsum("bkgqs,bksd->bkgqd", e, vh, preferred_element_type=jnp.float32)
    out = out / jnp.sum(e, axis=-1, keepdims=True)               # [B, K, G, Sq, Dh]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, Sq, H, Dh)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = einsum("bkgqs,bskd->bqkgd", probs, v, q.dtype)          # [B, Sq, K, G, Dh] float32
  return out.reshape(B, Sq, H, Dh).astype(q.dtype)


def count_params(params: hk.Params) -> int:
  """Total number of scalars in a parameter tree."""
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


# --------------------------------------------------------------------------------------------------
# GPT (nanoGPT) layers: LayerNorm with an optional bias, the exact-GELU MLP, dropout, and causal
# self-attention with dropout and a fixed-slot KV cache for sampling.

def dropout(x: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
  """Inverted dropout: zeroes each element with probability `rate`, scales the rest by 1/(1-rate)."""
  if rate <= 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype)).astype(x.dtype)


class LayerNorm(hk.Module):
  """LayerNorm over the last axis with a weight and an optional bias (nanoGPT's `bias` flag).

  Fields:
    with_bias: adds the `bias` parameter (zeros); False = no bias at all (nanoGPT's default).
    eps: 1e-5 (PyTorch's default).
  Computed in float32, returned in x's dtype. Parameters: `weight` [D] (ones), `bias` [D] (zeros).
  """

  def __init__(self, *, with_bias: bool = True, eps: float = 1e-5, name: Optional[str] = None):
    super().__init__(name=name)
    self.with_bias = with_bias
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., D]
    D = x.shape[-1]
    weight = hk.get_parameter("weight", [D], jnp.float32, init=jnp.ones)
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * weight
    if self.with_bias:
      y = y + hk.get_parameter("bias", [D], jnp.float32, init=jnp.zeros)
    return y.astype(x.dtype)


def gelu_exact(x: jax.Array) -> jax.Array:
  """x * 0.5 * (1 + erf(x / sqrt(2))): the exact GELU in PyTorch's formula.

  `jax.nn.gelu(approximate=False)` computes the same function through erfc, which XLA CPU evaluates
  ~3x slower; the two agree to 1.2e-6 (both within that of torch's GELU on [-12, 12]).
  A bfloat16 x is computed in float32 and rounded once, as torch's GELU does on a bfloat16 tensor.
  """
  x32 = x.astype(jnp.float32)
  return (x32 * 0.5 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0))))).astype(x.dtype)


def gelu_tanh(x: jax.Array) -> jax.Array:
  """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): GPT-2's "gelu_new" (torch's
  approximate="tanh"), computed in float32 and rounded once as `gelu_exact`."""
  return jax.nn.gelu(x.astype(jnp.float32), approximate=True).astype(x.dtype)


class GeluMLP(hk.Module):
  """c_proj(gelu(c_fc(x))) with the exact (erf) GELU (or GPT-2's tanh form with
  `approximate`) and dropout after c_proj (GPT's MLP).

  Fields:
    expansion: F = expansion * D (4 in GPT).  with_bias: biases on both projections.
    approximate: the tanh GELU (`gelu_tanh`) instead of the exact one.
    dropout_rate: applied to the output when called with `is_training=True`.
    dtype: compute dtype.  w_init / out_w_init: initialisers of c_fc / c_proj.
    fast_grad: `Linear.fast_grad` for both projections.
    matmul_dtype: the projections' operand dtype when it differs from `dtype` (bfloat16 matmuls
      with float32 activations: GPT's activations="float32"); default `dtype`.
  Parameters: `c_fc/w` [D, F], `c_proj/w` [F, D] (+ `b`).
  """

  def __init__(self, *, expansion: int = 4, with_bias: bool = True, dropout_rate: float = 0.0,
               dtype: DTypeLike = jnp.float32,
               w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None, fast_grad: bool = False,
               matmul_dtype: Optional[DTypeLike] = None, approximate: bool = False):
    super().__init__(name=name)
    self.fast_grad = fast_grad
    self.matmul_dtype = jnp.dtype(matmul_dtype or dtype)
    self.approximate = approximate
    self.expansion = expansion
    self.with_bias = with_bias
    self.dropout_rate = float(dropout_rate)
    self.dtype = jnp.dtype(dtype)
    self.w_init = w_init
    self.out_w_init = out_w_init

  def __call__(self, x: jax.Array, *, is_training: bool = False) -> jax.Array:  # [..., D]
    shape, D = x.shape, x.shape[-1]
    x = x.reshape(-1, D)                                         # [N, D]: see CausalSelfAttention
    h = Linear(self.expansion * D, with_bias=self.with_bias, dtype=self.matmul_dtype,
               output_dtype=self.dtype, w_init=self.w_init, name="c_fc",
               fast_grad=self.fast_grad)(x)                      # [N, F]
    h = gelu_tanh(h) if self.approximate else gelu_exact(h)
    y = Linear(D, with_bias=self.with_bias, dtype=self.matmul_dtype, output_dtype=self.dtype,
               w_init=self.out_w_init, name="c_proj",
               fast_grad=self.fast_grad)(h).reshape(shape)      # [..., D]
    if is_training and self.dropout_rate > 0:
      y = dropout(y, self.dropout_rate, hk.next_rng_key())
    return y


def init_kv_cache(batch: int, slots: int, num_heads: int, head_dim: int,
                  dtype: DTypeLike = jnp.float32) -> Tuple[jax.Array, jax.Array]:
  """An empty (zero) KV cache (k, v), each [B, C, H, Dh], for `CausalSelfAttention`."""
  shape = (batch, slots, num_heads, head_dim)
  return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


class CausalSelfAttention(hk.Module):
  """GPT's causal self-attention: fused q|k|v projection, scale 1/sqrt(Dh), dropout, KV cache.

  The parameter layout is `Attention`'s (`qkv_proj/w` [D, 3 H Dh] ordered q | k | v, head-major;
  `o_proj/w` [H Dh, D]; `b` with `with_bias`), which is also nanoGPT's `c_attn` / `c_proj` transposed.
  Fields:
    num_heads: H.  head_dim: Dh.  with_bias: biases on both projections.
    dropout_rate: on the attention probabilities and after the output projection (`is_training`).
    dtype: compute dtype (scores and softmax in float32).  qkv_w_init / out_w_init: initialisers.
    fast_grad: `Linear.fast_grad` for both projections.
    matmul_dtype: operand dtype of the two projections when it differs from `dtype` (see
      GeluMLP); default `dtype`.
  Without a cache, query s attends to keys <= s. With `kv_cache=(k, v)` ([B, C, H, Dh], C slots,
  `init_kv_cache`) and `cache_index` (int scalar: the position of the first of the S new tokens),
  the new keys/values are written into slots [cache_index, cache_index + S), query i attends to
  slots <= cache_index + i, and the call returns `(out, (k, v))` with the updated cache.
  """

  def __init__(self, *, num_heads: int, head_dim: int, with_bias: bool = True,
               dropout_rate: float = 0.0, dtype: DTypeLike = jnp.float32,
               qkv_w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None, fast_grad: bool = False,
               matmul_dtype: Optional[DTypeLike] = None):
    super().__init__(name=name)
    self.fast_grad = fast_grad
    self.matmul_dtype = jnp.dtype(matmul_dtype or dtype)
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.with_bias = with_bias
    self.dropout_rate = float(dropout_rate)
    self.dtype = jnp.dtype(dtype)
    self.qkv_w_init = qkv_w_init
    self.out_w_init = out_w_init

  def __call__(self, x: jax.Array, *, is_training: bool = False,
               kv_cache: Optional[Tuple[jax.Array, jax.Array]] = None,
               cache_index: Optional[jax.Array] = None):         # [B, S, D] -> [B, S, D]
    B, S, D = x.shape
    H, Dh = self.num_heads, self.head_dim
    drop = is_training and self.dropout_rate > 0
    # The projections run on [B S, D] rows: XLA CPU differentiates 2-D matmuls much faster.
    mm = self.matmul_dtype
    qkv = Linear(3 * H * Dh, with_bias=self.with_bias, dtype=mm, output_dtype=self.dtype,
                 w_init=self.qkv_w_init, name="qkv_proj", fast_grad=self.fast_grad)(
                     x.reshape(B * S, D)).reshape(B, S, 3, H, Dh)   # [B, S, 3, H, Dh]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]           # [B, S, H, Dh]
    if kv_cache is None:
      mask = jnp.tril(jnp.ones((S, S), bool))                    # [S, S]
    else:
      start = jnp.asarray(cache_index, jnp.int32)
      k = jax.lax.dynamic_update_slice(kv_cache[0], k.astype(kv_cache[0].dtype), (0, start, 0, 0))
      v = jax.lax.dynamic_update_slice(kv_cache[1], v.astype(kv_cache[1].dtype), (0, start, 0, 0))
      kv_cache = (k, v)                                          # [B, C, H, Dh]
      mask = jnp.arange(k.shape[1])[None, :] <= start + jnp.arange(S)[:, None]   # [S, C]
    # The two attention products take `dtype` operands with float32 accumulation, the softmax is
    # float32: torch's scaled_dot_product_attention under autocast (GPT's "autocast" activations).
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k.astype(q.dtype),
                        preferred_element_type=jnp.float32) * (1.0 / math.sqrt(Dh))  # [B, H, S, C]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    if drop:
      probs = dropout(probs, self.dropout_rate, hk.next_rng_key())
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.dtype), v.astype(self.dtype),
                     preferred_element_type=jnp.float32).astype(self.dtype)  # [B, S, H, Dh]
    out = Linear(D, with_bias=self.with_bias, dtype=mm, output_dtype=self.dtype,
                 w_init=self.out_w_init, name="o_proj", fast_grad=self.fast_grad)(
                     out.reshape(B * S, H * Dh)).reshape(B, S, D)   # [B, S, D]
    if drop:
      out = dropout(out, self.dropout_rate, hk.next_rng_key())
    return out if kv_cache is None else (out, kv_cache)
