"""GPT-2 124M's cell of `make bench-gpu` (experiments/tools/bench_gpu.py): one side of the training
step, podlab's or nanoGPT's, timed on this process's device.

configs/gpt2_124m.py (12 x 12 x 768, block 1024, vocab 50304, bf16) at a batch of sequences per
step, one micro-step, on the same random token windows. podlab: the trainer's step. Reference:
nanoGPT's iteration (torch_reference.py, its model.py's modules and names, with podlab's initial
weights): bf16 autocast, fused AdamW (configure_optimizers' two groups), grad clip, the model under
torch.compile (side "ref", nanoGPT's compile=True) or eager (side "eager"). Model FLOPs: nanoGPT's
6N + 12LHQT per token (modules/gpt.py `flops_per_token`).

  python -m experiments.tools.bench_gpu --cells=gpt --gpt_batch=12
"""

from __future__ import annotations

from typing import Any, Dict

import jax
import numpy as np

from experiments.common import device_step
from experiments.common import layout as layout_lib
from experiments.common import parallel
from experiments.common import trainer
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import train as gpt_train
from experiments.nanogpt.configs import gpt2_124m
from experiments.tools import step_timing
from modules import gpt

QUICK_GPT = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=128)
"""`--quick`'s model size (the smoke run's)."""


def _gpt_config(batch: int, quick: bool):
  c = gpt2_124m.get_config()
  layout_lib.set_batch(c, batch, accum=1)
  c.model.dtype = "bfloat16"
  if quick:
    for k, v in QUICK_GPT.items():
      setattr(c.model, k, v)
  trainer.check_config(gpt_train.NanoGPT(), c)
  return c


def _gpt_podlab(c):
  """(layout, built, model config, initial state) of podlab's GPT step, without data."""
  layout, built = trainer.build(gpt_train.NanoGPT(), c)
  state, _ = trainer.init_state(built, c)
  return layout, built, built.model_config, state


def gpt_side(side: str, batch: int, *, steps: int, warmup: int,
             quick: bool = False) -> Dict[str, Any]:
  """One side of the GPT-2 cell (one micro-step of `batch` sequences per optimizer step):
  {ms, p10, p90, loss0, mem_GB, items, flops} per optimizer step."""
  c = _gpt_config(batch, quick)
  layout, built, cfg, state = _gpt_podlab(c)
  T, V = cfg.block_size, cfg.vocab_size
  n_params = gpt.num_params(state.params)
  window = np.random.default_rng(c.seed).integers(0, V, (batch, T + 1)).astype(np.int32)
  label = f"GPT-2 batch {batch} {side}"
  if side == "podlab":
    n = layout.devices_per_host
    w = window.reshape(n, 1, layout.per_device_batch, T + 1)
    data = parallel.shard({"x": w[..., :-1], "y": w[..., 1:]})
    di = parallel.shard(parallel.device_indices())
    step = device_step.parallel_train_step(built.train_step, c.nonfinite, seed=c.seed)
    box = {"state": parallel.replicate(state)}

    def one() -> float:
      box["state"], _, sums = step(box["state"], None, data, di)
      return step_timing.first(sums["loss"])
    out = step_timing.timed(one, steps, warmup, label)
    out["mem_GB"] = step_timing.jax_peak_gb()
  else:
    torch = step_timing.import_torch(quick)
    # pylint: disable-next=g-import-not-at-top  (torch is optional: only the reference sides)
    from experiments.nanogpt.tools import torch_reference
    device = step_timing.torch_device(torch)
    if device != "cpu":
      torch.set_default_device(device)
    args = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=T,
                vocab_size=V, bias=cfg.bias)
    model = torch_reference.GPT(args)
    sd = nanogpt_checkpoint.to_state_dict(jax.device_get(state.params), cfg)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(                                 # nanoGPT's configure_optimizers
        [{"params": [p for p in named.values() if p.dim() >= 2], "weight_decay": c.weight_decay},
         {"params": [p for p in named.values() if p.dim() < 2], "weight_decay": 0.0}],
        lr=c.lr, betas=(c.beta1, c.beta2), eps=1e-8, fused=device == "cuda")
    forward = torch.compile(model) if side == "ref" else model
    x = torch.as_tensor(window[:, :-1], dtype=torch.long, device=device)
    y = torch.as_tensor(window[:, 1:], dtype=torch.long, device=device)
    if torch.cuda.is_available():
      torch.cuda.reset_peak_memory_stats()

    def one() -> float:
      with torch.autocast(device_type=device, dtype=torch.bfloat16):
        logits = forward(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
      loss.backward()
      if c.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
      opt.step()
      opt.zero_grad(set_to_none=True)
      return float(loss.item())                              # nanoGPT reads the loss: a sync
    out = step_timing.timed(one, steps, warmup, label)
    out["mem_GB"] = step_timing.torch_peak_gb(torch)
  out["items"] = float(batch * T)
  out["flops"] = gpt.flops_per_token(cfg, n_params) * batch * T
  return out
