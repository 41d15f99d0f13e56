"""What this machine's CPU can do, read from /proc/cpuinfo: its model, its instruction-set flags and
whether it has native bfloat16 arithmetic (AVX512-BF16 or AMX-BF16).

Why: machines of one cloud kind differ in their instruction sets. Without native bfloat16, XLA:CPU
(and PyTorch) convert every bfloat16 matmul operand to float32 in software, so a bfloat16 config runs
SLOWER than float32, not faster. `bf16_notice()` gives the one line a bfloat16 CPU run logs at start
on such a machine, with the factor measured by a short matmul probe (`bf16_slowdown`, a few ms).

Shape glossary: none.

Synopsis:

  from experiments.common import cpu_features
  cpu_features.cpu_model()              # "AMD EPYC"
  cpu_features.has_native_bf16()        # True with avx512_bf16 or amx_bf16 in the flags
  cpu_features.describe()               # "AMD EPYC, 2 usable cores, native bfloat16: yes (avx512_bf16)"
  line = cpu_features.bf16_notice("bfloat16")   # None where bfloat16 is native (or not bfloat16)
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, FrozenSet, Optional

import jax
import jax.numpy as jnp

CPU_DOTS_ONLY = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
"""XLA compiler options for a CPU program: YNNPACK (XLA:CPU's matmul library) gets single dots only,
never a dot fused with the reduction after it. XLA 0.10.2's default also fuses a dot with a following
reduce (e.g. a projection, the residual add and RMSNorm's sum of squares in one YNNPACK fusion), and
those fused kernels ran at a third to a half of the plain dot's rate on the dev CPU
(docs/benchmarks.md). Options of one compile (`parallel.compile_step(compiler_options=...)`), not of
the process: other programs keep XLA's defaults. TRM's steps take them on a CPU target
(experiments/trm/cpu_tuning.py, split_reduce)."""

CPUINFO = "/proc/cpuinfo"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpuinfo_text(path: str = CPUINFO) -> str:
  """The text of /proc/cpuinfo ("" where it cannot be read, e.g. macOS)."""
  try:
    with open(path) as fh:
      return fh.read()
  except OSError:
    return ""


def _first(text: str, key: str) -> Optional[str]:
  for line in text.splitlines():
    name, sep, value = line.partition(":")
    if sep and name.strip() == key:
      return value.strip()
  return None


def cpu_flags(text: Optional[str] = None) -> FrozenSet[str]:
  """The first processor's flags (x86 `flags`, ARM `Features`)."""
  text = cpuinfo_text() if text is None else text
  value = _first(text, "flags") or _first(text, "Features") or ""
  return frozenset(value.split())


def cpu_model(text: Optional[str] = None) -> str:
  text = cpuinfo_text() if text is None else text
  return _first(text, "model name") or _first(text, "Hardware") or "unknown CPU"


def has_native_bf16(flags: Optional[FrozenSet[str]] = None) -> bool:
  """True when the CPU computes in bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
  flags = cpu_flags() if flags is None else flags
  return any(f in flags for f in BF16_FLAGS)


def usable_cores() -> int:
  """The cores this process may run on (what XLA:CPU sizes its thread pool by)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:          # macOS
    return os.cpu_count() or 1


def describe(text: Optional[str] = None) -> str:
  """One line: CPU model, usable cores, native bfloat16 and which flag says so."""
  text = cpuinfo_text() if text is None else text
  flags = cpu_flags(text)
  native = [f for f in BF16_FLAGS if f in flags]
  bf16 = f"yes ({', '.join(native)})" if native else "no (neither avx512_bf16 nor amx_bf16)"
  return f"{cpu_model(text)}, {usable_cores()} usable cores, native bfloat16: {bf16}"


def bf16_slowdown(size: int = 256, reps: int = 5) -> float:
  """Median time of a [size, size] bfloat16 matmul (float32 accumulation, as the models' matmuls)
  over the float32 one, on JAX's default device: > 1 means bfloat16 is slower here."""
  def median_s(dtype) -> float:
    a = jnp.ones((size, size), dtype)
    dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    dot(a, a).block_until_ready()                # compile
    times = []
    for _ in range(reps):
      t0 = time.perf_counter()
      dot(a, a).block_until_ready()
      times.append(time.perf_counter() - t0)
    return statistics.median(times)

  return median_s(jnp.bfloat16) / median_s(jnp.float32)


def bf16_notice(dtype, *, flags: Optional[FrozenSet[str]] = None,
                probe: Optional[Callable[[], float]] = None) -> Optional[str]:
  """The start-of-run line for a bfloat16 config on a CPU without native bfloat16, else None.

  `dtype`: the config's compute dtype (anything `str()` names, e.g. "bfloat16" or a numpy dtype).
  `probe` (default `bf16_slowdown`) runs only when the line is due.
  """
  if str(dtype) != "bfloat16" or has_native_bf16(flags):
    return None
  factor = (probe or bf16_slowdown)()
  probe_text = (f"probe: a 256x256 matmul, bfloat16 {factor:.2f}x the float32 time; "
                f"{cpu_model()}, no avx512_bf16/amx_bf16")
  if factor <= 1.0:
    return f"this CPU has no native bfloat16; float32 is not faster here ({probe_text})"
  return (f"this CPU has no native bfloat16; float32 is {factor:.1f}x faster here ({probe_text}): "
          f"consider the float32 compute dtype")
