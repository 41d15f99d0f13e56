r"""Per-operation profile of TRM's real training step on this machine: where the milliseconds go.

Compiles the trainer's pmapped step (as `bench.compile_step`: the recipe's or `configs/cpu_demo.py`'s
model, AdamATan2, EMA, SignSGD, the non-finite guard), runs warm-up steps, then traces `--steps`
steps with `jax.profiler` (its chrome-trace JSON, `plugins/profile/<run>/<host>.trace.json.gz`; no
TensorBoard plugin needed) and joins every timed operation of the compiled program with its
optimized HLO (`compiled.as_text()`). Three readings, by what the target offers:

CPU (XLA:CPU's thunks on the host threads): the per-operation table below.
GPU (the kernels, memcpys and memsets on the device's `Stream #N` lines of the same trace): one row
  per kernel name, per step: ms, launches, share of the kernel time, the GEMM dtype its name shows
  (`sm90_xmma_gemm_f32f32_tf32f32_...`: float32 operands on TF32 cores; `..._bf16bf16_...`: bf16;
  `?`: a GEMM whose name shows none), its HLO op and that op's JAX source; the header gives kernel
  ms and launches per step, the device's span and idle time, and GEMM ms by dtype.
TPU (`--tpu=v5litepod-1`: compiled here by libtpu, as `--dry_run` does; nothing runs): the bytes
  each operation accesses (experiments/tools/hlo_bytes.py, loop trips counted), op counts,
  instructions outside fusions, matmuls with a float32 operand and those that are bfloat16
  products run in float32 (a bf16 operand or one converted from bf16: autodiff's transpose of a
  bf16 matmul with a float32 cotangent), scatters (the token embedding's gradient is one), the
  compiler's FLOPs and bytes accessed, per-device temp bytes. Read both for the program as
  lowered (what every compiler receives: a GPU runs its float32 products as f32/TF32 GEMMs) and as
  the TPU compiler optimized it (which runs a float32 product at default precision in bf16 passes
  itself, so its matmuls all show bf16 operands).
`--trace=DIR` reads a saved trace (e.g. one taken on a GPU machine) without running anything.

CPU table rows group the operations by (result shape, source op); columns, per optimizer step:
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
  python -m experiments.trm.tools.profile_step --model=mlp --dtype=bfloat16 --batch=768 --steps=3
      # on a GPU machine: the kernel table
  python -m experiments.trm.tools.profile_step --model=mlp --dtype=bfloat16 --batch=8 --tpu=v5litepod-1
  python -m experiments.trm.tools.profile_step --trace=/tmp/trace_dir --steps=3

Flags: --model=demo|mlp|att  --dtype=float32|bfloat16 (recipes; demo is float32)  --batch=0 (0: the
  config's, 64 for the recipes)  --steps=3  --warmup=5  --top=30  --cpu_tuning=true|false
  --hidden=0 (recipes: 0 = 512)  --forms=all (none, or a comma list of fast_grad,seq_major,unroll,
  head_major,lean_swiglu,split_reduce,batch_slices,nograd_chunks,pad_contraction,split_gate_up:
  the CPU forms the step carries, experiments/trm/cpu_tuning.py)
  --tpu=TYPE (compile for that TPU, print the HLO summary)  --trace=PATH (read a saved trace)

Functions (tests call them): `parse_trace`, `hlo_index`, `profile_table`, `format_profile`;
`parse_device_trace`, `gemm_dtype`, `kernel_table`, `format_kernels`; `parse_hlo`, `hlo_summary`,
`format_hlo_summary`, `tpu_train_step`, `tpu_hlo_report`.
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
import ml_collections  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import host_malloc  # noqa: E402
from experiments.common import layout as layout_lib  # noqa: E402
from experiments.common import trainer  # noqa: E402
from experiments.tools import dry_run  # noqa: E402
from experiments.tools import hlo_bytes  # noqa: E402
from experiments.tools import tpu_target  # noqa: E402
from experiments.trm import cpu_tuning  # noqa: E402
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
  """The host's operations of a jax.profiler trace (`*.trace.json.gz`, `perfetto_trace.json.gz` or
  a folder holding one), sorted by start: XLA:CPU's thunks (a GPU's kernels: `parse_device_trace`)."""
  events = _events(path)
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


# --------------------------------------------------------------------------------------------------
# A device's kernels (GPU) from the same trace: what ran on the accelerator, per stream.

class Kernel(NamedTuple):
  """One device event of a trace: a kernel or a memcpy/memset on a GPU stream (or an op on a TPU's
  "XLA Ops" line), start and end in microseconds, its device and line, the HLO op it belongs to."""
  name: str
  start: float
  end: float
  device: str
  line: str
  hlo_op: str


def _trace_file(path: str) -> str:
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


def _events(path: str) -> List[Dict[str, Any]]:
  path = _trace_file(path)
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as fh:
    data = json.load(fh)
  return data["traceEvents"] if isinstance(data, dict) else data


# Lines of a device that summarize its kernels (one event per HLO op / module / step) rather than run
# them: counting them too would count each kernel twice.
_SUMMARY_LINES = ("XLA Modules", "XLA TraceMe", "Steps", "Framework", "TensorFlow", "Source",
                  "Launch Stats", "SparseCore")


def parse_device_trace(path: str) -> List[Kernel]:
  """The device events of a jax.profiler trace (chrome-trace JSON, `*.trace.json.gz` or a folder
  holding one): on a GPU the kernels, memcpys and memsets of its `Stream #N` lines; on a TPU, whose
  trace has no streams, the ops of its `XLA Ops` line. Empty for a CPU-only trace. Sorted by start."""
  events = _events(path)
  process, thread = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      process[e["pid"]] = e.get("args", {}).get("name", "")
    elif e.get("ph") == "M" and e.get("name") == "thread_name":
      thread[(e["pid"], e.get("tid"))] = e.get("args", {}).get("name", "")
  devices = {pid for pid, name in process.items() if name.startswith("/device:")}
  lines = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in devices:
      lines[(e["pid"], e.get("tid"))].append(e)
  streams = {k for k in lines if thread.get(k, "").startswith("Stream")}
  chosen = streams or {k for k in lines if thread.get(k, "") == "XLA Ops"}
  out = []
  for k in chosen:
    for e in lines[k]:
      args = e.get("args") or {}
      out.append(Kernel(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
                        process[k[0]], thread.get(k, ""), str(args.get("hlo_op", ""))))
  return sorted(out, key=lambda x: x.start)


_GEMM = re.compile(r"gemm|gemv|xmma|cutlass|cublas|nvjet|matmul|s16816|h16816|hmma", re.I)


def gemm_dtype(kernel_name: str) -> str:
  """The dtype a GEMM kernel's name shows ("tf32", "bf16", "f16", "fp8", "f32"), "?" for a GEMM
  whose name shows none (e.g. a Triton GEMM named after its fusion), "" for a kernel that is no
  GEMM. From cuBLAS/CUTLASS names such as `sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_...` (float32
  operands on TF32 tensor cores) or `sm90_xmma_gemm_bf16bf16_bf16f32_f32_...`."""
  if not _GEMM.search(kernel_name):
    return ""
  n = kernel_name.lower()
  for dtype, pattern in (("fp8", r"e4m3|e5m2|fp8"), ("tf32", r"tf32"), ("bf16", r"bf16"),
                         ("f16", r"(?<![a-z])f16|fp16|h16816|hgemm|hmma"),
                         ("f32", r"f32|sgemm|fp32")):
    if re.search(pattern, n):
      return dtype
  return "?"


def kernel_table(kernels: Sequence[Kernel], steps: int, index: Optional[Dict[str, HloOp]] = None
                 ) -> Tuple[List[Dict[str, Any]], Dict[str, float]]:
  """Rows per kernel name, per step, sorted by ms: summed ms, launches, GEMM dtype (from the name),
  share of the kernel time, and the HLO op / its JAX source (through `index`, `hlo_index` of the
  compiled program) of its first launch; and the totals: kernel ms and launches per step, the
  device's span per step (first start to last end) and its idle time within it."""
  groups: Dict[str, Dict[str, Any]] = {}
  for k in kernels:
    g = groups.setdefault(k.name, {"us": 0.0, "n": 0, "hlo": collections.Counter()})
    g["us"] += k.end - k.start
    g["n"] += 1
    if k.hlo_op:
      g["hlo"][k.hlo_op] += 1
  total_us = sum(g["us"] for g in groups.values())
  rows = []
  for name, g in groups.items():
    hlo = g["hlo"].most_common(1)[0][0] if g["hlo"] else ""
    source = index[hlo].source if index and hlo in index else ""
    rows.append({"ms": g["us"] / 1e3 / steps, "launches": g["n"] / steps,
                 "share": g["us"] / total_us if total_us else 0.0, "gemm": gemm_dtype(name),
                 "kernel": name, "hlo_op": hlo, "op": source})
  rows.sort(key=lambda r: -r["ms"])
  busy = _busy_profile([Op(k.name, k.start, k.end, 0) for k in kernels])
  span = (max(k.end for k in kernels) - kernels[0].start) if kernels else 0.0
  gemm_ms = collections.Counter()
  for r in rows:
    if r["gemm"]:
      gemm_ms[r["gemm"]] += r["ms"]
  totals = {"kernel_ms": total_us / 1e3 / steps, "launches": len(kernels) / steps,
            "span_ms": span / 1e3 / steps, "idle_ms": busy.get(0, 0.0) / 1e3 / steps,
            "gemm_ms": dict(gemm_ms)}
  return rows, totals


