"""Model FLOPs utilisation: the device's peak FLOP/s, from the chip table or measured on a CPU.

nanoGPT's MFU = (6 N + 12 L H Q T) T (batch x accumulation steps) / step_time / peak, where the original
hard-codes an A100's 312e12; here the peak is the device's own: the dense bf16 figure of
`experiments/common/chips.py` (every TPU generation podlab targets, and the GPUs), per JAX device (a
v2/v3 device is one TensorCore, half a chip). On a CPU it is measured at start (a float32 matmul of
the model's size class, all cores), so CPU MFU says how close the step is to this machine's matmul
speed; the log says so. An accelerator missing from the table gets no MFU (peak 0, with a warning
naming `--config.peak_flops`), never a timed toy matmul.

Synopsis:

  from experiments.common import mfu
  peak = mfu.peak_flops_per_device()          # e.g. 1.97e14 on a TPU v5e; measured on a CPU
  mfu.lookup_peak("TPU v4")                   # 2.75e14
  mfu.lookup_peak("TPU v3")                   # 6.15e13 (one TensorCore)
"""

from __future__ import annotations

import time
from typing import Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import chips

_measured: Optional[float] = None


def lookup_peak(device_kind: str) -> Optional[float]:
  """The chip table's peak bf16 FLOP/s for one device of this kind, else None."""
  return chips.peak_flops_per_device(device_kind)


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


def peak_flops_per_device(override: float = -1.0, device: Optional[jax.Device] = None) -> float:
  """Peak FLOP/s of one device (default `jax.devices()[0]`), for MFU.

  `override` if > 0; else the chip table's figure; else on a CPU the measured matmul speed (logged
  as such); else (an accelerator the table lacks) 0.0, which means "no MFU", with a warning.
  """
  if override > 0:
    return float(override)
  device = device if device is not None else jax.devices()[0]
  peak = lookup_peak(device.device_kind)
  if peak is not None:
    return peak
  if device.platform == "cpu":
    peak = measure_cpu_peak() / max(1, jax.local_device_count())   # the cores split over devices
    logging.info("MFU: the CPU's peak is measured at start (a float32 matmul on all cores): %.3g "
                 "FLOP/s per device", peak)
    return peak
  logging.warning("MFU not reported: no peak FLOP/s for device kind %r in experiments/common/"
                  "chips.py; pass --config.peak_flops=<FLOP/s per device> to report it",
                  device.device_kind)
  return 0.0
