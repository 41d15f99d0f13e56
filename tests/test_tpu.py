"""experiments.tools.tpu_*: TPU slices by accelerator type, and programs compiled by libtpu's TPU
compiler on this CPU machine (memory, FLOPs, the does-not-fit path, the searches, the layout check).

The compile tests skip with one line when libtpu (the optional extra `tpu`) is not installed.
"""

import copy
import dataclasses
import math
import os
import pathlib
import subprocess
import sys

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import pytest

from experiments.common import chips
from experiments.common import errors
from experiments.common import mfu
from experiments.common import parallel
from experiments.diffucoder import train as diffusion_train
from experiments.nanogpt import train as nanogpt_train
from experiments.tools import dry_run
from experiments.tools import tpu_compile
from experiments.tools import tpu_cost
from experiments.tools import tpu_fit
from experiments.tools import tpu_report
from experiments.tools import tpu_target
from experiments.trm import train as trm_train
from experiments.trm.configs import v4_64
from modules.kernels import dispatch

GIB = 2 ** 30
REPO = pathlib.Path(__file__).resolve().parents[1]




# --------------------------------------------------------------------------------------------------
# Targets (no libtpu needed).

@pytest.mark.parametrize(("name", "canonical", "chips", "hosts", "per_host", "devices", "kind",
                          "hbm_gib", "tflops"), [
    ("v2-8", "v2-8", 4, 1, 4, 8, "TPU v2", 8, 23),           # a v2/v3 device is one TensorCore
    ("v2-512", "v2-512", 256, 64, 4, 512, "TPU v2", 8, 23),
    ("v3-8", "v3-8", 4, 1, 4, 8, "TPU v3", 16, 61.5),
    ("v3-2048", "v3-2048", 1024, 256, 4, 2048, "TPU v3", 16, 61.5),
    ("v4-8", "v4-8", 4, 1, 4, 4, "TPU v4", 32, 275),         # megacore: one device per chip
    ("v4-32", "v4-32", 16, 4, 4, 16, "TPU v4", 32, 275),
    ("v4-64", "v4-64", 32, 8, 4, 32, "TPU v4", 32, 275),
    ("v4-4096", "v4-4096", 2048, 512, 4, 2048, "TPU v4", 32, 275),
    ("v5litepod-1", "v5litepod-1", 1, 1, 1, 1, "TPU v5 lite", 16, 197),
    ("v5e-4", "v5litepod-4", 4, 1, 4, 4, "TPU v5 lite", 16, 197),
    ("V5E-8", "v5litepod-8", 8, 1, 8, 8, "TPU v5 lite", 16, 197),
    ("v5litepod-16", "v5litepod-16", 16, 4, 4, 16, "TPU v5 lite", 16, 197),
    ("v5litepod-256", "v5litepod-256", 256, 64, 4, 256, "TPU v5 lite", 16, 197),
    ("v5p-8", "v5p-8", 4, 1, 4, 4, "TPU v5", 95, 459),
    ("v5p-12288", "v5p-12288", 6144, 1536, 4, 6144, "TPU v5", 95, 459),
    ("v6e-8", "v6e-8", 8, 1, 8, 8, "TPU v6 lite", 32, 918),
    ("v6e-64", "v6e-64", 64, 16, 4, 64, "TPU v6 lite", 32, 918),
])
def test_parse_target(name, canonical, chips, hosts, per_host, devices, kind, hbm_gib, tflops):
  t = tpu_target.parse_target(name)
  assert (t.name, t.chips, t.hosts, t.chips_per_host, t.num_devices) == (
      canonical, chips, hosts, per_host, devices)
  assert t.chip.device_kind == kind
  assert t.hbm_bytes_per_device == hbm_gib * GIB
  assert t.peak_flops_per_device == pytest.approx(tflops * 1e12)
  assert t.devices_per_host * t.hosts == t.num_devices
  assert math.prod(int(d) for d in t.grid.split("x")) == chips
  assert t.usable_hbm_bytes_per_device <= t.hbm_bytes_per_device


def test_target_chip_figures():
  """Per chip: peak bf16 TFLOP/s, HBM TB/s, HBM GiB (docs/tpu.md cites them)."""
  got = {g: (c.peak_bf16_flops / 1e12, c.hbm_bytes_per_s / 1e12, c.hbm_gib)
         for g, c in tpu_target.CHIPS.items()}
  assert got == {"v2": (46, 0.7, 16), "v3": (123, 0.9, 32), "v4": (275, 1.2, 32),
                 "v5e": (197, 0.819, 16), "v5p": (459, 2.765, 95), "v6e": (918, 1.638, 32)}
  t = tpu_target.parse_target("v4-64")
  assert t.topology == "v4:2x4x4"
  assert t.topology_kwargs() == dict(platform="tpu", topology_name="v4:2x4x4",
                                     chips_per_host_bounds=(2, 2, 1), num_slices=1,
                                     chip_config_name="megacore")
  assert tpu_target.parse_target("v5litepod-8").chips_per_host_bounds == (2, 4, 1)  # one host


