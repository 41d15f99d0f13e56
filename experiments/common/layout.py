"""Where a run's examples go: every global, per-host and per-device batch figure comes from here.

`batch_layout(config)` reads the shared run fields (`global_batch_size`, `grad_accum`, `num_devices`,
`devices_per_host`) and the machine (this run's JAX devices, or the devices of a compile target) and
returns a `BatchLayout`, checking that the numbers divide. It is the only place that divides
batches or counts devices per batch: the trainer, the experiments, the data pipeline
(input_pipeline/pipeline.py, text.py: they take the layout), the checkpoint manager (per-device
rows, the topology a checkpoint records), nanoGPT's replayed batch order, the dry run, the TPU
compile and the tools all take their figures from it (per-host rows, steps per epoch, eval batches,
updates per epoch); code without a run's layout takes `of_devices()`. The batch fields' names live
here too (`add_fields`, `set_batch`, `with_per_device_batch`, `check_no_accum`,
`check_batch_multiple`): no other module reads them.

Glossary: a *micro-step* feeds `global_batch` examples (all devices of all hosts) through forward
and backward; an *update* (optimizer step) accumulates `accum` micro-steps.

Synopsis:

  import ml_collections
  from experiments.common import layout
  c = ml_collections.ConfigDict(dict(global_batch_size=768, grad_accum=1, num_devices=32,
                                     devices_per_host=4))
  l = layout.batch_layout(c, devices=32, devices_per_host=4, platform="tpu")   # a v4-64
  (l.hosts, l.per_host_batch, l.per_device_batch)                              # (8, 96, 24)
  l.steps_per_epoch(8000)                                                      # 10 per epoch
  layout.of(16, devices_per_host=2, hosts=2, process_index=1).host_rows        # (8, 16)
  layout.of_devices().devices_per_host                                         # local devices
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Tuple

import jax

from experiments.common import errors
from experiments.common import parallel


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """The batch of one micro-step, split over hosts and devices."""
  global_batch: int          # examples per micro-step, all devices of all hosts
  accum: int                 # micro-steps per update (gradient accumulation)
  devices: int               # data-parallel devices of the run (all hosts): JAX devices, or data
                             # groups of `model_parallel` chips each (the step's per-device rows)
  hosts: int                 # processes
  devices_per_host: int      # data-parallel devices per process
  process_index: int         # this process
  platform: str              # the platform the program is compiled for: "cpu", "tpu", "gpu"
  cpu_tuning: bool = False   # CPU-only speed-ups are on (config.cpu_tuning and platform == "cpu")
  rules: parallel.Rules = parallel.REPLICATED   # where the state lies (config.sharding,
                                                # config.model_parallel; parallel.Rules)

  @property
  def model_parallel(self) -> int:
    """JAX devices per data group (config.model_parallel; parallel.MODEL_AXIS)."""
    return self.rules.model_parallel

  @property
  def chips(self) -> int:
    """JAX devices of the run (all hosts): devices x model_parallel."""
    return self.devices * self.model_parallel

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

  @property
  def host_rows(self) -> Tuple[int, int]:
    """[start, stop) of this host's rows in a micro-step's global batch (devices in order)."""
    return (self.first_device * self.per_device_batch,
            (self.first_device + self.devices_per_host) * self.per_device_batch)

  def updates_for(self, examples: float) -> int:
    """Whole updates that `examples` examples make (e.g. epochs x examples per epoch)."""
    return int(examples / self.examples_per_update)

  def steps_per_epoch(self, num_examples: int) -> int:
    """Steps of one pass of this host over its 1/hosts share of `num_examples` (the split over all
    hosts); the trailing partial batch is dropped, so every host agrees."""
    return self.host_steps_per_epoch(num_examples // self.hosts)

  def host_steps_per_epoch(self, host_examples: int) -> int:
    """Steps of one pass over `host_examples` examples of this host (partial batch dropped)."""
    return host_examples // self.per_host_batch

  def eval_batches(self, num_examples: int) -> int:
    """Batches per host that evaluate `num_examples` examples (the same on every host; the last
    ones padded)."""
    return math.ceil(math.ceil(num_examples / self.hosts) / self.per_host_batch)

  def describe(self) -> str:
    accum = f" x {self.accum} accumulation steps" if self.accum > 1 else ""
    groups = (f" data group(s) of {self.model_parallel} {self.platform} devices"
              if self.model_parallel > 1 else f" {self.platform} device(s)")
    return (f"global batch {self.global_batch}{accum} = {self.hosts} host(s) x "
            f"{self.devices_per_host}{groups} x {self.per_device_batch}")


BATCH_FIELD, ACCUM_FIELD = "global_batch_size", "grad_accum"


def add_fields(c: Any) -> None:
  """The batch fields of the run section (experiments/common/config_utils.run_config):
  `BATCH_FIELD` examples per micro-step over all devices of all hosts, `ACCUM_FIELD` micro-steps per
  update."""
  c[BATCH_FIELD] = 32
  c[ACCUM_FIELD] = 1


def of(global_batch: int, *, devices_per_host: int, hosts: int = 1, process_index: int = 0,
       accum: int = 1, platform: str = "cpu") -> BatchLayout:
  """The checked layout of these figures without a config or devices (tools, tests, data
  benchmarks): `global_batch` examples per micro-step over `hosts` x `devices_per_host` devices."""
  return batch_layout({BATCH_FIELD: global_batch, ACCUM_FIELD: accum},
                      devices=hosts * devices_per_host, devices_per_host=devices_per_host,
                      process_index=process_index, platform=platform, check_num_devices=False)


def of_devices() -> BatchLayout:
  """The layout of this run's devices (all processes), one example per device: the device counts
  for code that has no run layout (the checkpoint manager outside a trainer, tools, tests)."""
  return batch_layout({BATCH_FIELD: jax.device_count(), ACCUM_FIELD: 1}, check_num_devices=False)


def set_batch(config: Any, global_batch: Optional[int] = None,
              accum: Optional[int] = None) -> Any:
  """Sets the config's batch fields (in place; returns it): tools and benchmarks that choose a
  batch."""
  if global_batch is not None:
    config[BATCH_FIELD] = int(global_batch)
  if accum is not None:
    config[ACCUM_FIELD] = int(accum)
  return config


def configured_batch(config: Any) -> int:
  """The global batch a config asks for (before a layout checks it against devices)."""
  return int(config[BATCH_FIELD])


def with_per_device_batch(config: Any, per_device: int, devices: int) -> Tuple[Any, str]:
  """(a copy of `config` whose batch is `per_device` examples on each of `devices` devices, the
  flag that sets it): the dry run's batch search and fit fixes, the benchmarks."""
  c = config.copy_and_resolve_references()
  c[BATCH_FIELD] = per_device * devices
  return c, f"--config.{BATCH_FIELD}={per_device * devices}"


