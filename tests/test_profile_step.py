"""experiments/trm/tools/profile_step.py and the modules it prints with (trace_ops.py: the trace
parser, the HLO index and the per-op table; trace_kernels.py: a device's kernel table;
hlo_instructions.py: the HLO summary), on small programs traced here (no TRM step: the numbers are
checked against what the program does)."""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.trm.tools import hlo_instructions
from experiments.trm.tools import profile_step
from experiments.trm.tools import trace_kernels
from experiments.trm.tools import trace_ops


def _program():
  def f(a, b):
    y = jnp.dot(a, b)                                           # [256, 384] @ [384, 128]
    return jnp.tanh(y) * 2.0
  a = jnp.ones((256, 384), jnp.float32)
  b = jnp.ones((384, 128), jnp.float32)
  return jax.jit(f).lower(a, b).compile(), (a, b)


def test_hlo_index_counts_the_matmul_flops_of_the_compiled_program():
  compiled, _ = _program()
  index = trace_ops.hlo_index(compiled.as_text())
  flops = sorted(h.flops for h in index.values() if h.flops)
  assert flops and flops[-1] == 2.0 * 256 * 384 * 128          # the one matmul, fused or not
  assert sum(flops) == 2.0 * 256 * 384 * 128


def test_hlo_index_marks_the_backward_pass():
  """An op of the backward pass is named `... (bwd)`; the forward's keep their plain name."""
  a = jnp.ones((64, 32), jnp.float32)
  b = jnp.ones((32, 16), jnp.float32)
  loss = lambda a, b: jnp.sum(jnp.tanh(a @ b))                  # noqa: E731
  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(a, b).compile()
  index = trace_ops.hlo_index(compiled.as_text())
  dots = [h for h in index.values() if h.flops]
  backward = [h for h in dots if h.source.endswith(" (bwd)")]
  forward = [h for h in dots if not h.source.endswith(" (bwd)")]
  assert len(forward) == 1 and forward[0].shape == "f32[64,16]"  # a @ b
  assert len(backward) == 2                                     # d a and d b
  assert sorted(h.flops for h in backward) == [2.0 * 32 * 64 * 16] * 2


def test_traced_steps_give_one_matmul_row_per_step(tmp_path):
  compiled, args = _program()
  index = trace_ops.hlo_index(compiled.as_text())
  compiled(*args).block_until_ready()
  jax.profiler.start_trace(str(tmp_path), create_perfetto_trace=True)
  for _ in range(3):
    compiled(*args).block_until_ready()
  jax.profiler.stop_trace()
  ops = trace_ops.parse_trace(str(tmp_path))
  assert ops and all(o.end > o.start for o in ops)
  rows, totals = trace_ops.profile_table(ops, index, steps=3)
  mm = [r for r in rows if r["GFLOP"]]
  assert len(mm) == 1 and mm[0]["calls"] == 1
  np.testing.assert_allclose(mm[0]["GFLOP"], 2 * 256 * 384 * 128 / 1e9)
  assert totals["GFLOP"] == pytest.approx(mm[0]["GFLOP"])
  assert totals["op_ms"] == pytest.approx(sum(r["ms"] for r in rows))
  assert totals["one_ms"] + totals["two_ms"] <= totals["wall_ms"] * 1.0001
  # Every row shown (with top=1 a loaded machine can make the elementwise op the longest one).
  text = trace_ops.format_profile(rows, totals, peak_gflop_s=100.0, top=len(rows))
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
  ops = trace_ops.parse_trace(str(path))
  assert [o.name for o in ops] == ["fusion.1", "fusion.2"]     # runtime bookkeeping dropped
  rows, totals = trace_ops.profile_table(ops, {}, steps=1)
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
  rows, _ = trace_ops.profile_table(trace_ops.parse_trace(str(path)), {}, steps=1)
  by_name = {r["op"]: r for r in rows}
  assert by_name["long"]["overlap"] == pytest.approx(400 / 1000)
  assert by_name["short"]["overlap"] == pytest.approx(1.0)


