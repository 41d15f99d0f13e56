r"""`--dry_run`: compile a config's programs for its pod before spending pod time, and print a table.

  python -m experiments.trm.main --config=configs/v4_64.py --dry_run              # the config's target
  python -m experiments.trm.main --config=configs/v4_64.py --dry_run --target=cpu # one host, fake CPUs

The experiment is built without its data (`Experiment.build` reads none; the state's shapes are
`jax.eval_shape` of its init: trainer.abstract_state; no data read,
no memory) with the batch layout of the target, and the REAL programs are compiled: the training step
exactly as the trainer pmaps it (experiments/common/device_step.py `parallel_train_step`: the
non-finite guard, donation, replicated state) and the experiment's evaluation steps.

Targets:
  cpu      this machine with the pod host's device count (config.devices_per_host) as fake CPU
           devices: one host's program, XLA:CPU's memory estimate (a TPU's differs).
  v4-64 ...  a gcloud accelerator type (experiments/tools/tpu_target.py: v2-8 ... v6e-256): the
           programs compiled by the TPU compiler (libtpu, the `tpu` extra) for the whole slice,
           every host's devices, on this CPU machine. One table (tpu_report.format_report):
           per-device HBM (the compiler's peak and the margin to the chip's usable HBM), compile
           time, the compiler's (loop-aware) and the analytic FLOPs, bytes accessed, the compute
           and memory bounds and the larger, "bound (compiler estimate)", examples/s (tokens/s)
           and MFU at the bound (upper bounds), and the chip-hours of the run's updates at the
           bound (a lower bound).
           COMPILER ESTIMATES, not measurements.

A training step that does not fit exits with one line naming the chip, its HBM and the need, and
the first fix that fits with the flags to copy, after trying, in order (`fit_variants`): the
experiment's own (`Experiment.fit_variants`: remat, bfloat16), fsdp (a replicated state split over
the chips) alone and with each of those, then half the per-device batch. `--search_batch` finds the
largest per-device batch that fits and its speed bound (a deviation from the recipe's batch).

The programs are built for the TARGET platform: CPU-only code paths (layout.cpu_tuning) are off
for a TPU target whatever the host's backend is.

The report ends with where the run's published inputs come from (`Experiment.describe_inputs`:
the dataset prepared or not, downloads, weights in the cache or not); nothing is downloaded.

Errors (a batch that does not divide, an unknown target) are one line naming the field and the fix.
"""

from __future__ import annotations

import copy
import functools
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import ml_collections

from experiments.common import device_step
from experiments.common import errors
from experiments.common import experiment as experiment_lib
from experiments.common import layout as layout_lib
from experiments.common import parallel
from experiments.common import trainer
from experiments.tools import tpu_compile
from experiments.tools import tpu_cost
from experiments.tools import tpu_fit
from experiments.tools import tpu_report
from experiments.tools import tpu_target

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


def programs(experiment: experiment_lib.Experiment, b: experiment_lib.Build,
             config: ml_collections.ConfigDict,
             layout: layout_lib.BatchLayout) -> Dict[str, experiment_lib.Program]:
  """The run's programs: the trainer's training step and the experiment's evaluation steps."""
  state, device_state = trainer.abstract_state(b, config)
  out = {"train_step": experiment_lib.Program(
      device_step.guarded_step(b.train_step, config.nonfinite, seed=config.seed,
                               rng_step_offset=experiment.rng_step_offset),
      (state, device_state, b.example_batch,
       jax.ShapeDtypeStruct((layout.devices_per_host,), jnp.int32)),
      state_in=(0,), out_axes=(None, 0, 0), donate_argnums=(0, 1),
      items=b.display.items_per_step, flops=b.flops_per_step, blocks=True)}
  evals = [ev for ev in b.evaluators if ev.program is not None]
  out.update({"eval_step" if len(evals) == 1 else f"{ev.name}_step": ev.program for ev in evals})
  return out


