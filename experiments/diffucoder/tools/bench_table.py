"""How the DiffuCoder benchmark prints its tables, and mode 1's block in docs/benchmarks.md.

`format_rows` is the fixed-width table every mode prints (floats to 3 decimals below 10, else 1);
`setup_cells` names mode 1's model, dtype and sampler; `write_docs` merges mode 1's rows, cells as
printed, into docs/benchmarks.md's diffucoder-benchmark block (experiments/tools/doc_tables.py),
keyed by TABLE_KEY, so a run with other options adds rows beside the others.

Synopsis:

  from experiments.diffucoder.tools import bench_table

  rows = [{"decoding": "plain", "seconds": 12.3456, "speedup": 1.0}]
  print(bench_table.format_rows(rows, ["decoding", "seconds", "speedup"]))
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from experiments.tools import doc_tables


def _cell(v) -> str:
  """A table cell as the tool prints it (floats to 3 decimals below 10, else 1)."""
  if isinstance(v, float):
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
  return str(v)


def format_rows(rows: List[Dict[str, Any]], columns: Sequence[str]) -> str:
  table = [list(columns)] + [[_cell(r[c]) for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
  return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table)


TABLE_COLUMNS = ["model", "dtype", "sampler", "batch", "canvas", "new_tokens", "compile_s",
                 "ms_step", "tokens_per_s", "gflop_step", "gflop_per_s"]
"""Mode 1's table; its first five columns (TABLE_KEY) name a row's options."""
TABLE_KEY = ("model", "dtype", "sampler", "batch", "canvas")
DOC_TABLE = "diffucoder-benchmark"
DOC_WRITER = "`python -m experiments.diffucoder.tools.benchmark --write_docs`"


def setup_cells(config, opts) -> Dict[str, str]:
  """The model, dtype and sampler cells of mode 1's rows (config: the small Dream; opts: its
  SamplerOptions)."""
  sampler = f"{opts.alg}, " + ("greedy" if opts.temperature == 0 else f"T {opts.temperature:g}")
  sampler += f", top_p {opts.top_p:g}" if opts.top_p < 1 else ""
  return {"model": f"{config.hidden_size} x {config.num_layers} layers, "
                   f"{config.num_heads}/{config.num_kv_heads} heads, vocab {config.vocab_size}",
          "dtype": config.dtype.name, "sampler": sampler}


def write_docs(rows: Sequence[Dict[str, Any]], command: str, device=None,
               path: str = doc_tables.BENCHMARKS_DOC) -> str:
  """Merges mode 1's rows (cells as printed) into `path`'s diffucoder-benchmark block, keyed by
  TABLE_KEY: a run with other options (e.g. a top-p sampler) adds its rows beside the others."""
  cells = [{c: _cell(r[c]) for c in TABLE_COLUMNS} for r in rows]
  return doc_tables.write_table(path, DOC_TABLE, DOC_WRITER, command=command, columns=TABLE_COLUMNS,
                                rows=cells, key=TABLE_KEY, device=device)

