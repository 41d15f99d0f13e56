"""nanoGPT's own random draws without torch: PyTorch's CPU generator replayed in numpy.

nanoGPT's train.py seeds torch's global CPU generator (`torch.manual_seed(seed)`) and every random
number of a run comes from it, in this order: the model's construction (nn.Embedding's normal_,
nn.Linear's kaiming_uniform_ / uniform_, in module order), `_init_weights` (normal_(0, 0.02) on every
Linear and Embedding weight, post-order `apply`: the tied head last), the c_proj re-init
(normal_(0, 0.02 / sqrt(2 L))), then `torch.randint` offsets, B per micro-batch, the eval batches of
iteration i (eval_iters x B for train, then for val) right after iteration i's first micro-batch,
because train.py fetches the next batch ahead. With `config.rng = "torch"` podlab starts from the
same initial weights and trains on the same windows in the same order as nanoGPT (single process or
GPU runs, where dropout draws from the CUDA generator; a CPU run with dropout > 0 also draws its
masks from this generator, which is not replayed). Values match torch to float rounding (normal_ uses
log/sin/cos, whose last bit can differ); offsets match exactly (tests/test_torch_rng.py).

What is replayed (PyTorch's CPU kernels): mt19937 seeded with the standard init_genrand;
`random()` = one 32-bit output; uniform float = (r & (2^24 - 1)) * 2^-24 (one draw per element,
uniform_ / kaiming_uniform_); normal_ on >= 16 float elements = one uniform per element, then
Box-Muller on blocks of 16 (u1 = 1 - x[j], u2 = x[j + 8] -> x[j] = r cos, x[j + 8] = r sin) and, when
16 does not divide the size, 16 fresh uniforms for the last 16 elements; randint(high) = r % high
(r = (r1 << 32) | r2 from two outputs when high >= 2^32).

Shape glossary:  B: global micro-batch (layout.global_batch)   A: layout.accum   E: eval_iters
  D: local devices   b: per-device rows   T: block_size

Synopsis:

  import numpy as np
  from experiments.nanogpt import torch_rng
  from modules import gpt
  g = torch_rng.Generator(1337)
  g.randint(1000, 4)                    # int64 [4], torch.manual_seed(1337); torch.randint(1000, (4,))
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16, bias=False)
  params, draws = torch_rng.init_params(cfg, seed=1337)       # nanoGPT's initial weights, Haiku tree
  from experiments.common import layout as layout_lib
  stream = torch_rng.BatchStream(np.arange(500), np.arange(100), block_size=8,
                                 layout=layout_lib.of(4, devices_per_host=1), eval_interval=5,
                                 eval_iters=2, init_draws=draws, seed=1337)
  x = stream.train(0)["x"]              # int32 [D=1, A=1, b=4, T=8]: nanoGPT's first batch
  evals = stream.eval(0, "val")         # E=2 batches {"x", "y"} [1, 1, 4, 8]
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from experiments.nanogpt import nanogpt_checkpoint
from modules import gpt

_MT_N = 624
_CHUNK = 1 << 20


def _mt19937_key(seed: int) -> np.ndarray:
  """The mt19937 state after init_genrand(seed) (PyTorch's `init_with_uint32`)."""
  key = np.empty(_MT_N, np.uint32)
  x = int(seed) & 0xFFFFFFFF
  key[0] = x
  for j in range(1, _MT_N):
    x = (1812433253 * (x ^ (x >> 30)) + j) & 0xFFFFFFFF
    key[j] = x
  return key


class Generator:
  """torch's CPU generator after `torch.manual_seed(seed)`; `draws` counts 32-bit outputs used."""

  def __init__(self, seed: int):
    if not 0 <= int(seed) < 2**64:
      raise ValueError(f"seed={seed}: torch seeds are in [0, 2**64); use e.g. 1337")
    self.seed = int(seed)
    self._bits = np.random.MT19937(0)
    # pos = 624: the first output regenerates the whole state, as torch's `left_ = 1` does.
    self._bits.state = {"bit_generator": "MT19937",
                        "state": {"key": _mt19937_key(self.seed), "pos": _MT_N}}
    self.draws = 0

  def raw(self, n: int) -> np.ndarray:
    """The next n 32-bit outputs (uint64 array holding uint32 values)."""
    self.draws += int(n)
    return self._bits.random_raw(int(n)).astype(np.uint64)

  def advance(self, n: int) -> None:
    """Skips the next n outputs (in chunks: no large arrays)."""
    self.draws += int(n)
    n = int(n)
    while n > 0:
      k = min(n, _CHUNK)
      self._bits.random_raw(k)
      n -= k

  def uniform(self, n: int) -> np.ndarray:
    """float32 [n] in [0, 1): torch's uniform_real_distribution<float>(0, 1), one draw each."""
    r = self.raw(n) & np.uint64((1 << 24) - 1)
    return (r.astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)

  def normal(self, n: int, mean: float = 0.0, std: float = 1.0) -> np.ndarray:
    """float32 [n]: torch's normal_ on a contiguous float tensor of n >= 16 elements."""
    if n < 16:
      raise ValueError(f"normal_ of {n} < 16 elements takes torch's scalar path, which is not "
                       "replayed; nanoGPT's weights all have >= 16 elements")
    data = self.uniform(n)
    full = (n // 16) * 16
    data[:full] = _box_muller16(data[:full], mean, std)
    if n % 16:
      data[n - 16:] = _box_muller16(self.uniform(16), mean, std)
    return data

  def randint(self, high: int, n: int) -> np.ndarray:
    """int64 [n]: torch.randint(high, (n,)), 0 < high < 2**63: r % high, r one 32-bit output, or
    below 2**32 offsets, or (r1 << 32) | r2 from two outputs above (torch's random64)."""
    high = int(high)
    if not 0 < high < 2**63:
      raise ValueError(f"randint high={high}: must be in (0, 2**63)")
    if high < 2**32:
      return (self.raw(n) % np.uint64(high)).astype(np.int64)
    r = self.raw(2 * n).reshape(n, 2)
    return (((r[:, 0] << np.uint64(32)) | r[:, 1]) % np.uint64(high)).astype(np.int64)


def draws_per_randint(high: int) -> int:
  """Generator outputs one torch.randint(high) element uses."""
  return 1 if int(high) < 2**32 else 2


def _box_muller16(u: np.ndarray, mean: float, std: float) -> np.ndarray:
  """torch's normal_fill_16 on consecutive blocks of 16 uniforms (float32 arithmetic)."""
  blocks = u.reshape(-1, 16)
  u1 = np.float32(1.0) - blocks[:, :8]
  u2 = blocks[:, 8:]
  radius = np.sqrt(np.float32(-2.0) * np.log(u1))
  theta = (2.0 * math.pi * u2.astype(np.float64)).astype(np.float32)
  std32, mean32 = np.float32(std), np.float32(mean)
  out = np.concatenate([radius * np.cos(theta) * std32 + mean32,
                        radius * np.sin(theta) * std32 + mean32], axis=1)
  return out.astype(np.float32).reshape(-1)


def _normal_draws(n: int) -> int:
  return n + (16 if n % 16 else 0)


# --------------------------------------------------------------------------------------------------
# nanoGPT's model initialisation.

def init_state_dict(config: gpt.GPTConfig, gen: Generator) -> Dict[str, np.ndarray]:
  """nanoGPT's GPT(config) weights (state_dict layout, float32), drawing from `gen` in its order."""
  C, V, L = config.n_embd, config.vocab_size, config.n_layer
  linears = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C),
             "mlp.c_proj": (C, 4 * C)}
  # Construction: nn.Embedding normal_(0, 1); nn.Linear kaiming_uniform_ (+ uniform_ bias). Only
  # the number of draws matters: _init_weights overwrites every one of these tensors.
  gen.advance(_normal_draws(V * C))                                   # transformer.wte
  gen.advance(_normal_draws(config.block_size * C))                   # transformer.wpe
  for _ in range(L):
    for out_dim, in_dim in linears.values():                          # c_attn, c_proj, c_fc, c_proj
      gen.advance(out_dim * in_dim + (out_dim if config.bias else 0))
  gen.advance(V * C)                                                  # lm_head (no bias)
  sd: Dict[str, np.ndarray] = {}
  # _init_weights in post-order apply: wte, wpe, each block's Linears, then lm_head (tied to wte:
  # its draw is the one that stays).
  gen.normal(V * C, 0.0, 0.02)
  sd["transformer.wpe.weight"] = gen.normal(config.block_size * C, 0.0, 0.02).reshape(-1, C)
  for i in range(L):
    t = f"transformer.h.{i}"
    for name, (out_dim, in_dim) in linears.items():
      sd[f"{t}.{name}.weight"] = gen.normal(out_dim * in_dim, 0.0, 0.02).reshape(out_dim, in_dim)
      if config.bias:
        sd[f"{t}.{name}.bias"] = np.zeros(out_dim, np.float32)
    for ln in ("ln_1", "ln_2"):
      sd[f"{t}.{ln}.weight"] = np.ones(C, np.float32)
      if config.bias:
        sd[f"{t}.{ln}.bias"] = np.zeros(C, np.float32)
  sd["transformer.wte.weight"] = gen.normal(V * C, 0.0, 0.02).reshape(V, C)
  sd["transformer.ln_f.weight"] = np.ones(C, np.float32)
  if config.bias:
    sd["transformer.ln_f.bias"] = np.zeros(C, np.float32)
  # The residual projections, in named_parameters order (attn.c_proj, mlp.c_proj per block).
  proj_std = 0.02 / math.sqrt(2 * L)
  for i in range(L):
    for name in ("attn.c_proj", "mlp.c_proj"):
      out_dim, in_dim = linears[name]
      sd[f"transformer.h.{i}.{name}.weight"] = gen.normal(out_dim * in_dim, 0.0,
                                                          proj_std).reshape(out_dim, in_dim)
  return sd


