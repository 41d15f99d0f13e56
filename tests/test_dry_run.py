"""`--dry_run --target=<TPU type>`: podlab's real programs compiled by the TPU compiler (libtpu) for a
whole slice on this CPU machine (experiments/tools/dry_run.py, experiments/tools/tpu_compile.py).

Skipped with one line where libtpu cannot be loaded. Compile times are printed by the tool, never
asserted here; memory and FLOPs are checked for consistency (positive, within the chip, the
compiler's FLOPs against the analytic count).
"""

import os
import pathlib
import subprocess
import sys

import jax
import pytest

from experiments.common import cpu_features
from experiments.common import errors
from experiments.common import layout as layout_lib
from experiments.common import parallel
from experiments.diffucoder.tools import tpu_plan
from experiments.nanogpt import train as gpt_train
from experiments.nanogpt.configs import shakespeare_char_cpu
from experiments.tools import dry_run
from experiments.tools import tpu_compile
from experiments.tools import tpu_report
from experiments.tools import tpu_target
from experiments.trm import train as trm_train
from experiments.trm.configs import cpu_demo
from modules import dream
from modules.kernels import xla_cpu

REPO = pathlib.Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("libtpu")      # tests/conftest.py


def _gpt(batch: int = 16):
  c = shakespeare_char_cpu.get_config("smoke")
  c.global_batch_size = batch
  return c


def _trm(batch: int = 16):
  c = cpu_demo.get_config("smoke")
  c.global_batch_size = batch
  return c


_COMPILED = {}


def _compiled(target: str, name: str):
  """(reports, steps) of the tiny GPT or TRM config's programs compiled for `target`, loop-aware;
  compiled once per test process (two tests read the v4-8 ones)."""
  if (target, name) not in _COMPILED:
    experiment, config = {"gpt": (gpt_train.NanoGPT(), _gpt()),
                          "trm": (trm_train.TRM(), _trm())}[name]
    _COMPILED[target, name] = dry_run.compile_for_tpu(experiment, config,
                                                      tpu_target.parse_target(target))
  return _COMPILED[target, name]


@pytest.mark.parametrize("target", ["v4-8", pytest.param("v5litepod-4", marks=pytest.mark.slow)])
def test_tiny_trm_and_gpt_compile_for_a_slice(target):
  t = tpu_target.parse_target(target)
  for name in ("gpt", "trm"):
    reports, steps = _compiled(target, name)
    assert [r.name for r in reports] == ["train_step", "eval_step"], name
    assert steps == (21 if name == "gpt" else 6)
    for r in reports:
      assert r.compiled and r.fits, (name, r.name)
      assert 0 < r.need_bytes < t.usable_hbm_bytes_per_device
      assert r.argument_bytes > 0 and r.compiler_flops > 0
      # config.cpu_tuning is on, but the program is compiled for a TPU: no CPU-only layout trick.
      assert r.layout_constraints is False
    text = tpu_report.format_report(reports)
    assert "COMPILER ESTIMATES" in text and target in text


@pytest.mark.parametrize("family", ["gpt", "trm"])
def test_the_cpu_matmul_path_is_only_in_cpu_programs(family):
  """The same GPT / TRM step lowered for the CPU (cpu_tuning on) carries the xla_cpu kernels and
  pins layouts; for a TPU it does not (the switch is the TARGET platform, not this process's
  backend)."""
  make, experiment = {"gpt": (_gpt, gpt_train.NanoGPT), "trm": (_trm, trm_train.TRM)}[family]
  config = make(4 * jax.local_device_count())
  cpu = layout_lib.batch_layout(config, platform="cpu")
  assert cpu.cpu_tuning
  b = experiment().build(config, cpu)
  assert b.model_config.kernels == "xla_cpu"
  if family == "trm":
    f = b.model_config.forms
    assert all((f.fast_grad, f.seq_major, f.unroll, f.head_major, f.lean_swiglu))
    assert b.compiler_options == cpu_features.CPU_DOTS_ONLY   # every form, split_reduce too
  p = dry_run.programs(experiment(), b, config, cpu)["train_step"]
  lowered = parallel.compile_step(p.fn, cpu.rules, state_in=p.state_in, out_axes=p.out_axes,
                                  blocks=p.blocks).lower(*p.args)
  assert tpu_compile.hlo_has_layout_constraints(lowered)
  t = tpu_target.parse_target("v4-8")
  on_tpu = dry_run.tpu_layout(experiment(), config, t)
  assert not on_tpu.cpu_tuning
  b = experiment().build(config, on_tpu)
  assert b.model_config.kernels == "default"
  if family == "trm":
    assert b.model_config.forms == xla_cpu.Forms()            # no form at all
  assert not b.compiler_options                               # no XLA:CPU option in a TPU program
  p = dry_run.programs(experiment(), b, config, on_tpu)["train_step"]
  assert not tpu_compile.hlo_has_layout_constraints(dry_run.lower_for_tpu(p, t, on_tpu))


