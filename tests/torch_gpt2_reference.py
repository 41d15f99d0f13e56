"""An independent PyTorch GPT-2 forward on Hugging Face GPT-2 tensors (tests only; no transformers).

Written from the GPT-2 architecture, on the stored tensors as they are: token + position embeddings,
per block x += c_proj(attn(ln_1(x))) and x += mlp(ln_2(x)) with Conv1D layers y = x @ W + b (W
stored [in, out]), c_attn's output split q | k | v and each into heads, causal softmax attention
with scale 1/sqrt(head dim), MLP c_fc -> GELU -> c_proj, final ln_f, logits = h @ wte^T; LayerNorm
eps 1e-5. GELU exact (erf) as nanoGPT computes it, or GPT-2's "gelu_new" tanh form. Any dtype
(the tests use float64 as the reference). Names may carry the `transformer.` prefix.

Synopsis (tensors: {name: numpy array} as in model.safetensors):
  logits = forward(tensors, n_head, idx)                   # idx [B, T] int -> [B, T, V] numpy
  tokens = greedy(tensors, n_head, prompt, 20, block_size)  # [B, P + 20], crop to block_size
"""
import math

import numpy as np
import torch
from torch.nn import functional as F


def _get(tensors, name, dtype):
  for prefix in ("", "transformer."):
    if prefix + name in tensors:
      return torch.as_tensor(np.array(tensors[prefix + name]), dtype=dtype)
  raise KeyError(name)


def forward(tensors, n_head, idx, *, dtype=torch.float64, gelu="exact"):
  """GPT-2 logits [B, T, V] (numpy, `dtype`) of token ids idx [B, T]."""
  g = lambda name: _get(tensors, name, dtype)  # noqa: E731
  idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
  B, T = idx.shape
  wte = g("wte.weight")
  x = wte[idx] + g("wpe.weight")[:T][None]                          # [B, T, C]
  C = x.shape[-1]
  Dh = C // n_head
  n_layer = 0
  while any(f"{p}h.{n_layer}.ln_1.weight" in tensors for p in ("", "transformer.")):
    n_layer += 1
  causal = torch.ones(T, T, dtype=torch.bool).tril()
  for i in range(n_layer):
    h = F.layer_norm(x, (C,), g(f"h.{i}.ln_1.weight"), g(f"h.{i}.ln_1.bias"), 1e-5)
    qkv = h @ g(f"h.{i}.attn.c_attn.weight") + g(f"h.{i}.attn.c_attn.bias")   # [B, T, 3C]
    q, k, v = (t.reshape(B, T, n_head, Dh).transpose(1, 2) for t in qkv.split(C, dim=-1))
    att = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)                 # [B, H, T, T]
    att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + y @ g(f"h.{i}.attn.c_proj.weight") + g(f"h.{i}.attn.c_proj.bias")
    h = F.layer_norm(x, (C,), g(f"h.{i}.ln_2.weight"), g(f"h.{i}.ln_2.bias"), 1e-5)
    a = h @ g(f"h.{i}.mlp.c_fc.weight") + g(f"h.{i}.mlp.c_fc.bias")
    a = F.gelu(a) if gelu == "exact" else F.gelu(a, approximate="tanh")
    x = x + a @ g(f"h.{i}.mlp.c_proj.weight") + g(f"h.{i}.mlp.c_proj.bias")
  x = F.layer_norm(x, (C,), g("ln_f.weight"), g("ln_f.bias"), 1e-5)
  return (x @ wte.T).numpy()


def greedy(tensors, n_head, prompt, max_new_tokens, block_size, **kw):
  """Argmax decoding, the context cropped to the last block_size tokens (nanoGPT's generate)."""
  tokens = np.asarray(prompt, np.int64)
  for _ in range(max_new_tokens):
    logits = forward(tensors, n_head, tokens[:, -block_size:], **kw)
    tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None]], axis=1)
  return tokens
