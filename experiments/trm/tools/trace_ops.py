"""The host's operations of a jax.profiler trace, joined with the compiled HLO: the per-op table.

Reads the chrome-trace JSON `jax.profiler` writes (`plugins/profile/<run>/<host>.trace.json.gz`, or
`perfetto_trace.json.gz`; no TensorBoard plugin needed), keeps the timed operations of the compiled
program (XLA:CPU's thunks on the host threads), joins each with its optimized HLO instruction
(`hlo_index` of `compiled.as_text()`: result shape, JAX source op, matmul FLOPs) and groups them per
optimizer step into the table experiments/trm/tools/profile_step.py prints on a CPU (its docstring
explains the columns). The device's kernels of the same trace:
experiments/trm/tools/trace_kernels.py.

Synopsis:

  from experiments.trm.tools import trace_ops

  ops = [trace_ops.Op("dot.1", 0.0, 40.0, 1), trace_ops.Op("fusion.2", 10.0, 30.0, 2)]
  rows, totals = trace_ops.profile_table(ops, {}, steps=1)
  print(trace_ops.format_profile(rows, totals, peak_gflop_s=100.0))
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import math
import os
import re
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple


def trace_file(path: str) -> str:
  """`path`, or the newest `*.trace.json.gz` (else `perfetto_trace.json.gz`) under a jax.profiler
  folder (`<dir>/plugins/profile/<run>/<host>.trace.json.gz`)."""
  if not os.path.isdir(path):
    return path
  for pattern in ("*.trace.json.gz", "perfetto_trace.json.gz"):
    found = sorted(glob.glob(os.path.join(path, "**", pattern), recursive=True),
                   key=os.path.getmtime)
    if found:
      return found[-1]
  raise FileNotFoundError(f"no *.trace.json.gz or perfetto_trace.json.gz under {path}")


def read_events(path: str) -> List[Dict[str, Any]]:
  """The events of a chrome-trace JSON file (`trace_file(path)`), gzipped or not."""
  path = trace_file(path)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as fh:
    data = json.load(fh)
  return data["traceEvents"] if isinstance(data, dict) else data


# Runtime bookkeeping events of the trace, not operations of the program.
_NOT_OPS = ("ThunkExecutor", "$", "PjitFunction", "SlinkyThreadPool", "Thunk", "end:",
            "CommonPjRt", "while", "conditional", "call")


class Op(NamedTuple):
  """One execution of a compiled operation: start and end in microseconds, thread id."""
  name: str
  start: float
  end: float
  tid: int


def parse_trace(path: str) -> List[Op]:
  """The host's operations of a jax.profiler trace (`*.trace.json.gz`, `perfetto_trace.json.gz` or
  a folder holding one), sorted by start: XLA:CPU's thunks (a GPU's kernels: `parse_device_trace`)."""
  events = read_events(path)
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and e.get("args", {}).get("name", "").startswith("/device:")}
  ops = [Op(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]), int(e.get("tid", 0)))
         for e in events
         if e.get("ph") == "X" and e.get("dur", 0) > 0 and e.get("pid") not in devices
         and not e["name"].startswith(_NOT_OPS)]
  return sorted(ops, key=lambda o: o.start)


_SHAPE = re.compile(r"^\w+\[([\d,]*)\]")


def _dims(shape: str) -> List[int]:
  m = _SHAPE.match(shape or "")
  return [int(d) for d in m.group(1).split(",") if d] if m else []


class HloOp(NamedTuple):
  shape: str          # result shape, e.g. "f32[81,8192]"
  source: str         # the tail of the JAX op name
  flops: float        # matmul FLOPs of one execution


def hlo_index(hlo_text: str) -> Dict[str, HloOp]:
  """Instruction name -> (result shape, source op tail, matmul FLOPs incl. fused computations)."""
  shapes: Dict[str, str] = {}
  for m in re.finditer(r"%([\w.\-]+) = (\w+\[[\d,]*\])", hlo_text):
    shapes[m.group(1)] = m.group(2)
  for m in re.finditer(r"([\w.\-]+): (\w+\[[\d,]*\])", hlo_text):     # computation parameters
    shapes.setdefault(m.group(1), m.group(2))
  bodies: Dict[str, str] = {}
  for m in re.finditer(r"^(?:ENTRY )?%?([\w.\-]+) \([^\n]*\{\n(.*?)\n\}", hlo_text, re.M | re.S):
    bodies[m.group(1)] = m.group(2)

  def dot_flops(text: str) -> float:
    total = 0.0
    for d in re.finditer(r"= (\w+\[[\d,]*\])\S* dot\(%([\w.\-]+), %([\w.\-]+)\), "
                         r"(?:lhs_batch_dims=\{[\d,]*\}, )?lhs_contracting_dims=\{([\d,]*)\}", text):
      lhs = _dims(shapes.get(d.group(2), ""))
      contracted = math.prod(lhs[int(i)] for i in d.group(4).split(",") if i) if lhs else 0
      total += 2.0 * math.prod(_dims(d.group(1))) * contracted
    return total

  # Instructions inside a fusion's computation run as part of that fusion, never on their own.
  fused = set(re.findall(r"\bfusion\([^\n]*?calls=%([\w.\-]+)", hlo_text))
  executed = "\n".join(body for name, body in bodies.items() if name not in fused)
  index: Dict[str, HloOp] = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+\[[\d,]*\])\S* (\w[\w\-]*)\((.*)$",
                       executed, re.M):
    name, shape, opcode, rest = m.groups()
    calls = re.search(r"calls=%([\w.\-]+)", rest)
    src = re.search(r'op_name="([^"]*)"', rest)
    flops = dot_flops(bodies.get(calls.group(1), "")) if calls else 0.0
    if opcode == "dot":
      flops = dot_flops(m.group(0))
    source = "/".join(src.group(1).split("/")[-3:]) if src else opcode
    if src and "transpose(jvp(" in src.group(1):
      source += " (bwd)"                      # part of the backward pass (autodiff's or a custom_vjp's)
    index[name] = HloOp(shape, source, flops)
  return index


def busy_profile(ops: Sequence[Op]) -> Dict[int, float]:
  """Microseconds during which 0, 1, 2+ operations ran, over the traced span."""
  points = sorted([(o.start, 1) for o in ops] + [(o.end, -1) for o in ops])
  busy: Dict[int, float] = collections.Counter()
  running, last = 0, None
  for t, delta in points:
    if last is not None:
      busy[min(running, 2)] += t - last
    running += delta
    last = t
  return busy


def profile_table(ops: Sequence[Op], index: Dict[str, HloOp], steps: int) -> Tuple[List[Dict[str, Any]], Dict[str, float]]:
  """Rows grouped by (shape, source), per step, sorted by ms; and the header's totals."""
  groups: Dict[Tuple[str, str], Dict[str, float]] = {}
  ends = [o.end for o in ops]
  reach = []                        # reach[j]: the latest end among ops[0..j] (ops sorted by start)
  for e in ends:
    reach.append(max(e, reach[-1]) if reach else e)
  for i, o in enumerate(ops):
    h = index.get(o.name, HloOp("?", re.sub(r"\.\d+$", "", o.name), 0.0))
    g = groups.setdefault((h.shape, h.source), {"us": 0.0, "calls": 0, "flops": 0.0, "ov": 0.0})
    dur = o.end - o.start
    shared = 0.0
    first = i                       # the earliest op that can still be running when o starts
    while first > 0 and reach[first - 1] > o.start:
      first -= 1
    for p in ops[first:]:
      if p.start >= o.end:
        break
      if p is not o and p.tid != o.tid and p.end > o.start:
        shared += min(o.end, p.end) - max(o.start, p.start)
    g["us"] += dur
    g["calls"] += 1
    g["flops"] += h.flops
    g["ov"] += min(shared, dur)
  rows = []
  for (shape, source), g in groups.items():
    ms = g["us"] / 1e3 / steps
    gflop = g["flops"] / 1e9 / steps
    rows.append({"ms": ms, "calls": g["calls"] / steps, "GFLOP": gflop,
                 "GFLOP_s": gflop / ms * 1e3 if ms and gflop else 0.0,
                 "overlap": g["ov"] / g["us"] if g["us"] else 0.0, "shape": shape, "op": source})
  rows.sort(key=lambda r: -r["ms"])
  busy = busy_profile(ops)
  span = (max(ends) - ops[0].start) if ops else 0.0
  totals = {"wall_ms": span / 1e3 / steps, "idle_ms": busy.get(0, 0.0) / 1e3 / steps,
            "one_ms": busy.get(1, 0.0) / 1e3 / steps, "two_ms": busy.get(2, 0.0) / 1e3 / steps,
            "op_ms": sum(r["ms"] for r in rows), "GFLOP": sum(r["GFLOP"] for r in rows)}
  return rows, totals


