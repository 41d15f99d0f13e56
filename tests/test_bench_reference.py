"""`python -m experiments.trm.tools.bench_reference --quick` (make bench's smoke run): podlab's TRM
step and the reference's PyTorch step timed side by side at hidden 32. Checks the table's header and
structure and that every cell is a number (times are printed, never asserted)."""
import json
import re
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from experiments.trm.tools import bench_reference  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


# ~28 s (torch and XLA steps); @slow to keep `make test` under 15 minutes (`make bench` runs it for real)
@pytest.mark.slow
def test_quick_run_prints_a_side_by_side_table(tmp_path):
  out = tmp_path / "bench.json"
  proc = subprocess.run([sys.executable, "-m", "experiments.trm.tools.bench_reference", "--quick",
                         f"--json_out={out}"], cwd=REPO, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = proc.stdout
  assert "TRM training step, podlab vs the reference (PyTorch)" in text
  assert "native bfloat16: " in text and "usable cores" in text
  assert "torch.set_num_threads(" in text
  assert "after 1 untimed step(s) of each" in text
  # each warm-up and timed step's log line counts its minor page faults
  assert len(re.findall(r"(warm-up step 1/1|round \d/2 (podlab|ref):) [\d.]+ s \([\d,]+ minor "
                        r"page faults\)", text)) == 2 + 4, text[-3000:]
  lines = text.splitlines()
  head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["model", "dtype", "batch"])
  assert lines[head].split() == list(bench_reference.COLUMNS)
  assert set(lines[head + 1].replace(" ", "")) == {"-"}
  cells = lines[head + 2].split()
  assert cells[:2] == ["mlp", "float32"]
  numbers = [float(c.replace(",", "")) for c in cells[2:]]
  assert all(n == n and n > 0 for n in numbers), cells        # no NaN, all positive
  saved = json.loads(out.read_text())
  (row,) = saved["rows"]
  assert row["podlab_p10"] <= row["podlab_ms"] <= row["podlab_p90"]
  assert row["ref_p10"] <= row["ref_ms"] <= row["ref_p90"]
  assert row["speed_ratio"] == pytest.approx(row["podlab_ex_s"] / row["ref_ex_s"])
  assert row["podlab_ex_s"] == pytest.approx(row["batch"] / (row["podlab_ms"] / 1e3))
  assert saved["header"][0].startswith("CPU: ")
  rates = next(line for line in saved["header"] if line.startswith("matmul GFLOP/s"))
  assert re.search(r"XLA float32 \d+; PyTorch float32 \d+$", rates), rates


def test_flags_are_checked_and_quick_is_narrowed():
  a = bench_reference.parse_args(["--quick"])
  assert (a.hidden, a.batches, a.models, a.dtypes, a.steps, a.warmup) == (
      32, ["4"], ["mlp"], ["float32"], 2, 1)
  a = bench_reference.parse_args(["--quick", "--models=mlp,att", "--steps=1", "--warmup=0"])
  assert a.models == ["mlp", "att"] and a.steps == 1 and a.hidden == 32 and a.warmup == 0
  a = bench_reference.parse_args([])
  assert (a.models, a.dtypes, a.batches) == (["mlp", "att"], ["float32", "bfloat16"], ["64", "256"])
  assert a.warmup == 3
  for bad in (["--models=gpt"], ["--dtypes=float16"], ["--batches=0"], ["--steps=0"],
              ["--warmup=-1"]):
    with pytest.raises(SystemExit):
      bench_reference.parse_args(bad)


def test_matmul_rates_time_both_frameworks_in_each_dtype():
  rates = bench_reference.matmul_rates(["float32", "bfloat16"], shape=(64, 32, 48), reps=3)
  assert set(rates) == {"XLA", "PyTorch"}
  for by_dtype in rates.values():
    assert list(by_dtype) == ["float32", "bfloat16"]
    assert all(0 < r < 1e6 for r in by_dtype.values()), rates     # GFLOP/s: finite, positive
  line = bench_reference.header_lines(2, True, rates, shape=(64, 32, 48))[-1]
  assert line.startswith("matmul GFLOP/s, one [64, 32] @ [32, 48] product: XLA float32 ")
  assert "; PyTorch float32 " in line and line.count("bfloat16") == 2


def test_rates_only_prints_one_matmul_line_per_shape_and_no_table(capsys):
  """--rates_only with two --matmul_shapes: the header with one rate line per product, in the
  given order, and no training step (no table); a malformed shape names the flag and the form."""
  a = bench_reference.parse_args(["--matmul_shapes=64x32x48,48X32x64"])
  assert a.matmul_shapes == [(64, 32, 48), (48, 32, 64)]
  assert bench_reference.parse_args([]).matmul_shapes == [bench_reference.MATMUL_SHAPE]
  for bad in ("64x32", "64x0x48", "axbxc", ","):
    with pytest.raises(SystemExit):
      bench_reference.parse_args([f"--matmul_shapes={bad}"])
    assert "--matmul_shapes" in capsys.readouterr().err
  assert bench_reference.main(["--rates_only", "--dtypes=float32", "--no_keep_heap",
                               "--matmul_shapes=64x32x48,48x32x64"]) == 0
  out = capsys.readouterr().out.splitlines()
  rates = [line for line in out if line.startswith("matmul GFLOP/s")]
  assert [r.split(" product")[0] for r in rates] == [
      "matmul GFLOP/s, one [64, 32] @ [32, 48]", "matmul GFLOP/s, one [48, 32] @ [32, 64]"]
  assert all("XLA float32 " in r and "PyTorch float32 " in r for r in rates)
  assert out[0].startswith("CPU: ") and not any(line.startswith("|") for line in out)
