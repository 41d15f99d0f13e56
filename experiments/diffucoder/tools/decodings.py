"""Modes 2 and 4 of the DiffuCoder benchmark: the cache / parallel-decoding options against plain.

`compare_decodings` decodes the same prompts greedily with each option (`compare_variants`:
block-wise decoding, prefix / dual KV cache, confidence-threshold parallel decoding, podlab's block
variant and Fast-dLLM's exact loop) and reports forwards, seconds, tokens/s, speed-up and agreement
with plain decoding and with the decoding each option approximates. On a trained model
`trained_table` adds, per option, forwards per token and `completion_nll`: the exact negative
log-likelihood of its completions under the plain model, left to right (and a row for the true
continuations). experiments/diffucoder/tools/benchmark.py's docstring explains the columns.

Synopsis:

  import numpy as np
  from experiments.diffucoder.tools import decodings
  from experiments.diffucoder.tools import step_speed

  config = step_speed.small_config(hidden=32, layers=1, heads=2, kv_heads=1, vocab=64)
  params = step_speed.random_params(config)
  prompt = np.arange(8, dtype=np.int32).reshape(1, 8)
  nll = decodings.completion_nll(config, params, prompt, prompt[:, :4], mask_id=63)   # [1, 4]
  assert nll.shape == (1, 4) and (nll > 0).all()
"""

from __future__ import annotations

import functools
import statistics
import sys
from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampling
from experiments.diffucoder.tools import step_speed
from modules import dream


def compare_variants(new: int, block_length: int, threshold: float) -> List[Tuple[str, dict, int]]:
  """The decodings mode 2 compares: (name, SamplerOptions fields, index of the row whose decoding it
  approximates). `steps` defaults to `new` (one token per step on average); Fast-dLLM's threshold
  rows use its published steps = new / block_length. The "fast_dllm ..., no cache" rows run
  Fast-dLLM's loop with full forwards (not in its code): the decodings its caches approximate."""
  bl, t = block_length, threshold
  parallel_steps = new // bl
  return [
      ("plain (reference)", dict(), 0),
      (f"blocks of {bl}, no cache", dict(block_length=bl), 0),
      ("prefix cache", dict(block_length=bl, cache="prefix"), 1),
      ("dual cache", dict(block_length=bl, cache="dual"), 1),
      (f"threshold {t}, no cache", dict(block_length=bl, threshold=t), 1),
      (f"dual cache + threshold {t}", dict(block_length=bl, cache="dual", threshold=t), 4),
      ("fast_dllm, no cache", dict(block_length=bl, block_algorithm="fast_dllm"), 0),
      ("fast_dllm prefix cache", dict(block_length=bl, cache="prefix", block_algorithm="fast_dllm"),
       6),
      ("fast_dllm dual cache", dict(block_length=bl, cache="dual", block_algorithm="fast_dllm"), 6),
      (f"fast_dllm threshold {t}, no cache", dict(block_length=bl, threshold=t,
                                                  steps=parallel_steps, block_algorithm="fast_dllm"),
       6),
      (f"fast_dllm prefix + threshold {t}", dict(block_length=bl, cache="prefix", threshold=t,
                                                 steps=parallel_steps, block_algorithm="fast_dllm"),
       9),
      (f"fast_dllm dual + threshold {t}", dict(block_length=bl, cache="dual", threshold=t,
                                               steps=parallel_steps, block_algorithm="fast_dllm"), 9),
  ]


