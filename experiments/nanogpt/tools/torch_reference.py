"""A minimal PyTorch GPT in nanoGPT's module layout (state_dict names): the tests' and the benchmark's
stand-in for the reference (needs torch: pip install '.[torch]').

Written from docs/nanogpt.md (pre-LN, fused c_attn, causal attention through
`F.scaled_dot_product_attention(is_causal=True)` as nanoGPT does on torch >= 2, exact GELU, tied
lm_head, LayerNorm with optional bias); no dropout, no generation. Modules are created in nanoGPT's
order, so `torch.manual_seed(s); init_like_nanogpt(GPT(args))` draws the same initial weights as
nanoGPT's GPT(args).

Synopsis:
  import torch
  from experiments.nanogpt.tools.torch_reference import GPT
  model = GPT(dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=False))
  logits = model(torch.zeros((1, 8), dtype=torch.long))          # [1, 8, 11]
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
  def __init__(self, n, bias):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(n))
    self.bias = nn.Parameter(torch.zeros(n)) if bias else None

  def forward(self, x):
    return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Block(nn.Module):
  def __init__(self, a):
    super().__init__()
    C, b = a["n_embd"], a["bias"]
    self.n_head = a["n_head"]
    self.ln_1 = LayerNorm(C, b)
    self.attn = nn.Module()
    self.attn.c_attn = nn.Linear(C, 3 * C, bias=b)
    self.attn.c_proj = nn.Linear(C, C, bias=b)
    self.ln_2 = LayerNorm(C, b)
    self.mlp = nn.Module()
    self.mlp.c_fc = nn.Linear(C, 4 * C, bias=b)
    self.mlp.c_proj = nn.Linear(4 * C, C, bias=b)

  def forward(self, x):
    B, T, C = x.shape
    q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    x = x + self.attn.c_proj(y)
    return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
  def __init__(self, a):
    super().__init__()
    self.transformer = nn.ModuleDict(dict(
        wte=nn.Embedding(a["vocab_size"], a["n_embd"]),
        wpe=nn.Embedding(a["block_size"], a["n_embd"]),
        h=nn.ModuleList([Block(a) for _ in range(a["n_layer"])]),
        ln_f=LayerNorm(a["n_embd"], a["bias"])))
    self.lm_head = nn.Linear(a["n_embd"], a["vocab_size"], bias=False)
    self.lm_head.weight = self.transformer.wte.weight

  def forward(self, idx):
    t = self.transformer
    x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
    for block in t.h:
      x = block(x)
    return self.lm_head(t.ln_f(x))


def init_like_nanogpt(model, n_layer):
  """nanoGPT's _init_weights (post-order apply) then the c_proj re-init; returns the model."""
  def init_weights(m):
    if isinstance(m, nn.Linear):
      torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
      if m.bias is not None:
        torch.nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Embedding):
      torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

  model.apply(init_weights)
  for name, p in model.named_parameters():
    if name.endswith("c_proj.weight"):
      torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
  return model
