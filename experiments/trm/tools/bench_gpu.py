r"""podlab's training steps beside the references' on one CUDA device, in one run (`make bench-gpu`).

Cells (bf16 throughout; every side starts from the same weights and batch):
  TRM-MLP / TRM-Att  the Sudoku recipes at `--trm_batches` (default 768 = the recipe's global batch on
               one device, and 256). podlab: the trainer's real pmapped step (experiments/trm/tools/
               bench.py `compile_step`). Reference: tests/torch_trm_reference.py `TrainStep` (the
               reference's model, ACT training wrapper, loss, AdamATan2, SignSGD, EMA; checked step
               for step against podlab by tests/test_trm_reference_step.py) with podlab's initial
               weights (bench_reference.py `reference_step`), run as its authors run it: the model's
               forward under `torch.compile` (`ref_*` columns), and eager (`eager_*`).
  GPT-2 124M   configs/gpt2_124m.py (12 x 12 x 768, block 1024, vocab 50304) at `--gpt_batch`
               sequences per step, one micro-step. podlab: the trainer's step. Reference: nanoGPT's
               iteration (experiments/nanogpt/tools/torch_reference.py, its model.py's modules and
               names, with podlab's initial weights): bf16 autocast, fused AdamW, grad clip 1.0, the
               model under torch.compile (nanoGPT's compile=True), and eager.
Each side runs `--warmup` untimed steps, then `--steps` timed ones (median and p10-p90; each step
ends with the device synchronized). On a GPU each side runs in its own process (`--isolate`, default
on a GPU), so its peak device memory is its own: JAX's allocator `peak_bytes_in_use` (the ref side
builds podlab's initial weights on the host CPU) and torch's `max_memory_allocated`.

Columns, per cell (ms per optimizer step; items = examples for TRM, tokens for GPT):
  *_ms, *_p10, *_p90  median, 10th and 90th percentile.
  *_items_s           items per step / median.
  *_TFLOP_s, *_MFU    model FLOPs per step (TRM: experiments/trm/flops.py analytic count; GPT:
                      nanoGPT's 6N + 12LHQT per token) / median, and that over the device's dense bf16
                      peak (experiments/common/mfu.py: the vendors' figure; measured on a CPU).
  *_mem_GB            peak device memory of the side (NaN on a CPU).
  speed               podlab items/s over the compiled reference's; speed_eager: over eager's.
  loss0_podlab, loss0_ref  the first step's loss on each side (TRM: lm_loss summed over the batch;
                      GPT: mean cross-entropy), the same weights and batch: they agree to bf16
                      precision.

Command lines:

  python -m experiments.trm.tools.bench_gpu                         # the full table on a CUDA GPU
  python -m experiments.trm.tools.bench_gpu --cells=trm --trm_models=mlp --trm_batches=768
  python -m experiments.trm.tools.bench_gpu --no_compile            # reference eager only
  python -m experiments.trm.tools.bench_gpu --quick                 # smoke: tiny sizes (runs on a CPU)
  make bench-gpu BENCH_GPU_ARGS='--steps=20 --json_out=/tmp/gpu.json'

On a GPU image without podlab's stack (JAX with CUDA, torch, optax, orbax, flax, einops; no
TensorFlow, TFDS, CLU, dm-haiku, ml-collections or jmp), experiments/trm/tools/gpu_wheels.sh
downloads the missing pure-Python wheels here and prints the command to run there.

Flags: --cells=trm,gpt  --trm_models=mlp,att  --trm_batches=768,256  --gpt_batch=12  --steps=10
  --warmup=3  --no_compile  --no_eager  --isolate=auto|true|false  --quick  --json_out=PATH
  --side=... --row_out=... (internal: one side of one cell, in a child process)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import layout as layout_lib  # noqa: E402
from experiments.common import mfu  # noqa: E402
from experiments.common import parallel  # noqa: E402
from experiments.common import trainer  # noqa: E402
from experiments.nanogpt import nanogpt_checkpoint  # noqa: E402
from experiments.nanogpt import train as gpt_train  # noqa: E402
from experiments.nanogpt.configs import gpt2_124m  # noqa: E402
from experiments.trm import flops  # noqa: E402
from experiments.trm.tools import bench_cli  # noqa: E402
from experiments.trm.tools import bench_reference  # noqa: E402
from experiments.trm.tools import measure  # noqa: E402
from experiments.trm.tools import step_setup  # noqa: E402
from modules import gpt  # noqa: E402

GB = 1e9
SIDES = ("podlab", "ref", "eager")
"""podlab's step; the reference under torch.compile (its authors' default); the reference eager."""
COLUMNS = (("cell", "batch") + tuple(f"podlab_{c}" for c in ("ms", "p10", "p90", "items_s", "TFLOP_s",
                                                              "MFU", "mem_GB"))
           + tuple(f"ref_{c}" for c in ("ms", "p10", "p90", "items_s", "TFLOP_s", "MFU", "mem_GB"))
           + ("eager_ms", "eager_mem_GB", "speed", "speed_eager", "loss0_podlab", "loss0_ref"))
QUICK_TRM = dict(hidden=32)
QUICK_GPT = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=128)


def _log(msg: str) -> None:
  print(f"[bench_gpu] {msg}", flush=True)


def _torch(quick: bool = False):
  torch, _ = bench_reference._torch()  # pylint: disable=protected-access  (the one torch import)
  if quick and not torch.cuda.is_available():
    torch.set_num_threads(1)   # a smoke run's tiny eager ops on a shared CPU: no threads to wait on
  return torch


def _sync(torch) -> None:
  if torch.cuda.is_available():
    torch.cuda.synchronize()


def _first(x) -> float:
  """A replicated or per-device scalar's value on the first local device."""
  return float(np.ravel(np.asarray(jax.device_get(x)))[0])


