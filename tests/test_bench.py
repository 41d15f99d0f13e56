"""Tests of experiments/trm/tools/bench.py at tiny sizes (hidden 32, per-device batch 2, 1 step).

The analytic FLOP counts of the REAL recipes (D = 512) are checked against the reference's figure
(TRM-MLP Sudoku: 25.6 forward + 17.1 backward = 42.7 GFLOP per example per step) and against an
independent count written here from the model's parameter SHAPES (jax.eval_shape, nothing computed):
every weight [a, b] of the shared net costs 2 a b per token it is applied to (S tokens, or D columns
for the token-mixing MLP), attention adds q k^T and p v (2 x 2 S^2 D), and the heads 2 a b per use.
"""
import math

import jax
import numpy as np
import pytest

from experiments.tools import doc_tables
from experiments.trm.tools import bench
from experiments.trm.tools import measure
from experiments.trm.tools import step_setup
from modules import trm


def shape_formula_flops(cfg: trm.TRMConfig) -> float:
  """FLOPs per example per optimizer step from the parameter shapes of a TRMModel."""
  params, _ = jax.eval_shape(trm.TRMModel(cfg).init, jax.random.key(0))
  S, L, D = cfg.total_len, cfg.seq_len, cfg.hidden_size
  net = 0.0
  heads = 0.0
  attention_layers = 0
  for module, leaves in params.items():
    if "w" not in leaves:
      continue
    a, b = leaves["w"].shape
    path = [p for p in module.split("/") if p != "~"]     # e.g. trm L_level layers_0 mlp_t gate_up_proj
    if "L_level" in path:
      net += 2.0 * (D if "mlp_t" in path else S) * a * b
      attention_layers += path[-2:] == ["self_attn", "qkv_proj"]
    elif path[-1] == "lm_head":
      heads += 2.0 * L * a * b
    elif path[-1] == "q_head":
      heads += 2.0 * a * b
  assert attention_layers == (0 if cfg.mlp_t else cfg.L_layers)
  net += attention_layers * 2 * (2.0 * S * S * D)
  with_grad = cfg.L_cycles + 1
  return (cfg.H_cycles * with_grad + 2 * with_grad) * net + 3 * heads


def test_analytic_flops_real_mlp_matches_reference():
  cfg = step_setup.trm_config("mlp")
  assert (cfg.hidden_size, cfg.total_len, cfg.mlp_t, cfg.H_cycles, cfg.L_cycles) == (512, 97, True,
                                                                                   3, 6)
  f = bench.analytic_flops(cfg)
  assert f.total == pytest.approx(42.7e9, rel=0.05)
  assert f.forward == pytest.approx(25.6e9, rel=0.05)
  assert f.backward == pytest.approx(17.1e9, rel=0.05)
  assert f.total == pytest.approx(shape_formula_flops(cfg), rel=1e-9)


def test_analytic_flops_real_att_matches_shape_formula():
  cfg = step_setup.trm_config("att")
  assert not cfg.mlp_t and cfg.pos_encodings == "rope" and cfg.hidden_size == 512
  f = bench.analytic_flops(cfg)
  assert f.total == pytest.approx(shape_formula_flops(cfg), rel=1e-9)
  assert f.total > bench.analytic_flops(step_setup.trm_config("mlp")).total
  assert f.forward + f.backward == f.total


