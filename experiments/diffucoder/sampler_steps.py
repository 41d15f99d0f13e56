"""The step functions of Dream / DiffuCoder's sampler: pure per-device programs that
`sampling.Runner` compiles (`parallel.compile_step`, one `model_sharding.shard_map_step` over a
(data, model) mesh, or one `jax.jit`).

`plain_step_fn` is the reference's step (a full forward over the canvas, one unmask step on the
generated region); block-wise decoding runs one compiled program per block: `block_fn` (podlab's
loop: the block-start forward is the block's first schedule step) or `fast_dllm_block_fn`
(Fast-dLLM's published Dream loop), both over the KV-cache window of `cache_window`. `axis_name`
(the data axis) makes the batch average M of the schedule global; `vocab_axis` (the model axis)
says the forward returns this device's vocabulary block. The algorithms and how the two block
loops differ: experiments/diffucoder/sampling.py.

Shape glossary:
  B: batch (rows)     L: canvas length (prompt + max_new_tokens)    V: vocabulary size
  W: window (the positions a step reads: the canvas, a block, or a block plus its suffix)
  C: cached context length (keys/values reused from the block-start forward)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from experiments.diffucoder import sampler_options
from experiments.diffucoder import unmasking

# forward(params, tokens [B, W], valid [B, W], positions [B, W], context, return_kv)
#   -> logits [B, W, V] (raw), or (logits, kv_list) when return_kv.
ForwardFn = Callable[..., Any]


def plain_step_fn(forward: ForwardFn, opts: sampler_options.SamplerOptions, *, mask_id: int,
                  start: int, axis_name: Optional[str] = None, vocab_axis: Optional[str] = None):
  """The reference's step: step(params, tokens, valid, positions, key, ratio) -> tokens [B, L].

  A full forward over the canvas; only the generated region (positions >= start, a static slice)
  is sampled and unmasked, so the sampler's float32 [B, L - start, V] buffers skip the prompt.
  axis_name: the data-parallel axis (the batch average M); vocab_axis: the model axis when the
  forward returns this device's vocabulary block (model parallelism, `sample_tokens`).
  """
  def step(params, tokens, valid, positions, key, ratio):
    logits = forward(params, tokens, valid, positions)                       # [B, L, V]
    shifted = unmasking.shift_logits(logits)[:, start:]                      # [B, L - start, V]
    gen = tokens[:, start:]
    region = jnp.ones(gen.shape, bool)
    new = unmasking.unmask_step(key, gen, shifted, region, ratio, opts, mask_id, axis_name,
                                vocab_axis)
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


def block_fn(forward: ForwardFn, opts: sampler_options.SamplerOptions, *, mask_id: int,
             start: int, block_index: Optional[int] = None, axis_name: Optional[str] = None,
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
        new = unmasking.threshold_step(k, tb, shifted_block, region, opts, mask_id, vocab_axis)
      else:
        new = unmasking.unmask_step(k, tb, shifted_block, region,
                                    ratios[jnp.minimum(j, num_r - 1)], opts, mask_id, axis_name,
                                    vocab_axis)
      return jax.lax.dynamic_update_slice_in_dim(tokens, new, lo, axis=1)

    # Step 0: full forward over the canvas (with keys/values when cached).
    if opts.cache == "none":
      logits, kv = forward(params, tokens, valid, positions), None
    else:
      logits, kv = forward(params, tokens, valid, positions, return_kv=True)
    boundary = jnp.take(logits, jnp.maximum(lo - 1, 0), axis=1)[:, None]     # [B, 1, V]
    tokens = sample_block(0, tokens, take(unmasking.shift_logits(logits)))

    if opts.cache == "none":
      def window_step(j, tokens):
        logits = forward(params, tokens, valid, positions)
        return sample_block(j, tokens, take(unmasking.shift_logits(logits)))
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


def fast_dllm_block_fn(forward: ForwardFn, opts: sampler_options.SamplerOptions, *, mask_id: int,
                       start: int, block_index: Optional[int] = None,
                       axis_name: Optional[str] = None, vocab_axis: Optional[str] = None):
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
  `ratios` [S]: `unmasking.transfer_ratios(S)`. With a threshold the loop also stops after
  block_length window forwards: Fast-dLLM loops forever when the model keeps predicting <|mask|>,
  otherwise every forward unmasks at least one token and the bound is never reached.
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
    first = jax.lax.dynamic_index_in_dim(unmasking.shift_logits(logits), lo, axis=1)    # [B, 1, V]
    _, x0, _ = unmasking.sample_tokens(jax.random.fold_in(key, 0), first, temperature=temperature,
                             top_p=top_p, top_k=top_k, alg="maskgit_plus", vocab_axis=vocab_axis)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, x0, lo, axis=1)

    if opts.cache == "none":
      def block_logits(tokens):
        return take(unmasking.shift_logits(forward(params, tokens, valid, positions)))  # [B, bl, V]
    else:
      ctx, window = cache_window(opts.cache, kv, valid, lo, bl)
      w_valid, w_pos = window(valid), window(positions)

      def block_logits(tokens):
        logits_w = forward(params, window(tokens), w_valid, w_pos, context=ctx)    # [B, W, V]
        return unmasking.shift_logits(logits_w)[:, :bl]                            # [B, bl, V]

    # 2. Window forwards until the block is full.
    def body(carry):
      n, i, tokens, _ = carry
      shifted = block_logits(tokens)
      tb = take(tokens)
      region = jnp.ones(tb.shape, bool)
      k = jax.random.fold_in(key, n + 1)
      if opts.threshold > 0:
        new = unmasking.threshold_step(k, tb, shifted, region, opts, mask_id, vocab_axis)
        stop = jnp.bool_(False)
      else:
        stop = i >= S                                 # the same on every device: no collective skipped
        new = jnp.where(stop, tb, unmasking.unmask_step(
            k, tb, shifted, region, ratios[jnp.minimum(i, S - 1)], entropy_opts, mask_id, axis_name,
            vocab_axis))
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
