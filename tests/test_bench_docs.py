"""The bench tools' --write_docs: each tool's table, as it prints it, goes into its own block of
docs/benchmarks.md (experiments/tools/doc_tables.py). Each test builds the tool's rows from a tiny
or stubbed measurement and writes them into a temporary copy of the doc; the real doc must hold
each tool's markers once, so that --write_docs cannot fail after a long run.
"""

import pathlib

import pytest

from experiments.diffucoder import sampler_options
from experiments.diffucoder.tools import bench_table
from experiments.diffucoder.tools import step_speed
from experiments.nanogpt.tools import bench as gpt_bench
from experiments.tools import doc_tables
from experiments.trm.tools import bench as trm_bench
from experiments.trm.tools import bench_cli
from experiments.trm.tools import bench_reference

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs/benchmarks.md"
TOOLS = [(gpt_bench.DOC_TABLE, gpt_bench.DOC_WRITER),
         (bench_table.DOC_TABLE, bench_table.DOC_WRITER),
         (trm_bench.DOC_TABLE, trm_bench.DOC_WRITER),
         (bench_reference.DOC_TABLE, bench_reference.DOC_WRITER)]


def _copy(tmp_path) -> str:
  """A copy of docs/benchmarks.md with the tools' blocks emptied."""
  path = tmp_path / "benchmarks_copy.txt"
  text = DOC.read_text()
  for name, writer in TOOLS:
    text = doc_tables.replace_block(text, *doc_tables.markers(name, writer), "")
  path.write_text(text)
  return str(path)


def _table(path, name, writer):
  begin, end = doc_tables.markers(name, writer)
  text = pathlib.Path(path).read_text()
  return doc_tables.parse_table(text, begin, end), doc_tables.block(text, begin, end)


@pytest.mark.parametrize("name,writer", TOOLS)
def test_the_doc_holds_each_tools_markers_once(name, writer):
  doc_tables.check_markers(str(DOC), name, writer)


def test_gpt_bench_writes_its_step_table(tmp_path):
  runs = [{"name": "podlab float32", "ms": [40.0, 42.0, 44.0], "cpu": [70.0, 71.0, 72.0],
           "tokens": 768, "flops": 1e9},
          {"name": "PyTorch 2.x (2 threads)", "ms": [41.0, 41.0, 45.0], "cpu": [80.0] * 3,
           "tokens": 768, "flops": 1e9}]
  rows = gpt_bench.step_rows(runs, peak=100e9, torch_ms=41.0)
  assert rows[0]["median ms"] == "42.00" and rows[0]["/torch"] == "1.02x"
  assert rows[0]["tokens/s"] == "18,286" and rows[0]["MFU"] == "23.8%"
  printed = doc_tables.text_table(gpt_bench.STEP_COLUMNS, rows)
  path = _copy(tmp_path)
  gpt_bench.write_docs(rows, "recipe: test", "python -m experiments.nanogpt.tools.bench --x", None,
                       path=path)
  written, content = _table(path, gpt_bench.DOC_TABLE, gpt_bench.DOC_WRITER)
  assert written == rows                                           # the printed cells, as printed
  assert [r["variant"] for r in written] == [ln[:23].strip() for ln in printed.splitlines()[2:]]
  assert "`python -m experiments.nanogpt.tools.bench --x` at " in content
  # a second run replaces the block: its ratios compare only variants of one run
  gpt_bench.write_docs(rows[:1], "recipe: test", "second", None, path=path)
  assert _table(path, gpt_bench.DOC_TABLE, gpt_bench.DOC_WRITER)[0] == rows[:1]


def test_diffucoder_benchmark_merges_samplers(tmp_path):
  config = step_speed.small_config(hidden=32, layers=1, heads=2, kv_heads=1, vocab=64,
                                   dtype="float32")
  params = step_speed.random_params(config)
  rows = []
  for temperature, top_p in ((0.0, 1.0), (0.2, 0.95)):
    opts = sampler_options.SamplerOptions(steps=12, temperature=temperature, top_p=top_p)
    rows.append({**bench_table.setup_cells(config, opts),
                 **step_speed.bench_cell(config, params, 1, 16, opts, timed_steps=1)})
  assert [r["sampler"] for r in rows] == ["entropy, greedy", "entropy, T 0.2, top_p 0.95"]
  path = _copy(tmp_path)
  bench_table.write_docs(rows[:1], "python -m experiments.diffucoder.tools.benchmark --a", None,
                         path=path)
  bench_table.write_docs(rows[1:], "python -m experiments.diffucoder.tools.benchmark --b", None,
                         path=path)
  written, content = _table(path, bench_table.DOC_TABLE, bench_table.DOC_WRITER)
  printed = bench_table.format_rows(rows, bench_table.TABLE_COLUMNS).splitlines()
  assert [r["run"] for r in written] == ["1", "2"]
  for r, line in zip(written, printed[1:]):
    assert line.split()[-8:] == [r[c] for c in bench_table.TABLE_COLUMNS[3:]]
  assert "run 1: `python -m experiments.diffucoder.tools.benchmark --a`" in content
  assert "run 2: `python -m experiments.diffucoder.tools.benchmark --b`" in content


def _trm_row(columns, model, dtype, batch, value):
  row = {c: value for c in columns}
  row.update(model=model, dtype=dtype, batch=batch)
  if "remat" in columns:
    row["remat"] = False
  return row


@pytest.mark.parametrize("tool", ["bench", "bench_reference"])
def test_trm_tools_merge_rows_by_model_dtype_batch(tmp_path, tool):
  if tool == "bench":
    columns, key = trm_bench.COLUMNS, trm_bench.DOC_KEY
    name, writer = trm_bench.DOC_TABLE, trm_bench.DOC_WRITER
  else:
    columns, key = bench_reference.COLUMNS, ("model", "dtype", "batch")
    name, writer = bench_reference.DOC_TABLE, bench_reference.DOC_WRITER
  kw = dict(name=name, writer=writer, columns=columns, key=key)
  path = _copy(tmp_path)
  first = [_trm_row(columns, "mlp", "float32", 64, 12345.6),
           _trm_row(columns, "att", "float32", 64, 0.5)]
  bench_cli.write_docs(first, "cmd one", "header", None, path=path, **kw)
  bench_cli.write_docs([_trm_row(columns, "att", "float32", 64, float("nan"))], "cmd two", "", None,
                       path=path, **kw)
  written, content = _table(path, name, writer)
  printed = doc_tables.format_table(first, columns).splitlines()
  assert printed[2].split() == [written[0][c] for c in columns]       # the cells as printed
  assert written[0]["podlab_ms" if tool != "bench" else "step_ms"] == "12,346"
  assert written[1][columns[-1]] == "nan" and [r["run"] for r in written] == ["1", "2"]
  assert "run 1: `cmd one`" in content and "header" in content


def test_write_docs_refuses_a_doc_without_the_markers(tmp_path):
  path = tmp_path / "no_markers.txt"
  path.write_text("# no table here\n")
  with pytest.raises(ValueError, match="not found"):
    gpt_bench.write_docs([], "note", "cmd", None, path=str(path))
  assert path.read_text() == "# no table here\n"
