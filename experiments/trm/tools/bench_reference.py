r"""podlab's TRM training step beside the reference's PyTorch training step, in one process (`make bench`).

Per cell (model mlp/att, compute dtype, batch), both steps are built from the same Sudoku recipe and
the same starting weights (podlab's init, exported to the reference's state_dict):
  podlab      the trainer's real pmapped step (experiments/trm/tools/bench.py `compile_step`: AdamATan2,
              EMA, sparse SignSGD, the non-finite guard), state and carry fed back and donated; on a
              CPU target with config.cpu_tuning (the recipes' default) it carries the CPU forms
              (--forms: experiments/trm/cpu_tuning.py).
  reference   tests/torch_trm_reference.py `TrainStep`: the reference's model code in PyTorch eager,
              the ACT wrapper in training mode, float64 stablemax + Q-halt loss, backward, AdamATan2
              and SignSGD at the scheduled rates, EMA; parity with podlab's step is checked by
              tests/test_trm_reference_step.py.
After `--warmup` untimed steps of each (default 3), the two run in alternating blocks (`--block`
steps of podlab, then of the reference, `--steps` times), so slow and fast periods of a shared machine
fall on both alike; then one more untimed step of each measures its heap. The warm-up is 3 steps
because podlab's first steps are slower than the rest while the glibc heap (kept: host_malloc) still
grows: a step whose scratch finds no free block of its size faults fresh pages in (TRM-Att float32
at batch 64: ~470,000 minor faults = its 1.84 GB scratch, 5-7 s of system time, a 18.5 s step
against 14.6 s; in steps 0-3 of a run). Each round's log line gives the step's minor page faults.

Columns (times in ms per optimizer step; batch = examples per step, the global batch):
  *_ms, *_p10, *_p90   median, 10th and 90th percentile of the timed steps.
  *_ex_s               batch / median.
  *_heap_GB            peak C-heap bytes in use during one more, untimed step of that framework
                       after the timed rounds (glibc mallinfo2, sampled every 100 ms; sampling
                       during the timed steps slowed both frameworks' steps by 3-5%, and every 5 ms
                       the reference's small eager ops several-fold, through the malloc lock; both
                       frameworks allocate through malloc). With the glibc
                       heap kept (host_malloc.keep_heap, on as in training) freed memory stays in the
                       process, so its RSS cannot be split between the two; this can.
  speed_ratio          podlab examples/s / reference examples/s (> 1: podlab is faster).
  rss_peak_GB          the process's peak RSS (VmHWM) over the cell, both frameworks.
The header names the CPU, whether it has native bfloat16 (avx512_bf16 / amx_bf16), XLA's usable cores
and torch's thread count (set equal), and each framework's matmul rate on this machine per dtype (one
TRM-sized product, `matmul_rates`): the ceiling that each framework's matmul library sets here (on a
CPU with AMX, PyTorch's oneDNN ran bfloat16 products 2.0-3.0x faster than XLA:CPU, whose rate there
varies by +-20% from call to call: docs/benchmarks.md).

Command lines:

  python -m experiments.trm.tools.bench_reference                     # 2 models x 2 dtypes x {64, 256}
  python -m experiments.trm.tools.bench_reference --models=mlp --dtypes=float32 --batches=64 --steps=3
  python -m experiments.trm.tools.bench_reference --quick             # smoke: hidden 32, batch 4
  python -m experiments.trm.tools.bench_reference --rates_only --matmul_shapes=3104x512x3072,3104x3072x512
      # the header alone: each framework's matmul rate at TRM-Att's projection shapes (one
      # 32-example slice of 97 positions: gate|up, and down's input gradient)

Flags: --models=mlp,att  --dtypes=float32,bfloat16  --batches=64,256  --steps=3  --block=1  --warmup=3
  --hidden=0 (the recipe's 512)  --quick  --no_keep_heap  --no_fast_grad  --no_reference
  --forms=all (or none, or a comma list of fast_grad,seq_major,unroll,head_major,lean_swiglu,
    split_reduce,batch_slices,nograd_chunks,pad_contraction,split_gate_up: which CPU forms podlab
    uses)
  --json_out=PATH  --matmul_shapes=4096x512x2048 (the header's products, MxKxN, comma-separated)
  --rates_only (print the header, with its matmul rates, and stop)
  --write_docs: merge the table, as printed, into docs/benchmarks.md's trm-bench block
    (experiments/tools/doc_tables.py: the command, commit, machine, date and this header; rows
    keyed by model, dtype and batch replace those of the same key, the others stay, each naming
    its run): make bench BENCH_ARGS='--models=mlp --dtypes=bfloat16 --batches=64 --write_docs'
At the recipe size one step takes 10-40 s per framework on a 2-core CPU: narrow the cells.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import cpu_features  # noqa: E402
from experiments.common import distributed  # noqa: E402
from experiments.common import host_malloc  # noqa: E402
from experiments.common import parallel  # noqa: E402
from experiments.tools import doc_tables  # noqa: E402
from experiments.tools import step_timing  # noqa: E402
from experiments.trm import cpu_tuning  # noqa: E402
from experiments.trm import reference_checkpoint  # noqa: E402
from experiments.trm import train  # noqa: E402
from experiments.trm.tools import bench_cli  # noqa: E402
from experiments.trm.tools import measure  # noqa: E402
from experiments.trm.tools import step_setup  # noqa: E402

GB = 1e9
COLUMNS = ("model", "dtype", "batch", "podlab_ms", "podlab_p10", "podlab_p90", "podlab_ex_s",
           "podlab_heap_GB", "ref_ms", "ref_p10", "ref_p90", "ref_ex_s", "ref_heap_GB",
           "speed_ratio", "rss_peak_GB")
DOC_TABLE = "trm-bench"
DOC_WRITER = "`make bench BENCH_ARGS=--write_docs`"


def _log(msg: str) -> None:
  print(f"[bench_reference] {msg}", flush=True)


def _torch():
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise SystemExit("bench_reference needs PyTorch (the reference's framework): "
                     "pip install -e '.[torch]'") from None
  from tests import torch_trm_reference  # pylint: disable=import-outside-toplevel
  return torch, torch_trm_reference


# --------------------------------------------------------------------------------------------------
# Heap in use (glibc mallinfo2), sampled while a block runs.

class _MallInfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in (
      "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
      "fordblks", "keepcost")]


class HeapSampler:
  """Peak of malloc'd bytes in use (uordblks + hblkhd) between start() and stop(); NaN off glibc."""

  def __init__(self, interval_s: float = 0.1):
    self.interval_s = interval_s
    self._fn = None
    if host_malloc.is_glibc():
      try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
        fn.restype = _MallInfo2
        self._fn = fn
      except AttributeError:      # glibc < 2.33
        self._fn = None
    self.peak = 0
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def in_use(self) -> int:
    m = self._fn()
    return int(m.uordblks + m.hblkhd)

  def _run(self):
    while not self._stop.wait(self.interval_s):
      self.peak = max(self.peak, self.in_use())

  def start(self):
    if self._fn is None:
      return
    self.peak = max(self.peak, self.in_use())
    self._stop.clear()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def stop(self):
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self.peak = max(self.peak, self.in_use())
      self._thread = None

  @property
  def peak_gb(self) -> float:
    return self.peak / GB if self._fn is not None else float("nan")


