"""An independent float64 NumPy Dream forward that reads Hugging Face-layout tensors directly.

Written from docs/diffucoder.md, not from modules/dream.py: torch [out, in] weights,
separate q/k/v projections with biases, query head h reads KV head h // (H // K), RoPE "rotate half"
with theta from the config, RMSNorm with weight, SwiGLU, untied head, a padding-only (non-causal)
mask = outer product of validity; a query row with no valid key gets uniform weights (as the podlab
layer does). Used by tests/test_dream_model.py and tests/test_diffucoder_convert.py.

Shape glossary: B batch, L tokens, C context tokens, D hidden, H/K query/KV heads, Dh head dim, V vocab.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import numpy as np


def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
  """x [B, L, heads, Dh]; pos [B, L]."""
  dh = x.shape[-1]
  half = dh // 2
  inv = theta ** (-(2.0 * np.arange(half)) / dh)
  ang = pos.astype(np.float64)[..., None] * inv                      # [B, L, Dh/2]
  cos, sin = np.cos(ang)[:, :, None, :], np.sin(ang)[:, :, None, :]
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def positions_from_valid(valid: np.ndarray, offset: Optional[np.ndarray] = None) -> np.ndarray:
  """0 at each row's first valid token (plus offset), pads 0."""
  pos = np.cumsum(valid, axis=1) - 1
  if offset is not None:
    pos = pos + offset[:, None]
  return np.where(valid, pos, 0)


def forward(get: Callable[[str], np.ndarray], cfg, tokens: np.ndarray, valid: np.ndarray,
            positions: Optional[np.ndarray] = None, kv_group: str = "h//G",
            context=None) -> Dict[str, np.ndarray]:
  """Returns {"logits": [B, L, V], "k": [layer][B, L, K, Dh], "v": ...} in float64.

  get(name) -> the HF tensor (any float dtype; converted to float64 here).
  kv_group: "h//G" (Dream) or "h%K" (a deliberately wrong grouping, for negative controls).
  context: None or (k_list, v_list, context_valid [B, C]) of float64 arrays.
  """
  g = lambda name: np.asarray(get(name), np.float64)
  B, L = tokens.shape
  H, K, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  G = H // K
  valid = np.asarray(valid, bool)
  if context is not None:
    ctx_k, ctx_v, ctx_valid = context
    ctx_valid = np.asarray(ctx_valid, bool)
  else:
    ctx_k = ctx_v = None
    ctx_valid = np.zeros((B, 0), bool)
  if positions is None:
    positions = positions_from_valid(valid, ctx_valid.sum(1) if context is not None else None)
  keys_valid = np.concatenate([ctx_valid, valid], axis=1)            # [B, C + L]
  allowed = valid[:, :, None] & keys_valid[:, None, :]               # [B, L, C + L]
  eps = cfg.rms_norm_eps
  x = g("model.embed_tokens.weight")[tokens]                         # [B, L, D]
  ks, vs = [], []
  for n in range(cfg.num_layers):
    p = f"model.layers.{n}."
    h = rms(x, g(p + "input_layernorm.weight"), eps)
    proj = lambda t: (h @ g(p + f"self_attn.{t}_proj.weight").T + g(p + f"self_attn.{t}_proj.bias"))
    q = rope(proj("q").reshape(B, L, H, Dh), positions, cfg.rope_theta)
    k = rope(proj("k").reshape(B, L, K, Dh), positions, cfg.rope_theta)
    v = proj("v").reshape(B, L, K, Dh)
    ks.append(k)
    vs.append(v)
    k_all = k if ctx_k is None else np.concatenate([ctx_k[n], k], axis=1)
    v_all = v if ctx_v is None else np.concatenate([ctx_v[n], v], axis=1)
    out = np.zeros((B, L, H, Dh))
    for head in range(H):
      j = head // G if kv_group == "h//G" else head % K
      s = np.einsum("bqd,bkd->bqk", q[:, :, head], k_all[:, :, j]) / math.sqrt(Dh)
      s = np.where(allowed, s, -np.inf)
      none = ~allowed.any(-1, keepdims=True)                         # fully masked rows: uniform
      s = np.where(none, 0.0, s)
      w = np.exp(s - s.max(-1, keepdims=True))
      w /= w.sum(-1, keepdims=True)
      out[:, :, head] = np.einsum("bqk,bkd->bqd", w, v_all[:, :, j])
    x = x + out.reshape(B, L, H * Dh) @ g(p + "self_attn.o_proj.weight").T
    h = rms(x, g(p + "post_attention_layernorm.weight"), eps)
    gate = h @ g(p + "mlp.gate_proj.weight").T
    up = h @ g(p + "mlp.up_proj.weight").T
    x = x + (gate / (1.0 + np.exp(-gate)) * up) @ g(p + "mlp.down_proj.weight").T
  x = rms(x, g("model.norm.weight"), eps)
  return {"logits": x @ g("lm_head.weight").T, "k": ks, "v": vs}
