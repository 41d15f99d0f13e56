"""Sampling from a GPT (nanoGPT's sample.py), with or without a KV cache, in one jitted loop.

Each new token: logits of the last position / temperature, keep those >= the k-th largest (top_k),
a categorical draw with key fold_in(key(seed), t) (temperature 0 = argmax). The context fed to the
model is a window tokens[s:L] of the L tokens so far, at positions 0..L-s-1. Two window policies:

* "exact" (the default; nanoGPT's crop): s = max(0, L - block_size). While the text fits the block
  (L <= block_size) the KV cache encodes one token per step; once it is longer, every token needs a
  full forward of the last block_size tokens (the window shifts by one and every position embedding
  with it, so no cached key/value can be reused), exactly as nanoGPT's `generate` does. Without the
  cache every step is that full forward. Both give nanoGPT's logits for any length.
* "chunk" (a DEVIATION from nanoGPT, kept for speed): s stays put until L - s would exceed
  block_size, then jumps to L - keep (default keep = block_size // 2). With the cache the window is
  encoded once when it jumps (a prefill) and then one token per step; without the cache the same
  windows are encoded in full each step (the same logits and, greedy, the same tokens). Past the
  block the model sees between keep and block_size tokens of context instead of block_size, so the
  tokens differ from nanoGPT's from the first token whose context passes the block.

Up to block_size tokens of context the policies are identical. Every loop is a `lax.fori_loop` inside
one `jit` (no per-token dispatch). The full forwards past the block compute the head for the last
position only, as nanoGPT's inference forward does (`lm_head(x[:, [-1], :])`).

Shape glossary: B batch   P prompt length   N new tokens   T block_size   V vocab

Synopsis:

  import jax, numpy as np
  from modules import gpt
  from experiments.nanogpt import sampling
  model = gpt.GPTModel(gpt.GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16))
  params = model.init(jax.random.key(0))
  prompt = np.array([[1, 2, 3]], np.int32)                       # [B, P]
  a = sampling.generate(model, params, prompt, 40, temperature=0.0)                  # exact + cache
  b = sampling.generate(model, params, prompt, 40, temperature=0.0, kv_cache=False)  # nanoGPT's loop
  c = sampling.generate(model, params, prompt, 40, temperature=0.0, window="chunk")  # the deviation
  assert (a == b).all() and a.shape == c.shape == (1, 43)        # [B, P + N]
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


WINDOWS = ("exact", "chunk")
"""Context policies: "exact" = nanoGPT's crop (the default), "chunk" = the cache-friendly deviation."""


def _chunk_start(L, s, block: int, keep: int):
  """The "chunk" window's start: s until L - s would exceed the block, then L - keep."""
  return jnp.where(L - s > block, L - keep, s)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature", "top_k",
                                             "kv_cache", "window", "keep"))
