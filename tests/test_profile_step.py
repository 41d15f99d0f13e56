"""experiments/trm/tools/profile_step.py: the trace parser, the HLO index and the per-op table, on a
small program traced here (no TRM step: the numbers are checked against what the program does)."""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.trm.tools import profile_step


def _program():
  def f(a, b):
    y = jnp.dot(a, b)                                           # [256, 384] @ [384, 128]
    return jnp.tanh(y) * 2.0
  a = jnp.ones((256, 384), jnp.float32)
  b = jnp.ones((384, 128), jnp.float32)
  return jax.jit(f).lower(a, b).compile(), (a, b)


def test_hlo_index_counts_the_matmul_flops_of_the_compiled_program():
  compiled, _ = _program()
  index = profile_step.hlo_index(compiled.as_text())
  flops = sorted(h.flops for h in index.values() if h.flops)
  assert flops and flops[-1] == 2.0 * 256 * 384 * 128          # the one matmul, fused or not
  assert sum(flops) == 2.0 * 256 * 384 * 128


def test_hlo_index_marks_the_backward_pass():
  """An op of the backward pass is named `... (bwd)`; the forward's keep their plain name."""
  a = jnp.ones((64, 32), jnp.float32)
  b = jnp.ones((32, 16), jnp.float32)
  loss = lambda a, b: jnp.sum(jnp.tanh(a @ b))                  # noqa: E731
  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(a, b).compile()
  index = profile_step.hlo_index(compiled.as_text())
  dots = [h for h in index.values() if h.flops]
  backward = [h for h in dots if h.source.endswith(" (bwd)")]
  forward = [h for h in dots if not h.source.endswith(" (bwd)")]
  assert len(forward) == 1 and forward[0].shape == "f32[64,16]"  # a @ b
  assert len(backward) == 2                                     # d a and d b
  assert sorted(h.flops for h in backward) == [2.0 * 32 * 64 * 16] * 2


def test_traced_steps_give_one_matmul_row_per_step(tmp_path):
  compiled, args = _program()
  index = profile_step.hlo_index(compiled.as_text())
  compiled(*args).block_until_ready()
  jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
  for _ in range(3):
    compiled(*args).block_until_ready()
  jax.profiler.stop_trace()
  ops = profile_step.parse_trace(str(tmp_path))
  assert ops and all(o.end > o.start for o in ops)
  rows, totals = profile_step.profile_table(ops, index, steps=3)
  mm = [r for r in rows if r["GFLOP"]]
  assert len(mm) == 1 and mm[0]["calls"] == 1
  np.testing.assert_allclose(mm[0]["GFLOP"], 2 * 256 * 384 * 128 / 1e9)
  assert totals["GFLOP"] == pytest.approx(mm[0]["GFLOP"])
  assert totals["op_ms"] == pytest.approx(sum(r["ms"] for r in rows))
  assert totals["one_ms"] + totals["two_ms"] <= totals["wall_ms"] * 1.0001
  # Every row shown (with top=1 a loaded machine can make the elementwise op the longest one).
  text = profile_step.format_profile(rows, totals, peak_gflop_s=100.0, top=len(rows))
  assert "GFLOP/s" in text and mm[0]["shape"] in text


def test_overlap_and_busy_time_from_a_written_trace(tmp_path):
  """Two operations on two threads overlapping by half of the first: overlap 0.5 and 1.0, and the
  busy profile splits the span into one-op and two-op time exactly."""
  events = [
      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "a"}},
      {"ph": "X", "name": "fusion.1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
      {"ph": "X", "name": "fusion.2", "pid": 1, "tid": 2, "ts": 50, "dur": 50},
      {"ph": "X", "name": "ThunkExecutor::Execute", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
  ]
  path = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(path, "wt") as fh:
    json.dump({"traceEvents": events}, fh)
  ops = profile_step.parse_trace(str(path))
  assert [o.name for o in ops] == ["fusion.1", "fusion.2"]     # runtime bookkeeping dropped
  rows, totals = profile_step.profile_table(ops, {}, steps=1)
  by_name = {r["op"]: r for r in rows}
  assert by_name["fusion"]["calls"] == 2
  assert by_name["fusion"]["overlap"] == pytest.approx((50 + 50) / 150)
  assert totals["wall_ms"] == pytest.approx(0.1)
  assert totals["one_ms"] == pytest.approx(0.05) and totals["two_ms"] == pytest.approx(0.05)


def test_bad_flags_name_the_fix():
  with pytest.raises(SystemExit):
    profile_step.parse_args(["--model=demo", "--dtype=bfloat16"])
  with pytest.raises(SystemExit):
    profile_step.parse_args(["--steps=0"])


def test_a_long_operation_counts_every_short_one_beside_it(tmp_path):
  """One 1 ms operation beside 100 short ones on another thread: its overlap is their summed time,
  however many operations started in between."""
  events = [{"ph": "X", "name": "long.1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
  events += [{"ph": "X", "name": f"short.{k}", "pid": 1, "tid": 2, "ts": 5 + 9 * k, "dur": 4}
             for k in range(100)]
  path = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(path, "wt") as fh:
    json.dump({"traceEvents": events}, fh)
  rows, _ = profile_step.profile_table(profile_step.parse_trace(str(path)), {}, steps=1)
  by_name = {r["op"]: r for r in rows}
  assert by_name["long"]["overlap"] == pytest.approx(400 / 1000)
  assert by_name["short"]["overlap"] == pytest.approx(1.0)