# --------------------------------------------------------------------------------------------------
# The reference's step for a podlab setup.

def reference_step(setup: step_setup.StepSetup, config, seed: int = 0):
  """(TrainStep, batch, carry) of the reference with podlab's starting weights and batch."""
  torch, ref = _torch()
  cfg = setup.cfg
  rcfg = ref.RefConfig(seq_len=cfg.seq_len, vocab_size=cfg.vocab_size,
                       num_puzzle_identifiers=cfg.num_puzzle_identifiers,
                       puzzle_emb_ndim=cfg.emb_ndim, puzzle_emb_len=cfg.puzzle_emb_len,
                       hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
                       expansion=cfg.expansion, H_cycles=cfg.H_cycles, L_cycles=cfg.L_cycles,
                       L_layers=cfg.L_layers, pos_encodings=cfg.pos_encodings, mlp_t=cfg.mlp_t,
                       rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                       halt_max_steps=cfg.halt_max_steps, forward_dtype=cfg.forward_dtype,
                       init_dtype="bfloat16")
  state = parallel.unreplicate(setup.args[0])
  table = train.host_puzzle_table(setup.args[0].puzzle_table, setup.args[1],   # replicated or sharded
                                  cfg.num_puzzle_identifiers)
  sd = reference_checkpoint.export_reference(state.params, state.model_state, table, cfg)
  model = ref.TorchTRM(rcfg)
  model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32).copy()).to(
      model.state_dict()[k].dtype) for k, v in sd.items()})
  tcfg = ref.TrainConfig(setup.global_batch, lr=config.lr,
                         puzzle_emb_lr=config.puzzle_emb_lr, weight_decay=config.weight_decay,
                         puzzle_emb_weight_decay=config.puzzle_emb_weight_decay,
                         beta1=config.beta1, beta2=config.beta2,
                         lr_warmup_steps=config.lr_warmup_steps, total_steps=config.total_steps,
                         lr_min_ratio=config.lr_min_ratio,
                         halt_exploration_prob=cfg.halt_exploration_prob,
                         ema_rate=config.ema_rate if config.ema else None)
  host = step_setup.random_batch(1, setup.global_batch, config.seed)
  batch = {k: torch.from_numpy(v[0]) for k, v in host.items()}
  step = ref.TrainStep(model, tcfg, seed=seed)
  return step, batch, model.model.initial_carry(batch)


