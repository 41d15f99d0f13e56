"""An HLO module read instruction by instruction: op counts, matmuls' operand dtypes, scatters.

Works on any target's HLO text: a TPU compile's optimized HLO (`compiled.as_text()`), or a program
as lowered (`lowered.as_text("hlo", debug_info=True)`, which every compiler receives, with the JAX
op names). `hlo_summary` finds the matmuls (dots and convolutions) with a float32 operand and those
that are bfloat16 products run in float32 (a bf16 operand, or one converted from bf16: autodiff's
transpose of a bf16 matmul with a float32 cotangent), and the scatters; `format_hlo_summary` prints
it (experiments/trm/tools/profile_step.py --tpu, tests/test_accelerator_hlo.py).

Synopsis:

  import jax, jax.numpy as jnp
  from experiments.trm.tools import hlo_instructions

  f = lambda a, b: jnp.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
  lowered = jax.jit(f).lower(jnp.ones((8, 8)), jnp.ones((8, 8)))
  s = hlo_instructions.hlo_summary(lowered.as_text("hlo", debug_info=True))
  print(hlo_instructions.format_hlo_summary(s, title="bf16 dot"))
"""

from __future__ import annotations

import collections
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple


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
