"""GPT (nanoGPT) in Haiku: pre-LN blocks, causal attention, tied output head; its own layers
(LayerNorm, GeluMLP, CausalSelfAttention, dropout: nanoGPT's model.py) on the shared `layers.Linear`
and `layers.Embed`.

The model of `docs/nanogpt.md`: token + learned position embeddings, dropout, n_layer
blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), a final ln_f and logits = h @ wte^T (the head IS
the token embedding). LayerNorm eps 1e-5 with or without biases (`bias`), exact GELU (`gelu`="tanh":
GPT-2's form), dropout on the embedding sum, the attention probabilities and after both residual
projections. Init: every linear and embedding weight N(0, 0.02), biases 0, LayerNorm weights 1, the
two residual output projections N(0, 0.02 / sqrt(2 n_layer)). Sampling uses an optional fixed-slot
KV cache.

Shape glossary:
  B: batch   T: sequence length (<= block_size)   C: n_embd   H: n_head   Dh = C // H
  V: vocab_size   L: n_layer   S: KV-cache slots (block_size)

Parameter names (nanoGPT's in brackets): wte/embedding [transformer.wte.weight],
wpe/embedding [transformer.wpe.weight], h_<i>/ln_1/{weight,bias}, h_<i>/attn/qkv_proj/{w,b}
[c_attn, transposed], h_<i>/attn/o_proj/{w,b} [attn.c_proj], h_<i>/ln_2, h_<i>/mlp/c_fc/{w,b},
h_<i>/mlp/c_proj/{w,b}, ln_f/{weight,bias}.

Synopsis:

  import jax, jax.numpy as jnp
  from modules import gpt
  cfg = gpt.GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, bias=False)
  model = gpt.GPTModel(cfg)
  params = model.init(jax.random.key(0))
  idx = jnp.zeros((2, 64), jnp.int32)                            # [B, T]
  logits = model.apply(params, idx)                              # [B, T, V] float32
  loss = gpt.cross_entropy(logits, idx)                          # mean over B * T
  print(gpt.num_params(params, cfg))                             # 795,904 (wpe not counted)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, List, Optional, Tuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from modules import kernels as kernels_lib
from modules import layers
from modules import numerics
from modules.kernels import dispatch

INIT_STD = 0.02


GELUS = ("exact", "tanh")
"""GPTConfig.gelu: "exact" (erf; nanoGPT's, the default) or "tanh" (GPT-2's "gelu_new", what an
OpenAI GPT-2 folder's config.json names; experiments/nanogpt/hf_gpt2.py)."""

ACTIVATIONS = ("autocast", "float32")
"""GPTConfig.activations, the dtypes of a "bfloat16" model's activations (float32 models: float32):
  "autocast" (default; nanoGPT's GPU runs, torch.autocast's rules): every Linear's output, the
    attention (bfloat16 q, k, v and output; float32 scores and softmax, as
    scaled_dot_product_attention), the GELU (float32 inside, rounded once) and the logits in
    bfloat16; the embeddings, LayerNorm, the residual stream and the loss in float32.
  "float32" (a podlab option): only the matmul operands are
    bfloat16; every activation, the attention's operands and the logits are float32. Closer to a
    float32 run, further from nanoGPT's bfloat16 run (docs/nanogpt.md section 8, row "model.activations")."""


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """nanoGPT's model_args (+ the compute dtype).

  Fields: block_size (max T), vocab_size, n_layer, n_head, n_embd (divisible by n_head), dropout
  (probability, 0 = off), bias (LayerNorm and Linear biases), dtype (matmul dtype: "float32" is the
  reference's CPU run; "bfloat16" is nanoGPT's GPU run under torch.autocast: bfloat16 matmul operands
  with float32 accumulation), activations (with "bfloat16" only; see ACTIVATIONS), gelu ("exact" or
  GPT-2's "tanh"; see GELUS), kernels ("default" | "xla_cpu": modules/kernels; the trainer picks
  "xla_cpu" for a CPU target, `layout.cpu_tuning`), remat (recompute each block's activations in the
  backward pass instead of storing them: the same numbers, about a third more compute, the
  activations of one block instead of n_layer in memory; what lets GPT-2 XL finetuning fit a v5e-8
  under fsdp, docs/sharding.md. Not in the reference (an implementation choice with no effect on
  results); off by default. Training forward passes only), attention ("xla" | "splash" | "cudnn":
  the training forward's attention kernel, modules/kernels/dispatch.py; the trainer picks it for
  the target platform: splash on a TPU, cudnn on a GPU, xla on a CPU. "xla" is the reference's
  formulation; a kernel gives the same function with the sum over keys blocked (float32 rounding;
  bfloat16: the probabilities stay float32 for the value product). Dropout on the probabilities
  and the sampler's KV cache always run "xla"), loss ("xla" | "pallas": the head and the loss of
  `GPTModel.loss`; "xla" writes the [B, T, V] logits, "pallas" computes the same function in one
  TPU kernel without them, modules/kernels/fused_ce.py; the trainer picks "pallas" for a TPU).
  """
  block_size: int = 1024
  vocab_size: int = 50304
  n_layer: int = 12
  n_head: int = 12
  n_embd: int = 768
  dropout: float = 0.0
  bias: bool = True
  dtype: str = "float32"
  activations: str = "autocast"
  gelu: str = "exact"
  kernels: str = "default"
  remat: bool = False
  attention: str = "xla"
  loss: str = "xla"

  def __post_init__(self):
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"model.{name}={value!r}: must be a positive integer. Fix: e.g. "
                         f"{getattr(GPTConfig, name)}")
    if self.n_embd % self.n_head:
      raise ValueError(f"model.n_embd={self.n_embd}: must be divisible by n_head={self.n_head}. "
                       f"Fix: use n_embd={self.n_embd // self.n_head * self.n_head or self.n_head}")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"model.dropout={self.dropout}: must be in [0, 1). Fix: use 0.0 or 0.2")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"model.dtype={self.dtype!r}: must be 'float32' or 'bfloat16'. Fix: use "
                       "'float32' (the reference)")
    if self.gelu not in GELUS:
      raise ValueError(f"model.gelu={self.gelu!r}: must be 'exact' or 'tanh'. Fix: use 'exact' "
                       "(nanoGPT's) or 'tanh' (GPT-2's gelu_new)")
    kernels_lib.check(self.kernels, "model.kernels")
    dispatch.check_attention(self.attention, "model.attention")
    dispatch.check_loss(self.loss, "model.loss")
    if self.activations not in ACTIVATIONS:
      raise ValueError(f"model.activations={self.activations!r}: must be one of "
                       f"{', '.join(map(repr, ACTIVATIONS))}. Fix: use 'autocast' (the reference)")

  @property
  def head_dim(self) -> int:
    return self.n_embd // self.n_head

  def model_args(self) -> dict:
    """nanoGPT's `model_args` dict (what its checkpoints store)."""
    return dict(n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                block_size=self.block_size, bias=self.bias, vocab_size=self.vocab_size,
                dropout=self.dropout)


