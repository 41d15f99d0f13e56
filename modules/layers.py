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

import math
from typing import Optional, Tuple

import haiku as hk
import jax
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


class Linear(hk.Module):
  """y = x @ w (+ b) with float32 parameters cast to `dtype` at use.

  Fields:
    output_size: number of output features.
    with_bias: adds a bias (initialised by `b_init`, zeros by default).
    dtype: compute dtype; the input and the weights are cast to it, the matmul accumulates in float32.
    w_init: weight initialiser, default: the corrected truncated normal with std 1/sqrt(fan_in).
  Parameters: `w` [D, output_size], `b` [output_size] (float32).
  """

  def __init__(self, output_size: int, *, with_bias: bool = False, dtype: DTypeLike = jnp.bfloat16,
               w_init: Optional[hk.initializers.Initializer] = None,
               b_init: Optional[hk.initializers.Initializer] = None, name: Optional[str] = None):
    super().__init__(name=name)
    self.output_size = output_size
    self.with_bias = with_bias
    self.dtype = jnp.dtype(dtype)
    self.w_init = w_init
    self.b_init = b_init or jnp.zeros

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., output_size]
    fan_in = x.shape[-1]
    w = hk.get_parameter("w", [fan_in, self.output_size], jnp.float32,
                         init=self.w_init or fan_in_init(fan_in))
    y = jnp.dot(x.astype(self.dtype), w.astype(self.dtype), preferred_element_type=jnp.float32)
    if self.with_bias:
      b = hk.get_parameter("b", [self.output_size], jnp.float32, init=self.b_init)
      y = y.astype(self.dtype) + b.astype(self.dtype)
    return y.astype(self.dtype)


class Embed(hk.Module):
  """Token embedding with a float32 table cast to `dtype` at lookup.

  Fields:
    vocab_size, embed_dim: the table is `embedding` [V, D] float32.
    init_std: std of the corrected truncated-normal init (e.g. 1/sqrt(D) for TRM).
    w_init: overrides the init (e.g. a plain normal for GPT).
    dtype: compute dtype of the returned vectors.
  """

  def __init__(self, vocab_size: int, embed_dim: int, *, init_std: float = 1.0,
               w_init: Optional[hk.initializers.Initializer] = None,
               dtype: DTypeLike = jnp.bfloat16, name: Optional[str] = None):
    super().__init__(name=name)
    self.vocab_size = vocab_size
    self.embed_dim = embed_dim
    self.w_init = w_init or TruncatedNormal(init_std)
    self.dtype = jnp.dtype(dtype)

  @property
  def embeddings(self) -> jax.Array:                             # [V, D] float32
    return hk.get_parameter("embedding", [self.vocab_size, self.embed_dim], jnp.float32,
                            init=self.w_init)

  def __call__(self, ids: jax.Array) -> jax.Array:              # [...] int -> [..., D]
    return jnp.take(self.embeddings.astype(self.dtype), ids, axis=0)

  def attend(self, x: jax.Array) -> jax.Array:                  # [..., D] -> [..., V] (tied output head)
    w = self.embeddings.astype(self.dtype)
    return jnp.dot(x.astype(self.dtype), w.T, preferred_element_type=jnp.float32).astype(self.dtype)


