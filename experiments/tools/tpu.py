"""Compile for a Cloud TPU slice on a CPU-only machine, and read the TPU compiler's estimates.

PyPI's `libtpu` (podlab's optional extra `tpu`: `pip install -e '.[tpu]'`) holds the TPU compiler.
JAX builds a TPU topology from it with no TPU present (`jax.experimental.topologies.
get_topology_desc`): compile-only devices laid out on the slice's hosts. A pmapped step lowered over
ALL of a slice's devices (global leading axis = number of devices) compiles with the compiler the
pod runs, and the compiled program's `memory_analysis()` / `cost_analysis()` give per-device HBM and
the compiler's FLOP, byte and time estimates. The host backend stays the CPU: nothing runs on a
TPU, and every number here is a compiler estimate, not a measurement (docs/tpu.md says what each
one means).

- `parse_target("v4-64")`: a gcloud accelerator type -> `Target` (chips, hosts, chip figures).
- `load_libtpu()`, `target_devices(target)`: the topology's compile-only devices.
- `lower_step(fn, target, args, ...)`: `parallel.compile_step` over all of the target's devices.
- `compile_report(lowered, target=...)` -> `Report`; `format_report([...])` prints one table;
  `fits(report)` and `does_not_fit_message(report)`.
- `first_fitting(variants)`, `search_batch(compile_at, lo, hi)`: the usual fixes, the largest batch.
- `hlo_has_layout_constraints(lowered)`: whether a CPU-only layout constraint is in a program.

A "device" is one JAX device: one chip on v4/v5p (megacore) and v5e/v6e (one TensorCore per chip),
one TensorCore (half a chip) on v2/v3. HBM, FLOPs and bytes are per device, per step.

Shape glossary: N = the target's number of devices (the global leading axis of per-device args).

Synopsis (on a CPU, with libtpu installed):

  import jax, jax.numpy as jnp
  from experiments.common import parallel
  from experiments.tools import tpu

  target = tpu.parse_target("v5litepod-4")            # 4 TPU v5e chips on 1 host
  B, D = 256, 1024
  def step(w, x):                                     # w replicated [D, D], x per device [B, D]
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * jax.lax.pmean(g, parallel.AXIS)
  lowered = tpu.lower_step(step, target, (jax.ShapeDtypeStruct((D, D), jnp.float32),
                                          jax.ShapeDtypeStruct((B, D), jnp.float32)),
                           state_in=(0,), out_axes=None)
  report = tpu.compile_report(lowered, target=target, name="mlp step",
                              analytic_flops_per_device=4 * B * D * D,   # forward + weight gradient
                              items_per_step=B * target.num_devices)
  print(tpu.format_report([report]))
  assert tpu.fits(report), tpu.does_not_fit_message(report)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib.metadata
import math
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import jax.extend
from jax.experimental import topologies

from experiments.common import chips
from experiments.common import errors
from experiments.common import parallel

GIB = 2 ** 30
INSTALL_HINT = "pip install -e '.[tpu]'"


class TpuError(errors.BadInput):
  """A TPU-compile problem; the message is one line that names the fix (the CLI exits 2 on it)."""


class TargetError(TpuError):
  """An unknown accelerator type, or one whose topology libtpu cannot build."""


class LibtpuMissingError(TpuError):
  """libtpu (the TPU compiler) cannot be found in this environment."""


class CompileError(TpuError):
  """The TPU compiler refused a program for a reason other than running out of HBM."""


class DoesNotFitError(TpuError):
  """A program needs more HBM per device than the target's chip has; `.report` has the numbers."""

  def __init__(self, report: "Report"):
    self.report = report
    super().__init__(does_not_fit_message(report))


# --------------------------------------------------------------------------------------------------
# Chips and slices.


# The chip figures live in experiments/common/chips.py (one table for the TPU compile and the MFU).
Chip = chips.Chip
CHIPS: Dict[str, Chip] = chips.TPU_CHIPS

# gcloud accelerator types: family -> {N: chip grid}. N counts TensorCores for v2, v3, v4 and v5p
# (2 per chip) and chips for v5litepod (v5e) and v6e. The grids are the Cloud TPU docs' shapes.
_V3D = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 512: "4x8x8",
        1024: "8x8x8"}
