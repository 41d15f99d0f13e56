"""Tests of experiments/common/cpu_features.py: /proc/cpuinfo parsing, native bfloat16 detection and
the one start-of-run line of a bfloat16 config on a CPU without native bfloat16 (monkeypatched
cpuinfo; the probe is the real matmul probe, its factor is checked to be a positive number only)."""
import logging as py_logging
import re

import pytest

from experiments.common import cpu_features
from experiments.common import trainer
from experiments.trm.configs import cpu_demo

AVX2_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
"""
BF16_EPYC = AVX2_EPYC.replace("AMD EPYC 7B12", "AMD EPYC 9B14").replace(
    "bmi2", "bmi2 avx512f avx512_bf16")


def test_parses_model_and_flags():
  assert cpu_features.cpu_model(AVX2_EPYC) == "AMD EPYC 7B12"
  assert "avx2" in cpu_features.cpu_flags(AVX2_EPYC)
  assert not cpu_features.has_native_bf16(cpu_features.cpu_flags(AVX2_EPYC))
  assert cpu_features.has_native_bf16(cpu_features.cpu_flags(BF16_EPYC))
  assert cpu_features.has_native_bf16(frozenset({"amx_bf16"}))
  assert "native bfloat16: no" in cpu_features.describe(AVX2_EPYC)
  assert "native bfloat16: yes (avx512_bf16)" in cpu_features.describe(BF16_EPYC)
  assert cpu_features.cpu_flags("") == frozenset() and cpu_features.cpu_model("") == "unknown CPU"


def test_bf16_notice_only_for_bfloat16_without_native_support(monkeypatch):
  monkeypatch.setattr(cpu_features, "cpuinfo_text", lambda path=cpu_features.CPUINFO: AVX2_EPYC)
  line = cpu_features.bf16_notice("bfloat16")                   # the real probe
  m = re.fullmatch(r"this CPU has no native bfloat16; float32 is (?:(\d+\.\d)x faster|not faster) "
                   r"here \(probe: a 256x256 matmul, bfloat16 (\d+\.\d\d)x the float32 time; "
                   r"AMD EPYC 7B12, no avx512_bf16/amx_bf16\).*", line)
  assert m, line
  assert float(m.group(2)) > 0
  calls = []
  probe = lambda: calls.append(1) or 3.04                        # noqa: E731
  assert cpu_features.bf16_notice("bfloat16", probe=probe).startswith(
      "this CPU has no native bfloat16; float32 is 3.0x faster here (probe: a 256x256 matmul, "
      "bfloat16 3.04x the float32 time")
  assert cpu_features.bf16_notice("float32", probe=probe) is None
  monkeypatch.setattr(cpu_features, "cpuinfo_text", lambda path=cpu_features.CPUINFO: BF16_EPYC)
  assert cpu_features.bf16_notice("bfloat16", probe=probe) is None
  assert len(calls) == 1                                         # the probe runs only when due


@pytest.mark.parametrize("dtype,want", [("bfloat16", "bfloat16"), ("float32", "float32")])
def test_compute_dtype_of_trm_and_gpt_configs(dtype, want):
  from experiments.trm import train as trm_train
  from modules import gpt
  c = cpu_demo.get_config("smoke")
  c.model.forward_dtype = dtype
  cfg = trm_train.model_config(c, {"seq_len": 81, "vocab_size": 11, "num_puzzle_identifiers": 1})
  assert trainer.compute_dtype(cfg) == want
  assert trainer.compute_dtype(gpt.GPTConfig(dtype=dtype)) == want
  assert trainer.compute_dtype(object()) == ""


@pytest.mark.slow    # make test: the notice's rule and text (test_bf16_notice_only_for_...)
def test_a_bfloat16_trm_run_logs_the_line_once(monkeypatch, tmp_path, caplog):
  """The trainer's start on a CPU target, with a cpuinfo that lacks bfloat16 (probe stubbed)."""
  from absl import logging as absl_logging
  from experiments.trm import train as trm_train
  monkeypatch.setattr(cpu_features, "cpuinfo_text", lambda path=cpu_features.CPUINFO: AVX2_EPYC)
  monkeypatch.setattr(cpu_features, "bf16_slowdown", lambda: 4.2)
  c = cpu_demo.get_config("smoke")
  c.model.forward_dtype = "bfloat16"
  c.total_steps = 1
  c.eval_every_steps = 1
  monkeypatch.setattr(absl_logging.get_absl_logger(), "propagate", True)
  with caplog.at_level(py_logging.WARNING):
    trm_train.train_and_evaluate(c, str(tmp_path / "run"))
  lines = [r.getMessage() for r in caplog.records if "no native bfloat16" in r.getMessage()]
  assert lines == ["this CPU has no native bfloat16; float32 is 4.2x faster here (probe: a 256x256 "
                   "matmul, bfloat16 4.20x the float32 time; AMD EPYC 7B12, no "
                   "avx512_bf16/amx_bf16): consider the float32 compute dtype"]
