"""An independent PyTorch TRM for tests, written from docs/trm.md sections 1 and 8.

Float32 forward by default (`RefConfig.forward_dtype="bfloat16"` runs the reference's training dtype).

It imports no podlab code. Module and parameter names follow the reference, so
`TorchTRM(cfg).state_dict()` has exactly the section-8 keys (`model.inner.*`), and the tests can save
it with torch.save, import it into podlab and compare one or several ACT steps.

Pieces: CastedLinear / CastedEmbedding (float32 weights cast to the input/forward dtype at use), the
sparse puzzle embedding (a `weights` buffer), SwiGLU, non-causal attention with rotate-half RoPE,
post-norm blocks (attention or token MLP over the sequence axis, whose RMSNorm normalises over S),
the reasoning module (hidden + injection, then the blocks), the inner model (input embedding with the
16-slot prefix and sqrt(D) scaling, learned/rope/none positions, T-1 gradient-free cycles then one with
gradient, lm head, Q head, H_init/L_init buffers) and the ACT wrapper in evaluation mode.

Synopsis:

  import torch
  from tests import torch_trm_reference as ref

  cfg = ref.RefConfig(seq_len=81, vocab_size=11, hidden_size=64, num_heads=2, mlp_t=True,
                      pos_encodings="none", H_cycles=2, L_cycles=2, halt_max_steps=2)
  model = ref.TorchTRM(cfg)
  ref.randomize_(model, seed=0)
  batch = {"inputs": torch.ones(4, 81, dtype=torch.int32),
           "labels": torch.full((4, 81), 2, dtype=torch.int32),
           "puzzle_identifiers": torch.zeros(4, dtype=torch.int32)}
  carry = model.model.initial_carry(batch)
  carry, out = model.model(carry, batch)                # out["logits"]: [4, 81, 11]
  torch.save(model.state_dict(), "/tmp/trm_ref.pt")     # keys model.inner.*
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import torch
from torch import nn
import torch.nn.functional as F

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class RefConfig:
  """The reference's architecture fields (names as in the reference config)."""
  seq_len: int
  vocab_size: int
  num_puzzle_identifiers: int = 1
  puzzle_emb_ndim: int = -1          # -1: = hidden_size; 0: no puzzle embedding
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
  halt_max_steps: int = 16
  forward_dtype: str = "float32"     # "bfloat16" is the reference's training/eval dtype
  # The dtype of the H_init/L_init buffers. The reference creates them in its forward dtype: a
  # published (bfloat16) run stores bfloat16, a forward_dtype="float32" run float32. Default
  # bfloat16: the tests run a bfloat16-trained checkpoint's weights in float32.
  init_dtype: str = "bfloat16"

  @property
  def dtype(self) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.forward_dtype]

  @property
  def emb_ndim(self) -> int:
    return self.hidden_size if self.puzzle_emb_ndim < 0 else self.puzzle_emb_ndim

  @property
  def prefix(self) -> int:
    if self.emb_ndim == 0:
      return 0
    return self.puzzle_emb_len if self.puzzle_emb_len else math.ceil(self.emb_ndim / self.hidden_size)


def trunc_normal_(t: Tensor, std: float, gen: torch.Generator) -> Tensor:
  """Truncated at +-2 of the underlying normal, rescaled so the result's std is exactly `std`."""
  with torch.no_grad():
    u = torch.empty(t.shape, dtype=torch.float32)
    nn.init.trunc_normal_(u, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=gen)
    t.copy_(u * (std / 0.87962566103423978))
  return t


def rms_norm(x: Tensor, eps: float) -> Tensor:
  """RMSNorm over the last axis without a scale, in float32, returned in x's dtype."""
  dtype = x.dtype
  x = x.float()
  x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
  return x.to(dtype)


class CastedLinear(nn.Module):
  """y = x W^T (+ b) with W (out, in) float32, cast to x's dtype at use."""

  def __init__(self, in_features: int, out_features: int, bias: bool):
    super().__init__()
    self.weight = nn.Parameter(torch.zeros(out_features, in_features))
    self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    b = None if self.bias is None else self.bias.to(x.dtype)
    return F.linear(x, self.weight.to(x.dtype), b)


class CastedEmbedding(nn.Module):
  def __init__(self, num: int, dim: int, dtype: torch.dtype):
    super().__init__()
    self.embedding_weight = nn.Parameter(torch.zeros(num, dim))
    self.dtype = dtype

  def forward(self, ids: Tensor) -> Tensor:
    return F.embedding(ids.long(), self.embedding_weight.to(self.dtype))