_LITE = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
SLICES: Dict[str, Dict[int, str]] = {
    "v2": {8: "2x2", 32: "4x4", 128: "8x8", 256: "8x16", 512: "16x16"},
    "v3": {8: "2x2", 32: "4x4", 64: "4x8", 128: "8x8", 256: "8x16", 512: "16x16", 1024: "16x32",
           2048: "32x32"},
    "v4": {**_V3D, 1536: "8x8x12", 2048: "8x8x16", 4096: "8x16x16"},
    "v5p": {**_V3D, 2048: "8x8x16", 4096: "8x16x16", 8192: "16x16x16", 12288: "16x16x24"},
    "v5litepod": dict(_LITE),
    "v6e": dict(_LITE),
}
_FAMILY_CHIP = {"v2": "v2", "v3": "v3", "v4": "v4", "v5p": "v5p", "v5litepod": "v5e", "v6e": "v6e"}
_ALIASES = {"v5e": "v5litepod"}
# Chips per host: 4 on every multi-host slice; v5e/v6e slices of up to 8 chips are one host.
_SINGLE_HOST_MAX_CHIPS = {"v5litepod": 8, "v6e": 8}


@dataclasses.dataclass(frozen=True)
class Target:
  """A Cloud TPU slice to compile for (from `parse_target`).

  Fields:
    name: the canonical gcloud accelerator type, e.g. "v4-64", "v5litepod-16".
    chip: the generation's `Chip`.
    chips: chips in the slice.
    hosts: TPU VM hosts (JAX processes).
    grid: the chip grid, e.g. "2x4x4".
    chips_per_host_bounds: the chips of one host as a (x, y, z) block of the grid.
  """
  name: str
  chip: Chip
  chips: int
  hosts: int
  grid: str
  chips_per_host_bounds: Tuple[int, int, int]

  @property
  def chips_per_host(self) -> int:
    return self.chips // self.hosts

  @property
  def num_devices(self) -> int:
    """JAX devices of the slice: the global leading axis of a pmapped step's per-device args."""
    return self.chips * self.chip.devices_per_chip

  @property
  def devices_per_host(self) -> int:
    return self.num_devices // self.hosts

  @property
  def device_noun(self) -> str:
    """What one JAX device is: "chip" (v4, v5e, v5p, v6e) or "TensorCore" (v2, v3)."""
    return "chip" if self.chip.devices_per_chip == 1 else "TensorCore"

  @property
  def topology(self) -> str:
    """libtpu's topology name, e.g. "v4:2x4x4"."""
    return f"{self.chip.libtpu_name}:{self.grid}"

  @property
  def hbm_bytes_per_device(self) -> float:
    """Published HBM per device (a v2/v3 TensorCore has half of its chip's)."""
    return self.chip.hbm_gib * GIB / self.chip.devices_per_chip

  @property
  def usable_hbm_bytes_per_device(self) -> float:
    """The HBM per device a program may use: the compiler's limit (measured, see `Chip`), or the
    published capacity where that is smaller (v5p: 95 GiB published of 96 physical, the rest being
    the runtime's; its compiler allows 95.74)."""
    return self.chip.usable_hbm_gib_per_device * GIB

  @property
  def peak_flops_per_device(self) -> float:
    return self.chip.peak_flops_per_device

  @property
  def hbm_bytes_per_s_per_device(self) -> float:
    return self.chip.hbm_bytes_per_s / self.chip.devices_per_chip

  def topology_kwargs(self) -> Dict[str, Any]:
    """Keyword arguments of `jax.experimental.topologies.get_topology_desc` for this slice."""
    kwargs: Dict[str, Any] = dict(platform="tpu", topology_name=self.topology,
                                  chips_per_host_bounds=self.chips_per_host_bounds, num_slices=1)
    if self.chip.megacore:
      kwargs["chip_config_name"] = "megacore"
    return kwargs

  def describe(self) -> str:
    """One line: chips, hosts, per-chip HBM, peak and bandwidth."""
    c = self.chip
    per = (f"; a JAX device is one TensorCore ({self.num_devices} devices)"
           if c.devices_per_chip > 1 else "")
    return (f"{self.name}: {self.chips} {c.device_kind} chips, {self.hosts} host"
            f"{'s' if self.hosts > 1 else ''} x {self.chips_per_host}{per}; per chip "
            f"{c.hbm_gib:g} GiB HBM at {c.hbm_bytes_per_s / 1e12:.2f} TB/s, "
            f"{c.peak_bf16_flops / 1e12:g} TFLOP/s bf16")


