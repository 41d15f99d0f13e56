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

Functions (tests call them at tiny sizes): `trm_config`, `analytic_flops`, `xla_net_call_flops`,
`matmul_peak_flops`, `compile_step`, `find_max_batch`, `bench_row`, `run_benchmark`, `format_table`,
`pipeline_throughput`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # before TensorFlow is imported (via train)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.common import distributed
from experiments.common import layout as layout_lib
from experiments.common import parallel
from experiments.common import trainer
from experiments.tools import doc_tables
from experiments.trm import cpu_tuning
from experiments.trm import flops
from experiments.trm import train
from experiments.trm.configs import sudoku_att
from experiments.trm.configs import sudoku_mlp
from modules import layers
from modules import trm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SUDOKU_METADATA = {"seq_len": 81, "vocab_size": 11, "num_puzzle_identifiers": 1}
RECIPES = {"mlp": sudoku_mlp.get_config, "att": sudoku_att.get_config}
REFERENCE_TOTAL_STEPS = 65_104           # Sudoku at batch 768 (docs/trm.md section 5): the LR schedule
REFERENCE_MEMORY_NOTE = ("reference PyTorch needs ~0.056 GB per example in bf16 "
                         "(batch 768 ~ 45 GB)")
REFERENCE_FLOP_NOTE = ("reference: about 43 GFLOP per example per optimizer step "
                       "(TRM-MLP Sudoku: 25.6 forward + 17.1 backward)")
GB = 1e9

COLUMNS = ("model", "dtype", "batch", "global_batch", "remat", "compile_s", "step_ms",
           "examples_per_s", "rss_peak_GB", "compiled_temp_GB", "temp_arg_GB", "GB_per_example",
           "GFLOP_per_ex", "GFLOP_per_s", "peak_GFLOP_per_s", "frac_peak")
SEARCH_COLUMNS = ("model", "dtype", "remat", "batch", "compile_s", "compiled_temp_GB", "temp_arg_GB",
                  "fits")


def _log(msg: str) -> None:
  print(f"[bench] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# Configs.

def recipe_config(model: str, dtype: str, *, hidden: Optional[int] = None, remat: bool = False,
                  per_device_batch: int = 64,
                  cpu_tuning: Optional[bool] = None) -> ml_collections.ConfigDict:
  """The real Sudoku recipe config ("mlp" or "att") with compute dtype, remat, optional hidden size;
  `cpu_tuning` False turns the CPU-only forms off (None: the config's own, on)."""
  if model not in RECIPES:
    raise ValueError(f"unknown model {model!r}; use one of {sorted(RECIPES)}")
  c = RECIPES[model]()
  c.model.forward_dtype = dtype
  c.model.remat = bool(remat)
  if hidden:
    c.model.hidden_size = int(hidden)
    c.model.puzzle_emb_ndim = int(hidden)     # the recipes' E = D
  c, _ = layout_lib.with_per_device_batch(c, per_device_batch, jax.local_device_count())
  c.total_steps = REFERENCE_TOTAL_STEPS
  if cpu_tuning is not None:
    c.cpu_tuning = bool(cpu_tuning)
  trainer.check_config(train.TRM(), c)
  return c


def trm_config(model: str, dtype: str = "bfloat16", *, hidden: Optional[int] = None,
               remat: bool = False) -> trm.TRMConfig:
  """TRMConfig of a recipe via `train.model_config` and the Sudoku metadata (L 81, V 11, N 1)."""
  return train.model_config(recipe_config(model, dtype, hidden=hidden, remat=remat),
                            SUDOKU_METADATA)


# --------------------------------------------------------------------------------------------------
# Analytic FLOPs.

FlopCount = flops.FlopCount
analytic_flops = flops.analytic_flops
xla_net_call_flops = flops.xla_net_call_flops


# --------------------------------------------------------------------------------------------------
# Matmul peak.

def matmul_peak_flops(dtype: str, size: int = 2048, reps: int = 5,
                      shape: Optional[Sequence[int]] = None) -> float:
  """Median FLOP/s of a jitted [size, size] @ [size, size] (bfloat16: f32 accumulation, as the model);
  `shape` = (M, K, N): an [M, K] @ [K, N] product instead."""
  m, k, n = shape or (size, size, size)
  dt = jnp.dtype(dtype)
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (m, k), jnp.float32).astype(dt)
  b = jax.random.normal(kb, (k, n), jnp.float32).astype(dt)
  dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  dot(a, b).block_until_ready()
  times = []
  for _ in range(max(1, reps)):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - t0)
  return 2.0 * m * k * n / statistics.median(times)


