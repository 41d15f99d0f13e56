r"""Per-operation profile of TRM's real training step on this machine: where the milliseconds go.

Compiles the trainer's pmapped step (as `bench.compile_step`: the recipe's or `configs/cpu_demo.py`'s
model, AdamATan2, EMA, SignSGD, the non-finite guard), runs warm-up steps, then traces `--steps`
steps with `jax.profiler` (a Perfetto trace; no TensorBoard plugin needed) and joins every timed
operation of the compiled program with its optimized HLO (`compiled.as_text()`).

Table rows group the operations by (result shape, source op); columns, per optimizer step:
  ms           summed duration of the group's executions.
  calls        executions per step.
  GFLOP        matmul FLOPs of the group (2 x output size x contracted size, from the HLO).
  GFLOP/s      GFLOP / ms: the achieved rate; compare with `peak` in the header (a square
               `jnp.dot` of the step's dtype, measured in the same run: the roofline of a matmul
               here).
  at_peak_ms   what the group's matmuls would take at that peak.
  overlap      mean fraction of the group's time during which another operation ran on the other
               thread(s) (XLA's thunk executor runs independent operations concurrently, and two
               operations then share the cores: a high overlap inflates ms).
  shape, op    the HLO result shape and the tail of its JAX op name (e.g.
               `mlp_t/gate_up_proj/transpose` = that projection's backward), with ` (bwd)` when
               the op belongs to the backward pass (`transpose(jvp(...))` in its name): a forward
               op and a backward one of the same name and shape are two rows.
The header gives the wall time per step (first traced op to last), the time with 0, 1 and 2+
operations running, and the summed matmul FLOPs against the peak. Tracing slows the operations
(on the dev CPU the demo step took ~440 ms untraced and 740-950 ms traced, unevenly across
operations): the table says where the time goes, the untraced warm-up steps printed above it say
how fast the step is.

Command lines:

  python -m experiments.trm.tools.profile_step                                  # make run's model
  python -m experiments.trm.tools.profile_step --model=mlp --dtype=float32 --batch=64 --steps=1
  python -m experiments.trm.tools.profile_step --cpu_tuning=false               # without the CPU forms

Flags: --model=demo|mlp|att  --dtype=float32|bfloat16 (recipes; demo is float32)  --batch=0 (0: the
  config's, 64 for the recipes)  --steps=3  --warmup=5  --top=30  --cpu_tuning=true|false
  --hidden=0 (recipes: 0 = 512)  --cpu_forms=all (none, or a comma list of fast_grad,seq_major,unroll,
  head_major,lean_swiglu,split_reduce,batch_slices,nograd_chunks,pad_contraction,split_gate_up)

Functions (tests call them): `parse_trace`, `hlo_index`, `profile_table`, `format_profile`.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import host_malloc  # noqa: E402
from experiments.common import trainer  # noqa: E402
from experiments.trm import train  # noqa: E402
from experiments.trm.configs import cpu_demo  # noqa: E402
from experiments.trm.tools import bench  # noqa: E402

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
  """The operations of a Perfetto trace (`*.trace.json.gz` or a folder holding one), sorted by start."""
  if os.path.isdir(path):
    found = sorted(glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True))
    if not found:
      raise FileNotFoundError(f"no perfetto_trace.json.gz under {path}")
    path = found[-1]
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as fh:
    data = json.load(fh)
  events = data["traceEvents"] if isinstance(data, dict) else data
  ops = [Op(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]), int(e.get("tid", 0)))
         for e in events
         if e.get("ph") == "X" and e.get("dur", 0) > 0 and not e["name"].startswith(_NOT_OPS)]
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


def _busy_profile(ops: Sequence[Op]) -> Dict[int, float]:
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
  busy = _busy_profile(ops)
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


def _setup(args: argparse.Namespace) -> bench.StepSetup:
  tuning = args.cpu_tuning
  if args.model != "demo":
    return bench.compile_step(args.model, args.dtype, args.batch or 64,
                              hidden=args.hidden or None, cpu_tuning=tuning,
                              cpu_forms=args.cpu_forms)
  config = cpu_demo.get_config(f"batch={args.batch}" if args.batch else None)
  config.cpu_tuning = tuning
  config.cpu_forms = args.cpu_forms
  trainer.check_config(train.TRM(), config)
  return bench.compile_config_step(config)


def _run(setup: bench.StepSetup, n: int) -> List[float]:
  state, carry, batch, device_index = setup.args
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    state, carry, sums = setup.compiled(state, carry, batch, device_index)
    jax.block_until_ready((state, carry, sums))
    times.append(time.perf_counter() - t0)
  setup.args = (state, carry, batch, device_index)
  return times


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m experiments.trm.tools.profile_step",
                               description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="demo", choices=["demo", "mlp", "att"])
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--batch", type=int, default=0)
  ap.add_argument("--hidden", type=int, default=0)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--warmup", type=int, default=5)
  ap.add_argument("--top", type=int, default=30)
  ap.add_argument("--cpu_tuning", default="true", choices=["true", "false"])
  ap.add_argument("--cpu_forms", default="all",
                  help=f"all, none or a comma list of {','.join(train.CPU_FORMS)} (config.cpu_forms)")
  args = ap.parse_args(argv)
  args.cpu_tuning = args.cpu_tuning == "true"
  if args.model == "demo" and args.dtype != "float32":
    ap.error(f"--dtype={args.dtype} with --model=demo: the demo config is float32; "
             "use --model=mlp or --model=att for bfloat16")
  if args.steps < 1:
    ap.error(f"--steps={args.steps}: trace at least one step")
  return args


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  args = parse_args(argv)
  if args.cpu_tuning:
    host_malloc.keep_heap()   # as the trainer does on a CPU target; before the backend's threads
  setup = _setup(args)
  print(f"model {args.model}, {setup.cfg.forward_dtype}, global batch {setup.global_batch}, "
        f"cpu_tuning {args.cpu_tuning} ({setup.forms_text()}); compiled in {setup.compile_s:.1f} s",
        flush=True)
  index = hlo_index(setup.compiled.as_text())
  warm = _run(setup, args.warmup)
  with tempfile.TemporaryDirectory(prefix="podlab_profile_") as tmp:
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0         # Python frames are not wanted and slow the step
    jax.profiler.start_trace(tmp, create_perfetto_trace=True, profiler_options=options)
    timed = _run(setup, args.steps)
    jax.profiler.stop_trace()
    ops = parse_trace(tmp)
  peak = bench.matmul_peak_flops(setup.cfg.forward_dtype) / 1e9
  rows, totals = profile_table(ops, index, args.steps)
  print(f"step wall time: warm-up {', '.join(f'{t * 1e3:.0f}' for t in warm)} ms; traced median "
        f"{statistics.median(timed) * 1e3:.0f} ms (tracing slows every operation: read the table for "
        f"proportions and the untraced warm-up steps for speed)")
  print(format_profile(rows, totals, peak, args.top))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
