r"""podlab's training steps beside the references' on one CUDA device in one run (`make bench-gpu`).

Cells (bf16 throughout; every side starts from the same weights and batch):
  TRM-MLP / TRM-Att  the Sudoku recipes at `--trm_batches` (default 768 = the recipe's global batch
               on one device, and 256) beside tests/torch_trm_reference.py, under torch.compile
               (`ref_*` columns, as its authors run it) and eager (`eager_*`):
               experiments/trm/tools/bench_gpu.py.
  GPT-2 124M   configs/gpt2_124m.py at `--gpt_batch` sequences per step, one micro-step, beside
               nanoGPT's iteration (bf16 autocast, fused AdamW, grad clip 1.0) under torch.compile
               (nanoGPT's compile=True) and eager: experiments/nanogpt/tools/bench_gpu.py.
Each side runs `--warmup` untimed steps, then `--steps` timed ones (median and p10-p90; each step
ends with the device synchronized: experiments/tools/step_timing.py). On a GPU each side runs in its
own process (`--isolate`, default on a GPU), so its peak device memory is its own: JAX's allocator
`peak_bytes_in_use` (the ref side builds podlab's initial weights on the host CPU) and torch's
`max_memory_allocated`.

Columns, per cell (ms per optimizer step; items = examples for TRM, tokens for GPT):
  *_ms, *_p10, *_p90  median, 10th and 90th percentile.
  *_items_s           items per step / median.
  *_TFLOP_s, *_MFU    model FLOPs per step (TRM: experiments/trm/flops.py analytic count; GPT:
                      nanoGPT's 6N + 12LHQT per token) / median, and that over the device's dense
                      bf16 peak (experiments/common/mfu.py: the vendors' figure; measured on a CPU).
  *_mem_GB            peak device memory of the side (NaN on a CPU).
  speed               podlab items/s over the compiled reference's; speed_eager: over eager's.
  loss0_podlab, loss0_ref  the first step's loss on each side (TRM: lm_loss summed over the batch;
                      GPT: mean cross-entropy), the same weights and batch: they agree to bf16
                      precision.

Command lines:

  python -m experiments.tools.bench_gpu                         # the full table on a CUDA GPU
  python -m experiments.tools.bench_gpu --cells=trm --trm_models=mlp --trm_batches=768
  python -m experiments.tools.bench_gpu --no_compile            # reference eager only
  python -m experiments.tools.bench_gpu --quick                 # smoke: tiny sizes (runs on a CPU)
  make bench-gpu BENCH_GPU_ARGS='--steps=20 --json_out=/tmp/gpu.json'

On a GPU image without podlab's stack (JAX with CUDA, torch, optax, orbax, flax, einops; no
TensorFlow, TFDS, CLU, dm-haiku, ml-collections or jmp), experiments/tools/gpu_wheels.sh
downloads the missing pure-Python wheels here and prints the command to run there.

Flags: --cells=trm,gpt  --trm_models=mlp,att  --trm_batches=768,256  --gpt_batch=12  --steps=10
  --warmup=3  --no_compile  --no_eager  --isolate=auto|true|false  --quick  --json_out=PATH
  --side=... --row_out=... (internal: one side of one cell, in a child process)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import mfu  # noqa: E402
from experiments.tools import doc_tables  # noqa: E402
from experiments.tools import step_timing  # noqa: E402

SIDES = ("podlab", "ref", "eager")
"""podlab's step; the reference under torch.compile (its authors' default); the reference eager."""
_SIDE_COLUMNS = ("ms", "p10", "p90", "items_s", "TFLOP_s", "MFU", "mem_GB")
COLUMNS = (("cell", "batch") + tuple(f"podlab_{c}" for c in _SIDE_COLUMNS)
           + tuple(f"ref_{c}" for c in _SIDE_COLUMNS)
           + ("eager_ms", "eager_mem_GB", "speed", "speed_eager", "loss0_podlab", "loss0_ref"))
CELL_NAMES = {"trm:mlp": "TRM-MLP bf16", "trm:att": "TRM-Att bf16", "gpt": "GPT-2 124M bf16"}
CELL_MODULES = {"trm": "experiments.trm.tools.bench_gpu",
                "gpt": "experiments.nanogpt.tools.bench_gpu"}
"""The registry of the experiments' cells (`--cells`): modules named by string and loaded by
`cells`, TRM's with `trm_side` and `MODELS`, GPT-2's with `gpt_side`, so that experiments/tools/
imports no experiment (as tpu_check.ROW_MODULES)."""


def cells(name: str):
  """The module of the experiment's cells `name` ("trm" or "gpt"; CELL_MODULES)."""
  return importlib.import_module(CELL_MODULES[name])


