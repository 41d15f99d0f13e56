r"""Throughput and memory benchmark of the real TRM training step (Sudoku TRM-MLP and TRM-Att recipes).

What is measured, per (model, compute dtype, batch):
  compile_s        lower + compile of the REAL pmapped step (the trainer's `parallel_train_step` of
                   TRM's step: the recipe's AdamATan2, EMA and sparse SignSGD, the non-finite guard).
  step_ms          median wall time of one optimizer step (one ACT step for every slot), measured
                   after `block_until_ready`, on a random Sudoku-shaped batch and a device-resident
                   carry (outputs fed back, donated, as in training).
  examples_per_s   global batch / median step time.
  rss_peak_GB      peak resident memory of the process during the row (VmHWM, reset at the start of
                   the row through /proc/self/clear_refs; where that is unavailable, getrusage's
                   ru_maxrss). With `--isolate` (the default on a CPU backend) every row runs in a
                   fresh process, so this is the row's own peak; in one process it can include what
                   earlier rows left behind. On a CPU backend it includes the "device" buffers.
  compiled_temp_GB the compiled step's `memory_analysis()` temp bytes: the device-memory estimate.
  temp_arg_GB      temp + argument bytes (per device); GB_per_example divides it by the batch.
  GFLOP_per_ex     ANALYTIC model FLOPs per example per optimizer step (`analytic_flops`): forward =
                   T (n + 1) net calls + heads, backward = 2 x the forward FLOPs of the last n + 1
                   calls (the cycle with gradient) + heads; matmuls only (2 FLOPs per multiply-add).
                   Remat's recomputation is not counted (model FLOPs, not hardware FLOPs). XLA's
                   `cost_analysis` is not used for the step: it counts a while-loop body once. It is
                   used only as a cross-check of ONE net call (no loops), printed above the table.
  GFLOP_per_s      achieved = GFLOP_per_ex x examples_per_s;  frac_peak = achieved / the matmul peak
                   of the row's dtype measured in the same run (median of timed square `jnp.dot`s,
                   float32, and bfloat16 inputs with float32 accumulation as the model's matmuls).

Batches are PER DEVICE (global batch = batch x local devices; one device on a plain CPU or one-GPU
machine). `--batches` takes integers and `max`: the largest of `--max_candidates` whose compiled
temp + argument bytes fit in `--memory_limit_gb`, found by compile-only `memory_analysis()` with remat
off and on (remat on is tried only above the largest batch that fits without it); the table's `remat`
column says which was used. Integer batches use `--remat` (default off, the recipe's).

A row whose process fails (e.g. killed for memory under `--isolate`) is printed as NaNs and the run
goes on. All timings are medians within one run of this command (steps of the same compiled
executable, matmuls of the same run; nothing is compared across runs or cached between them). The
first timed step is included unless `--warmup_steps` > 0: compilation is ahead of time, and the median
of 3 steps already drops one slow step. A run's first few steps can also be slower while the kept
heap still grows (TRM-Att float32 at batch 64: in steps 0-3; docs/benchmarks.md, "Warm-up"):
`--warmup_steps=3` measures the steps after that, as `make bench` does. At the recipe size a CPU
step takes ~45 s at batch 64, so the default run (2 models x 2 dtypes x {64, max}) takes hours
there; use --models/--dtypes/--batches to cut.

Command lines:

  python -m experiments.trm.tools.bench                                  # the full benchmark (slow on a CPU)
  python -m experiments.trm.tools.bench --models=mlp --dtypes=bfloat16 --batches=64 --steps=3
  python -m experiments.trm.tools.bench --pipeline                       # + tf.data input-pipeline examples/s
  python -m experiments.trm.tools.bench --quick                          # smoke run: hidden 32, tiny batches
  python -m experiments.trm.tools.bench --json_out=/tmp/bench.json       # rows as JSON too
  make bench-throughput THROUGHPUT_ARGS='--models=mlp --batches=64 --write_docs'   # into the docs

`--write_docs` merges the table, as printed, into docs/benchmarks.md's trm-bench-throughput block
(experiments/tools/doc_tables.py: the command, commit, machine and date; rows keyed by model, dtype,
batch and remat replace the block's rows of the same key, the others stay, each naming its run).

Flags: --models=mlp,att  --dtypes=bfloat16,float32  --batches=64,max  --steps=3  --warmup_steps=0
  --hidden=0 (0 = the recipe's 512)  --memory_limit_gb=24  --max_candidates=64,128,256,384,512,768
  --remat=false  --matmul_size=2048  --matmul_reps=5  --pipeline  --pipeline_batch=768
  --pipeline_batches=20  --pipeline_train_size=4096  --data_dir= (default: a temporary folder)
  --isolate=auto|true|false (auto: each row in a fresh process on a CPU backend)  --json_out=
  --write_docs

Functions (tests call them at tiny sizes): `analytic_flops`, `xla_net_call_flops`, `find_max_batch`,
`bench_row`, `run_benchmark`, `pipeline_throughput`. The step they time is built by
experiments/trm/tools/step_setup.py (`recipe_config`, `trm_config`, `compile_step`), the matmul peak
and memory are measured by measure.py, and the table is printed by experiments/tools/doc_tables.py
(`format_table`) and merged into the docs by bench_cli.py (`write_docs`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # before TensorFlow is imported (via train)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax

from experiments.common import distributed
from experiments.common import layout as layout_lib
from experiments.tools import doc_tables
from experiments.trm import flops
from experiments.trm.tools import bench_cli
from experiments.trm.tools import measure
from experiments.trm.tools import step_setup

REFERENCE_MEMORY_NOTE = ("reference PyTorch needs ~0.056 GB per example in bf16 "
                         "(batch 768 ~ 45 GB)")
REFERENCE_FLOP_NOTE = ("reference: about 43 GFLOP per example per optimizer step "
                       "(TRM-MLP Sudoku: 25.6 forward + 17.1 backward)")

COLUMNS = ("model", "dtype", "batch", "global_batch", "remat", "compile_s", "step_ms",
           "examples_per_s", "rss_peak_GB", "compiled_temp_GB", "temp_arg_GB", "GB_per_example",
           "GFLOP_per_ex", "GFLOP_per_s", "peak_GFLOP_per_s", "frac_peak")
SEARCH_COLUMNS = ("model", "dtype", "remat", "batch", "compile_s", "compiled_temp_GB", "temp_arg_GB",
                  "fits")


def _log(msg: str) -> None:
  print(f"[bench] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# Analytic FLOPs.

FlopCount = flops.FlopCount
analytic_flops = flops.analytic_flops
xla_net_call_flops = flops.xla_net_call_flops


# --------------------------------------------------------------------------------------------------
# The rows: the largest batch that fits, one timed row (in this process or a fresh one).

def find_max_batch(model: str, dtype: str, candidates: Sequence[int], limit_gb: float, *,
                   hidden: Optional[int] = None) -> Tuple[Optional[int], bool, List[Dict[str, Any]]]:
  """Largest candidate per-device batch whose compiled temp + argument bytes fit in `limit_gb`.

  Compile-only (`memory_analysis()`), ascending, remat off first; remat on only for candidates above
  the largest that fits without it. Returns (batch or None, remat used, one row per compile).
  """
  rows: List[Dict[str, Any]] = []
  best: Dict[bool, Optional[int]] = {False: None, True: None}
  cands = sorted(set(int(b) for b in candidates))
  for remat in (False, True):
    todo = cands if not remat else [b for b in cands if best[False] is None or b > best[False]]
    for b in todo:
      setup = step_setup.compile_step(model, dtype, b, remat=remat, hidden=hidden)
      m = setup.memory
      fits = m["temp"] + m["arg"] <= limit_gb
      rows.append({"model": model, "dtype": dtype, "remat": remat, "batch": b,
                   "compile_s": setup.compile_s, "compiled_temp_GB": m["temp"],
                   "temp_arg_GB": m["temp"] + m["arg"], "fits": "yes" if fits else "no"})
      _log(f"  max-batch search {model} {dtype} remat={remat} batch {b}: temp "
           f"{m['temp']:.3f} GB + args {m['arg']:.3f} GB -> {'fits' if fits else 'too big'} "
           f"(compile {setup.compile_s:.1f} s)")
      del setup
      if not fits:
        break
      best[remat] = b
  if best[True] is not None and (best[False] is None or best[True] > best[False]):
    return best[True], True, rows
  return best[False], False, rows


def bench_row(model: str, dtype: str, per_device_batch: int, *, remat: bool = False,
              hidden: Optional[int] = None, steps: int = 3, warmup: int = 0,
              peaks: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
  """One table row: compile, time `steps` real training steps, memory, analytic FLOP/s."""
  reset_ok = measure.reset_peak_rss()
  label = f"{model} {dtype} batch {per_device_batch}{' remat' if remat else ''}"
  _log(f"{label}: compiling the pmapped train step ...")
  setup = step_setup.compile_step(model, dtype, per_device_batch, remat=remat, hidden=hidden)
  m = setup.memory
  _log(f"{label}: compiled in {setup.compile_s:.1f} s (temp {m['temp']:.3f} GB, "
       f"args {m['arg']:.3f} GB); {warmup} warm-up + {steps} timed steps")
  times = step_setup.time_steps(setup, steps, warmup, label)
  step_s = statistics.median(times)
  flops = analytic_flops(setup.cfg).total
  examples_per_s = setup.global_batch / step_s
  achieved = flops * examples_per_s
  peak = (peaks or {}).get(dtype, float("nan"))
  row = {"model": model, "dtype": dtype, "batch": per_device_batch,
         "global_batch": setup.global_batch, "remat": remat, "compile_s": setup.compile_s,
         "step_ms": 1e3 * step_s, "examples_per_s": examples_per_s,
         "rss_peak_GB": measure.peak_rss_gb(reset_ok), "compiled_temp_GB": m["temp"],
         "temp_arg_GB": m["temp"] + m["arg"],
         "GB_per_example": (m["temp"] + m["arg"]) / per_device_batch,
         "GFLOP_per_ex": flops / 1e9, "GFLOP_per_s": achieved / 1e9,
         "peak_GFLOP_per_s": peak / 1e9, "frac_peak": achieved / peak}
  of_peak = "" if math.isnan(peak) else f" ({row['frac_peak']:.1%} of the {dtype} matmul peak)"
  _log(f"{label}: median {row['step_ms']:.1f} ms/step, {examples_per_s:.2f} examples/s, "
       f"{row['GFLOP_per_s']:.2f} GFLOP/s{of_peak}")
  return row


def bench_row_subprocess(model: str, dtype: str, per_device_batch: int, *, remat: bool = False,
                         hidden: Optional[int] = None, steps: int = 3, warmup: int = 0,
                         peaks: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
  """`bench_row` in a fresh Python process (`--isolate`): its peak RSS and compile time are the row's
  alone. A failed child (e.g. killed for memory) gives a row of NaNs instead of stopping the run."""
  with tempfile.TemporaryDirectory(prefix="podlab_bench_row_") as tmp:
    out = os.path.join(tmp, "row.json")
    cmd = [sys.executable, "-m", "experiments.trm.tools.bench", f"--models={model}", f"--dtypes={dtype}",
           f"--batches={per_device_batch}", f"--remat={'true' if remat else 'false'}",
           f"--hidden={hidden or 0}", f"--steps={steps}", f"--warmup_steps={warmup}",
           f"--row_out={out}"]
    proc = subprocess.run(cmd, cwd=bench_cli.REPO_ROOT, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      _log(f"{model} {dtype} batch {per_device_batch}: the row's process failed (exit code "
           f"{proc.returncode}); recorded as NaN")
      nan = float("nan")
      row = {c: nan for c in COLUMNS}
      row.update(model=model, dtype=dtype, batch=per_device_batch,
                 global_batch=per_device_batch * jax.local_device_count(), remat=remat)
      return row
    with open(out) as fh:
      row = json.load(fh)
  peak = (peaks or {}).get(dtype, float("nan"))
  row["peak_GFLOP_per_s"] = peak / 1e9
  row["frac_peak"] = row["GFLOP_per_s"] * 1e9 / peak
  return row


# --------------------------------------------------------------------------------------------------
# Input pipeline.

def pipeline_throughput(data_dir: Optional[str] = None, *, batch_size: int = 768,
                        num_batches: int = 20, train_size: int = 4096) -> Dict[str, float]:
  """examples/s of the tf.data training stream alone (Sudoku augmentation on a generated dataset).

  Prepares a small `sudoku_generated` dataset (30 givens, `train_size` puzzles) in `data_dir` (a
  temporary folder, removed afterwards, when None), takes one batch (graph building, loading), then
  times `next()` over `num_batches` batches of `batch_size`.
  """
  from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
  from input_pipeline import prepare  # pylint: disable=g-import-not-at-top
  tmp = None
  if not data_dir:
    tmp = data_dir = tempfile.mkdtemp(prefix="podlab_bench_tfds_")
  try:
    kwargs = {"givens": 30, "train_size": max(train_size, batch_size), "test_size": 16,
              "num_workers": 1}
    t0 = time.perf_counter()
    prepare.prepare("sudoku_generated", data_dir, kwargs)
    prepare_s = time.perf_counter() - t0
    it = pipeline.create_train_iterator(data_dir, "sudoku_generated", kwargs,
                                        layout=layout_lib.of(batch_size, devices_per_host=1),
                                        seed=0)
    t0 = time.perf_counter()
    first = next(it)
    first_s = time.perf_counter() - t0
    assert first["inputs"].shape == (1, batch_size, 81), first["inputs"].shape
    times = []
    t_all = time.perf_counter()
    for _ in range(num_batches):
      t0 = time.perf_counter()
      next(it)
      times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    return {"batch": batch_size, "batches": num_batches, "prepare_s": prepare_s,
            "first_batch_s": first_s, "median_batch_ms": 1e3 * statistics.median(times),
            "examples_per_s": num_batches * batch_size / total}
  finally:
    if tmp:
      shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The docs block; the whole benchmark.

DOC_TABLE = "trm-bench-throughput"
DOC_WRITER = "`make bench-throughput THROUGHPUT_ARGS=--write_docs`"
DOC_KEY = ("model", "dtype", "batch", "remat")
"""The columns that name a row of the docs' table: a run's rows replace those of the same key."""


def flop_report(hidden: Optional[int] = None, xla_check: bool = True) -> List[str]:
  """Lines with the analytic FLOPs per example per step of both recipes (and XLA's one-call check)."""
  out = []
  for model in ("mlp", "att"):
    cfg = step_setup.trm_config(model, hidden=hidden)
    f = analytic_flops(cfg)
    line = (f"{model}: D={cfg.hidden_size} S={cfg.total_len} T={cfg.H_cycles} n={cfg.L_cycles}: "
            f"{f.total / 1e9:.2f} GFLOP/example/step = {f.forward / 1e9:.2f} forward + "
            f"{f.backward / 1e9:.2f} backward (one net call {f.net_call / 1e9:.4f}")
    if xla_check:
      line += f"; XLA cost_analysis of one net call {xla_net_call_flops(cfg) / 1e9:.4f}"
    out.append(line + ")")
  return out


def run_benchmark(models: Sequence[str], dtypes: Sequence[str], batches: Sequence[str], *,
                  steps: int = 3, warmup: int = 0, hidden: Optional[int] = None,
                  memory_limit_gb: float = 24.0,
                  max_candidates: Sequence[int] = (64, 128, 256, 384, 512, 768),
                  remat: bool = False, matmul_size: int = 2048, matmul_reps: int = 5,
                  isolate: bool = False
                  ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], Dict[str, float]]:
  """Returns (table rows, max-batch search rows, matmul peak FLOP/s by dtype).

  isolate: time each row in its own process (`bench_row_subprocess`); the max-batch search and the
  matmul peaks run in this one.
  """
  row_fn = bench_row_subprocess if isolate else bench_row
  peaks = {}
  for dtype in dtypes:
    peaks[dtype] = measure.matmul_peak_flops(dtype, matmul_size, matmul_reps)
    _log(f"matmul peak {dtype} ({matmul_size}^3, median of {matmul_reps}): "
         f"{peaks[dtype] / 1e9:.1f} GFLOP/s")
  rows, search = [], []
  for model in models:
    for dtype in dtypes:
      for b in batches:
        if str(b) == "max":
          _log(f"{model} {dtype}: searching the largest batch of {list(max_candidates)} within "
               f"{memory_limit_gb} GB (compile only)")
          best, use_remat, srows = find_max_batch(model, dtype, max_candidates, memory_limit_gb,
                                                  hidden=hidden)
          search.extend(srows)
          if best is None:
            _log(f"{model} {dtype}: no candidate batch fits in {memory_limit_gb} GB; skipped")
            continue
          _log(f"{model} {dtype}: max batch {best} (remat {'on' if use_remat else 'off'})")
          rows.append(row_fn(model, dtype, best, remat=use_remat, hidden=hidden, steps=steps,
                                warmup=warmup, peaks=peaks))
        else:
          rows.append(row_fn(model, dtype, int(b), remat=remat, hidden=hidden, steps=steps,
                                warmup=warmup, peaks=peaks))
  return rows, search, peaks