def test_compiler_flops_against_the_analytic_count_with_every_loop_trip():
  """GPT's step has no loops: the compiler's FLOPs are within 10% of 6N + attention (measured +3.7%:
  the compiler also counts the elementwise work, and the fused head's recomputation, which its
  kernels report), and the loop-aware counts are the compiler's own.
  TRM's step loops over its cycles: the compiler counts each body once (BELOW the analytic count);
  with every trip counted (each loop body compiled once) it is within 0% to +10% of the analytic
  count (measured +5.0%). GPT with grad_accum=5 (a 5-trip scan of micro-steps) against 1: the same
  FLOPs per token (within 3%); bytes per token no higher (the update's optimizer bytes are shared by
  5 micro-batches; measured 0.67x), where the one-trip count said 0.2x."""
  t = tpu_target.parse_target("v4-8")
  gpt = _compiled("v4-8", "gpt")[0][0]
  assert gpt.while_loops == 0 and gpt.loops == () and gpt.loop_aware
  assert abs(gpt.compiler_flops / gpt.analytic_flops - 1) < 0.10
  assert (gpt.total_flops, gpt.bytes_accessed) == (gpt.compiler_flops,
                                                   gpt.compiler_bytes_accessed)
  trm = _compiled("v4-8", "trm")[0][0]
  assert trm.while_loops > 0 and trm.compiler_flops < trm.analytic_flops
  assert trm.loop_aware and trm.loop_note is None and len(trm.loops) >= 2
  assert 1.0 <= trm.total_flops / trm.analytic_flops < 1.10
  # (the cycle with gradient is written out; the cycles without gradient still loop)
  assert trm.bytes_accessed > 1.05 * trm.compiler_bytes_accessed
  accum = _gpt()
  accum.grad_accum = 5
  (gpt5,), _ = dry_run.compile_for_tpu(gpt_train.NanoGPT(), accum, t, only=("train_step",))
  assert gpt5.items_per_step == 5 * gpt.items_per_step and [lp.trips for lp in gpt5.loops] == [5]
  per_token = lambda r, x: x / r.items_per_step  # noqa: E731
  assert per_token(gpt5, gpt5.total_flops) == pytest.approx(per_token(gpt, gpt.total_flops),
                                                            rel=0.03)
  ratio = per_token(gpt5, gpt5.bytes_accessed) / per_token(gpt, gpt.bytes_accessed)
  assert 0.5 < ratio <= 1.0
  assert per_token(gpt5, gpt5.compiler_bytes_accessed) / per_token(gpt, gpt.bytes_accessed) < 0.3


# three TPU compiles (~40 s on an idle 2-core machine)
@pytest.mark.slow
def test_a_program_too_big_for_a_v5e_chip_names_the_need_and_the_fix_that_fits(capsys):
  """XLA attention's scores of 512 sequences of 1024 tokens per chip need more than a v5e chip's
  16 GiB (256 fit, with remat). The tool tries the fixes in order (remat and bfloat16 are on
  already: fsdp, then half the batch) and exits naming the chip, the need and the first fix that
  fits: splitting the state does not shrink the activations, half the batch does. (The splash
  kernel, auto on a TPU from 512 positions, keeps the scores out of HBM.)"""
  config = _gpt(4 * 512)
  config.model.block_size = 1024
  config.model.remat, config.model.dtype = True, "bfloat16"
  config.model.attention = "xla"
  with pytest.raises(errors.BadInput) as e:
    dry_run.run(gpt_train.NanoGPT(), config, target="v5litepod-4", name="big")
  message = str(e.value)
  assert "does not fit on v5litepod-4" in message and "16 GiB" in message and "\n" not in message
  assert message.endswith("Fix: half the per-device batch (256; a deviation from the recipe): "
                          "--config.global_batch_size=1024"), message
  tried = capsys.readouterr().out.split("Tried to make train_step fit:\n")[1].splitlines()
  assert len(tried) == 2, tried
  assert tried[0].startswith("  fsdp (") and tried[0].endswith("does not fit: --config.sharding=fsdp")
  assert tried[1].startswith("  half the per-device batch") and ", fits: " in tried[1]


