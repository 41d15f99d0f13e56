"""What the TRM bench tools share on the command line: --quick defaults, the table they print.

bench.py, bench_reference.py, bench_gpu.py and compare_forms.py print their rows as one
fixed-width table (`format_table`: numbers rounded for reading, NaN for a failed row), optionally
with a JSON copy (`print_table`), and some merge it, cells as printed, into a block of
docs/benchmarks.md (`write_docs`, through experiments/tools/doc_tables.py). `quick_defaults` sets a
`--quick` smoke run's sizes unless given on the command line; REPO_ROOT is where their per-row
child processes run.

Synopsis:

  from experiments.trm.tools import bench_cli

  rows = [{"model": "mlp", "step_ms": 45012.3, "remat": False}, {"model": "att", "step_ms": 0.5}]
  print(bench_cli.format_table(rows, ("model", "remat", "step_ms")))
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Sequence

from experiments.tools import doc_tables

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def quick_defaults(args: Any, argv: Sequence[str], **defaults: Any) -> None:
  """For a tool's `--quick` smoke run: sets each `defaults` attribute of the parsed `args` unless its
  flag (`--name`) was given on the command line `argv` (flags given explicitly still win)."""
  given = {a.split("=")[0] for a in argv}
  for name, value in defaults.items():
    if f"--{name}" not in given:
      setattr(args, name, value)


def _fmt(v: Any) -> str:
  """A cell as the table prints it: on/off, nan, thousands separators, 3 significant-ish digits."""
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


def format_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> str:
  """Fixed-width text table of `rows` (dicts) with a header line of `columns`."""
  cells = [list(columns)] + [[_fmt(r.get(c, "")) for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in cells]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def doc_rows(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> List[Dict[str, str]]:
  """`rows`' cells as `format_table` prints them."""
  return [{c: _fmt(r.get(c, "")) for c in columns} for r in rows]


def write_docs(rows: Sequence[Dict[str, Any]], command: str, note: str = "", device=None, *,
               name: str, writer: str, columns: Sequence[str], key: Sequence[str],
               path: str = doc_tables.BENCHMARKS_DOC) -> str:
  """Merges the table's rows, as printed, into `path`'s block `name` written by `writer`
  (experiments/tools/doc_tables.py: keyed by the columns `key`, each row's run named above the
  table); returns the block. bench.py's block is trm-bench-throughput, bench_reference.py's its
  own."""
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
