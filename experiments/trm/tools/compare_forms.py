r"""podlab's TRM training step compiled with several CPU-form lists, timed in alternating rounds.

Each variant is the trainer's real pmapped step (experiments/trm/tools/bench.py `compile_step` /
`compile_config_step`: AdamATan2, EMA, sparse SignSGD, the non-finite guard) carrying one list of
CPU forms ("all", "none" or a comma list of fast_grad, seq_major, unroll, head_major, lean_swiglu,
split_reduce, batch_slices, nograd_chunks, pad_contraction, split_gate_up: experiments/trm/
cpu_tuning.py FORMS, turned off with `cpu_tuning.override`; docs/trm.md section 11),
optionally followed by `/slices=N` for config.batch_slices (the training step on N slices of the
batch in turn; docs/trm.md section 11). All variants are compiled in one process, then run in turn:
first `--warmup` untimed steps of each (default 2: a run's first steps still grow the kept heap and
fault fresh pages in; docs/benchmarks.md, "Warm-up"), then per round one untimed step of each variant
(its state and carry carried on from its last step) and `--per_round` timed steps of it, so the
machine's slow and fast periods fall on every variant alike. Each round's line gives every variant's
time and, in brackets, its timed steps' minor page faults. This is how the effect of
one form is measured here (one process per variant mixes in minutes of the machine's drift).

Columns:
  forms            the variant's list of CPU forms.
  ms, p10, p90     median, 10th and 90th percentile of its timed steps (ms per optimizer step).
  vs_first         median / the first variant's median - 1 (negative: faster).
  won              rounds in which its median beat the first variant's (the first row: -).
  temp_GB          the compiled program's scratch (memory_analysis().temp_size_in_bytes).
  lm_loss          the last step's summed lm_loss (the variants' numerics side by side).

Command lines:

  python -m experiments.trm.tools.compare_forms --model=att --dtype=float32 \
      --forms=all --forms=fast_grad,seq_major,unroll,split_reduce --rounds=6
  python -m experiments.trm.tools.compare_forms --model=demo --forms=all --forms=none
  python -m experiments.trm.tools.compare_forms --model=demo --forms=all --forms=all/slices=2
  python -m experiments.trm.tools.compare_forms --quick        # smoke: hidden 32, batch 4, 2 rounds, no warm-up

Flags: --model=demo|mlp|att (demo: configs/cpu_demo.py's model, float32, batch 128)
  --dtype=float32|bfloat16 (recipes)  --batch=0 (0: the config's; 64 for the recipes)
  --hidden=0 (recipes: 0 = 512)  --forms=LIST (repeat; default: all, then none)  --rounds=4
  --per_round=1  --warmup=2  --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import cpu_features  # noqa: E402
from experiments.common import distributed  # noqa: E402
from experiments.common import host_malloc  # noqa: E402
from experiments.common import layout as layout_lib  # noqa: E402
from experiments.tools import doc_tables  # noqa: E402
from experiments.tools import step_timing  # noqa: E402
from experiments.trm import cpu_tuning  # noqa: E402
from experiments.trm.configs import cpu_demo  # noqa: E402
from experiments.trm.tools import measure  # noqa: E402
from experiments.trm.tools import step_setup  # noqa: E402


def split_variant(variant: str) -> Tuple[str, int]:
  """"FORMS" or "FORMS/slices=N" -> (the forms list, config.batch_slices; 0 = automatic:
  cpu_tuning.batch_slices' automatic count when FORMS includes batch_slices, else 1)."""
  forms, _, rest = variant.partition("/")
  if not rest:
    return forms, 0
  key, _, value = rest.partition("=")
  if key != "slices" or not value.isdigit() or int(value) < 1:
    raise ValueError(f"{variant!r}: the part after '/' must be slices=N with N >= 1")
  return forms, int(value)


def _setup(args: argparse.Namespace, variant: str) -> step_setup.StepSetup:
  forms, slices = split_variant(variant)
  if args.model == "demo":
    config = cpu_demo.get_config()
    if args.batch:
      layout_lib.set_batch(config, args.batch)
  else:
    config = step_setup.recipe_config(args.model, args.dtype, hidden=args.hidden or None,
                                      per_device_batch=args.batch or 64)
  config.batch_slices = slices
  return step_setup.compile_config_step(config, forms=forms)


def compare(args: argparse.Namespace) -> List[Dict[str, Any]]:
  """Compiles every variant, runs the alternating rounds; one row per variant (the columns above)."""
  setups = {}
  for forms in args.forms:
    setups[forms] = s = _setup(args, forms)
    print(f"{forms}: compiled in {s.compile_s:.1f} s, scratch {s.memory['temp']:.2f} GB", flush=True)
  times: Dict[str, List[float]] = {f: [] for f in args.forms}
  rounds: Dict[str, List[float]] = {f: [] for f in args.forms}
  loss: Dict[str, float] = {}
  live = {f: s.args[:2] for f, s in setups.items()}       # each variant's state and carry (donated)
  faults: Dict[str, int] = {}

  def step(forms: str) -> Dict[str, Any]:
    """One step of the variant, its state and carry carried on; returns its summed metrics."""
    s = setups[forms]
    state, carry, sums = s.compiled(*live[forms], *s.args[2:])
    live[forms] = (state, carry)
    return jax.block_until_ready(sums)

  for _ in range(args.warmup):                            # untimed: the heap grows to its size
    for forms in setups:
      step(forms)
  for r in range(args.rounds):
    for forms in setups:
      step(forms)                                         # untimed
      these, f0 = [], measure.minor_page_faults()
      for _ in range(args.per_round):
        t0 = time.perf_counter()
        sums = step(forms)
        these.append(time.perf_counter() - t0)
      faults[forms] = measure.minor_page_faults() - f0
      times[forms] += these
      rounds[forms].append(float(np.median(these)))
      loss[forms] = float(np.asarray(sums["lm_loss"]).ravel()[0])
    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
        f"{f} {1e3 * rounds[f][-1]:,.0f} ms [{faults[f]:,}]" for f in args.forms), flush=True)
  first = args.forms[0]
  base_ms = step_timing.percentiles_ms(times[first])["ms"]
  rows = []
  for forms in args.forms:
    p = step_timing.percentiles_ms(times[forms])
    won = sum(a < b for a, b in zip(rounds[forms], rounds[first]))
    rows.append({"forms": forms, **p, "vs_first": p["ms"] / base_ms - 1.0,
                 "won": None if forms == first else won, "rounds": args.rounds,
                 "temp_GB": setups[forms].memory["temp"], "lm_loss": loss[forms]})
  return rows


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
  out = ["| forms | ms | p10 | p90 | vs_first | won | temp_GB | lm_loss |",
         "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    won = "-" if r["won"] is None else f"{r['won']}/{r['rounds']}"
    out.append(f"| {r['forms']} | {r['ms']:,.0f} | {r['p10']:,.0f} | {r['p90']:,.0f} | "
               f"{100 * r['vs_first']:+.1f}% | {won} | {r['temp_GB']:.3f} | {r['lm_loss']:.6g} |")
  return "\n".join(out)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="python -m experiments.trm.tools.compare_forms",
                               description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="att", choices=["demo", "mlp", "att"])
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--batch", type=int, default=0, help="0: the config's (64 for the recipes)")
  ap.add_argument("--hidden", type=int, default=0, help="recipes: 0 = 512")
  ap.add_argument("--forms", action="append", default=None,
                  help="a list of CPU forms ('all', 'none' or a comma list of "
                       f"{','.join(cpu_tuning.FORMS)}), optionally with /slices=N "
                       "(config.batch_slices) "
                       "(repeat the flag; default: all, then none)")
  ap.add_argument("--rounds", type=int, default=4)
  ap.add_argument("--per_round", type=int, default=1)
  ap.add_argument("--warmup", type=int, default=2,
                  help="untimed steps of each variant before the rounds (the heap's growth)")
  ap.add_argument("--quick", action="store_true",
                  help="smoke run: hidden 32, batch 4, 2 rounds (flags given explicitly still win)")
  args = ap.parse_args(argv)
  if args.quick:
    doc_tables.quick_defaults(args, argv, hidden=32, batch=4, rounds=2, warmup=0)
  args.forms = args.forms or ["all", "none"]
  for variant in args.forms:
    try:
      forms, _ = split_variant(variant)
      cpu_tuning.parse_forms(forms)
    except ValueError as e:
      ap.error(f"--forms={variant!r}: {e}")
  if len(set(args.forms)) != len(args.forms):
    ap.error(f"--forms: a list is given twice ({args.forms}); give each variant once")
  if args.rounds < 1 or args.per_round < 1:
    ap.error("--rounds and --per_round must be >= 1")
  if args.warmup < 0:
    ap.error(f"--warmup={args.warmup}: use 0 or more untimed steps")
  if args.model == "demo" and args.hidden:
    ap.error("--hidden is for the recipes (mlp, att); the demo model is configs/cpu_demo.py's")
  if args.model == "demo" and args.batch and args.batch % jax.local_device_count():
    ap.error(f"--batch={args.batch} must be a multiple of the {jax.local_device_count()} devices")
  return args


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  args = parse_args(argv)
  host_malloc.keep_heap()          # as the trainer does on a CPU target; before the backend's threads
  print(f"CPU: {cpu_features.describe()}; XLA uses the {cpu_features.usable_cores()} usable cores",
        flush=True)
  what = "make run's model (configs/cpu_demo.py)" if args.model == "demo" else (
      f"TRM-{args.model.upper() if args.model == 'mlp' else 'Att'} {args.dtype}"
      f"{f' at hidden {args.hidden}' if args.hidden else ''}")
  batch = args.batch or (layout_lib.configured_batch(cpu_demo.get_config())
                         if args.model == "demo" else 64)
  print(f"{what}, batch {batch}; {args.warmup} untimed step(s) of each variant, then "
        f"{args.rounds} alternating round(s) of 1 untimed + {args.per_round} timed step(s) per "
        f"variant; [minor page faults of the timed steps]", flush=True)
  rows = compare(args)
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