def _jax_peak_gb() -> float:
  stats = jax.local_devices()[0].memory_stats()
  return stats["peak_bytes_in_use"] / GB if stats and "peak_bytes_in_use" in stats else float("nan")


def _torch_peak_gb(torch) -> float:
  return torch.cuda.max_memory_allocated() / GB if torch.cuda.is_available() else float("nan")


def _device(torch) -> str:
  return "cuda" if torch.cuda.is_available() else "cpu"


def _timed(one: Callable[[], float], steps: int, warmup: int, label: str) -> Dict[str, Any]:
  """Runs `one` (a step, device synchronized, returning its loss) warmup + steps times."""
  t0 = time.perf_counter()
  loss0 = one()
  _log(f"{label}: first step {time.perf_counter() - t0:.2f} s (compilation included), loss "
       f"{loss0:.6g}")
  for _ in range(max(warmup - 1, 0)):
    one()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    one()
    times.append(time.perf_counter() - t0)
  p = measure.percentiles_ms(times)
  _log(f"{label}: median {p['ms']:.2f} ms (p10 {p['p10']:.2f}, p90 {p['p90']:.2f})")
  return {**p, "loss0": loss0}


# --------------------------------------------------------------------------------------------------
# TRM.

def _trm_config(model: str, batch: int, quick: bool):
  return step_setup.recipe_config(model, "bfloat16",
                                  per_device_batch=batch // jax.local_device_count(),
                                  hidden=QUICK_TRM["hidden"] if quick else None)


