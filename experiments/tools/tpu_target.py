"""Cloud TPU slices to compile for on a CPU-only machine: accelerator types, libtpu, the devices.

PyPI's `libtpu` (podlab's optional extra `tpu`: `pip install -e '.[tpu]'`) holds the TPU compiler.
JAX builds a TPU topology from it with no TPU present (`jax.experimental.topologies.
get_topology_desc`): compile-only devices laid out on the slice's hosts. A pmapped step lowered over
ALL of a slice's devices (global leading axis = number of devices) compiles with the compiler the
pod runs. The host backend stays the CPU: nothing runs on a TPU.

- `parse_target("v4-64")`: a gcloud accelerator type -> `Target` (chips, hosts, chip figures);
  `valid_target_names()`.
- `load_libtpu()`, `target_devices(target)`: the topology's compile-only devices.
- `lower_step(fn, target, args, ...)`: `parallel.compile_step` over all of the target's devices.

The rest of the TPU compile: `tpu_compile.compile_report` (a program's `tpu_report.Report`; its
docstring has a synopsis that runs), `tpu_cost` (loops counted trip by trip), `tpu_report` (the
verdicts and the table), `tpu_fit` (the fixes tried and the batch search); docs/tpu.md says what
each estimate means.

A "device" is one JAX device: one chip on v4/v5p (megacore) and v5e/v6e (one TensorCore per chip),
one TensorCore (half a chip) on v2/v3. HBM is per device.

Shape glossary: N = the target's number of devices (the global leading axis of per-device args).
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
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
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
# libtpu, the topology's devices, and a step lowered over them.

_libtpu_version: Optional[str] = None


@contextlib.contextmanager
def native_output_captured() -> Iterator[List[str]]:
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


def first_line(text: str) -> str:
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
    with native_output_captured() as out:
      topologies.get_topology_desc(**probe.topology_kwargs())
  except Exception as e:  # pylint: disable=broad-except  (any loader failure gets the same hint)
    detail = first_line(str(e)) or first_line("".join(out))
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
    with native_output_captured():
      devices = tuple(topologies.get_topology_desc(**target.topology_kwargs()).devices)
  except Exception as e:  # pylint: disable=broad-except  (libtpu's refusals are JaxRuntimeErrors)
    raise TargetError(f"libtpu {version} cannot build the topology of {target.name} "
                      f"({target.topology}, chips per host {target.chips_per_host_bounds}): "
                      f"{first_line(str(e))}") from e
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