# --------------------------------------------------------------------------------------------------
# Cells, sides in this process or each in its own.

def run_side(cell: str, side: str, batch: int, *, steps: int, warmup: int,
             quick: bool) -> Dict[str, Any]:
  """`cell` is "trm:mlp", "trm:att" or "gpt"."""
  if cell == "gpt":
    return cells("gpt").gpt_side(side, batch, steps=steps, warmup=warmup, quick=quick)
  return cells("trm").trm_side(side, cell.split(":")[1], batch, steps=steps, warmup=warmup,
                               quick=quick)


def run_side_subprocess(cell: str, side: str, batch: int, *, steps: int, warmup: int,
                        quick: bool) -> Dict[str, Any]:
  """`run_side` in a fresh process: its peak device memory is its own. A reference side builds
  podlab's initial weights on the host CPU (JAX_PLATFORMS=cpu), leaving the GPU to torch. A failed
  child (e.g. out of memory) gives NaNs."""
  with tempfile.TemporaryDirectory(prefix="podlab_bench_gpu_") as tmp:
    out = os.path.join(tmp, "side.json")
    env = dict(os.environ)
    if side != "podlab":
      env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-m", "experiments.tools.bench_gpu", f"--side={side}",
           f"--cell={cell}", f"--batch={batch}", f"--steps={steps}", f"--warmup={warmup}",
           f"--row_out={out}"] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=doc_tables.REPO_ROOT, env=env, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      step_timing.log(f"{cell} batch {batch} {side}: the process failed (exit code "
                      f"{proc.returncode}); NaN")
      return {k: float("nan") for k in ("ms", "p10", "p90", "loss0", "mem_GB", "items", "flops")}
    with open(out) as fh:
      return json.load(fh)


def cell_row(cell: str, batch: int, sides: Dict[str, Dict[str, Any]], peak_flops: float
             ) -> Dict[str, Any]:
  """One table row from the sides' results (a missing side's columns NaN)."""
  nan = float("nan")
  row: Dict[str, Any] = {"cell": CELL_NAMES[cell], "batch": batch}
  for side in SIDES:
    r = sides.get(side) or {}
    ms = r.get("ms", nan)
    per_s = 1e3 / ms if ms == ms and ms > 0 else nan
    row.update({f"{side}_ms": ms, f"{side}_p10": r.get("p10", nan),
                f"{side}_p90": r.get("p90", nan),
                f"{side}_items_s": r.get("items", nan) * per_s,
                f"{side}_TFLOP_s": r.get("flops", nan) * per_s / 1e12,
                f"{side}_mem_GB": r.get("mem_GB", nan)})
    row[f"{side}_MFU"] = row[f"{side}_TFLOP_s"] * 1e12 / peak_flops
  row["speed"] = row["podlab_items_s"] / row["ref_items_s"]
  row["speed_eager"] = row["podlab_items_s"] / row["eager_items_s"]
  row["loss0_podlab"] = (sides.get("podlab") or {}).get("loss0", nan)
  row["loss0_ref"] = next((sides[s]["loss0"] for s in ("ref", "eager") if s in sides), nan)
  return row


def run(cells: Sequence[str], trm_batches: Sequence[int], gpt_batch: int, *, steps: int,
        warmup: int, sides: Sequence[str] = SIDES, isolate: bool = False,
        quick: bool = False) -> List[Dict[str, Any]]:
  """The table's rows: every cell's sides, in this process or (isolate) each in its own."""
  fn = run_side_subprocess if isolate else run_side
  peak = mfu.peak_flops_per_device()
  rows = []
  for cell in cells:
    for batch in ([gpt_batch] if cell == "gpt" else trm_batches):
      results = {s: fn(cell, s, batch, steps=steps, warmup=warmup, quick=quick) for s in sides}
      rows.append(cell_row(cell, batch, results, peak))
  return rows