def valid_target_names() -> List[str]:
  """Every supported accelerator type, in order (v5e-N is also accepted for v5litepod-N)."""
  return [f"{family}-{n}" for family, sizes in SLICES.items() for n in sizes]


def _valid_summary() -> str:
  groups = [f"{family}-{{{','.join(str(n) for n in sizes)}}}" for family, sizes in SLICES.items()]
  return " ".join(groups) + " (v5e-N = v5litepod-N)"


def parse_target(name: str) -> Target:
  """A gcloud accelerator type ("v4-64", "v5litepod-16" or "v5e-16", "v5p-8", "v6e-8", "v2-8", ...)
  -> `Target`. Raises `TargetError` (one line with the valid types) for anything else."""
  text = str(name).strip().lower()
  m = re.fullmatch(r"(v2|v3|v4|v5p|v5e|v5litepod|v6e)-(\d+)", text)
  family = _ALIASES.get(m.group(1), m.group(1)) if m else None
  n = int(m.group(2)) if m else 0
  if family is None or n not in SLICES[family]:
    raise TargetError(f"unknown TPU type {name!r}; valid types: {_valid_summary()}")
  chip = CHIPS[_FAMILY_CHIP[family]]
  grid = SLICES[family][n]
  dims = [int(d) for d in grid.split("x")]
  chips = math.prod(dims)
  if family in _SINGLE_HOST_MAX_CHIPS and chips <= _SINGLE_HOST_MAX_CHIPS[family]:
    bounds = tuple(dims + [1] * (3 - len(dims)))
  else:
    bounds = (2, 2, 1)
  per_host = math.prod(bounds)
  return Target(name=f"{family}-{n}", chip=chip, chips=chips, hosts=chips // per_host, grid=grid,
                chips_per_host_bounds=bounds)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# libtpu and the topology's devices.

_libtpu_version: Optional[str] = None


@contextlib.contextmanager
def _native_output_captured() -> Iterator[List[str]]:
  """Sends what native code writes to file descriptors 1 and 2 into a buffer for the duration.

  libtpu prints warnings about the missing TPU environment (worker hostnames, accelerator type)
  straight to the process's stdout/stderr when it initialises; they mean nothing for a compile-only
  topology. The yielded list receives the captured text when the block ends.
  """
  sys.stdout.flush()
  sys.stderr.flush()
  saved = (os.dup(1), os.dup(2))
  captured: List[str] = []
  with tempfile.TemporaryFile() as tmp:
    try:
      os.dup2(tmp.fileno(), 1)
      os.dup2(tmp.fileno(), 2)
      yield captured
    finally:
      try:
        ctypes.CDLL(None).fflush(None)     # C stdio buffers of the library, before fds go back
      except (OSError, AttributeError):
        pass
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      os.close(saved[0])
      os.close(saved[1])
      tmp.seek(0)
      captured.append(tmp.read().decode("utf-8", errors="replace"))


def _first_line(text: str) -> str:
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  return lines[0] if lines else ""


def load_libtpu() -> str:
  """Makes libtpu's TPU compiler available to JAX in this (CPU) process; returns libtpu's version.

  Uses TPU_LIBRARY_PATH when it names a file, else the `libtpu` package (which sets it). Loads the
  library by building a 4-chip v4 topology once, with libtpu's start-up warnings silenced, and
  with ALLOW_MULTIPLE_LIBTPU_LOAD=1 (unless set): libtpu's one-process-per-machine lock is for the
  chips, which a compile touches not. JAX's own backend is untouched: run with JAX_PLATFORMS=cpu
  (the trainers' --dry_run sets it) so that JAX does not also try to start a TPU runtime. Raises
  `LibtpuMissingError` (one line: how to install it).
  """
  global _libtpu_version
  if _libtpu_version is not None:
    return _libtpu_version
  # libtpu lets one process per machine load it (/tmp/libtpu_lockfile), for the TPU chips' sake. A
  # compile-only load touches no chip; without this, any other JAX process that tried a TPU backend
  # (one run without JAX_PLATFORMS=cpu), or a second compiling process, would make the load fail.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  path = os.environ.get("TPU_LIBRARY_PATH", "")
  version = None
  if not os.path.isfile(path):
    try:
      import libtpu  # pylint: disable=g-import-not-at-top  (optional dependency)
    except ImportError as e:
      raise LibtpuMissingError(
          f"compiling for a TPU needs libtpu (the TPU compiler), which is not installed: "
          f"{INSTALL_HINT}") from e
    os.environ["TPU_LIBRARY_PATH"] = libtpu.get_library_path()
  try:
    version = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    version = f"unknown version at {os.environ['TPU_LIBRARY_PATH']}"
  probe = parse_target("v4-8")
  try:
    with _native_output_captured() as out:
      topologies.get_topology_desc(**probe.topology_kwargs())
  except Exception as e:  # pylint: disable=broad-except  (any loader failure gets the same hint)
    detail = _first_line(str(e)) or _first_line("".join(out))
    raise LibtpuMissingError(f"libtpu at {os.environ['TPU_LIBRARY_PATH']} did not load ({detail}); "
                             f"reinstall it: {INSTALL_HINT}") from e
  _libtpu_version = version
  return version