def trained_variants(new: int, block_length: int, threshold: float) -> List[Tuple[str, dict, int]]:
  """Mode 4's rows: `compare_variants`, then the plain sampler with new / 2 and new / 4 steps (2 and
  4 tokens per step on average): the speed any diffusion sampler buys by taking fewer steps, the
  yardstick for what the caches and thresholds buy at their agreement."""
  fewer = [(f"plain, {new // k} steps", dict(steps=new // k), 0) for k in (2, 4) if new // k >= 1]
  return compare_variants(new, block_length, threshold) + fewer


def compare_decodings(config, params, prompt, valid, *, mask_id: int, new_tokens: int,
                      block_length: int, threshold: float, alg: str = "entropy", repeats: int = 3,
                      variants=None, steps: Any = None) -> List[Dict[str, Any]]:
  """Mode 2 on any Dream: `config` a modules.dream.DreamConfig, `params` its Haiku parameters
  (random, converted or trained), prompt / valid [B, P] (left-padded). Each variant (default
  `compare_variants`) decodes greedily: each is compiled (its tokens kept: greedy decoding is
  deterministic), then `repeats` rounds time one generation of every variant in turn (so a change
  of the machine's load over the minutes affects all variants alike); seconds is the median.
  Returns one row per variant: decoding, forwards, seconds, tokens_per_s, speedup (vs the first
  row), agreement (identical generated tokens vs the first row), vs / agreement_vs (vs the row the
  variant approximates) and tokens (the generated [B, new_tokens] ids, for further scoring).
  `steps` (default new_tokens) is the diffusion steps of the variants that do not set their own."""
  forward = step_speed.sampler_forward(config)
  variants = variants or compare_variants(new_tokens, block_length, threshold)
  start = prompt.shape[1]
  key = jax.random.key(0)
  runners, firsts = [], []
  for name, kw, _ in variants:                        # compile each (and keep its greedy tokens)
    opts = sampler_options.SamplerOptions(**{"steps": steps or new_tokens, "alg": alg, **kw})
    runner = sampling.Runner(forward, opts, mask_id=mask_id)
    firsts.append(runner.generate(params, prompt, valid, key, max_new_tokens=new_tokens))
    runners.append(runner)
    print(f"compiled {name}: {firsts[-1].forwards} forwards", file=sys.stderr, flush=True)
  times = [[] for _ in variants]
  for _ in range(repeats):                  # rounds over all variants: load drift hits them alike
    for i, runner in enumerate(runners):
      times[i].append(runner.generate(params, prompt, valid, key,
                                      max_new_tokens=new_tokens).seconds)
  gens = [f.tokens[:, start:] for f in firsts]
  seconds = [statistics.median(t) for t in times]
  rows = []
  for i, (name, _, base) in enumerate(variants):
    rows.append(dict(decoding=name, forwards=firsts[i].forwards, seconds=seconds[i],
                     tokens_per_s=gens[i].size / seconds[i], speedup=seconds[0] / seconds[i],
                     agreement=float(np.mean(gens[i] == gens[0])), vs=variants[base][0],
                     agreement_vs=float(np.mean(gens[i] == gens[base])), tokens=gens[i]))
  return rows


@functools.lru_cache(maxsize=8)
def _nll_scorer(config):
  """jit(params, tokens [r, L], pos [r], target [r]) -> -log softmax(raw logits[pos])[target] [r]."""
  apply = dream.dream_forward(config).apply

  @jax.jit
  def score(params, tokens, pos, tgt):
    logits = apply(params, tokens, jnp.ones(tokens.shape, bool))             # [r, L, V]
    row = jnp.take_along_axis(logits, pos[:, None, None], axis=1)[:, 0]      # [r, V]
    logp = jax.nn.log_softmax(row.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, tgt[:, None], axis=-1)[:, 0]          # [r]
  return score


def completion_nll(config, params, prompt: np.ndarray, completion: np.ndarray, *, mask_id: int,
                   rows_per_call: int = 64) -> np.ndarray:
  """nll [B, N] (float64, nats): -log p(y_j | prompt, y_<j, N - j masks) for each token y_j of the
  completions [B, N] after the unpadded prompts [B, P], under the model `config`/`params`.

  The left-to-right chain rule with the masked-diffusion model as the conditional: canvas j is the
  prompt, y_0 .. y_{j-1}, then <|mask|> x (N - j) (the canvas length of the sampler), and y_j is read
  from the raw logit of position P + j - 1 (Dream's shift). Summed over j it is the exact negative
  log-likelihood of the completion under the left-to-right autoregressive model the plain
  masked-diffusion model defines (one of its any-order factorisations), so completions of all
  decodings are scored by one fixed model and one fixed order. B x N canvases, `rows_per_call` per
  forward (the last call padded with repeats)."""
  prompt = np.asarray(prompt, np.int32)
  completion = np.asarray(completion, np.int32)
  B, P = prompt.shape
  N = completion.shape[1]
  if P < 1:
    raise ValueError("completion_nll needs a prompt of at least one token (the shift reads P - 1)")
  canvases = np.full((B, N, P + N), mask_id, np.int32)                      # [B, N, L]
  canvases[:, :, :P] = prompt[:, None]
  for j in range(N):
    canvases[:, j, P:P + j] = completion[:, :j]
  canvases = canvases.reshape(B * N, P + N)
  read = np.tile(P - 1 + np.arange(N), B).astype(np.int32)                  # [B N] logit position
  target = completion.reshape(-1)
  score = _nll_scorer(config)
  total = B * N
  out = np.zeros(total, np.float64)
  for lo in range(0, total, rows_per_call):
    idx = np.arange(lo, lo + rows_per_call) % total
    got = np.asarray(score(params, canvases[idx], read[idx], target[idx]), np.float64)
    n = min(rows_per_call, total - lo)
    out[lo:lo + n] = got[:n]
  return out.reshape(B, N)


def trained_table(config, params, prompt: np.ndarray, continuation: np.ndarray, *, mask_id: int,
                  new_tokens: int, block_length: int, threshold: float, steps: Any = None,
                  repeats: int = 3, variants=None) -> List[Dict[str, Any]]:
  """The rows of mode 4: `compare_decodings` of `variants` (default `trained_variants`) on
  unpadded prompts [B, P] (greedy, entropy) plus, per row, forwards_per_token (forwards / new
  tokens) and nll (mean `completion_nll` of its completions under the plain model, nats per token),
  then a last row "held-out text" scoring the true continuations [B, new_tokens] (its agreement: the
  share of plain's tokens equal to the text)."""
  prompt = np.asarray(prompt, np.int32)
  valid = np.ones(prompt.shape, bool)
  variants = variants or trained_variants(new_tokens, block_length, threshold)
  rows = compare_decodings(config, params, prompt, valid, mask_id=mask_id, new_tokens=new_tokens,
                           block_length=block_length, threshold=threshold, repeats=repeats,
                           variants=variants, steps=steps)
  for r in rows:
    r["forwards_per_token"] = r["forwards"] / new_tokens
    r["nll"] = float(np.mean(completion_nll(config, params, prompt, r["tokens"], mask_id=mask_id)))
  truth = np.asarray(continuation, np.int32)
  rows.append(dict(decoding="held-out text", forwards="-", forwards_per_token="-", seconds="-",
                   tokens_per_s="-", speedup="-", agreement=float(np.mean(truth == rows[0]["tokens"])),
                   vs="-", agreement_vs="-", tokens=truth,
                   nll=float(np.mean(completion_nll(config, params, prompt, truth,
                                                    mask_id=mask_id)))))
  return rows


TRAINED_COLUMNS = ["decoding", "forwards", "forwards_per_token", "seconds", "tokens_per_s",
                   "speedup", "agreement", "nll", "vs", "agreement_vs"]