class PuzzleEmbedding(nn.Module):
  """The sparse puzzle table: a persistent float32 buffer `weights` (not a parameter)."""

  def __init__(self, num: int, dim: int, dtype: torch.dtype):
    super().__init__()
    self.register_buffer("weights", torch.zeros(num, dim), persistent=True)
    self.dtype = dtype

  def forward(self, ids: Tensor) -> Tensor:
    return self.weights[ids.long()].to(self.dtype)


def swiglu_inner(width: int, expansion: float) -> int:
  inner = round(expansion * width * 2 / 3)
  return ((inner + 255) // 256) * 256


class SwiGLU(nn.Module):
  def __init__(self, width: int, expansion: float):
    super().__init__()
    inner = swiglu_inner(width, expansion)
    self.gate_up_proj = CastedLinear(width, 2 * inner, bias=False)
    self.down_proj = CastedLinear(inner, width, bias=False)

  def forward(self, x: Tensor) -> Tensor:
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(F.silu(gate) * up)


def rotate_half(x: Tensor) -> Tensor:
  half = x.shape[-1] // 2
  return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
  def __init__(self, hidden: int, heads: int):
    super().__init__()
    self.heads = heads
    self.head_dim = hidden // heads
    self.qkv_proj = CastedLinear(hidden, 3 * hidden, bias=False)
    self.o_proj = CastedLinear(hidden, hidden, bias=False)

  def forward(self, x: Tensor, cos_sin: Optional[Tuple[Tensor, Tensor]]) -> Tensor:
    B, S, D = x.shape
    qkv = self.qkv_proj(x).view(B, S, 3 * self.heads, self.head_dim)
    q, k, v = qkv[:, :, :self.heads], qkv[:, :, self.heads:2 * self.heads], qkv[:, :, 2 * self.heads:]
    if cos_sin is not None:
      cos, sin = cos_sin                               # [S, Dh] float32
      cos, sin = cos[:, None, :], sin[:, None, :]
      q = (q.float() * cos + rotate_half(q.float()) * sin).to(q.dtype)
      k = (k.float() * cos + rotate_half(k.float()) * sin).to(k.dtype)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))   # [B, H, S, Dh]
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v).transpose(1, 2).reshape(B, S, D)
    return self.o_proj(out)


class Block(nn.Module):
  def __init__(self, cfg: RefConfig):
    super().__init__()
    self.cfg = cfg
    if cfg.mlp_t:
      self.mlp_t = SwiGLU(cfg.seq_len + cfg.prefix, cfg.expansion)
    else:
      self.self_attn = Attention(cfg.hidden_size, cfg.num_heads)
    self.mlp = SwiGLU(cfg.hidden_size, cfg.expansion)

  def forward(self, h: Tensor, cos_sin) -> Tensor:
    eps = self.cfg.rms_norm_eps
    if self.cfg.mlp_t:
      t = h.transpose(1, 2)                            # [B, D, S]
      t = rms_norm(t + self.mlp_t(t), eps)             # normalises over S
      h = t.transpose(1, 2)
    else:
      h = rms_norm(h + self.self_attn(h, cos_sin), eps)
    return rms_norm(h + self.mlp(h), eps)


class ReasoningModule(nn.Module):
  def __init__(self, cfg: RefConfig):
    super().__init__()
    self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.L_layers)])

  def forward(self, hidden: Tensor, injection: Tensor, cos_sin) -> Tensor:
    hidden = hidden + injection
    for layer in self.layers:
      hidden = layer(hidden, cos_sin)
    return hidden