def libtpu_version() -> str:
  """The loaded libtpu's version (loads it first)."""
  return load_libtpu()


@functools.lru_cache(maxsize=None)
def _topology_devices(target: Target) -> Tuple[Any, ...]:
  version = load_libtpu()
  try:
    with _native_output_captured():
      devices = tuple(topologies.get_topology_desc(**target.topology_kwargs()).devices)
  except Exception as e:  # pylint: disable=broad-except  (libtpu's refusals are JaxRuntimeErrors)
    raise TargetError(f"libtpu {version} cannot build the topology of {target.name} "
                      f"({target.topology}, chips per host {target.chips_per_host_bounds}): "
                      f"{_first_line(str(e))}") from e
  hosts = {d.process_index for d in devices}
  if len(devices) != target.num_devices or len(hosts) != target.hosts:
    raise TargetError(f"libtpu {version} built {len(devices)} devices on {len(hosts)} hosts for "
                      f"{target.name}, expected {target.num_devices} on {target.hosts}")
  return devices


def target_devices(target: Target) -> List[Any]:
  """The slice's compile-only TPU devices in topology order (`.process_index`: host 0..hosts-1)."""
  return list(_topology_devices(target))


def lower_step(fn: Callable[..., Any], target: Target, args: Sequence[Any], *,
               rules: parallel.Rules = parallel.REPLICATED, state_in: Sequence[int] = (),
               out_axes: Any = 0, donate_argnums: Sequence[int] = (),
               blocks: bool = False) -> jax.stages.Lowered:
  """Lowers `parallel.compile_step(fn, rules, ...)` over ALL of the target's devices.

  Args:
    fn: the per-device step, as for `parallel.compile_step`.
    target: the slice.
    args: one pytree of `jax.ShapeDtypeStruct` (or arrays) per argument of `fn`: the PER-DEVICE
      shapes; a leading axis of the mesh's rows (devices, or data groups under a model axis) is
      added to every argument not in `state_in` (the layout of the pod's global step).
    rules, state_in, out_axes, donate_argnums, blocks: as for `parallel.compile_step`.
  """
  devices = target_devices(target)
  n = len(devices) // rules.model_parallel

  def with_device_axis(x):
    return jax.ShapeDtypeStruct((n,) + tuple(x.shape), x.dtype)

  global_args = [a if i in state_in else jax.tree.map(with_device_axis, a)
                 for i, a in enumerate(args)]
  step = parallel.compile_step(fn, rules, state_in=state_in, out_axes=out_axes,
                               donate_argnums=donate_argnums, devices=devices, blocks=blocks)
  return step.lower(*global_args)


# --------------------------------------------------------------------------------------------------
# HLO inspection.

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


def _count_while_loops(hlo_text: str) -> int:
  return len(re.findall(r"\swhile\(", hlo_text))


# --------------------------------------------------------------------------------------------------
# Loop-aware FLOPs and bytes.
#
# The compiler's cost analysis counts a while loop's body once, not once per trip. The loops of a
# podlab program are `lax.scan`s in its jaxpr (scans, and `fori_loop`s with static bounds, which JAX
# turns into scans): each has a static trip count. Each loop body is compiled once as its own
# program (pmapped over the same devices, so its collectives compile), and
#   loop-aware cost(P) = compiled cost(P) + sum over the loops L of P (outermost first):
#                        trips(L) x loop-aware cost(body L) - counted(L) x compiled cost(body L)
# where counted(L) is the trips the compiled P already holds (1; `unroll` copies when unrolled).


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


def per_device_jaxpr(fn: Callable[..., Any], target: Target, args: Sequence[Any]) -> Any:
  """The jaxpr of the per-device step `fn` at the PER-DEVICE `args` (as for `lower_step`), with the
  data axis bound to the slice's device count: what `loop_aware_cost` reads the loops from."""
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


