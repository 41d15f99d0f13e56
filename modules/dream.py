"""The Dream / DiffuCoder masked-diffusion language model in Haiku (Qwen2.5 layout, bidirectional).

Dream 7B and DiffuCoder-7B (base, instruct, cpGRPO) share one architecture: a Qwen2.5-7B decoder whose
attention is NOT causal (the only mask is padding). The facts are in
`docs/diffucoder.md`; this module builds the network from the shared layers:

  embed_tokens -> num_layers x [x + attn(norm1(x)); h + mlp(norm2(h))] -> norm -> lm_head (untied)
  attention: grouped-query (query head h uses KV head h // (H // K)), q/k/v biases, no output bias,
    RoPE theta 1e6 ("rotate half", tables in float32), scale 1/sqrt(Dh), padding mask only.
  RMSNorm: eps 1e-6, normalise in float32, cast back, multiply by the weight in the model dtype.
  SwiGLU: down(silu(gate(x)) * up(x)) with an explicit width (18944), no biases.
  Parameters are stored in bfloat16 and the compute dtype is bfloat16 by default (both configurable).

The logits are RAW: the logit at position i predicts token i + 1. The sampler shifts them
(position j reads the logit of j - 1) before reading masked positions.

Shape glossary:
  B: batch        L: query tokens (the canvas or a block of it)      C: cached context tokens
  D: hidden       H: query heads     K: KV heads     Dh: head dim (D / H)     G = H // K
  F: SwiGLU width V: vocabulary      N: num_layers

Padding: `valid` [B, L] marks real tokens (False = padding, e.g. the left pads of a batch). Attention
uses the outer product of validity (pads neither attend nor are attended); a fully padded query row
gets uniform weights and stays finite (never NaN). With `positions=None` each row's positions restart
at 0 at its first valid token (so a left-padded row gives the logits of the same row unpadded).

KV context (for block-wise approximate caching): `context=(kv_list, context_valid)` with
`kv_list[n] = (k, v)`, each [B, C, K, Dh] with RoPE already applied at their own positions (exactly
what `return_kv=True` returns for those tokens). The L queries attend to the C context keys and their
own L keys, masked by validity. With `positions=None` the queries' positions continue after the
context's valid tokens (right for a prefix cache); pass `positions` explicitly otherwise (dual cache).
Running [prefix; block] in one call equals running the block with that call's prefix kv as context.

Parameter layout (Haiku names -> shape; `w` is [in, out], i.e. the transpose of a torch Linear weight):
  dream/embed_tokens/embedding                       [V, D]      <- model.embed_tokens.weight
  dream/layer_{n}/input_layernorm/weight             [D]         <- model.layers.n.input_layernorm.weight
  dream/layer_{n}/self_attn/qkv_proj/w               [D, (H+2K)Dh] <- [q|k|v]_proj.weight^T
  dream/layer_{n}/self_attn/qkv_proj/b               [(H+2K)Dh] <- [q|k|v]_proj.bias
  dream/layer_{n}/self_attn/o_proj/w                 [H Dh, D]   <- o_proj.weight^T
  dream/layer_{n}/post_attention_layernorm/weight    [D]
  dream/layer_{n}/mlp/gate_up_proj/w                 [D, 2F]     <- [gate|up]_proj.weight^T
  dream/layer_{n}/mlp/down_proj/w                    [F, D]      <- down_proj.weight^T
  dream/norm/weight                                  [D]         <- model.norm.weight
  dream/lm_head/w                                    [D, V]      <- lm_head.weight^T
`param_layout(config)` returns this table as {module: {name: shape}}; the 7.6B config has
7,615,616,512 parameters (`count_params(DREAM_7B)`, no allocation).

Model parallelism (Megatron style, docs/diffucoder.md section 9.1): `dream_forward(config,
model_axis, m)` is the per-device program inside a `shard_map` whose `model_axis` has m devices.
Device i holds KV heads [i K/m, (i+1) K/m) with their query heads (whole GQA groups), its F/m SwiGLU
columns, the matching o_proj / down_proj rows (partial sums added by a float32 psum), and vocabulary
rows [i V/m, (i+1) V/m) of the embedding and the head (its logits are that block). The parameters
are the same tree, split by `param_partition_specs`, with the fused qkv / gate_up columns in
`model_parallel_layout` order; `valid_model_degrees(DREAM_7B)` is [1, 2, 4] (4 KV heads).

Synopsis:

  import jax, jax.numpy as jnp
  from modules import dream

  cfg = dream.tiny_config()                                       # V 272, D 64, 2 layers, H 4, K 2
  model = dream.dream_forward(cfg)
  tokens = jnp.array([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]], jnp.int32)  # [B, L], row 0 left-padded
  valid = tokens != 0
  params = jax.jit(model.init)(jax.random.key(0), tokens, valid)   # bfloat16 parameters
  apply = jax.jit(model.apply, static_argnames="return_kv")       # one compile per shape
  logits, kv = apply(params, tokens, valid, return_kv=True)       # [2, 5, 272] bfloat16 (unshifted)
  kv[0][0].shape                                                  # (2, 5, 2, 16): layer 0's k
  assert dream.count_params(dream.DREAM_7B) == 7_615_616_512
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from modules import layers

KV = Tuple[jax.Array, jax.Array]                                  # (k, v), each [B, C|L, K, Dh]
Context = Tuple[Sequence[KV], jax.Array]                          # (per-layer kv, valid [B, C])

_DTYPES = ("bfloat16", "float32", "float16")


@dataclasses.dataclass(frozen=True)
class DreamConfig:
  """Dream architecture fields (defaults: the released 7B models, see `DREAM_7B`).

  vocab_size: V rows of the embedding and of the untied head (152064).
  hidden_size: D (3584).      intermediate_size: F, SwiGLU width (18944).
  num_layers: N (28).         num_heads: H query heads (28).      num_kv_heads: K (4).
  head_dim: Dh = D / H (a property, 128).
  rope_theta: RoPE base (1e6).  rms_norm_eps: (1e-6).
  dtype: compute dtype (bfloat16; "float32" for references).  param_dtype: storage dtype (bfloat16).
  Dtypes may be given as strings ("bfloat16"), as they are in ml_collections configs.
  """
  vocab_size: int = 152064
  hidden_size: int = 3584
  intermediate_size: int = 18944
  num_layers: int = 28
  num_heads: int = 28
  num_kv_heads: int = 4
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  dtype: Any = jnp.bfloat16
  param_dtype: Any = jnp.bfloat16

  def __post_init__(self):
    def bad(field, value, fix):
      raise ValueError(f"DreamConfig.{field}={value!r}: {fix}")
    for field in ("dtype", "param_dtype"):
      value = getattr(self, field)
      try:
        dt = jnp.dtype(value)
      except TypeError:
        dt = None
      if dt is None or dt.name not in _DTYPES:
        bad(field, value, f"use one of {_DTYPES}")
      object.__setattr__(self, field, dt)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads"):
      value = getattr(self, field)
      if not isinstance(value, (int, np.integer)) or value < 1:
        bad(field, value, "must be a positive integer")
    if self.hidden_size % self.num_heads:
      bad("num_heads", self.num_heads, f"must divide hidden_size={self.hidden_size}")
    if self.num_heads % self.num_kv_heads:
      bad("num_kv_heads", self.num_kv_heads, f"must divide num_heads={self.num_heads}")
    if self.head_dim % 2:
      bad("num_heads", self.num_heads,
          f"head_dim = hidden_size / num_heads = {self.head_dim} must be even for RoPE")
    if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
      bad("rope_theta/rms_norm_eps", (self.rope_theta, self.rms_norm_eps), "must be > 0")

  @property
  def head_dim(self) -> int:
    """Dh = D / H."""
    return self.hidden_size // self.num_heads

  @property
  def group_size(self) -> int:
    """G = H / K query heads per KV head."""
    return self.num_heads // self.num_kv_heads

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> "DreamConfig":
    """From a mapping such as `config.model` (ml_collections); unknown keys are a clear error."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
      raise ValueError(f"config.model has unknown fields {unknown}: valid fields are {sorted(known)}")
    return cls(**dict(fields))

  def to_dict(self) -> dict:
    """Plain fields with dtypes as strings (what a config file writes)."""
    out = dataclasses.asdict(self)
    out["dtype"], out["param_dtype"] = self.dtype.name, self.param_dtype.name
    return out