def test_one_chip_table_for_the_tpu_compile_and_the_live_mfu(caplog):
  """tpu_target.py and mfu.py read experiments/common/chips.py: every TPU generation, per JAX
  device (a v2/v3 device is one TensorCore: half its chip's peak)."""
  assert tpu_target.CHIPS is chips.TPU_CHIPS
  assert set(chips.TPU_CHIPS) == {"v2", "v3", "v4", "v5e", "v5p", "v6e"}
  for chip in chips.TPU_CHIPS.values():
    assert mfu.lookup_peak(chip.device_kind) == chip.peak_bf16_flops / chip.devices_per_chip
  assert mfu.lookup_peak("TPU v2") == 23e12 and mfu.lookup_peak("TPU v3") == 61.5e12
  assert mfu.lookup_peak("TPU v5") == 459e12 and mfu.lookup_peak("TPU v5 lite") == 197e12
  assert mfu.lookup_peak("TPU v5p") == 459e12 and mfu.lookup_peak("TPU v5e") == 197e12
  assert mfu.lookup_peak("NVIDIA H100 80GB HBM3") == 989e12 and mfu.lookup_peak("cpu") is None
  assert "1.97e14" in mfu.__doc__ and "9.9e13" not in mfu.__doc__
  for kind in ("TPU v4", "TPU v3"):
    assert mfu.peak_flops_per_device(device=_FakeDevice("tpu", kind)) == mfu.lookup_peak(kind)
  # An accelerator missing from the table: no MFU (0), said in the log, no timed toy matmul.
  with caplog.at_level("WARNING"):
    assert mfu.peak_flops_per_device(device=_FakeDevice("tpu", "TPU v9")) == 0.0
  assert "MFU not reported" in caplog.text and "--config.peak_flops" in caplog.text
  assert mfu.peak_flops_per_device(2.5e12, device=_FakeDevice("tpu", "TPU v9")) == 2.5e12


@dataclasses.dataclass
class _FakeDevice:
  platform: str
  device_kind: str


@pytest.mark.parametrize("name", ["v4-63", "v4-2", "v7-8", "tpu", "v4_64", "", "v5litepod-2",
                                  "v5p-24", "cpu", "v4-64 extra"])
def test_bad_target_names(name):
  with pytest.raises(tpu_target.TargetError) as e:
    tpu_target.parse_target(name)
  msg = str(e.value)
  assert isinstance(e.value, ValueError) and "\n" not in msg
  assert repr(name) in msg
  assert "v4-{8,16,32,64,128,256,512,1024,1536,2048,4096}" in msg and "v5e-N = v5litepod-N" in msg


def test_valid_target_names_parse_back():
  names = tpu_target.valid_target_names()
  assert len(names) == len(set(names)) == sum(len(s) for s in tpu_target.SLICES.values())
  assert [tpu_target.parse_target(n).name for n in names] == names


def test_parse_oom():
  parse_oom = tpu_compile.parse_oom
  assert parse_oom("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
                   "for HLO temporaries (42.00G) exceeds available HBM (15.75G).") == (
                       42 * GIB, int(15.75 * GIB))
  assert parse_oom("... required for HLO temporaries (1.37T) exceeds available HBM (512.0M)"
                   ) == (int(1.37 * 2 ** 40), 512 * 2 ** 20)
  assert parse_oom("Ran out of memory in memory space hbm. Used 20.50G of 15.48G hbm.") == (
      int(20.5 * GIB), int(15.48 * GIB))
  assert tpu_compile.parse_oom("RESOURCE_EXHAUSTED: something else") == (None, None)


def _report(**kw):
  base = dict(name="train", target=tpu_target.parse_target("v4-8"), libtpu_version="test",
              compiled=True, compile_s=1.0, argument_bytes=2 * GIB, output_bytes=GIB,
              alias_bytes=GIB, temp_bytes=3 * GIB, peak_bytes=0, compiler_flops=0.5e12,
              compiler_bytes_accessed=6e9, cost_model_raw_s=-54.0, while_loops=2,
              analytic_flops=2.75e12, items_per_step=768)
  base.update(kw)
  return tpu_report.Report(**base)


