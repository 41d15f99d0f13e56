"""Loop-aware FLOPs and bytes of a program compiled for a TPU slice.

The compiler's cost analysis counts a while loop's body once, not once per trip. The loops of a
podlab program are `lax.scan`s in its jaxpr (scans, and `fori_loop`s with static bounds, which JAX
turns into scans): each has a static trip count. Each loop body is compiled once as its own
program (pmapped over the same devices, so its collectives compile), and
  loop-aware cost(P) = compiled cost(P) + sum over the loops L of P (outermost first):
                       trips(L) x loop-aware cost(body L) - counted(L) x compiled cost(body L)
where counted(L) is the trips the compiled P already holds (1; `unroll` copies when unrolled).

- `per_device_jaxpr(fn, target, args)`: the jaxpr the loops are read from.
- `loop_aware_cost(jaxpr, compiled, target)` -> `LoopAwareCost` (its `Cost`, its `Loop`s, a note).
- `count_while_loops(hlo_text)`: the while loops the compiled program kept.

`tpu_compile.compile_report(..., jaxpr=...)` puts these counts into its Report.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import jax.extend

from experiments.common import parallel
from experiments.tools import tpu_target


def count_while_loops(hlo_text: str) -> int:
  """The while loops of a compiled program's (optimized) HLO text."""
  return len(re.findall(r"\swhile\(", hlo_text))


@dataclasses.dataclass(frozen=True)
class Cost:
  """FLOPs, bytes accessed and the cost model's seconds of a program (seconds None: invalid)."""
  flops: float
  bytes: float
  seconds: Optional[float]

  def plus(self, other: "Cost", times: float = 1.0) -> "Cost":
    seconds = (None if self.seconds is None or other.seconds is None
               else self.seconds + times * other.seconds)
    return Cost(self.flops + times * other.flops, self.bytes + times * other.bytes, seconds)


@dataclasses.dataclass(frozen=True)
class Loop:
  """One loop of a program: where it is, its trips, and one trip's loop-aware cost per device."""
  name: str
  trips: int
  per_trip: Cost


@dataclasses.dataclass(frozen=True)
class LoopAwareCost:
  """A program's loop-aware cost per device (`loop_aware_cost`); `note` says why it may be off."""
  cost: Cost
  loops: Tuple[Loop, ...]
  note: Optional[str] = None


def per_device_jaxpr(fn: Callable[..., Any], target: tpu_target.Target,
                     args: Sequence[Any]) -> Any:
  """The jaxpr of the per-device step `fn` at the PER-DEVICE `args` (as for
  `tpu_target.lower_step`), with the data axis bound to the slice's device count: what
  `loop_aware_cost` reads the loops from."""
  return jax.make_jaxpr(fn, axis_env=[(parallel.AXIS, target.num_devices)])(*args)


def _cost_of(compiled: Any) -> Cost:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):            # older JAX: one dict per program
    cost = cost[0] if cost else {}
  cost = cost or {}
  t = cost.get("optimal_seconds")
  return Cost(float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
              float(t) if t is not None and math.isfinite(t) and t > 0 else None)


KERNEL_PRIMITIVES = ("pallas_call",)
"""Equations that compile to one kernel (a custom call): their jaxprs are the kernel's body, whose
loops run inside the kernel, not as XLA loops; the loop count does not look into them."""


def _sub_jaxprs(params: Dict[str, Any]) -> Iterator[Any]:
  for value in params.values():
    for x in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(x, jax.extend.core.ClosedJaxpr):
        yield x.jaxpr
      elif isinstance(x, jax.extend.core.Jaxpr):
        yield x


