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
- `lower_pmap(fn, target, args, ...)`: `parallel.pmap_step` over all of the target's devices.
- `compile_report(lowered, target=...)` -> `Report`; `format_report([...])` prints one table;
  `fits(report)` and `does_not_fit_message(report)`.
- `first_fitting(variants)`, `search_batch(compile_at, lo, hi)`: the usual fixes, the largest batch.
- `hlo_has_layout_constraints(lowered)`: whether a CPU-only layout constraint is in a program.

A "device" is one JAX device: one chip on v4/v5p (megacore) and v5e/v6e (one TensorCore per chip),
one TensorCore (half a chip) on v2/v3. HBM, FLOPs and bytes are per device, per step.

Shape glossary: N = the target's number of devices (the global leading axis of per-device args).

Synopsis (on a CPU, with libtpu installed):

  import jax, jax.numpy as jnp
  from experiments.common import parallel, tpu

  target = tpu.parse_target("v5litepod-4")            # 4 TPU v5e chips on 1 host
  B, D = 256, 1024
  def step(w, x):                                     # w replicated [D, D], x per device [B, D]
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * jax.lax.pmean(g, parallel.AXIS)
  lowered = tpu.lower_pmap(step, target, (jax.ShapeDtypeStruct((D, D), jnp.float32),
                                          jax.ShapeDtypeStruct((B, D), jnp.float32)),
                           replicated_in=(0,), out_axes=None)
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
from jax.experimental import topologies

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


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's per-chip figures (docs/tpu.md lists their sources).

  Fields:
    generation: "v2", "v3", "v4", "v5e", "v5p" or "v6e".
    device_kind: `jax.Device.device_kind` of the topology's devices, e.g. "TPU v5 lite".
    libtpu_name: the generation's name in a libtpu topology string ("v5e" in "v5e:4x4").
    devices_per_chip: JAX devices per chip: 2 on v2/v3 (one per TensorCore); 1 on v4/v5p (megacore:
      the two TensorCores are one device) and on v5e/v6e (one TensorCore).
    megacore: the topology is built with chip_config_name="megacore" (v4, v5p).
    hbm_gib: published HBM per chip, GiB.
    peak_bf16_flops: published peak bf16 FLOP/s per chip.
    hbm_bytes_per_s: published HBM bandwidth per chip, bytes/s.
    compiler_hbm_gib: HBM per DEVICE that libtpu 0.0.42's compiler lets a program use, GiB (what it
      prints as "available HBM" when a program does not fit; measured, docs/tpu.md).
  """
  generation: str
  device_kind: str
  libtpu_name: str
  devices_per_chip: int
  megacore: bool
  hbm_gib: float
  peak_bf16_flops: float
  hbm_bytes_per_s: float
  compiler_hbm_gib: float


CHIPS: Dict[str, Chip] = {
    "v2": Chip("v2", "TPU v2", "v2", 2, False, 16, 46e12, 700e9, 7.48),
    "v3": Chip("v3", "TPU v3", "v3", 2, False, 32, 123e12, 900e9, 15.48),
    "v4": Chip("v4", "TPU v4", "v4", 1, True, 32, 275e12, 1200e9, 30.75),
    "v5e": Chip("v5e", "TPU v5 lite", "v5e", 1, False, 16, 197e12, 819e9, 15.75),
    "v5p": Chip("v5p", "TPU v5", "v5p", 1, True, 95, 459e12, 2765e9, 95.74),
    "v6e": Chip("v6e", "TPU v6 lite", "v6e", 1, False, 32, 918e12, 1638e9, 31.25),
}

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
    return min(self.chip.compiler_hbm_gib * GIB, self.hbm_bytes_per_device)

  @property
  def peak_flops_per_device(self) -> float:
    return self.chip.peak_bf16_flops / self.chip.devices_per_chip

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


def lower_pmap(fn: Callable[..., Any], target: Target, args: Sequence[Any], *,
               replicated_in: Sequence[int] = (), out_axes: Any = 0,
               donate_argnums: Sequence[int] = ()) -> jax.stages.Lowered:
  """Lowers `parallel.pmap_step(fn, ...)` over ALL of the target's devices.

  Args:
    fn: the per-device step, as for `parallel.pmap_step`.
    target: the slice.
    args: one pytree of `jax.ShapeDtypeStruct` (or arrays) per argument of `fn`: the PER-DEVICE
      shapes; a leading axis of length `target.num_devices` is added to every argument not in
      `replicated_in` (the layout of the pod's global step).
    replicated_in, out_axes, donate_argnums: as for `parallel.pmap_step`.
  """
  devices = target_devices(target)
  n = len(devices)

  def with_device_axis(x):
    return jax.ShapeDtypeStruct((n,) + tuple(x.shape), x.dtype)

  global_args = [a if i in replicated_in else jax.tree.map(with_device_axis, a)
                 for i, a in enumerate(args)]
  step = parallel.pmap_step(fn, replicated_in=replicated_in, out_axes=out_axes,
                            donate_argnums=donate_argnums, devices=devices)
  return step.lower(*global_args)


# --------------------------------------------------------------------------------------------------
# HLO inspection.

_LAYOUT_CONSTRAINT = re.compile(
    r'custom_call\s*@LayoutConstraint|custom_call_target\s*=\s*"LayoutConstraint"')


def hlo_has_layout_constraints(program: Any) -> bool:
  """True when the program pins an array's memory layout (`jax.experimental.layout.
  with_layout_constraint`, e.g. the CPU-only weight-gradient trick of `modules.layers.matmul(
  fast_grad=True)`, which only a CPU target may carry).

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


@dataclasses.dataclass
class Report:
  """The TPU compiler's view of one program on one target, per device and per step.

  Filled by `compile_report`. Byte and FLOP fields are None when the program did not compile (it ran
  out of HBM: then `oom_need_bytes` is what the compiler said it needs, when it said).
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

  @property
  def need_bytes(self) -> Optional[int]:
    """HBM per device the program needs: the larger of the compiler's peak and arguments + outputs -
    aliased (donated) + temporaries; for a program that did not compile, the compiler's figure."""
    if not self.compiled:
      return self.oom_need_bytes
    total = self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
    return max(total, self.peak_bytes or 0)

  @property
  def fits(self) -> bool:
    need = self.need_bytes
    return self.compiled and need is not None and need <= self.target.usable_hbm_bytes_per_device

  @property
  def cost_model_s(self) -> Optional[float]:
    """The cost model's step time (`optimal_seconds`); None unless a positive finite number."""
    t = self.cost_model_raw_s
    return t if t is not None and math.isfinite(t) and t > 0 else None

  @property
  def flops(self) -> Optional[float]:
    """FLOPs per device per step used for the estimates: the analytic count when given (the compiler
    counts a while loop's body once, not once per trip), else the compiler's."""
    return self.analytic_flops if self.analytic_flops is not None else self.compiler_flops

  @property
  def flops_source(self) -> str:
    return "analytic" if self.analytic_flops is not None else "compiler"

  @property
  def roofline_s(self) -> Optional[float]:
    """max(FLOPs / peak, bytes accessed / HBM bandwidth), per device: a lower bound on the step."""
    if self.flops is None or self.compiler_bytes_accessed is None:
      return None
    t = self.target
    return max(self.flops / t.peak_flops_per_device,
               self.compiler_bytes_accessed / t.hbm_bytes_per_s_per_device)

  @property
  def step_basis(self) -> Optional[str]:
    """"cost model" when its time is valid and the program has no while loop (whose body it counts
    once), else "roofline"."""
    if self.cost_model_s is not None and self.while_loops == 0:
      return "cost model"
    return "roofline" if self.roofline_s is not None else None

  @property
  def step_s(self) -> Optional[float]:
    return self.cost_model_s if self.step_basis == "cost model" else self.roofline_s

  @property
  def items_per_s(self) -> Optional[float]:
    if self.items_per_step is None or not self.step_s:
      return None
    return self.items_per_step / self.step_s

  @property
  def mfu(self) -> Optional[float]:
    """FLOPs / (step time x peak): model FLOP utilisation at the predicted step time (an upper bound
    when the step time is the roofline)."""
    if self.flops is None or not self.step_s:
      return None
    return self.flops / (self.step_s * self.target.peak_flops_per_device)

  def chip_hours(self, steps: int) -> Optional[float]:
    """Chip-hours of `steps` steps at the predicted step time."""
    return None if self.step_s is None else steps * self.step_s * self.target.chips / 3600


def fits(report: Report) -> bool:
  """True when the program compiled and its HBM need is within what the compiler allows a device."""
  return report.fits


def does_not_fit_message(report: Report) -> str:
  """One line naming the program, target, chip, its capacity and the need."""
  t = report.target
  need = report.need_bytes
  need_text = "more than it has" if need is None else f"{need / GIB:.2f} GiB"
  return (f"{report.name} does not fit on {t.name}: it needs {need_text} of HBM per "
          f"{t.chip.device_kind} {t.device_noun}, which has {t.hbm_bytes_per_device / GIB:g} GiB "
          f"({t.usable_hbm_bytes_per_device / GIB:.2f} GiB usable)")


def compile_report(program: Any, *, target: Target, name: str = "program",
                   analytic_flops_per_device: Optional[float] = None,
                   items_per_step: Optional[float] = None, item_name: str = "examples",
                   compile_s: Optional[float] = None) -> Report:
  """Compiles a program for `target` (or reads an already compiled one) into a `Report`.

  Args:
    program: a `jax.stages.Lowered` for the target's devices (compiled and timed here), or its
      `jax.stages.Compiled` (then pass `compile_s` if known).
    target: the slice the program was lowered for.
    name: the program's row name in `format_report`.
    analytic_flops_per_device: the model's FLOPs per device per step, counted by hand (used for the
      step time and MFU instead of the compiler's count, which sees each loop body once).
    items_per_step: examples (or tokens...) of the GLOBAL batch per step, for the predicted items/s.
    item_name: what an item is ("examples", "tokens").
    compile_s: compile time of an already compiled program.

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
  return Report(
      compiled=True, compile_s=compile_s,
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      peak_bytes=int(getattr(mem, "peak_memory_in_bytes", 0) or 0),
      compiler_flops=cost.get("flops"), compiler_bytes_accessed=cost.get("bytes accessed"),
      cost_model_raw_s=cost.get("optimal_seconds"),
      while_loops=_count_while_loops(compiled.as_text()), layout_constraints=layout, **common)


def _gib(x: Optional[float]) -> str:
  return "-" if x is None else f"{x / GIB:.2f}"


def _time(t: Optional[float]) -> str:
  if t is None:
    return "-"
  return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _count(x: float) -> str:
  return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def format_report(reports: Sequence[Report]) -> str:
  """One table, one row per program, with the targets above it and the caveats below."""
  if not reports:
    return "no programs compiled"
  versions = sorted({r.libtpu_version for r in reports})
  lines = [f"TPU compile with libtpu {', '.join(versions)}: COMPILER ESTIMATES (the TPU compiler's "
           f"memory assignment and cost model), not measurements. Per device, per step."]
  seen = []
  for r in reports:
    if r.target.name not in seen:
      seen.append(r.target.name)
      lines.append("  " + r.target.describe())
  header = ["program", "target", "args GiB", "out", "donated", "temp", "total", "usable", "fits",
            "compile", "TFLOP compiler", "TFLOP analytic", "GB accessed", "step: cost model",
            "roofline", "predicted", "MFU"]
  rows = [header]
  notes: List[str] = []
  for r in reports:
    need = r.need_bytes
    usable = r.target.usable_hbm_bytes_per_device
    if r.compiled:
      fit = f"{'yes' if r.fits else 'NO'} {100 * need / usable:.0f}%"
    else:
      fit = "NO"
    total = _gib(need) if r.compiled else (f">={_gib(need)}" if need is not None else "?")
    loop_mark = "*" if r.while_loops else ""
    cflops = "-" if r.compiler_flops is None else f"{r.compiler_flops / 1e12:.4g}{loop_mark}"
    aflops = "-" if r.analytic_flops is None else f"{r.analytic_flops / 1e12:.4g}"
    gb = ("-" if r.compiler_bytes_accessed is None
          else f"{r.compiler_bytes_accessed / 1e9:.4g}{loop_mark}")
    if r.cost_model_s is not None:
      cm = _time(r.cost_model_s) + loop_mark
    elif r.cost_model_raw_s is not None:
      cm = f"invalid ({r.cost_model_raw_s:.3g})"
    else:
      cm = "-"
    items = "-" if r.items_per_s is None else f"{_count(r.items_per_s)} {r.item_name}/s"
    if r.mfu is None:
      mfu = "-"
    else:
      mfu = f"{'<=' if r.step_basis == 'roofline' else ''}{100 * r.mfu:.0f}%"
    rows.append([r.name, r.target.name, _gib(r.argument_bytes), _gib(r.output_bytes),
                 _gib(r.alias_bytes), _gib(r.temp_bytes), total, f"{usable / GIB:.2f}", fit,
                 "-" if r.compile_s is None else f"{r.compile_s:.1f} s", cflops, aflops, gb, cm,
                 _time(r.roofline_s), items, mfu])
    if not r.compiled:
      notes.append(f"{r.name}: {does_not_fit_message(r)}. Compiler: {r.compiler_message}")
    elif not r.fits:
      notes.append(f"{r.name}: {does_not_fit_message(r)}")
    if r.layout_constraints:
      notes.append(f"{r.name}: the program pins array layouts (LayoutConstraint custom calls), "
                   "e.g. a CPU-only matmul path: switch it off for a TPU target")
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  for k, row in enumerate(rows):
    lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    if k == 0:
      lines.append("  ".join("-" * w for w in widths))
  lines.append("HBM: arguments + outputs - donated (aliased) + temporaries, or the compiler's peak "
               "if larger; usable = the compiler's limit per device (or the published HBM if "
               "smaller). Step: the cost model's time when valid and the program is loop-free, "
               "else the roofline max(FLOPs / peak, bytes / HBM bandwidth) with the analytic FLOPs "
               "when given (MFU then an upper bound); neither counts the host input pipeline.")
  if any(r.while_loops for r in reports):
    lines.append("*: the program has while loops; the compiler counts each loop body once, not "
                 "once per trip, so these FLOPs, bytes and cost-model times are undercounts.")
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