def test_report_arithmetic():
  r = _report()
  assert r.sum_bytes == 5 * GIB and r.need_bytes == 5 * GIB and r.fits   # 2 + 1 - 1 (donated) + 3
  assert _report(peak_bytes=7 * GIB).need_bytes == 7 * GIB        # the compiler's peak when given
  assert r.cost_model_s is None                                   # -54 s is not a time
  assert r.flops == 2.75e12 and r.flops_source == "analytic"
  # Loops not counted: the compiler's one-trip figures, marked; the analytic FLOPs drive compute.
  assert not r.loop_aware and r.total_flops == 0.5e12 and r.bytes_accessed == 6e9
  assert r.compute_bound_s == pytest.approx(2.75e12 / 275e12)     # 10 ms
  assert r.memory_bound_s == pytest.approx(6e9 / 1.2e12)          # 5 ms
  assert r.bound_s == pytest.approx(0.01) and r.bound_kind == "compute"
  assert r.mfu == pytest.approx(1.0) and r.items_per_s == pytest.approx(76800)
  assert r.chip_hours(65104) == pytest.approx(65104 * 0.01 * 4 / 3600)
  # Loops counted: 18 GB per step makes the memory bound (15 ms) the larger.
  counted = _report(loop_flops=3e12, loop_bytes=18e9, loop_cost_model_s=0.02)
  assert counted.loop_aware and counted.bytes_accessed == 18e9
  assert counted.compute_bound_s == pytest.approx(3e12 / 275e12)  # the larger FLOP count
  assert counted.bound_s == pytest.approx(0.015) and counted.bound_kind == "memory"
  assert counted.mfu == pytest.approx(2.75e12 / (0.015 * 275e12)) and counted.cost_model_s == 0.02
  valid = _report(cost_model_raw_s=0.02, while_loops=0)
  assert valid.loop_aware and valid.cost_model_s == 0.02 and valid.bound_s == pytest.approx(0.01)
  assert _report(cost_model_raw_s=0.02).cost_model_s is None      # loops: the model saw one trip
  compiler_only = _report(analytic_flops=None, cost_model_raw_s=float("nan"))
  assert compiler_only.flops == 0.5e12 and compiler_only.cost_model_s is None
  assert compiler_only.bound_s == pytest.approx(6e9 / 1.2e12)     # memory-bound: 5 ms
  failed = _report(compiled=False, argument_bytes=None, output_bytes=None, alias_bytes=None,
                   temp_bytes=None, oom_need_bytes=42 * GIB, compiler_flops=None,
                   compiler_bytes_accessed=None, cost_model_raw_s=None)
  assert not failed.fits and failed.need_bytes == 42 * GIB and failed.bound_s is None
  assert tpu_report.does_not_fit_message(failed) == (
      "train does not fit on v4-8: it needs 42.00 GiB of HBM per TPU v4 chip, which has 32 GiB "
      "(30.75 GiB usable)")
  v2 = _report(target=tpu_target.parse_target("v2-8"), compiled=False, oom_need_bytes=None)
  assert ("per TPU v2 TensorCore, which has 8 GiB (7.48 GiB usable"
          in tpu_report.does_not_fit_message(v2))
  table = tpu_report.format_report([r, counted, failed]).splitlines()
  assert "COMPILER ESTIMATES" in table[0] and "not measurements" in table[0]
  assert table[1].strip().startswith("v4-8: 4 TPU v4 chips, 1 host x 4")
  assert "bound (compiler estimate)" in table[2] and "predicted" not in "\n".join(table)
  rows = [line for line in table if line.startswith("train ")]
  assert len(rows) == 3
  assert "10 ms compute*" in rows[0] and "<=100%" in rows[0] and "<=76,800 examples/s" in rows[0]
  assert "15 ms memory" in rows[1] and "*" not in rows[1] and "<=51,200 examples/s" in rows[1]
  assert ">=42.00" in rows[2] and " NO" in rows[2]
  assert any(line.startswith("*: the program has while loops") for line in table)


def test_the_fit_verdict_is_the_compilers():
  """What the compiler accepts fits, judged by its peak: Maze at 48 per v4 chip compiled at a 29.05
  GiB peak while arguments + outputs - donated + temporaries add up to 33.07 GiB (issue 49)."""
  maze = _report(argument_bytes=int(0.28 * GIB), output_bytes=int(0.28 * GIB),
                 alias_bytes=int(0.28 * GIB), temp_bytes=int(32.79 * GIB),
                 peak_bytes=int(29.05 * GIB))
  assert maze.sum_bytes > maze.target.usable_hbm_bytes_per_device
  assert maze.fits and maze.need_bytes == int(29.05 * GIB)
  assert maze.margin_bytes == pytest.approx(1.70 * GIB, abs=0.01 * GIB)
  assert maze.margin == pytest.approx(1.70 / 30.75, abs=1e-3) and not maze.tight
  assert tpu_report.margin_text(maze) == "29.05 of 30.75 GiB per chip, margin 1.70 GiB (5.5%)"
  # Dream 7.6B on a v2-8 at model_parallel 2: 7.35 of 7.48 GiB per TensorCore.
  thin = _report(target=tpu_target.parse_target("v2-8"), peak_bytes=int(7.35 * GIB))
  assert thin.fits and thin.tight
  assert (tpu_report.margin_text(thin)
          == "7.35 of 7.48 GiB per TensorCore, margin 133 MiB (1.7%): tight")
  row = dict(zip(tpu_report.TABLE_HEADER, tpu_report.report_row(thin)))
  assert row["fits (margin)"] == "tight 1.7%" and row["peak"] == "7.35"
  assert "fits with a thin margin" in tpu_report.format_report([thin])