def format_profile(rows: Sequence[Dict[str, Any]], totals: Dict[str, float], peak_gflop_s: float,
                   top: int = 30) -> str:
  at_peak = totals["GFLOP"] / peak_gflop_s * 1e3 if peak_gflop_s else float("nan")
  lines = [
      f"per step: wall {totals['wall_ms']:.1f} ms (idle {totals['idle_ms']:.1f}, one op "
      f"{totals['one_ms']:.1f}, two or more {totals['two_ms']:.1f}); summed op time "
      f"{totals['op_ms']:.1f} ms",
      f"matmuls: {totals['GFLOP']:.2f} GFLOP per step = {totals['GFLOP'] / totals['wall_ms'] * 1e3:.0f} "
      f"GFLOP/s over the wall time; peak (square jnp.dot, this run) {peak_gflop_s:.0f} GFLOP/s -> "
      f"{at_peak:.1f} ms at peak",
      "",
      f"{'ms':>8} {'calls':>6} {'GFLOP':>7} {'GFLOP/s':>8} {'at_peak_ms':>10} {'overlap':>7}  "
      f"{'shape':24} op"]
  for r in rows[:top]:
    ap = r["GFLOP"] / peak_gflop_s * 1e3 if peak_gflop_s and r["GFLOP"] else 0.0
    lines.append(f"{r['ms']:8.1f} {r['calls']:6.0f} {r['GFLOP']:7.2f} {r['GFLOP_s']:8.0f} "
                 f"{ap:10.1f} {r['overlap']:7.2f}  {r['shape'][:24]:24} {r['op']}")
  rest = rows[top:]
  if rest:
    lines.append(f"{sum(r['ms'] for r in rest):8.1f} {'':>6} {sum(r['GFLOP'] for r in rest):7.2f}"
                 f" {'':>8} {'':>10} {'':>7}  ({len(rest)} more groups)")
  return "\n".join(lines)
