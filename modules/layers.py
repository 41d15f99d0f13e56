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
import jax.numpy as jnp
import numpy as np

from modules import kernels as kernels_lib
from modules import numerics
from modules.kernels import dispatch

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


def _is_low_precision(dtype: DTypeLike) -> bool:
  return jnp.dtype(dtype) != jnp.float32


class Linear(hk.Module):
  """y = x @ w (+ b) with float32 parameters cast to `dtype` at use.

  Fields:
    output_size: number of output features.
    with_bias: adds a bias (initialised by `b_init`, zeros by default).
    dtype: compute dtype; the input and the weights are cast to it, the matmul accumulates in float32.
    w_init: weight initialiser, default: the corrected truncated normal with std 1/sqrt(fan_in).
    param_dtype: storage dtype of the parameters (float32 default; bfloat16 for Dream checkpoints).
    output_dtype: dtype of the result (and of the bias add); default `dtype`. float32 with a
      bfloat16 `dtype` = torch-autocast style: bfloat16 matmul operands, float32 activations.
    feature_major: the input is [D, N] (features on the rows) and the result [output_size, N]
      (`wt_matmul`); the same parameters and products as the default [N, D] -> [N, output_size].
    kernels: "default" | "xla_cpu" (modules/kernels/dispatch.py: the products' forms).
  Parameters: `w` [D, output_size], `b` [output_size] (float32).
  """

  def __init__(self, output_size: int, *, with_bias: bool = False, dtype: DTypeLike = jnp.bfloat16,
               w_init: Optional[hk.initializers.Initializer] = None,
               b_init: Optional[hk.initializers.Initializer] = None, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32, output_dtype: Optional[DTypeLike] = None,
               feature_major: bool = False, kernels: str = "default"):
    super().__init__(name=name)
    self.kernels = kernels_lib.check(kernels)
    self.feature_major = feature_major
    self.output_dtype = jnp.dtype(output_dtype or dtype)
    self.output_size = output_size
    self.with_bias = with_bias
    self.dtype = jnp.dtype(dtype)
    self.w_init = w_init
    self.b_init = b_init or jnp.zeros
    self.param_dtype = jnp.dtype(param_dtype)

  def weight(self, fan_in: int) -> jax.Array:
    """The parameter `w` [fan_in, output_size] (created at init), for a caller that computes the
    projection itself (`SwiGLU` with xla_cpu's split_gate_up)."""
    return hk.get_parameter("w", [fan_in, self.output_size], self.param_dtype,
                            init=self.w_init or fan_in_init(fan_in))

  def bias(self) -> jax.Array:
    """The parameter `b` [output_size] (with_bias; created at init), for a caller that computes the
    projection itself."""
    return hk.get_parameter("b", [self.output_size], self.param_dtype, init=self.b_init)

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., output_size]
    fan_in = x.shape[0] if self.feature_major else x.shape[-1]
    w = self.weight(fan_in)
    ops = dispatch.ops(self.kernels, self.dtype)
    if self.feature_major:                                       # [D, N] -> [output_size, N]
      y = ops.wt_matmul(w, x)
    else:                                                        # [..., D] -> [..., output_size]
      y = ops.projection(x, w)
    if self.with_bias:
      b = self.bias().astype(self.output_dtype)
      y = y.astype(self.output_dtype) + (b[:, None] if self.feature_major else b)
    return y.astype(self.output_dtype)