def check_no_accum(config: Any, why: str) -> None:
  """Raises errors.ConfigError when `config` accumulates micro-steps and the experiment cannot."""
  accum = int(config.get(ACCUM_FIELD, 1))
  if accum != 1:
    raise errors.ConfigError(ACCUM_FIELD, accum, why, "use 1")


def check_batch_multiple(config: Any, field: str, why: str) -> None:
  """Raises errors.ConfigError unless config[field] is a positive multiple of the global batch."""
  batch, value = int(config[BATCH_FIELD]), int(config[field])
  if value <= 0 or value % batch:
    raise errors.ConfigError(field, value, f"must be a positive multiple of {BATCH_FIELD}={batch} "
                             f"({why})", f"use {max(1, -(-value // batch)) * batch}")


def batch_layout(config: Any, *, devices: Optional[int] = None,
                 devices_per_host: Optional[int] = None, process_index: Optional[int] = None,
                 platform: Optional[str] = None, check_num_devices: bool = True,
                 target: Optional[str] = None,
                 model_spec: Optional[parallel.ModelSpec] = None) -> BatchLayout:
  """The layout of `config` on this run's devices, or on the ones given (dry runs, TPU targets);
  its state rules from config.sharding, config.model_parallel and `model_spec` (the experiment's,
  trainer.run_layout).

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
  batch = int(config[BATCH_FIELD])
  accum = int(config.get(ACCUM_FIELD, 1))
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
  m = int(config.get("model_parallel", 1))
  if m < 1 or devices_per_host % m:
    raise errors.ConfigError(
        "model_parallel", m, f"must be a positive divisor of the {devices_per_host} devices per "
        "host (a data group's devices are on one host)",
        f"use one of {[d for d in range(1, devices_per_host + 1) if devices_per_host % d == 0]}")
  groups = devices // m
  if batch % groups:
    what = f"{groups} data groups of model_parallel={m}" if m > 1 else f"{devices} devices"
    raise errors.ConfigError(
        "global_batch_size", batch,
        f"not divisible by the {what}" + (f" of {slice_}" if target else ""),
        f"use a multiple of {groups}, e.g. "
        + ("--config.global_batch_size=" if target else "")
        + f"{max(groups, batch // groups * groups)}")
  cpu_tuning = bool(config.get("cpu_tuning", False)) and platform == "cpu"
  sharding = str(config.get("sharding", "replicated"))
  if sharding not in parallel.SHARDINGS or (m > 1 and sharding != "fsdp"):
    raise errors.ConfigError("sharding", sharding,
                             f"must be one of {parallel.SHARDINGS}, fsdp with model_parallel={m}",
                             "use replicated, or fsdp")
  rules = parallel.Rules(sharding, m, model_spec)
  return BatchLayout(global_batch=batch, accum=accum, devices=devices // m, hosts=hosts,
                     devices_per_host=devices_per_host // m, process_index=process_index,
                     platform=platform, cpu_tuning=cpu_tuning, rules=rules)
