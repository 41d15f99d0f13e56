"""What the TRM bench tools measure besides the step: matmul peak, memory, page faults.

`matmul_peak_flops` is the roofline a row's FLOP/s is compared with (a jitted square `jnp.dot` of
the row's dtype, timed in the same run); `reset_peak_rss` / `peak_rss_gb` give a row's own peak
resident memory (VmHWM, reset through /proc/self/clear_refs; getrusage's ru_maxrss where that is
unavailable); `minor_page_faults` counts fresh pages touched (a step that grew the heap). Step
times are summarized by experiments/tools/step_timing.py (`percentiles_ms`).

Synopsis:

  from experiments.trm.tools import measure

  peak = measure.matmul_peak_flops("float32", size=256, reps=2)        # FLOP/s
  ok = measure.reset_peak_rss()
  print(peak / 1e9, measure.peak_rss_gb(ok), measure.minor_page_faults())
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp

GB = 1e9


# --------------------------------------------------------------------------------------------------
# Matmul peak.

def matmul_peak_flops(dtype: str, size: int = 2048, reps: int = 5,
                      shape: Optional[Sequence[int]] = None) -> float:
  """Median FLOP/s of a jitted [size, size] @ [size, size] (bfloat16: f32 accumulation, as the model);
  `shape` = (M, K, N): an [M, K] @ [K, N] product instead."""
  m, k, n = shape or (size, size, size)
  dt = jnp.dtype(dtype)
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (m, k), jnp.float32).astype(dt)
  b = jax.random.normal(kb, (k, n), jnp.float32).astype(dt)
  dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  dot(a, b).block_until_ready()
  times = []
  for _ in range(max(1, reps)):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    times.append(time.perf_counter() - t0)
  return 2.0 * m * k * n / statistics.median(times)


# --------------------------------------------------------------------------------------------------
# Memory.

def reset_peak_rss() -> bool:
  """Resets this process's VmHWM (Linux >= 4.0); False where that is not possible."""
  try:
    with open("/proc/self/clear_refs", "w") as fh:
      fh.write("5")
    return True
  except OSError:
    return False


def peak_rss_gb(reset_ok: bool) -> float:
  """VmHWM since the last reset (when `reset_ok`), else getrusage's process-lifetime ru_maxrss."""
  if reset_ok:
    try:
      with open("/proc/self/status") as fh:
        for line in fh:
          if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    except OSError:
      pass
  return process_maxrss_gb()


def minor_page_faults() -> int:
  """This process's minor page faults so far: fresh pages touched (a step that grew the heap shows
  as hundreds of thousands; docs/benchmarks.md, "Warm-up")."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def process_maxrss_gb() -> float:
  scale = 1 if sys.platform == "darwin" else 1024      # bytes on macOS, KiB on Linux
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / GB

