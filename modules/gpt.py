"""GPT (nanoGPT) in Haiku from the shared layers: pre-LN blocks, causal attention, tied output head.

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

from modules import layers

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
  "float32" (a podlab option, before 2e39947 the only form): only the matmul operands are
    bfloat16; every activation, the attention's operands and the logits are float32. Closer to a
    float32 run, further from nanoGPT's bfloat16 run (docs/nanogpt.md section 8, row "bfloat16")."""


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """nanoGPT's model_args (+ the compute dtype).

  Fields: block_size (max T), vocab_size, n_layer, n_head, n_embd (divisible by n_head), dropout
  (probability, 0 = off), bias (LayerNorm and Linear biases), dtype (matmul dtype: "float32" is the
  reference's CPU run; "bfloat16" is nanoGPT's GPU run under torch.autocast: bfloat16 matmul operands
  with float32 accumulation), activations (with "bfloat16" only; see ACTIVATIONS), fast_grad (for a
  CPU target only, set from `layout.cpu_tuning`: `layers.matmul`'s gradient: the weight gradient as
  a row-major matmul, and bfloat16 backward operands under "bfloat16"; float32 results are the same
  sums in another order), gelu ("exact" or GPT-2's "tanh"; see GELUS), remat (recompute each
  block's activations in the backward pass instead of storing them: the same numbers, about a
  third more compute, the activations of one block instead of n_layer in memory; what lets GPT-2
  XL finetuning fit a v5e-8 under fsdp, docs/sharding.md. Not in the reference (an implementation
  choice with no effect on results); off by default. Training forward passes only).
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
  fast_grad: bool = False
  gelu: str = "exact"
  remat: bool = False

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


class GPT(hk.Module):
  """The nanoGPT transformer; see the module doc. Call: idx [B, T] int -> logits [B, T, V]."""

  def __init__(self, config: GPTConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self.config = config

  def __call__(self, idx: jax.Array, *, is_training: bool = False,
               kv_cache: Optional[KVCache] = None, cache_index: Optional[jax.Array] = None,
               last_only: bool = False):
    """Logits [B, T, V] float32 (bfloat16 in a bfloat16 model with "autocast" activations;
    `last_only`: [B, 1, V]); with `kv_cache`, (logits, new cache).

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
                       lookup="gather" if cfg.fast_grad else "auto")   # a CPU target: gather
    # Positions never collide: their gradient is no serialised scatter, so always a gather.
    wpe = layers.Embed(cfg.block_size, cfg.n_embd, w_init=normal, dtype=dtype, name="wpe",
                       lookup="gather")
    start = 0 if kv_cache is None else jnp.asarray(cache_index, jnp.int32)
    pos = start + jnp.arange(T, dtype=jnp.int32)                 # [T]
    x = wte(idx) + wpe(pos)[None]                                # [B, T, C]
    drop = is_training and cfg.dropout > 0
    if drop:
      x = layers.dropout(x, cfg.dropout, hk.next_rng_key())
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
    x = layers.LayerNorm(with_bias=cfg.bias, name="ln_f")(x)
    if last_only:
      x = x[:, -1:]                                              # [B, 1, C]
    logits = wte.attend(x, matmul_dtype=mm, fast_grad=cfg.fast_grad)   # [B, T, V] float32
    if act == jnp.bfloat16:
      # autocast's lm_head returns bfloat16 logits; rounded by to_precision first, which XLA keeps,
      # where it may drop the float32 -> bfloat16 -> float32 round trip into the loss's float32.
      logits = layers.to_precision(logits, act).astype(act)
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
  attn = layers.CausalSelfAttention(
      num_heads=cfg.n_head, head_dim=cfg.head_dim, with_bias=cfg.bias,
      dropout_rate=cfg.dropout, dtype=act, qkv_w_init=normal, out_w_init=proj, name="attn",
      fast_grad=cfg.fast_grad, matmul_dtype=mm)
  h = layers.LayerNorm(with_bias=cfg.bias, name="ln_1")(x)
  layer_cache = None
  if kv_cache is None:
    a = attn(h, is_training=is_training)
  else:
    a, layer_cache = attn(h, kv_cache=kv_cache, cache_index=cache_index)
  x = x + a                                                    # [B, T, C] float32
  h = layers.LayerNorm(with_bias=cfg.bias, name="ln_2")(x)
  x = x + layers.GeluMLP(with_bias=cfg.bias, dropout_rate=cfg.dropout, dtype=act,
                         w_init=normal, out_w_init=proj, name="mlp",
                         fast_grad=cfg.fast_grad, matmul_dtype=mm,
                         approximate=cfg.gelu == "tanh")(h, is_training=is_training)
  return x if kv_cache is None else (x, layer_cache)


class GPTModel:
  """A pure-function wrapper: `init(rng)`, `apply(params, idx, rng=None, is_training=False)`,
  `apply_cached(params, idx, cache, cache_index)`, `init_cache(batch)`."""

  def __init__(self, config: GPTConfig):
    self.config = config

    def forward(idx, is_training=False, last_only=False):
      return GPT(config, name="gpt")(idx, is_training=is_training, last_only=last_only)

    def cached(idx, kv_cache, cache_index, last_only=False):
      return GPT(config, name="gpt")(idx, kv_cache=kv_cache, cache_index=cache_index,
                                     last_only=last_only)

    self._fwd = hk.transform(forward)
    self._cached = hk.without_apply_rng(hk.transform(cached))

  def init(self, rng: jax.Array) -> hk.Params:
    return self._fwd.init(rng, jnp.zeros((1, self.config.block_size), jnp.int32))

  def apply(self, params: hk.Params, idx: jax.Array, rng: Optional[jax.Array] = None, *,
            is_training: bool = False, last_only: bool = False) -> jax.Array:
    if is_training and self.config.dropout > 0 and rng is None:
      raise ValueError("dropout > 0 in training needs an rng: pass rng=jax.random.key(...)")
    return self._fwd.apply(params, rng, idx, is_training=is_training, last_only=last_only)

  def apply_cached(self, params: hk.Params, idx: jax.Array, kv_cache: KVCache,
                   cache_index: jax.Array, *, last_only: bool = False):
    """(logits [B, T, V], new cache) for tokens idx at positions cache_index + [0, T)."""
    return self._cached.apply(params, idx, kv_cache, cache_index, last_only=last_only)

  def init_cache(self, batch: int, slots: Optional[int] = None) -> KVCache:
    cfg = self.config
    return [layers.init_kv_cache(batch, slots or cfg.block_size, cfg.n_head, cfg.head_dim,
                                 cfg.dtype) for _ in range(cfg.n_layer)]


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean token cross-entropy in float32. logits [B, T, V], targets [B, T] int."""
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