def test_search_batch_logic():
  """Fake compiles: need = 1 GiB + b x 10 MiB against v4's 30.75 GiB usable: 3046 fits at most."""
  target = tpu_target.parse_target("v4-8")

  def compile_at(b):
    need = GIB + b * 10 * 2 ** 20
    fits = need <= target.usable_hbm_bytes_per_device
    return _report(target=target, argument_bytes=need, output_bytes=0, alias_bytes=0, temp_bytes=0,
                   compiled=fits, oom_need_bytes=None if fits else need)

  best = (int(target.usable_hbm_bytes_per_device) - GIB) // (10 * 2 ** 20)
  res = tpu_fit.search_batch(compile_at, 1, 100_000)
  assert res.batch == best == 3046 and res.report.fits
  assert len(res.tried) <= 6
  res8 = tpu_fit.search_batch(compile_at, 8, 100_000, multiple_of=8)
  assert res8.batch == best // 8 * 8 and all(b % 8 == 0 for b, _ in res8.tried)
  assert tpu_fit.search_batch(compile_at, 4000, 5000).batch is None
  assert tpu_fit.search_batch(compile_at, 10, 20).batch == 20
  with pytest.raises(ValueError):
    tpu_fit.search_batch(compile_at, 5, 7, multiple_of=8)


def test_missing_libtpu_message(monkeypatch):
  monkeypatch.setattr(tpu_target, "_libtpu_version", None)
  monkeypatch.setenv("TPU_LIBRARY_PATH", "/nonexistent/libtpu.so")
  monkeypatch.setitem(sys.modules, "libtpu", None)       # `import libtpu` raises ImportError
  with pytest.raises(tpu_target.LibtpuMissingError) as e:
    tpu_target.load_libtpu()
  assert "\n" not in str(e.value) and str(e.value).endswith("pip install -e '.[tpu]'")


# --------------------------------------------------------------------------------------------------
# Compiled for TPU by libtpu.

@pytest.mark.parametrize("name", tpu_target.valid_target_names())
def test_every_target_builds_its_topology(libtpu, name):
  t = tpu_target.parse_target(name)
  devices = tpu_target.target_devices(t)
  assert len(devices) == t.num_devices
  assert {d.device_kind for d in devices} == {t.chip.device_kind}
  per_host = {}
  for d in devices:
    per_host[d.process_index] = per_host.get(d.process_index, 0) + 1
  assert sorted(per_host) == list(range(t.hosts))
  assert set(per_host.values()) == {t.devices_per_host}


def test_refused_topology_is_one_line(libtpu):
  """A one-chip grid cannot be split into 2x2x1 hosts: libtpu refuses it, the error says so."""
  bad = dataclasses.replace(tpu_target.parse_target("v6e-1"), chips_per_host_bounds=(2, 2, 1))
  with pytest.raises(tpu_target.TargetError) as e:
    tpu_target.target_devices(bad)
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("libtpu 0.0.42") and "v6e:1x1" in msg
  assert "not divisible" in msg


def _mlp_step(sizes):
  """SGD step of a tanh MLP (mean-square loss), gradients averaged over the devices."""
  def loss(ws, x):
    h = x
    for w in ws:
      h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)

  def step(ws, x):                       # ws replicated, x per device [B, sizes[0]]
    grads = jax.lax.pmean(jax.grad(loss)(ws, x), parallel.AXIS)
    return [w - 0.01 * g for w, g in zip(ws, grads)], jnp.sum(x)
  weights = [jax.ShapeDtypeStruct((a, b), jnp.float32) for a, b in zip(sizes[:-1], sizes[1:])]
  return step, weights