def _outer_loops(jaxpr: Any) -> List[Any]:
  """The scan and while equations of `jaxpr` not inside another loop (inside jit, remat, custom
  derivative or cond equations too)."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("scan", "while"):
      out.append(eqn)
    elif eqn.primitive.name not in KERNEL_PRIMITIVES:
      for sub in _sub_jaxprs(eqn.params):
        out.extend(_outer_loops(sub))
  return out


def _loop_name(eqn: Any) -> str:
  """E.g. "scan at trm.py:332 (cycle)": the loop's primitive and the user frame that made it."""
  try:
    from jax._src import source_info_util  # pylint: disable=g-import-not-at-top
    where = source_info_util.summarize(eqn.source_info)
  except Exception:  # pylint: disable=broad-except  (a name only; JAX's private API may move)
    where = ""
  where = os.path.basename(where) if where else ""
  return f"{eqn.primitive.name}{' at ' + where if where else ''}"


def _compile_jaxpr(closed: Any, target: tpu_target.Target) -> Any:
  fun = jax.extend.core.jaxpr_as_fun(closed)
  avals = tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars)
  lowered = tpu_target.lower_step(lambda xs: fun(*xs), target, (avals,))
  with tpu_target.native_output_captured():
    return lowered.compile()


def loop_aware_cost(jaxpr: Any, compiled: Any, target: tpu_target.Target) -> LoopAwareCost:
  """The loop-aware FLOPs, bytes and cost-model time per device of a program compiled for `target`
  (`compiled`: its `jax.stages.Compiled`; `jaxpr`: its per-device `per_device_jaxpr`). Every loop
  body is compiled once for the target (nested loops inside their body's program). A while loop
  (a trip count known only when it runs) is counted once, as the compiler does, and named in
  `note`; so is a compiled program that holds fewer while loops than the jaxpr's scans (the
  compiler unrolled one), and a loop whose body alone does not fit the chip (compiled alone, the
  body holds whole what the program splits over the devices)."""
  notes: List[str] = []
  loops: List[Loop] = []

  def aware(jx: Any, compiled_cost: Cost, compiled_text: str, where: str) -> Cost:
    total = compiled_cost
    outer = _outer_loops(jx)
    expected = _count_loops(jx)
    found = count_while_loops(compiled_text)
    if found < expected:
      notes.append(f"{where}: the compiler kept {found} of {expected} loops (the others unrolled); "
                   "their bodies may be counted twice")
    for eqn in outer:
      name = _loop_name(eqn)
      if eqn.primitive.name == "while":
        notes.append(f"{name}: a while loop (trips known only at run time), counted once")
        continue
      trips = int(eqn.params["length"])
      unroll = eqn.params.get("unroll", 1)
      counted = trips if unroll is True else min(max(int(unroll), 1), trips)
      body = eqn.params["jaxpr"]
      try:
        body_compiled = _compile_jaxpr(body, target)
      except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
          raise
        # Alone, every device holds the body's whole inputs (an fsdp step's gathered weights
        # among them), which the program itself splits: the loop keeps the compiler's one trip.
        notes.append(f"{name}: its body compiled alone does not fit a {target.name} chip; its "
                     f"{trips} trips are counted once")
        continue
      body_cost = _cost_of(body_compiled)
      body_aware = aware(body.jaxpr, body_cost, body_compiled.as_text(), name)
      loops.append(Loop(name, trips, body_aware))
      total = total.plus(body_aware, trips).plus(body_cost, -counted)
    return total

  jx = jaxpr.jaxpr if isinstance(jaxpr, jax.extend.core.ClosedJaxpr) else jaxpr
  cost = aware(jx, _cost_of(compiled), compiled.as_text(), "program")
  return LoopAwareCost(cost, tuple(loops), "; ".join(notes) or None)


def _count_loops(jaxpr: Any) -> int:
  """Scans with more than one trip and while loops in `jaxpr`, nested ones included."""
  n = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "while":
      n += 1
    elif eqn.primitive.name == "scan":
      trips, unroll = int(eqn.params["length"]), eqn.params.get("unroll", 1)
      n += int(trips > 1 and unroll is not True and int(unroll) < trips)
    if eqn.primitive.name in KERNEL_PRIMITIVES:
      continue
    for sub in _sub_jaxprs(eqn.params):
      n += _count_loops(sub)
  return n