def _gpu_trace(path, host_noise=True):
  """A chrome-trace file laid out as jax.profiler writes one on a CUDA machine
  (`plugins/profile/<run>/<host>.trace.json.gz`): a host process, and a device process
  `/device:GPU:0` whose `Stream #N` lines hold the kernels and memcpys (args: the HLO op and
  module, CUPTI's correlation id and kernel details) and whose `XLA Modules` / `XLA Ops` lines
  summarize them. Two steps of: a TF32 GEMM (3 ms), a bf16 GEMM (1 ms), a fusion twice (0.5 ms
  each), a memcpy (0.25 ms); 0.5 ms idle between the steps' kernels."""
  meta = [
      {"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}},
      {"ph": "M", "pid": 701, "tid": 11, "name": "thread_name", "args": {"name": "python"}},
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
      {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name",
       "args": {"name": "Stream #9(MemcpyD2D)"}},
      {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "XLA Modules"}},
      {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
  ]
  tf32 = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"
  bf16 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize1x2x1_execute"
  events = []
  for step in range(2):
    t = 10_000.0 + step * 6_000.0
    events.append({"ph": "X", "pid": 1, "tid": 1, "ts": t, "dur": 5_250, "name": "jit_step(1)"})
    for name, dur, tid, hlo in ((tf32, 3000, 7, "dot.5"), (bf16, 1000, 7, "dot.7"),
                                ("loop_multiply_fusion", 500, 7, "loop_multiply_fusion.3"),
                                ("loop_multiply_fusion", 500, 7, "loop_multiply_fusion.3"),
                                ("MemcpyD2D", 250, 9, "copy.2")):
      args = {"hlo_op": hlo, "hlo_module": "jit_step", "correlation_id": str(len(events)),
              "kernel_details": "regs:128 static_shared:0 dynamic_shared:232448 grid:132,1,1 "
                                "block:384,1,1 occ_pct:12.5"}
      events.append({"ph": "X", "pid": 1, "tid": tid, "ts": t, "dur": dur, "name": name,
                     "args": args})
      events.append({"ph": "X", "pid": 1, "tid": 2, "ts": t, "dur": dur, "name": hlo})  # summary
      t += dur
    if host_noise:
      events.append({"ph": "X", "pid": 701, "tid": 11, "ts": 9_000.0 + step * 6_000,
                     "dur": 400, "name": "cuLaunchKernel"})
  with gzip.open(path, "wt") as fh:
    json.dump({"displayTimeUnit": "ns", "metadata": {"highres-ticks": True},
               "traceEvents": meta + events}, fh)


def test_gpu_trace_gives_kernels_per_step_with_their_gemm_dtype(tmp_path):
  run = tmp_path / "plugins" / "profile" / "2026_11_27_20_00_00"
  run.mkdir(parents=True)
  _gpu_trace(run / "gpu-host.trace.json.gz")
  kernels = trace_kernels.parse_device_trace(str(tmp_path))       # the folder jax.profiler wrote
  assert len(kernels) == 10                                        # stream events only, no summaries
  assert {k.device for k in kernels} == {"/device:GPU:0"}
  index = {"dot.5": trace_ops.HloOp("f32[768,512]", "mlp/down_proj/dot_general (bwd)", 0.0)}
  rows, totals = trace_kernels.kernel_table(kernels, steps=2, index=index)
  by = {r["kernel"][:14]: r for r in rows}
  assert [r["kernel"][:14] for r in rows] == ["sm90_xmma_gemm", "sm90_xmma_gemm", "loop_multiply_",
                                             "MemcpyD2D"]
  assert by["loop_multiply_"]["ms"] == pytest.approx(1.0) and by["loop_multiply_"]["launches"] == 2
  assert rows[0]["ms"] == pytest.approx(3.0) and rows[0]["gemm"] == "tf32"
  assert rows[0]["op"] == "mlp/down_proj/dot_general (bwd)" and rows[0]["hlo_op"] == "dot.5"
  assert rows[1]["gemm"] == "bf16" and by["MemcpyD2D"]["gemm"] == ""
  assert totals["kernel_ms"] == pytest.approx(5.25) and totals["launches"] == 5
  assert totals["span_ms"] == pytest.approx((6_000 + 5_250) / 1e3 / 2)
  assert totals["idle_ms"] == pytest.approx(0.75 / 2)             # between the two steps' kernels
  assert totals["gemm_ms"] == {"tf32": pytest.approx(3.0), "bf16": pytest.approx(1.0)}
  assert sum(r["share"] for r in rows) == pytest.approx(1.0)
  text = trace_kernels.format_kernels(rows, totals, top=2)
  assert "5 launches" in text and "GEMM ms by dtype: tf32 3.0, bf16 1.0" in text
  assert "(2 more kernels)" in text
  # The host's events are not kernels, and the CPU reader leaves the device's out.
  assert [o.name for o in trace_ops.parse_trace(str(tmp_path))] == ["cuLaunchKernel"] * 2


def test_a_cpu_trace_has_no_device_kernels(tmp_path):
  compiled, args = _program()
  compiled(*args).block_until_ready()
  jax.profiler.start_trace(str(tmp_path))
  compiled(*args).block_until_ready()
  jax.profiler.stop_trace()
  assert trace_kernels.parse_device_trace(str(tmp_path)) == []
  assert trace_ops.parse_trace(str(tmp_path))                  # the *.trace.json.gz jax wrote


@pytest.mark.parametrize("name, dtype", [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute", "tf32"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize1x2x1_execute", "bf16"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "bf16"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "f16"),
    ("volta_sgemm_128x64_nn", "f32"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", "fp8"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "?"),
    ("loop_multiply_fusion", ""),
    ("input_reduce_fusion_3", ""),
])
def test_gemm_dtype_from_the_kernel_name(name, dtype):
  assert trace_kernels.gemm_dtype(name) == dtype


def test_hlo_summary_reads_a_module_as_lowered_and_as_compiled():
  """The matmuls' operand dtypes (a bf16 product run in float32 found through the convert), the
  scatters and op counts, in both the lowered module's text and the compiled one's."""
  def loss(w, x, tok):
    y = jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return jnp.sum(jnp.tanh(y)) + jnp.sum(jnp.take(w, tok, axis=0))
  args = (jax.ShapeDtypeStruct((64, 32), jnp.float32), jax.ShapeDtypeStruct((16, 64), jnp.float32),
          jax.ShapeDtypeStruct((8,), jnp.int32))
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args)
  s = hlo_instructions.hlo_summary(lowered.as_text("hlo", debug_info=True))
  assert len(s.dots) == 3                                          # forward, d x, d w
  forward = [d for d in s.dots if "transpose(" not in d.op_name]
  assert len(forward) == 1 and forward[0].operand_dtypes == ("bf16", "bf16")
  assert not forward[0].float32
  assert len(s.f32_dots_from_bf16) == 2                            # the backward's two products
  assert all("transpose(jvp())" in d.op_name for d in s.f32_dots_from_bf16)
  assert [x.shape for x in s.scatters] == ["f32[64,32]"]          # take's gradient
  assert s.op_counts["dot"] == 3 and s.kernels > 0
  text = hlo_instructions.format_hlo_summary(s, title="t",
                                             cost={"flops": 1.0, "bytes accessed": 2.0})
  assert "2 of them bf16 products run in float32" in text and "scatter: f32[64,32]" in text
  assert "bytes accessed 2" in text
  compiled = hlo_instructions.hlo_summary(lowered.compile().as_text())
  assert compiled.op_counts.get("fusion", 0) > 0 and compiled.kernels < sum(compiled.op_counts.values())