class Inner(nn.Module):
  def __init__(self, cfg: RefConfig):
    super().__init__()
    self.cfg = cfg
    D = cfg.hidden_size
    self.embed_tokens = CastedEmbedding(cfg.vocab_size, D, cfg.dtype)
    self.lm_head = CastedLinear(D, cfg.vocab_size, bias=False)
    self.q_head = CastedLinear(D, 2, bias=True)
    if cfg.emb_ndim > 0:
      self.puzzle_emb = PuzzleEmbedding(cfg.num_puzzle_identifiers, cfg.emb_ndim, cfg.dtype)
    total = cfg.seq_len + cfg.prefix
    if cfg.pos_encodings == "learned":
      self.embed_pos = CastedEmbedding(total, D, cfg.dtype)
    self.cos_sin = None
    if cfg.pos_encodings == "rope":
      head_dim = D // cfg.num_heads
      inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32)
                                           / head_dim))
      freqs = torch.outer(torch.arange(total, dtype=torch.float32), inv_freq)
      emb = torch.cat((freqs, freqs), dim=-1)
      self.cos_sin = (emb.cos(), emb.sin())            # recomputed, never stored
    self.L_level = ReasoningModule(cfg)
    init = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.init_dtype]
    self.register_buffer("H_init", torch.zeros(D, dtype=init), persistent=True)
    self.register_buffer("L_init", torch.zeros(D, dtype=init), persistent=True)

  def input_embeddings(self, inputs: Tensor, puzzle_ids: Tensor) -> Tensor:
    cfg = self.cfg
    D = cfg.hidden_size
    x = self.embed_tokens(inputs)                      # [B, L, D]
    if cfg.emb_ndim > 0:
      p = self.puzzle_emb(puzzle_ids)                  # [B, E]
      pad = cfg.prefix * D - p.shape[-1]
      if pad > 0:
        p = F.pad(p, (0, pad))
      x = torch.cat((p.view(-1, cfg.prefix, D).to(cfg.dtype), x), dim=-2)
    if cfg.pos_encodings == "learned":
      x = 0.707106781 * (x + self.embed_pos.embedding_weight.to(cfg.dtype))
    return math.sqrt(D) * x

  def forward(self, z_H: Tensor, z_L: Tensor, batch: Dict[str, Tensor]):
    cfg = self.cfg
    x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
    cs = self.cos_sin
    with torch.no_grad():
      for _ in range(cfg.H_cycles - 1):
        for _ in range(cfg.L_cycles):
          z_L = self.L_level(z_L, z_H + x, cs)
        z_H = self.L_level(z_H, z_L, cs)
    for _ in range(cfg.L_cycles):
      z_L = self.L_level(z_L, z_H + x, cs)
    z_H = self.L_level(z_H, z_L, cs)
    logits = self.lm_head(z_H)[:, cfg.prefix:]
    q = self.q_head(z_H[:, 0]).to(torch.float32)
    return z_H.detach(), z_L.detach(), logits, q[..., 0], q[..., 1]


@dataclasses.dataclass
class Carry:
  z_H: Tensor
  z_L: Tensor
  steps: Tensor
  halted: Tensor
  current_data: Dict[str, Tensor]


class ACT(nn.Module):
  """The ACT wrapper, evaluation mode: every example runs exactly halt_max_steps steps."""

  def __init__(self, cfg: RefConfig):
    super().__init__()
    self.cfg = cfg
    self.inner = Inner(cfg)

  def initial_carry(self, batch: Dict[str, Tensor]) -> Carry:
    B = batch["inputs"].shape[0]
    S = self.cfg.seq_len + self.cfg.prefix
    z = torch.zeros(B, S, self.cfg.hidden_size, dtype=self.cfg.dtype)
    return Carry(z, z.clone(), torch.zeros(B, dtype=torch.int32), torch.ones(B, dtype=torch.bool),
                 {k: torch.zeros_like(v) for k, v in batch.items()})

  @torch.no_grad()
  def forward(self, carry: Carry, batch: Dict[str, Tensor]):
    halted = carry.halted
    flag = halted.view(-1, 1, 1)
    z_H = torch.where(flag, self.inner.H_init.to(self.cfg.dtype), carry.z_H)
    z_L = torch.where(flag, self.inner.L_init.to(self.cfg.dtype), carry.z_L)
    steps = torch.where(halted, torch.zeros_like(carry.steps), carry.steps)
    data = {k: torch.where(halted.view((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()}
    z_H, z_L, logits, q_halt, q_cont = self.inner(z_H, z_L, data)
    steps = steps + 1
    new_halted = steps >= self.cfg.halt_max_steps
    out = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_cont}
    return Carry(z_H, z_L, steps, new_halted, data), out


class TorchTRM(nn.Module):
  """Holds the ACT model as `.model` so state_dict keys read `model.inner.*` (section 8)."""

  def __init__(self, cfg: RefConfig):
    super().__init__()
    self.model = ACT(cfg)


def randomize_(trm: TorchTRM, seed: int, q_std: float = 0.3, table_std: float = 0.5) -> TorchTRM:
  """Random reference-style weights, with a NON-zero Q head and random puzzle rows (so q values and
  the prefix are informative); H_init/L_init truncated normal std 1 in their dtype (cfg.init_dtype)."""
  gen = torch.Generator().manual_seed(seed)
  inner = trm.model.inner
  D = inner.cfg.hidden_size
  with torch.no_grad():
    for name, p in inner.named_parameters():
      if name.startswith("q_head"):
        p.copy_(torch.randn(p.shape, generator=gen) * q_std)
      elif p.ndim == 2 and "embedding_weight" in name:
        trunc_normal_(p, 1.0 / math.sqrt(D), gen)
      else:
        trunc_normal_(p, 1.0 / math.sqrt(p.shape[1]), gen)
    if hasattr(inner, "puzzle_emb"):
      inner.puzzle_emb.weights.copy_(torch.randn(inner.puzzle_emb.weights.shape, generator=gen)
                                     * table_std)
    for buf in (inner.H_init, inner.L_init):
      buf.copy_(trunc_normal_(torch.empty(D), 1.0, gen).to(buf.dtype))
  return trm
