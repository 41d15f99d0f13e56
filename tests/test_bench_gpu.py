"""experiments/tools/bench_gpu.py (`make bench-gpu`) in its --quick sizes on this CPU: the table's
columns, and podlab's step and the reference's (TRM's cells: experiments/trm/tools/bench_gpu.py,
tests/torch_trm_reference.py; GPT-2's: experiments/nanogpt/tools/bench_gpu.py, nanoGPT's model in
torch_reference.py) computing the same first loss from the same weights and batch. The
torch.compile column is the eager step compiled (run on a GPU by `make bench-gpu`; here eager only:
inductor's CPU compile takes minutes). Timings are printed, never asserted."""

import math

import pytest

from experiments.nanogpt.tools import bench_gpu as gpt_cells
from experiments.tools import bench_gpu
from experiments.tools import doc_tables

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def rows():
  return bench_gpu.run(["trm:mlp", "gpt"], [4], 4, steps=1, warmup=1, sides=("podlab", "eager"),
                       quick=True)


@pytest.mark.slow
def test_the_table_has_every_column_and_a_row_per_cell(rows):
  assert [(r["cell"], r["batch"]) for r in rows] == [("TRM-MLP bf16", 4), ("GPT-2 124M bf16", 4)]
  text = doc_tables.format_table(rows, bench_gpu.COLUMNS)
  header = text.splitlines()[0].split()
  assert header == list(bench_gpu.COLUMNS)
  for r in rows:
    for side in ("podlab", "eager"):
      assert r[f"{side}_ms"] > 0 and r[f"{side}_p10"] <= r[f"{side}_ms"] <= r[f"{side}_p90"]
    assert r["podlab_items_s"] == pytest.approx(
        (r["batch"] * (1 if r["cell"].startswith("TRM") else gpt_cells.QUICK_GPT["block_size"]))
        / r["podlab_ms"] * 1e3)
    assert r["podlab_TFLOP_s"] > 0 and r["podlab_MFU"] > 0
    assert r["speed_eager"] == pytest.approx(r["podlab_items_s"] / r["eager_items_s"])
    assert math.isnan(r["ref_ms"]) and math.isnan(r["speed"])     # no compiled side asked for


@pytest.mark.slow
def test_both_sides_compute_the_same_first_loss(rows):
  trm, gpt = rows
  # TRM: lm_loss summed over the 4 examples (stablemax cross-entropy), bf16 forward on both sides.
  assert trm["loss0_podlab"] == pytest.approx(trm["loss0_ref"], rel=1e-2)
  assert 4 * math.log(11) * 0.5 < trm["loss0_podlab"] < 4 * math.log(11) * 2
  # GPT: mean cross-entropy near ln(vocab) at init.
  assert gpt["loss0_podlab"] == pytest.approx(gpt["loss0_ref"], rel=1e-2)
  assert gpt["loss0_podlab"] == pytest.approx(math.log(gpt_cells.QUICK_GPT["vocab_size"]), rel=0.1)


def test_bad_flags_name_the_fix():
  for argv in (["--cells=tpu"], ["--trm_models=big"], ["--trm_batches=0"],
               ["--no_compile", "--no_eager"], ["--warmup=0"]):
    with pytest.raises(SystemExit):
      bench_gpu.parse_args(argv)
  args = bench_gpu.parse_args(["--quick", "--steps=5"])
  assert args.steps == 5 and args.trm_batches == ["4"] and args.trm_models == ["mlp"]