def format_kernels(rows: Sequence[Dict[str, Any]], totals: Dict[str, Any], top: int = 30) -> str:
  gemm = ", ".join(f"{d} {ms:.1f}" for d, ms in sorted(totals["gemm_ms"].items(), key=lambda kv: -kv[1]))
  lines = [f"per step: kernels {totals['kernel_ms']:.1f} ms in {totals['launches']:.0f} launches; "
           f"device span {totals['span_ms']:.1f} ms, idle {totals['idle_ms']:.1f} ms; GEMM ms by "
           f"dtype: {gemm or 'none'}",
           "",
           f"{'ms':>8} {'launch':>6} {'share':>6} {'gemm':>5}  {'kernel':48} hlo_op  op"]
  for r in rows[:top]:
    lines.append(f"{r['ms']:8.2f} {r['launches']:6.0f} {r['share']:6.1%} {r['gemm'] or '-':>5}  "
                 f"{r['kernel'][:48]:48} {r['hlo_op'] or '-'}  {r['op']}")
  rest = rows[top:]
  if rest:
    lines.append(f"{sum(r['ms'] for r in rest):8.2f} {sum(r['launches'] for r in rest):6.0f} "
                 f"{sum(r['share'] for r in rest):6.1%}        ({len(rest)} more kernels)")
  return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# An HLO module read instruction by instruction (any target: a TPU compile's optimized HLO, or a
