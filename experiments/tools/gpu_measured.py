"""Step times measured on a real GPU, shown by `make tpu-check` beside the TPU bound of the same program.

The TPU rows of `make tpu-check` are the compiler's bounds; a step measured on a real accelerator
says how far a bound is from a chip. Each entry names the device, the commit, where the command and
method are written down, and the `tpu_check` row of the same program (the same model, precision and
global batch); `tpu_check` prints `cell(m)` in its "measured GPU" column.

Synopsis:

  from experiments.tools import gpu_measured
  m = gpu_measured.for_row("trm v4_64 sudoku_mlp: train_step")
  gpu_measured.cell(m)           # "H200 380.2 ms = 2,020 examples/s (<commit>)"
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One measured step.

  Fields:
    row: the `tpu_check` row name of the same program (model, precision and global batch).
    device: the GPU, e.g. "H200".
    ms_per_step: the median step time.
    items_per_step: examples (tokens) per step: the global batch.
    item_name: "examples" or "tokens".
    commit: the podlab commit measured.
    source: where the figure and its method are written down.
  """
  row: str
  device: str
  ms_per_step: float
  items_per_step: int
  item_name: str
  commit: str
  source: str

  @property
  def items_per_s(self) -> float:
    return self.items_per_step / (self.ms_per_step / 1e3)


MEASURED: Tuple[Measurement, ...] = (
    # One NVIDIA H200, JAX 0.11.2 with CUDA, bf16, batch 768 (the Sudoku recipe's global
    # batch on one device), median of 10 steps after 3 warm-up, podlab's whole training step.
    Measurement("trm v4_64 sudoku_mlp: train_step", "H200", 380.2, 768, "examples", "02b0496",
                'docs/benchmarks.md, "On a GPU"'),
    Measurement("trm v4_64 sudoku_att: train_step", "H200", 333.2, 768, "examples", "02b0496",
                'docs/benchmarks.md, "On a GPU"'),
)


def for_row(row: str) -> Optional[Measurement]:
  """The measurement of the program of `tpu_check` row `row` (its name, label included), or None."""
  for m in MEASURED:
    if m.row == row:
      return m
  return None


def cell(m: Optional[Measurement]) -> str:
  """The "measured GPU" cell: device, ms per step, items/s and commit; "-" without a measurement."""
  if m is None:
    return "-"
  return f"{m.device} {m.ms_per_step:g} ms = {m.items_per_s:,.0f} {m.item_name}/s ({m.commit})"