KVCache = List[Tuple[jax.Array, jax.Array]]      # per layer (k, v), each [B, S, H, Dh]


# --------------------------------------------------------------------------------------------------
# GPT's layers (nanoGPT's model.py): LayerNorm with an optional bias, the exact-GELU MLP, dropout, and causal
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
  A bfloat16 x is computed in float32 and rounded once, as torch's GELU does on a bfloat16 tensor;
  its backward pass keeps only x (`numerics.float32_inside`).
  """
  return _gelu_exact(x)


@numerics.float32_inside
def _gelu_exact(x32: jax.Array) -> jax.Array:
  return x32 * 0.5 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0))))


def gelu_tanh(x: jax.Array) -> jax.Array:
  """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): GPT-2's "gelu_new" (torch's
  approximate="tanh"), computed in float32 and rounded once as `gelu_exact`."""
  return _gelu_tanh(x)


@numerics.float32_inside
def _gelu_tanh(x32: jax.Array) -> jax.Array:
  return jax.nn.gelu(x32, approximate=True)


class GeluMLP(hk.Module):
  """c_proj(gelu(c_fc(x))) with the exact (erf) GELU (or GPT-2's tanh form with
  `approximate`) and dropout after c_proj (GPT's MLP).

  Fields:
    expansion: F = expansion * D (4 in GPT).  with_bias: biases on both projections.
    approximate: the tanh GELU (`gelu_tanh`) instead of the exact one.
    dropout_rate: applied to the output when called with `is_training=True`.
    dtype: compute dtype.  w_init / out_w_init: initialisers of c_fc / c_proj.
    kernels: "default" | "xla_cpu" for both projections (`Linear.kernels`).
    matmul_dtype: the projections' operand dtype when it differs from `dtype` (bfloat16 matmuls
      with float32 activations: GPT's activations="float32"); default `dtype`.
  Parameters: `c_fc/w` [D, F], `c_proj/w` [F, D] (+ `b`).
  """

  def __init__(self, *, expansion: int = 4, with_bias: bool = True, dropout_rate: float = 0.0,
               dtype: layers.DTypeLike = jnp.float32,
               w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None, kernels: str = "default",
               matmul_dtype: Optional[layers.DTypeLike] = None, approximate: bool = False):
    super().__init__(name=name)
    self.kernels = kernels_lib.check(kernels)
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
    h = layers.Linear(self.expansion * D, with_bias=self.with_bias, dtype=self.matmul_dtype,
                      output_dtype=self.dtype, w_init=self.w_init, name="c_fc",
                      kernels=self.kernels)(x)                   # [N, F]
    h = gelu_tanh(h) if self.approximate else gelu_exact(h)
    y = layers.Linear(D, with_bias=self.with_bias, dtype=self.matmul_dtype,
                      output_dtype=self.dtype, w_init=self.out_w_init, name="c_proj",
                      kernels=self.kernels)(h).reshape(shape)    # [..., D]
    if is_training and self.dropout_rate > 0:
      y = dropout(y, self.dropout_rate, hk.next_rng_key())
    return y


def init_kv_cache(batch: int, slots: int, num_heads: int, head_dim: int,
                  dtype: layers.DTypeLike = jnp.float32) -> Tuple[jax.Array, jax.Array]:
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
    kernels: "default" | "xla_cpu" for both projections (`Linear.kernels`).
    matmul_dtype: operand dtype of the two projections when it differs from `dtype` (see
      GeluMLP); default `dtype`.
    attention: "xla" | "splash" | "cudnn" (modules/kernels/dispatch.py) for calls without a cache
      or dropout; "xla" (this class's own formulation, torch's math attention under autocast)
      otherwise.
  Without a cache, query s attends to keys <= s. With `kv_cache=(k, v)` ([B, C, H, Dh], C slots,
  `init_kv_cache`) and `cache_index` (int scalar: the position of the first of the S new tokens),
  the new keys/values are written into slots [cache_index, cache_index + S), query i attends to
  slots <= cache_index + i, and the call returns `(out, (k, v))` with the updated cache.
  """

  def __init__(self, *, num_heads: int, head_dim: int, with_bias: bool = True,
               dropout_rate: float = 0.0, dtype: layers.DTypeLike = jnp.float32,
               qkv_w_init: Optional[hk.initializers.Initializer] = None,
               out_w_init: Optional[hk.initializers.Initializer] = None,
               name: Optional[str] = None, kernels: str = "default",
               matmul_dtype: Optional[layers.DTypeLike] = None, attention: str = "xla"):
    super().__init__(name=name)
    self.kernels = kernels_lib.check(kernels)
    self.attention = dispatch.check_attention(attention)
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
    qkv_proj = layers.Linear(3 * H * Dh, with_bias=self.with_bias, dtype=mm,
                             output_dtype=self.dtype, w_init=self.qkv_w_init, name="qkv_proj",
                             kernels=self.kernels)
    ops = dispatch.ops(self.kernels, mm, self.attention)
    if kv_cache is None and ops.attention_used(dropout=self.dropout_rate if drop else 0.0) != "xla":
      return _kernel_attention(self, qkv_proj, ops, x, drop)
    qkv = qkv_proj(x.reshape(B * S, D)).reshape(B, S, 3, H, Dh)   # [B, S, 3, H, Dh]
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
    out = _project_out(self, out, B, S, D, drop)
    return out if kv_cache is None else (out, kv_cache)


def _kernel_attention(attn: CausalSelfAttention, qkv_proj: layers.Linear, ops: dispatch.Ops,
                      x: jax.Array, drop: bool) -> jax.Array:
  """The attention kernel's path (no cache, no dropout on the probabilities): q, k, v projected
  head-major [B, H, S, Dh] straight from the fused weight, the kernel, and o_proj from its
  head-major output: the same parameters and products as the XLA path, without the layout copies
  between them. A function, not a method, so the projections keep their names (attn/qkv_proj)."""
  B, S, D = x.shape
  H, Dh, act = attn.num_heads, attn.head_dim, attn.dtype
  qkv = ops.heads_projection(x, qkv_proj.weight(D), 3, H)        # [3, B, H, S, Dh] float32
  qkv = qkv.astype(act)
  if attn.with_bias:
    qkv = qkv + qkv_proj.bias().astype(act).reshape(3, 1, H, 1, Dh)
  out = ops.attention_heads(qkv[0], qkv[1], qkv[2], causal=True)  # [B, H, S, Dh]
  o_proj = layers.Linear(D, with_bias=attn.with_bias, dtype=attn.matmul_dtype, output_dtype=act,
                         w_init=attn.out_w_init, name="o_proj", kernels=attn.kernels)
  y = ops.heads_out_projection(out.astype(act), o_proj.weight(H * Dh)).astype(act)  # [B, S, D]
  if attn.with_bias:
    y = y + o_proj.bias().astype(act)
  if drop:
    y = dropout(y, attn.dropout_rate, hk.next_rng_key())
  return y


def _project_out(attn: CausalSelfAttention, out: jax.Array, B: int, S: int, D: int,
                 drop: bool) -> jax.Array:
  """o_proj of the heads [B, S, H, Dh] -> [B, S, D], and the residual dropout. A function, not a
  method: Haiku would name the projection within the method ("attn/~_project_out/o_proj")."""
  out = layers.Linear(D, with_bias=attn.with_bias, dtype=attn.matmul_dtype,
                      output_dtype=attn.dtype, w_init=attn.out_w_init, name="o_proj",
                      kernels=attn.kernels)(out.reshape(B * S, -1)).reshape(B, S, D)
  if drop:
    out = dropout(out, attn.dropout_rate, hk.next_rng_key())
  return out


class GPT(hk.Module):
  """The nanoGPT transformer; see the module doc. Call: idx [B, T] int -> logits [B, T, V]."""

  def __init__(self, config: GPTConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self.config = config

  def __call__(self, idx: jax.Array, *, is_training: bool = False,
               kv_cache: Optional[KVCache] = None, cache_index: Optional[jax.Array] = None,
               last_only: bool = False, targets: Optional[jax.Array] = None):
    """Logits [B, T, V] float32 (bfloat16 in a bfloat16 model with "autocast" activations;
    `last_only`: [B, 1, V]); with `kv_cache`, (logits, new cache); with `targets` [B, T], the mean
    cross-entropy (`cross_entropy` of the logits, or the fused head of `config.loss`).

    `cache_index` is the position of idx[:, 0] (tokens before it are in the cache); positions are
    cache_index + [0, T).
    """
    cfg = self.config
    B, T = idx.shape
    mm = jnp.dtype(cfg.dtype)                                    # matmul operands
    dtype = jnp.float32                                          # embeddings, residual stream, norms
    act = mm if cfg.activations == "autocast" else dtype         # Linear, attention, GELU outputs
    normal = hk.initializers.RandomNormal(INIT_STD)
    wte = layers.Embed(cfg.vocab_size, cfg.n_embd, w_init=normal, dtype=dtype, name="wte",
                       kernels=cfg.kernels)
    # Positions never collide: their gradient is no serialised scatter, so always a gather.
    wpe = layers.Embed(cfg.block_size, cfg.n_embd, w_init=normal, dtype=dtype, name="wpe",
                       lookup="gather")
    start = 0 if kv_cache is None else jnp.asarray(cache_index, jnp.int32)
    pos = start + jnp.arange(T, dtype=jnp.int32)                 # [T]
    x = wte(idx) + wpe(pos)[None]                                # [B, T, C]
    drop = is_training and cfg.dropout > 0
    if drop:
      x = dropout(x, cfg.dropout, hk.next_rng_key())
    new_cache = []
    for i in range(cfg.n_layer):
      with hk.name_scope(f"h_{i}"):
        if kv_cache is None:
          block = lambda x: _block(cfg, x, is_training=is_training)   # noqa: E731
          # remat: the block's activations are recomputed in the backward pass (the same
          # numbers); its parameters keep their names (h_<i>/...).
          x = (hk.remat(block) if cfg.remat and is_training else block)(x)
        else:
          x, layer_cache = _block(cfg, x, kv_cache=kv_cache[i], cache_index=start)
          new_cache.append(layer_cache)
    x = LayerNorm(with_bias=cfg.bias, name="ln_f")(x)
    if last_only:
      x = x[:, -1:]                                              # [B, 1, C]
    if targets is not None and cfg.loss != "xla":                # the head and loss fused
      rows = dispatch.head_loss_rows(cfg.loss, x.reshape(B * T, -1), wte.embeddings,
                                     targets.reshape(B * T), dtype=mm, logits_dtype=act)
      return jnp.mean(rows)
    logits = wte.attend(x, matmul_dtype=mm)                      # [B, T, V] float32
    if act == jnp.bfloat16:
      # autocast's lm_head returns bfloat16 logits; rounded by to_precision first, which XLA keeps,
      # where it may drop the float32 -> bfloat16 -> float32 round trip into the loss's float32.
      logits = layers.to_precision(logits, act).astype(act)
    if targets is not None:
      return cross_entropy(logits, targets)
    return logits if kv_cache is None else (logits, new_cache)


def _block(cfg: GPTConfig, x: jax.Array, *, is_training: bool = False,
           kv_cache: Optional[Tuple[jax.Array, jax.Array]] = None,
           cache_index: Optional[jax.Array] = None):
  """One block, x [B, T, C] float32 -> x + attn(ln_1(x)) + mlp(ln_2(...)) (with `kv_cache`:
  (x, the layer's new cache)). A function, not a module method: its modules are named within the
  caller's h_<i> scope, as before the block had a function of its own."""
  mm = jnp.dtype(cfg.dtype)
  act = mm if cfg.activations == "autocast" else jnp.float32
  normal = hk.initializers.RandomNormal(INIT_STD)
  proj = hk.initializers.RandomNormal(INIT_STD / math.sqrt(2 * cfg.n_layer))
  attn = CausalSelfAttention(
      num_heads=cfg.n_head, head_dim=cfg.head_dim, with_bias=cfg.bias,
      dropout_rate=cfg.dropout, dtype=act, qkv_w_init=normal, out_w_init=proj, name="attn",
      kernels=cfg.kernels, matmul_dtype=mm, attention=cfg.attention)
  h = LayerNorm(with_bias=cfg.bias, name="ln_1")(x)
  layer_cache = None
  if kv_cache is None:
    a = attn(h, is_training=is_training)
  else:
    a, layer_cache = attn(h, kv_cache=kv_cache, cache_index=cache_index)
  x = x + a                                                    # [B, T, C] float32
  h = LayerNorm(with_bias=cfg.bias, name="ln_2")(x)
  x = x + GeluMLP(with_bias=cfg.bias, dropout_rate=cfg.dropout, dtype=act, w_init=normal,
                  out_w_init=proj, name="mlp", kernels=cfg.kernels, matmul_dtype=mm,
                  approximate=cfg.gelu == "tanh")(h, is_training=is_training)
  return x if kv_cache is None else (x, layer_cache)


class GPTModel:
  """A pure-function wrapper: `init(rng)`, `apply(params, idx, rng=None, is_training=False)`,
  `apply_cached(params, idx, cache, cache_index)`, `init_cache(batch)`."""

  def __init__(self, config: GPTConfig):
    self.config = config

    def forward(idx, is_training=False, last_only=False):
      return GPT(config, name="gpt")(idx, is_training=is_training, last_only=last_only)

    def loss(idx, targets, is_training=False):
      return GPT(config, name="gpt")(idx, is_training=is_training, targets=targets)

    def cached(idx, kv_cache, cache_index, last_only=False):
      return GPT(config, name="gpt")(idx, kv_cache=kv_cache, cache_index=cache_index,
                                     last_only=last_only)

    self._fwd = hk.transform(forward)
    self._loss = hk.transform(loss)
    self._cached = hk.without_apply_rng(hk.transform(cached))

  def init(self, rng: jax.Array) -> hk.Params:
    return self._fwd.init(rng, jnp.zeros((1, self.config.block_size), jnp.int32))

  def apply(self, params: hk.Params, idx: jax.Array, rng: Optional[jax.Array] = None, *,
            is_training: bool = False, last_only: bool = False) -> jax.Array:
    """Logits [B, T, V] of token ids idx [B, T]; concrete ids outside [0, V) raise ValueError
    (traced ids, inside jit, are not checked: an embedding lookup there would read NaN)."""
    if is_training and self.config.dropout > 0 and rng is None:
      raise ValueError("dropout > 0 in training needs an rng: pass rng=jax.random.key(...)")
    if not isinstance(idx, jax.core.Tracer):
      check_token_ids(idx, self.config.vocab_size)
    return self._fwd.apply(params, rng, idx, is_training=is_training, last_only=last_only)

  def loss(self, params: hk.Params, idx: jax.Array, targets: jax.Array,
           rng: Optional[jax.Array] = None, *, is_training: bool = False) -> jax.Array:
    """The mean cross-entropy of the next tokens `targets` [B, T]: `cross_entropy(apply(...))`, or
    with config.loss "pallas" the fused head and loss (no [B, T, V] logits)."""
    if is_training and self.config.dropout > 0 and rng is None:
      raise ValueError("dropout > 0 in training needs an rng: pass rng=jax.random.key(...)")
    return self._loss.apply(params, rng, idx, targets, is_training=is_training)

  def apply_cached(self, params: hk.Params, idx: jax.Array, kv_cache: KVCache,
                   cache_index: jax.Array, *, last_only: bool = False):
    """(logits [B, T, V], new cache) for tokens idx at positions cache_index + [0, T)."""
    return self._cached.apply(params, idx, kv_cache, cache_index, last_only=last_only)

  def init_cache(self, batch: int, slots: Optional[int] = None) -> KVCache:
    cfg = self.config
    return [init_kv_cache(batch, slots or cfg.block_size, cfg.n_head, cfg.head_dim,
                                 cfg.dtype) for _ in range(cfg.n_layer)]


def outside_vocabulary(idx: Any, vocab_size: int) -> List[int]:
  """The distinct ids of idx outside [0, vocab_size), sorted (empty when all are inside)."""
  a = np.asarray(idx)
  if not a.size or (a.min() >= 0 and a.max() < vocab_size):
    return []
  return sorted({int(i) for i in a.ravel() if not 0 <= i < vocab_size})


def check_token_ids(idx: Any, vocab_size: int) -> None:
  """ValueError naming the ids of idx outside the model's vocabulary (an embedding lookup there
  reads NaN in JAX, where torch raises IndexError)."""
  bad = outside_vocabulary(idx, vocab_size)
  if bad:
    raise ValueError(f"token ids {bad[:5]}{' ...' if len(bad) > 5 else ''} are outside the model's "
                     f"vocabulary of {vocab_size} ids (0..{vocab_size - 1}); use a tokenizer whose "
                     "ids the model covers")


@jax.checkpoint
def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean token cross-entropy in float32. logits [B, T, V], targets [B, T] int.

  Recomputed in the backward pass (jax.checkpoint): the gradient keeps the logits as given
  (bfloat16 for a bfloat16 model), not a float32 log-softmax of [B, T, V] (GPT-2 124M on a v4-32:
  0.6 GiB per device). The same operations, so the same numbers."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1))


def num_params(params: hk.Params, config: Optional[GPTConfig] = None,
               non_embedding: bool = True) -> int:
  """nanoGPT's reported count: every parameter, minus wpe when `non_embedding` (wte counted once)."""
  total = layers.count_params(params)
  if non_embedding:
    wpe = [v for k, v in _flat(params).items() if k.endswith("wpe/embedding")]
    total -= sum(int(np.prod(x.shape)) for x in wpe)
  return total


def _flat(params: hk.Params) -> dict:
  return {f"{m}/{n}": v for m, d in params.items() for n, v in d.items()}


def decay_mask(params: hk.Params) -> hk.Params:
  """nanoGPT's weight-decay groups: True for every tensor with >= 2 dims (linear weights, both
  embeddings), False for biases and LayerNorm weights."""
  return jax.tree.map(lambda x: x.ndim >= 2, params)


def flops_per_token(config: GPTConfig, n_params: int) -> float:
  """nanoGPT's estimate: 6 N + 12 L H Q T (forward + backward, per token)."""
  return 6.0 * n_params + 12.0 * config.n_layer * config.n_head * config.head_dim * config.block_size


def analytic_param_count(config: GPTConfig) -> int:
  """The non-embedding count from the shapes alone (tests check it against `num_params`)."""
  C, L, V = config.n_embd, config.n_layer, config.vocab_size
  b = 1 if config.bias else 0
  ln = C * (1 + b)
  block = 2 * ln + (C * 3 * C + b * 3 * C) + (C * C + b * C) + (C * 4 * C + b * 4 * C) + (4 * C * C + b * C)
  return V * C + L * block + ln


def init_stats(params: hk.Params) -> dict:
  """{name: std} of every weight (for checking the init)."""
  return {k: float(np.std(np.asarray(v))) for k, v in _flat(params).items()}


Params = Any
