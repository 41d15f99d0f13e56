"""experiments/tools/stream_bench.py on a tiny generated Sudoku dataset: host 1 of a 2-host job
loads its train stream and eval batches and prints the report's rows; a dataset that is not
prepared is a one-line error with exit code 2. Timings and memory are printed, never asserted."""

import json
import pathlib
import subprocess
import sys

import pytest

from input_pipeline import prepare

REPO = pathlib.Path(__file__).resolve().parents[1]
KWARGS = {"givens": 30, "train_size": 64, "test_size": 16, "num_workers": 1}


def _stream_bench(data_dir, *flags):
  cmd = [sys.executable, "-m", "experiments.tools.stream_bench", "--dataset=sudoku_generated",
         f"--data_dir={data_dir}", f"--builder_kwargs={json.dumps(KWARGS)}", *flags]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


# ~30 s (two processes that import TensorFlow); @slow to keep `make test` under 15 minutes.
@pytest.mark.slow
def test_one_host_of_two_reports_its_stream_and_eval_batches(tmp_path):
  prepare.prepare("sudoku_generated", str(tmp_path / "tfds"), KWARGS)
  proc = _stream_bench(tmp_path / "tfds", "--global_batch=8", "--process_count=2",
                       "--process_index=1", "--batches=3")
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = dict(line.split("  ", 1) for line in proc.stdout.splitlines() if "  " in line)
  rows = {k.strip(): v.strip() for k, v in rows.items()}
  assert rows["host"] == "1 of 2, 1 devices, global batch 8"
  assert rows["train stream"] == "shuffled shard"
  assert "inputs int32[1, 4, 81]" in rows["batch"]          # 8 over 2 hosts of 1 device each
  assert rows["eval load"].endswith("8 examples, 2 batches")   # this host's half of the 16
  assert "ms/batch (median of 3)" in rows and "peak RSS" in rows

  proc = _stream_bench(tmp_path / "empty", "--global_batch=8", "--batches=1")
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
