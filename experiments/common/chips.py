"""The one table of accelerator figures: every TPU generation podlab targets, and the GPUs it meets.

Read by the TPU compile (`experiments/tools/tpu_target.py`: HBM, usable HBM, peak and bandwidth of
a slice's devices), the dry run and `make tpu-check` (through it), and the trainer's live MFU
(`experiments/common/mfu.py`: the peak of the device it runs on).

TPU figures, per chip (docs/tpu.md has the table):

- v2: Jouppi et al., "A Domain-Specific Supercomputer for Training Deep Neural Networks", CACM
  63(7), 2020 (the Cloud TPU v2 page, https://cloud.google.com/tpu/docs/v2, refers to it): 46
  TFLOP/s bf16, 16 GiB HBM, 700 GB/s.
- v3: https://cloud.google.com/tpu/docs/v3: 123 TFLOP/s bf16, 32 GiB HBM, 900 GB/s.
- v4: https://cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, 32 GiB HBM, 1200 GB/s.
- v5e: https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GiB HBM, 819 GB/s.
- v5p: https://cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB HBM, 2765 GB/s.
- v6e: https://cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GiB HBM, 1638 GB/s.
- compiler_hbm_gib: what libtpu 0.0.42's compiler lets one device use, measured by compiling more
  input than fits (`tests/test_tpu.py::test_compiler_hbm_limits_match_the_chip_table`).

GPU dense bf16 peaks (tensor cores, no sparsity), from NVIDIA's data sheets: A100 312 TFLOP/s
(A100 Tensor Core GPU data sheet), H100 SXM 989 TFLOP/s and H200 989 TFLOP/s (H100 and H200 data
sheets).

A JAX device is one chip on v4/v5p (megacore) and v5e/v6e, one TensorCore (half a chip: half its
HBM, peak and bandwidth) on v2/v3.

Synopsis:

  from experiments.common import chips
  chips.TPU_CHIPS["v5e"].peak_bf16_flops            # 1.97e14 per chip
  chips.peak_flops_per_device("TPU v3")             # 6.15e13: a v3 device is one TensorCore
  chips.peak_flops_per_device("NVIDIA H200")        # 9.89e14
  chips.peak_flops_per_device("cpu")                # None: not in the table
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's per-chip figures (sources: the module docstring).

  Fields:
    generation: "v2", "v3", "v4", "v5e", "v5p" or "v6e".
    device_kind: `jax.Device.device_kind` of its devices, e.g. "TPU v5 lite".
    libtpu_name: the generation's name in a libtpu topology string ("v5e" in "v5e:4x4").
    devices_per_chip: JAX devices per chip: 2 on v2/v3 (one per TensorCore); 1 on v4/v5p (megacore:
      the two TensorCores are one device) and on v5e/v6e (one TensorCore).
    megacore: the topology is built with chip_config_name="megacore" (v4, v5p).
    hbm_gib: published HBM per chip, GiB.
    peak_bf16_flops: published peak bf16 FLOP/s per chip.
    hbm_bytes_per_s: published HBM bandwidth per chip, bytes/s.
    compiler_hbm_gib: HBM per DEVICE that libtpu 0.0.42's compiler lets a program use, GiB (what it
      prints as "available HBM" when a program does not fit; measured).
  """
  generation: str
  device_kind: str
  libtpu_name: str
  devices_per_chip: int
  megacore: bool
  hbm_gib: float
  peak_bf16_flops: float
  hbm_bytes_per_s: float
  compiler_hbm_gib: float

  @property
  def peak_flops_per_device(self) -> float:
    return self.peak_bf16_flops / self.devices_per_chip

  @property
  def hbm_gib_per_device(self) -> float:
    return self.hbm_gib / self.devices_per_chip

  @property
  def usable_hbm_gib_per_device(self) -> float:
    """The compiler's limit, or the published capacity where smaller (v5p: 95 of 95.74)."""
    return min(self.compiler_hbm_gib, self.hbm_gib_per_device)


TPU_CHIPS: Dict[str, Chip] = {
    "v2": Chip("v2", "TPU v2", "v2", 2, False, 16, 46e12, 700e9, 7.48),
    "v3": Chip("v3", "TPU v3", "v3", 2, False, 32, 123e12, 900e9, 15.48),
    "v4": Chip("v4", "TPU v4", "v4", 1, True, 32, 275e12, 1200e9, 30.75),
    "v5e": Chip("v5e", "TPU v5 lite", "v5e", 1, False, 16, 197e12, 819e9, 15.75),
    "v5p": Chip("v5p", "TPU v5", "v5p", 1, True, 95, 459e12, 2765e9, 95.74),
    "v6e": Chip("v6e", "TPU v6 lite", "v6e", 1, False, 32, 918e12, 1638e9, 31.25),
}

GPU_PEAK_BF16_FLOPS: Dict[str, float] = {
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}
"""Dense bf16 peak FLOP/s per GPU, by a substring of its `device_kind` ("NVIDIA H100 80GB HBM3")."""


def tpu_chip(device_kind: str) -> Optional[Chip]:
  """The TPU generation whose devices report `device_kind` ("TPU v4", "TPU v5 lite", ...; also
  "TPU v5e", "TPU v5p"), else None. Exact match: "TPU v5" is v5p, "TPU v5 lite" v5e."""
  kind = device_kind.strip().lower()
  for chip in TPU_CHIPS.values():
    if kind in (chip.device_kind.lower(), f"tpu {chip.generation}"):
      return chip
  return None


def peak_flops_per_device(device_kind: str) -> Optional[float]:
  """Peak bf16 FLOP/s of one JAX device of this kind (a v2/v3 TensorCore: half its chip's), or
  None when the table has no figure for it (a CPU, an unknown accelerator)."""
  chip = tpu_chip(device_kind)
  if chip is not None:
    return chip.peak_flops_per_device
  matches = [k for k in GPU_PEAK_BF16_FLOPS if k.lower() in device_kind.lower()]
  return GPU_PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None
