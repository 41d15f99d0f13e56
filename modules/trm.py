"""Tiny Recursive Models (TRM) in Haiku, faithful to the reference PyTorch implementation.

One small network ("net" = `L_layers` post-norm blocks) is applied recursively to two latents z_H and
z_L; an ACT wrapper runs one supervision step per optimizer step on a carry that persists across steps.
The facts implemented here are listed in `docs/trm.md` sections 1-2.

Shape glossary:
  B: batch                      L: puzzle tokens (Sudoku 81, Maze/ARC 900)
  P: puzzle-embedding prefix slots (16; 0 without a puzzle embedding)
  S = P + L: sequence           D: hidden (512)          V: vocab
  E: puzzle_emb_ndim (D)        N: number of puzzle identifiers

Pieces:
  TRMConfig            the model's fields (defaults = the reference defaults).
  TRMInner             the Haiku module: one ACT step's recursion (T-1 gradient-free cycles, one with
                       gradient) from a carry (z_H, z_L) -> new carry, logits [B, L, V], q_halt/q_continue.
  ACTCarry             (z_H, z_L, steps, halted, current_data): lives on the device across steps.
  act_reset/act_halt   the ACT wrapper's data-selection and halting halves, pure and jittable.
  TRMModel             bundles init/apply and `act_step` (the whole ACT step, one static-shape function).

The puzzle-embedding table [N, E] is NOT a Haiku parameter: the caller gathers the batch's rows
(`puzzle_table[ids]`) and passes them in, so the trainer can differentiate with respect to the rows only
and apply sparse SignSGD to them (and keep huge tables sharded or on the host).

Synopsis:

  import jax, jax.numpy as jnp
  from modules import trm

  cfg = trm.TRMConfig(seq_len=81, vocab_size=11, mlp_t=True, pos_encodings="none",
                      hidden_size=64, num_heads=2, H_cycles=2, L_cycles=2, halt_max_steps=4)
  model = trm.TRMModel(cfg)
  params, state = model.init(jax.random.key(0))
  table = model.init_puzzle_table()                               # [1, 64] zeros
  batch = {"inputs": jnp.ones((4, 81), jnp.int32), "labels": jnp.full((4, 81), 2, jnp.int32),
           "puzzle_identifiers": jnp.zeros((4,), jnp.int32)}
  carry = model.initial_carry(batch)
  carry, out = model.act_step(params, state, table, carry, batch, training=False)
  out["logits"].shape                                             # (4, 81, 11)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, NamedTuple, Optional, Tuple

import haiku as hk
import jax
import jax.numpy as jnp

from modules import kernels as kernels_lib
from modules import layers
from modules.kernels import dispatch
from modules.kernels import xla_cpu

Batch = Dict[str, jax.Array]

POS_ENCODINGS = ("rope", "learned", "none")


@dataclasses.dataclass(frozen=True)
class TRMConfig:
  """TRM fields. Defaults are the reference's (docs/trm.md section 5).

  seq_len: L, puzzle tokens.                vocab_size: V.
  num_puzzle_identifiers: N rows of the puzzle-embedding table (Sudoku: 1).
  puzzle_emb_ndim: E, width of a puzzle vector; 0 disables the prefix. None means hidden_size.
  puzzle_emb_len: P prefix slots; 0 means ceil(E / D).
  hidden_size: D.  num_heads: attention heads (head dim D / heads).  expansion: SwiGLU expansion.
  H_cycles: T (T-1 gradient-free cycles, one with gradient).  L_cycles: n z_L updates per cycle.
  L_layers: blocks in the single shared net.
  pos_encodings: "rope" | "learned" | "none".
  mlp_t: token-MLP blocks (mix over the sequence) instead of attention.
  rms_norm_eps, rope_theta: as named.
  forward_dtype: compute dtype ("bfloat16" reference, "float32" option); parameters stay float32.
  halt_max_steps: ACT steps per example.  halt_exploration_prob: per-row exploration probability.
  remat: recompute each block's activations in the backward pass instead of storing them (same numbers,
    about a third more compute, several times less memory: what lets batch 768 fit in 24 GB).
    Not in the reference (an implementation choice with no effect on results); off by default.
  kernels: "default" (plain JAX: what a TPU or GPU compiles) or "xla_cpu" (modules/kernels/xla_cpu.py:
    the same model in the forms XLA:CPU runs faster, which `xla_cpu.forms` picks for the forward
    dtype, among them the [S, B, D] recursion of mlp_t models, the unrolled cycle with gradient and
    the cycles without gradient in chunks of the batch). The trainer sets "xla_cpu" for a CPU
    target only (`layout.cpu_tuning`). The same function; results agree to float32 rounding.
  attention: "xla" | "splash" | "cudnn" (modules/kernels/dispatch.py): the attention kernel of
    attention models; the trainer picks it for the target platform (splash on a TPU for long
    sequences). TRM's attention has no mask, so every kernel takes it; the same function (float32
    rounding).
  mlp: "xla" | "pallas": the SwiGLU MLPs (token mix and channel) in one TPU kernel per block of
    rows (modules/kernels/fused_mlp.py); the trainer picks pallas for a TPU. The same products.
  The cycle with gradient is written out (its n z_L updates unrolled, no loop) on every target:
  a loop's autodiff stacks each update's residuals into [n, ...] buffers (the TPU compiler counted
  23.0 GB for Sudoku-MLP's v4-64 step, 17.6 GB unrolled); only xla_cpu's tuning tools loop it
  (the `unroll` form off).
  """
  seq_len: int
  vocab_size: int
  num_puzzle_identifiers: int = 1
  puzzle_emb_ndim: Optional[int] = None
  puzzle_emb_len: int = 16
  hidden_size: int = 512
  num_heads: int = 8
  expansion: float = 4.0
  H_cycles: int = 3
  L_cycles: int = 6
  L_layers: int = 2
  pos_encodings: str = "rope"
  mlp_t: bool = False
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  forward_dtype: str = "bfloat16"
  halt_max_steps: int = 16
  halt_exploration_prob: float = 0.1
  remat: bool = False
  kernels: str = "default"
  attention: str = "xla"
  mlp: str = "xla"

  def __post_init__(self):
    def bad(field, value, fix):
      raise ValueError(f"TRMConfig.{field}={value!r}: {fix}")
    if self.pos_encodings not in POS_ENCODINGS:
      bad("pos_encodings", self.pos_encodings, f"use one of {POS_ENCODINGS}")
    if self.forward_dtype not in ("bfloat16", "float32"):
      bad("forward_dtype", self.forward_dtype, "use 'bfloat16' or 'float32'")
    if self.hidden_size % self.num_heads:
      bad("num_heads", self.num_heads, f"must divide hidden_size={self.hidden_size}")
    if self.H_cycles < 1:
      bad("H_cycles", self.H_cycles, "needs at least one cycle (the one with gradient)")
    if self.L_cycles < 1 or self.L_layers < 1:
      bad("L_cycles/L_layers", (self.L_cycles, self.L_layers), "must be >= 1")
    if self.halt_max_steps < 1:
      bad("halt_max_steps", self.halt_max_steps, "must be >= 1")
    if not 0.0 <= self.halt_exploration_prob <= 1.0:
      bad("halt_exploration_prob", self.halt_exploration_prob, "must be in [0, 1]")
    if self.kernels not in kernels_lib.KERNELS:
      bad("kernels", self.kernels, f"use one of {kernels_lib.KERNELS}")
    if self.attention not in dispatch.ATTENTIONS:
      bad("attention", self.attention, f"use one of {dispatch.ATTENTIONS}")
    if self.mlp not in dispatch.MLPS:
      bad("mlp", self.mlp, f"use one of {dispatch.MLPS}")
    if self.emb_ndim > self.prefix_len * self.hidden_size:
      bad("puzzle_emb_len", self.puzzle_emb_len,
          f"P * hidden_size must hold puzzle_emb_ndim={self.emb_ndim}")

  @property
  def emb_ndim(self) -> int:
    """E: puzzle vector width (0 = no puzzle embedding)."""
    return self.hidden_size if self.puzzle_emb_ndim is None else self.puzzle_emb_ndim

  @property
  def prefix_len(self) -> int:
    """P: prefix slots (reference: puzzle_emb_len, or ceil(E / D) when it is 0)."""
    if self.emb_ndim == 0:
      return 0
    return self.puzzle_emb_len or -(-self.emb_ndim // self.hidden_size)

  @property
  def total_len(self) -> int:
    """S = P + L."""
    return self.prefix_len + self.seq_len

  @property
  def forms(self) -> xla_cpu.Forms:
    """The XLA:CPU forms this model carries (none for kernels="default"), read at trace time."""
    return xla_cpu.forms(self.kernels, self.dtype)

  @property
  def seq_first(self) -> bool:
    """True when the recursion runs on [S, B, D] latents (xla_cpu's seq_major, mlp_t models)."""
    return self.mlp_t and self.forms.seq_major

  @property
  def dtype(self) -> jnp.dtype:
    return jnp.dtype(self.forward_dtype)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


class TRMBlock(hk.Module):
  """One post-norm block: attention (or token MLP over S) then a channel SwiGLU, each + RMSNorm."""

  def __init__(self, config: TRMConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self.config = config

  def __call__(self, h: jax.Array, rope: Optional[Tuple[jax.Array, jax.Array]],
               forward_only: bool = False) -> jax.Array:
    """`forward_only` (no gradient is taken: the cycles without gradient) lets the MLPs run as the
    fused kernel of `config.mlp`; a block with gradient keeps XLA's MLP, whose backward reads the
    gate|up it stored (the kernel's would recompute the layer)."""
    cfg = self.config                                            # h: [B, S, D] ([S, B, D]: seq_first)
    mlp_kind = cfg.mlp if forward_only else "xla"
    eps = cfg.rms_norm_eps
    if cfg.seq_first:
      S, B, D = h.shape
      mix = layers.SwiGLU(expansion=cfg.expansion, dtype=cfg.dtype, name="mlp_t",
                          feature_major=True, kernels=cfg.kernels)
      mixed = mix(h.reshape(S, B * D)).reshape(S, B, D)         # SwiGLU over S on [S, B*D] rows
      h = layers.rms_norm(h + mixed, axis=0, eps=eps)            # normalise over the SEQUENCE axis
    elif cfg.mlp_t:
      mix = layers.SwiGLU(expansion=cfg.expansion, dtype=cfg.dtype, name="mlp_t",
                          kernels=cfg.kernels, mlp=mlp_kind)
      mixed = jnp.swapaxes(mix(jnp.swapaxes(h, 1, 2)), 1, 2)    # SwiGLU over S: [B, D, S] -> [B, S, D]
      h = layers.rms_norm(h + mixed, axis=1, eps=eps)            # normalise over the SEQUENCE axis
    else:
      attn = layers.Attention(num_heads=cfg.num_heads, head_dim=cfg.head_dim, causal=False,
                              dtype=cfg.dtype, name="self_attn", kernels=cfg.kernels,
                              attention=cfg.attention)
      h = layers.rms_norm(h + attn(h, rope=rope), eps=eps)
    mlp = layers.SwiGLU(expansion=cfg.expansion, dtype=cfg.dtype, name="mlp",
                        kernels=cfg.kernels, mlp=mlp_kind)
    return layers.rms_norm(h + mlp(h), eps=eps)


class ReasoningNet(hk.Module):
  """The single shared net: hidden <- blocks(hidden + injection)."""

  def __init__(self, config: TRMConfig, name: Optional[str] = None):
    super().__init__(name=name)
    self.blocks = [TRMBlock(config, name=f"layers_{i}") for i in range(config.L_layers)]
    self.remat = config.remat

  def __call__(self, hidden: jax.Array, injection: jax.Array,
               rope: Optional[Tuple[jax.Array, jax.Array]],
               forward_only: bool = False) -> jax.Array:
    hidden = hidden + injection                                  # [B, S, D]
    for block in self.blocks:
      if forward_only:                                           # no gradient: nothing to remat
        hidden = block(hidden, rope, forward_only=True)
      else:
        hidden = (hk.remat(block) if self.remat else block)(hidden, rope)
    return hidden


def _stop_gradient_getter(next_getter, value, context):
  del context
  return jax.lax.stop_gradient(next_getter(value))


class TRMInner(hk.Module):
  """One ACT step's recursion.

  __call__(z_H, z_L, inputs, puzzle_rows) -> (z_H, z_L, logits, q_halt, q_continue)
    z_H, z_L: [B, S, D] forward dtype (already reset for halted rows).
    inputs: [B, L] int tokens.  puzzle_rows: [B, E] float32 gathered table rows (None when E = 0).
    logits: [B, L, V] forward dtype.  q_halt, q_continue: [B] float32.
  Haiku state (fixed, never trained): `H_init`, `L_init` [D] bfloat16.
  """

  def __init__(self, config: TRMConfig, name: Optional[str] = "trm"):
    super().__init__(name=name)
    self.config = config
    cfg = config
    D = cfg.hidden_size
    self.embed_tokens = layers.Embed(cfg.vocab_size, D, init_std=1.0 / math.sqrt(D),
                                     dtype=cfg.dtype, name="embed_tokens", kernels=cfg.kernels)
    if cfg.pos_encodings == "learned":
      self.embed_pos = layers.Embed(cfg.total_len, D, init_std=1.0 / math.sqrt(D), dtype=cfg.dtype,
                                    name="embed_pos")
    self.lm_head = layers.Linear(cfg.vocab_size, dtype=cfg.dtype, name="lm_head",
                                 w_init=layers.TruncatedNormal(1.0 / math.sqrt(D)),
                                 kernels=cfg.kernels)
    self.q_head = layers.Linear(2, with_bias=True, dtype=cfg.dtype, name="q_head",
                                w_init=jnp.zeros, b_init=hk.initializers.Constant(-5.0),
                                kernels=cfg.kernels)
    self.L_level = ReasoningNet(cfg, name="L_level")

  def initial_latents(self) -> Tuple[jax.Array, jax.Array]:
    """The fixed H_init, L_init vectors [D] (truncated normal std 1, bfloat16)."""
    D = self.config.hidden_size
    h_init = hk.get_state("H_init", [D], jnp.bfloat16, init=layers.TruncatedNormal(1.0))
    l_init = hk.get_state("L_init", [D], jnp.bfloat16, init=layers.TruncatedNormal(1.0))
    return h_init, l_init

  def input_embeddings(self, inputs: jax.Array, puzzle_rows: Optional[jax.Array]) -> jax.Array:
    cfg = self.config
    B, D, P = inputs.shape[0], cfg.hidden_size, cfg.prefix_len
    x = self.embed_tokens(inputs)                                # [B, L, D]
    if P:
      if puzzle_rows is None:
        raise ValueError("TRMConfig.puzzle_emb_ndim > 0: pass the batch's puzzle-table rows")
      rows = puzzle_rows.astype(cfg.dtype)                       # [B, E]
      rows = jnp.pad(rows, ((0, 0), (0, P * D - cfg.emb_ndim)))  # slot 0 = the vector, rest zeros
      x = jnp.concatenate([rows.reshape(B, P, D), x], axis=1)   # [B, S, D]
    if cfg.pos_encodings == "learned":
      x = (0.707106781 * (x + self.embed_pos.embeddings.astype(cfg.dtype))).astype(cfg.dtype)
    return (math.sqrt(D) * x).astype(cfg.dtype)

  def rope(self) -> Optional[Tuple[jax.Array, jax.Array]]:
    cfg = self.config
    if cfg.pos_encodings != "rope" or cfg.mlp_t:
      return None
    return layers.rope_tables(jnp.arange(cfg.total_len), head_dim=cfg.head_dim, theta=cfg.rope_theta)

  def latent_recursion(self, z_H, z_L, x, rope, unroll=False, forward_only=False):
    """One cycle: n times z_L = net(z_L, z_H + x); then z_H = net(z_H, z_L). `forward_only`: no
    gradient is taken through it (`TRMBlock`)."""
    def l_step(_, z_l):
      return self.L_level(z_l, z_H + x, rope, forward_only=forward_only)
    if unroll:
      for i in range(self.config.L_cycles):
        z_L = l_step(i, z_L)
    else:
      z_L = hk.fori_loop(0, self.config.L_cycles, l_step, z_L)
    z_H = self.L_level(z_H, z_L, rope, forward_only=forward_only)
    return z_H, z_L

  def cycles_without_gradient(self, z_H, z_L, x, rope):
    """The T-1 cycles before the one with gradient, in chunks of `xla_cpu.nograd_chunk` examples
    (one chunk, the whole batch, by default). z_H, z_L, x: [B, S, D] ([S, B, D]: seq_first)."""
    cfg = self.config

    def cycles(z_H, z_L, x):
      def cycle(_, z):
        return self.latent_recursion(*z, x, rope, forward_only=True)
      return hk.fori_loop(0, cfg.H_cycles - 1, cycle, (z_H, z_L))

    axis = 1 if cfg.seq_first else 0                             # the batch axis
    B = z_H.shape[axis]
    chunk = xla_cpu.nograd_chunk(cfg.forms, B, cfg.total_len * cfg.hidden_size)
    if chunk == B:
      return cycles(z_H, z_L, x)

    def split(a):                                                # -> [B/chunk, (S,) chunk, (S,) D]
      a = a.reshape(a.shape[:axis] + (B // chunk, chunk) + a.shape[axis + 1:])
      return jnp.moveaxis(a, axis, 0)

    def merge(a):                                                # the inverse of split
      a = jnp.moveaxis(a, 0, axis)
      return a.reshape(a.shape[:axis] + (B,) + a.shape[axis + 2:])

    _, (z_H, z_L) = hk.scan(lambda carry, zs: (carry, cycles(*zs)), None,
                            (split(z_H), split(z_L), split(x)))
    return merge(z_H), merge(z_L)

  def __call__(self, z_H: jax.Array, z_L: jax.Array, inputs: jax.Array,
               puzzle_rows: Optional[jax.Array]):
    cfg = self.config
    x = self.input_embeddings(inputs, puzzle_rows)               # [B, S, D]
    rope = self.rope()
    z_H, z_L = jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L)  # the carry is a constant
    if cfg.seq_first:                                            # [B, S, D] -> [S, B, D]
      x, z_H, z_L = (jnp.swapaxes(a, 0, 1) for a in (x, z_H, z_L))
    if cfg.H_cycles > 1:
      # T-1 cycles WITHOUT gradient: parameters and inputs enter as constants, so no residuals are
      # stored and nothing flows back through these cycles.
      with hk.custom_getter(_stop_gradient_getter):
        z_H, z_L = self.cycles_without_gradient(z_H, z_L, jax.lax.stop_gradient(x), rope)
    unroll = cfg.forms.unroll if cfg.kernels == "xla_cpu" else True   # TRMConfig's doc
    z_H, z_L = self.latent_recursion(z_H, z_L, x, rope, unroll=unroll)  # WITH gradient
    if cfg.seq_first:
      logits = jnp.swapaxes(self.lm_head(z_H[cfg.prefix_len:]), 0, 1)  # [L, B, V] -> [B, L, V]
      q = self.q_head(z_H[0]).astype(jnp.float32)                # [B, 2]
      z_H, z_L = jnp.swapaxes(z_H, 0, 1), jnp.swapaxes(z_L, 0, 1)  # back to [B, S, D]
    else:
      logits = self.lm_head(z_H)[:, cfg.prefix_len:]             # [B, L, V]
      q = self.q_head(z_H[:, 0]).astype(jnp.float32)             # [B, 2]
    return (jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L), logits, q[:, 0], q[:, 1])


class ACTCarry(NamedTuple):
  """State of the ACT wrapper; persists across optimizer steps.

  z_H, z_L: [B, S, D] forward dtype.  steps: [B] int32.  halted: [B] bool.
  current_data: the examples the slots hold, dict of [B, ...] arrays.
  """
  z_H: jax.Array
  z_L: jax.Array
  steps: jax.Array
  halted: jax.Array
  current_data: Batch


def initial_carry(config: TRMConfig, batch: Batch) -> ACTCarry:
  """All slots halted (so the first call loads the batch), steps 0; z contents are irrelevant."""
  B = batch["inputs"].shape[0]
  z = jnp.zeros((B, config.total_len, config.hidden_size), config.dtype)
  return ACTCarry(z_H=z, z_L=z, steps=jnp.zeros((B,), jnp.int32), halted=jnp.ones((B,), bool),
                  current_data=jax.tree.map(jnp.zeros_like, dict(batch)))


def _rows_where(flag: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
  return jnp.where(flag.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)


def act_reset(carry: ACTCarry, batch: Batch, h_init: jax.Array, l_init: jax.Array) -> ACTCarry:
  """Halted slots take the new batch's row, z <- (H_init, L_init), steps <- 0; others keep theirs."""
  halted = carry.halted
  if set(batch) != set(carry.current_data):
    raise ValueError(f"batch keys {sorted(batch)} differ from the carry's "
                     f"{sorted(carry.current_data)}: build the carry from the same kind of batch")
  return ACTCarry(
      z_H=_rows_where(halted, jnp.broadcast_to(h_init.astype(carry.z_H.dtype), carry.z_H.shape),
                      carry.z_H),
      z_L=_rows_where(halted, jnp.broadcast_to(l_init.astype(carry.z_L.dtype), carry.z_L.shape),
                      carry.z_L),
      steps=jnp.where(halted, 0, carry.steps),
      halted=halted,
      current_data={k: _rows_where(halted, batch[k], v) for k, v in carry.current_data.items()})


def act_halt(config: TRMConfig, carry: ACTCarry, q_halt: jax.Array, *, training: bool,
             rng: Optional[jax.Array] = None) -> ACTCarry:
  """steps += 1; halted = steps >= halt_max_steps, plus (training only) Q-halting with exploration.

  Training with halt_max_steps > 1: halted |= q_halt > 0; with probability halt_exploration_prob a row
  draws min_halt_steps uniformly in {2..halt_max_steps} (else 0) and halted &= steps >= min_halt_steps.
  Evaluation: every row runs exactly halt_max_steps steps.
  """
  steps = carry.steps + 1
  halted = steps >= config.halt_max_steps
  if training and config.halt_max_steps > 1:
    if rng is None:
      raise ValueError("act_halt(training=True) needs an rng for halting exploration")
    explore_key, steps_key = jax.random.split(rng)
    halted = halted | (q_halt > 0)
    explore = jax.random.uniform(explore_key, q_halt.shape) < config.halt_exploration_prob
    min_halt_steps = explore * jax.random.randint(steps_key, steps.shape, 2,
                                                  config.halt_max_steps + 1)
    halted = halted & (steps >= min_halt_steps)
  return carry._replace(steps=steps, halted=halted)


class TRMModel:
  """The transformed TRM with the ACT step.

  Methods (all pure; jit/pmap them as needed):
    init(rng) -> (params, state)           params: the Adam parameters; state: {"trm": H_init, L_init}.
    init_puzzle_table() -> [N, E] float32 zeros.
    inner(params, state, z_H, z_L, inputs, puzzle_rows) -> (z_H, z_L, logits, q_halt, q_continue).
    initial_carry(batch) -> ACTCarry.
    act_step(params, state, puzzle_table, carry, batch, *, training, rng=None) -> (carry, outputs):
      one whole ACT step (reset halted slots with the new batch, recursion, halting). outputs holds
      logits [B, L, V], q_halt_logits, q_continue_logits [B] float32.
  """

  def __init__(self, config: TRMConfig):
    self.config = config

    def inner_fn(z_H, z_L, inputs, puzzle_rows):
      return TRMInner(config)(z_H, z_L, inputs, puzzle_rows)

    def latents_fn():
      return TRMInner(config).initial_latents()

    self._inner = hk.without_apply_rng(hk.transform_with_state(inner_fn))
    self._latents = hk.without_apply_rng(hk.transform_with_state(latents_fn))

  def example_batch(self, batch_size: int = 1) -> Batch:
    cfg = self.config
    return {"inputs": jnp.zeros((batch_size, cfg.seq_len), jnp.int32),
            "labels": jnp.zeros((batch_size, cfg.seq_len), jnp.int32),
            "puzzle_identifiers": jnp.zeros((batch_size,), jnp.int32)}

  def init(self, rng: jax.Array) -> Tuple[hk.Params, hk.State]:
    cfg = self.config
    batch = self.example_batch()
    z = jnp.zeros((1, cfg.total_len, cfg.hidden_size), cfg.dtype)
    rows = jnp.zeros((1, cfg.emb_ndim), jnp.float32) if cfg.prefix_len else None
    params_rng, latents_rng = jax.random.split(rng)
    # Compiled as one program: the same values as running the forward op by op (which compiles each
    # primitive on its own: 3.8 s for make run's model on the dev CPU, 1.7 s jitted).
    params, inner_state = jax.jit(self._inner.init)(params_rng, z, z, batch["inputs"], rows)
    assert not inner_state, inner_state
    _, state = jax.jit(self._latents.init)(latents_rng)
    return params, state

  def init_puzzle_table(self) -> jax.Array:
    cfg = self.config
    return jnp.zeros((cfg.num_puzzle_identifiers, cfg.emb_ndim), jnp.float32)

  def latents(self, state: hk.State) -> Tuple[jax.Array, jax.Array]:
    (h_init, l_init), _ = self._latents.apply({}, state)
    return h_init, l_init

  def inner(self, params, state, z_H, z_L, inputs, puzzle_rows):
    out, _ = self._inner.apply(params, state, z_H, z_L, inputs, puzzle_rows)
    return out

  def initial_carry(self, batch: Batch) -> ACTCarry:
    return initial_carry(self.config, batch)

  def puzzle_rows(self, puzzle_table: Optional[jax.Array], data: Batch) -> Optional[jax.Array]:
    if not self.config.prefix_len:
      return None
    return jnp.take(puzzle_table, data["puzzle_identifiers"], axis=0)  # [B, E]

  def act_step(self, params, state, puzzle_table, carry: ACTCarry, batch: Batch, *,
               training: bool, rng: Optional[jax.Array] = None,
               puzzle_rows: Optional[jax.Array] = None) -> Tuple[ACTCarry, Dict[str, Any]]:
    """One ACT step. `puzzle_rows` [B, E]: the batch's rows looked up by the caller (e.g. from a
    sharded table; the batch must then be the carry's current data), else read from puzzle_table."""
    carry = act_reset(carry, batch, *self.latents(state))
    data = carry.current_data
    if puzzle_rows is None:
      puzzle_rows = self.puzzle_rows(puzzle_table, data)
    z_H, z_L, logits, q_halt, q_cont = self.inner(
        params, state, carry.z_H, carry.z_L, data["inputs"], puzzle_rows)
    carry = act_halt(self.config, carry._replace(z_H=z_H, z_L=z_L), q_halt, training=training,
                     rng=rng)
    return carry, {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_cont}


def adam_param_count(params: hk.Params) -> int:
  """Number of Adam-trained scalars (the reference's printed count; excludes the puzzle table)."""
  return layers.count_params(params)