# --------------------------------------------------------------------------------------------------
# Command line.

def _define_flags() -> None:
  """Command-line flags, defined only when run as a program (importing has no side effects)."""
  flags.DEFINE_list("models", ["mlp", "att"], "Recipes: mlp (TRM-MLP), att (TRM-Att).")
  flags.DEFINE_list("dtypes", ["bfloat16", "float32"], "Compute dtypes.")
  flags.DEFINE_list("batches", ["64", "max"],
                    "Per-device batches: integers and/or 'max' (largest that fits).")
  flags.DEFINE_integer("steps", 3, "Timed optimizer steps per row (median reported).")
  flags.DEFINE_integer("warmup_steps", 0, "Untimed steps before the timed ones.")
  flags.DEFINE_integer("hidden", 0, "Override hidden_size (and puzzle_emb_ndim); 0 = 512.")
  flags.DEFINE_float("memory_limit_gb", 24.0, "Device-memory budget for 'max'.")
  flags.DEFINE_list("max_candidates", ["64", "128", "256", "384", "512", "768"],
                    "Per-device batches tried for 'max'.")
  flags.DEFINE_bool("remat", False, "Remat for integer batches ('max' chooses its own).")
  flags.DEFINE_integer("matmul_size", 2048, "Square matmul size for the peak.")
  flags.DEFINE_integer("matmul_reps", 5, "Timed matmuls (median).")
  flags.DEFINE_bool("pipeline", False, "Also time the tf.data input pipeline alone.")
  flags.DEFINE_integer("pipeline_batch", 768, "Pipeline batch size.")
  flags.DEFINE_integer("pipeline_batches", 20, "Pipeline batches timed.")
  flags.DEFINE_integer("pipeline_train_size", 4096, "Puzzles generated for the pipeline's dataset.")
  flags.DEFINE_string("data_dir", "", "TFDS dir for the pipeline dataset (default: temp).")
  flags.DEFINE_bool("quick", False,
                    "Smoke run: hidden 32, batches 2,max over 2,4,8, 1 step, 256^3 matmul, "
                    "pipeline batch 64 x 3 on 256 puzzles.")
  flags.DEFINE_string("json_out", "", "Also write the rows as JSON here.")
  flags.DEFINE_bool("write_docs", False, "Merge the table into docs/benchmarks.md's "
                    f"{DOC_TABLE} block (rows keyed by {', '.join(DOC_KEY)}).")
  flags.DEFINE_enum("isolate", "auto", ["auto", "true", "false"],
                    "Time each row in a fresh process (clean per-row peak RSS and compile time). "
                    "auto: on when JAX runs on the CPU (where RSS is the device memory), off on "
                    "accelerators (the parent would hold device memory).")
  flags.DEFINE_string("row_out", "", "Internal (--isolate): run the single row given by --models, "
                      "--dtypes, --batches, --remat and write it here as JSON.")