ONE_HOT_MAX_VOCAB = 1024
"""`Embed`'s automatic lookup is a one-hot matmul for vocabularies up to this size (TRM's 11-12
tokens, shakespeare_char's 65) and a gather above it (GPT-2's 50,257, Dream's 151,936). A gather's
gradient is a scatter-add of every token's row into the table, which an accelerator serialises on
rows that collide: at TRM's 11 tokens every row does (the bfloat16 Sudoku step on an H200: 36% of
the step in that one scatter). The one-hot lookup's forward pass is still the gather (the
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
      (`jnp.take`: the gradient is a scatter-add). The same vectors; the table gradients are the
      same sums in another order.
    kernels: "default" | "xla_cpu" (modules/kernels/dispatch.py: "auto" becomes the kernels'
      `embed_lookup`; the tied head `attend` their `matmul`).
  """

  def __init__(self, vocab_size: int, embed_dim: int, *, init_std: float = 1.0,
               w_init: Optional[hk.initializers.Initializer] = None,
               dtype: DTypeLike = jnp.bfloat16, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32, lookup: str = "auto",
               kernels: str = "default"):
    super().__init__(name=name)
    self.kernels = kernels_lib.check(kernels)
    if lookup == "auto":
      lookup = dispatch.ops(kernels, dtype).embed_lookup
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

  def attend(self, x: jax.Array, *,
             matmul_dtype: Optional[DTypeLike] = None) -> jax.Array:  # [..., D] -> [..., V] (tied)
    """x @ embeddings^T in `dtype`; `matmul_dtype` (default `dtype`) as in `matmul`."""
    ops = dispatch.ops(self.kernels, matmul_dtype or self.dtype)
    y = ops.matmul(x.reshape(-1, x.shape[-1]), self.embeddings, w_transposed=True)
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


silu = numerics.silu
to_precision = numerics.to_precision
swiglu_activation = numerics.swiglu_activation


class SwiGLU(hk.Module):
  """down(silu(gate) * up) with a fused gate|up projection (no biases).

  Fields:
    expansion: sets F by `swiglu_width(D, expansion)` (ignored when `inner_size` is set).
    inner_size: explicit F (e.g. 18944 for Dream).
    dtype: compute dtype.
    param_dtype: storage dtype of the weights (float32 default).
    feature_major: x is [D, N] and so is the result (`Linear.feature_major`); same parameters.
    kernels: "default" | "xla_cpu" (modules/kernels/dispatch.py: the projections' and the
      activation's forms; the same values and parameters).
    mlp: "xla" | "pallas": "pallas" computes the whole MLP in one TPU kernel per block of rows
      (modules/kernels/fused_mlp.py; the same products and roundings).
  Parameters: `gate_up_proj/w` [D, 2F] (first half gate, second half up), `down_proj/w` [F, D].
  """

  def __init__(self, *, expansion: float = 4.0, inner_size: Optional[int] = None,
               dtype: DTypeLike = jnp.bfloat16, name: Optional[str] = None,
               param_dtype: DTypeLike = jnp.float32, feature_major: bool = False,
               kernels: str = "default", mlp: str = "xla"):
    super().__init__(name=name)
    self.kernels = kernels_lib.check(kernels)
    self.mlp = dispatch.check_mlp(mlp)
    self.feature_major = feature_major
    self.expansion = expansion
    self.inner_size = inner_size
    self.dtype = jnp.dtype(dtype)
    self.param_dtype = jnp.dtype(param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., D]
    axis = 0 if self.feature_major else -1                       # feature_major: [D, N] -> [D, N]
    width = x.shape[axis]
    inner = self.inner_size or swiglu_width(width, self.expansion)
    linear = functools.partial(Linear, dtype=self.dtype, param_dtype=self.param_dtype,
                               feature_major=self.feature_major, kernels=self.kernels)
    gate_up_proj = linear(2 * inner, name="gate_up_proj")
    ops = dispatch.ops(self.kernels, self.dtype, mlp=self.mlp)
    if ops.fused_mlp is not None and not self.feature_major:     # one kernel, rows [N, D]
      down_proj = linear(width, name="down_proj")
      rows = x.reshape(-1, width)
      y = ops.fused_mlp(rows, gate_up_proj.weight(width), down_proj.weight(inner))
      return y.reshape(x.shape).astype(self.dtype)
    if ops.gate_up_swiglu is not None and (x.ndim == 2 or not self.feature_major):
      w = gate_up_proj.weight(width)                             # [D, 2F]
      rows = x if self.feature_major else x.reshape(-1, width)   # [D, N] or [N, D]
      with jax.named_scope("gate_up_proj"):                     # profiles name it as Linear's
        h = ops.gate_up_swiglu(rows, w, feature_major=self.feature_major)
      h = h if self.feature_major else h.reshape(x.shape[:-1] + (inner,))   # [..., F] (or [F, N])
    else:
      gate_up = gate_up_proj(x)                                  # [..., 2F] (or [2F, N])
      h = ops.swiglu(gate_up, axis=axis)                         # [..., F] (or [F, N])
    return linear(width, name="down_proj")(h)