def test_bad_targets_and_layouts_are_one_line_errors():
  with pytest.raises(errors.BadInput, match=r"unknown TPU type 'v9-8'; valid types: .*v4-\{8,") as e:
    dry_run.run(gpt_train.NanoGPT(), _gpt(), target="v9-8")
  assert "\n" not in str(e.value)
  c = _gpt(18)
  with pytest.raises(errors.ConfigError, match=r"global_batch_size=18.*4 devices of v4-8.*"
                     r"global_batch_size=16"):
    dry_run.run(gpt_train.NanoGPT(), c, target="v4-8")
  c = _gpt()
  c.num_devices = 32
  with pytest.raises(errors.ConfigError, match=r"num_devices=32.*v4-8 has 4"):
    dry_run.run(gpt_train.NanoGPT(), c, target="v4-8")


@pytest.mark.slow    # ~30 s; the same dry run in-process: test_trm_train (the pod config)
def test_the_entry_point_compiles_for_a_tpu_target():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-m", "experiments.trm.main",
                         "--config=configs/cpu_demo.py:smoke", "--dry_run", "--target=v5litepod-4"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "v5litepod-4: 4 TPU v5 lite chips" in proc.stdout
  assert "train_step" in proc.stdout and "eval_step" in proc.stdout
  assert "chip-hours" in proc.stdout


# --------------------------------------------------------------------------------------------------
# DiffuCoder: the sampler's programs (generate.py --dry_run).

def _tiny_dream_param_bytes() -> int:
  shapes = dream.param_shapes(dream.tiny_config())
  return sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(shapes))


@pytest.mark.parametrize("target", ["v4-8", "v5litepod-4"])
def test_tiny_dream_sampling_step_compiles_for_a_slice_replicated_and_sharded(target):
  """The tiny Dream's sampler step (pmap program at model_parallel 1, shard_map at 2) compiles for
  the slice; each device's arguments hold the whole weights at 1 and about half at 2 (the
  embedding, norms and rows are not all split, so between 1/2 and 3/4)."""
  t = tpu_target.parse_target(target)
  weights = _tiny_dream_param_bytes()
  args = {}
  for m in (1, 2):
    lowered = tpu_plan.lower_step(t, 4, m, dream.tiny_config(), prompt=8, new=8)
    r = tpu_compile.compile_report(lowered, target=t, name=f"mp{m}")
    assert r.compiled and r.fits, m
    args[m] = r.argument_bytes
  assert weights <= args[1] < 1.5 * weights     # TPU tiling pads small arrays
  assert 0.45 * weights < args[2] < 0.75 * args[1]


@pytest.mark.slow        # the generate CLI's dry run as a program; the same compile in process: tpu_plan
def test_generate_dry_run_prints_the_table_and_names_bad_degrees_and_targets():
  """`generate.py --dry_run --target=v4-8` on the tiny config compiles its sampler (exit 0, the step
  row fits); a degree that does not divide the heads and a missing target are one line, exit 2."""
  base = [sys.executable, "-m", "experiments.diffucoder.generate", "--config=configs/tiny.py",
          "--dry_run"]
  env = dict(os.environ, PYTHONPATH=str(REPO))
  ok = subprocess.run(base + ["--target=v4-8", "--config.generate.block_length=8",
                              "--config.generate.cache=dual", "--config.generate.steps=8"],
                      capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
  assert ok.returncode == 0, ok.stderr[-2000:]
  rows = [line for line in ok.stdout.splitlines() if line.startswith("dream ")]
  assert [r.split()[:4] for r in rows] == [["dream", "sampling", "step", "b4"],
                                           ["dream", "podlab", "block", "b4"]]
  assert all(" yes " in r for r in rows)
  assert "COMPILER ESTIMATES" in ok.stdout
  for extra, needle in ((["--target=v4-8", "--config.model_parallel=3"], "valid degrees"),
                        ([], "--target=")):
    bad = subprocess.run(base + extra, capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=600)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr and needle in bad.stderr
    assert len([line for line in bad.stderr.splitlines() if line.startswith("error:")]) == 1
