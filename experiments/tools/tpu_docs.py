"""The TPU tables of docs/tpu.md and README.md, written by `make tpu-check` so they cannot go stale.

`python -m experiments.tools.tpu_check --write_docs` (what `make tpu-check` runs) turns each compiled
program into one row of docs/tpu.md's table (between the markers TABLE_BEGIN and TABLE_END; rows of
programs not compiled in this run are kept, each row names the commit it was compiled at) and
rewrites the README's excerpt (between EXCERPT_BEGIN and EXCERPT_END) from that table; the markers,
the parsing and the atomic writing are experiments/tools/doc_tables.py's, shared with the bench tools.
tests/test_tpu_docs.py checks, with no compile, that the README excerpt is what `excerpt` makes of
docs/tpu.md's table, and that the measured-GPU cells are those of `gpu_measured`.

Synopsis:

  from experiments.tools import tpu_docs
  doc = open("docs/tpu.md").read()
  rows = tpu_docs.parse_table(doc)                             # [{column: cell}, ...]
  text = tpu_docs.excerpt(rows)                                # the README's table
  doc = tpu_docs.replace_block(doc, tpu_docs.TABLE_BEGIN, tpu_docs.TABLE_END,
                               tpu_docs.table_block(rows, libtpu="0.0.42.1"))
"""

from __future__ import annotations

from typing import List, Sequence

from experiments.tools import doc_tables

TABLE_BEGIN, TABLE_END = doc_tables.markers("tpu-check", "`make tpu-check`")
EXCERPT_BEGIN = ("<!-- tpu-check excerpt: written by `make tpu-check` from docs/tpu.md's table; "
                 "do not edit -->")
EXCERPT_END = "<!-- end of the tpu-check excerpt -->"

COLUMNS = ["program", "slice", "commit", "temp GiB", "peak GiB", "usable GiB", "fits (margin)",
           "TFLOP analytic", "TFLOP compiler", "GB accessed", "compute bound", "memory bound",
           "bound (compiler estimate)", "speed at the bound", "MFU", "measured GPU"]
"""docs/tpu.md's table, one row per program compiled for its slice (per device, per step)."""

EXCERPT_COLUMNS = ["program", "slice", "HBM peak per device (margin)",
                   "bound (compiler estimate)", "speed at the bound", "measured GPU"]

Row = doc_tables.Row
markdown = doc_tables.markdown            # the shared writer's functions (experiments/tools/doc_tables.py)
block = doc_tables.block
replace_block = doc_tables.replace_block


def parse_table(text: str, begin: str = TABLE_BEGIN, end: str = TABLE_END) -> List[Row]:
  """The rows of docs/tpu.md's table (or of the table between other markers)."""
  return doc_tables.parse_table(text, begin, end)


def merge(old: Sequence[Row], new: Sequence[Row]) -> List[Row]:
  """`old` with each row of the same (program, slice) replaced by `new`'s, new ones appended."""
  return doc_tables.merge(old, new, ("program", "slice"))


def table_block(rows: Sequence[Row], libtpu: str) -> str:
  """docs/tpu.md's block: a line on what the rows are, and the table."""
  return (f"Written by `make tpu-check` (libtpu {libtpu}); each row was compiled at the commit it "
          "names. COMPILER ESTIMATES per device and per step, not measurements; a bound is a lower "
          "bound on the step time, so speed and MFU at it are upper bounds.\n\n"
          + markdown(COLUMNS, rows))


def in_excerpt(row: Row) -> bool:
  """The README shows the training steps, and Dream's greedy sampling step at batch 8."""
  name = row["program"]
  return name.endswith(": train_step") or ("diffucoder" in name and "greedy" in name
                                            and " b8 " in name)


def excerpt(rows: Sequence[Row]) -> str:
  """The README's table: the `in_excerpt` rows of docs/tpu.md's table, fewer columns."""
  out = []
  for r in rows:
    if not in_excerpt(r):
      continue
    if r["fits (margin)"] == "NO":
      hbm = f"{r['peak GiB']} of {r['usable GiB']} GiB: does NOT fit"
    else:
      hbm = f"{r['peak GiB']} of {r['usable GiB']} GiB ({r['fits (margin)']})"
    out.append({"program": r["program"], "slice": r["slice"],
                "HBM peak per device (margin)": hbm,
                "bound (compiler estimate)": r["bound (compiler estimate)"],
                "speed at the bound": r["speed at the bound"], "measured GPU": r["measured GPU"]})
  commits = sorted({r["commit"] for r in rows if in_excerpt(r)})
  return (f"Rows compiled at commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}; "
          "COMPILER ESTIMATES, not measurements:\n\n" + markdown(EXCERPT_COLUMNS, out))
