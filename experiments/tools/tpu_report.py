"""The TPU compiler's view of one program on one slice (`Report`), its fit verdicts, the table.

A `Report` (from `tpu_compile.compile_report`) holds per device and per step the compiler's memory
assignment and cost analysis, loop-aware when counted (experiments/tools/tpu_cost.py), and derives
the margin, the compute and memory bounds, the speed and MFU at the bound. Every number is a
COMPILER ESTIMATE, not a measurement (docs/tpu.md says what each one means).

- `fits(report)`, `does_not_fit_message(report)`, `margin_text(report)`; `DoesNotFitError`.
- `format_report([...])`: one table, the targets above it and the caveats below;
  `report_row(report)`: one row's cells under `TABLE_HEADER`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from experiments.tools import tpu_cost
from experiments.tools import tpu_target

GIB = tpu_target.GIB


class DoesNotFitError(tpu_target.TpuError):
  """A program needs more HBM per device than the target's chip has; `.report` has the numbers."""

  def __init__(self, report: "Report"):
    self.report = report
    super().__init__(does_not_fit_message(report))


TIGHT_MARGIN = 0.05
"""A fitting program whose compiler peak leaves less than this share of usable HBM free is
"tight"."""


@dataclasses.dataclass
class Report:
  """The TPU compiler's view of one program on one target, per device and per step.

  Filled by `tpu_compile.compile_report`. Byte and FLOP fields are None when the program did not
  compile (it ran out of HBM: then `oom_need_bytes` is what the compiler said it needs, when it
  said). `loop_*` are the loop-aware counts (`tpu_cost.loop_aware_cost`), None when not computed.
  """
  name: str
  target: tpu_target.Target
  libtpu_version: str
  compiled: bool
  compile_s: Optional[float] = None
  argument_bytes: Optional[int] = None
  output_bytes: Optional[int] = None
  alias_bytes: Optional[int] = None
  temp_bytes: Optional[int] = None
  peak_bytes: Optional[int] = None
  oom_need_bytes: Optional[int] = None
  compiler_message: Optional[str] = None
  compiler_flops: Optional[float] = None
  compiler_bytes_accessed: Optional[float] = None
  cost_model_raw_s: Optional[float] = None
  while_loops: int = 0
  analytic_flops: Optional[float] = None
  items_per_step: Optional[float] = None
  item_name: str = "examples"
  layout_constraints: Optional[bool] = None
  loop_flops: Optional[float] = None
  loop_bytes: Optional[float] = None
  loop_cost_model_s: Optional[float] = None
  loops: Tuple[tpu_cost.Loop, ...] = ()
  loop_note: Optional[str] = None
  breakdown: Any = None            # hlo_bytes.Breakdown of the optimized HLO (compile_report's)

  @property
  def sum_bytes(self) -> Optional[int]:
    """arguments + outputs - aliased (donated) + temporaries: buffers that need not be live at once,
    so more than the compiler's peak on TPU (shown for reference, not the fit verdict)."""
    if not self.compiled:
      return None
    return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

  @property
  def need_bytes(self) -> Optional[int]:
    """HBM per device the program needs: the compiler's peak (`peak_memory_in_bytes`; the sum above
    where the compiler gives no peak); for a program that did not compile, the compiler's figure."""
    if not self.compiled:
      return self.oom_need_bytes
    return self.peak_bytes if self.peak_bytes else self.sum_bytes

  @property
  def fits(self) -> bool:
    """The compiler's verdict: a program it compiled fits (it assigns every buffer to HBM, or
    refuses with RESOURCE_EXHAUSTED)."""
    return self.compiled

  @property
  def margin_bytes(self) -> Optional[float]:
    """Usable HBM per device minus the compiler's peak (negative: over the published capacity)."""
    need = self.need_bytes
    return None if not self.compiled or need is None else (
        self.target.usable_hbm_bytes_per_device - need)

  @property
  def margin(self) -> Optional[float]:
    """`margin_bytes` as a share of the usable HBM."""
    m = self.margin_bytes
    return None if m is None else m / self.target.usable_hbm_bytes_per_device

  @property
  def tight(self) -> bool:
    """It fits with less than TIGHT_MARGIN (5%) of the usable HBM to spare."""
    return self.fits and self.margin is not None and self.margin < TIGHT_MARGIN

  @property
  def cost_model_s(self) -> Optional[float]:
    """The cost model's step time (`optimal_seconds`, loop-aware when the loops were counted); None
    unless a positive finite number, or when the program has loops that were not counted."""
    if self.while_loops and self.loop_flops is None:
      return None
    t = self.loop_cost_model_s if self.loop_flops is not None else self.cost_model_raw_s
    return t if t is not None and math.isfinite(t) and t > 0 else None

  @property
  def loop_aware(self) -> bool:
    """The FLOP and byte counts cover every loop trip (no loops, or each loop counted)."""
    return self.compiled and (self.while_loops == 0 or self.loop_flops is not None)

  @property
  def total_flops(self) -> Optional[float]:
    """The compiler's FLOPs per device per step, loop-aware when counted."""
    return self.loop_flops if self.loop_flops is not None else self.compiler_flops

  @property
  def bytes_accessed(self) -> Optional[float]:
    """The compiler's bytes accessed per device per step, loop-aware when counted."""
    return self.loop_bytes if self.loop_bytes is not None else self.compiler_bytes_accessed

  @property
  def flops(self) -> Optional[float]:
    """Model FLOPs per device per step, for MFU: the analytic count when given, else the
    compiler's (loop-aware when counted)."""
    return self.analytic_flops if self.analytic_flops is not None else self.total_flops

  @property
  def flops_source(self) -> str:
    return "analytic" if self.analytic_flops is not None else "compiler"

  @property
  def compute_bound_s(self) -> Optional[float]:
    """The larger of the analytic and the compiler's FLOPs / the device's peak: no step is faster.
    None for a program that did not compile."""
    if not self.compiled:
      return None
    counts = [f for f in (self.analytic_flops, self.total_flops) if f is not None]
    return max(counts) / self.target.peak_flops_per_device if counts else None

  @property
  def memory_bound_s(self) -> Optional[float]:
    """The compiler's bytes accessed / the device's HBM bandwidth."""
    b = self.bytes_accessed
    return None if b is None else b / self.target.hbm_bytes_per_s_per_device

  @property
  def bound_s(self) -> Optional[float]:
    """max(compute bound, memory bound): a lower bound on the step time (a compiler estimate)."""
    bounds = [t for t in (self.compute_bound_s, self.memory_bound_s) if t is not None]
    return max(bounds) if bounds else None

  @property
  def bound_kind(self) -> Optional[str]:
    """"compute" or "memory": which bound is the larger."""
    if self.bound_s is None:
      return None
    return "memory" if self.memory_bound_s == self.bound_s else "compute"

  @property
  def items_per_s(self) -> Optional[float]:
    """Items of the global batch per second at the bound: an upper bound on the speed."""
    if self.items_per_step is None or not self.bound_s:
      return None
    return self.items_per_step / self.bound_s

  @property
  def mfu(self) -> Optional[float]:
    """Model FLOPs / (bound x peak): an upper bound on the model FLOP utilisation."""
    if self.flops is None or not self.bound_s:
      return None
    return self.flops / (self.bound_s * self.target.peak_flops_per_device)

  def chip_hours(self, steps: int) -> Optional[float]:
    """Chip-hours of `steps` steps at the bound (a lower bound)."""
    return None if self.bound_s is None else steps * self.bound_s * self.target.chips / 3600


