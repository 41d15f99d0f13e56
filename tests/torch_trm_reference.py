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

The reference's TRAINING step is `TrainStep` (section 2 losses, section 4 optimizers): the ACT
wrapper in training mode (Q-halting with exploration), stablemax cross-entropy in float64 and the
Q-halt BCE, `(total / global_batch).backward()`, AdamATan2 on every parameter and sparse SignSGD on
the puzzle table's rows, each with the warm-up + cosine learning rate of the 1-based step, then the
EMA. `experiments/trm/tools/bench_reference.py` times it beside podlab's step.

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
    if self.training and torch.is_grad_enabled():
      # The reference's training path: the batch's rows copied into a leaf that receives the
      # gradient (`local_weights`, with the ids in `local_ids`) for the sparse SignSGD.
      self.local_ids = ids.long()
      self.local_weights = self.weights[self.local_ids].detach().requires_grad_(True)
      return self.local_weights.to(self.dtype)
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


# --------------------------------------------------------------------------------------------------
# The reference's training step (docs/trm.md sections 2 and 4).

IGNORE_LABEL_ID = -100


def log_stablemax(x: Tensor, dim: int = -1) -> Tensor:
  s = torch.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
  return torch.log(s / torch.sum(s, dim=dim, keepdim=True))


def stablemax_cross_entropy(logits: Tensor, labels: Tensor,
                            ignore_index: int = IGNORE_LABEL_ID) -> Tensor:
  """Per-token -log_stablemax at the label, computed in float64, 0 at ignored positions."""
  logprobs = log_stablemax(logits.to(torch.float64), dim=-1)
  valid = labels != ignore_index
  safe = torch.where(valid, labels, 0).long()
  picked = torch.gather(logprobs, index=safe.unsqueeze(-1), dim=-1).squeeze(-1)
  return -torch.where(valid, picked, 0)


def act_loss(logits: Tensor, labels: Tensor, q_halt: Tensor) -> Tuple[Tensor, Dict[str, Tensor]]:
  """The reference's ACTLossHead: total = lm_loss + 0.5 * q_halt_loss (continue loss off)."""
  with torch.no_grad():
    mask = labels != IGNORE_LABEL_ID
    counts = mask.sum(-1)
    divisor = counts.clamp_min(1).unsqueeze(-1)
    correct = mask & (torch.argmax(logits, dim=-1) == labels)
    exact = correct.sum(-1) == counts
  lm_loss = (stablemax_cross_entropy(logits, labels) / divisor).sum()
  q_halt_loss = F.binary_cross_entropy_with_logits(q_halt, exact.to(q_halt.dtype), reduction="sum")
  return lm_loss + 0.5 * q_halt_loss, {"lm_loss": lm_loss.detach(),
                                       "q_halt_loss": q_halt_loss.detach()}


def warmup_cosine_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int,
                     min_ratio: float = 1.0, num_cycles: float = 0.5) -> float:
  """The reference's cosine_schedule_with_warmup_lr_lambda of the 1-based step."""
  if step < warmup_steps:
    return base_lr * float(step) / float(max(1, warmup_steps))
  progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
  return base_lr * (min_ratio + max(0.0, (1 - min_ratio) * 0.5
                                    * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))))


