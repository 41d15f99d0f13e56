"""What the TRM bench tools share: REPO_ROOT, and their table merged into docs/benchmarks.md.

bench.py, bench_reference.py, bench_gpu.py and compare_forms.py print their rows as one
fixed-width table (experiments/tools/doc_tables.py `format_table`: numbers rounded for reading, NaN
for a failed row), optionally with a JSON copy (`doc_tables.print_table`), and some merge it, cells
as printed, into a block of docs/benchmarks.md (`write_docs` here, through doc_tables);
`doc_tables.quick_defaults` sets a `--quick` smoke run's sizes unless given on the command line;
REPO_ROOT is where their per-row child processes run.

Synopsis:

  from experiments.trm.tools import bench_cli

  rows = [{"model": "mlp", "step_ms": 45012.3, "remat": False}, {"model": "att", "step_ms": 0.5}]
  print(bench_cli.doc_rows(rows, ("model", "remat", "step_ms")))
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence

from experiments.tools import doc_tables

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def doc_rows(rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> List[Dict[str, str]]:
  """`rows`' cells as `doc_tables.format_table` prints them."""
  return [{c: doc_tables.format_cell(r.get(c, "")) for c in columns} for r in rows]


def write_docs(rows: Sequence[Dict[str, Any]], command: str, note: str = "", device=None, *,
               name: str, writer: str, columns: Sequence[str], key: Sequence[str],
               path: str = doc_tables.BENCHMARKS_DOC) -> str:
  """Merges the table's rows, as printed, into `path`'s block `name` written by `writer`
  (experiments/tools/doc_tables.py: keyed by the columns `key`, each row's run named above the
  table); returns the block. bench.py's block is trm-bench-throughput, bench_reference.py's its
  own."""
  return doc_tables.write_table(path, name, writer, command=command, columns=columns,
                                rows=doc_rows(rows, columns), key=key, note=note, device=device)