# program as lowered, which every compiler receives).

class Instr(NamedTuple):
  """One HLO instruction: its computation, name, result dtype ("f32", "bf16", "tuple", ...) and
  shape (e.g. "f32[81,8192]"), opcode, operand names, the rest of its line, its JAX op name."""
  computation: str
  name: str
  dtype: str
  shape: str
  opcode: str
  operands: Tuple[str, ...]
  attrs: str
  op_name: str


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{$")


def _balanced(text: str) -> Tuple[str, str]:
  """(the bracketed group that opens `text`, the rest)."""
  depth = 0
  for i, ch in enumerate(text):
    depth += ch in "([{"
    depth -= ch in ")]}"
    if depth == 0:
      return text[:i + 1], text[i + 1:]
  return text, ""


def parse_hlo(hlo_text: str) -> List[Instr]:
  """Every instruction of an HLO module's text (`compiled.as_text()`, or `lowered.as_text("hlo",
  debug_info=True)` for the op names), fused computations' included, in text order."""
  out: List[Instr] = []
  comp = ""
  for line in hlo_text.splitlines():
    s = line.strip()
    if " = " not in s:
      m = _COMPUTATION.match(s)
      if m:
        comp = m.group(1)
      continue
    lhs, rhs = s.split(" = ", 1)
    if not comp or " " in lhs.replace("ROOT ", "").strip():
      continue
    name = lhs.replace("ROOT ", "").strip().lstrip("%")
    if rhs.startswith("("):                                # a tuple-shaped result
      shape, rest = _balanced(rhs)
      dtype = "tuple"
    else:
      head, _, rest = rhs.partition(" ")
      shape = re.sub(r"\{.*$", "", head)                   # without the layout
      dtype = shape.split("[", 1)[0]
    m = re.match(r"\s*([\w\-]+)\(", rest)
    if not m:
      continue
    args, attrs = _balanced(rest[m.end() - 1:])
    operands = tuple(a.strip().split(" ")[-1].lstrip("%")
                     for a in args[1:-1].split(",") if a.strip())
    src = re.search(r'op_name="([^"]*)"', attrs)
    out.append(Instr(comp, name, dtype, shape, m.group(1), operands, attrs,
                     src.group(1) if src else ""))
  return out


DOT_OPCODES = ("dot", "convolution")      # a TPU program runs its matmuls as `convolution`s
_SAME_VALUE = ("bitcast", "copy", "reshape", "transpose", "broadcast")


class _Module:
  """Look-ups over `parse_hlo`'s instructions: by (computation, name), a fused computation's
  caller, a computation's ROOT."""

  def __init__(self, instrs: Sequence[Instr]):
    self.instrs = list(instrs)
    self.by_name = {(i.computation, i.name): i for i in instrs}
    self.caller: Dict[str, Instr] = {}
    self.root: Dict[str, Instr] = {}
    for i in instrs:
      self.root[i.computation] = i          # the last instruction of a computation is its ROOT
      if i.opcode == "fusion":
        called = re.search(r"calls=%?([\w.\-]+)", i.attrs)
        if called:
          self.caller[called.group(1)] = i

  def origin(self, instr: Instr, depth: int = 0) -> Instr:
    """The instruction whose value `instr` passes on in the same dtype: back through bitcasts,
    copies, reshapes, transposes and broadcasts, into a fusion's ROOT, and out of a fused
    computation's parameter to its caller's operand; a convert (or anything else) stops it."""
    nxt = None
    if instr.opcode in _SAME_VALUE and instr.operands:
      nxt = self.by_name.get((instr.computation, instr.operands[0]))
    elif instr.opcode == "fusion":
      called = re.search(r"calls=%?([\w.\-]+)", instr.attrs)
      nxt = self.root.get(called.group(1)) if called else None
    elif instr.opcode == "parameter" and instr.computation in self.caller:
      caller = self.caller[instr.computation]
      k = int(instr.operands[0]) if instr.operands and instr.operands[0].isdigit() else -1
      if 0 <= k < len(caller.operands):
        nxt = self.by_name.get((caller.computation, caller.operands[k]))
    return self.origin(nxt, depth + 1) if nxt is not None and depth < 64 else instr

  def operand(self, instr: Instr, k: int) -> Optional[Instr]:
    return self.by_name.get((instr.computation, instr.operands[k])) if k < len(instr.operands) else None


class DotInfo(NamedTuple):
  """A matmul (dot or convolution) of the program: result and operand dtypes, the dtype each
  operand was converted FROM when a convert made it (else ""), its JAX op name."""
  name: str
  shape: str
  dtype: str
  operand_dtypes: Tuple[str, ...]
  converted_from: Tuple[str, ...]
  op_name: str

  @property
  def float32(self) -> bool:
    """A float32 operand: the product runs in float32 (XLA converts a narrower other operand up;
    a GPU runs it as an f32/TF32 GEMM)."""
    return "f32" in self.operand_dtypes

  @property
  def from_bf16(self) -> bool:
    """A float32 product with a bfloat16 operand, or one converted from bfloat16: a bf16 product
    (autodiff's transpose of a bf16 matmul with a float32 cotangent) run in float32."""
    return self.float32 and ("bf16" in self.operand_dtypes or "bf16" in self.converted_from)


class HloSummary(NamedTuple):
  """What `hlo_summary` finds in one HLO module."""
  op_counts: Dict[str, int]            # opcode -> instructions, fused computations' included
  kernels: int                         # instructions outside fused computations (launches, roughly)
  dots: List[DotInfo]
  scatters: List[Instr]

  @property
  def f32_dots_from_bf16(self) -> List[DotInfo]:
    return [d for d in self.dots if d.from_bf16]


_NOT_KERNELS = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")


def hlo_summary(hlo_text: str) -> HloSummary:
  """Op counts, matmuls with their operand dtypes and bf16 -> f32 converts, scatters, of an HLO
  module's text."""
  mod = _Module(parse_hlo(hlo_text))
  counts: Dict[str, int] = collections.Counter(i.opcode for i in mod.instrs)
  kernels = sum(1 for i in mod.instrs
                if i.computation not in mod.caller and i.opcode not in _NOT_KERNELS)
  dots = []
  for i in mod.instrs:
    if i.opcode not in DOT_OPCODES:
      continue
    ops = [mod.operand(i, k) for k in range(min(2, len(i.operands)))]
    dtypes, sources = [], []
    for op in ops:
      if op is None:
        dtypes.append("?")
        sources.append("")
        continue
      dtypes.append(op.dtype)
      src = mod.origin(op)
      conv = mod.operand(src, 0) if src.opcode == "convert" else None
      sources.append(mod.origin(conv).dtype if conv is not None else "")
    dots.append(DotInfo(i.name, i.shape, i.dtype, tuple(dtypes), tuple(sources), i.op_name))
  scatters = [i for i in mod.instrs if i.opcode == "scatter"]
  return HloSummary(dict(counts), kernels, dots, scatters)


def _tail(op_name: str, parts: int = 4) -> str:
  return "/".join(op_name.split("/")[-parts:]) if op_name else "(no op name)"


def format_hlo_summary(summary: HloSummary, *, title: str, cost: Optional[Dict[str, float]] = None,
                       top: int = 12) -> str:
  """A few lines: op counts, float32 matmuls (those fed by bf16 converts named), scatters, and the
  compiler's cost figures when given (`compiled.cost_analysis()`: flops, bytes accessed)."""
  f32 = [d for d in summary.dots if d.float32]
  lines = [f"{title}: {sum(summary.op_counts.values()):,} instructions, {summary.kernels:,} outside "
           f"fusions; matmuls {len(summary.dots)} ({len(f32)} float32, "
           f"{len(summary.f32_dots_from_bf16)} of them bf16 products run in float32); scatters "
           f"{len(summary.scatters)}"]
  if cost:
    lines.append("  compiler: " + ", ".join(
        f"{k} {cost[k]:.4g}" for k in ("flops", "bytes accessed", "optimal_seconds") if k in cost))
  common = sorted(summary.op_counts.items(), key=lambda kv: -kv[1])[:top]
  lines.append("  op counts: " + ", ".join(f"{k} {v}" for k, v in common))
  for d in summary.f32_dots_from_bf16:
    lines.append(f"  bf16 product in float32: {d.shape} {d.name} <- {'/'.join(d.operand_dtypes)} "
                 f"(converted from {'/'.join(s or '-' for s in d.converted_from)})  {_tail(d.op_name)}")
  for s in summary.scatters:
    lines.append(f"  scatter: {s.shape} {s.name}  {_tail(s.op_name)}")
  return "\n".join(lines)



def tpu_train_step(config: ml_collections.ConfigDict, target_name: str):
  """(lowered, compiled) of the trainer's training step of a TRM `config` for a TPU slice, compiled
  by libtpu on this machine as `--dry_run --target=...` does (experiments/tools/dry_run.py)."""
  target = tpu_target.parse_target(target_name)
  layout = dry_run.tpu_layout(train.TRM(), config, target)
  trainer.check_config(train.TRM(), config)
  b = train.TRM().build(config, layout)
  p = dry_run.programs(train.TRM(), b, config, layout)["train_step"]
  lowered = dry_run.lower_for_tpu(p, target, layout)
  return lowered, lowered.compile()


def tpu_hlo_report(lowered, compiled, title: str, top: int = 12) -> str:
  """`format_hlo_summary` of the program as lowered (what every compiler receives: its float32
  products are what a GPU runs in f32/TF32) and as the TPU compiler optimized it (which runs a
  float32 product at default precision in bf16 passes itself), with the compiler's costs."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  mem = compiled.memory_analysis()
  lines = [format_hlo_summary(hlo_summary(lowered.as_text("hlo", debug_info=True)),
                              title=f"{title}, as lowered", top=top),
           format_hlo_summary(hlo_summary(compiled.as_text()), title=f"{title}, TPU-optimized",
                              cost=cost, top=top)]
  if mem is not None:
    lines.append(f"  per device: temp {mem.temp_size_in_bytes / 1e9:.3f} GB, arguments "
                 f"{mem.argument_size_in_bytes / 1e9:.3f} GB")
  # Where the bytes go: the optimized program's operations by bytes (loop trips counted).
  lines.append(hlo_bytes.format_breakdown(hlo_bytes.breakdown(compiled.as_text()), top=top,
                                          compiler_bytes=cost.get("bytes accessed"),
                                          title=f"{title}, bytes by operation"))
  return "\n".join(lines)

def _setup(args: argparse.Namespace) -> bench.StepSetup:
  return bench.compile_config_step(_config(args), forms=args.forms)


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
  ap.add_argument("--forms", default="all",
                  help=f"the CPU forms: all, none or a comma list of {','.join(cpu_tuning.FORMS)}")
  ap.add_argument("--tpu", default="",
                  help="a TPU type (e.g. v5litepod-1): compile the step for it with libtpu and print "
                       "the HLO summary instead of running it")
  ap.add_argument("--trace", default="",
                  help="read this jax.profiler trace (a *.trace.json.gz or its folder) of --steps "
                       "steps instead of running the step")
  args = ap.parse_args(argv)
  args.cpu_tuning = args.cpu_tuning == "true"
  try:
    cpu_tuning.parse_forms(args.forms)
  except ValueError as e:
    ap.error(f"--{e}")
  if args.model == "demo" and args.dtype != "float32":
    ap.error(f"--dtype={args.dtype} with --model=demo: the demo config is float32; "
             "use --model=mlp or --model=att for bfloat16")
  if args.steps < 1:
    ap.error(f"--steps={args.steps}: trace at least one step")
  if args.tpu and args.tpu not in tpu_target.valid_target_names():
    ap.error(f"--tpu={args.tpu}: not a TPU type; use one of "
             f"{', '.join(tpu_target.valid_target_names())}")
  if args.trace and not os.path.exists(args.trace):
    ap.error(f"--trace={args.trace}: no such file or folder; give a jax.profiler trace")
  return args


def _config(args: argparse.Namespace) -> ml_collections.ConfigDict:
  if args.model != "demo":
    return bench.recipe_config(args.model, args.dtype, hidden=args.hidden or None,
                               per_device_batch=args.batch or 64, cpu_tuning=args.cpu_tuning)
  config = cpu_demo.get_config(f"batch={args.batch}" if args.batch else None)
  config.cpu_tuning = args.cpu_tuning
  trainer.check_config(train.TRM(), config)
  return config


def print_trace(path: str, steps: int, top: int, index: Optional[Dict[str, HloOp]] = None,
                peak_gflop_s: float = 0.0) -> None:
  """The device kernel table of a trace that has a device (GPU / TPU), else the host ops table."""
  kernels = parse_device_trace(path)
  if kernels:
    print(format_kernels(*kernel_table(kernels, steps, index), top=top))
  else:
    rows, totals = profile_table(parse_trace(path), index or {}, steps)
    print(format_profile(rows, totals, peak_gflop_s, top))


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  args = parse_args(argv)
  if args.trace:
    print_trace(args.trace, args.steps, args.top)
    return 0
  if args.tpu:
    config = _config(args)
    t0 = time.perf_counter()
    lowered, compiled = tpu_train_step(config, args.tpu)
    print(f"model {args.model}, {config.model.forward_dtype}, global batch "
          f"{layout_lib.configured_batch(config)}, compiled for {args.tpu} in "
          f"{time.perf_counter() - t0:.1f} s")
    print(tpu_hlo_report(lowered, compiled, f"training step ({args.tpu})", top=args.top))
    return 0
  if args.cpu_tuning and jax.default_backend() == "cpu":
    host_malloc.keep_heap()   # as the trainer does on a CPU target; before the backend's threads
  setup = _setup(args)
  print(f"model {args.model}, {setup.cfg.forward_dtype}, global batch {setup.global_batch}, "
        f"cpu_tuning {args.cpu_tuning} ({setup.forms_text()}); compiled in {setup.compile_s:.1f} s "
        f"for {jax.devices()[0].device_kind}", flush=True)
  index = hlo_index(setup.compiled.as_text())
  warm = _run(setup, args.warmup)
  with tempfile.TemporaryDirectory(prefix="podlab_profile_") as tmp:
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0         # Python frames are not wanted and slow the step
    jax.profiler.start_trace(tmp, profiler_options=options)
    timed = _run(setup, args.steps)
    jax.profiler.stop_trace()
    print(f"step wall time: warm-up {', '.join(f'{t * 1e3:.0f}' for t in warm)} ms; traced median "
          f"{statistics.median(timed) * 1e3:.0f} ms (tracing slows every operation: read the table "
          f"for proportions and the untraced warm-up steps for speed)")
    peak = bench.matmul_peak_flops(setup.cfg.forward_dtype) / 1e9
    print_trace(tmp, args.steps, args.top, index, peak)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
