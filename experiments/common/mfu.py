"""Model FLOPs utilisation: the device's peak FLOP/s, from a table or measured on a CPU.

nanoGPT's MFU = (6 N + 12 L H Q T) T (batch x grad_accum) / step_time / peak, where the original
hard-codes an A100's 312e12; here the peak is the device's own (dense bf16 tensor-core / MXU figures
from the vendors' data sheets), and on a CPU it is measured at start (a float32 matmul of the
model's size class, all cores), so CPU MFU says how close the step is to this machine's matmul speed.

Synopsis:

  from experiments.common import mfu
  peak = mfu.peak_flops_per_device()          # e.g. 9.9e13 on a TPU v5e... measured on a CPU
  mfu.lookup_peak("TPU v4")                   # 2.75e14
"""

from __future__ import annotations

import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,      # v5e
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,      # v6e
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
}
"""Dense bf16 peak FLOP/s per device, by a substring of `jax.devices()[0].device_kind`."""

_measured: Optional[float] = None


def lookup_peak(device_kind: str) -> Optional[float]:
  """The table's peak for a device kind (longest matching key), else None."""
  matches = [k for k in PEAK_FLOPS if k.lower() in device_kind.lower()]
  return PEAK_FLOPS[max(matches, key=len)] if matches else None


def measure_cpu_peak(size: int = 512, repeats: int = 20) -> float:
  """Best float32 matmul FLOP/s of this process's CPU device (all its threads), measured once."""
  global _measured
  if _measured is None:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
      t = time.perf_counter()
      f(a).block_until_ready()
      best = min(best, time.perf_counter() - t)
    _measured = 2.0 * size ** 3 / best
  return _measured


def peak_flops_per_device(override: float = -1.0) -> float:
  """`override` if > 0, else the table's figure for this device, else (CPU) the measured one."""
  if override > 0:
    return float(override)
  device = jax.devices()[0]
  peak = lookup_peak(device.device_kind)
  if peak is not None:
    return peak
  return measure_cpu_peak() / max(1, jax.local_device_count() if device.platform == "cpu" else 1)