def trm_side(side: str, model: str, batch: int, *, steps: int, warmup: int,
             quick: bool = False) -> Dict[str, Any]:
  """One side of a TRM cell: {ms, p10, p90, loss0, mem_GB, items, flops} per optimizer step."""
  config = _trm_config(model, batch, quick)
  label = f"TRM-{model} batch {batch} {side}"
  if side == "podlab":
    setup = step_setup.compile_config_step(config)
    state, carry, b, di = setup.args
    setup.args = (None, None, b, di)                         # state and carry get donated

    def one() -> float:
      nonlocal state, carry
      state, carry, sums = setup.compiled(state, carry, b, di)
      return _first(sums["lm_loss"])                         # reads back: the step has finished
    out = _timed(one, steps, warmup, label)
    out["mem_GB"] = _jax_peak_gb()
  else:
    torch = _torch(quick)
    setup = step_setup.compile_config_step(config, compile=False)   # podlab's first weights, batch
    device = _device(torch)
    if device != "cpu":
      torch.set_default_device(device)      # the reference's tensors on the GPU as it creates them
    t_step, t_batch, _ = bench_reference.reference_step(setup, config)
    t_step.generator = torch.Generator(device=device).manual_seed(0)
    t_batch = {k: v.to(device) for k, v in t_batch.items()}
    t_carry = t_step.act.initial_carry(t_batch)
    if side == "ref":                                        # the reference's default: compiled
      inner = t_step.act.inner
      inner.forward = torch.compile(inner.forward)
    if torch.cuda.is_available():
      torch.cuda.reset_peak_memory_stats()

    def one() -> float:
      nonlocal t_carry
      t_carry, metrics = t_step(t_carry, t_batch)
      _sync(torch)
      return float(metrics["lm_loss"])
    out = _timed(one, steps, warmup, label)
    out["mem_GB"] = _torch_peak_gb(torch)
  out["items"] = float(batch)
  out["flops"] = flops.analytic_flops(setup.cfg).total * batch
  return out


# --------------------------------------------------------------------------------------------------
# GPT-2 124M.

def _gpt_config(batch: int, quick: bool):
  c = gpt2_124m.get_config()
  layout_lib.set_batch(c, batch, accum=1)
  c.model.dtype = "bfloat16"
  if quick:
    for k, v in QUICK_GPT.items():
      setattr(c.model, k, v)
  trainer.check_config(gpt_train.NanoGPT(), c)
  return c


def _gpt_podlab(c):
  """(layout, built, model config, initial state) of podlab's GPT step, without data."""
  layout, built = trainer.build(gpt_train.NanoGPT(), c)
  state, _ = trainer.init_state(built, c)
  return layout, built, built.model_config, state


