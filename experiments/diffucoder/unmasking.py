"""One masked-diffusion step's arithmetic in Dream / DiffuCoder's sampler: the transfer schedule,
token choice and confidences, and which masked positions unmask.

The schedule is host-side NumPy in the reference's float32 arithmetic (`timesteps`,
`transfer_ratios`, `transfer_schedule`). The rest are pure JAX functions on a window of the canvas
(tokens [B, W], logits already shifted [B, W, V]) that the step functions
(experiments/diffucoder/sampler_steps.py) call: `sample_tokens` (temperature, top-p, top-k, the
softmax in float32 and the alg's confidence; `vocab_sharded_sample_tokens` on a vocabulary split
over a model axis), `select_transfer` (per row the k most confident masked positions, or k drawn by
Gumbel-top-k), `unmask_step` (one reference step) and `threshold_step` (confidence-threshold
parallel decoding). The formulas: experiments/diffucoder/sampling.py.

Synopsis:

  import jax, jax.numpy as jnp
  from experiments.diffucoder import unmasking

  assert unmasking.transfer_schedule(256, 128)[:2] == [1, 2]           # tokens unmasked per step
  logits = jnp.log(jnp.array([[0.7, 0.2, 0.1]]))                       # [B=1, V=3]
  confidence, tokens, p = unmasking.sample_tokens(jax.random.key(0), logits, alg="topk_margin")
  assert tokens.tolist() == [0] and abs(float(confidence[0]) - 0.5) < 1e-5   # p1 - p2
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import errors
from experiments.diffucoder import sampler_options

ENTROPY_EPS = 1e-10
"""Added inside the log of the entropy confidence, as in the reference."""


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
    raise errors.BadInput(f"alg={alg!r}: unknown. "
                          f"Fix: use one of {', '.join(sampler_options.ALGS)}")
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
  if alg not in sampler_options.ALGS:
    raise errors.BadInput(f"alg={alg!r}: unknown. "
                          f"Fix: use one of {', '.join(sampler_options.ALGS)}")
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
                ratio: jax.Array, opts: sampler_options.SamplerOptions, mask_id: int,
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
                   opts: sampler_options.SamplerOptions, mask_id: int,
                   vocab_axis: Optional[str] = None) -> jax.Array:
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
