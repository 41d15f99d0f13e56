"""One side of a side-by-side step benchmark: podlab's JAX step or a PyTorch reference's, timed on
its device, with the side's peak device memory.

What `make bench-gpu`'s cells share (experiments/tools/bench_gpu.py runs them: TRM's in
experiments/trm/tools/bench_gpu.py, GPT-2's in experiments/nanogpt/tools/bench_gpu.py) and what the
CPU benchmarks use to summarize step times (`percentiles_ms`). A side is a function `one()` that
runs one optimizer step, waits for the device and returns the step's loss; `timed` runs it (the
first call compiles) and returns the median, 10th and 90th percentile in ms and the first step's
loss.

Synopsis:

  from experiments.tools import step_timing
  step_timing.percentiles_ms([0.010, 0.012, 0.011])["ms"]          # 11.0 (the median, in ms)
  out = step_timing.timed(lambda: 2.5, steps=3, warmup=1, label="demo")
  out["loss0"], sorted(out)                        # 2.5, ['loss0', 'ms', 'p10', 'p90']
  step_timing.jax_peak_gb()                        # NaN where the device keeps no statistics (CPU)
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Sequence

import jax
import numpy as np

GB = 1e9


def log(msg: str) -> None:
  print(f"[bench_gpu] {msg}", flush=True)


def import_torch(quick: bool = False):
  """PyTorch (the references' framework), or SystemExit naming the install. `quick` on a CPU: one
  thread (a smoke run's tiny eager ops on a shared CPU: no threads to wait on)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel  (optional: only the reference sides)
  except ImportError:
    raise SystemExit("the reference sides need PyTorch: pip install -e '.[torch]'") from None
  if quick and not torch.cuda.is_available():
    torch.set_num_threads(1)
  return torch


def torch_device(torch) -> str:
  """Where a reference side runs: "cuda" when torch sees a GPU, else "cpu"."""
  return "cuda" if torch.cuda.is_available() else "cpu"


def sync(torch) -> None:
  """Waits for torch's queued GPU work (nothing to wait for on a CPU)."""
  if torch.cuda.is_available():
    torch.cuda.synchronize()


def first(x) -> float:
  """A replicated or per-device scalar's value on the first local device."""
  return float(np.ravel(np.asarray(jax.device_get(x)))[0])


def jax_peak_gb() -> float:
  """JAX's allocator `peak_bytes_in_use` on the first local device, in GB (NaN without
  statistics)."""
  stats = jax.local_devices()[0].memory_stats()
  return stats["peak_bytes_in_use"] / GB if stats and "peak_bytes_in_use" in stats else float("nan")


def torch_peak_gb(torch) -> float:
  """torch's `max_memory_allocated` on the GPU in GB (NaN on a CPU)."""
  return torch.cuda.max_memory_allocated() / GB if torch.cuda.is_available() else float("nan")


def percentiles_ms(times_s: Sequence[float]) -> Dict[str, float]:
  """Step times in seconds -> {"ms": median, "p10", "p90"} in milliseconds."""
  ms = 1e3 * np.asarray(times_s)
  return {"ms": float(np.median(ms)), "p10": float(np.percentile(ms, 10)),
          "p90": float(np.percentile(ms, 90))}


def timed(one: Callable[[], float], steps: int, warmup: int, label: str) -> Dict[str, Any]:
  """Runs `one` (a step, device synchronized, returning its loss) warmup + steps times:
  {"ms", "p10", "p90"} of the `steps` timed calls and "loss0", the first call's loss."""
  t0 = time.perf_counter()
  loss0 = one()
  log(f"{label}: first step {time.perf_counter() - t0:.2f} s (compilation included), loss "
      f"{loss0:.6g}")
  for _ in range(max(warmup - 1, 0)):
    one()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    one()
    times.append(time.perf_counter() - t0)
  p = percentiles_ms(times)
  log(f"{label}: median {p['ms']:.2f} ms (p10 {p['p10']:.2f}, p90 {p['p90']:.2f})")
  return {**p, "loss0": loss0}