def gpt_side(side: str, batch: int, *, steps: int, warmup: int, quick: bool = False) -> Dict[str, Any]:
  """One side of the GPT-2 cell (one micro-step of `batch` sequences per optimizer step)."""
  c = _gpt_config(batch, quick)
  layout, built, cfg, state = _gpt_podlab(c)
  T, V = cfg.block_size, cfg.vocab_size
  n_params = gpt.num_params(state.params)
  window = np.random.default_rng(c.seed).integers(0, V, (batch, T + 1)).astype(np.int32)
  label = f"GPT-2 batch {batch} {side}"
  if side == "podlab":
    n = layout.devices_per_host
    w = window.reshape(n, 1, layout.per_device_batch, T + 1)
    data = parallel.shard({"x": w[..., :-1], "y": w[..., 1:]})
    di = parallel.shard(parallel.device_indices())
    step = trainer.parallel_train_step(built.train_step, c.nonfinite, seed=c.seed)
    box = {"state": parallel.replicate(state)}

    def one() -> float:
      box["state"], _, sums = step(box["state"], None, data, di)
      return _first(sums["loss"])
    out = _timed(one, steps, warmup, label)
    out["mem_GB"] = _jax_peak_gb()
  else:
    torch = _torch(quick)
    from experiments.nanogpt.tools import torch_reference  # pylint: disable=g-import-not-at-top  (torch is optional)
    device = _device(torch)
    if device != "cpu":
      torch.set_default_device(device)
    args = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=T,
                vocab_size=V, bias=cfg.bias)
    model = torch_reference.GPT(args)
    sd = nanogpt_checkpoint.to_state_dict(jax.device_get(state.params), cfg)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(                                 # nanoGPT's configure_optimizers
        [{"params": [p for p in named.values() if p.dim() >= 2], "weight_decay": c.weight_decay},
         {"params": [p for p in named.values() if p.dim() < 2], "weight_decay": 0.0}],
        lr=c.lr, betas=(c.beta1, c.beta2), eps=1e-8, fused=device == "cuda")
    forward = torch.compile(model) if side == "ref" else model
    x = torch.as_tensor(window[:, :-1], dtype=torch.long, device=device)
    y = torch.as_tensor(window[:, 1:], dtype=torch.long, device=device)
    if torch.cuda.is_available():
      torch.cuda.reset_peak_memory_stats()

    def one() -> float:
      with torch.autocast(device_type=device, dtype=torch.bfloat16):
        logits = forward(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
      loss.backward()
      if c.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
      opt.step()
      opt.zero_grad(set_to_none=True)
      return float(loss.item())                              # nanoGPT reads the loss: a sync
    out = _timed(one, steps, warmup, label)
    out["mem_GB"] = _torch_peak_gb(torch)
  out["items"] = float(batch * T)
  out["flops"] = gpt.flops_per_token(cfg, n_params) * batch * T
  return out


# --------------------------------------------------------------------------------------------------
# Cells, sides in this process or each in its own.

def run_side(cell: str, side: str, batch: int, *, steps: int, warmup: int,
             quick: bool) -> Dict[str, Any]:
  """`cell` is "trm:mlp", "trm:att" or "gpt"."""
  if cell == "gpt":
    return gpt_side(side, batch, steps=steps, warmup=warmup, quick=quick)
  return trm_side(side, cell.split(":")[1], batch, steps=steps, warmup=warmup, quick=quick)


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
    cmd = [sys.executable, "-m", "experiments.trm.tools.bench_gpu", f"--side={side}",
           f"--cell={cell}", f"--batch={batch}", f"--steps={steps}", f"--warmup={warmup}",
           f"--row_out={out}"] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=bench_cli.REPO_ROOT, env=env, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      _log(f"{cell} batch {batch} {side}: the process failed (exit code {proc.returncode}); NaN")
      return {k: float("nan") for k in ("ms", "p10", "p90", "loss0", "mem_GB", "items", "flops")}
    with open(out) as fh:
      return json.load(fh)


CELL_NAMES = {"trm:mlp": "TRM-MLP bf16", "trm:att": "TRM-Att bf16", "gpt": "GPT-2 124M bf16"}


def cell_row(cell: str, batch: int, sides: Dict[str, Dict[str, Any]], peak_flops: float
             ) -> Dict[str, Any]:
  """One table row from the sides' results (a missing side's columns NaN)."""
  nan = float("nan")
  row: Dict[str, Any] = {"cell": CELL_NAMES[cell], "batch": batch}
  for side in SIDES:
    r = sides.get(side) or {}
    ms = r.get("ms", nan)
    per_s = 1e3 / ms if ms == ms and ms > 0 else nan
    row.update({f"{side}_ms": ms, f"{side}_p10": r.get("p10", nan), f"{side}_p90": r.get("p90", nan),
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


_csv = bench_reference._csv  # pylint: disable=protected-access  (the same comma lists)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m experiments.trm.tools.bench_gpu",
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
    bench_cli.quick_defaults(args, argv, trm_models=["mlp"], trm_batches=["4"], gpt_batch=4,
                             steps=2, warmup=1)
  for c in args.cells:
    if c not in ("trm", "gpt"):
      ap.error(f"--cells: {c!r}; use trm and/or gpt")
  for m in args.trm_models:
    if m not in step_setup.RECIPES:
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
  cells = [f"trm:{m}" for m in args.trm_models] * ("trm" in args.cells) + ["gpt"] * ("gpt" in args.cells)
  torch = _torch()
  device = jax.devices()[0]
  header = [f"device: {device.device_kind} ({device.platform}); JAX {jax.__version__}, PyTorch "
            f"{torch.__version__}; peak {mfu.peak_flops_per_device() / 1e12:.3g} TFLOP/s (experiments/"
            f"common/mfu.py: dense bf16 on a GPU, measured float32 on a CPU); {args.steps} timed steps after {args.warmup} warm-up; "
            f"sides {'each in its own process' if isolate else 'in one process'}"]
  _log(header[0])
  rows = run(cells, [int(b) for b in args.trm_batches], args.gpt_batch, steps=args.steps,
             warmup=args.warmup, sides=sides, isolate=isolate, quick=args.quick)
  print()
  print("podlab vs the references, bf16 training steps on one device (ref = torch.compile, the "
        "references' default; eager = without it)")
  bench_cli.print_table(header, rows, COLUMNS, args.json_out)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