@pytest.mark.parametrize("name", ["v4-8", pytest.param("v5e-4", marks=pytest.mark.slow), "v4-64"])
def test_mlp_train_step(libtpu, name):
  target = tpu_target.parse_target(name)
  B, sizes = 512, (1024, 2048, 1024)
  step, weights = _mlp_step(sizes)
  x = jax.ShapeDtypeStruct((B, sizes[0]), jnp.float32)
  lowered = tpu_target.lower_step(step, target, (weights, x), state_in=(0,), out_axes=(None, 0),
                                  donate_argnums=(0,))
  assert lowered.in_avals[0][1].shape == (target.num_devices, B, sizes[0])   # global device axis
  assert lowered.in_avals[0][0][0].shape == (1024, 2048)                     # replicated: as given
  # Forward 2BKN per layer, weight gradients 2BKN, input gradient 2BKN except for the first layer.
  matmuls = [2 * B * a * b for a, b in zip(sizes[:-1], sizes[1:])]
  analytic = 3 * sum(matmuls) - matmuls[0]
  r = tpu_compile.compile_report(lowered, target=target, name="mlp",
                                 analytic_flops_per_device=analytic,
                                 items_per_step=B * target.num_devices)
  assert r.compiled and r.fits and r.layout_constraints is False and r.while_loops == 0
  weight_bytes = 4 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
  assert r.argument_bytes == weight_bytes + 4 * B * sizes[0]   # one device's share of x
  assert r.output_bytes >= weight_bytes and r.alias_bytes == weight_bytes   # donated
  assert 0 < r.need_bytes < target.usable_hbm_bytes_per_device
  assert r.compiler_flops == pytest.approx(analytic, rel=0.1)
  assert r.compiler_bytes_accessed > weight_bytes and r.compile_s > 0
  assert r.bound_s >= analytic / target.peak_flops_per_device
  assert 0 < r.mfu <= 1 and r.items_per_s == pytest.approx(B * target.num_devices / r.bound_s)
  assert target.name in tpu_report.format_report([r])


@pytest.mark.slow    # make test: test_dry_run's FLOPs against the analytic count, every loop trip
def test_loops_are_counted_trip_by_trip(libtpu):
  """The compiler's cost analysis counts a loop body once: a 5-trip fori_loop of a matmul reports one
  matmul. `loop_aware_cost` compiles the body once more and counts 5, as for the same 5 matmuls
  unrolled (FLOPs within 0.1%; bytes within 15%: a standalone body reads its carry from HBM). A
  loop-free program's counts stay the compiler's; nested loops multiply (4 x 3 matmuls)."""
  target = tpu_target.parse_target("v4-8")
  M, K, N = 1024, 2048, 4096
  w = jax.ShapeDtypeStruct((K, N), jnp.bfloat16)
  x = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
  one = 2 * M * K * K

  def matmul(y, w):
    return jnp.tanh(jnp.dot(y, w[:, :K]))

  def looped(w, x):
    y = jax.lax.fori_loop(0, 5, lambda i, y: matmul(y, w), x)
    return jax.lax.psum(jnp.sum(y.astype(jnp.float32)), parallel.AXIS)

  def unrolled(w, x):
    y = x
    for _ in range(5):
      y = matmul(y, w)
    return jax.lax.psum(jnp.sum(y.astype(jnp.float32)), parallel.AXIS)

  def nested(w, x):
    inner = lambda i, y: jax.lax.fori_loop(0, 3, lambda j, y: matmul(y, w), y) * 0.5  # noqa: E731
    return jax.lax.psum(jnp.sum(jax.lax.fori_loop(0, 4, inner, x).astype(jnp.float32)),
                        parallel.AXIS)

  def report(fn):
    return tpu_compile.compile_report(tpu_target.lower_step(fn, target, (w, x), state_in=(0,)),
                                      target=target, name=fn.__name__,
                                      jaxpr=tpu_cost.per_device_jaxpr(fn, target, (w, x)))
  loop, plain, nest = report(looped), report(unrolled), report(nested)
  assert plain.while_loops == 0 and plain.loops == () and plain.loop_aware
  assert (plain.loop_flops, plain.loop_bytes) == (plain.compiler_flops,
                                                  plain.compiler_bytes_accessed)
  assert plain.compiler_flops == pytest.approx(5 * one, rel=0.01)
  assert loop.while_loops >= 1 and loop.loop_note is None
  assert loop.compiler_flops == pytest.approx(one, rel=0.01)           # one trip, not five
  assert [lp.trips for lp in loop.loops] == [5] and loop.loop_aware
  assert loop.loop_flops == pytest.approx(plain.compiler_flops, rel=1e-3)
  assert loop.loop_bytes == pytest.approx(plain.compiler_bytes_accessed, rel=0.15)
  assert loop.bound_s == pytest.approx(plain.bound_s, rel=0.15)
  assert sorted(lp.trips for lp in nest.loops) == [3, 4]
  assert nest.loop_flops == pytest.approx(12 * one, rel=0.01)
  assert "*" not in tpu_report.format_report([loop, plain, nest])


