r"""Masked-diffusion sampling for Dream / DiffuCoder: the reference `diffusion_generate`, in JAX.

The canvas is the (left-padded) prompt followed by `max_new_tokens` mask tokens; its length never
changes. Each of exactly `steps` iterations runs the model over the canvas, shifts the logits right by
one (position j reads the raw logit of j - 1), and unmasks some masked positions:

  timesteps  = linspace(1, eps=1e-3, steps + 1) in float32 (torch's two-sided linspace formula);
  t, s       = timesteps[i], timesteps[i + 1];  ratio_i = 1 - s / t  (float32; 1 at the last step)
  origin     : every masked position independently unmasks with probability ratio_i, with a token
               drawn from the filtered distribution;
  maskgit_plus / topk_margin / entropy: confidence = p(chosen token) / p1 - p2 / sum p log(p + 1e-10);
               k = floor(M * ratio_i), M = the batch-average number of masked positions; per row the k
               most confident masked positions unmask (or k sampled without replacement from
               softmax(confidence / alg_temp) when alg_temp > 0, by the Gumbel-top-k trick).
  token choice: logits / temperature (if > 0), top-p then top-k filtering (removed logits set to the
               dtype's minimum), probs = softmax; a draw from probs if temperature > 0 else argmax.
Unmasked tokens are never re-masked. Sampling runs in float32 on the model's (bfloat16) logits.

Beyond the reference (off by default; `SamplerOptions`): block-wise decoding of the generated region
in blocks of `block_length` (steps split evenly over blocks; each block has its own schedule), with an
approximate KV cache (Fast-dLLM, arXiv 2505.22618) refreshed at every block start: `cache="prefix"`
reuses the keys/values of everything before the block, `cache="dual"` also those after it, and
confidence-threshold parallel decoding (`threshold` > 0: per step, unmask the most probable masked
token of the block plus every masked token of the block whose probability is >= threshold).
`block_algorithm` says how a block runs:
  "podlab" (default, `block_fn`): the block-start forward is the block's first schedule step (k_0
    tokens by the alg's confidence, or a threshold step), the cached forwards take the rest.
  "fast_dllm" (`fast_dllm_block_fn`): Fast-dLLM's published Dream loop (NVlabs/Fast-dLLM
    dream/model/generation_utils_block.py), token for token on unpadded rows at temperature 0
    (tests/test_diffucoder_fast_dllm.py): the block-start forward fixes the block's first position
    and nothing else; the schedule continues at step 1 on the cached forwards; without a threshold
    the confidence is entropy whatever `alg` is (validate() asks for alg="entropy"). Differences:
    the sampler runs in float32 (Fast-dLLM's in the model dtype, bf16 for the 7B); its threshold
    branch handles batch 1 (here each row independently); its cached calls give the model a padding
    mask sliced to another shape and positions 0..L-1 (it evaluates batch 1 unpadded; here padding
    is masked and positions restart per row, which is the same for unpadded rows); a threshold block
    stops after block_length cached forwards (Fast-dLLM never stops while the model predicts
    <|mask|>).

Shape glossary:
  B: batch (rows)     L: canvas length (prompt + max_new_tokens)    V: vocabulary size
  W: window (the positions a step reads: the canvas, a block, or a block plus its suffix)
  C: cached context length (keys/values reused from the block-start forward)

Synopsis (a toy "model" that always predicts token 7 with logit 5):

  import jax, jax.numpy as jnp
  from experiments.diffucoder import sampling

  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    logits = jnp.zeros(tokens.shape + (16,)).at[..., 7].set(5.0)        # [B, L, V]
    return (logits, None) if return_kv else logits

  opts = sampling.SamplerOptions(steps=4, alg="entropy")
  prompt = jnp.array([[1, 2, 3]]); valid = jnp.ones((1, 3), bool)
  out = sampling.generate(forward, None, prompt, valid, jax.random.key(0), opts,
                          max_new_tokens=4, mask_id=15)
  assert out.tokens.tolist() == [[1, 2, 3, 7, 7, 7, 7]]               # [B, L]
  assert sampling.transfer_schedule(256, 256)[:3] == [0, 1, 1]
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import PartitionSpec as P

from experiments.common import config_utils
from experiments.common import errors
from experiments.common import parallel
from experiments.diffucoder import model_sharding

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
CACHES = ("none", "prefix", "dual")
BLOCK_ALGORITHMS = ("podlab", "fast_dllm")
ENTROPY_EPS = 1e-10
"""Added inside the log of the entropy confidence, as in the reference."""

# forward(params, tokens [B, W], valid [B, W], positions [B, W], context, return_kv)
#   -> logits [B, W, V] (raw), or (logits, kv_list) when return_kv.
ForwardFn = Callable[..., Any]


# ----------------------------------------------------------------------------------------------
# Options.


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
  """Sampler settings (all static: a change recompiles).

  Fields:
    steps: diffusion steps (forward passes of the plain sampler).
    alg: one of ALGS.
    temperature: 0 = greedy (argmax); > 0 divides the logits and samples.
    top_p: nucleus filtering; None or >= 1 disables.
    top_k: top-k filtering; None or 0 disables.
    alg_temp: 0 = take the k most confident positions; > 0 samples them from softmax(conf / alg_temp).
    eps: the last timestep of linspace(1, eps, steps + 1).
    block_length: 0 = the reference (whole generated region at once); > 0 = block-wise decoding.
    cache: "none", "prefix" or "dual" (approximate KV cache refreshed at each block start; needs
      block_length > 0).
    threshold: 0 = off; > 0 = confidence-threshold parallel decoding within blocks (needs
      block_length > 0; a block then takes as many steps as it needs, at most block_length).
    block_algorithm: how a block is decoded (block_length > 0): "podlab" (`block_fn`: the block's
      schedule starts on the block-start forward) or "fast_dllm" (`fast_dllm_block_fn`: Fast-dLLM's
      published Dream loop, exactly: the block-start forward fixes the block's first position, the
      schedule continues on the cached forwards, entropy confidence without a threshold).
  """
  steps: int = 256
  alg: str = "entropy"
  temperature: float = 0.0
  top_p: Optional[float] = None
  top_k: Optional[int] = None
  alg_temp: float = 0.0
  eps: float = 1e-3
  block_length: int = 0
  cache: str = "none"
  threshold: float = 0.0
  block_algorithm: str = "podlab"

  def validate(self, max_new_tokens: int, prefix: str = "generate") -> None:
    """Raises ConfigError (naming `prefix.field`, the value and the fix) for unusable settings."""
    E = config_utils.ConfigError
    if max_new_tokens < 1:
      raise E(f"{prefix}.max_new_tokens", max_new_tokens, "must be >= 1", "ask for some tokens")
    if self.steps < 1:
      raise E(f"{prefix}.steps", self.steps, "must be >= 1",
              f"use e.g. steps = max_new_tokens = {max_new_tokens}")
    if self.alg not in ALGS:
      raise E(f"{prefix}.alg", self.alg, "unknown algorithm", f"use one of {', '.join(ALGS)}")
    if self.temperature < 0:
      raise E(f"{prefix}.temperature", self.temperature, "must be >= 0", "use 0 for greedy")
    if self.top_p is not None and not 0 < self.top_p:
      raise E(f"{prefix}.top_p", self.top_p, "must be in (0, 1]", "use e.g. 0.95, or 1 to disable")
    if self.top_k is not None and self.top_k < 0:
      raise E(f"{prefix}.top_k", self.top_k, "must be >= 0", "use 0 to disable")
    if self.alg_temp < 0:
      raise E(f"{prefix}.alg_temp", self.alg_temp, "must be >= 0", "use 0 for top-k selection")
    if not 0 < self.eps < 1:
      raise E(f"{prefix}.eps", self.eps, "must be in (0, 1)", "use the reference's 1e-3")
    if self.cache not in CACHES:
      raise E(f"{prefix}.cache", self.cache, "unknown cache", f"use one of {', '.join(CACHES)}")
    if not 0 <= self.threshold <= 1:
      raise E(f"{prefix}.threshold", self.threshold, "must be in [0, 1]", "use 0 (off) or e.g. 0.9")
    if self.block_length < 0:
      raise E(f"{prefix}.block_length", self.block_length, "must be >= 0", "use 0 (off) or e.g. 32")
    if self.block_algorithm not in BLOCK_ALGORITHMS:
      raise E(f"{prefix}.block_algorithm", self.block_algorithm, "unknown block algorithm",
              f"use one of {', '.join(BLOCK_ALGORITHMS)}")
    if self.block_length == 0:
      if self.block_algorithm != "podlab":
        raise E(f"{prefix}.block_algorithm", self.block_algorithm,
                "Fast-dLLM's loop decodes blocks and block_length is 0",
                "set --config.generate.block_length=32 (Fast-dLLM's) and cache=prefix or dual")
      if self.cache != "none":
        raise E(f"{prefix}.cache", self.cache, "the KV cache is block-wise and block_length is 0",
                "set --config.generate.block_length=32 (a divisor of max_new_tokens)")
      if self.threshold > 0:
        raise E(f"{prefix}.threshold", self.threshold,
                "parallel decoding works per block and block_length is 0",
                "set --config.generate.block_length=32 (a divisor of max_new_tokens)")
      return
    if max_new_tokens % self.block_length:
      raise E(f"{prefix}.block_length", self.block_length,
              f"does not divide max_new_tokens={max_new_tokens}",
              "use a divisor of max_new_tokens (e.g. 32 for 256)")
    num_blocks = max_new_tokens // self.block_length
    if (self.threshold == 0 or self.block_algorithm == "fast_dllm") and self.steps % num_blocks:
      raise E(f"{prefix}.steps", self.steps,
              f"not divisible by the {num_blocks} blocks of {self.block_length} tokens",
              f"use a multiple of {num_blocks}")
    if self.block_algorithm == "fast_dllm" and self.threshold == 0:
      if self.steps // num_blocks < 2:
        raise E(f"{prefix}.steps", self.steps,
                f"gives {self.steps // num_blocks} step per block: Fast-dLLM's loop then leaves all "
                "but the block's first position masked",
                f"use steps >= {2 * num_blocks} (2 per block), or a threshold")
      if self.alg != "entropy":
        raise E(f"{prefix}.alg", self.alg,
                "Fast-dLLM's block loop ranks by entropy whatever alg says (without a threshold)",
                "set alg=entropy, or block_algorithm=podlab for another confidence")
    if self.alg == "origin" and self.threshold > 0:
      raise E(f"{prefix}.alg", self.alg, "threshold decoding ranks tokens by confidence",
              "use maskgit_plus/topk_margin/entropy, or threshold=0")

  @property
  def filtering(self) -> Tuple[float, Optional[float], Optional[int]]:
    return self.temperature, self.top_p, self.top_k


# ----------------------------------------------------------------------------------------------
# The transfer schedule (host-side numbers, exactly the reference's float32 arithmetic).


def timesteps(steps: int, eps: float = 1e-3) -> np.ndarray:
  """linspace(1, eps, steps + 1) as torch computes it in float32 ([steps + 1]).

  torch's kernel fills the first half as start + step * i and the second as end - step * (n - 1 - i),
  with step = (end - start) / (n - 1) in float32 and a fused multiply-add (nvcc's default, and what
  torch's CPU kernel matches); emulated by one float64 evaluation rounded to float32. `jnp.linspace`
  rounds differently in a few (L, steps) pairs, which changes the schedule there.
  """
  n = steps + 1
  start, end = np.float32(1.0), np.float32(eps)
  if n == 1:
    return np.array([start], np.float32)
  step = np.float32((end - start) / np.float32(n - 1))
  i = np.arange(n, dtype=np.float64)
  first = np.float64(start) + np.float64(step) * i
  second = np.float64(end) - np.float64(step) * (n - 1 - i)
  return np.where(i < n // 2, first, second).astype(np.float32)


def transfer_ratios(steps: int, eps: float = 1e-3) -> np.ndarray:
  """ratio_i = 1 - s / t in float32 for each step ([steps]), 1 at the last step.

  `origin` unmasks each masked position with probability ratio_i; the other algorithms unmask
  k_i = floor(M * ratio_i) positions per row (at the last step floor(M): everything left).
  """
  ts = timesteps(steps, eps)
  ratios = (np.float32(1.0) - ts[1:] / ts[:-1]).astype(np.float32)
  ratios[-1] = np.float32(1.0)
  return ratios


def transfer_schedule(num_masked: int, steps: int, eps: float = 1e-3) -> List[int]:
  """Tokens unmasked per step (per row) when every row starts with `num_masked` mask tokens.

  E.g. (256, 256) -> [0, 1, 1, ..., 1, 2]; (256, 128) -> [1, 2, ..., 2, 3]. Sums to num_masked.
  """
  ks, m = [], num_masked
  for r in transfer_ratios(steps, eps):
    k = int(np.float32(m) * r)
    ks.append(k)
    m -= k
  return ks


def num_transfer(mask: jax.Array, ratio: jax.Array, axis_name: Optional[str] = None) -> jax.Array:
  """k = floor(M * ratio) with M = masked positions per row averaged over the batch (int32 scalar).

  mask: [B, W] bool. With `axis_name` (inside pmap) M is averaged over the whole data-parallel batch,
  as the reference averages over its one batch.
  """
  count = jnp.sum(mask, dtype=jnp.int32)
  rows = jnp.int32(mask.shape[0])
  if axis_name is not None:
    count = jax.lax.psum(count, axis_name)
    rows = jax.lax.psum(rows, axis_name)
  m = count.astype(jnp.float32) / rows.astype(jnp.float32)
  return jnp.floor(m * ratio).astype(jnp.int32)


# ----------------------------------------------------------------------------------------------
# Token choice and confidences.


def shift_logits(logits: jax.Array) -> jax.Array:
  """[B, L, V] -> [B, L, V]: position j gets the raw logit of j - 1 (position 0 keeps its own)."""
  return jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)


def top_p_filter(logits: jax.Array, top_p: Optional[float]) -> jax.Array:
  """Keeps the most probable tokens up to and including the first whose cumulative probability
  exceeds top_p (ties in stable index order); the rest get the dtype's minimum. [..., V]."""
  if top_p is None or top_p >= 1:
    return logits
  order = jnp.argsort(-logits, axis=-1, stable=True)                  # descending
  sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
  cum = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
  remove = cum > top_p
  remove = jnp.concatenate([jnp.zeros_like(remove[..., :1]), remove[..., :-1]], axis=-1)
  remove = jnp.take_along_axis(remove, jnp.argsort(order, axis=-1), axis=-1)   # back to vocab order
  return jnp.where(remove, jnp.finfo(logits.dtype).min, logits)


def top_k_filter(logits: jax.Array, top_k: Optional[int]) -> jax.Array:
  """Removes (dtype minimum) every logit below the k-th largest; ties with it stay. [..., V]."""
  if not top_k:
    return logits
  k = min(int(top_k), logits.shape[-1])
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  return jnp.where(logits < kth, jnp.finfo(logits.dtype).min, logits)


def filtered_logits(logits: jax.Array, temperature: float, top_p: Optional[float],
                    top_k: Optional[int]) -> jax.Array:
  """Temperature, then top-p, then top-k, in float32 ([..., V])."""
  logits = logits.astype(jnp.float32)
  if temperature > 0:
    logits = logits / jnp.float32(temperature)
  return top_k_filter(top_p_filter(logits, top_p), top_k)


def sample_tokens(key: jax.Array, logits: jax.Array, *, temperature: float = 0.0,
                  top_p: Optional[float] = None, top_k: Optional[int] = None,
                  alg: str = "maskgit_plus", vocab_axis: Optional[str] = None
                  ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Token choice and confidence for every position.

  logits: [..., V] (already shifted). Returns (confidence [...] float32, tokens [...] int32,
  probability of the chosen token [...] float32). The confidence is the alg's: maskgit_plus and
  origin: p(chosen); topk_margin: p1 - p2; entropy: sum p log(p + 1e-10).
  vocab_axis: inside shard_map with the vocabulary split over this mesh axis, `logits` is this
  device's [..., V/m] block (`vocab_sharded_sample_tokens`).
  """
  if vocab_axis is not None:
    return vocab_sharded_sample_tokens(key, logits, vocab_axis, temperature=temperature,
                                       top_p=top_p, top_k=top_k, alg=alg)
  logits = filtered_logits(logits, temperature, top_p, top_k)
  probs = jax.nn.softmax(logits, axis=-1)
  if temperature > 0:
    tokens = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    p_chosen = jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]
  else:
    tokens = jnp.argmax(probs, axis=-1).astype(jnp.int32)
    p_chosen = jnp.max(probs, axis=-1)
  if alg in ("maskgit_plus", "origin"):
    confidence = p_chosen
  elif alg == "topk_margin":
    top2 = jax.lax.top_k(probs, 2)[0]
    confidence = top2[..., 0] - top2[..., 1]
  elif alg == "entropy":
    confidence = jnp.sum(probs * jnp.log(probs + ENTROPY_EPS), axis=-1)
  else:
    raise errors.BadInput(f"alg={alg!r}: unknown. Fix: use one of {', '.join(ALGS)}")
  return confidence, tokens, p_chosen


def vocab_sharded_sample_tokens(key: jax.Array, logits: jax.Array, vocab_axis: str, *,
                                temperature: float = 0.0, top_p: Optional[float] = None,
                                top_k: Optional[int] = None, alg: str = "maskgit_plus"
                                ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`sample_tokens` on a vocabulary split over the mesh axis `vocab_axis` (inside shard_map).

  logits: this device's [..., V/m] columns (device i holds ids [i V/m, (i+1) V/m)); the results are
  the same on every device of the axis. Greedy decoding without top-p / top-k never gathers a row:
  the softmax is a sharded max and sum (pmax, psum), the argmax the smallest id among the devices'
  argmaxes of the largest probability (argmax's first-index tie rule), topk_margin gathers each
  device's top 2, entropy is a psum of per-device sums. Sampling (temperature > 0) and top-p /
  top-k filtering gather the row's V logits on every device of the axis and run `sample_tokens`
  (the same numbers as unsharded, at the unsharded sampler's memory).
  """
  if temperature > 0 or (top_p is not None and top_p < 1) or top_k:
    full = jax.lax.all_gather(logits, vocab_axis, axis=logits.ndim - 1, tiled=True)  # [..., V]
    return sample_tokens(key, full, temperature=temperature, top_p=top_p, top_k=top_k, alg=alg)
  if alg not in ALGS:
    raise errors.BadInput(f"alg={alg!r}: unknown. Fix: use one of {', '.join(ALGS)}")
  x = logits.astype(jnp.float32)                                        # [..., V/m]
  width = x.shape[-1]
  top = jax.lax.pmax(jnp.max(x, axis=-1), vocab_axis)                  # [...] the row's max logit
  e = jnp.exp(x - top[..., None])
  total = jax.lax.psum(jnp.sum(e, axis=-1), vocab_axis)                 # [...] softmax denominator
  probs = e / total[..., None]                                          # this device's p
  local_best = jnp.max(probs, axis=-1)
  p_chosen = jax.lax.pmax(local_best, vocab_axis)
  local_id = (jnp.argmax(probs, axis=-1).astype(jnp.int32)
              + jax.lax.axis_index(vocab_axis).astype(jnp.int32) * width)
  tokens = jax.lax.pmin(jnp.where(local_best == p_chosen, local_id, jnp.iinfo(jnp.int32).max),
                        vocab_axis)
  if alg in ("maskgit_plus", "origin"):
    confidence = p_chosen
  elif alg == "topk_margin":
    tops = jax.lax.all_gather(jax.lax.top_k(probs, min(2, width))[0], vocab_axis,
                              axis=probs.ndim - 1, tiled=True)          # [..., 2m]
    top2 = jax.lax.top_k(tops, 2)[0]
    confidence = top2[..., 0] - top2[..., 1]
  else:
    confidence = jax.lax.psum(jnp.sum(probs * jnp.log(probs + ENTROPY_EPS), axis=-1), vocab_axis)
  return confidence, tokens, p_chosen


def ranks(scores: jax.Array) -> jax.Array:
  """Rank of each entry along the last axis in descending order (0 = largest; ties by index)."""
  order = jnp.argsort(-scores, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True)


def select_transfer(key: jax.Array, confidence: jax.Array, mask: jax.Array, k: jax.Array,
                    alg_temp: float = 0.0) -> jax.Array:
  """Which masked positions to unmask: per row the k best by confidence, or (alg_temp > 0) k drawn
  without replacement from softmax(confidence / alg_temp) over the masked positions (Gumbel-top-k,
  the same distribution as torch.multinomial without replacement). Never selects an unmasked
  position, even when k exceeds a row's masked count. confidence, mask: [B, W]; -> [B, W] bool."""
  score = confidence.astype(jnp.float32)
  if alg_temp > 0:
    score = score / jnp.float32(alg_temp) + jax.random.gumbel(key, score.shape, jnp.float32)
  score = jnp.where(mask, score, -jnp.inf)
  return (ranks(score) < k) & mask


# ----------------------------------------------------------------------------------------------
# One step on a window of the canvas.


def unmask_step(key: jax.Array, tokens: jax.Array, shifted: jax.Array, region: jax.Array,
                ratio: jax.Array, opts: SamplerOptions, mask_id: int,
                axis_name: Optional[str] = None, vocab_axis: Optional[str] = None) -> jax.Array:
  """One reference step on a window: tokens [B, W], shifted logits [B, W, V], region [B, W] (where
  unmasking is allowed) -> new tokens [B, W]. vocab_axis: as in `sample_tokens` ([B, W, V/m])."""
  mask = (tokens == mask_id) & region
  key_tok, key_sel = jax.random.split(key)
  temperature, top_p, top_k = opts.filtering
  if opts.alg == "origin":
    key_tok, key_u = jax.random.split(key_tok)
    transfer = (jax.random.uniform(key_u, mask.shape, jnp.float32) < ratio) & mask
    _, x0, _ = sample_tokens(key_tok, shifted, temperature=temperature, top_p=top_p, top_k=top_k,
                             alg="origin", vocab_axis=vocab_axis)
    return jnp.where(transfer, x0, tokens)
  confidence, x0, _ = sample_tokens(key_tok, shifted, temperature=temperature, top_p=top_p,
                                    top_k=top_k, alg=opts.alg, vocab_axis=vocab_axis)
  k = num_transfer(mask, ratio, axis_name)
  transfer = select_transfer(key_sel, confidence, mask, k, opts.alg_temp)
  return jnp.where(transfer, x0, tokens)


def threshold_step(key: jax.Array, tokens: jax.Array, shifted: jax.Array, region: jax.Array,
                   opts: SamplerOptions, mask_id: int, vocab_axis: Optional[str] = None) -> jax.Array:
  """Parallel decoding: per row unmask the most probable masked position of `region` and every
  masked position of it whose chosen token has probability >= opts.threshold. [B, W] -> [B, W]."""
  mask = (tokens == mask_id) & region
  temperature, top_p, top_k = opts.filtering
  _, x0, p = sample_tokens(key, shifted, temperature=temperature, top_p=top_p, top_k=top_k,
                           alg="maskgit_plus", vocab_axis=vocab_axis)
  score = jnp.where(mask, p, -jnp.inf)
  best = ranks(score) == 0
  transfer = mask & (best | (p >= jnp.float32(opts.threshold)))
  return jnp.where(transfer, x0, tokens)


# ----------------------------------------------------------------------------------------------
# Canvas helpers.


def positions_from_valid(valid: jax.Array) -> jax.Array:
  """Per-row positions restarting at 0 at each row's first valid token; 0 on padding. [B, L]."""
  pos = jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1
  return jnp.where(valid, pos, 0)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int,
             length: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
  """Token lists -> (tokens [B, P] int32 left-padded with pad_id, valid [B, P] bool)."""
  longest = max(len(r) for r in rows)
  length = longest if length is None else length
  if length < longest:
    raise errors.BadInput(f"length={length} is shorter than the longest prompt ({longest} tokens). "
                     "Fix: pass length >= the longest prompt.")
  tokens = np.full((len(rows), length), pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    if len(r):
      tokens[i, length - len(r):] = np.asarray(r, np.int32)
      valid[i, length - len(r):] = True
  return tokens, valid


def cut_at_stop(tokens: Sequence[int], stop_ids: Sequence[int]) -> List[int]:
  """The generated ids up to (not including) the first stop id (eos / <|dlm_pad|> / ...)."""
  out = []
  stop = set(int(s) for s in stop_ids)
  for t in tokens:
    if int(t) in stop:
      break
    out.append(int(t))
  return out


# ----------------------------------------------------------------------------------------------
# Step functions (pure; jit or pmap them) and the loop.


def plain_step_fn(forward: ForwardFn, opts: SamplerOptions, *, mask_id: int, start: int,
                  axis_name: Optional[str] = None, vocab_axis: Optional[str] = None):
  """The reference's step: step(params, tokens, valid, positions, key, ratio) -> tokens [B, L].

  A full forward over the canvas; only the generated region (positions >= start, a static slice)
  is sampled and unmasked, so the sampler's float32 [B, L - start, V] buffers skip the prompt.
  axis_name: the data-parallel axis (the batch average M); vocab_axis: the model axis when the
  forward returns this device's vocabulary block (model parallelism, `sample_tokens`).
  """
  def step(params, tokens, valid, positions, key, ratio):
    logits = forward(params, tokens, valid, positions)                       # [B, L, V]
    shifted = shift_logits(logits)[:, start:]                                # [B, L - start, V]
    gen = tokens[:, start:]
    region = jnp.ones(gen.shape, bool)
    new = unmask_step(key, gen, shifted, region, ratio, opts, mask_id, axis_name, vocab_axis)
    return tokens.at[:, start:].set(new)
  return step


def cache_window(cache: str, kv, valid: jax.Array, lo, bl: int):
  """The cached steps' (context, window) after a block-start forward that returned `kv`.

  cache "prefix": window = positions [lo, L) (the block and everything after it), context = the
  keys/values of [0, lo). "dual": window = the block [lo, lo + bl), context = every other position's
  keys/values. Returns ((kv_list, context_valid), window) with window(a) slicing [B, L, ...] arrays.
  """
  L = valid.shape[1]
  if cache == "prefix":
    ctx = ([(k[:, :lo], v[:, :lo]) for k, v in kv], valid[:, :lo])
    return ctx, lambda a: a[:, lo:]
  idx = jnp.arange(L - bl)
  idx = jnp.where(idx < lo, idx, idx + bl)                                         # [L - bl]
  ctx = ([(jnp.take(k, idx, axis=1), jnp.take(v, idx, axis=1)) for k, v in kv],
         jnp.take(valid, idx, axis=1))
  return ctx, lambda a: jax.lax.dynamic_slice_in_dim(a, lo, bl, axis=1)


def block_fn(forward: ForwardFn, opts: SamplerOptions, *, mask_id: int, start: int,
             block_index: Optional[int] = None, axis_name: Optional[str] = None,
             vocab_axis: Optional[str] = None):
  """All steps of one block: block(params, tokens, valid, positions, key, ratios, block_start)
  -> (tokens [B, L], steps run).

  Step 0 is a full forward (refreshing the KV cache when one is used); later steps run the model on
  the window the cache mode allows: the whole canvas (cache "none"), the block and everything after
  it ("prefix"), or the block alone ("dual", the keys/values before and after it cached). Only the
  block's positions are sampled ([B, block_length, V]); the logit that shifts onto its first position
  (the raw logit of block_start - 1) comes from the block-start forward when that position is cached.
  `ratios` [S] is the block's schedule (S steps; unused with a threshold, where the block runs until
  it has no mask left, at most block_length steps). The prefix window shrinks from block to block,
  so "prefix" needs the static `block_index` (one compile per block); "none" and "dual" take the
  traced `block_start` (one compile for all blocks).
  """
  bl = opts.block_length
  if opts.cache == "prefix" and block_index is None:
    raise ValueError("cache='prefix' needs a static block_index (its window length depends on it)")

  def block(params, tokens, valid, positions, key, ratios, block_start):
    B, L = tokens.shape
    num_r = ratios.shape[0]
    lo = start + block_index * bl if opts.cache == "prefix" else block_start
    take = lambda a: jax.lax.dynamic_slice_in_dim(a, lo, bl, axis=1)         # [B, bl, ...]

    def sample_block(j, tokens, shifted_block):                              # shifted [B, bl, V]
      tb = take(tokens)
      region = jnp.ones(tb.shape, bool)
      k = jax.random.fold_in(key, j)
      if opts.threshold > 0:
        new = threshold_step(k, tb, shifted_block, region, opts, mask_id, vocab_axis)
      else:
        new = unmask_step(k, tb, shifted_block, region, ratios[jnp.minimum(j, num_r - 1)], opts,
                          mask_id, axis_name, vocab_axis)
      return jax.lax.dynamic_update_slice_in_dim(tokens, new, lo, axis=1)

    # Step 0: full forward over the canvas (with keys/values when cached).
    if opts.cache == "none":
      logits, kv = forward(params, tokens, valid, positions), None
    else:
      logits, kv = forward(params, tokens, valid, positions, return_kv=True)
    boundary = jnp.take(logits, jnp.maximum(lo - 1, 0), axis=1)[:, None]     # [B, 1, V]
    tokens = sample_block(0, tokens, take(shift_logits(logits)))

    if opts.cache == "none":
      def window_step(j, tokens):
        logits = forward(params, tokens, valid, positions)
        return sample_block(j, tokens, take(shift_logits(logits)))
    else:
      ctx, window = cache_window(opts.cache, kv, valid, lo, bl)
      w_valid, w_pos = window(valid), window(positions)

      def window_step(j, tokens):
        logits_w = forward(params, window(tokens), w_valid, w_pos, context=ctx)  # [B, W, V]
        shifted = jnp.concatenate([boundary.astype(logits_w.dtype), logits_w[:, :bl - 1]], axis=1)
        return sample_block(j, tokens, shifted)

    if opts.threshold > 0:
      def cond(carry):
        j, tokens = carry
        return (j < bl) & jnp.any(take(tokens) == mask_id)

      def body(carry):
        j, tokens = carry
        return j + 1, window_step(j, tokens)
      steps, tokens = jax.lax.while_loop(cond, body, (jnp.int32(1), tokens))
      return tokens, steps
    tokens = jax.lax.fori_loop(1, num_r, window_step, tokens)
    return tokens, jnp.int32(num_r)

  return block


def fast_dllm_block_fn(forward: ForwardFn, opts: SamplerOptions, *, mask_id: int, start: int,
                       block_index: Optional[int] = None, axis_name: Optional[str] = None,
                       vocab_axis: Optional[str] = None):
  """Fast-dLLM's Dream block loop (`block_algorithm="fast_dllm"`); the same signature and result as
  `block_fn`: block(params, tokens, valid, positions, key, ratios, block_start) -> (tokens, forwards).

  1. The refresh: a full forward over the canvas (keys/values kept for the cache). Its shifted
     logits fix the block's FIRST position whatever its confidence (argmax at temperature 0, else a
     draw from the filtered distribution); nothing else is unmasked by it.
  2. Then forwards on the cache's window (cache "prefix": the block and everything after it, the
     keys/values before the block reused; "dual": the block alone, all other keys/values reused;
     "none": the whole canvas, a podlab extension). The logits are shifted inside the window, so
     the window's first position reads its own raw logit, as Fast-dLLM's code does (it only
     matters if the refresh fixed <|mask|> there). Each forward, on the block's masked positions:
     - threshold > 0 (Fast-dLLM's alg="confidence_threshold"): confidence = probability of the
       chosen token; unmask the most confident masked position of each row and every one whose
       confidence >= threshold.
     - threshold 0: the schedule continues at step i = 1 (the refresh took step 0) of the S =
       steps / blocks steps of linspace(1, eps, S + 1): k = floor(M (1 - s/t)) (all the rest at
       i = S - 1), M = the batch-average masked count of the block; confidence = sum p log(p + 1e-10)
       (entropy) whatever `alg` says, top-k positions (or sampled with alg_temp). At i = S the
       forward is made and the loop stops (Fast-dLLM's `if i == steps_per_block: break`).
  3. The block ends when no position of it is masked in any row (checked after each forward), so
     every block costs at least the refresh plus one window forward.
  `ratios` [S]: `transfer_ratios(S)`. With a threshold the loop also stops after block_length window
  forwards: Fast-dLLM loops forever when the model keeps predicting <|mask|>, otherwise every
  forward unmasks at least one token and the bound is never reached.
  """
  bl = opts.block_length
  if opts.cache == "prefix" and block_index is None:
    raise ValueError("cache='prefix' needs a static block_index (its window length depends on it)")
  temperature, top_p, top_k = opts.filtering
  entropy_opts = dataclasses.replace(opts, alg="entropy")

  def psum(x):
    return x if axis_name is None else jax.lax.psum(x, axis_name)

  def block(params, tokens, valid, positions, key, ratios, block_start):
    S = ratios.shape[0]
    lo = start + block_index * bl if opts.cache == "prefix" else block_start
    take = lambda a: jax.lax.dynamic_slice_in_dim(a, lo, bl, axis=1)         # [B, bl, ...]

    # 1. The refresh forward fixes the block's first position.
    if opts.cache == "none":
      logits, kv = forward(params, tokens, valid, positions), None
    else:
      logits, kv = forward(params, tokens, valid, positions, return_kv=True)
    first = jax.lax.dynamic_index_in_dim(shift_logits(logits), lo, axis=1)    # [B, 1, V]
    _, x0, _ = sample_tokens(jax.random.fold_in(key, 0), first, temperature=temperature,
                             top_p=top_p, top_k=top_k, alg="maskgit_plus", vocab_axis=vocab_axis)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, x0, lo, axis=1)

    if opts.cache == "none":
      def block_logits(tokens):
        return take(shift_logits(forward(params, tokens, valid, positions)))       # [B, bl, V]
    else:
      ctx, window = cache_window(opts.cache, kv, valid, lo, bl)
      w_valid, w_pos = window(valid), window(positions)

      def block_logits(tokens):
        logits_w = forward(params, window(tokens), w_valid, w_pos, context=ctx)    # [B, W, V]
        return shift_logits(logits_w)[:, :bl]                                      # [B, bl, V]

    # 2. Window forwards until the block is full.
    def body(carry):
      n, i, tokens, _ = carry
      shifted = block_logits(tokens)
      tb = take(tokens)
      region = jnp.ones(tb.shape, bool)
      k = jax.random.fold_in(key, n + 1)
      if opts.threshold > 0:
        new = threshold_step(k, tb, shifted, region, opts, mask_id, vocab_axis)
        stop = jnp.bool_(False)
      else:
        stop = i >= S                                 # the same on every device: no collective skipped
        new = jnp.where(stop, tb, unmask_step(k, tb, shifted, region, ratios[jnp.minimum(i, S - 1)],
                                              entropy_opts, mask_id, axis_name, vocab_axis))
        i = i + 1
      tokens = jax.lax.dynamic_update_slice_in_dim(tokens, new, lo, axis=1)
      left = psum(jnp.sum(new == mask_id, dtype=jnp.int32))
      return n + 1, i, tokens, stop | (left == 0)

    cap = bl if opts.threshold > 0 else S
    cond = lambda carry: (carry[0] < cap) & ~carry[3]
    n, _, tokens, _ = jax.lax.while_loop(
        cond, body, (jnp.int32(0), jnp.int32(1), tokens, jnp.bool_(False)))
    return tokens, n + 1

  return block


@dataclasses.dataclass
class Output:
  """What `generate` returns.

  tokens: [B, L] int32 host array, the final canvas (prompt + completion).
  forwards: model forward passes run per row (full or windowed).
  seconds: wall time of the loop, including compilation when the Runner meets a new shape.
  """
  tokens: np.ndarray
  forwards: int
  seconds: float


class Runner:
  """Compiles and caches the sampler's step functions for one (forward, options, mask id).

  `data_parallel=True` runs the step on every device (`parallel.compile_step`): params
  replicated, rows split over devices (B must be a multiple of the local device count), the batch
  average M taken over every device of every host. `mesh` (a `model_sharding.mesh_2d(data, model)`):
  model parallelism, one `model_sharding.shard_map_step` over the mesh: `forward` is the per-device
  program of a model split over `model_sharding.MODEL_AXIS` (e.g. `dream.dream_forward(config,
  model_sharding.MODEL_AXIS, model)`; its logits are the device's vocabulary block), `param_specs` the
  PartitionSpec tree of the params (already placed that way), rows split over `parallel.AXIS`
  (B a multiple of the data size), the sampler's softmax and argmax sharded over the vocabulary
  (`vocab_sharded_sample_tokens`); the random keys are folded per data row group, so the
  model-parallel devices of a group draw the same numbers. Otherwise one `jax.jit` on the default
  device. Compiled functions are cached per (canvas shape, prompt length, block): one compile per
  shape.
  """

  def __init__(self, forward: ForwardFn, opts: SamplerOptions, *, mask_id: int,
               data_parallel: bool = False, mesh: Optional[jax.sharding.Mesh] = None,
               param_specs: Any = None):
    if mesh is not None and (data_parallel or param_specs is None):
      raise ValueError("Runner: mesh needs param_specs and replaces data_parallel (rows are split "
                       "over the mesh's data axis)")
    self.forward = forward
    self.opts = opts
    self.mask_id = int(mask_id)
    self.data_parallel = data_parallel
    self.mesh = mesh
    self.param_specs = param_specs
    self._fns = {}

  def _compile(self, key, make):
    """make(axis_name, vocab_axis) -> the step; compiled once per key."""
    if key not in self._fns:
      if self.mesh is not None:
        self._fns[key] = self._mesh_step(make(parallel.AXIS, model_sharding.MODEL_AXIS),
                                         blocks=key[0] == "block")
      elif self.data_parallel:
        fn = make(parallel.AXIS, None)
        replicated = tuple(range(5, len(inspect.signature(fn).parameters)))
        self._fns[key] = parallel.compile_step(fn, state_in=(0,) + replicated)
      else:
        self._fns[key] = jax.jit(make(None, None))
    return self._fns[key]

  def _mesh_step(self, fn, blocks: bool):
    """shard_map of a step over the (data, model) mesh: params by `param_specs`, tokens / valid /
    positions / keys by rows over the data axis, the rest (ratios, block start) the same everywhere;
    a block step's forward count comes back per data group."""
    rest = len(inspect.signature(fn).parameters) - 5
    rows = P(parallel.AXIS)

    def per_device(params, tokens, valid, positions, keys, *args):
      out = fn(params, tokens, valid, positions, keys[0], *args)     # keys: [1] (this data group's)
      return (out[0], out[1][None]) if blocks else out

    return model_sharding.shard_map_step(
        per_device, self.mesh, in_specs=(self.param_specs, rows, rows, rows, rows) + (P(),) * rest,
        out_specs=(rows, rows) if blocks else rows)

  def _split_rows(self, x):
    """[B, ...] host array -> [devices, B / devices, ...] under data parallelism (B rows split over
    the mesh's data axis with a mesh)."""
    if self.mesh is not None:
      n = self.mesh.shape[parallel.AXIS]
      if x.shape[0] % n:
        raise errors.BadInput(f"batch of {x.shape[0]} rows is not a multiple of the mesh's {n} data "
                              f"groups. Fix: pad the batch to a multiple of {n} (generate.py does).")
      return jnp.asarray(x)
    if not self.data_parallel:
      return jnp.asarray(x)
    n = jax.local_device_count()
    if x.shape[0] % n:
      raise errors.BadInput(f"batch of {x.shape[0]} rows is not a multiple of the {n} local devices. "
                       f"Fix: pad the batch to a multiple of {n} (generate.py does).")
    return np.asarray(x).reshape((n, x.shape[0] // n) + x.shape[1:])

  def _keys(self, key):
    if self.mesh is not None:
      return jnp.stack([jax.random.fold_in(key, d) for d in range(self.mesh.shape[parallel.AXIS])])
    if not self.data_parallel:
      return key
    return jnp.stack([jax.random.fold_in(key, int(d)) for d in parallel.device_indices()])

  def generate(self, params, prompt: np.ndarray, prompt_valid: np.ndarray, key: jax.Array, *,
               max_new_tokens: int, progress: Optional[Callable[[int], None]] = None) -> Output:
    """Runs the sampler on a left-padded batch. prompt, prompt_valid: [B, P]."""
    opts = self.opts
    opts.validate(max_new_tokens)
    prompt = np.asarray(prompt, np.int32)
    prompt_valid = np.asarray(prompt_valid, bool)
    b, start = prompt.shape
    tokens = np.concatenate([prompt, np.full((b, max_new_tokens), self.mask_id, np.int32)], axis=1)
    valid = np.concatenate([prompt_valid, np.ones((b, max_new_tokens), bool)], axis=1)
    positions = np.asarray(positions_from_valid(jnp.asarray(valid)))
    shape = tokens.shape
    x, v, p = (self._split_rows(a) for a in (tokens, valid, positions))
    forwards = 0
    t0 = time.perf_counter()
    if opts.block_length == 0:
      ratios = transfer_ratios(opts.steps, opts.eps)
      fn = self._compile(("plain", shape, start), lambda axis, vocab: plain_step_fn(
          self.forward, opts, mask_id=self.mask_id, start=start, axis_name=axis, vocab_axis=vocab))
      for i in range(opts.steps):
        x = fn(params, x, v, p, self._keys(jax.random.fold_in(key, i)), jnp.float32(ratios[i]))
        forwards += 1
        if progress is not None:
          progress(1)
    else:
      num_blocks = max_new_tokens // opts.block_length
      fast = opts.block_algorithm == "fast_dllm"
      spb = max(opts.steps // num_blocks, 1) if (opts.threshold == 0 or fast) else 1
      ratios = jnp.asarray(transfer_ratios(spb, opts.eps))
      make_block = fast_dllm_block_fn if fast else block_fn
      if start < 1 and opts.cache != "none":
        raise errors.BadInput("block-wise KV caching needs a prompt of at least one token. "
                         "Fix: give a non-empty prompt or use cache='none'.")
      for blk in range(num_blocks):
        # Prefix windows shrink block by block (one compile per block); the others share one shape.
        static_blk = blk if opts.cache == "prefix" else None
        fn = self._compile(("block", shape, start, static_blk),
                           lambda axis, vocab, b=static_blk: make_block(
                               self.forward, opts, mask_id=self.mask_id, start=start, block_index=b,
                               axis_name=axis, vocab_axis=vocab))
        x, n = fn(params, x, v, p, self._keys(jax.random.fold_in(key, blk)), ratios,
                  jnp.int32(start + blk * opts.block_length))
        forwards += int(np.max(np.asarray(n)))
        if progress is not None:
          progress(1)
    out = np.asarray(x).reshape(shape)
    return Output(tokens=out, forwards=forwards, seconds=time.perf_counter() - t0)


def generate(forward: ForwardFn, params: Any, prompt, prompt_valid, key: jax.Array,
             opts: SamplerOptions, *, max_new_tokens: int, mask_id: int,
             data_parallel: bool = False, mesh: Optional[jax.sharding.Mesh] = None,
             param_specs: Any = None) -> Output:
  """One-shot convenience around `Runner` (compiles each call; keep a Runner to reuse compiles)."""
  return Runner(forward, opts, mask_id=mask_id, data_parallel=data_parallel, mesh=mesh,
                param_specs=param_specs).generate(
      params, np.asarray(prompt), np.asarray(prompt_valid), key, max_new_tokens=max_new_tokens)
