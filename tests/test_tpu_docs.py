"""The TPU tables of docs/tpu.md and README.md cannot go stale: `make tpu-check --write_docs` writes
both (experiments/tools/tpu_docs.py), and these checks need no compile: the README's excerpt is what
`tpu_docs.excerpt` makes of docs/tpu.md's table, every row is the table's format, and the
measured-GPU cells are those of experiments/tools/gpu_measured.py. (tests/test_tpu_check.py
compiles the pod configs again against the table's temporaries.)
"""

import pathlib
import re

import pytest

from experiments.tools import gpu_measured
from experiments.tools import tpu_docs

REPO = pathlib.Path(__file__).resolve().parents[1]


def _doc_rows():
  return tpu_docs.parse_table((REPO / "docs/tpu.md").read_text())


def test_the_readme_excerpt_is_docs_tpu_table():
  rows = _doc_rows()
  readme = (REPO / "README.md").read_text()
  assert tpu_docs.block(readme, tpu_docs.EXCERPT_BEGIN, tpu_docs.EXCERPT_END).strip() == (
      tpu_docs.excerpt(rows).strip())


def test_docs_table_rows():
  rows = _doc_rows()
  assert rows, "docs/tpu.md's table is empty: run make tpu-check"
  for r in rows:
    assert list(r) == tpu_docs.COLUMNS, r["program"]
    assert re.fullmatch(r"[0-9a-f]{7,}", r["commit"]), r       # compiled at a clean commit
    assert r["measured GPU"] == gpu_measured.cell(gpu_measured.for_row(r["program"]))
    if r["fits (margin)"] == "NO":
      assert r["peak GiB"].startswith(">=") and r["bound (compiler estimate)"] == "-"
      continue
    assert re.fullmatch(r"(yes|tight) -?[0-9.]+%", r["fits (margin)"]), r
    assert "*" not in r["bound (compiler estimate)"], r            # every loop trip counted
    assert r["speed at the bound"] == "-" or r["speed at the bound"].startswith("<=")
  assert not any("predicted" in c for r in rows for c in r.values())


def test_tables_round_trip():
  rows = [dict(zip(tpu_docs.COLUMNS, [f"{c} {i}" for c in tpu_docs.COLUMNS])) for i in range(2)]
  rows[0]["program"] = "x: train_step"
  text = f"a\n{tpu_docs.TABLE_BEGIN}\nold\n{tpu_docs.TABLE_END}\nb"
  text = tpu_docs.replace_block(text, tpu_docs.TABLE_BEGIN, tpu_docs.TABLE_END,
                                tpu_docs.table_block(rows, "0.0.42.1"))
  assert text.startswith("a\n") and text.endswith("\nb") and "old" not in text
  assert tpu_docs.parse_table(text) == rows
  newer = dict(rows[1], commit="abcdef0")
  extra = dict(rows[1], slice="v5p-8")
  assert tpu_docs.merge(rows, [newer, extra]) == [rows[0], newer, extra]
  assert "x: train_step" in tpu_docs.excerpt(rows) and "program 1" not in tpu_docs.excerpt(rows)
  with pytest.raises(ValueError, match="not found"):
    tpu_docs.block("no markers", tpu_docs.TABLE_BEGIN, tpu_docs.TABLE_END)
