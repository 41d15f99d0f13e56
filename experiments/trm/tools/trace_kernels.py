"""A device's kernels in a jax.profiler trace (a GPU's streams, a TPU's ops): the kernel table.

On a GPU the kernels, memcpys and memsets of the device's `Stream #N` lines; on a TPU, whose trace
has no streams, the ops of its `XLA Ops` line. `kernel_table` groups them per kernel name and
optimizer step (ms, launches, share of the kernel time, the GEMM dtype a cuBLAS/CUTLASS name shows,
the HLO op and its JAX source through `trace_ops.hlo_index`); `format_kernels` prints it as
experiments/trm/tools/profile_step.py does on a GPU. The host's operations: trace_ops.py.

Synopsis:

  from experiments.trm.tools import trace_kernels

  assert trace_kernels.gemm_dtype("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "bf16"
  kernels = [trace_kernels.Kernel("sm90_xmma_gemm_f32f32_tf32f32_f32", 0.0, 500.0, "/device:GPU:0",
                                  "Stream 14", "dot.5")]
  rows, totals = trace_kernels.kernel_table(kernels, steps=1)
  print(trace_kernels.format_kernels(rows, totals))
"""

from __future__ import annotations

import collections
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from experiments.trm.tools.trace_ops import HloOp, Op, busy_profile, read_events


class Kernel(NamedTuple):
  """One device event of a trace: a kernel or a memcpy/memset on a GPU stream (or an op on a TPU's
  "XLA Ops" line), start and end in microseconds, its device and line, the HLO op it belongs to."""
  name: str
  start: float
  end: float
  device: str
  line: str
  hlo_op: str


# Lines of a device that summarize its kernels (one event per HLO op / module / step) rather than run
# them: counting them too would count each kernel twice.
_SUMMARY_LINES = ("XLA Modules", "XLA TraceMe", "Steps", "Framework", "TensorFlow", "Source",
                  "Launch Stats", "SparseCore")


def parse_device_trace(path: str) -> List[Kernel]:
  """The device events of a jax.profiler trace (chrome-trace JSON, `*.trace.json.gz` or a folder
  holding one): on a GPU the kernels, memcpys and memsets of its `Stream #N` lines; on a TPU, whose
  trace has no streams, the ops of its `XLA Ops` line. Empty for a CPU-only trace. Sorted by start."""
  events = read_events(path)
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
  busy = busy_profile([Op(k.name, k.start, k.end, 0) for k in kernels])
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