# --------------------------------------------------------------------------------------------------
# One cell.

def run_cell(model: str, dtype: str, batch: int, *, steps: int = 3, block: int = 1,
             hidden: Optional[int] = None, fast_grad: bool = True,
             reference: bool = True, forms: str = "all",
             warmup: int = 3) -> Dict[str, Any]:
  """Compiles podlab's step, builds the reference's, runs `warmup` untimed steps of each, then
  `steps` alternating blocks; one row.
  `fast_grad=False`: podlab without the CPU forms (config.cpu_tuning off); `forms`: some of
  them (cpu_tuning.FORMS); `reference=False`: podlab alone (the reference's columns NaN)."""
  reset_ok = measure.reset_peak_rss()
  label = f"{model} {dtype} batch {batch}"
  tuning = None if fast_grad else False
  config = step_setup.recipe_config(model, dtype, hidden=hidden, per_device_batch=batch,
                                    cpu_tuning=tuning)
  _log(f"{label}: compiling podlab's pmapped step ...")
  setup = step_setup.compile_step(model, dtype, batch, hidden=hidden, cpu_tuning=tuning,
                                  forms=forms)
  _log(f"{label}: compiled in {setup.compile_s:.1f} s ({setup.forms_text()})"
       + ("; building the reference's step" if reference else ""))
  if reference:
    t_step, t_batch, t_carry = reference_step(setup, config)
  state, carry, p_batch, device_index = setup.args
  setup.args = (None, None, p_batch, device_index)        # donated below
  times: Dict[str, List[float]] = {"podlab": [], "ref": []}
  heap = {"podlab": HeapSampler(), "ref": HeapSampler()}

  def podlab_once():
    nonlocal state, carry
    state, carry, sums = setup.compiled(state, carry, p_batch, device_index)
    jax.block_until_ready((state, carry, sums))

  def ref_once():
    nonlocal t_carry
    t_carry, _ = t_step(t_carry, t_batch)

  runs = {"podlab": podlab_once, "ref": ref_once}
  if not reference:
    del runs["ref"]
  for i in range(warmup):                                  # untimed steps, alternating
    for name, fn in runs.items():
      f0, t0 = measure.minor_page_faults(), time.perf_counter()
      fn()
      _log(f"{label}: {name} warm-up step {i + 1}/{warmup} {time.perf_counter() - t0:.3f} s "
           f"({measure.minor_page_faults() - f0:,} minor page faults)")
  for r in range(steps):
    for name, fn in runs.items():
      f0 = measure.minor_page_faults()
      for _ in range(block):
        t0 = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t0)
      _log(f"{label}: round {r + 1}/{steps} {name}: "
           + ", ".join(f"{t:.3f}" for t in times[name][-block:])
           + f" s ({measure.minor_page_faults() - f0:,} minor page faults)")
  for name, fn in runs.items():          # the heap round: sampled, untimed (sampling costs 3-5%)
    heap[name].start()
    fn()
    heap[name].stop()
  _log(f"{label}: heap round (one untimed step each) done")
  del state, carry
  row: Dict[str, Any] = {"model": model, "dtype": dtype, "batch": setup.global_batch,
                         **{n: setup.forms[n] for n in ("fast_grad", "seq_major", "unroll",
                                                         "head_major", "lean_swiglu",
                                                         "split_reduce", "batch_slices")}}
  nan = float("nan")
  row.update({f"ref_{k}": nan for k in ("ms", "p10", "p90", "ex_s", "heap_GB")})
  for name in runs:
    p = step_timing.percentiles_ms(times[name])
    row.update({f"{name}_ms": p["ms"], f"{name}_p10": p["p10"], f"{name}_p90": p["p90"],
                f"{name}_ex_s": setup.global_batch / (p["ms"] / 1e3),
                f"{name}_heap_GB": heap[name].peak_gb})
  row["speed_ratio"] = row["podlab_ex_s"] / row["ref_ex_s"]
  row["rss_peak_GB"] = measure.peak_rss_gb(reset_ok)
  _log(f"{label}: podlab {row['podlab_ms']:.1f} ms, reference {row['ref_ms']:.1f} ms: "
       f"podlab at {row['speed_ratio']:.2f}x the reference's speed")
  return row