class Attention(hk.Module):
  """Multi-head attention with a fused q|k|v projection, optional grouped KV heads and RoPE.

  Fields:
    num_heads: H query heads.  head_dim: Dh.  num_kv_heads: K (default H); query head h uses KV head
      h // (H // K).
    causal: adds a lower-triangular mask (TRM and Dream are non-causal, GPT is causal).
    qkv_bias / out_bias: biases on the fused projection / the output projection.
    dtype: compute dtype. Scores and softmax are float32; probabilities are cast to `dtype` for the
      value product.
    param_dtype: storage dtype of the weights (float32 default).
    kernels: "default" | "xla_cpu" (modules/kernels/dispatch.py: XLA:CPU's head-major attention
      and projections).
    attention: "xla" | "splash" | "cudnn": the attention kernel (modules/kernels/dispatch.py; a
      kernel that cannot take the call's mask leaves it to "xla").
  Parameters: `qkv_proj/w` [D, (H + 2K) Dh] ordered q | k | v, head-major within each; `o_proj/w`
  [H Dh, D].
  Masks: `mask` is boolean and broadcastable to [B, H, S, S] (True = attend). A query row with nothing
  to attend to gets uniform weights, never NaN.
  Cached keys (optional): `kv_context=(k, v)` [B, C, K, Dh] (RoPE already applied) are placed BEFORE
  this call's own S keys, so `mask` is then [.., S, C + S]; `return_kv=True` also returns this call's
  own (k, v) [B, S, K, Dh] after RoPE (used by Dream's block-wise KV cache).
  """

  def __init__(self, *, num_heads: int, head_dim: int, num_kv_heads: Optional[int] = None,
               causal: bool = False, qkv_bias: bool = False, out_bias: bool = False,
               dtype: DTypeLike = jnp.bfloat16,
               qkv_w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None, param_dtype: DTypeLike = jnp.float32,
               kernels: str = "default", attention: str = "xla"):
    super().__init__(name=name)
    self.kernels = kernels_lib.check(kernels)
    self.attention = dispatch.check_attention(attention)
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
    linear = functools.partial(Linear, dtype=self.dtype, param_dtype=self.param_dtype,
                               kernels=self.kernels)
    qkv = linear((H + 2 * K) * Dh, with_bias=self.qkv_bias, w_init=self.qkv_w_init,
                 name="qkv_proj")(x)                             # [B, S, (H+2K) Dh]
    qkv = qkv.reshape(B, S, H + 2 * K, Dh)
    ops = dispatch.ops(self.kernels, self.dtype, self.attention)
    q, k, v = ops.split_qkv(qkv, H, K)                           # [B, S, H|K, Dh]
    if rope is not None:
      q = apply_rope(q, *rope)
      k = apply_rope(k, *rope)
    k_all, v_all = k, v
    if kv_context is not None:
      k_all = jnp.concatenate([kv_context[0].astype(k.dtype), k], axis=1)  # [B, C + S, K, Dh]
      v_all = jnp.concatenate([kv_context[1].astype(v.dtype), v], axis=1)
    out = ops.attention(q, k_all, v_all, mask=mask, causal=self.causal)   # [B, S, H, Dh]
    out = linear(D, with_bias=self.out_bias, w_init=self.out_w_init,
                 name="o_proj")(out.reshape(B, S, H * Dh))
    return (out, (k, v)) if return_kv else out


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          mask: Optional[jax.Array] = None, causal: bool = False,
                          kernels: str = "default", attention: str = "xla") -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v with grouped KV heads (`dispatch.Ops.attention`): q [B, Sq, H, Dh],
  k, v [B, Sk, K, Dh], mask broadcastable to [B, H, Sq, Sk] (True = attend) -> [B, Sq, H, Dh] in
  q's dtype; `dtype` operands with float32 accumulation, the softmax in float32."""
  return dispatch.ops(kernels, q.dtype, attention).attention(q, k, v, mask=mask, causal=causal)


def count_params(params: hk.Params) -> int:
  """Total number of scalars in a parameter tree."""
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