def rms_norm(x: jax.Array, *, axis: int = -1, eps: float = 1e-5) -> jax.Array:
  """RMSNorm without a learnable scale, computed in float32 over `axis`, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  variance = jnp.mean(jnp.square(x32), axis=axis, keepdims=True)
  return (x32 * jax.lax.rsqrt(variance + eps)).astype(x.dtype)


class RMSNorm(hk.Module):
  """RMSNorm with a learnable weight (Dream/Qwen style).

  Normalises in float32, casts back to x's dtype, then multiplies by the weight cast to that dtype.
  Parameter: `weight` [D] float32, initialised to ones.
  """

  def __init__(self, *, eps: float = 1e-6, axis: int = -1, name: Optional[str] = None):
    super().__init__(name=name)
    self.eps = eps
    self.axis = axis

  def __call__(self, x: jax.Array) -> jax.Array:
    weight = hk.get_parameter("weight", [x.shape[self.axis]], jnp.float32, init=jnp.ones)
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


class SwiGLU(hk.Module):
  """down(silu(gate) * up) with a fused gate|up projection (no biases).

  Fields:
    expansion: sets the inner width F by `swiglu_width(D, expansion)` (ignored when `inner_size` is set).
    inner_size: explicit F (e.g. 18944 for Dream).
    dtype: compute dtype.
  Parameters: `gate_up_proj/w` [D, 2F] (first half gate, second half up), `down_proj/w` [F, D].
  """

  def __init__(self, *, expansion: float = 4.0, inner_size: Optional[int] = None,
               dtype: DTypeLike = jnp.bfloat16, name: Optional[str] = None):
    super().__init__(name=name)
    self.expansion = expansion
    self.inner_size = inner_size
    self.dtype = jnp.dtype(dtype)

  def __call__(self, x: jax.Array) -> jax.Array:                # [..., D] -> [..., D]
    width = x.shape[-1]
    inner = self.inner_size or swiglu_width(width, self.expansion)
    gate_up = Linear(2 * inner, dtype=self.dtype, name="gate_up_proj")(x)   # [..., 2F]
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return Linear(width, dtype=self.dtype, name="down_proj")(jax.nn.silu(gate) * up)


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
  """

  def __init__(self, *, num_heads: int, head_dim: int, num_kv_heads: Optional[int] = None,
               causal: bool = False, qkv_bias: bool = False, out_bias: bool = False,
               dtype: DTypeLike = jnp.bfloat16,
               qkv_w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None):
    super().__init__(name=name)
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

  def __call__(self, x: jax.Array, *, rope: Optional[Tuple[jax.Array, jax.Array]] = None,
               mask: Optional[jax.Array] = None) -> jax.Array:  # [B, S, D] -> [B, S, D]
    B, S, D = x.shape
    H, K, Dh = self.num_heads, self.num_kv_heads, self.head_dim
    qkv = Linear((H + 2 * K) * Dh, with_bias=self.qkv_bias, dtype=self.dtype,
                 w_init=self.qkv_w_init, name="qkv_proj")(x)     # [B, S, (H+2K) Dh]
    qkv = qkv.reshape(B, S, H + 2 * K, Dh)
    q, k, v = qkv[:, :, :H], qkv[:, :, H:H + K], qkv[:, :, H + K:]  # [B, S, H|K, Dh]
    if rope is not None:
      q = apply_rope(q, *rope)
      k = apply_rope(k, *rope)
    out = dot_product_attention(q, k, v, mask=mask, causal=self.causal)  # [B, S, H, Dh]
    return Linear(D, with_bias=self.out_bias, dtype=self.dtype, w_init=self.out_w_init,
                  name="o_proj")(out.reshape(B, S, H * Dh))


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          mask: Optional[jax.Array] = None, causal: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(Dh)) v with grouped KV heads.

  q: [B, Sq, H, Dh]; k, v: [B, Sk, K, Dh]; mask broadcastable to [B, H, Sq, Sk] (True = attend).
  Returns [B, Sq, H, Dh] in q's dtype.
  """
  B, Sq, H, Dh = q.shape
  Sk, K = k.shape[1], k.shape[2]
  G = H // K
  qg = q.reshape(B, Sq, K, G, Dh)                               # head h -> (h // G, h % G)
  scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k,
                      preferred_element_type=jnp.float32) * (1.0 / math.sqrt(Dh))  # [B, K, G, Sq, Sk]
  if causal:
    causal_mask = jnp.tril(jnp.ones((Sq, Sk), bool), k=Sk - Sq)
    mask = causal_mask if mask is None else jnp.logical_and(mask, causal_mask)
  if mask is not None:
    mask = jnp.broadcast_to(mask, (B, H, Sq, Sk)).reshape(B, K, G, Sq, Sk)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v, preferred_element_type=jnp.float32)
  return out.reshape(B, Sq, H, Dh).astype(q.dtype)


def count_params(params: hk.Params) -> int:
  """Total number of scalars in a parameter tree."""
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
