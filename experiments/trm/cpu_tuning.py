"""TRM on a CPU target: every decision `layout.cpu_tuning` (config.cpu_tuning on a CPU TARGET
platform; never a TPU or GPU compile) makes for TRM, in one place.

  kernels            the model's `TRMConfig.kernels`: "xla_cpu" (modules/kernels/xla_cpu.py decides
                     which forms that is for the forward dtype).
  batch_slices       the training step's automatic count of batch slices (config.batch_slices = 0).
  compiler_options   the XLA options of the training and evaluation steps (split_reduce).
  FORMS / override   the names the tuning tools (make bench, make profile, compare_forms) turn on
                     and off one at a time: xla_cpu.FORMS plus split_reduce and batch_slices.
  carried            what a compiled step carries (the tools print it: forms_text).

The slice budgets below were measured with compare_forms (docs/benchmarks.md, "batch_slices").
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator

import jax.numpy as jnp

from experiments.common import cpu_features
from modules import trm
from modules.kernels import xla_cpu

FORMS = ("fast_grad", "seq_major", "unroll", "head_major", "lean_swiglu", "split_reduce",
         "batch_slices", "nograd_chunks", "pad_contraction", "split_gate_up")
"""The forms a tuning tool's --forms names: the model's (xla_cpu.FORMS), split_reduce (the XLA
option `cpu_features.CPU_DOTS_ONLY` for the steps) and batch_slices (the automatic count below)."""
assert set(FORMS) == set(xla_cpu.FORMS) | {"split_reduce", "batch_slices"}

SLICE_ELEMENTS = 2 ** 21
"""config.batch_slices = 0 (automatic) on a CPU target: each device's batch in the fewest slices
(2, 4, 8, ...: at least 2) whose activations, examples x positions x hidden, are at most this many
elements. Measured on the dev CPU: make run's model (batch 128, 81 x 64) 2 slices of 64 faster than
the whole batch, 4 the same; the recipes (97 x 512) at batch 64 2 slices of 32 faster than 1 or 4;
at batch 256 2, 4 and 8 slices within 1.3% of each other, in 5.81, 2.98 and 1.57 GB of scratch
(TRM-MLP bfloat16). 2 ** 21 picks 2, 2 and 8 there: the speed of the fastest, the memory of the
smallest slices. A bfloat16 forward takes TOKEN_MIX_SLICE_ELEMENTS or
BF16_ATTENTION_SLICE_ELEMENTS instead."""

TOKEN_MIX_SLICE_ELEMENTS = 2 ** 19
"""SLICE_ELEMENTS for a bfloat16 forward with the token mix (mlp_t): 8 examples of the recipe
(97 x 512) per slice, as xla_cpu.NOGRAD_CHUNK_ELEMENTS for the cycles without gradient. The token
mix writes its float32 gate|up, [2F, examples x hidden] (64 MB for 32 examples of the recipe), and
reads it back; smaller slices keep it nearer the cores. Measured on the Intel/AMX CPU: TRM-MLP
bfloat16 5.7% shorter at batch 64 (8 slices against 2) and 7.6% at batch 256 (32 against 8), in a
third of the scratch; TRM-MLP float32 no faster (+0.8%), so it keeps SLICE_ELEMENTS."""

BF16_ATTENTION_SLICE_ELEMENTS = 2 ** 20
"""SLICE_ELEMENTS for a bfloat16 forward with attention: 16 examples of the recipe (97 x 512) per
slice. Measured on the Intel/AMX CPU: TRM-Att bfloat16 6.0% shorter at batch 64 (4 slices against
2, 4 of 4 rounds) and 4.4% at batch 256 (16 against 8, 2 of 2), in 0.53-0.58x the scratch; 8 slices
of 8 at batch 64 were 5.8% slower than 2 in an earlier session. TRM-Att float32 in 4 slices was no
faster (+1.4%, 1 of 3 rounds) and keeps SLICE_ELEMENTS."""


def kernels(cpu_tuning: bool) -> str:
  """TRMConfig.kernels for a target: "xla_cpu" where `layout.cpu_tuning`, else "default"."""
  return "xla_cpu" if cpu_tuning else "default"


def parse_forms(text: str) -> Dict[str, bool]:
  """A tool's --forms ("all", "none" or a comma list of FORMS) -> {form: on} for every form; a
  ValueError naming the unknown ones."""
  text = str(text).strip()
  names = FORMS if text == "all" else tuple(
      n.strip() for n in text.split(",") if n.strip() and n.strip() != "none")
  bad = [n for n in names if n not in FORMS]
  if bad:
    raise ValueError(f"forms={text!r}: unknown form(s) {bad}; use 'all', 'none' or a comma list "
                     f"of {', '.join(FORMS)}")
  return {name: name in names for name in FORMS}


@contextlib.contextmanager
def override(text: str = "all") -> Iterator[None]:
  """Builds and traces within the block carry only the forms `text` names (`parse_forms`), on a CPU
  target; for the tuning tools only (a run always carries all of them)."""
  with xla_cpu.override(**parse_forms(text)):
    yield


def batch_slices(config_slices: int, model_config: trm.TRMConfig, per_device_batch: int,
                 cpu_tuning: bool) -> int:
  """How many slices of each device's batch the training step runs one after another:
  `config_slices` (config.batch_slices) when >= 1 (any target); when 0 (automatic) on a CPU target,
  the smallest power of two >= 2 dividing the per-device batch whose slices hold at most
  SLICE_ELEMENTS activations (examples x total_len x hidden_size; for a bfloat16 forward
  TOKEN_MIX_SLICE_ELEMENTS with the token mix, BF16_ATTENTION_SLICE_ELEMENTS with attention; the
  largest such power when none is that small), else 1 (the whole batch, as the reference)."""
  slices = int(config_slices)
  if slices >= 1:
    return slices
  if not (cpu_tuning and xla_cpu.enabled("batch_slices")) or per_device_batch % 2:
    return 1
  per_example = model_config.total_len * model_config.hidden_size
  budget = SLICE_ELEMENTS
  if model_config.dtype == jnp.bfloat16:
    budget = TOKEN_MIX_SLICE_ELEMENTS if model_config.mlp_t else BF16_ATTENTION_SLICE_ELEMENTS
  slices = 2
  while ((per_device_batch // slices) * per_example > budget
         and per_device_batch % (2 * slices) == 0):
    slices *= 2
  return slices


def compiler_options(cpu_tuning: bool) -> Dict[str, str]:
  """XLA options of the training and evaluation steps: `cpu_features.CPU_DOTS_ONLY` (split_reduce)
  for a CPU target; none otherwise."""
  return dict(cpu_features.CPU_DOTS_ONLY) if cpu_tuning and xla_cpu.enabled("split_reduce") else {}


def carried(model_config: trm.TRMConfig, split_reduce: bool, slices: int) -> Dict[str, Any]:
  """{form: value} of what a compiled step carries (call it where the step was traced: within the
  tool's `override`)."""
  f = model_config.forms
  return {"fast_grad": f.fast_grad, "seq_major": f.seq_major, "unroll": f.unroll,
          "head_major": f.head_major, "lean_swiglu": f.lean_swiglu, "split_reduce": split_reduce,
          "batch_slices": slices, "nograd_chunk_elements": f.nograd_chunk_elements,
          "pad_contraction": f.pad_contraction, "split_gate_up": f.split_gate_up}


def forms_text(carried_forms: Dict[str, Any]) -> str:
  """One line of `carried`'s forms, e.g. "fast_grad True, ..., batch_slices 2, ..."."""
  return ", ".join(f"{name} {value}" for name, value in carried_forms.items())