# --------------------------------------------------------------------------------------------------
# Memory.

def reset_peak_rss() -> bool:
  """Resets this process's VmHWM (Linux >= 4.0); False where that is not possible."""
  try:
    with open("/proc/self/clear_refs", "w") as fh:
      fh.write("5")
    return True
  except OSError:
    return False


def peak_rss_gb(reset_ok: bool) -> float:
  """VmHWM since the last reset (when `reset_ok`), else getrusage's process-lifetime ru_maxrss."""
  if reset_ok:
    try:
      with open("/proc/self/status") as fh:
        for line in fh:
          if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    except OSError:
      pass
  return process_maxrss_gb()


def minor_page_faults() -> int:
  """This process's minor page faults so far: fresh pages touched (a step that grew the heap shows
  as hundreds of thousands; docs/benchmarks.md, "Warm-up")."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def process_maxrss_gb() -> float:
  scale = 1 if sys.platform == "darwin" else 1024      # bytes on macOS, KiB on Linux
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / GB


def _memory(compiled) -> Dict[str, float]:
  m = compiled.memory_analysis()
  if m is None:
    return {"temp": float("nan"), "arg": float("nan"), "out": float("nan"), "alias": float("nan")}
  return {"temp": m.temp_size_in_bytes / GB, "arg": m.argument_size_in_bytes / GB,
          "out": m.output_size_in_bytes / GB, "alias": m.alias_size_in_bytes / GB}


# --------------------------------------------------------------------------------------------------
# The real training step.

@dataclasses.dataclass
class StepSetup:
  """A compiled train step and fresh on-device arguments for it."""
  cfg: trm.TRMConfig
  per_device_batch: int
  global_batch: int
  compiled: Any
  compile_s: float
  memory: Dict[str, float]
  args: Tuple[Any, Any, Any, Any]          # state, carry, batch, device_index
  slices: int = 1                          # cpu_tuning.batch_slices: the batch's slices per step
  forms: Dict[str, Any] = dataclasses.field(default_factory=dict)   # cpu_tuning.carried

  def forms_text(self) -> str:
    """Which CPU forms the compiled step carries, e.g. "fast_grad True, ..., batch_slices 2"."""
    return cpu_tuning.forms_text(self.forms)


def random_batch(n_local: int, per_device: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """Sudoku-shaped random batch [n_local, b, ...]: inputs in {blank, digits}, labels digits."""
  rng = np.random.default_rng(seed)
  L, V = SUDOKU_METADATA["seq_len"], SUDOKU_METADATA["vocab_size"]
  return {"inputs": rng.integers(1, V, (n_local, per_device, L)).astype(np.int32),
          "labels": rng.integers(2, V, (n_local, per_device, L)).astype(np.int32),
          "puzzle_identifiers": np.zeros((n_local, per_device), np.int32)}


def compile_step(model: str, dtype: str, per_device_batch: int, *, remat: bool = False,
                 hidden: Optional[int] = None, cpu_tuning: Optional[bool] = None,
                 forms: str = "all") -> StepSetup:
  """Builds state/carry/batch as `train.train_and_evaluate` does and AOT-compiles the pmapped step
  (`forms`: the CPU forms it may carry, as `compile_config_step`)."""
  return compile_config_step(recipe_config(model, dtype, hidden=hidden, remat=remat,
                                           per_device_batch=per_device_batch,
                                           cpu_tuning=cpu_tuning), forms=forms)


def compile_config_step(config: ml_collections.ConfigDict, compile: bool = True,  # pylint: disable=redefined-builtin
                        forms: str = "all") -> StepSetup:
  """`compile_step` for any TRM config (e.g. configs/cpu_demo.py's), on a random Sudoku-shaped batch;
  `compile=False`: the state, carry and batch alone (`compiled` None, `memory` empty). `forms`: on
  a CPU target (config.cpu_tuning), the CPU forms the step carries: "all" (a run's), "none" or a
  comma list of cpu_tuning.FORMS (`cpu_tuning.override`)."""
  with cpu_tuning.override(forms):
    return _compile_config_step(config, compile)


def _compile_config_step(config: ml_collections.ConfigDict, compile: bool) -> StepSetup:  # pylint: disable=redefined-builtin
  layout, b = trainer.build(train.TRM(), config)  # the trainer's own step and state
  per_device_batch, n_local = layout.per_device_batch, layout.devices_per_host
  cfg = b.model_config
  state, carry = trainer.init_state(b, config)
  state, carry = parallel.replicate(state), parallel.shard(carry)
  batch = parallel.shard(random_batch(n_local, per_device_batch, config.seed))
  device_index = parallel.shard(parallel.device_indices())
  slices = cpu_tuning.batch_slices(config.batch_slices, cfg, per_device_batch, layout.cpu_tuning)
  forms = cpu_tuning.carried(cfg, bool(b.compiler_options), slices)
  if not compile:
    return StepSetup(cfg=cfg, per_device_batch=per_device_batch,
                     global_batch=per_device_batch * n_local, compiled=None, compile_s=0.0,
                     memory={}, args=(state, carry, batch, device_index), slices=slices,
                     forms=forms)
  p_step = trainer.parallel_train_step(b.train_step, config.nonfinite, seed=config.seed,
                                       rng_step_offset=train.TRM.rng_step_offset)
  t0 = time.perf_counter()
  compiled = p_step.lower(state, carry, batch, device_index).compile(
      compiler_options=dict(b.compiler_options) or None)         # the trainer's XLA options
  compile_s = time.perf_counter() - t0
  return StepSetup(cfg=cfg, per_device_batch=per_device_batch,
                   global_batch=per_device_batch * n_local, compiled=compiled, compile_s=compile_s,
                   memory=_memory(compiled), args=(state, carry, batch, device_index),
                   slices=slices, forms=forms)


def quick_defaults(args: Any, argv: Sequence[str], **defaults: Any) -> None:
  """For a tool's `--quick` smoke run: sets each `defaults` attribute of the parsed `args` unless its
  flag (`--name`) was given on the command line `argv` (flags given explicitly still win)."""
  given = {a.split("=")[0] for a in argv}
  for name, value in defaults.items():
    if f"--{name}" not in given:
      setattr(args, name, value)


def time_steps(setup: StepSetup, steps: int, warmup: int = 0, label: str = "") -> List[float]:
  """Runs warmup + steps optimizer steps (carry and state fed back); returns the timed seconds."""
  state, carry, batch, device_index = setup.args
  setup.args = (None, None, batch, device_index)          # state and carry get donated
  times = []
  for i in range(warmup + steps):
    t0 = time.perf_counter()
    state, carry, sums = setup.compiled(state, carry, batch, device_index)
    jax.block_until_ready((state, carry, sums))
    dt = time.perf_counter() - t0
    kind = "warm-up" if i < warmup else "timed"
    _log(f"  {label} step {i + 1}/{warmup + steps} ({kind}): {dt:.3f} s")
    if i >= warmup:
      times.append(dt)
  del state, carry
  return times


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
      setup = compile_step(model, dtype, b, remat=remat, hidden=hidden)
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
  reset_ok = reset_peak_rss()
  label = f"{model} {dtype} batch {per_device_batch}{' remat' if remat else ''}"
  _log(f"{label}: compiling the pmapped train step ...")
  setup = compile_step(model, dtype, per_device_batch, remat=remat, hidden=hidden)
  m = setup.memory
  _log(f"{label}: compiled in {setup.compile_s:.1f} s (temp {m['temp']:.3f} GB, "
       f"args {m['arg']:.3f} GB); {warmup} warm-up + {steps} timed steps")
  times = time_steps(setup, steps, warmup, label)
  step_s = statistics.median(times)
  flops = analytic_flops(setup.cfg).total
  examples_per_s = setup.global_batch / step_s
  achieved = flops * examples_per_s
  peak = (peaks or {}).get(dtype, float("nan"))
  row = {"model": model, "dtype": dtype, "batch": per_device_batch,
         "global_batch": setup.global_batch, "remat": remat, "compile_s": setup.compile_s,
         "step_ms": 1e3 * step_s, "examples_per_s": examples_per_s,
         "rss_peak_GB": peak_rss_gb(reset_ok), "compiled_temp_GB": m["temp"],
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
    proc = subprocess.run(cmd, cwd=REPO_ROOT, check=False)
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
# The table.

def _fmt(v: Any) -> str:
  if isinstance(v, bool):
    return "on" if v else "off"
  if isinstance(v, float):
    if math.isnan(v):
      return "nan"
    if v == 0:
      return "0"
    a = abs(v)
    if a >= 1000:
      return f"{v:,.0f}"
    if a >= 10:
      return f"{v:.1f}"
    if a >= 0.01:
      return f"{v:.3f}"
    return f"{v:.2e}"
  return str(v)


def format_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
  """Fixed-width text table of `rows` (dicts) with a header line of `columns`."""
  cells = [list(columns)] + [[_fmt(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in cells]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


DOC_TABLE = "trm-bench-throughput"
DOC_WRITER = "`make bench-throughput THROUGHPUT_ARGS=--write_docs`"
DOC_KEY = ("model", "dtype", "batch", "remat")
"""The columns that name a row of the docs' table: a run's rows replace those of the same key."""


def doc_rows(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> List[Dict[str, str]]:
  """`rows`' cells as `format_table` prints them."""
  return [{c: _fmt(r.get(c, "")) for c in columns} for r in rows]


def write_docs(rows: Sequence[Dict[str, Any]], command: str, note: str = "", device=None, *,
               name: str = DOC_TABLE, writer: str = DOC_WRITER, columns: Sequence[str] = COLUMNS,
               key: Sequence[str] = DOC_KEY, path: str = doc_tables.BENCHMARKS_DOC) -> str:
  """Merges the table's rows, as printed, into `path`'s block `name` (experiments/tools/doc_tables.py:
  keyed by `key`, each row's run named above the table); returns the block. bench_reference.py
  writes its own block through this too."""
  return doc_tables.write_table(path, name, writer, command=command, columns=columns,
                                rows=doc_rows(rows, columns), key=key, note=note, device=device)


def print_table(header: Sequence[str], rows: Sequence[Dict[str, Any]], columns: Sequence[str],
                json_out: str = "") -> None:
  """Prints `header`'s lines and the table of `rows`; with `json_out`, writes {"header", "rows"}
  there too (the side-by-side tools' output)."""
  for line in header:
    print(line)
  print(format_table(rows, columns))
  if json_out:
    with open(json_out, "w") as fh:
      json.dump({"header": list(header), "rows": list(rows)}, fh, indent=1)


def flop_report(hidden: Optional[int] = None, xla_check: bool = True) -> List[str]:
  """Lines with the analytic FLOPs per example per step of both recipes (and XLA's one-call check)."""
  out = []
  for model in ("mlp", "att"):
    cfg = trm_config(model, hidden=hidden)
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
    peaks[dtype] = matmul_peak_flops(dtype, matmul_size, matmul_reps)
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
  print(format_table(rows))
  if search:
    print(f"\nMax-batch search (compile-only memory_analysis, limit {f.memory_limit_gb} GB on "
          "temp + argument bytes per device):")
    print(format_table(search, SEARCH_COLUMNS))
  print("\nMatmul peak measured in this run: " + ", ".join(
      f"{d} {p / 1e9:.1f} GFLOP/s" for d, p in peaks.items()) + f" ({matmul_size}^3)")
  print("Analytic FLOPs per example per optimizer step (model FLOPs, matmuls only):")
  for line in flop_lines:
    print("  " + line)
  print("  " + REFERENCE_FLOP_NOTE)
  print(f"Memory: {REFERENCE_MEMORY_NOTE}; GB_per_example above is this port's compiled "
        "(temp + argument) bytes per example.")
  print(f"Peak RSS of this process (getrusage ru_maxrss"
        f"{'; rows ran in their own processes' if isolate else ''}): {process_maxrss_gb():.2f} GB")
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
    write_docs(rows, doc_tables.command_line("experiments.trm.tools.bench", sys.argv[1:]),
               f"{title}; {peak_line}", jax.devices()[0])
    _log(f"merged the table into {doc_tables.BENCHMARKS_DOC}'s {DOC_TABLE} table")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