def test_a_loop_body_too_big_alone_is_counted_once_with_a_note(libtpu):
  """Under fsdp a step splits a 16 GiB weight over a v5e-4's chips (4 GiB each); its loop body
  compiled alone would hold it whole on one 15.75 GiB chip. The report keeps the program's memory
  and the compiler's one-trip count for that loop, with a note naming it (a "~" row), instead of
  failing the whole check."""
  target = tpu_target.parse_target("v5litepod-4")
  w = jax.ShapeDtypeStruct((4 * 2 ** 30 // 4, 4), jnp.float32)           # 16 GiB, [2^30, 4]
  x = jax.ShapeDtypeStruct((8,), jnp.float32)

  def step(w, x):
    y = jax.lax.fori_loop(0, 3, lambda i, y: y + jnp.sum(w[:8] * 2.0, axis=1), x)
    return jax.lax.psum(jnp.sum(y), parallel.AXIS)
  lowered = tpu_target.lower_step(step, target, (w, x), rules=parallel.Rules("fsdp"),
                                  state_in=(0,), blocks=True)
  r = tpu_compile.compile_report(lowered, target=target, name="step",
                                 jaxpr=tpu_cost.per_device_jaxpr(step, target, (w, x)))
  assert r.compiled and r.fits and r.argument_bytes < 5 * 2 ** 30       # w split 4 ways
  assert r.loops == () and "does not fit a v5litepod-4 chip" in r.loop_note
  assert "3 trips are counted once" in r.loop_note
  assert (r.loop_flops, r.loop_bytes) == (r.compiler_flops, r.compiler_bytes_accessed)


def _big_input_step(remat):
  def step(w, x):                       # w replicated [D, D], x per device [B, D] float32
    loss = lambda w: jnp.mean(jnp.tanh(x @ w) ** 2)
    loss = jax.checkpoint(loss) if remat else loss
    return w - 0.1 * jax.lax.pmean(jax.grad(loss)(w), parallel.AXIS)
  return step


def _compile_big(target, batch, remat=False, D=512):
  lowered = tpu_target.lower_step(_big_input_step(remat), target, (
      jax.ShapeDtypeStruct((D, D), jnp.float32), jax.ShapeDtypeStruct((batch, D), jnp.float32)),
      state_in=(0,), out_axes=None, donate_argnums=(0,))
  return tpu_compile.compile_report(lowered, target=target, name=f"batch {batch}")


def test_does_not_fit_and_first_fitting(libtpu):
  """8M x 512 float32 rows per chip: 16 GiB of input alone, more than a v5e chip's 15.75 usable."""
  target = tpu_target.parse_target("v5e-4")
  big = _compile_big(target, 2 ** 23)
  assert not big.compiled and not tpu_report.fits(big)
  assert big.need_bytes >= 16 * GIB and "RESOURCE_EXHAUSTED" in big.compiler_message
  msg = str(tpu_report.DoesNotFitError(big))
  assert msg == tpu_report.does_not_fit_message(big)
  assert msg.startswith("batch 8388608 does not fit on v5litepod-4: it needs 16.00 GiB of HBM per "
                        "TPU v5 lite chip, which has 16 GiB (15.75 GiB usable)")
  found, tried = tpu_fit.first_fitting([
      ("as configured", "", lambda: big),
      ("remat", "--config.remat=True", lambda: _compile_big(target, 2 ** 23, remat=True)),
      ("quarter batch", "--config.batch_size=2097152", lambda: _compile_big(target, 2 ** 21)),
      ("eighth batch", "--config.batch_size=1048576", lambda: _compile_big(target, 2 ** 20)),
  ])
  assert [v.label for v in tried] == ["as configured", "remat", "quarter batch"]
  assert found is tried[-1] and found.report.fits and not tried[1].report.fits
  assert found.report.need_bytes >= 4 * GIB                   # the 4 GiB input is in it
  text = tpu_fit.format_variants(tried).splitlines()
  assert text[0] == "  as configured: >=16.00 GiB of 15.75 GiB per chip, does not fit"
  assert text[2].endswith("fits: --config.batch_size=2097152")


def test_search_batch_compiles(libtpu):
  target = tpu_target.parse_target("v5e-4")
  res = tpu_fit.search_batch(lambda b: _compile_big(target, b), 2 ** 12, 2 ** 23,
                             multiple_of=2 ** 16)
  assert res.report.fits and res.batch % 2 ** 16 == 0
  assert res.batch * 512 * 4 <= target.usable_hbm_bytes_per_device    # the input alone fits
  assert not _compile_big(target, res.batch + 2 ** 16).fits
  assert len(res.tried) <= 8


def test_compiler_hbm_limits_match_the_chip_table(libtpu):
  """What the compiler says is available per device when 64 GiB (v5p: 128) of input does not fit."""
  for family, gen in (("v2-8", "v2"), ("v3-8", "v3"), ("v4-8", "v4"), ("v5e-4", "v5e"),
                      ("v5p-8", "v5p"), ("v6e-4", "v6e")):
    target = tpu_target.parse_target(family)
    width = 2048 if gen == "v5p" else 1024              # 128 GiB / 64 GiB of float32 input
    lowered = tpu_target.lower_step(lambda x: jax.lax.psum(jnp.sum(x), parallel.AXIS), target,
                                    (jax.ShapeDtypeStruct((2 ** 24, width), jnp.float32),))
    try:
      lowered.compile()
      raise AssertionError(f"{family}: expected RESOURCE_EXHAUSTED")
    except jax.errors.JaxRuntimeError as e:
      _, available = tpu_compile.parse_oom(str(e))
    assert available == int(tpu_target.CHIPS[gen].compiler_hbm_gib * GIB), family


def test_layout_constraints_detected(libtpu):
  """`dispatch.ops("xla_cpu", dtype).matmul` (the CPU-target form) pins a row-major transpose; the
  check finds it in that program only, so a TPU compile that carried it by mistake is reported."""
  target = tpu_target.parse_target("v4-8")

  def make(kernels):
    def step(w, x):                     # w replicated [256, 512], x per device [128, 256]
      loss = lambda w: jnp.sum(dispatch.ops(kernels, jnp.bfloat16).matmul(x, w) ** 2)
      g = jax.grad(loss)(w)
      return jax.lax.pmean(g, parallel.AXIS)
    return tpu_target.lower_step(step, target, (jax.ShapeDtypeStruct((256, 512), jnp.float32),
                                                jax.ShapeDtypeStruct((128, 256), jnp.float32)),
                                 state_in=(0,), out_axes=None)
  cpu_style, plain = make("xla_cpu"), make("default")
  assert tpu_compile.hlo_has_layout_constraints(cpu_style)
  assert tpu_compile.hlo_has_layout_constraints(cpu_style.as_text(dialect="hlo"))
  assert not tpu_compile.hlo_has_layout_constraints(plain)
  assert not tpu_compile.hlo_has_layout_constraints(plain.as_text(dialect="hlo"))
  r = tpu_compile.compile_report(cpu_style, target=target, name="fast_grad")
  assert r.layout_constraints is True and r.compiled
  assert any(line.startswith("fast_grad: the program pins array layouts")
             for line in tpu_report.format_report([r]).splitlines())
  with pytest.raises(TypeError, match="Lowered"):
    tpu_compile.hlo_has_layout_constraints(plain.compile())


# --------------------------------------------------------------------------------------------------
# The fixes the dry run tries when the training step does not fit (dry_run.fit_variants): their
# order, and their flags parsed as a user's command line gives the config the variant applies.

REMAT, BF16, FSDP = "--config.model.remat=True", "--config.model.dtype=bfloat16", "--config.sharding=fsdp"


def _load(path: str, argv=()):
  """The config file (REPO-relative path[:arg]) with `argv` overrides, parsed by ml_collections'
  config flags as `--config=... --config.FIELD=VALUE` on a podlab command line."""
  args = ["main", f"--config={REPO / path}", *argv]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=fv, lock_config=True, sys_argv=args)
  fv(args)
  return fv.config


@pytest.mark.parametrize("experiment, path, overrides, per_host, expect", [
    # nanoGPT at the reference's float32: remat and bfloat16 alone, fsdp alone and with each.
    (nanogpt_train.NanoGPT, "experiments/nanogpt/configs/shakespeare_char_cpu.py:smoke", (), None,
     [REMAT, BF16, FSDP, f"{FSDP} {REMAT}", f"{FSDP} {BF16}"]),
    # GPT-2 XL finetuning (bfloat16, replicated, issue 45): remat, fsdp, fsdp + remat.
    (nanogpt_train.NanoGPT, "experiments/nanogpt/configs/finetune_shakespeare.py:gpt2-xl,devices=4",
     (), None, [REMAT, FSDP, f"{FSDP} {REMAT}"]),
    (nanogpt_train.NanoGPT, "experiments/nanogpt/configs/finetune_shakespeare.py:gpt2-xl,devices=4",
     (FSDP, REMAT), None, []),                             # nothing left to try but the batch
    (trm_train.TRM, "experiments/trm/configs/cpu_demo.py:smoke", (), None,
     [REMAT, FSDP, f"{FSDP} {REMAT}"]),
    (trm_train.TRM, "experiments/trm/configs/cpu_demo.py:smoke", (FSDP,), None, [REMAT]),
    (diffusion_train.MaskedDiffusion, "experiments/diffucoder/configs/shakespeare_mdm.py", (), None,
     [FSDP]),
    # On a slice with 4 chips per host: the model axis too, at the degrees the model splits into
    # (2 KV heads: 2, not 4); none for an experiment without a model split.
    (diffusion_train.MaskedDiffusion, "experiments/diffucoder/configs/shakespeare_mdm.py", (), 4,
     [FSDP, f"{FSDP} --config.model_parallel=2"]),
    (diffusion_train.MaskedDiffusion, "experiments/diffucoder/configs/dream_7b_mdm.py", (), 4,
     ["--config.model_parallel=2", "--config.model_parallel=4"]),
    (trm_train.TRM, "experiments/trm/configs/cpu_demo.py:smoke", (FSDP,), 4, [REMAT]),
])
def test_the_fixes_in_order_and_their_flags_as_typed(experiment, path, overrides, per_host, expect):
  config = _load(path, overrides)
  before = config.to_dict()
  variants = dry_run.fit_variants(experiment(), config, per_host)
  assert [v[1] for v in variants] == expect
  for label, flag_text, apply in variants:
    assert label and "\n" not in label
    if flag_text.startswith(FSDP):
      assert label.startswith("fsdp")
    applied = copy.deepcopy(config)
    with applied.unlocked():
      apply(applied)
    typed = _load(path, (*overrides, *flag_text.split()))      # the flags as the user types them
    assert typed.to_dict() == applied.to_dict() != before, flag_text
  assert config.to_dict() == before                             # the config itself untouched


def test_the_fix_line_names_the_first_variant_that_fits(monkeypatch, capsys):
  """GPT-2 XL finetuning on a v4-8 (issue 45), the compiles stood in for: only fsdp + remat fits.
  The dry run prints every tried variant in order and exits with one line naming the first fix
  that fits and its flags."""
  config = _load("experiments/nanogpt/configs/finetune_shakespeare.py:gpt2-xl,devices=4")
  tried = []

  def fake_compile(experiment, c, target, *, only=None, loop_aware=True):
    del experiment, only, loop_aware
    tried.append((c.sharding, bool(c.model.remat)))
    fits = c.sharding == "fsdp" and c.model.remat
    need = (20 if fits else 36) * GIB
    r = (_report(target=target, peak_bytes=need) if fits else
         _report(target=target, compiled=False, oom_need_bytes=need))
    return [r], 1000

  monkeypatch.setattr(tpu_target, "load_libtpu", lambda: "test")
  monkeypatch.setattr(dry_run, "compile_for_tpu", fake_compile)
  with pytest.raises(errors.BadInput) as e:
    dry_run.run(nanogpt_train.NanoGPT(), config, target="v4-8", name="gpt2-xl")
  assert tried == [("replicated", False),                          # as configured
                   ("replicated", True), ("fsdp", False), ("fsdp", True)]
  message = str(e.value)
  assert "\n" not in message and message.startswith("train does not fit on v4-8: it needs 36.00 GiB")
  assert message.endswith(f". Fix: fsdp + remat (recompute each block's activations in the "
                          f"backward pass; the same numbers): {FSDP} {REMAT}")
  printed = capsys.readouterr().out.split("Tried to make train_step fit:\n")[1].splitlines()
  assert [line.split(":")[0].strip().split(" (")[0] for line in printed] == [
      "remat", "fsdp", "fsdp + remat"]
  assert printed[0].endswith(f"does not fit: {REMAT}") and printed[2].endswith(
      f"20.00 GiB of 30.75 GiB per chip, fits: {FSDP} {REMAT}")


# --------------------------------------------------------------------------------------------------
# A config's layout against a target (dry_run.tpu_layout: checked before anything compiles).

def test_tpu_layout_checks_devices_per_host_against_the_slice():
  c = v4_64.get_config()                    # 32 devices, 4 per host (a v4-64's 8 hosts)
  layout = dry_run.tpu_layout(trm_train.TRM(), c, tpu_target.parse_target("v4-64"))
  assert (layout.hosts, layout.devices_per_host, layout.per_host_batch,
          layout.per_device_batch) == (8, 4, 96, 24)
  c.num_devices, c.global_batch_size = 8, 768
  with pytest.raises(errors.ConfigError) as e:
    dry_run.tpu_layout(trm_train.TRM(), c, tpu_target.parse_target("v6e-8"))   # 1 host x 8 chips
  assert str(e.value) == (
      "config.devices_per_host=4: the config's per-host data layout is written for 4 devices per "
      "host but v6e-8 has 8 chips per host (1 host(s)). Fix: pass --config.devices_per_host=8, or a "
      "--target with 4 chips per host")


def test_a_target_with_other_chips_per_host_is_one_line_exit_2_before_compiling():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-m", "experiments.trm.main", "--config=configs/v4_64.py",
                         "--dry_run", "--target=v6e-8", "--config.num_devices=8"], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  assert lines[-1].startswith("error: config.devices_per_host=4: ") and "Traceback" not in proc.stderr
  assert "v6e-8 has 8 chips per host" in lines[-1] and "--config.devices_per_host=8" in lines[-1]
