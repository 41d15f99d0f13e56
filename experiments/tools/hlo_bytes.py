r"""Where a compiled program's HBM traffic goes: bytes per top-level operation of the optimized HLO.

The TPU compiler's `cost_analysis()` gives one figure, "bytes accessed", for a whole program. This
module splits it: every top-level instruction of the optimized HLO (`Compiled.as_text()`: the
fusions, copies, collectives and custom calls the device runs, each one HBM round trip) is charged
the bytes of its operands and its result, a `while` body's instructions times the loop's known trip
count, and the rows are grouped by what produced them (the JAX op path in the instruction's
metadata, layer indices folded: `h_7/attn/...` -> `h_*/attn/...`).

Glossary:
  op        one top-level HLO instruction (a fusion counts once: what it reads and writes).
  bytes     operand bytes + result bytes of an op, times its loop trips (a `while` body's ops run
            once per trip; XLA's cost analysis counts a body once, this counts every trip when the
            compiler recorded the trip count, `known_trip_count`).
  source    the op's JAX name path (`jit(...)/.../jvp(gpt)/h_3/attn/dot_general` ->
            `h_*/attn/dot_general`), with ` (bwd)` for backward-pass ops (`transpose(...)`).
  category  a coarse kind read from the source and the opcode: attention, logits/loss, norm, mlp,
            projections, embedding, optimizer, collective, copy/transpose, custom call (a kernel:
            Pallas/Mosaic, cuDNN), other.

A custom call (a Pallas kernel) is charged its operands and results only: what it reads and writes
in HBM, not what it keeps in on-chip memory. XLA's own analysis sees a custom call the same way
(no FLOPs, operand and result bytes), so the totals stay comparable.

The split is this module's arithmetic, not the compiler's: operand + result bytes of each top-level
op. `breakdown(...).total` is printed beside the compiler's figure so a reader sees how close the
two are (within a few percent for the pod programs, docs/tpu.md).

Synopsis:

  from experiments.tools import hlo_bytes
  b = hlo_bytes.breakdown(compiled.as_text())
  print(hlo_bytes.format_breakdown(b, top=10, compiler_bytes=cost["bytes accessed"]))
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
               "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
               "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16, "token": 0}

FREE_OPCODES = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
    "conditional", "after-all", "partition-id", "replica-id", "iota", "opt-barrier",
    "copy-done", "all-reduce-done", "all-gather-done", "collective-permute-done", "send-done",
    "recv-done", "async-done", "async-update", "add-dependency", "domain"})
"""Opcodes that move no data of their own (aliases, control flow, the second half of async
pairs: their start is charged)."""

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*)?\{\s*$")
_ARRAY = re.compile(r"([a-z]\w*)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_BODY = re.compile(r"body=%?([\w.\-]+)")
_CALLS = re.compile(r"(?:to_apply|calls|branch_computations|true_computation|false_computation)"
                    r"=\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?")
_LAYER = re.compile(r"(?<![\w])(h|layer|layers|block|blocks)_\d+")


@dataclasses.dataclass
class Op:
  """One top-level instruction: its opcode, result bytes, operand bytes, trips and source."""
  name: str
  opcode: str
  result_bytes: float
  operand_bytes: float
  trips: int
  source: str
  target: str = ""           # a custom call's target (e.g. tpu_custom_call) or a fusion's kind

  @property
  def bytes(self) -> float:
    return (self.result_bytes + self.operand_bytes) * self.trips


@dataclasses.dataclass
class Row:
  """Ops grouped by (category, source, opcode)."""
  category: str
  source: str
  opcode: str
  count: int
  bytes: float
  shape: str


@dataclasses.dataclass
class Breakdown:
  ops: List[Op]
  rows: List[Row]            # largest first
  total: float               # bytes, every trip counted
  by_category: Dict[str, float]


def _split_top(text: str, sep: str = ",") -> List[str]:
  """`text` split at `sep` outside (), [] and {}."""
  parts, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == sep and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return parts


def _matching(text: str, start: int) -> int:
  """Index of the bracket closing the one at `start`."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i
  raise ValueError(f"unbalanced brackets in HLO: {text[start:start + 80]!r}")


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO shape string (`bf16[6,1024]{1,0}`, a tuple of them, `f32[]`); layouts and
  tiling padding are not counted."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(re.sub(r"\{[^{}]*\}", "", shape)):
    if dtype not in DTYPE_BYTES:
      continue
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    total += n * DTYPE_BYTES[dtype]
  return total


