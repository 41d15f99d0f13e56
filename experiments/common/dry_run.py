r"""`--dry_run`: compile a config's programs for its pod before spending pod time, and print a table.

  python -m experiments.trm.main --config=configs/v4_64.py --dry_run              # the config's target
  python -m experiments.trm.main --config=configs/v4_64.py --dry_run --target=cpu # one host, fake CPUs

The experiment is built abstractly (`Experiment.build(..., abstract=True)`: shapes only, no data read,
no memory) with the batch layout of the target, and the REAL programs are compiled: the training step
exactly as the trainer pmaps it (experiments/common/trainer.py `parallel_train_step`: the non-finite
guard, donation, replicated state) and the experiment's evaluation steps.

Targets:
  cpu      this machine with the pod host's device count (config.devices_per_host) as fake CPU
           devices: one host's program, XLA:CPU's memory estimate (a TPU's differs).

Errors (a batch that does not divide, an unknown target) are one line naming the field and the fix.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from experiments.common import errors
from experiments.common import experiment as experiment_lib
from experiments.common import layout as layout_lib
from experiments.common import parallel
from experiments.common import trainer

GIB = 2.0 ** 30


def resolve_target(config: ml_collections.ConfigDict, target: Optional[str]) -> str:
  """--target, else the config's `target`, else "cpu"."""
  return (target or config.get("target", "") or "cpu").strip()


def prepare(config: ml_collections.ConfigDict, target: Optional[str]) -> None:
  """Before JAX starts a backend: for the cpu target, give this process the pod host's device count
  as fake CPU devices."""
  if resolve_target(config, target) != "cpu":
    return
  n = config.devices_per_host if config.devices_per_host > 0 else max(config.num_devices, 1)
  os.environ["XLA_FLAGS"] = " ".join(
      [f for f in os.environ.get("XLA_FLAGS", "").split()
       if not f.startswith("--xla_force_host_platform_device_count")]
      + [f"--xla_force_host_platform_device_count={n}"])
  jax.config.update("jax_platforms", "cpu")


def widen(tree: Any, n: int) -> Any:
  """Per-device ShapeDtypeStructs [n_local, ...] -> [n, ...] (the compile's device count)."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct((n,) + tuple(s.shape[1:]), s.dtype), tree)


def programs(b: experiment_lib.Build, config: ml_collections.ConfigDict,
             layout: layout_lib.BatchLayout) -> Dict[str, experiment_lib.Program]:
  """The run's programs: the trainer's training step and the experiment's evaluation steps."""
  out = {"train_step": experiment_lib.Program(
      trainer.guarded_step(b.train_step, config.nonfinite),
      (b.state, b.device_state, b.example_batch,
       jax.ShapeDtypeStruct((layout.devices_per_host,), jnp.int32)),
      replicated_in=(0,), out_axes=(None, 0, 0), donate_argnums=(0, 1),
      items=b.items_per_step, flops=b.flops_per_step)}
  out.update(b.eval_programs)
  return out


def compile_program(p: experiment_lib.Program, *, devices: Optional[Sequence[Any]] = None):
  """(compiled, seconds): `pmap(p.fn)` over `devices` (default: this host's), arguments widened."""
  n = len(devices) if devices is not None else jax.local_device_count()
  args = tuple(a if i in p.replicated_in else widen(a, n) for i, a in enumerate(p.args))
  fn = parallel.pmap_step(p.fn, replicated_in=p.replicated_in, out_axes=p.out_axes,
                          donate_argnums=p.donate_argnums, devices=devices)
  t0 = time.perf_counter()
  compiled = fn.lower(*args).compile()
  return compiled, time.perf_counter() - t0


def _cpu_report(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict,
                name: str) -> str:
  n_local = jax.local_device_count()
  devices = config.num_devices if config.num_devices > 0 else n_local
  layout = layout_lib.batch_layout(config, devices=devices, devices_per_host=n_local,
                                   process_index=0, platform="cpu", check_num_devices=False)
  trainer.check_config(experiment, config)
  b = experiment.build(config, layout, abstract=True)
  rows: List[tuple] = [
      ("devices", f"{layout.devices} = {layout.hosts} host(s) x {layout.devices_per_host} "
                  f"(compiled for one host on {n_local} fake CPU devices)"),
      ("batch", layout.describe()),
      ("updates", f"{b.total_steps:,}"),
  ]
  if b.summary:
    rows += [("model", line) for line in b.summary.splitlines()]
  for pname, p in programs(b, config, layout).items():
    compiled, seconds = compile_program(p)
    mem = compiled.memory_analysis()
    text = f"compile {seconds:.1f} s"
    if mem is not None:
      text += (f"; per device: arguments {mem.argument_size_in_bytes / GIB:.3f} GiB, outputs "
               f"{mem.output_size_in_bytes / GIB:.3f} GiB, temp {mem.temp_size_in_bytes / GIB:.3f} "
               "GiB (XLA CPU estimate; a TPU's differs)")
    if p.flops:
      text += f"; {p.flops / 1e12:.3f} TFLOP per call, all devices"
      if p.items:
        text += f" ({p.flops / p.items / 1e9:.2f} GFLOP per {b.item_name[:-1]}, analytic)"
    rows.append((pname, text))
  width = max(len(k) for k, _ in rows)
  return f"Dry run of {name} (target cpu):\n" + "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def run(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict, *,
        target: Optional[str] = None, search_batch: bool = False, name: str = "config") -> str:
  """Compiles the config's programs for the target; returns the report (see the module doc)."""
  target = resolve_target(config, target)
  if target == "cpu":
    if search_batch:
      raise errors.ConfigError("target", target, "--search_batch needs a TPU target",
                               "pass --target=v4-8 (or the pod's accelerator type)")
    return _cpu_report(experiment, config, name)
  raise errors.ConfigError("target", target, "TPU targets need the TPU compiler tooling",
                           "pass --target=cpu")
