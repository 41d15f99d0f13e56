r"""Val loss of trained shakespeare_char GPTs on the SAME N random val batches: a fair comparison.

A training run's val loss is the mean of eval_iters (20 in the CPU recipe) random batches, drawn
from that run's own random stream, so two runs' final numbers differ by sampling noise as well as by
their weights. This tool scores every model it is given on one fixed set of windows: `batches`
batches of `batch_size` windows of block_size tokens at offsets drawn from
numpy.random.default_rng(seed) in [0, len(val) - block_size), with y = x shifted by one (nanoGPT's
get_batch), and reports per model the mean over the batches of each batch's mean token
cross-entropy, the standard error of that mean, and the spread (standard deviation) of a 20- and a
200-batch estimate (what eval_iters=20 / 200 would give).

Models: nanoGPT checkpoints (`--ckpt`, a ckpt.pt with model + model_args, e.g. from
experiments.nanogpt.tools.reference_curve --out; read with torch.load(weights_only=True)) and
podlab workdirs (`--workdir`, the newest checkpoint in <workdir>/checkpoints, the model from
<workdir>/model_args.json). All are evaluated by podlab's GPT forward (modules/gpt.py) in float32
(a bfloat16-trained workdir in its own dtype); the val ids come from input.txt as nanoGPT's
prepare.py makes them (sorted characters, last 10%).

  python -m experiments.nanogpt.tools.val_eval --ckpt=/tmp/ref/ckpt.pt \
      --workdir=workdirs/shakespeare_char_cpu --batches=1200
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.common import console

console.quiet_native_logs()     # CLI: before TensorFlow (via the data pipeline) and XLA load (its oneDNN notice)

import jax
import jax.numpy as jnp
import numpy as np
from experiments.common import checkpointing
from experiments.common import distributed
from experiments.common import errors
from experiments.common import workdir as workdir_lib
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt.tools import reference_curve
from modules import gpt

CHUNK = 50          # batches per jitted forward


class EvalInputError(errors.BadInput):
  """A --ckpt / --workdir / --input this tool cannot evaluate; the message names it and the fix."""


def windows(val_ids: np.ndarray, block_size: int, batches: int, batch_size: int,
            seed: int) -> np.ndarray:
  """int64 offsets [batches, batch_size] in [0, len(val_ids) - block_size)."""
  return np.random.default_rng(seed).integers(0, len(val_ids) - block_size,
                                              size=(batches, batch_size))


def load_workdir(workdir: str) -> Tuple[gpt.GPTConfig, Dict[str, Any], int, str]:
  """(config, params, step, vocabulary) of the newest complete checkpoint of a podlab GPT run."""
  run = workdir_lib.Workdir(workdir)
  args_path = run.path("model_args.json")
  if not os.path.isfile(args_path):
    raise EvalInputError(f"--workdir={workdir}: no model_args.json. Fix: pass the --workdir of a "
                         "finished `python -m experiments.nanogpt.main` run")
  args = workdir_lib.read_json(args_path)
  found = checkpointing.find_checkpoint(run.checkpoints)
  if found is None:
    raise EvalInputError(f"--workdir={workdir}: no complete checkpoint in {run.checkpoints}. Fix: "
                         "train first (rerunning the training command resumes)")
  _, step = found
  tree = checkpointing.read_tree(run.replicated(step))
  params = jax.tree.map(np.asarray, tree["state"]["params"])
  config = nanogpt_checkpoint.config_from_args(args, args.get("dtype", "float32"))
  # A workdir from before model.activations existed ran bfloat16 as "float32".
  config = dataclasses.replace(config, activations=args.get("activations", "float32"),
                              gelu=args.get("gelu", "exact"))   # workdirs before gelu: exact
  return config, params, step, args.get("vocab", "")


def evaluate(config: gpt.GPTConfig, params: Dict[str, Any], val_ids: np.ndarray,
             offsets: np.ndarray) -> np.ndarray:
  """Mean token cross-entropy of each batch: float64 [batches]."""
  model = gpt.GPTModel(config)
  T = config.block_size
  idx = offsets[..., None] + np.arange(T + 1)                    # [N, B, T + 1]

  @jax.jit
  def batch_losses(params, w):                                   # w [n, B, T + 1]
    n, b = w.shape[:2]
    x, y = w[..., :-1].reshape(n * b, T), w[..., 1:].reshape(n * b, T)
    logp = jax.nn.log_softmax(model.apply(params, x).astype(jnp.float32), axis=-1)   # [nB, T, V]
    nll = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]                # [nB, T]
    return nll.reshape(n, b * T).mean(axis=1)                                     # [n]

  params = jax.tree.map(jnp.asarray, params)
  out = []
  for start in range(0, len(offsets), CHUNK):
    w = val_ids[idx[start:start + CHUNK]].astype(np.int32)
    out.append(np.asarray(batch_losses(params, w), np.float64))
  return np.concatenate(out)


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--ckpt", action="append", default=[], help="a nanoGPT ckpt.pt (repeatable)")
  p.add_argument("--workdir", action="append", default=[], help="a podlab GPT workdir (repeatable)")
  p.add_argument("--input", default=reference_curve.DEFAULT_INPUT, help="tinyshakespeare input.txt")
  p.add_argument("--batches", type=int, default=1200)
  p.add_argument("--batch_size", type=int, default=12)
  p.add_argument("--seed", type=int, default=0, help="seed of the window offsets")
  a = p.parse_args(argv)
  if not a.ckpt and not a.workdir:
    p.error("nothing to evaluate: pass --ckpt=PATH and/or --workdir=DIR")
  if a.batches < 2 or a.batch_size < 1:
    p.error(f"--batches={a.batches} --batch_size={a.batch_size}: need >= 2 batches of >= 1 window")
  return a


def main(argv: Optional[Sequence[str]] = None) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  a = parse(argv)
  try:
    _, val_ids, chars = reference_curve.prepare(a.input)
    models: List[Tuple[str, gpt.GPTConfig, Dict[str, Any], str]] = []
    for path in a.ckpt:
      cfg, params, meta = nanogpt_checkpoint.load(path)
      models.append((path, cfg, params, f"iter {meta['iter_num']}"))
    for wd in a.workdir:
      cfg, params, step, vocab = load_workdir(wd)
      if vocab and vocab != "".join(chars):
        raise EvalInputError(f"--workdir={wd}: trained on another vocabulary than {a.input}'s "
                             f"{len(chars)} characters. Fix: evaluate shakespeare_char runs only")
      models.append((wd, cfg, params, f"step {step}"))
  except errors.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return errors.exit_code(e)
  for name, cfg, _, _ in models:
    if cfg.vocab_size < len(chars):
      print(f"error: {name}: vocab_size {cfg.vocab_size} < the {len(chars)} characters of "
            f"{a.input}. Fix: evaluate shakespeare_char models only", file=sys.stderr)
      return 2
  print(f"{a.batches} val batches x {a.batch_size} windows, offsets from default_rng({a.seed}); "
        f"{len(val_ids):,} val ids")
  print("| model | at | block | mean val loss | std error | spread of a 20-batch / 200-batch "
        "estimate |\n|---|---|---|---|---|---|")
  for name, cfg, params, at in models:
    offsets = windows(val_ids, cfg.block_size, a.batches, a.batch_size, a.seed)
    losses = evaluate(cfg, params, val_ids, offsets)
    sd = float(np.std(losses, ddof=1))
    print(f"| {name} | {at} | {cfg.block_size} | {losses.mean():.4f} | "
          f"{sd / math.sqrt(len(losses)):.4f} | {sd / math.sqrt(20):.4f} / {sd / math.sqrt(200):.4f} |",
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
