r"""Per-operation profile of TRM's real training step on this machine: where the milliseconds go.

Compiles the trainer's pmapped step (as `step_setup.compile_step`: the recipe's or
`configs/cpu_demo.py`'s model, AdamATan2, EMA, SignSGD, the non-finite guard), runs warm-up steps,
then traces `--steps` steps with `jax.profiler` (its chrome-trace JSON,
`plugins/profile/<run>/<host>.trace.json.gz`; no TensorBoard plugin needed) and joins every timed
operation of the compiled program with its optimized HLO (`compiled.as_text()`). Three readings, by
what the target offers:

CPU (XLA:CPU's thunks on the host threads): the per-operation table below.
GPU (the kernels, memcpys and memsets on the device's `Stream #N` lines of the same trace): one row
  per kernel name, per step: ms, launches, share of the kernel time, the GEMM dtype its name shows
  (`sm90_xmma_gemm_f32f32_tf32f32_...`: float32 operands on TF32 cores; `..._bf16bf16_...`: bf16;
  `?`: a GEMM whose name shows none), its HLO op and that op's JAX source; the header gives kernel
  ms and launches per step, the device's span and idle time, and GEMM ms by dtype.
TPU (`--tpu=v5litepod-1`: compiled here by libtpu, as `--dry_run` does; nothing runs): the bytes
  each operation accesses (experiments/tools/hlo_bytes.py, loop trips counted), op counts,
  instructions outside fusions, matmuls with a float32 operand and those that are bfloat16
  products run in float32 (a bf16 operand or one converted from bf16: autodiff's transpose of a
  bf16 matmul with a float32 cotangent), scatters (the token embedding's gradient is one), the
  compiler's FLOPs and bytes accessed, per-device temp bytes. Read both for the program as
  lowered (what every compiler receives: a GPU runs its float32 products as f32/TF32 GEMMs) and as
  the TPU compiler optimized it (which runs a float32 product at default precision in bf16 passes
  itself, so its matmuls all show bf16 operands).
`--trace=DIR` reads a saved trace (e.g. one taken on a GPU machine) without running anything.

CPU table rows group the operations by (result shape, source op); columns, per optimizer step:
  ms           summed duration of the group's executions.
  calls        executions per step.
  GFLOP        matmul FLOPs of the group (2 x output size x contracted size, from the HLO).
  GFLOP/s      GFLOP / ms: the achieved rate; compare with `peak` in the header (a square
               `jnp.dot` of the step's dtype, measured in the same run: the roofline of a matmul
               here).
  at_peak_ms   what the group's matmuls would take at that peak.
  overlap      mean fraction of the group's time during which another operation ran on the other
               thread(s) (XLA's thunk executor runs independent operations concurrently, and two
               operations then share the cores: a high overlap inflates ms).
  shape, op    the HLO result shape and the tail of its JAX op name (e.g.
               `mlp_t/gate_up_proj/transpose` = that projection's backward), with ` (bwd)` when
               the op belongs to the backward pass (`transpose(jvp(...))` in its name): a forward
               op and a backward one of the same name and shape are two rows.
The header gives the wall time per step (first traced op to last), the time with 0, 1 and 2+
operations running, and the summed matmul FLOPs against the peak. Tracing slows the operations
(on the dev CPU the demo step took ~440 ms untraced and 740-950 ms traced, unevenly across
operations): the table says where the time goes, the untraced warm-up steps printed above it say
how fast the step is.

Command lines:

  python -m experiments.trm.tools.profile_step                                  # make run's model
  python -m experiments.trm.tools.profile_step --model=mlp --dtype=float32 --batch=64 --steps=1
  python -m experiments.trm.tools.profile_step --cpu_tuning=false               # without the CPU forms
  python -m experiments.trm.tools.profile_step --model=mlp --dtype=bfloat16 --batch=768 --steps=3
      # on a GPU machine: the kernel table
  python -m experiments.trm.tools.profile_step --model=mlp --dtype=bfloat16 --batch=8 --tpu=v5litepod-1
  python -m experiments.trm.tools.profile_step --trace=/tmp/trace_dir --steps=3

Flags: --model=demo|mlp|att  --dtype=float32|bfloat16 (recipes; demo is float32)  --batch=0 (0: the
  config's, 64 for the recipes)  --steps=3  --warmup=5  --top=30  --cpu_tuning=true|false
  --hidden=0 (recipes: 0 = 512)  --forms=all (none, or a comma list of fast_grad,seq_major,unroll,
  head_major,lean_swiglu,split_reduce,batch_slices,nograd_chunks,pad_contraction,split_gate_up:
  the CPU forms the step carries, experiments/trm/cpu_tuning.py)
  --tpu=TYPE (compile for that TPU, print the HLO summary)  --trace=PATH (read a saved trace)

Functions (tests call them): here `tpu_train_step`, `tpu_hlo_report`, `parse_args`; the host's
table in experiments/trm/tools/trace_ops.py (`parse_trace`, `hlo_index`, `profile_table`,
`format_profile`), the device's in trace_kernels.py (`parse_device_trace`, `gemm_dtype`,
`kernel_table`, `format_kernels`), the HLO reading in hlo_instructions.py (`parse_hlo`,
`hlo_summary`, `format_hlo_summary`).
"""