def init_params(config: gpt.GPTConfig, seed: int) -> Tuple[Dict[str, Dict[str, np.ndarray]], int]:
  """(Haiku params of nanoGPT's initial model for `seed`, generator draws the init used)."""
  gen = Generator(seed)
  sd = init_state_dict(config, gen)
  return nanogpt_checkpoint.from_state_dict(sd, config), gen.draws


# --------------------------------------------------------------------------------------------------
# nanoGPT's batches.

class BatchStream:
  """nanoGPT's batch offsets, replayed: train micro-batches and eval batches of any iteration.

  The generator's outputs after the init are, per iteration i: micro-batch i*A (B draws), the eval
  batches of i when i % eval_interval == 0 (E x B train offsets, E x B val offsets), micro-batches
  i*A + 1 .. i*A + A - 1. `train(i)` and `eval(i, split)` return this host's rows of them as
  window batches; the stream reads forward, one iteration at a time (resuming at iteration k skips
  the draws before it: 1.2 s per 300M draws here).

  Fields: train_tokens / val_tokens ([N] ids), block_size (T), layout (the run's BatchLayout: B all
  hosts, A, D, b and this host's rows), eval_interval, eval_iters (E), init_draws (outputs the init
  used), seed.
  """

  def __init__(self, train_tokens: np.ndarray, val_tokens: np.ndarray, *, block_size: int,
               layout: Any, eval_interval: int, eval_iters: int, init_draws: int, seed: int):
    self.tokens = {"train": np.asarray(train_tokens), "val": np.asarray(val_tokens)}
    for split, t in self.tokens.items():
      if len(t) <= block_size:
        raise ValueError(f"block_size={block_size}: the {split} split has only {len(t)} tokens; "
                         "it needs more than block_size + 1 (use a smaller block_size)")
    self.T, self.B, self.A = block_size, layout.global_batch, layout.accum
    self.eval_interval, self.E = eval_interval, eval_iters
    self.D, self.b = layout.devices_per_host, layout.per_device_batch
    self.rows = slice(*layout.host_rows)
    self.init_draws, self.seed = init_draws, seed
    self._gen: Optional[Generator] = None
    self._next = 0                     # the iteration the generator is positioned at
    self._cached: Tuple[int, Optional[dict]] = (-1, None)

  def _draws_between(self, start: int, stop: int) -> int:
    """Generator outputs iterations start .. stop - 1 use."""
    per = {s: draws_per_randint(len(t) - self.T) for s, t in self.tokens.items()}
    every = self.eval_interval
    evals = -(-stop // every) - -(-start // every)            # multiples of every in [start, stop)
    return ((stop - start) * self.A * per["train"]
            + evals * self.E * (per["train"] + per["val"])) * self.B

  def _read(self, i: int) -> dict:
    if self._cached[0] == i:
      return self._cached[1]
    if self._gen is None or i < self._next:
      self._gen = Generator(self.seed)
      self._gen.advance(self.init_draws)
      self._next = 0
    self._gen.advance(self._draws_between(self._next, i))
    g, n = self._gen, {s: len(t) - self.T for s, t in self.tokens.items()}
    first = g.randint(n["train"], self.B)                                 # [B]
    evals = None
    if i % self.eval_interval == 0:
      evals = {"train": g.randint(n["train"], self.E * self.B).reshape(self.E, self.B),
               "val": g.randint(n["val"], self.E * self.B).reshape(self.E, self.B)}
    rest = g.randint(n["train"], (self.A - 1) * self.B).reshape(self.A - 1, self.B)
    out = {"train": np.concatenate([first[None], rest], axis=0), "eval": evals}   # [A, B]
    self._next = i + 1
    self._cached = (i, out)
    return out

  def offsets(self, i: int) -> np.ndarray:
    """The global micro-batch offsets of iteration i: int64 [A, B]."""
    return self._read(i)["train"]

  def _windows(self, split: str, offsets: np.ndarray) -> dict:
    """{"x", "y"} int32 [D, A', b, T] of this host's rows of offsets [A', B]."""
    mine = offsets[:, self.rows]                                           # [A', D b]
    w = self.tokens[split][mine[..., None] + np.arange(self.T + 1)]        # [A', D b, T + 1]
    w = w.astype(np.int32).reshape(len(offsets), self.D, self.b, self.T + 1).transpose(1, 0, 2, 3)
    return {"x": np.ascontiguousarray(w[..., :-1]), "y": np.ascontiguousarray(w[..., 1:])}

  def train(self, i: int) -> dict:
    """Iteration i's micro-batches: {"x", "y"} int32 [D, A, b, T]."""
    return self._windows("train", self.offsets(i))

  def eval(self, i: int, split: str) -> List[dict]:
    """The E batches nanoGPT evaluates `split` ("train"/"val") on at iteration i ([D, 1, b, T])."""
    evals = self._read(i)["eval"]
    if evals is None:
      raise ValueError(f"iteration {i} has no evaluation in nanoGPT's stream (eval_interval="
                       f"{self.eval_interval})")
    return [self._windows(split, evals[split][e][None]) for e in range(self.E)]