DREAM_7B = DreamConfig()          # Dream-v0-Base/Instruct-7B: 7,615,616,512 parameters.
DIFFUCODER_7B = DREAM_7B          # DiffuCoder-7B-Base/Instruct/cpGRPO: the same architecture.


def tiny_config(**overrides: Any) -> DreamConfig:
  """A tiny random Dream for tests and demos: V 272 (256 bytes + 16 specials), D 64, F 160, 2 layers,
  4 query heads and 2 KV heads of 16 (so GQA grouping is exercised); overrides replace fields."""
  fields = dict(vocab_size=272, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                num_kv_heads=2)
  fields.update(overrides)
  return DreamConfig(**fields)


def default_positions(valid: jax.Array, offset: Optional[jax.Array] = None) -> jax.Array:
  """Per-row positions [B, L] int32: 0 at each row's first valid token, +1 per valid token.

  Padding gets position 0 (it is masked, its position never matters). `offset` [B] (e.g. the number
  of valid context tokens) is added to every valid position.
  """
  valid = valid.astype(bool)
  pos = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1                 # [B, L]
  if offset is not None:
    pos = pos + offset.astype(jnp.int32)[:, None]
  return jnp.where(valid, pos, 0).astype(jnp.int32)


class DreamLayer(hk.Module):
  """One pre-norm decoder layer: h = x + attn(norm1(x)); out = h + mlp(norm2(h)).

  __call__(x [B, L, D], rope (cos, sin) [B, L, Dh], mask [B, 1, L, C + L], kv_context) ->
    (out [B, L, D], (k, v) [B, L, K, Dh] with RoPE).
  """

  def __init__(self, config: DreamConfig, name: Optional[str] = None,
               model_axis: Optional[str] = None, model_degree: int = 1):
    super().__init__(name=name)
    self.config = config
    self.model_axis = model_axis
    self.model_degree = model_degree

  def __call__(self, x: jax.Array, rope: Tuple[jax.Array, jax.Array], mask: jax.Array,
               kv_context: Optional[KV]) -> Tuple[jax.Array, KV]:
    cfg = self.config
    if self.model_axis is not None:
      return _sharded_layer(cfg, self.model_degree, self.model_axis, x, rope, mask, kv_context)
    norm = lambda name: layers.RMSNorm(eps=cfg.rms_norm_eps, param_dtype=cfg.param_dtype, name=name)
    attn = layers.Attention(num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                            num_kv_heads=cfg.num_kv_heads, causal=False, qkv_bias=True,
                            out_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                            name="self_attn")
    a, kv = attn(norm("input_layernorm")(x), rope=rope, mask=mask, kv_context=kv_context,
                 return_kv=True)                                  # [B, L, D], ([B, L, K, Dh]) x 2
    h = x + a
    mlp = layers.SwiGLU(inner_size=cfg.intermediate_size, dtype=cfg.dtype,
                        param_dtype=cfg.param_dtype, name="mlp")
    return h + mlp(norm("post_attention_layernorm")(h)), kv