def fits(report: Report) -> bool:
  """True when the TPU compiler accepted the program (its memory assignment fits the device)."""
  return report.fits


def does_not_fit_message(report: Report) -> str:
  """One line naming the program, target, chip, its capacity and the need."""
  t = report.target
  need = report.need_bytes
  need_text = "more than it has" if need is None else f"{need / GIB:.2f} GiB"
  return (f"{report.name} does not fit on {t.name}: it needs {need_text} of HBM per "
          f"{t.chip.device_kind} {t.device_noun}, which has {t.hbm_bytes_per_device / GIB:g} GiB "
          f"({t.usable_hbm_bytes_per_device / GIB:.2f} GiB usable)")


def margin_text(report: Report) -> str:
  """E.g. "7.35 of 7.48 GiB per TensorCore, margin 132 MiB (1.7%): tight"."""
  t = report.target
  need = report.need_bytes
  if not report.compiled:
    return f">={_gib(need)} of {t.usable_hbm_bytes_per_device / GIB:.2f} GiB: does not fit"
  m = report.margin_bytes
  size = f"{m / GIB:.2f} GiB" if abs(m) >= GIB else f"{m / 2 ** 20:.0f} MiB"
  return (f"{need / GIB:.2f} of {t.usable_hbm_bytes_per_device / GIB:.2f} GiB per "
          f"{t.device_noun}, margin {size} ({100 * report.margin:.1f}%)"
          f"{': tight' if report.tight else ''}")


# --------------------------------------------------------------------------------------------------
# The table.


def _gib(x: Optional[float]) -> str:
  return "-" if x is None else f"{x / GIB:.2f}"


