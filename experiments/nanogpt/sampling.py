"""Sampling from a GPT (nanoGPT's sample.py), with or without a KV cache, in one jitted loop.

Each new token: logits of the last position / temperature, keep those >= the k-th largest (top_k),
a categorical draw with key fold_in(key(seed), t) (temperature 0 = argmax). The context fed to the
model is a window tokens[s:L] of the L tokens so far, positions 0..L-s-1:

* "slide" (nanoGPT's crop, the default without a cache): s = max(0, L - block_size); once the text
  is longer than the block every step re-encodes a shifted window, which no cache can reuse.
* "chunk" (the cache's policy): s stays put until L - s would exceed block_size, then jumps to
  L - keep (default keep = block_size // 2). With the cache the window is encoded once when it
  jumps (a prefill) and then one token per step; without the cache the same windows are encoded in
  full each step, so the two give the same logits and (greedy) the same tokens.

Up to block_size tokens of context the three are identical. Every loop is a `lax.fori_loop` inside
one `jit` (no per-token dispatch); the no-cache step runs the full [B, block_size] forward.

Shape glossary: B batch   P prompt length   N new tokens   T block_size   V vocab

Synopsis:

  import jax, numpy as np
  from modules import gpt
  from experiments.nanogpt import sampling
  model = gpt.GPTModel(gpt.GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16))
  params = model.init(jax.random.key(0))
  prompt = np.array([[1, 2, 3]], np.int32)                       # [B, P]
  a = sampling.generate(model, params, prompt, 40, temperature=0.0, kv_cache=True)
  b = sampling.generate(model, params, prompt, 40, temperature=0.0, kv_cache=False, context="chunk")
  assert (a == b).all() and a.shape == (1, 43)                   # [B, P + N]
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from modules import gpt


def select(logits: jax.Array, key: jax.Array, temperature: float, top_k: Optional[int]) -> jax.Array:
  """Next ids [B] from logits [B, V]: greedy for temperature 0, else top-k + categorical."""
  if temperature <= 0.0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits.astype(jnp.float32) / temperature
  if top_k is not None and top_k > 0:
    k = min(int(top_k), logits.shape[-1])
    kth = jax.lax.top_k(logits, k)[0][:, -1:]                     # [B, 1]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _window_start(L, s, block: int, context: str, keep: int):
  if context == "slide":
    return jnp.maximum(0, L - block)
  return jnp.where(L - s > block, L - keep, s)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature", "top_k",
                                             "kv_cache", "context", "keep"))
def _generate(model, params, prompt, seed, *, max_new_tokens, temperature, top_k, kv_cache,
              context, keep):
  cfg = model.config
  B, P = prompt.shape
  T = cfg.block_size
  total = P + max_new_tokens
  tokens = jnp.zeros((B, total + T), jnp.int32).at[:, :P].set(prompt)   # padded for the windows
  key = jax.random.key(seed)

  def no_cache_body(t, carry):
    tokens, s = carry
    L = P + t
    s = _window_start(L, s, T, context, keep)
    window = jax.lax.dynamic_slice(tokens, (0, s), (B, T))               # [B, T]
    logits = model.apply(params, window)                                 # [B, T, V]
    last = jax.lax.dynamic_index_in_dim(logits, L - 1 - s, axis=1, keepdims=False)  # [B, V]
    nxt = select(last, jax.random.fold_in(key, t), temperature, top_k)
    return jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, L)), s

  def cache_body(t, carry):
    tokens, s, cache = carry
    L = P + t
    s_new = _window_start(L, s, T, "chunk", keep)
    refill = (t == 0) | (s_new != s)

    def prefill(cache):
      window = jax.lax.dynamic_slice(tokens, (0, s_new), (B, T))         # [B, T]
      logits, cache = model.apply_cached(params, window, model.init_cache(B), 0)
      return jax.lax.dynamic_index_in_dim(logits, L - 1 - s_new, axis=1, keepdims=False), cache

    def one(cache):
      last_tok = jax.lax.dynamic_slice(tokens, (0, L - 1), (B, 1))       # [B, 1]
      logits, cache = model.apply_cached(params, last_tok, cache, L - 1 - s_new)
      return logits[:, 0], cache

    last, cache = jax.lax.cond(refill, prefill, one, cache)
    nxt = select(last, jax.random.fold_in(key, t), temperature, top_k)
    return jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, L)), s_new, cache

  s0 = jnp.zeros((), jnp.int32)
  if kv_cache:
    tokens, _, _ = jax.lax.fori_loop(0, max_new_tokens, cache_body,
                                     (tokens, s0, model.init_cache(B)))
  else:
    tokens, _ = jax.lax.fori_loop(0, max_new_tokens, no_cache_body, (tokens, s0))
  return tokens[:, :total]


def generate(model: gpt.GPTModel, params, prompt: np.ndarray, max_new_tokens: int, *,
             temperature: float = 0.8, top_k: Optional[int] = 200, seed: int = 1337,
             kv_cache: bool = True, context: Optional[str] = None,
             keep: Optional[int] = None) -> np.ndarray:
  """prompt [B, P] int -> [B, P + max_new_tokens] int32; see the module doc for `context`."""
  prompt = np.asarray(prompt, np.int32)
  if prompt.ndim != 2 or prompt.shape[1] == 0:
    raise ValueError(f"prompt must be [B, P] ids with P >= 1, got shape {prompt.shape}; start from "
                     "the newline id (0) for an empty prompt")
  T = model.config.block_size
  context = context or ("chunk" if kv_cache else "slide")
  if context not in ("slide", "chunk"):
    raise ValueError(f"context={context!r}: must be 'slide' or 'chunk'")
  if kv_cache and context != "chunk":
    raise ValueError("the KV cache uses context='chunk' (a sliding crop re-encodes every step); "
                     "use kv_cache=False for nanoGPT's sliding crop")
  keep = int(keep or max(1, T // 2))
  if not 1 <= keep < T + 1:
    raise ValueError(f"keep={keep}: must be in [1, block_size={T}]")
  return np.asarray(_generate(model, params, jnp.asarray(prompt), int(seed),
                              max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                              top_k=None if top_k is None else int(top_k), kv_cache=bool(kv_cache),
                              context=context, keep=keep))