def _parse_instruction(rhs: str) -> Tuple[str, str, List[str], str]:
  """(result shape, opcode, operand names, attributes) of an instruction's right-hand side."""
  rhs = rhs.strip()
  if rhs.startswith("("):                       # a tuple shape
    end = _matching(rhs, 0)
    shape, rest = rhs[:end + 1], rhs[end + 1:].lstrip()
  else:
    m = re.match(r"[\w]+\[[^\]]*\](\{)?", rhs)
    if m is None:                                # a scalar token etc.: `token[] after-all()`
      shape, rest = rhs.split(" ", 1)[0], rhs.split(" ", 1)[1] if " " in rhs else ""
    else:
      end = _matching(rhs, m.end() - 1) + 1 if m.group(1) else m.end()
      shape, rest = rhs[:end], rhs[end:].lstrip()
  paren = rest.find("(")
  opcode = rest[:paren].strip()
  close = _matching(rest, paren)
  operands = [o.strip() for o in _split_top(rest[paren + 1:close]) if o.strip()]
  names = []
  for o in operands:
    o = re.sub(r"/\*.*?\*/", "", o).strip()
    token = o.split()[-1] if o else ""
    if token.startswith("%"):
      names.append(token[1:])
    elif re.fullmatch(r"[\w.\-]+", token) and not re.fullmatch(r"[\d.\-e]+", token):
      names.append(token)
  return shape, opcode, names, rest[close + 1:]


def _computations(hlo_text: str) -> Tuple[Dict[str, List[Tuple[str, str]]], Optional[str]]:
  """{computation name: [(instruction name, right-hand side)]} (the ROOT instruction last), and
  the entry's name."""
  comps: Dict[str, List[Tuple[str, str]]] = {}
  root = None
  entry, current = None, None
  for line in hlo_text.splitlines():
    if current is None:
      m = _COMPUTATION.match(line)
      if m and "=" not in line.split("(", 1)[0]:
        current = m.group(2)
        comps[current] = []
        if m.group(1):
          entry = current
      continue
    if line.strip() == "}":
      if root is not None:
        comps[current].append(root)
      current, root = None, None
      continue
    m = _INSTRUCTION.match(line)
    if m:
      if m.group(1):
        root = (m.group(2), m.group(3))
      else:
        comps[current].append((m.group(2), m.group(3)))
  return comps, entry


def source_of(op_name: str) -> str:
  """A readable source for an op's metadata path: transforms dropped, layer indices folded, and
  ` (bwd)` for the backward pass."""
  backward = "transpose(" in op_name
  parts = [p for p in op_name.split("/") if p]
  kept = []
  for p in parts:
    if p.startswith(("jit(", "pmap(", "shard_map", "xla_pmap")) or p in ("while", "body", "cond"):
      continue
    p = re.sub(r"^(?:jvp|transpose|vmap|remat|checkpoint|rematted_computation|pjit|"
               r"custom_vjp_call|custom_jvp_call)\((.*)\)$", r"\1", p)
    while True:
      q = re.sub(r"^(?:jvp|transpose|vmap|remat|checkpoint|pjit)\((.*)\)$", r"\1", p)
      if q == p:
        break
      p = q
    kept.append(p)
  text = _LAYER.sub(lambda m: m.group(1) + "_*", "/".join(kept)) or "(no source)"
  return text + (" (bwd)" if backward else "")


_CATEGORIES = (
    ("logits/loss", ("cross_entropy", "log_softmax", "logsumexp", "attend", "lm_head", "loss",
                     "logits", "take_along_axis", "rematted_computation")),
    ("projections", ("qkv_proj", "o_proj")),
    ("attention", ("attn/", "attention", "splash", "flash")),
    ("norm", ("ln_", "layer_norm", "rms_norm", "layernorm", "rsqrt")),
    ("mlp", ("mlp/", "mlp_t/", "gelu", "swiglu", "gate_up", "c_fc", "c_proj")),
    ("embedding", ("embed", "wte", "wpe", "one_hot", "scatter")),
    ("loop residuals", ("dynamic_update_slice",)),
    ("optimizer", ("adam", "optimizer", "optax", "ema", "opt_state", "decay", "clip",
                   "global_norm", "apply_updates", "moment", "sign")),
    ("non-finite guard", ("reduce_and", "is_finite", "isfinite", "nonfinite", "guard")),
)
"""(category, keys): the first whose key is in an op's source wins."""


def category_of(op: Op) -> str:
  """The op's category (module doc)."""
  if op.opcode.startswith(COLLECTIVES):
    return "collective"
  if op.opcode == "custom-call":
    return "custom call"
  if op.opcode in ("copy", "copy-start", "transpose"):
    return "copy/transpose"
  low = op.source.lower()
  for name, keys in _CATEGORIES:
    if any(k in low for k in keys):
      return name
  return "other"


