r"""The reference's val-loss curve: nanoGPT's train.py loop re-run in PyTorch on shakespeare_char.

The curve podlab's CPU recipe is compared with (docs/nanogpt.md, "The CPU recipe's curve") comes
from nanoGPT's own loop. This tool re-runs that loop in PyTorch (needs torch: pip install
'.[torch]'), as nanoGPT's README command for CPUs does it (config/train_shakespeare_char.py with
--device=cpu --compile=False --eval_iters=20 --block_size=64 --batch_size=12 --n_layer=4
--n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0), step for step:

* data as nanoGPT's data/shakespeare_char/prepare.py: the sorted distinct characters of input.txt,
  the first 90% of the ids for train, the rest for val;
* `torch.manual_seed(seed)`, then the model of experiments/nanogpt/tools/torch_reference.py, built and
  initialised in nanoGPT's module order (so the draws, and the initial weights, are nanoGPT's);
* the first batch fetched before the loop; at every iteration: the learning rate of get_lr(it)
  (linear warm-up, cosine to min_lr), at it % eval_interval == 0 the mean loss of eval_iters random
  batches per split (train, then val; before the update), then gradient_accumulation_steps forward passes, each
  followed by fetching the next batch and the backward pass, clipping to global norm 1.0, AdamW
  (weight decay on tensors of >= 2 dims, betas (0.9, 0.99), eps 1e-8); max_iters + 1 updates.

Batches are nanoGPT's get_batch: `torch.randint(len(data) - block_size, (batch_size,))` offsets,
x = data[i:i+T], y = data[i+1:i+1+T]. Dropout is not modelled (the CPU recipe has none).

  python -m experiments.nanogpt.tools.reference_curve                  # the 2000-iteration curve
  python -m experiments.nanogpt.tools.reference_curve --max_iters=100 --eval_interval=50
  python -m experiments.nanogpt.tools.reference_curve --out=/tmp/ref/ckpt.pt   # + the final model

Prints one line per evaluation (`iter N: train L, val L`) and the val curve as one table row; with
--out writes the model after the last update as a nanoGPT ckpt.pt (model, optimizer, model_args,
iter_num, best_val_loss, config), which experiments.nanogpt.sample --ckpt and
experiments.nanogpt.tools.val_eval --ckpt read.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.nn import functional as F

from experiments.common import errors
from experiments.nanogpt.tools import torch_reference
from input_pipeline import sources

DEFAULT_INPUT = sources.TINY_SHAKESPEARE          # the repository's copy

# nanoGPT's config/train_shakespeare_char.py with the README's CPU overrides.
CPU_RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False, batch_size=12,
                  gradient_accumulation_steps=1, max_iters=2000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
                  lr_decay_iters=2000, beta1=0.9, beta2=0.99, weight_decay=0.1, grad_clip=1.0,
                  eval_interval=250, eval_iters=20, seed=1337)


class InputMissing(errors.BadInput, FileNotFoundError):
  """--input does not exist (a FileNotFoundError too); the message names it and the fix."""


def prepare(path: str) -> Tuple[np.ndarray, np.ndarray, List[str]]:
  """(train ids, val ids, vocabulary) of a text file, as nanoGPT's shakespeare_char/prepare.py."""
  if not os.path.isfile(path):
    raise InputMissing(f"--input={path}: no such file. Fix: pass a text file, or leave --input "
                       f"out for the repository's Tiny Shakespeare ({DEFAULT_INPUT})")
  with open(path, encoding="utf-8") as f:
    data = f.read()
  chars = sorted(set(data))
  stoi = {ch: i for i, ch in enumerate(chars)}
  ids = np.array([stoi[c] for c in data], dtype=np.uint16)
  n = int(len(ids) * 0.9)
  return ids[:n], ids[n:], chars


