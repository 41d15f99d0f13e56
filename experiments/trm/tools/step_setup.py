"""The real TRM training step for the bench tools: recipe configs, the compiled step, timed steps.

`recipe_config` is a Sudoku recipe (configs/sudoku_mlp.py, sudoku_att.py) with the compute dtype,
remat, hidden size and per-device batch a benchmark row asks for; `compile_config_step` builds
state, carry and a random Sudoku-shaped batch as `train.train_and_evaluate` does and AOT-compiles
the trainer's pmapped step (AdamATan2, EMA, sparse SignSGD, the non-finite guard; on a CPU target
the CPU forms of experiments/trm/cpu_tuning.py); `time_steps` runs it with state and carry fed
back. Used by bench.py, bench_reference.py, bench_gpu.py, compare_forms.py and profile_step.py.

Synopsis (a tiny recipe on this machine):

  from experiments.trm.tools import step_setup

  setup = step_setup.compile_step("mlp", "float32", 2, hidden=32)
  times = step_setup.time_steps(setup, steps=2, warmup=1, label="tiny")   # seconds per step
  print(setup.global_batch, setup.compile_s, setup.memory["temp"], setup.forms_text())
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
import ml_collections
import numpy as np

from experiments.common import device_step
from experiments.common import layout as layout_lib
from experiments.common import parallel
from experiments.common import trainer
from experiments.trm import cpu_tuning
from experiments.trm import train
from experiments.trm.configs import sudoku_att
from experiments.trm.configs import sudoku_mlp
from modules import trm

SUDOKU_METADATA = {"seq_len": 81, "vocab_size": 11, "num_puzzle_identifiers": 1}
RECIPES = {"mlp": sudoku_mlp.get_config, "att": sudoku_att.get_config}
REFERENCE_TOTAL_STEPS = 65_104           # Sudoku at batch 768 (docs/trm.md section 5): the LR schedule
GB = 1e9


def _log(msg: str) -> None:
  print(f"[bench] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# Configs.

def recipe_config(model: str, dtype: str, *, hidden: Optional[int] = None, remat: bool = False,
                  per_device_batch: int = 64,
                  cpu_tuning: Optional[bool] = None) -> ml_collections.ConfigDict:
  """The real Sudoku recipe config ("mlp" or "att") with compute dtype, remat, optional hidden size;
  `cpu_tuning` False turns the CPU-only forms off (None: the config's own, on)."""
  if model not in RECIPES:
    raise ValueError(f"unknown model {model!r}; use one of {sorted(RECIPES)}")
  c = RECIPES[model]()
  c.model.forward_dtype = dtype
  c.model.remat = bool(remat)
  if hidden:
    c.model.hidden_size = int(hidden)
    c.model.puzzle_emb_ndim = int(hidden)     # the recipes' E = D
  c, _ = layout_lib.with_per_device_batch(c, per_device_batch, jax.local_device_count())
  c.total_steps = REFERENCE_TOTAL_STEPS
  if cpu_tuning is not None:
    c.cpu_tuning = bool(cpu_tuning)
  trainer.check_config(train.TRM(), c)
  return c


def trm_config(model: str, dtype: str = "bfloat16", *, hidden: Optional[int] = None,
               remat: bool = False) -> trm.TRMConfig:
  """TRMConfig of a recipe via `train.model_config` and the Sudoku metadata (L 81, V 11, N 1)."""
  return train.model_config(recipe_config(model, dtype, hidden=hidden, remat=remat),
                            SUDOKU_METADATA)



def _memory(compiled) -> Dict[str, float]:
  m = compiled.memory_analysis()
  if m is None:
    return {"temp": float("nan"), "arg": float("nan"), "out": float("nan"), "alias": float("nan")}
  return {"temp": m.temp_size_in_bytes / GB, "arg": m.argument_size_in_bytes / GB,
          "out": m.output_size_in_bytes / GB, "alias": m.alias_size_in_bytes / GB}

# --------------------------------------------------------------------------------------------------
# The real training step.

@dataclasses.dataclass
class StepSetup:
  """A compiled train step and fresh on-device arguments for it."""
  cfg: trm.TRMConfig
  per_device_batch: int
  global_batch: int
  compiled: Any
  compile_s: float
  memory: Dict[str, float]
  args: Tuple[Any, Any, Any, Any]          # state, carry, batch, device_index
  slices: int = 1                          # cpu_tuning.batch_slices: the batch's slices per step
  forms: Dict[str, Any] = dataclasses.field(default_factory=dict)   # cpu_tuning.carried

  def forms_text(self) -> str:
    """Which CPU forms the compiled step carries, e.g. "fast_grad True, ..., batch_slices 2"."""
    return cpu_tuning.forms_text(self.forms)


def random_batch(n_local: int, per_device: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """Sudoku-shaped random batch [n_local, b, ...]: inputs in {blank, digits}, labels digits."""
  rng = np.random.default_rng(seed)
  L, V = SUDOKU_METADATA["seq_len"], SUDOKU_METADATA["vocab_size"]
  return {"inputs": rng.integers(1, V, (n_local, per_device, L)).astype(np.int32),
          "labels": rng.integers(2, V, (n_local, per_device, L)).astype(np.int32),
          "puzzle_identifiers": np.zeros((n_local, per_device), np.int32)}


def compile_step(model: str, dtype: str, per_device_batch: int, *, remat: bool = False,
                 hidden: Optional[int] = None, cpu_tuning: Optional[bool] = None,
                 forms: str = "all") -> StepSetup:
  """Builds state/carry/batch as `train.train_and_evaluate` does and AOT-compiles the pmapped step
  (`forms`: the CPU forms it may carry, as `compile_config_step`)."""
  return compile_config_step(recipe_config(model, dtype, hidden=hidden, remat=remat,
                                           per_device_batch=per_device_batch,
                                           cpu_tuning=cpu_tuning), forms=forms)


def compile_config_step(config: ml_collections.ConfigDict, compile: bool = True,  # pylint: disable=redefined-builtin
                        forms: str = "all") -> StepSetup:
  """`compile_step` for any TRM config (e.g. configs/cpu_demo.py's), on a random Sudoku-shaped batch;
  `compile=False`: the state, carry and batch alone (`compiled` None, `memory` empty). `forms`: on
  a CPU target (config.cpu_tuning), the CPU forms the step carries: "all" (a run's), "none" or a
  comma list of cpu_tuning.FORMS (`cpu_tuning.override`)."""
  with cpu_tuning.override(forms):
    return _compile_config_step(config, compile)


def _compile_config_step(config: ml_collections.ConfigDict, compile: bool) -> StepSetup:  # pylint: disable=redefined-builtin
  layout, b = trainer.build(train.TRM(), config)  # the trainer's own step and state
  per_device_batch, n_local = layout.per_device_batch, layout.devices_per_host
  cfg = b.model_config
  state, carry = trainer.init_state(b, config)
  state, carry = parallel.replicate(state), parallel.shard(carry)
  batch = parallel.shard(random_batch(n_local, per_device_batch, config.seed))
  device_index = parallel.shard(parallel.device_indices())
  slices = cpu_tuning.batch_slices(config.batch_slices, cfg, per_device_batch, layout.cpu_tuning)
  forms = cpu_tuning.carried(cfg, bool(b.compiler_options), slices)
  if not compile:
    return StepSetup(cfg=cfg, per_device_batch=per_device_batch,
                     global_batch=per_device_batch * n_local, compiled=None, compile_s=0.0,
                     memory={}, args=(state, carry, batch, device_index), slices=slices,
                     forms=forms)
  p_step = device_step.parallel_train_step(b.train_step, config.nonfinite, seed=config.seed,
                                           rng_step_offset=train.TRM.rng_step_offset)
  t0 = time.perf_counter()
  compiled = p_step.lower(state, carry, batch, device_index).compile(
      compiler_options=dict(b.compiler_options) or None)         # the trainer's XLA options
  compile_s = time.perf_counter() - t0
  return StepSetup(cfg=cfg, per_device_batch=per_device_batch,
                   global_batch=per_device_batch * n_local, compiled=compiled, compile_s=compile_s,
                   memory=_memory(compiled), args=(state, carry, batch, device_index),
                   slices=slices, forms=forms)


def time_steps(setup: StepSetup, steps: int, warmup: int = 0, label: str = "") -> List[float]:
  """Runs warmup + steps optimizer steps (carry and state fed back); returns the timed seconds."""
  state, carry, batch, device_index = setup.args
  setup.args = (None, None, batch, device_index)          # state and carry get donated
  times = []
  for i in range(warmup + steps):
    t0 = time.perf_counter()
    state, carry, sums = setup.compiled(state, carry, batch, device_index)
    jax.block_until_ready((state, carry, sums))
    dt = time.perf_counter() - t0
    kind = "warm-up" if i < warmup else "timed"
    _log(f"  {label} step {i + 1}/{warmup + steps} ({kind}): {dt:.3f} s")
    if i >= warmup:
      times.append(dt)
  del state, carry
  return times

