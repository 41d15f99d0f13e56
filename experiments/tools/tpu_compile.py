"""Compile a program for a Cloud TPU slice on a CPU-only machine; read the compiler's estimates.

A step lowered over all of a slice's devices (`tpu_target.lower_step`) compiles with the compiler
the pod runs; the compiled program's `memory_analysis()` / `cost_analysis()` give per-device HBM
and the compiler's FLOP, byte and time estimates, gathered into a `tpu_report.Report`. Every number
is a compiler estimate, not a measurement (docs/tpu.md says what each one means).

- `compile_report(lowered, target=...)` -> `tpu_report.Report` (loops counted with `jaxpr`:
  tpu_cost.py); an out-of-memory compile is a Report that does not fit, any other refusal a
  `CompileError`.
- `parse_oom(message)`: the need and the capacity from the compiler's RESOURCE_EXHAUSTED message.
- `hlo_has_layout_constraints(lowered)`: whether a CPU-only layout constraint is in a program.

Synopsis (on a CPU, with libtpu installed):

  import jax, jax.numpy as jnp
  from experiments.common import parallel
  from experiments.tools import tpu_compile, tpu_report, tpu_target

  target = tpu_target.parse_target("v5litepod-4")     # 4 TPU v5e chips on 1 host
  B, D = 256, 1024
  def step(w, x):                                     # w replicated [D, D], x per device [B, D]
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * jax.lax.pmean(g, parallel.AXIS)
  lowered = tpu_target.lower_step(step, target, (jax.ShapeDtypeStruct((D, D), jnp.float32),
                                                 jax.ShapeDtypeStruct((B, D), jnp.float32)),
                                  state_in=(0,), out_axes=None)
  report = tpu_compile.compile_report(lowered, target=target, name="mlp step",
                                      analytic_flops_per_device=4 * B * D * D,  # fwd + weight grad
                                      items_per_step=B * target.num_devices)
  print(tpu_report.format_report([report]))
  assert tpu_report.fits(report), tpu_report.does_not_fit_message(report)
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any, Optional, Tuple

import jax

from experiments.tools import tpu_cost
from experiments.tools import tpu_report
from experiments.tools import tpu_target


class CompileError(tpu_target.TpuError):
  """The TPU compiler refused a program for a reason other than running out of HBM."""


_LAYOUT_CONSTRAINT = re.compile(
    r'custom_call\s*@LayoutConstraint|custom_call_target\s*=\s*"LayoutConstraint"')


def hlo_has_layout_constraints(program: Any) -> bool:
  """True when the program pins an array's memory layout (`jax.experimental.layout.
  with_layout_constraint`, e.g. the CPU-only weight-gradient trick of
  `modules.kernels.xla_cpu.matmul`, which only a CPU target may carry).

  `program`: a `jax.stages.Lowered` (its StableHLO has `stablehlo.custom_call @LayoutConstraint`),
  or HLO / StableHLO text (`custom_call_target="LayoutConstraint"` in HLO). A `jax.stages.Compiled`
  is refused: the compiler consumes the constraint, and its optimized HLO keeps no trace of it.
  """
  if isinstance(program, str):
    text = program
  elif isinstance(program, jax.stages.Lowered):
    text = program.as_text()
  elif isinstance(program, jax.stages.Compiled):
    raise TypeError("hlo_has_layout_constraints needs the jax.stages.Lowered (or its text): the "
                    "compiler consumes layout constraints, so a Compiled program has none left")
  else:
    raise TypeError(f"expected a jax.stages.Lowered or HLO text, got {type(program).__name__}")
  return bool(_LAYOUT_CONSTRAINT.search(text))


_UNITS = {"": 1, "B": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40, "P": 2 ** 50}
_SIZE = r"([0-9.]+)\s*([KMGTP]?)(?:i?B)?"


def _parse_size(number: str, unit: str) -> int:
  return int(float(number) * _UNITS[unit])


def parse_oom(message: str) -> Tuple[Optional[int], Optional[int]]:
  """(bytes needed, bytes available) per device from the TPU compiler's RESOURCE_EXHAUSTED message,
  e.g. "... the total memory required for HLO temporaries (42.00G) exceeds available HBM (15.75G)."
  (binary units); (None, None) when the message has another form."""
  m = re.search(rf"required[^(]*\({_SIZE}\)\s*exceeds available HBM\s*\({_SIZE}\)", message)
  if m:
    return _parse_size(m.group(1), m.group(2)), _parse_size(m.group(3), m.group(4))
  m = re.search(rf"Used {_SIZE} of {_SIZE} hbm", message)
  if m:
    return _parse_size(m.group(1), m.group(2)), _parse_size(m.group(3), m.group(4))
  return None, None


def compile_report(program: Any, *, target: tpu_target.Target, name: str = "program",
                   analytic_flops_per_device: Optional[float] = None,
                   items_per_step: Optional[float] = None, item_name: str = "examples",
                   compile_s: Optional[float] = None, jaxpr: Any = None,
                   breakdown: bool = False) -> tpu_report.Report:
  """Compiles a program for `target` (or reads an already compiled one) into a `tpu_report.Report`.

  Args:
    program: a `jax.stages.Lowered` for the target's devices (compiled and timed here), or its
      `jax.stages.Compiled` (then pass `compile_s` if known).
    target: the slice the program was lowered for.
    name: the program's row name in `tpu_report.format_report`.
    analytic_flops_per_device: the model's FLOPs per device per step, counted by hand (for MFU, and
      the compute bound when larger than the compiler's count).
    items_per_step: examples (or tokens...) of the GLOBAL batch per step, for items/s at the bound.
    item_name: what an item is ("examples", "tokens").
    compile_s: compile time of an already compiled program.
    jaxpr: the program's `tpu_cost.per_device_jaxpr`: its loops are counted trip by trip
      (`tpu_cost.loop_aware_cost`); without it a program with loops keeps the compiler's one-trip
      counts, marked `*` in the table.
    breakdown: also split the bytes per operation of the optimized HLO (`report.breakdown`,
      experiments/tools/hlo_bytes.py).

  A program that runs out of HBM gives a Report with `compiled=False` (and `fits` False); any other
  compiler refusal raises `CompileError` with the compiler's first line.
  """
  version = tpu_target.load_libtpu()
  common = dict(name=name, target=target, libtpu_version=version,
                analytic_flops=analytic_flops_per_device, items_per_step=items_per_step,
                item_name=item_name)
  if isinstance(program, jax.stages.Lowered):
    layout = hlo_has_layout_constraints(program)
    t0 = time.perf_counter()
    try:
      # libtpu prints an out-of-memory compile's whole buffer listing to stderr; the Report keeps
      # the compiler's message (PODLAB_VERBOSE=1 shows the listing).
      with (contextlib.nullcontext() if os.environ.get("PODLAB_VERBOSE", "") not in ("", "0")
            else tpu_target.native_output_captured()):
        compiled = program.compile()
    except jax.errors.JaxRuntimeError as e:
      message = str(e)
      if "RESOURCE_EXHAUSTED" not in message:
        raise CompileError(f"{name}: the TPU compiler (libtpu {version}) refused it for "
                           f"{target.name}: {tpu_target.first_line(message)}") from e
      need, _ = parse_oom(message)
      return tpu_report.Report(compiled=False, compile_s=time.perf_counter() - t0,
                               oom_need_bytes=need, compiler_message=tpu_target.first_line(message),
                               layout_constraints=layout, **common)
    compile_s = time.perf_counter() - t0
  elif isinstance(program, jax.stages.Compiled):
    compiled, layout = program, None
  else:
    raise TypeError(f"compile_report needs a jax.stages.Lowered or Compiled, got "
                    f"{type(program).__name__}")
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):            # older JAX: one dict per program
    cost = cost[0] if cost else {}
  cost = cost or {}
  text = compiled.as_text()
  report = tpu_report.Report(
      compiled=True, compile_s=compile_s,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      peak_bytes=int(getattr(mem, "peak_memory_in_bytes", 0) or 0),
      compiler_flops=cost.get("flops"), compiler_bytes_accessed=cost.get("bytes accessed"),
      cost_model_raw_s=cost.get("optimal_seconds"),
      while_loops=tpu_cost.count_while_loops(text), layout_constraints=layout, **common)
  if breakdown:
    # Loaded on use: a dry run never reads HLO text operation by operation.
    from experiments.tools import hlo_bytes  # pylint: disable=g-import-not-at-top
    report.breakdown = hlo_bytes.breakdown(text)
  if jaxpr is not None:
    counted = tpu_cost.loop_aware_cost(jaxpr, compiled, target)
    report.loop_flops, report.loop_bytes = counted.cost.flops, counted.cost.bytes
    report.loop_cost_model_s, report.loops = counted.cost.seconds, counted.loops
    report.loop_note = counted.note
  return report
