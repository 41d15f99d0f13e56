"""TRM's cells of `make bench-gpu` (experiments/tools/bench_gpu.py): one side of a TRM-MLP or
TRM-Att training step at a batch, podlab's or the reference's, timed on this process's device.

podlab: the trainer's real pmapped step of the Sudoku recipe (step_setup.py `compile_config_step`).
Reference: tests/torch_trm_reference.py `TrainStep` (the reference's model, ACT training wrapper,
loss, AdamATan2, SignSGD, EMA; checked step for step against podlab by
tests/test_trm_reference_step.py) with podlab's initial weights and batch (bench_reference.py
`reference_step`), run as its authors run it: the model's forward under `torch.compile` (side
"ref"), or eager (side "eager"). Model FLOPs: experiments/trm/flops.py's analytic count.

  python -m experiments.tools.bench_gpu --cells=trm --trm_models=mlp --trm_batches=768
"""

from __future__ import annotations

from typing import Any, Dict

import jax

from experiments.tools import step_timing
from experiments.trm import flops
from experiments.trm.tools import bench_reference
from experiments.trm.tools import step_setup

MODELS = tuple(step_setup.RECIPES)
"""The recipes a cell may name: "mlp", "att"."""
QUICK_TRM = dict(hidden=32)
"""`--quick`'s model size (the smoke run's)."""


def _trm_config(model: str, batch: int, quick: bool):
  return step_setup.recipe_config(model, "bfloat16",
                                  per_device_batch=batch // jax.local_device_count(),
                                  hidden=QUICK_TRM["hidden"] if quick else None)


def trm_side(side: str, model: str, batch: int, *, steps: int, warmup: int,
             quick: bool = False) -> Dict[str, Any]:
  """One side of a TRM cell: {ms, p10, p90, loss0, mem_GB, items, flops} per optimizer step."""
  config = _trm_config(model, batch, quick)
  label = f"TRM-{model} batch {batch} {side}"
  if side == "podlab":
    setup = step_setup.compile_config_step(config)
    state, carry, b, di = setup.args
    setup.args = (None, None, b, di)                         # state and carry get donated

    def one() -> float:
      nonlocal state, carry
      state, carry, sums = setup.compiled(state, carry, b, di)
      return step_timing.first(sums["lm_loss"])              # reads back: the step has finished
    out = step_timing.timed(one, steps, warmup, label)
    out["mem_GB"] = step_timing.jax_peak_gb()
  else:
    torch = step_timing.import_torch(quick)
    setup = step_setup.compile_config_step(config, compile=False)   # podlab's first weights, batch
    device = step_timing.torch_device(torch)
    if device != "cpu":
      torch.set_default_device(device)      # the reference's tensors on the GPU as it creates them
    t_step, t_batch, _ = bench_reference.reference_step(setup, config)
    t_step.generator = torch.Generator(device=device).manual_seed(0)
    t_batch = {k: v.to(device) for k, v in t_batch.items()}
    t_carry = t_step.act.initial_carry(t_batch)
    if side == "ref":                                        # the reference's default: compiled
      inner = t_step.act.inner
      inner.forward = torch.compile(inner.forward)
    if torch.cuda.is_available():
      torch.cuda.reset_peak_memory_stats()

    def one() -> float:
      nonlocal t_carry
      t_carry, metrics = t_step(t_carry, t_batch)
      step_timing.sync(torch)
      return float(metrics["lm_loss"])
    out = step_timing.timed(one, steps, warmup, label)
    out["mem_GB"] = step_timing.torch_peak_gb(torch)
  out["items"] = float(batch)
  out["flops"] = flops.analytic_flops(setup.cfg).total * batch
  return out