def _sharded_layer(cfg: DreamConfig, m: int, axis: str, x: jax.Array, rope, mask: jax.Array,
                   kv_context: Optional[KV]) -> Tuple[jax.Array, KV]:
  """DreamLayer on this device's heads and SwiGLU columns (Megatron; called inside the layer's
  __call__, so its parameters keep their names): H/m query heads, K/m KV heads (their qkv columns,
  in `model_parallel_layout` order), F/m gate and up columns; o_proj and down_proj get the matching
  rows and their partial sums are added over the model axis in float32
  (then cast to the compute dtype, as the unsharded Linear casts its float32 accumulation)."""
  H, K, Dh, F = cfg.num_heads // m, cfg.num_kv_heads // m, cfg.head_dim, cfg.intermediate_size // m
  B, L, D = x.shape
  norm = lambda name: layers.RMSNorm(eps=cfg.rms_norm_eps, param_dtype=cfg.param_dtype, name=name)
  linear = lambda size, name, **kw: layers.Linear(size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                                  name=name, **kw)
  xn = norm("input_layernorm")(x)
  with hk.name_scope("self_attn"):
    qkv = linear((H + 2 * K) * Dh, "qkv_proj", with_bias=True)(xn)
    qkv = qkv.reshape(B, L, H + 2 * K, Dh)                        # this device's heads
    q, k, v = qkv[:, :, :H], qkv[:, :, H:H + K], qkv[:, :, H + K:]  # [B, L, H/m | K/m, Dh]
    q, k = layers.apply_rope(q, *rope), layers.apply_rope(k, *rope)
    k_all, v_all = k, v
    if kv_context is not None:
      k_all = jnp.concatenate([kv_context[0].astype(k.dtype), k], axis=1)  # [B, C + L, K/m, Dh]
      v_all = jnp.concatenate([kv_context[1].astype(v.dtype), v], axis=1)
    out = layers.dot_product_attention(q, k_all, v_all, mask=mask)     # [B, L, H/m, Dh]
    a = linear(D, "o_proj", output_dtype=jnp.float32)(out.reshape(B, L, H * Dh))  # partial [B, L, D]
  h = x + jax.lax.psum(a, axis).astype(cfg.dtype)
  hn = norm("post_attention_layernorm")(h)
  with hk.name_scope("mlp"):
    gate, up = jnp.split(linear(2 * F, "gate_up_proj")(hn), 2, axis=-1)  # [B, L, F/m] each
    y = linear(D, "down_proj", output_dtype=jnp.float32)(layers.silu(gate) * up)  # partial sum
  return h + jax.lax.psum(y, axis).astype(cfg.dtype), (k, v)