def _compile_jaxpr(closed: Any, target: Target) -> Any:
  fun = jax.extend.core.jaxpr_as_fun(closed)
  avals = tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars)
  lowered = lower_step(lambda xs: fun(*xs), target, (avals,))
  with _native_output_captured():
    return lowered.compile()


def loop_aware_cost(jaxpr: Any, compiled: Any, target: Target) -> LoopAwareCost:
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
    found = _count_while_loops(compiled_text)
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


# --------------------------------------------------------------------------------------------------
# Reports.


TIGHT_MARGIN = 0.05
"""A fitting program whose compiler peak leaves less than this share of usable HBM free is "tight"."""


@dataclasses.dataclass
class Report:
  """The TPU compiler's view of one program on one target, per device and per step.

  Filled by `compile_report`. Byte and FLOP fields are None when the program did not compile (it ran
  out of HBM: then `oom_need_bytes` is what the compiler said it needs, when it said). `loop_*` are
  the loop-aware counts (`loop_aware_cost`), None when not computed.
  """
  name: str
  target: Target
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
  loops: Tuple[Loop, ...] = ()
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


def compile_report(program: Any, *, target: Target, name: str = "program",
                   analytic_flops_per_device: Optional[float] = None,
                   items_per_step: Optional[float] = None, item_name: str = "examples",
                   compile_s: Optional[float] = None, jaxpr: Any = None,
                   breakdown: bool = False) -> Report:
  """Compiles a program for `target` (or reads an already compiled one) into a `Report`.

  Args:
    program: a `jax.stages.Lowered` for the target's devices (compiled and timed here), or its
      `jax.stages.Compiled` (then pass `compile_s` if known).
    target: the slice the program was lowered for.
    name: the program's row name in `format_report`.
    analytic_flops_per_device: the model's FLOPs per device per step, counted by hand (for MFU, and
      the compute bound when larger than the compiler's count).
    items_per_step: examples (or tokens...) of the GLOBAL batch per step, for items/s at the bound.
    item_name: what an item is ("examples", "tokens").
    compile_s: compile time of an already compiled program.
    jaxpr: the program's `per_device_jaxpr`: its loops are counted trip by trip
      (`loop_aware_cost`); without it a program with loops keeps the compiler's one-trip counts,
      marked `*` in the table.
    breakdown: also split the bytes per operation of the optimized HLO (`report.breakdown`,
      experiments/tools/hlo_bytes.py).

  A program that runs out of HBM gives a Report with `compiled=False` (and `fits` False); any other
  compiler refusal raises `CompileError` with the compiler's first line.
  """
  version = load_libtpu()
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
            else _native_output_captured()):
        compiled = program.compile()
    except jax.errors.JaxRuntimeError as e:
      message = str(e)
      if "RESOURCE_EXHAUSTED" not in message:
        raise CompileError(f"{name}: the TPU compiler (libtpu {version}) refused it for "
                           f"{target.name}: {_first_line(message)}") from e
      need, _ = parse_oom(message)
      return Report(compiled=False, compile_s=time.perf_counter() - t0, oom_need_bytes=need,
                    compiler_message=_first_line(message), layout_constraints=layout, **common)
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
  report = Report(
      compiled=True, compile_s=compile_s,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      peak_bytes=int(getattr(mem, "peak_memory_in_bytes", 0) or 0),
      compiler_flops=cost.get("flops"), compiler_bytes_accessed=cost.get("bytes accessed"),
      cost_model_raw_s=cost.get("optimal_seconds"),
      while_loops=_count_while_loops(text), layout_constraints=layout, **common)
  if breakdown:
    # Loaded on use: a dry run never reads HLO text operation by operation.
    from experiments.tools import hlo_bytes  # pylint: disable=g-import-not-at-top
    report.breakdown = hlo_bytes.breakdown(text)
  if jaxpr is not None:
    counted = loop_aware_cost(jaxpr, compiled, target)
    report.loop_flops, report.loop_bytes = counted.cost.flops, counted.cost.bytes
    report.loop_cost_model_s, report.loops = counted.cost.seconds, counted.loops
    report.loop_note = counted.note
  return report


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
      f"usable - peak; 'tight' under {100 * TIGHT_MARGIN:.0f}%). Bounds: compute = FLOPs (the larger "
      "of the analytic and the compiler's count) / peak FLOP/s, memory = bytes accessed / HBM "
      "bandwidth; the bound is the larger, a LOWER bound on the step time, so speed and MFU are "
      "upper bounds. Loops are counted trip by trip (each loop body compiled once). Neither bound "
      "counts the host input pipeline or the collectives' ICI time.")
  if any(not r.loop_aware and r.compiled for r in reports):
    lines.append("*: the program has while loops that were not counted trip by trip; the compiler "
                 "counts each loop body once, so these FLOPs, bytes and bounds are undercounts.")
  lines.extend(notes)
  return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Searches.