def _csv(text: str) -> List[str]:
  return [x for x in text.split(",") if x]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m experiments.tools.bench_gpu",
                               description=__doc__.split("\n")[0])
  ap.add_argument("--cells", type=_csv, default=["trm", "gpt"])
  ap.add_argument("--trm_models", type=_csv, default=["mlp", "att"])
  ap.add_argument("--trm_batches", type=_csv, default=["768", "256"])
  ap.add_argument("--gpt_batch", type=int, default=12, help="sequences of 1024 tokens per step")
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--no_compile", action="store_true", help="no torch.compile reference column")
  ap.add_argument("--no_eager", action="store_true", help="no eager reference column")
  ap.add_argument("--isolate", default="auto", choices=["auto", "true", "false"],
                  help="each side in its own process (auto: on a GPU)")
  ap.add_argument("--quick", action="store_true",
                  help="smoke run at tiny sizes (TRM hidden 32, batch 4; GPT 2x2x32, block 32, "
                       "batch 4), 2 steps after 1 warm-up; flags given explicitly still win")
  ap.add_argument("--json_out", default="")
  ap.add_argument("--side", default="", choices=["", *SIDES], help=argparse.SUPPRESS)
  ap.add_argument("--cell", default="", help=argparse.SUPPRESS)
  ap.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
  ap.add_argument("--row_out", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.quick:
    doc_tables.quick_defaults(args, argv, trm_models=["mlp"], trm_batches=["4"], gpt_batch=4,
                              steps=2, warmup=1)
  for c in args.cells:
    if c not in CELL_MODULES:
      ap.error(f"--cells: {c!r}; use trm and/or gpt")
  for m in args.trm_models:
    if m not in cells("trm").MODELS:
      ap.error(f"--trm_models: {m!r}; use mlp and/or att")
  for b in args.trm_batches:
    if not b.isdigit() or int(b) <= 0:
      ap.error(f"--trm_batches: {b!r} is not a positive integer")
  if args.gpt_batch <= 0 or args.steps < 1 or args.warmup < 1:
    ap.error(f"--gpt_batch={args.gpt_batch}, --steps={args.steps}, --warmup={args.warmup}: use "
             "positive values (one warm-up step at least: the first step compiles)")
  if args.no_compile and args.no_eager:
    ap.error("--no_compile with --no_eager leaves no reference: drop one of them")
  return args


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: no libtpu probe (and its warnings)
  args = parse_args(argv)
  if args.row_out:                   # one side, in a child process of --isolate
    out = run_side(args.cell, args.side, args.batch, steps=args.steps, warmup=args.warmup,
                   quick=args.quick)
    with open(args.row_out, "w") as fh:
      json.dump(out, fh)
    return 0
  on_gpu = jax.default_backend() == "gpu"     # where the steps run: this process's own device
  isolate = args.isolate == "true" or (args.isolate == "auto" and on_gpu)
  if isolate:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # the parent leaves the GPU
  sides = [s for s in SIDES if not (s == "ref" and args.no_compile)
           and not (s == "eager" and args.no_eager)]
  cells = ([f"trm:{m}" for m in args.trm_models] * ("trm" in args.cells)
           + ["gpt"] * ("gpt" in args.cells))
  torch = step_timing.import_torch()
  device = jax.devices()[0]
  header = [f"device: {device.device_kind} ({device.platform}); JAX {jax.__version__}, PyTorch "
            f"{torch.__version__}; peak {mfu.peak_flops_per_device() / 1e12:.3g} TFLOP/s "
            "(experiments/common/mfu.py: dense bf16 on a GPU, measured float32 on a CPU); "
            f"{args.steps} timed steps after {args.warmup} warm-up; "
            f"sides {'each in its own process' if isolate else 'in one process'}"]
  step_timing.log(header[0])
  rows = run(cells, [int(b) for b in args.trm_batches], args.gpt_batch, steps=args.steps,
             warmup=args.warmup, sides=sides, isolate=isolate, quick=args.quick)
  print()
  print("podlab vs the references, bf16 training steps on one device (ref = torch.compile, the "
        "references' default; eager = without it)")
  doc_tables.print_table(header, rows, COLUMNS, args.json_out)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
