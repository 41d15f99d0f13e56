"""Where a run's examples go: every global, per-host and per-device batch figure comes from here.

`batch_layout(config)` reads the shared run fields (`global_batch_size`, `grad_accum`, `num_devices`,
`devices_per_host`) and the machine (this run's JAX devices, or the devices of a compile target) and
returns a `BatchLayout`, checking that the numbers divide. The trainer, the data iterators, the dry
run and the TPU compile all take their figures from it.

Glossary: a *micro-step* feeds `global_batch` examples (all devices of all hosts) through forward
and backward; an *update* (optimizer step) accumulates `accum` micro-steps.

Synopsis:

  import ml_collections
  from experiments.common import layout
  c = ml_collections.ConfigDict(dict(global_batch_size=768, grad_accum=1, num_devices=32,
                                     devices_per_host=4))
  l = layout.batch_layout(c, devices=32, devices_per_host=4, platform="tpu")   # a v4-64
  (l.hosts, l.per_host_batch, l.per_device_batch)                              # (8, 96, 24)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax

from experiments.common import errors


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """The batch of one micro-step, split over hosts and devices."""
  global_batch: int          # examples per micro-step, all devices of all hosts
  accum: int                 # micro-steps per update (gradient accumulation)
  devices: int               # JAX devices of the run (all hosts)
  hosts: int                 # processes
  devices_per_host: int      # JAX devices per process
  process_index: int         # this process
  platform: str              # the platform the program is compiled for: "cpu", "tpu", "gpu"
  cpu_tuning: bool = False   # CPU-only speed-ups are on (config.cpu_tuning and platform == "cpu")

  @property
  def per_host_batch(self) -> int:
    return self.global_batch // self.hosts

  @property
  def per_device_batch(self) -> int:
    return self.global_batch // self.devices

  @property
  def examples_per_update(self) -> int:
    return self.global_batch * self.accum

  @property
  def first_device(self) -> int:
    """Global index of this process's first device."""
    return self.process_index * self.devices_per_host

  def describe(self) -> str:
    accum = f" x {self.accum} accumulation steps" if self.accum > 1 else ""
    return (f"global batch {self.global_batch}{accum} = {self.hosts} host(s) x "
            f"{self.devices_per_host} {self.platform} device(s) x {self.per_device_batch}")


def batch_layout(config: Any, *, devices: Optional[int] = None,
                 devices_per_host: Optional[int] = None, process_index: Optional[int] = None,
                 platform: Optional[str] = None, check_num_devices: bool = True,
                 target: Optional[str] = None) -> BatchLayout:
  """The layout of `config` on this run's devices, or on the ones given (dry runs, TPU targets).

  Raises errors.ConfigError naming the field, the value and the fix when the config was written for
  another device count (config.num_devices > 0 and `check_num_devices`) or when the batch does not
  divide over the devices. `target` (a TPU type such as "v4-64", for the devices given) words the
  errors for that slice and also checks config.devices_per_host (> 0: the per-host data layout the
  config is written for) against the slice's chips per host.
  """
  if devices is None:
    devices = jax.device_count()
  if devices_per_host is None:
    devices_per_host = jax.local_device_count()
  if process_index is None:
    process_index = jax.process_index() if devices == jax.device_count() else 0
  if platform is None:
    platform = jax.devices()[0].platform
  batch = int(config.global_batch_size)
  accum = int(config.get("grad_accum", 1))
  if batch <= 0:
    raise errors.ConfigError("global_batch_size", batch, "must be positive", "use e.g. 768")
  if accum <= 0:
    raise errors.ConfigError("grad_accum", accum, "must be positive", "use 1 (no accumulation)")
  if devices % devices_per_host:
    raise errors.ConfigError("devices_per_host", devices_per_host,
                             f"does not divide the {devices} devices", "set the pod's chips per host")
  hosts = devices // devices_per_host
  slice_ = f"{target} ({hosts} hosts x {devices_per_host})" if target else ""
  wanted = int(config.get("num_devices", -1))
  if target and check_num_devices and wanted > 0 and wanted != devices:
    raise errors.ConfigError(
        "num_devices", wanted,
        f"the config is written for {wanted} devices but {target} has {devices} ({hosts} hosts x "
        f"{devices_per_host})",
        f"pass --config.num_devices={devices} (and a global_batch_size it divides), or the --target "
        f"with {wanted} devices")
  per_host_wanted = int(config.get("devices_per_host", -1))
  if target and per_host_wanted > 0 and per_host_wanted != devices_per_host:
    raise errors.ConfigError(
        "devices_per_host", per_host_wanted,
        f"the config's per-host data layout is written for {per_host_wanted} devices per host but "
        f"{target} has {devices_per_host} chips per host ({hosts} host(s))",
        f"pass --config.devices_per_host={devices_per_host}, or a --target with "
        f"{per_host_wanted} chips per host")
  if check_num_devices and wanted > 0 and wanted != devices:
    raise errors.ConfigError(
        "num_devices", wanted,
        f"this config is written for {wanted} JAX devices but this run has {devices} ({hosts} "
        f"process(es) x {devices_per_host} {platform} device(s))",
        f"run it on a matching slice, or override with --config.num_devices={devices} (check "
        f"global_batch_size={batch} too), or compile it here with --dry_run")
  if batch % devices:
    raise errors.ConfigError(
        "global_batch_size", batch,
        f"not divisible by the {devices} devices" + (f" of {slice_}" if target else ""),
        f"use a multiple of {devices}, e.g. "
        + ("--config.global_batch_size=" if target else "")
        + f"{max(devices, batch // devices * devices)}")
  cpu_tuning = bool(config.get("cpu_tuning", False)) and platform == "cpu"
  return BatchLayout(global_batch=batch, accum=accum, devices=devices, hosts=hosts,
                     devices_per_host=devices_per_host, process_index=process_index,
                     platform=platform, cpu_tuning=cpu_tuning)