def _generate(model, params, prompt, seed, *, max_new_tokens, temperature, top_k, kv_cache,
              window, keep):
  cfg = model.config
  B, P = prompt.shape
  T = cfg.block_size
  N = max_new_tokens
  total = P + N
  tokens = jnp.zeros((B, total + T), jnp.int32).at[:, :P].set(prompt)   # padded for the windows
  key = jax.random.key(seed)

  def put(tokens, t, last):                                 # last [B, V] -> token P + t
    nxt = select(last, jax.random.fold_in(key, t), temperature, top_k)
    return jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, P + t))

  def full_window(tokens, s, L):
    """Logits [B, V] of position L - 1 from a full forward of tokens[s:s + T]."""
    w = jax.lax.dynamic_slice(tokens, (0, s), (B, T))                   # [B, T]
    logits = model.apply(params, w)                                     # [B, T, V]
    return jax.lax.dynamic_index_in_dim(logits, L - 1 - s, axis=1, keepdims=False)

  if window == "exact":
    # t < n_fit: the text (P + t tokens) fits the block; afterwards nanoGPT's crop.
    n_fit = min(N, max(0, T - P + 1))

    def crop_body(t, tokens):
      L = P + t
      s = jnp.maximum(0, L - T)
      if kv_cache:                                      # only past the block: the last T tokens
        w = jax.lax.dynamic_slice(tokens, (0, s), (B, T))               # [B, T]
        last = model.apply(params, w, last_only=True)[:, 0]             # [B, V]
      else:
        last = full_window(tokens, s, L)
      return put(tokens, t, last)

    if kv_cache and n_fit > 0:
      logits, cache = model.apply_cached(params, tokens[:, :T], model.init_cache(B), 0)
      tokens = put(tokens, 0, logits[:, P - 1])                         # prefill of the prompt

      def cache_body(t, carry):
        tokens, cache = carry
        L = P + t
        last_tok = jax.lax.dynamic_slice(tokens, (0, L - 1), (B, 1))    # [B, 1]
        logits, cache = model.apply_cached(params, last_tok, cache, L - 1)
        return put(tokens, t, logits[:, 0]), cache

      tokens, _ = jax.lax.fori_loop(1, n_fit, cache_body, (tokens, cache))
      tokens = jax.lax.fori_loop(n_fit, N, crop_body, tokens)
    else:
      tokens = jax.lax.fori_loop(0, N, crop_body, tokens)
    return tokens[:, :total]

  # window == "chunk"
  def no_cache_body(t, carry):
    tokens, s = carry
    L = P + t
    s = _chunk_start(L, s, T, keep)
    return put(tokens, t, full_window(tokens, s, L)), s

  def cache_body(t, carry):
    tokens, s, cache = carry
    L = P + t
    s_new = _chunk_start(L, s, T, keep)
    refill = (t == 0) | (s_new != s)

    def prefill(cache):
      w = jax.lax.dynamic_slice(tokens, (0, s_new), (B, T))             # [B, T]
      logits, cache = model.apply_cached(params, w, model.init_cache(B), 0)
      return jax.lax.dynamic_index_in_dim(logits, L - 1 - s_new, axis=1, keepdims=False), cache

    def one(cache):
      last_tok = jax.lax.dynamic_slice(tokens, (0, L - 1), (B, 1))       # [B, 1]
      logits, cache = model.apply_cached(params, last_tok, cache, L - 1 - s_new)
      return logits[:, 0], cache

    last, cache = jax.lax.cond(refill, prefill, one, cache)
    return put(tokens, t, last), s_new, cache

  s0 = jnp.zeros((), jnp.int32)
  if kv_cache:
    tokens, _, _ = jax.lax.fori_loop(0, N, cache_body, (tokens, s0, model.init_cache(B)))
  else:
    tokens, _ = jax.lax.fori_loop(0, N, no_cache_body, (tokens, s0))
  return tokens[:, :total]


def generate(model: gpt.GPTModel, params, prompt: np.ndarray, max_new_tokens: int, *,
             temperature: float = 0.8, top_k: Optional[int] = 200, seed: int = 1337,
             kv_cache: bool = True, window: str = "exact",
             keep: Optional[int] = None) -> np.ndarray:
  """prompt [B, P] int -> [B, P + max_new_tokens] int32.

  window: "exact" (nanoGPT's crop, the default) or "chunk" (the deviation; see the module doc).
  kv_cache: use the KV cache where the window allows it (the result is the same either way).
  keep: the "chunk" policy's context kept at a jump (default block_size // 2).
  """
  prompt = np.asarray(prompt, np.int32)
  if prompt.ndim != 2 or prompt.shape[1] == 0:
    raise ValueError(f"prompt must be [B, P] ids with P >= 1, got shape {prompt.shape}; start from "
                     "the newline id (0) for an empty prompt")
  gpt.check_token_ids(prompt, model.config.vocab_size)   # else NaN logits and token 0, silently
  T = model.config.block_size
  if window not in WINDOWS:
    raise ValueError(f"window={window!r}: must be 'exact' (nanoGPT's crop) or 'chunk' (the "
                     "cache-friendly deviation)")
  if keep is not None and window != "chunk":
    raise ValueError(f"keep={keep} is an option of window='chunk'; window={window!r} keeps "
                     f"block_size={T} tokens, as nanoGPT")
  keep = int(keep or max(1, T // 2))
  if not 1 <= keep <= T:
    raise ValueError(f"keep={keep}: must be in [1, block_size={T}]")
  return np.asarray(_generate(model, params, jnp.asarray(prompt), int(seed),
                              max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                              top_k=None if top_k is None else int(top_k), kv_cache=bool(kv_cache),
                              window=window, keep=keep))