def main(argv: Sequence[str]) -> None:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  hidden = f.hidden or None
  if f.isolate == "true":                       # before the backend starts: leave the device to rows
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if f.row_out:                                 # one row, in a child process of --isolate
    row = bench_row(f.models[0], f.dtypes[0], int(f.batches[0]), remat=f.remat, hidden=hidden,
                    steps=f.steps, warmup=f.warmup_steps)
    with open(f.row_out, "w") as fh:
      json.dump(row, fh)
    return
  batches, candidates = list(f.batches), [int(b) for b in f.max_candidates]
  steps, matmul_size = f.steps, f.matmul_size
  p_batch, p_batches, p_train = f.pipeline_batch, f.pipeline_batches, f.pipeline_train_size
  if f.quick:
    hidden, batches, candidates, steps, matmul_size = 32, ["2", "max"], [2, 4, 8], 1, 256
    p_batch, p_batches, p_train = 64, 3, 256
  for b in batches:
    if b != "max" and not b.isdigit():
      raise app.UsageError(f"--batches: {b!r} is neither an integer nor 'max'")
  if f.write_docs and (f.quick or f.hidden):
    raise app.UsageError("--write_docs records the recipes' size: drop --quick and --hidden")
  if f.write_docs:                              # before hours of benchmark, not after
    doc_tables.check_markers(doc_tables.BENCHMARKS_DOC, DOC_TABLE, DOC_WRITER)
  isolate = f.isolate == "true" or (f.isolate == "auto" and jax.default_backend() == "cpu")
  _log(f"JAX {jax.__version__}, {jax.local_device_count()} x {jax.devices()[0].device_kind} "
       f"({jax.devices()[0].platform}); batches are per device; rows "
       f"{'each in a fresh process' if isolate else 'in this process'}")
  flop_lines = flop_report(hidden)
  for line in flop_lines:
    _log("analytic " + line)
  rows, search, peaks = run_benchmark(
      f.models, f.dtypes, batches, steps=steps, warmup=f.warmup_steps, hidden=hidden,
      memory_limit_gb=f.memory_limit_gb, max_candidates=candidates, remat=f.remat,
      matmul_size=matmul_size, matmul_reps=f.matmul_reps, isolate=isolate)
  pipe = None
  if f.pipeline:
    _log(f"input pipeline: preparing sudoku_generated ({p_train} puzzles) and timing "
         f"{p_batches} batches of {p_batch}")
    pipe = pipeline_throughput(f.data_dir or None, batch_size=p_batch, num_batches=p_batches,
                               train_size=p_train)

  print()
  title = (f"TRM training-step benchmark (Sudoku recipes; {jax.local_device_count()} x "
           f"{jax.devices()[0].device_kind}; timings are medians of {steps} step(s) within this run)")
  print(title)
  print(doc_tables.format_table(rows, COLUMNS))
  if search:
    print(f"\nMax-batch search (compile-only memory_analysis, limit {f.memory_limit_gb} GB on "
          "temp + argument bytes per device):")
    print(doc_tables.format_table(search, SEARCH_COLUMNS))
  print("\nMatmul peak measured in this run: " + ", ".join(
      f"{d} {p / 1e9:.1f} GFLOP/s" for d, p in peaks.items()) + f" ({matmul_size}^3)")
  print("Analytic FLOPs per example per optimizer step (model FLOPs, matmuls only):")
  for line in flop_lines:
    print("  " + line)
  print("  " + REFERENCE_FLOP_NOTE)
  print(f"Memory: {REFERENCE_MEMORY_NOTE}; GB_per_example above is this port's compiled "
        "(temp + argument) bytes per example.")
  print(f"Peak RSS of this process (getrusage ru_maxrss"
        f"{'; rows ran in their own processes' if isolate else ''}): "
        f"{measure.process_maxrss_gb():.2f} GB")
  if pipe is not None:
    print(f"Input pipeline alone (tf.data, Sudoku augmentation, batch {pipe['batch']}): "
          f"{pipe['examples_per_s']:,.0f} examples/s (median {pipe['median_batch_ms']:.1f} ms per "
          f"batch over {pipe['batches']}; first batch {pipe['first_batch_s']:.1f} s; dataset "
          f"prepared in {pipe['prepare_s']:.1f} s)")
  if f.json_out:
    with open(f.json_out, "w") as fh:
      json.dump({"rows": rows, "search": search, "matmul_peak_flops": peaks, "pipeline": pipe,
                 "analytic": flop_lines}, fh, indent=1)
  if f.write_docs:
    peak_line = "matmul peak " + ", ".join(f"{d} {p / 1e9:.1f} GFLOP/s" for d, p in peaks.items())
    bench_cli.write_docs(rows, doc_tables.command_line("experiments.trm.tools.bench", sys.argv[1:]),
                         f"{title}; {peak_line}", jax.devices()[0], name=DOC_TABLE,
                         writer=DOC_WRITER, columns=COLUMNS, key=DOC_KEY)
    _log(f"merged the table into {doc_tables.BENCHMARKS_DOC}'s {DOC_TABLE} table")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