MATMUL_SHAPE = (4096, 512, 2048)
"""[M, K] @ [K, N] of the header's matmul rates: a TRM recipe's projection (K = hidden 512) on the
~4,000 token rows of one batch slice."""


def matmul_rates(dtypes: Sequence[str], shape: Sequence[int] = MATMUL_SHAPE,
                 reps: int = 7) -> Dict[str, Dict[str, float]]:
  """{framework: {dtype: GFLOP/s}}: the median rate of one [M, K] @ [K, N] product of operands in
  the dtype under XLA (`measure.matmul_peak_flops` at this shape: float32 result, as podlab's
  projections ask for) and PyTorch (eager, its thread count as set; result in the dtype, as the
  reference's nn.Linear), on this machine. Says how fast each framework's matmul library is here,
  e.g. whether it uses the CPU's bfloat16 units, which bounds the steps' ratio."""
  torch, _ = _torch()
  m, k, n = shape
  a32 = np.random.default_rng(0).standard_normal((m, k), dtype=np.float32)
  b32 = np.random.default_rng(1).standard_normal((k, n), dtype=np.float32)

  def torch_rate(ta, tb) -> float:
    ta @ tb  # pylint: disable=pointless-statement
    times = []
    for _ in range(reps):
      t0 = time.perf_counter()
      ta @ tb  # pylint: disable=pointless-statement
      times.append(time.perf_counter() - t0)
    return 2.0 * m * k * n / statistics.median(times) / 1e9

  out: Dict[str, Dict[str, float]] = {"XLA": {}, "PyTorch": {}}
  for dtype in dtypes:
    out["XLA"][dtype] = measure.matmul_peak_flops(dtype, reps=reps, shape=shape) / 1e9
    tdt = getattr(torch, dtype)
    out["PyTorch"][dtype] = torch_rate(torch.from_numpy(a32).to(tdt), torch.from_numpy(b32).to(tdt))
  return out


def header_lines(threads: int, keep_heap: bool,
                 rates: Optional[Dict[str, Dict[str, float]]] = None,
                 shape: Sequence[int] = MATMUL_SHAPE) -> List[str]:
  """The table's header; `rates`: `matmul_rates` of a product of `shape`."""
  torch, _ = _torch()
  lines = [f"CPU: {cpu_features.describe()}",
           f"threads: XLA uses the {cpu_features.usable_cores()} usable cores; "
           f"torch.set_num_threads({threads})",
           f"JAX {jax.__version__} ({jax.local_device_count()} x {jax.devices()[0].platform}), "
           f"PyTorch {torch.__version__} eager; glibc heap kept (host_malloc): "
           f"{'on' if keep_heap else 'off'}"]
  if rates:
    m, k, n = shape
    lines.append(f"matmul GFLOP/s, one [{m}, {k}] @ [{k}, {n}] product: " + "; ".join(
        f"{fw} " + ", ".join(f"{d} {r:.0f}" for d, r in by_dtype.items())
        for fw, by_dtype in rates.items()))
  return lines


def _csv(text: str) -> List[str]:
  return [x for x in text.split(",") if x]