@dataclasses.dataclass
class Variant:
  """One candidate fix tried by `first_fitting`: its label, the flags that select it, its report."""
  label: str
  flags: str
  report: Report


def first_fitting(variants: Sequence[Tuple[str, str, Callable[[], Report]]]
                  ) -> Tuple[Optional[Variant], List[Variant]]:
  """Compiles `(label, flags_to_copy, compile_fn)` variants in order until one fits.

  Returns (the first that fits or None, every variant tried with its report), e.g. variants
  [("as configured", "", f0), ("remat", "--config.remat=True", f1), ("half batch", "...", f2)].
  """
  tried: List[Variant] = []
  for label, flags, compile_fn in variants:
    variant = Variant(label, flags, compile_fn())
    tried.append(variant)
    if variant.report.fits:
      return variant, tried
  return None, tried


def format_variants(tried: Sequence[Variant]) -> str:
  """One line per tried variant: HBM need per device against usable, fits, the flags to copy."""
  lines = []
  for v in tried:
    r = v.report
    need = r.need_bytes
    need_text = "?" if need is None else f"{need / GIB:.2f} GiB"
    if not r.compiled and need is not None:
      need_text = ">=" + need_text
    verdict = "fits" if r.fits else "does not fit"
    flags = f": {v.flags}" if v.flags else ""
    usable = r.target.usable_hbm_bytes_per_device / GIB
    lines.append(f"  {v.label}: {need_text} of {usable:.2f} GiB per {r.target.device_noun}, "
                 f"{verdict}{flags}")
  return "\n".join(lines)


@dataclasses.dataclass
class BatchSearch:
  """`search_batch`'s result: the largest fitting batch (None if even `lo` does not fit), its
  report, and every (batch, report) compiled on the way."""
  batch: Optional[int]
  report: Optional[Report]
  tried: List[Tuple[int, Report]]


def search_batch(compile_at: Callable[[int], Report], lo: int, hi: int,
                 multiple_of: int = 1) -> BatchSearch:
  """The largest per-device batch in [lo, hi] (a multiple of `multiple_of`) whose program fits.

  Assumes that a batch fits when a larger one does (HBM grows with the batch). Probes lo and hi,
  then alternates a linear interpolation of the HBM need between the bracket's ends (memory is close
  to linear in the batch, so it usually lands next to the answer) with bisection (which bounds the
  number of compiles by log2 of the range).
  """
  m = int(multiple_of)
  if m < 1:
    raise ValueError(f"multiple_of must be >= 1, got {multiple_of}")
  lo = -(-int(lo) // m) * m
  hi = int(hi) // m * m
  if lo < m or hi < lo:
    raise ValueError(f"no multiple of {m} in the batch range [{lo}, {hi}]")
  tried: List[Tuple[int, Report]] = []

  def probe(b: int) -> Report:
    r = compile_at(b)
    tried.append((b, r))
    return r

  good_r = probe(lo)
  if not good_r.fits:
    return BatchSearch(None, None, tried)
  good = lo
  if hi == lo:
    return BatchSearch(lo, good_r, tried)
  bad_r = probe(hi)
  if bad_r.fits:
    return BatchSearch(hi, bad_r, tried)
  bad = hi
  interpolate = True
  while bad - good > m:
    b = None
    limit = good_r.target.usable_hbm_bytes_per_device
    n_good, n_bad = good_r.need_bytes, bad_r.need_bytes
    if interpolate and n_good is not None and n_bad is not None and n_bad > n_good:
      slope = (n_bad - n_good) / (bad - good)
      b = int((good + (limit - n_good) / slope) // m * m)
      b = min(max(b, good + m), bad - m)
    if b is None:
      b = (good + bad) // 2 // m * m
      b = min(max(b, good + m), bad - m)
    interpolate = not interpolate
    r = probe(b)
    if r.fits:
      good, good_r = b, r
    else:
      bad, bad_r = b, r
  return BatchSearch(good, good_r, tried)
