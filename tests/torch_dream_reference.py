"""An independent PyTorch Dream forward with the Hugging Face (Qwen2-style) bfloat16 numerics.

Written from docs/diffucoder.md and the usual Qwen2 structure, not from podlab code:
nn.functional.linear with bias for q/k/v, RoPE tables computed in float32 then cast to the model dtype
and applied in that dtype, repeat_kv for grouped heads, scaled_dot_product_attention with a boolean
padding mask (outer product of validity), RMSNorm in float32 cast back then times the weight,
down(silu(gate) * up), untied lm_head. Used by tests/test_dream_model.py to measure how close the
JAX bfloat16 forward is to the PyTorch bfloat16 one. torch is the optional `torch` extra.

Shape glossary: B batch, L tokens, D hidden, H/K query/KV heads, Dh head dim, V vocab.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _rms(x, w, eps):
  dtype = x.dtype
  x32 = x.to(torch.float32)
  x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
  return w * x32.to(dtype)


def _rotate_half(x):
  x1, x2 = x.chunk(2, dim=-1)
  return torch.cat((-x2, x1), dim=-1)


def forward(tensors: dict, cfg, tokens: np.ndarray, valid: np.ndarray,
            dtype=torch.bfloat16) -> np.ndarray:
  """logits [B, L, V] as float32 numpy; tensors: HF name -> numpy array (cast to `dtype`)."""
  w = {k: torch.from_numpy(np.asarray(v, np.float32)).to(dtype) for k, v in tensors.items()}
  B, L = tokens.shape
  H, K, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  valid_t = torch.from_numpy(np.asarray(valid, bool))
  pos = (valid_t.long().cumsum(-1) - 1).clamp(min=0)                     # [B, L]
  inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, Dh, 2, dtype=torch.int64).float() / Dh))
  freqs = pos[:, :, None].float() * inv_freq[None, None, :]              # [B, L, Dh/2] float32
  emb = torch.cat((freqs, freqs), dim=-1)
  cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]  # [B, 1, L, Dh]
  mask = (valid_t[:, None, :, None] & valid_t[:, None, None, :])         # [B, 1, L, L]
  mask = mask | ~mask.any(-1, keepdim=True)            # fully padded rows: attend to all (no NaN)
  eps = cfg.rms_norm_eps
  with torch.no_grad():
    x = w["model.embed_tokens.weight"][torch.from_numpy(np.asarray(tokens, np.int64))]
    for n in range(cfg.num_layers):
      p = f"model.layers.{n}."
      h = _rms(x, w[p + "input_layernorm.weight"], eps)
      lin = lambda t: F.linear(h, w[p + f"self_attn.{t}_proj.weight"], w[p + f"self_attn.{t}_proj.bias"])
      q = lin("q").view(B, L, H, Dh).transpose(1, 2)                    # [B, H, L, Dh]
      k = lin("k").view(B, L, K, Dh).transpose(1, 2)
      v = lin("v").view(B, L, K, Dh).transpose(1, 2)
      q = q * cos + _rotate_half(q) * sin
      k = k * cos + _rotate_half(k) * sin
      k = k.repeat_interleave(H // K, dim=1)                            # repeat_kv: h -> h // G
      v = v.repeat_interleave(H // K, dim=1)
      a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
      a = a.transpose(1, 2).reshape(B, L, H * Dh)
      x = x + F.linear(a, w[p + "self_attn.o_proj.weight"])
      h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
      g = F.linear(h, w[p + "mlp.gate_proj.weight"])
      u = F.linear(h, w[p + "mlp.up_proj.weight"])
      x = x + F.linear(F.silu(g) * u, w[p + "mlp.down_proj.weight"])
    x = _rms(x, w["model.norm.weight"], eps)
    return F.linear(x, w["lm_head.weight"]).float().numpy()