def _shapes(text: str) -> List[tuple]:
  """"MxKxN,MxKxN" -> [(M, K, N), ...] (argparse type of --matmul_shapes)."""
  out = []
  for item in _csv(text):
    parts = item.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
      raise argparse.ArgumentTypeError(
          f"{item!r} is not MxKxN with three positive integers (e.g. 3104x512x3072)")
    out.append(tuple(int(p) for p in parts))
  if not out:
    raise argparse.ArgumentTypeError("give at least one MxKxN shape")
  return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m experiments.trm.tools.bench_reference",
                               description=__doc__.split("\n")[0])
  ap.add_argument("--models", type=_csv, default=["mlp", "att"])
  ap.add_argument("--dtypes", type=_csv, default=["float32", "bfloat16"])
  ap.add_argument("--batches", type=_csv, default=["64", "256"])
  ap.add_argument("--steps", type=int, default=3, help="timed blocks per framework")
  ap.add_argument("--block", type=int, default=1, help="steps per block")
  ap.add_argument("--warmup", type=int, default=3,
                  help="untimed steps of each framework before the timed blocks (podlab's first "
                       "steps fault its heap in)")
  ap.add_argument("--hidden", type=int, default=0, help="0: the recipe's 512")
  ap.add_argument("--quick", action="store_true",
                  help="smoke run: hidden 32, batch 4, 1 warm-up step, 2 blocks (flags given explicitly "
                       "still win)")
  ap.add_argument("--no_keep_heap", action="store_true", help="glibc's default heap behaviour")
  ap.add_argument("--no_fast_grad", action="store_true",
                  help="podlab without the CPU matmul forms (config.cpu_tuning=False)")
  ap.add_argument("--forms", default="all",
                  help="which CPU forms podlab uses: all, none or a comma list of "
                       f"{','.join(cpu_tuning.FORMS)}")
  ap.add_argument("--no_reference", action="store_true",
                  help="podlab alone (to compare podlab variants; the reference's columns are NaN)")
  ap.add_argument("--json_out", default="")
  ap.add_argument("--matmul_shapes", type=_shapes, default=[MATMUL_SHAPE],
                  help="the header's matmul products, MxKxN comma-separated (default "
                       f"{'x'.join(map(str, MATMUL_SHAPE))})")
  ap.add_argument("--rates_only", action="store_true",
                  help="print the header with its matmul rates and stop (no training steps)")
  ap.add_argument("--write_docs", action="store_true",
                  help=f"merge the table into docs/benchmarks.md's {DOC_TABLE} block (rows keyed "
                       "by model, dtype and batch)")
  args = ap.parse_args(argv)
  if args.write_docs and (args.quick or args.hidden or args.rates_only):
    ap.error("--write_docs records the recipes' table: drop --quick, --hidden and --rates_only")
  if args.quick:
    doc_tables.quick_defaults(args, argv, hidden=32, batches=["4"], steps=2, models=["mlp"],
                             dtypes=["float32"], warmup=1)
  for m in args.models:
    if m not in step_setup.RECIPES:
      ap.error(f"--models: {m!r}; use mlp and/or att")
  for d in args.dtypes:
    if d not in ("float32", "bfloat16"):
      ap.error(f"--dtypes: {d!r}; use float32 and/or bfloat16")
  for b in args.batches:
    if not b.isdigit() or int(b) <= 0:
      ap.error(f"--batches: {b!r} is not a positive integer")
  if args.steps < 1 or args.block < 1:
    ap.error("--steps and --block must be >= 1")
  if args.warmup < 0:
    ap.error(f"--warmup={args.warmup}: use 0 or more untimed steps")
  try:
    cpu_tuning.parse_forms(args.forms)
  except ValueError as e:
    ap.error(f"--{e}")
  return args


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  args = parse_args(argv)
  keep = (not args.no_keep_heap) and host_malloc.keep_heap()   # before the backends' threads
  torch, _ = _torch()
  if args.write_docs:                          # before the benchmark's hours, not after
    doc_tables.check_markers(doc_tables.BENCHMARKS_DOC, DOC_TABLE, DOC_WRITER)
  threads = cpu_features.usable_cores()
  torch.set_num_threads(threads)
  first, *more = args.matmul_shapes
  header = header_lines(threads, keep, matmul_rates(args.dtypes, shape=first), shape=first)
  for shape in more:
    header.append(header_lines(threads, keep, matmul_rates(args.dtypes, shape=shape),
                               shape=shape)[-1])
  if args.rates_only:
    for line in header:
      print(line)
    return 0
  for line in header:
    _log(line)
  rows = []
  for model in args.models:
    for dtype in args.dtypes:
      for b in args.batches:
        rows.append(run_cell(model, dtype, int(b), steps=args.steps, block=args.block,
                             warmup=args.warmup,
                             hidden=args.hidden or None, fast_grad=not args.no_fast_grad,
                             reference=not args.no_reference, forms=args.forms))
  print()
  print(f"TRM training step, podlab vs the reference (PyTorch), Sudoku recipes"
        f"{f' at hidden {args.hidden}' if args.hidden else ''}; {args.steps} alternating block(s) "
        f"of {args.block} step(s) each after {args.warmup} untimed step(s) of each")
  forms = ("podlab CPU forms (--forms): "
           f"{'off (cpu_tuning False)' if args.no_fast_grad else args.forms}")
  doc_tables.print_table(header + [forms], rows, COLUMNS, args.json_out)
  if args.write_docs:
    bench_cli.write_docs(rows,
                         doc_tables.command_line("experiments.trm.tools.bench_reference", argv),
                         "; ".join(header + [forms]), jax.devices()[0], name=DOC_TABLE,
                         writer=DOC_WRITER, columns=COLUMNS, key=("model", "dtype", "batch"))
    _log(f"merged the table into {doc_tables.BENCHMARKS_DOC}'s {DOC_TABLE} table")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