from __future__ import annotations

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import ml_collections  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import host_malloc  # noqa: E402
from experiments.common import layout as layout_lib  # noqa: E402
from experiments.common import trainer  # noqa: E402
from experiments.tools import dry_run  # noqa: E402
from experiments.tools import hlo_bytes  # noqa: E402
from experiments.tools import tpu_target  # noqa: E402
from experiments.trm import cpu_tuning  # noqa: E402
from experiments.trm import train  # noqa: E402
from experiments.trm.configs import cpu_demo  # noqa: E402
from experiments.trm.tools import hlo_instructions  # noqa: E402
from experiments.trm.tools import measure  # noqa: E402
from experiments.trm.tools import step_setup  # noqa: E402
from experiments.trm.tools import trace_kernels  # noqa: E402
from experiments.trm.tools import trace_ops  # noqa: E402


def tpu_train_step(config: ml_collections.ConfigDict, target_name: str):
  """(lowered, compiled) of the trainer's training step of a TRM `config` for a TPU slice, compiled
  by libtpu on this machine as `--dry_run --target=...` does (experiments/tools/dry_run.py)."""
  target = tpu_target.parse_target(target_name)
  layout = dry_run.tpu_layout(train.TRM(), config, target)
  trainer.check_config(train.TRM(), config)
  b = train.TRM().build(config, layout)
  p = dry_run.programs(train.TRM(), b, config, layout)["train_step"]
  lowered = dry_run.lower_for_tpu(p, target, layout)
  return lowered, lowered.compile()