FREE_CUSTOM_CALLS = frozenset({"ConcatBitcast", "AssumeGatherIndicesInBound",
                               "GatherScatterIndicesBitpacked", "LayoutConstraint", "Sharding",
                               "SPMDFullToShardShape", "SPMDShardToFullShape"})
"""Custom calls that are annotations or bitcasts (no data moved)."""

_SLICING = ("slice", "dynamic-slice", "gather")
_PASS_THROUGH = ("bitcast", "reshape", "get-tuple-element")


def _tuple_elements(shape: str) -> List[str]:
  """The element shapes of a tuple shape (a plain shape: itself)."""
  shape = shape.strip()
  if not shape.startswith("("):
    return [shape]
  return [e.strip() for e in _split_top(shape[1:_matching(shape, 0)])]


def _fused_operand_bytes(body: List[Tuple[str, str]], params: Sequence[float]) -> List[float]:
  """Bytes a fusion reads of each parameter: the whole parameter, or, where every use (through
  bitcasts and reshapes) slices or gathers it, the sum of those slices' sizes; the buffer of an
  in-place dynamic-update-slice root is not read."""
  parsed = {}
  index = {}
  for name, rhs in body:
    try:
      parsed[name] = _parse_instruction(rhs)
    except (ValueError, IndexError):
      continue
    if parsed[name][1] == "parameter":
      m = re.match(r"\s*(\d+)", rhs[rhs.find("parameter(") + len("parameter("):])
      if m:
        index[name] = int(m.group(1))
  users: Dict[str, List[str]] = collections.defaultdict(list)
  for name, (_, _, operands, _) in parsed.items():
    for o in operands:
      users[o].append(name)
  root = body[-1][0] if body else ""            # _computations puts the ROOT last

  def read(name: str) -> Optional[float]:
    """Bytes read of `name` when every use slices it (None: read whole)."""
    total = 0.0
    for u in users.get(name, []):
      shape, opcode, operands, _ = parsed[u]
      if opcode in _SLICING and operands and operands[0] == name:
        total += shape_bytes(shape)
      elif opcode in _PASS_THROUGH:
        sub = read(u)
        if sub is None:
          return None
        total += sub
      elif opcode == "dynamic-update-slice" and operands and operands[0] == name and u == root:
        continue                               # updated in place: not read
      else:
        return None
    return total

  out = list(params)
  for name, i in index.items():
    if i < len(out):
      sliced = read(name)
      if sliced is not None:
        out[i] = min(out[i], sliced)
  return out


_CONSTANT = re.compile(r"constant\((-?\d+)\)")


def _trip_count(comps: Dict[str, List[Tuple[str, str]]], caller: str, attrs: str,
                operands: Sequence[str]) -> int:
  """A while loop's trip count: the compiler's `known_trip_count`, else read from a counted loop's
  condition (`i < N` on tuple element 0, i starting at a constant of the init tuple), else 1."""
  t = _TRIP.search(attrs)
  if t:
    return int(t.group(1))
  c = re.search(r"condition=%?([\w.\-]+)", attrs)
  body = comps.get(c.group(1), []) if c else []
  if not body:
    return 1
  consts = {name: int(m.group(1)) for name, rhs in body
            if " constant(" in rhs and (m := _CONSTANT.search(rhs))}
  _, opcode, root_operands, root_attrs = _parse_instruction(body[-1][1])
  if opcode != "compare" or "direction=LT" not in root_attrs or len(root_operands) != 2:
    return 1
  bound = consts.get(root_operands[1])
  if bound is None:
    return 1
  start = 0
  caller_body = dict(comps.get(caller, []))
  init = caller_body.get(operands[0]) if operands else None
  if init is not None and " tuple(" in init:
    first = _parse_instruction(init)[2][:1]
    rhs = caller_body.get(first[0], "") if first else ""
    m = _CONSTANT.search(rhs) if " constant(" in rhs else None
    start = int(m.group(1)) if m else 0
  return max(bound - start, 1)