def compile_program(p: experiment_lib.Program, rules: parallel.Rules = parallel.REPLICATED, *,
                    devices: Optional[Sequence[Any]] = None,
                    compiler_options: Optional[Dict[str, str]] = None):
  """(compiled, seconds): `parallel.compile_step(p.fn, rules)` over `devices` (default: this
  host's), arguments widened to the mesh's rows, with the Build's XLA `compiler_options` (CPU
  targets only)."""
  devices = jax.local_devices() if devices is None else devices
  args = tuple(a if i in p.state_in else widen(a, len(devices) // rules.model_parallel)
               for i, a in enumerate(p.args))
  fn = parallel.compile_step(p.fn, rules, state_in=p.state_in, out_axes=p.out_axes,
                             donate_argnums=p.donate_argnums, devices=devices, blocks=p.blocks)
  t0 = time.perf_counter()
  compiled = fn.lower(*args).compile(compiler_options=dict(compiler_options or {}) or None)
  return compiled, time.perf_counter() - t0


def _cpu_report(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict,
                name: str) -> str:
  n_local = jax.local_device_count()
  devices = config.num_devices if config.num_devices > 0 else n_local
  layout = trainer.run_layout(experiment, config, devices=devices, devices_per_host=n_local,
                              process_index=0, platform="cpu", check_num_devices=False)
  trainer.check_config(experiment, config)
  b = experiment.build(config, layout)
  rows: List[tuple] = [
      ("devices", f"{layout.devices} = {layout.hosts} host(s) x {layout.devices_per_host} "
                  f"(compiled for one host on {n_local} fake CPU devices)"),
      ("batch", layout.describe()),
      ("updates", f"{b.total_steps:,}" if b.total_steps else "unknown here (see model)"),
  ]
  if b.display.summary:
    rows += [("model", line) for line in b.display.summary.splitlines()]
  for pname, p in programs(experiment, b, config, layout).items():
    compiled, seconds = compile_program(p, layout.rules,
                                        compiler_options=dict(b.compiler_options))
    mem = compiled.memory_analysis()
    text = f"compile {seconds:.1f} s"
    if mem is not None:
      text += (f"; per device: arguments {mem.argument_size_in_bytes / GIB:.3f} GiB, outputs "
               f"{mem.output_size_in_bytes / GIB:.3f} GiB, temp {mem.temp_size_in_bytes / GIB:.3f} "
               "GiB (XLA CPU estimate; a TPU's differs)")
    if p.flops:
      text += f"; {p.flops / 1e12:.3f} TFLOP per call, all devices"
      if p.items:
        text += f" ({p.flops / p.items / 1e9:.2f} GFLOP per {b.display.item_name[:-1]}, analytic)"
    rows.append((pname, text))
  width = max(len(k) for k, _ in rows)
  return f"Dry run of {name} (target cpu):\n" + "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# --------------------------------------------------------------------------------------------------
# TPU targets.

def tpu_layout(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict,
               target: tpu_target.Target) -> layout_lib.BatchLayout:
  """The layout of `config` on a TPU slice (every figure checked against the slice by
  layout.batch_layout: num_devices, devices_per_host, the batch's divisibility; the state rules)."""
  return trainer.run_layout(experiment, config, devices=target.num_devices,
                            devices_per_host=target.devices_per_host, process_index=0,
                            platform="tpu", target=target.name)


def _per_device(p: experiment_lib.Program) -> tuple:
  """The program's arguments without their leading (local) device axis (tpu_target.lower_step
  adds the slice's)."""
  strip = lambda s: jax.ShapeDtypeStruct(tuple(s.shape[1:]), s.dtype)  # noqa: E731
  return tuple(a if i in p.state_in else jax.tree.map(strip, a) for i, a in enumerate(p.args))


def lower_for_tpu(p: experiment_lib.Program, target: tpu_target.Target,
                  layout: layout_lib.BatchLayout) -> jax.stages.Lowered:
  """The program lowered for the whole slice as the run lays it out (tpu_target.lower_step)."""
  return tpu_target.lower_step(p.fn, target, _per_device(p), rules=layout.rules,
                               state_in=p.state_in, out_axes=p.out_axes,
                               donate_argnums=p.donate_argnums, blocks=p.blocks)


def compile_for_tpu(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict,
                    target: tpu_target.Target, *, only: Optional[Sequence[str]] = None,
                    loop_aware: bool = True,
                    breakdown: bool = False) -> Tuple[List[tpu_report.Report], int]:
  """(the reports of the config's programs (or `only` those) compiled for `target` in the config's
  state layout (`config.sharding`), the run's updates). `loop_aware`: count loops trip by trip
  (tpu_cost.loop_aware_cost: each loop body compiled too); the fit searches, which need only the
  memory, turn it off; `breakdown`: each report's bytes per operation
  (tpu_compile.compile_report)."""
  trainer.check_config(experiment, config)
  layout = tpu_layout(experiment, config, target)
  reports = []
  b = experiment.build(config, layout)
  for pname, p in programs(experiment, b, config, layout).items():
    if only is not None and pname not in only:
      continue
    lowered = lower_for_tpu(p, target, layout)
    reports.append(tpu_compile.compile_report(
        lowered, target=target, name=pname,
        analytic_flops_per_device=p.flops / target.num_devices if p.flops else None,
        items_per_step=p.items or None, item_name=b.display.item_name,
        jaxpr=tpu_cost.per_device_jaxpr(p.fn, target, _per_device(p)) if loop_aware else None,
        breakdown=breakdown))
  return reports, int(b.total_steps)


def _with(config: ml_collections.ConfigDict, apply) -> ml_collections.ConfigDict:
  c = copy.deepcopy(config)
  with c.unlocked():
    apply(c)
  return c


FSDP_LABEL = ("fsdp (parameters, gradients and optimizer state split over the chips; the same "
              "numbers to float32 rounding, more communication)")
FSDP_FLAGS = "--config.sharding=fsdp"


def fit_variants(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict,
                 devices_per_host: Optional[int] = None) -> List[Tuple[str, str, Any]]:
  """(label, flags a user types, apply(config)) of the fixes tried, in order, when the training step
  does not fit the chip; ordered by what each adds to the run:
  1. the experiment's own variants (`Experiment.fit_variants`: remat, then bfloat16 for nanoGPT),
     each alone: more compute or another precision, no new communication;
  2. for a replicated state: fsdp alone, then fsdp with each of those variants: communication (the
     weights all-gathered once per update, each micro-batch's gradient reduce-scattered:
     ~P/2 + accum x P bytes per chip against replicated's ~2P all-reduce), state / N per chip;
  3. with `devices_per_host` (the slice's) and an experiment that names a model split
     (`Experiment.model_axis_spec`), no model axis yet: fsdp x model_parallel=m for each m > 1
     dividing the chips per host that the model takes, smallest first (the weights also split over
     each group's m chips; the numbers are those of data parallelism over the groups);
  4. half the per-device batch (the global batch halved; `_fixes`): a deviation from the recipe, last."""
  own = list(experiment.fit_variants(config))
  out = list(own)
  if config.sharding == "replicated":

    def fsdp(c, also=None):
      c.sharding = "fsdp"
      if also is not None:
        also(c)

    out.append((FSDP_LABEL, FSDP_FLAGS, fsdp))
    out += [(f"fsdp + {label}", f"{FSDP_FLAGS} {flags}", functools.partial(fsdp, also=apply))
            for label, flags, apply in own]
  if devices_per_host and int(config.get("model_parallel", 1)) == 1:
    for m in range(2, devices_per_host + 1):
      if devices_per_host % m:
        continue
      c = _with(config, lambda c, m=m: c.update({"sharding": "fsdp", "model_parallel": m}))
      try:
        if experiment.model_axis_spec(c) is None:
          break                                        # the experiment has no model axis
      except errors.ConfigError:
        continue                                       # the model does not split m ways
      flags = ("" if config.sharding == "fsdp" else f"{FSDP_FLAGS} ") + f"--config.model_parallel={m}"
      out.append((f"fsdp x model_parallel={m} (each weight also split over a group of {m} chips; "
                  f"one step per group: a replicated run's numbers on 1/{m} of the chips)", flags,
                  lambda c, m=m: c.update({"sharding": "fsdp", "model_parallel": m})))
  return out


def _fixes(experiment, config, target: tpu_target.Target):
  """(label, flags, compile_fn) variants tried when the training step does not fit: `fit_variants`,
  then half the per-device batch."""
  out = []
  for label, flags, apply in fit_variants(experiment, config, target.devices_per_host):
    c = _with(config, apply)
    out.append((label, flags, lambda c=c: compile_for_tpu(experiment, c, target,
                                                          only=("train_step",),
                                                          loop_aware=False)[0][0]))
  per_device = tpu_layout(experiment, config, target).per_device_batch
  if per_device > 1:
    c, flag = layout_lib.with_per_device_batch(config, per_device // 2, target.num_devices)
    out.append((f"half the per-device batch ({per_device // 2}; a deviation from the recipe)",
                flag,
                lambda c=c: compile_for_tpu(experiment, c, target, only=("train_step",),
                                            loop_aware=False)[0][0]))
  return out


def _chip_hours(report: tpu_report.Report, target: tpu_target.Target, steps: int) -> str:
  if not steps or report.bound_s is None:
    return ""
  hours = report.chip_hours(steps)
  return (f"The run's {steps:,} updates at the bound of {report.bound_s * 1e3:.1f} ms per step: "
          f">= {steps * report.bound_s / 3600:.1f} h on {target.name}, >= {hours:,.0f} chip-hours "
          f"(a lower bound from the compiler's estimates, not a prediction).")


def _tpu_report(experiment, config, target_name: str, search: bool, name: str) -> str:
  target = tpu_target.parse_target(target_name)
  tpu_layout(experiment, config, target)   # a layout the slice cannot take: one line, before libtpu
  tpu_target.load_libtpu()
  reports, steps = compile_for_tpu(experiment, config, target)
  text = [f"Dry run of {name} for {target.name}:", tpu_report.format_report(reports)]
  hours = _chip_hours(reports[0], target, steps)
  if hours:
    text.append(hours)
  if search:
    per_device = tpu_layout(experiment, config, target).per_device_batch

    def compile_at(b: int) -> tpu_report.Report:
      c, _ = layout_lib.with_per_device_batch(config, b, target.num_devices)
      return compile_for_tpu(experiment, c, target, only=("train_step",), loop_aware=False)[0][0]
    found = tpu_fit.search_batch(compile_at, 1, max(per_device * 64, 64))
    if found.batch is None:
      text.append("--search_batch: not even a per-device batch of 1 fits.")
    else:
      c, flag = layout_lib.with_per_device_batch(config, found.batch, target.num_devices)
      r = compile_for_tpu(experiment, c, target, only=("train_step",))[0][0]   # loops counted
      speed = (f", <= {r.items_per_s:,.0f} {r.item_name}/s" if r.items_per_s else "")
      mfu = f", MFU <= {100 * r.mfu:.0f}%" if r.mfu else ""
      base = reports[0]
      base_speed = (f" (<= {base.items_per_s:,.0f} {base.item_name}/s at the recipe's "
                    f"{per_device})" if base.items_per_s else "")
      text.append(
          f"--search_batch: the largest per-device batch that fits {target.name} is {found.batch} "
          f"({tpu_report.margin_text(r)}){speed}{mfu}{base_speed}: {flag}. A batch other than "
          "the recipe's is a deviation: its published results were measured at the recipe's batch. "
          f"({len(found.tried) + 1} compiles)")
  train = reports[0]
  if not train.fits:
    fixed, tried = tpu_fit.first_fitting(_fixes(experiment, config, target))
    text.append("Tried to make train_step fit:\n" + tpu_fit.format_variants(tried))
    print("\n".join(text), flush=True)
    fix = (f"{fixed.label}: {fixed.flags}" if fixed is not None else
           "a larger slice (--target), or a smaller model; none of the tried variants fits")
    raise errors.BadInput(f"{tpu_report.does_not_fit_message(train)}. Fix: {fix}")
  return "\n".join(text)


def run(experiment: experiment_lib.Experiment, config: ml_collections.ConfigDict, *,
        target: Optional[str] = None, search_batch: bool = False, name: str = "config") -> str:
  """Compiles the config's programs for the target in the config's state layout
  (`config.sharding`); returns the report (see the module doc)."""
  target = resolve_target(config, target)
  inputs = "".join(f"\n{what}: {where}" for what, where in experiment.describe_inputs(config))
  if target == "cpu":
    if search_batch:
      raise errors.ConfigError("target", target, "--search_batch needs a TPU target",
                               "pass --target=v4-8 (or the pod's accelerator type)")
    return _cpu_report(experiment, config, name) + inputs
  return _tpu_report(experiment, config, target, search_batch, name) + inputs