def get_lr(it: int, h: Dict) -> float:
  """nanoGPT's get_lr: warm-up (it + 1) / (warmup + 1), cosine to min_lr, then min_lr."""
  if it < h["warmup_iters"]:
    return h["lr"] * (it + 1) / (h["warmup_iters"] + 1)
  if it > h["lr_decay_iters"]:
    return h["min_lr"]
  ratio = (it - h["warmup_iters"]) / (h["lr_decay_iters"] - h["warmup_iters"])
  return h["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (h["lr"] - h["min_lr"])


def run(h: Dict, train_ids: np.ndarray, val_ids: np.ndarray, vocab_size: int,
        log=print) -> Tuple[Dict[int, Dict[str, float]], torch.nn.Module, torch.optim.Optimizer,
                            List[float]]:
  """nanoGPT's training loop; returns ({iter: {"train", "val"}}, model, optimizer, ms/iteration)."""
  T, B = h["block_size"], h["batch_size"]
  splits = {"train": train_ids, "val": val_ids}
  torch.manual_seed(h["seed"])
  args = dict(n_layer=h["n_layer"], n_head=h["n_head"], n_embd=h["n_embd"], block_size=T,
              vocab_size=vocab_size, bias=h["bias"])
  model = torch_reference.init_like_nanogpt(torch_reference.GPT(args), h["n_layer"])
  params = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(
      [{"params": [p for p in params if p.dim() >= 2], "weight_decay": h["weight_decay"]},
       {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
      lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=1e-8)

  def get_batch(split: str) -> Tuple[torch.Tensor, torch.Tensor]:
    data = splits[split]
    ix = torch.randint(len(data) - T, (B,))
    x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
    return x, y

  def loss_of(x, y):
    logits = model(x)                                              # [B, T, V]
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)

  @torch.no_grad()
  def estimate_loss() -> Dict[str, float]:
    model.eval()
    out = {}
    for split in ("train", "val"):
      losses = torch.zeros(h["eval_iters"])
      for k in range(h["eval_iters"]):
        losses[k] = loss_of(*get_batch(split)).item()
      out[split] = float(losses.mean())
    model.train()
    return out

  curve: Dict[int, Dict[str, float]] = {}
  ms: List[float] = []
  x, y = get_batch("train")
  for it in range(h["max_iters"] + 1):
    lr = get_lr(it, h)
    for group in opt.param_groups:
      group["lr"] = lr
    if it % h["eval_interval"] == 0:
      curve[it] = estimate_loss()
      log(f"iter {it}: train {curve[it]['train']:.4f}, val {curve[it]['val']:.4f}")
    t0 = time.perf_counter()
    for _ in range(h["gradient_accumulation_steps"]):
      loss = loss_of(x, y) / h["gradient_accumulation_steps"]
      x, y = get_batch("train")
      loss.backward()
    if h["grad_clip"] > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), h["grad_clip"])
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()                                   # nanoGPT reads the loss every log interval
    ms.append(1e3 * (time.perf_counter() - t0))
  return curve, model, opt, ms


def save_checkpoint(path: str, model, opt, h: Dict, vocab_size: int,
                    curve: Dict[int, Dict[str, float]]) -> None:
  """The model after the last update as nanoGPT's ckpt.pt dict (written to a tmp file, renamed)."""
  model_args = dict(n_layer=h["n_layer"], n_head=h["n_head"], n_embd=h["n_embd"],
                    block_size=h["block_size"], bias=h["bias"], vocab_size=vocab_size, dropout=0.0)
  ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "model_args": model_args,
          "iter_num": h["max_iters"], "best_val_loss": min(v["val"] for v in curve.values()),
          "config": dict(h)}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  torch.save(ckpt, tmp)
  os.replace(tmp, path)


def curve_row(curve: Dict[int, Dict[str, float]]) -> str:
  """`| iteration | 0 | 250 | ... |` and `| val | 4.1649 | ... |` (markdown, 4 decimals)."""
  its = sorted(curve)
  return ("| iteration | " + " | ".join(str(i) for i in its) + " |\n"
          "| val | " + " | ".join(f"{curve[i]['val']:.4f}" for i in its) + " |")


def parse(argv: Optional[Sequence[str]]) -> Dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--input", default=DEFAULT_INPUT, help="tinyshakespeare input.txt")
  p.add_argument("--out", default="", help="write the final model as a nanoGPT ckpt.pt here")
  p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
  for k, v in CPU_RECIPE.items():
    if isinstance(v, bool):
      continue
    p.add_argument(f"--{k}", type=type(v), default=v, help=f"nanoGPT's {k} (default {v})")
  a = vars(p.parse_args(argv))
  for k in ("max_iters", "eval_interval", "eval_iters", "batch_size", "gradient_accumulation_steps", "block_size"):
    if a[k] < (0 if k == "max_iters" else 1):
      p.error(f"--{k}={a[k]}: must be {'>= 0' if k == 'max_iters' else '>= 1'}")
  return a


def main(argv: Optional[Sequence[str]] = None) -> int:
  a = parse(argv)
  if a["threads"] > 0:
    torch.set_num_threads(a["threads"])
  h = {k: a[k] for k in CPU_RECIPE if k in a}
  h["bias"] = CPU_RECIPE["bias"]
  try:
    train_ids, val_ids, chars = prepare(a["input"])
  except errors.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return errors.exit_code(e)
  print(f"nanoGPT loop in PyTorch {torch.__version__} ({torch.get_num_threads()} threads): "
        f"{len(chars)} characters, {len(train_ids):,} train / {len(val_ids):,} val ids; {h}",
        flush=True)
  t0 = time.perf_counter()
  curve, model, opt, ms = run(h, train_ids, val_ids, len(chars),
                              log=lambda s: print(s, flush=True))
  print(f"{h['max_iters'] + 1} updates in {time.perf_counter() - t0:.1f} s; median "
        f"{statistics.median(ms):.2f} ms/iteration (forward, backward, clip, AdamW; evaluations "
        "excluded)")
  print(curve_row(curve))
  if a["out"]:
    save_checkpoint(a["out"], model, opt, h, len(chars), curve)
    print(f"wrote {a['out']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