def _ops(hlo_text: str) -> Iterator[Op]:
  comps, entry = _computations(hlo_text)
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  shapes = {}
  for body in comps.values():
    for name, rhs in body:
      try:
        shapes[name] = _parse_instruction(rhs)[0]
      except (ValueError, IndexError):
        pass
  seen = set()

  def visit(comp: str, trips: int) -> Iterator[Op]:
    if (comp, trips) in seen or comp not in comps:
      return
    seen.add((comp, trips))
    for name, rhs in comps[comp]:
      try:
        shape, opcode, operands, attrs = _parse_instruction(rhs)
      except (ValueError, IndexError):
        continue
      if opcode == "while":
        m = _BODY.search(attrs)
        if m:
          yield from visit(m.group(1), trips * _trip_count(comps, comp, attrs, operands))
        continue
      if opcode in ("call", "conditional"):
        m = _CALLS.search(attrs)
        if m:
          for callee in m.group(1).split(","):
            yield from visit(callee.strip().lstrip("%"), trips)
        continue
      if opcode in FREE_OPCODES or opcode.endswith("-done"):
        continue
      m = _OP_NAME.search(attrs)
      target = ""
      t = re.search(r'custom_call_target="([^"]+)"', attrs) or re.search(r"kind=(\w+)", attrs)
      if t:
        target = t.group(1)
      if opcode == "custom-call" and target in FREE_CUSTOM_CALLS:
        continue
      result = shape_bytes(shape)
      operand_sizes = [shape_bytes(shapes.get(o, "")) for o in operands]
      if opcode.endswith("-start") and not opcode.startswith(COLLECTIVES):
        # An async copy or slice (e.g. a prefetch into another memory space): its result tuple
        # holds (operand, destination, context); it reads and writes the destination's bytes.
        parts = _tuple_elements(shape)
        moved = shape_bytes(parts[1]) if len(parts) > 1 else result
        result, operand_sizes = moved, [moved]
      elif opcode.endswith("-start"):            # an async collective: (operands, results, ...)
        parts = _tuple_elements(shape)
        result = shape_bytes(parts[1]) if len(parts) > 1 else result
      elif opcode in _SLICING:
        operand_sizes = [result]
      elif opcode == "dynamic-update-slice":
        update = operand_sizes[1] if len(operand_sizes) > 1 else 0.0
        result, operand_sizes = update, [update]
      elif opcode == "fusion":
        called = re.search(r"calls=%?([\w.\-]+)", attrs)
        if called and called.group(1) in comps:
          operand_sizes = _fused_operand_bytes(comps[called.group(1)], operand_sizes)
          body = comps[called.group(1)]
          root = body[-1][1] if body else ""
          if " dynamic-update-slice(" in root and len(operand_sizes) > 0:
            # in place: the buffer is written where the update lands, not whole
            result = max(result - sum(operand_sizes[:1]), 0.0) or result
      yield Op(name, opcode, result, sum(operand_sizes), trips,
               source_of(m.group(1)) if m else "(no source)", target)

  yield from visit(entry, 1)


def breakdown(hlo_text: str) -> Breakdown:
  """Bytes per op of an optimized HLO module's text, grouped (see the module doc)."""
  ops = list(_ops(hlo_text))
  groups: Dict[Tuple[str, str, str], Row] = {}
  by_category: Dict[str, float] = collections.defaultdict(float)
  for op in ops:
    cat = category_of(op)
    by_category[cat] += op.bytes
    key = (cat, op.source, op.opcode if op.opcode != "fusion" else f"fusion:{op.target}")
    row = groups.get(key)
    if row is None:
      groups[key] = Row(cat, op.source, key[2], 1, op.bytes, f"{_fmt(op.result_bytes)} out")
    else:
      row.count += op.trips
      row.bytes += op.bytes
  rows = sorted(groups.values(), key=lambda r: -r.bytes)
  return Breakdown(ops, rows, sum(op.bytes for op in ops), dict(by_category))


def _fmt(b: float) -> str:
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if b >= scale:
      return f"{b / scale:.3g} {unit}"
  return f"{b:.0f} B"


def format_breakdown(b: Breakdown, *, top: int = 10, compiler_bytes: Optional[float] = None,
                     title: str = "") -> str:
  """The top `top` rows and the categories, as a text table."""
  lines = []
  head = f"{title}: " if title else ""
  total = f"{b.total / 1e9:.2f} GB over {len(b.ops)} top-level ops (every loop trip)"
  if compiler_bytes:
    total += (f"; the compiler's bytes accessed {compiler_bytes / 1e9:.2f} GB "
              f"({b.total / compiler_bytes:.0%} of it)")
  lines.append(head + total)
  lines.append("by category: " + ", ".join(
      f"{k} {v / 1e9:.2f} GB ({v / b.total:.0%})"
      for k, v in sorted(b.by_category.items(), key=lambda kv: -kv[1]) if v > 0))
  table = [("#", "GB", "share", "ops", "category", "op", "source", "result")]
  for i, r in enumerate(b.rows[:top], 1):
    table.append((str(i), f"{r.bytes / 1e9:.2f}", f"{r.bytes / b.total:.1%}", str(r.count),
                  r.category, r.opcode, r.source[-70:], r.shape))
  widths = [max(len(row[j]) for row in table) for j in range(len(table[0]))]
  for k, row in enumerate(table):
    lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if k == 0:
      lines.append("  ".join("-" * w for w in widths))
  return "\n".join(lines)


def top_rows(b: Breakdown, top: int) -> Sequence[Row]:
  return b.rows[:top]