def tpu_hlo_report(lowered, compiled, title: str, top: int = 12) -> str:
  """`format_hlo_summary` of the program as lowered (what every compiler receives: its float32
  products are what a GPU runs in f32/TF32) and as the TPU compiler optimized it (which runs a
  float32 product at default precision in bf16 passes itself), with the compiler's costs."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  mem = compiled.memory_analysis()
  as_lowered = hlo_instructions.hlo_summary(lowered.as_text("hlo", debug_info=True))
  optimized = hlo_instructions.hlo_summary(compiled.as_text())
  lines = [hlo_instructions.format_hlo_summary(as_lowered, title=f"{title}, as lowered", top=top),
           hlo_instructions.format_hlo_summary(optimized, title=f"{title}, TPU-optimized",
                                               cost=cost, top=top)]
  if mem is not None:
    lines.append(f"  per device: temp {mem.temp_size_in_bytes / 1e9:.3f} GB, arguments "
                 f"{mem.argument_size_in_bytes / 1e9:.3f} GB")
  # Where the bytes go: the optimized program's operations by bytes (loop trips counted).
  lines.append(hlo_bytes.format_breakdown(hlo_bytes.breakdown(compiled.as_text()), top=top,
                                          compiler_bytes=cost.get("bytes accessed"),
                                          title=f"{title}, bytes by operation"))
  return "\n".join(lines)


def _setup(args: argparse.Namespace) -> step_setup.StepSetup:
  return step_setup.compile_config_step(_config(args), forms=args.forms)


def _run(setup: step_setup.StepSetup, n: int) -> List[float]:
  state, carry, batch, device_index = setup.args
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    state, carry, sums = setup.compiled(state, carry, batch, device_index)
    jax.block_until_ready((state, carry, sums))
    times.append(time.perf_counter() - t0)
  setup.args = (state, carry, batch, device_index)
  return times


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m experiments.trm.tools.profile_step",
                               description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="demo", choices=["demo", "mlp", "att"])
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--batch", type=int, default=0)
  ap.add_argument("--hidden", type=int, default=0)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--warmup", type=int, default=5)
  ap.add_argument("--top", type=int, default=30)
  ap.add_argument("--cpu_tuning", default="true", choices=["true", "false"])
  ap.add_argument("--forms", default="all",
                  help=f"the CPU forms: all, none or a comma list of {','.join(cpu_tuning.FORMS)}")
  ap.add_argument("--tpu", default="",
                  help="a TPU type (e.g. v5litepod-1): compile the step for it with libtpu and print "
                       "the HLO summary instead of running it")
  ap.add_argument("--trace", default="",
                  help="read this jax.profiler trace (a *.trace.json.gz or its folder) of --steps "
                       "steps instead of running the step")
  args = ap.parse_args(argv)
  args.cpu_tuning = args.cpu_tuning == "true"
  try:
    cpu_tuning.parse_forms(args.forms)
  except ValueError as e:
    ap.error(f"--{e}")
  if args.model == "demo" and args.dtype != "float32":
    ap.error(f"--dtype={args.dtype} with --model=demo: the demo config is float32; "
             "use --model=mlp or --model=att for bfloat16")
  if args.steps < 1:
    ap.error(f"--steps={args.steps}: trace at least one step")
  if args.tpu and args.tpu not in tpu_target.valid_target_names():
    ap.error(f"--tpu={args.tpu}: not a TPU type; use one of "
             f"{', '.join(tpu_target.valid_target_names())}")
  if args.trace and not os.path.exists(args.trace):
    ap.error(f"--trace={args.trace}: no such file or folder; give a jax.profiler trace")
  return args


def _config(args: argparse.Namespace) -> ml_collections.ConfigDict:
  if args.model != "demo":
    return step_setup.recipe_config(args.model, args.dtype, hidden=args.hidden or None,
                                    per_device_batch=args.batch or 64, cpu_tuning=args.cpu_tuning)
  config = cpu_demo.get_config(f"batch={args.batch}" if args.batch else None)
  config.cpu_tuning = args.cpu_tuning
  trainer.check_config(train.TRM(), config)
  return config


def print_trace(path: str, steps: int, top: int, index: Optional[Dict[str, trace_ops.HloOp]] = None,
                peak_gflop_s: float = 0.0) -> None:
  """The device kernel table of a trace that has a device (GPU / TPU), else the host ops table."""
  kernels = trace_kernels.parse_device_trace(path)
  if kernels:
    print(trace_kernels.format_kernels(*trace_kernels.kernel_table(kernels, steps, index), top=top))
  else:
    rows, totals = trace_ops.profile_table(trace_ops.parse_trace(path), index or {}, steps)
    print(trace_ops.format_profile(rows, totals, peak_gflop_s, top))


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  args = parse_args(argv)
  if args.trace:
    print_trace(args.trace, args.steps, args.top)
    return 0
  if args.tpu:
    config = _config(args)
    t0 = time.perf_counter()
    lowered, compiled = tpu_train_step(config, args.tpu)
    print(f"model {args.model}, {config.model.forward_dtype}, global batch "
          f"{layout_lib.configured_batch(config)}, compiled for {args.tpu} in "
          f"{time.perf_counter() - t0:.1f} s")
    print(tpu_hlo_report(lowered, compiled, f"training step ({args.tpu})", top=args.top))
    return 0
  if args.cpu_tuning and jax.default_backend() == "cpu":
    host_malloc.keep_heap()   # as the trainer does on a CPU target; before the backend's threads
  setup = _setup(args)
  print(f"model {args.model}, {setup.cfg.forward_dtype}, global batch {setup.global_batch}, "
        f"cpu_tuning {args.cpu_tuning} ({setup.forms_text()}); compiled in {setup.compile_s:.1f} s "
        f"for {jax.devices()[0].device_kind}", flush=True)
  index = trace_ops.hlo_index(setup.compiled.as_text())
  warm = _run(setup, args.warmup)
  with tempfile.TemporaryDirectory(prefix="podlab_profile_") as tmp:
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0         # Python frames are not wanted and slow the step
    jax.profiler.start_trace(tmp, profiler_options=options)
    timed = _run(setup, args.steps)
    jax.profiler.stop_trace()
    print(f"step wall time: warm-up {', '.join(f'{t * 1e3:.0f}' for t in warm)} ms; traced median "
          f"{statistics.median(timed) * 1e3:.0f} ms (tracing slows every operation: read the table "
          f"for proportions and the untraced warm-up steps for speed)")
    peak = measure.matmul_peak_flops(setup.cfg.forward_dtype) / 1e9
    print_trace(tmp, args.steps, args.top, index, peak)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