# ~12 s; @slow to keep `make test` under 15 minutes (`make bench-throughput` runs it for real)
@pytest.mark.slow
def test_table_at_tiny_size():
  rows, search, peaks = bench.run_benchmark(
      ["mlp"], ["float32"], ["2"], steps=1, hidden=32, matmul_size=64, matmul_reps=1)
  assert search == [] and set(peaks) == {"float32"} and peaks["float32"] > 0
  (row,) = rows
  assert tuple(row) == bench.COLUMNS
  assert row["batch"] == 2 and row["global_batch"] == 2 * jax.local_device_count()
  assert row["step_ms"] > 0 and row["compile_s"] > 0 and row["rss_peak_GB"] > 0
  assert row["compiled_temp_GB"] > 0 and row["temp_arg_GB"] > row["compiled_temp_GB"]
  flops = bench.analytic_flops(step_setup.trm_config("mlp", "float32", hidden=32)).total
  assert row["GFLOP_per_ex"] == pytest.approx(flops / 1e9)
  assert row["GFLOP_per_s"] == pytest.approx(flops * row["examples_per_s"] / 1e9)
  assert row["frac_peak"] == pytest.approx(row["GFLOP_per_s"] * 1e9 / peaks["float32"])
  table = doc_tables.format_table(rows, bench.COLUMNS)
  header = table.splitlines()[0].split()
  assert header == list(bench.COLUMNS)
  for column in ("compile_s", "step_ms", "examples_per_s", "rss_peak_GB", "compiled_temp_GB",
                 "GFLOP_per_s", "frac_peak"):
    assert column in header
  assert len(table.splitlines()) == 3


def test_find_max_batch_prefers_no_remat_and_falls_back_to_remat(monkeypatch):
  """The search logic, with a fake compile whose memory grows with the batch (no compilation)."""
  per_example = {False: 1.0, True: 0.25}          # GB per example without / with remat
  calls = []

  class FakeSetup:
    def __init__(self, b, remat):
      self.memory = {"temp": per_example[remat] * b, "arg": 0.5}
      self.compile_s = 0.0

  def fake_compile(model, dtype, b, *, remat=False, hidden=None):
    calls.append((b, remat))
    return FakeSetup(b, remat)

  monkeypatch.setattr(step_setup, "compile_step", fake_compile)
  best, remat, rows = bench.find_max_batch("mlp", "bfloat16", [64, 8, 16, 32], 20.0)
  assert (best, remat) == (64, True)               # 16 + 0.5 fits without remat; 64 only with it
  assert calls == [(8, False), (16, False), (32, False), (32, True), (64, True)]
  assert [r["fits"] for r in rows] == ["yes", "yes", "no", "yes", "yes"]
  assert set(rows[0]) == set(bench.SEARCH_COLUMNS)
  best, remat, _ = bench.find_max_batch("mlp", "bfloat16", [8, 16], 100.0)
  assert (best, remat) == (16, False)
  best, _, _ = bench.find_max_batch("mlp", "bfloat16", [8], 1.0)
  assert best is None


def test_pipeline_throughput_tiny(tmp_path):
  out = bench.pipeline_throughput(str(tmp_path), batch_size=32, num_batches=2, train_size=64)
  assert out["batch"] == 32 and out["batches"] == 2
  assert out["examples_per_s"] > 0 and math.isfinite(out["examples_per_s"])


def test_format_table_nan_and_bools():
  rows = [{"model": "att", "remat": True, "step_ms": float("nan"), "fits": "no"}]
  text = doc_tables.format_table(rows, ("model", "remat", "step_ms", "fits"))
  assert text.splitlines()[2].split() == ["att", "on", "nan", "no"]
  assert np.isnan(rows[0]["step_ms"])


def test_minor_page_faults_count_fresh_pages_only():
  """`minor_page_faults` (the benchmarks' per-step fault counts) grows when fresh pages are touched
  and not when the same pages are touched again. 32 MiB of fresh anonymous memory is 8,192 small
  pages, or 16 huge ones where transparent huge pages are always on."""
  import mmap  # pylint: disable=g-import-not-at-top
  size = 32 << 20
  m = mmap.mmap(-1, size)
  try:
    f0 = measure.minor_page_faults()
    for off in range(0, size, 4096):
      m[off] = 1
    f1 = measure.minor_page_faults()
    for off in range(0, size, 4096):
      m[off] = 2
    f2 = measure.minor_page_faults()
  finally:
    m.close()
  assert f1 - f0 >= 16, (f0, f1)
  assert f2 - f1 < 8, (f1, f2)