def _time(t: Optional[float]) -> str:
  if t is None:
    return "-"
  return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _count(x: float) -> str:
  return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


BOUND_HEADER = "bound (compiler estimate)"
TABLE_HEADER = ["program", "target", "args GiB", "out", "donated", "temp", "peak", "usable",
                "fits (margin)", "compile", "TFLOP compiler", "TFLOP analytic", "GB accessed",
                "compute bound", "memory bound", BOUND_HEADER, "speed at the bound", "MFU"]


def report_row(r: Report) -> List[str]:
  """The cells of `r`'s row under TABLE_HEADER."""
  usable = r.target.usable_hbm_bytes_per_device
  if r.compiled:
    fit = f"{'tight' if r.tight else 'yes'} {100 * r.margin:.1f}%"
    peak = _gib(r.need_bytes)
  else:
    fit = "NO"
    peak = f">={_gib(r.need_bytes)}" if r.need_bytes is not None else "?"
  mark = "" if r.loop_aware or not r.compiled else "*"
  if r.loop_note:
    mark = "~"
  tflops = "-" if r.total_flops is None else f"{r.total_flops / 1e12:.4g}{mark}"
  aflops = "-" if r.analytic_flops is None else f"{r.analytic_flops / 1e12:.4g}"
  gb = "-" if r.bytes_accessed is None else f"{r.bytes_accessed / 1e9:.4g}{mark}"
  bound = "-" if r.bound_s is None else f"{_time(r.bound_s)} {r.bound_kind}{mark}"
  items = "-" if r.items_per_s is None else f"<={_count(r.items_per_s)} {r.item_name}/s"
  mfu = "-" if r.mfu is None else f"<={100 * r.mfu:.0f}%"
  return [r.name, r.target.name, _gib(r.argument_bytes), _gib(r.output_bytes),
          _gib(r.alias_bytes), _gib(r.temp_bytes), peak, f"{usable / GIB:.2f}", fit,
          "-" if r.compile_s is None else f"{r.compile_s:.1f} s", tflops, aflops, gb,
          _time(r.compute_bound_s), _time(r.memory_bound_s), bound, items, mfu]


def format_report(reports: Sequence[Report], extra: Optional[Dict[str, Sequence[str]]] = None
                  ) -> str:
  """One table, one row per program, with the targets above it and the caveats below. `extra`:
  more columns, {header: one cell per report}."""
  if not reports:
    return "no programs compiled"
  versions = sorted({r.libtpu_version for r in reports})
  lines = [f"TPU compile with libtpu {', '.join(versions)}: COMPILER ESTIMATES (the TPU compiler's "
           f"memory assignment and cost analysis), not measurements. Per device, per step."]
  seen = []
  for r in reports:
    if r.target.name not in seen:
      seen.append(r.target.name)
      lines.append("  " + r.target.describe())
  header = TABLE_HEADER + list(extra or {})
  rows = [header]
  notes: List[str] = []
  for k, r in enumerate(reports):
    rows.append(report_row(r) + [str(cells[k]) for cells in (extra or {}).values()])
    if not r.compiled:
      notes.append(f"{r.name}: {does_not_fit_message(r)}. Compiler: {r.compiler_message}")
    elif r.tight:
      notes.append(f"{r.name}: fits with a thin margin: {margin_text(r)}")
    if r.loop_note:
      notes.append(f"{r.name} (~): {r.loop_note}")
    if r.layout_constraints:
      notes.append(f"{r.name}: the program pins array layouts (LayoutConstraint custom calls), "
                   "e.g. a CPU-only matmul path: switch it off for a TPU target")
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  for k, row in enumerate(rows):
    lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    if k == 0:
      lines.append("  ".join("-" * w for w in widths))
  lines.append(
      "peak: the compiler's peak HBM per device; fits: the compiler accepted the program (margin = "
      f"usable - peak; 'tight' under {100 * TIGHT_MARGIN:.0f}%). Bounds: compute = FLOPs (the "
      "larger of the analytic and the compiler's count) / peak FLOP/s, memory = bytes accessed / "
      "HBM bandwidth; the bound is the larger, a LOWER bound on the step time, so speed and MFU "
      "are upper bounds. Loops are counted trip by trip (each loop body compiled once). Neither "
      "bound counts the host input pipeline or the collectives' ICI time.")
  if any(not r.loop_aware and r.compiled for r in reports):
    lines.append("*: the program has while loops that were not counted trip by trip; the compiler "
                 "counts each loop body once, so these FLOPs, bytes and bounds are undercounts.")
  lines.extend(notes)
  return "\n".join(lines)