class AdamATan2(torch.optim.Optimizer):
  """p *= 1 - lr wd; m, v as Adam; p -= lr atan2(m / (1 - b1^t), sqrt(v) / sqrt(1 - b2^t))."""

  def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.95), weight_decay: float = 0.1):
    super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

  @torch.no_grad()
  def step(self, closure=None):
    for group in self.param_groups:
      lr, wd, (b1, b2) = group["lr"], group["weight_decay"], group["betas"]
      for p in group["params"]:
        if p.grad is None:
          continue
        st = self.state[p]
        if not st:
          st["step"] = 0
          st["exp_avg"] = torch.zeros_like(p)
          st["exp_avg_sq"] = torch.zeros_like(p)
        st["step"] += 1
        t = st["step"]
        g = p.grad
        p.mul_(1 - lr * wd)
        st["exp_avg"].lerp_(g, 1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        direction = torch.atan2(st["exp_avg"] / (1 - b1 ** t),
                                st["exp_avg_sq"].sqrt() / math.sqrt(1 - b2 ** t))
        p.add_(direction, alpha=-lr)


def sparse_signsgd_(weights: Tensor, ids: Tensor, grads: Tensor, lr: float, wd: float) -> None:
  """The reference's _sparse_emb_signsgd_dist on one process: duplicate ids' gradients summed."""
  with torch.no_grad():
    uniq, inv = ids.unique(return_inverse=True)
    summed = torch.zeros((uniq.shape[0], grads.shape[1]), dtype=grads.dtype)
    summed.scatter_add_(0, inv.unsqueeze(-1).expand(-1, grads.shape[1]), grads)
    p = weights[uniq]
    p.mul_(1.0 - lr * wd).add_(torch.sign(summed), alpha=-lr)
    weights[uniq] = p


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The optimisation fields of the reference (names as podlab's config)."""
  global_batch_size: int
  lr: float = 1e-4
  puzzle_emb_lr: float = 1e-2
  weight_decay: float = 0.1
  puzzle_emb_weight_decay: float = 0.1
  beta1: float = 0.9
  beta2: float = 0.95
  lr_warmup_steps: int = 2000
  total_steps: int = 65104
  lr_min_ratio: float = 1.0
  halt_exploration_prob: float = 0.1
  ema_rate: Optional[float] = None          # None: no EMA (the recipes use 0.999)


class TrainStep:
  """One optimizer step of the reference: `carry, metrics = step(carry, batch)`.

  The ACT wrapper in training mode (reset halted slots, the inner model, steps + 1, halted on
  steps >= halt_max_steps or q_halt > 0, exploration with probability halt_exploration_prob from
  `generator`), `act_loss` / global batch backward, AdamATan2 (every parameter), sparse SignSGD (the
  puzzle table's batch rows), both at the schedule's rate of the 1-based step, then the EMA.
  `carry` starts as `trm.model.initial_carry(batch)`.
  """

  def __init__(self, trm: TorchTRM, config: TrainConfig, seed: int = 0):
    self.trm, self.config = trm, config
    self.act = trm.model
    self.act.train()
    self.cfg = self.act.cfg
    self.step_count = 0
    self.adam = AdamATan2(self.act.inner.parameters(), lr=config.lr,
                          betas=(config.beta1, config.beta2), weight_decay=config.weight_decay)
    self.generator = torch.Generator().manual_seed(seed)
    self.ema = None
    if config.ema_rate is not None:
      self.ema = {k: v.detach().clone() for k, v in self.act.inner.named_parameters()}

  def forward(self, carry: Carry, batch: Dict[str, Tensor]):
    cfg, inner = self.cfg, self.act.inner
    halted = carry.halted
    flag = halted.view(-1, 1, 1)
    z_H = torch.where(flag, inner.H_init.to(cfg.dtype), carry.z_H)
    z_L = torch.where(flag, inner.L_init.to(cfg.dtype), carry.z_L)
    steps = torch.where(halted, torch.zeros_like(carry.steps), carry.steps)
    data = {k: torch.where(halted.view((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()}
    z_H, z_L, logits, q_halt, q_cont = inner(z_H, z_L, data)
    with torch.no_grad():
      steps = steps + 1
      new_halted = steps >= cfg.halt_max_steps
      if cfg.halt_max_steps > 1:
        new_halted = new_halted | (q_halt > 0)
        explore = torch.rand(q_halt.shape, generator=self.generator) < (
            self.config.halt_exploration_prob)
        min_steps = explore * torch.randint(2, cfg.halt_max_steps + 1, steps.shape,
                                            generator=self.generator)
        new_halted = new_halted & (steps >= min_steps)
    return Carry(z_H, z_L, steps, new_halted, data), logits, q_halt, q_cont

  def __call__(self, carry: Carry, batch: Dict[str, Tensor]):
    c, inner = self.config, self.act.inner
    self.step_count += 1
    carry, logits, q_halt, _ = self.forward(carry, batch)
    loss, metrics = act_loss(logits, carry.current_data["labels"], q_halt)
    ((1 / c.global_batch_size) * loss).backward()
    lr = warmup_cosine_lr(self.step_count, c.lr, c.lr_warmup_steps, c.total_steps, c.lr_min_ratio)
    for group in self.adam.param_groups:
      group["lr"] = lr
    if hasattr(inner, "puzzle_emb"):
      emb = inner.puzzle_emb
      emb_lr = warmup_cosine_lr(self.step_count, c.puzzle_emb_lr, c.lr_warmup_steps, c.total_steps,
                                c.lr_min_ratio)
      sparse_signsgd_(emb.weights, emb.local_ids, emb.local_weights.grad, emb_lr,
                      c.puzzle_emb_weight_decay)
    self.adam.step()
    self.adam.zero_grad(set_to_none=True)
    if self.ema is not None:
      with torch.no_grad():
        for k, v in self.act.inner.named_parameters():
          self.ema[k].mul_(c.ema_rate).add_(v.detach(), alpha=1 - c.ema_rate)
    return carry, metrics