class DreamModel(hk.Module):
  """The Dream network; see the module docstring for the parameter layout and the context contract.

  __call__(tokens [B, L] int32, valid [B, L] bool, positions [B, L] int32 | None, *, context=None,
           return_kv=False) -> logits [B, L, V] in config.dtype (raw, unshifted),
           and with return_kv=True also a list of N (k, v) pairs, each [B, L, K, Dh] after RoPE.
  """

  def __init__(self, config: DreamConfig, name: Optional[str] = "dream",
               model_axis: Optional[str] = None, model_degree: int = 1):
    super().__init__(name=name)
    self.config = config
    self.model_axis = model_axis
    self.model_degree = model_degree if model_axis is not None else 1
    if model_axis is not None:
      check_model_degree(config, model_degree)

  def __call__(self, tokens: jax.Array, valid: jax.Array, positions: Optional[jax.Array] = None, *,
               context: Optional[Context] = None, return_kv: bool = False):
    cfg = self.config
    m = self.model_degree
    if tokens.ndim != 2 or valid.shape != tokens.shape:
      raise ValueError(f"DreamModel: tokens {tokens.shape} and valid {valid.shape} must both be "
                       "[B, L]; add a batch axis to a single row")
    B, L = tokens.shape
    valid = valid.astype(bool)
    if context is None:
      kv_list: List[Optional[KV]] = [None] * cfg.num_layers
      context_valid = jnp.zeros((B, 0), bool)
    else:
      kv_list, context_valid = context
      kv_list = list(kv_list)
      context_valid = context_valid.astype(bool)
      if len(kv_list) != cfg.num_layers:
        raise ValueError(f"DreamModel: context has {len(kv_list)} layers of (k, v); the model has "
                         f"num_layers={cfg.num_layers}; pass the list that return_kv=True returned")
      C = context_valid.shape[1]
      want = (B, C, cfg.num_kv_heads // m, cfg.head_dim)
      for k, v in kv_list:
        if tuple(k.shape) != want or tuple(v.shape) != want:
          raise ValueError(f"DreamModel: context k/v shapes {k.shape}/{v.shape} must be {want} "
                           "([B, C, K, Dh] with C = context_valid.shape[1])")
    if positions is None:
      offset = jnp.sum(context_valid, axis=1) if context is not None else None
      positions = default_positions(valid, offset)                 # [B, L]
    elif positions.shape != tokens.shape:
      raise ValueError(f"DreamModel: positions {positions.shape} must match tokens {tokens.shape}")

    keys_valid = jnp.concatenate([context_valid, valid], axis=1)     # [B, C + L]
    mask = valid[:, None, :, None] & keys_valid[:, None, None, :]    # [B, 1, L, C + L]
    rope = layers.rope_tables(positions, head_dim=cfg.head_dim, theta=cfg.rope_theta)  # [B, L, Dh]

    vocab = cfg.vocab_size // m                                      # this device's rows of V
    embed = layers.Embed(vocab, cfg.hidden_size, init_std=1.0, dtype=cfg.dtype,
                         param_dtype=cfg.param_dtype, name="embed_tokens")
    if self.model_axis is None:
      x = embed(tokens)                                              # [B, L, D]
    else:                          # rows [i V/m, (i+1) V/m) here: look up ours, zeros elsewhere, sum
      local = tokens - jax.lax.axis_index(self.model_axis) * vocab
      here = (local >= 0) & (local < vocab)
      x = jnp.where(here[..., None], embed(jnp.clip(local, 0, vocab - 1)), 0)
      x = jax.lax.psum(x, self.model_axis)                           # [B, L, D], exact (one term)
    new_kv = []
    for n in range(cfg.num_layers):
      x, kv = DreamLayer(cfg, name=f"layer_{n}", model_axis=self.model_axis, model_degree=m)(
          x, rope, mask, kv_list[n])
      new_kv.append(kv)
    x = layers.RMSNorm(eps=cfg.rms_norm_eps, param_dtype=cfg.param_dtype, name="norm")(x)
    logits = layers.Linear(vocab, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                           name="lm_head")(x)                        # [B, L, V] (V/m when sharded)
    return (logits, new_kv) if return_kv else logits


def dream_forward(config: DreamConfig, model_axis: Optional[str] = None,
                  model_degree: int = 1) -> hk.Transformed:
  """init/apply of DreamModel without an apply rng.

  init(rng, tokens, valid, positions=None, context=None, return_kv=False) -> params
  apply(params, tokens, valid, positions=None, context=None, return_kv=False) -> logits [, kv]
  (`return_kv` must be static under jit: close over it, e.g. functools.partial(apply, return_kv=True).)

  With `model_axis` (a mesh axis of `model_degree` devices) `apply` is the per-device program of
  Megatron-style model parallelism, to be run inside `shard_map` over that axis: `params` are this
  device's blocks (`param_partition_specs` of the tree in `model_parallel_layout` order), the
  logits are this device's V/m vocabulary columns and k/v (context in and out) its K/m KV heads.
  """
  def forward(tokens, valid, positions=None, context=None, return_kv=False):
    return DreamModel(config, model_axis=model_axis, model_degree=model_degree)(
        tokens, valid, positions, context=context, return_kv=return_kv)
  return hk.without_apply_rng(hk.transform(forward))


# ----------------------------------------------------------------------------------------------
# Model parallelism (weights sharded over a mesh axis of m devices; see docs/diffucoder.md).


def valid_model_degrees(config: DreamConfig) -> List[int]:
  """Model-parallel degrees m that split `config` evenly: m divides the KV heads (each device keeps
  whole GQA groups: K/m KV heads and their H/m query heads), the SwiGLU width and the vocabulary.
  [1, 2, 4] for the 7.6B (4 KV heads)."""
  return [m for m in range(1, config.num_kv_heads + 1)
          if config.num_kv_heads % m == 0 and config.intermediate_size % m == 0
          and config.vocab_size % m == 0]


def check_model_degree(config: DreamConfig, degree: int) -> None:
  """ValueError naming the degree, what it does not divide and the valid degrees."""
  if degree in valid_model_degrees(config):
    return
  parts = [f"{n}={v}" for n, v in (("num_heads", config.num_heads),
                                    ("num_kv_heads", config.num_kv_heads),
                                    ("intermediate_size", config.intermediate_size),
                                    ("vocab_size", config.vocab_size))
           if not isinstance(degree, (int, np.integer)) or degree < 1 or v % degree]
  raise ValueError(f"model-parallel degree {degree!r} does not divide {', '.join(parts) or 'the model'}"
                   f"; valid degrees for this model: {valid_model_degrees(config)}")


def _qkv_order(config: DreamConfig, degree: int) -> np.ndarray:
  """Column permutation of the fused q|k|v axis ((H + 2K) Dh) into device-major order: device i's
  block is [its H/m q heads | its K/m k heads | its K/m v heads], each head Dh wide."""
  H, K, Dh, m = config.num_heads, config.num_kv_heads, config.head_dim, degree
  heads = np.arange((H + 2 * K) * Dh).reshape(H + 2 * K, Dh)
  q, k, v = heads[:H], heads[H:H + K], heads[H + K:]
  blocks = [np.concatenate([q[i * H // m:(i + 1) * H // m], k[i * K // m:(i + 1) * K // m],
                            v[i * K // m:(i + 1) * K // m]]) for i in range(m)]
  return np.concatenate(blocks).reshape(-1)


def _gate_up_order(config: DreamConfig, degree: int) -> np.ndarray:
  """Column permutation of the fused gate|up axis (2F): device i's block is [its F/m gate columns |
  its F/m up columns]."""
  F, m = config.intermediate_size, degree
  f = F // m
  return np.concatenate([np.concatenate([np.arange(i * f, (i + 1) * f),
                                         F + np.arange(i * f, (i + 1) * f)]) for i in range(m)])


def model_parallel_layout(module: str, name: str, value: Any, config: DreamConfig,
                          degree: int, inverse: bool = False) -> Any:
  """One parameter in the model-parallel column order (identity for degree 1 and for every parameter
  but the fused qkv_proj w/b and gate_up_proj w, whose columns are reordered so that the contiguous
  split over `degree` devices gives each its heads / SwiGLU columns). `inverse` undoes it. Works on
  numpy (the converter, per tensor) and jax arrays."""
  if degree == 1 or not (module.endswith("qkv_proj") or module.endswith("gate_up_proj")):
    return value
  order = (_qkv_order if module.endswith("qkv_proj") else _gate_up_order)(config, degree)
  if inverse:
    order = np.argsort(order)
  return value[..., order]


def to_model_parallel_layout(params: hk.Params, config: DreamConfig, degree: int,
                             inverse: bool = False) -> hk.Params:
  """`model_parallel_layout` on every parameter of a tree (the tree of `dream_forward(config)`)."""
  return {module: {name: model_parallel_layout(module, name, value, config, degree, inverse)
                   for name, value in p.items()} for module, p in params.items()}


def param_partition_spec(module: str, name: str, model_axis: str) -> P:
  """How one parameter is split over the model axis (Megatron): embedding and lm_head by vocabulary,
  qkv_proj and gate_up_proj by columns (w and b), o_proj and down_proj by rows, norms replicated."""
  leaf = module.rsplit("/", 1)[-1]
  if leaf == "embed_tokens" or leaf in ("o_proj", "down_proj"):
    return P(model_axis, None)
  if leaf in ("lm_head", "qkv_proj", "gate_up_proj"):
    return P(None, model_axis) if name == "w" else P(model_axis)
  return P()


def param_partition_specs(config: DreamConfig, model_axis: str) -> dict:
  """{module: {name: PartitionSpec}} for the tree of `dream_forward(config)` (`param_partition_spec`)."""
  return {module: {name: param_partition_spec(module, name, model_axis) for name in p}
          for module, p in param_shapes(config).items()}


def param_shapes(config: DreamConfig) -> hk.Params:
  """The parameter tree as jax.ShapeDtypeStruct leaves (jax.eval_shape: nothing is allocated)."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  valid = jax.ShapeDtypeStruct((1, 1), jnp.bool_)
  model = dream_forward(config)
  return jax.eval_shape(lambda t, v: model.init(jax.random.key(0), t, v), tokens, valid)


def param_layout(config: DreamConfig) -> dict:
  """{module name: {parameter name: shape tuple}} of the Haiku parameters (no allocation)."""
  return {m: {n: tuple(a.shape) for n, a in p.items()} for m, p in param_shapes(config).items()}


def count_params(config: DreamConfig) -> int:
  """Number of parameters of `config` (7,615,616,512 for DREAM_7B), without allocating them."""
  return int(sum(np.prod(a.shape, dtype=np.int64) for a in jax.tree.leaves(param_shapes(config))))
