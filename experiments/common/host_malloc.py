"""Keeps XLA:CPU's per-step scratch memory in the C heap: no fresh pages to fault in every step.

Why: XLA:CPU allocates one scratch ("temp") buffer per execution with the C allocator and frees it
when the step ends (`jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes`: 51 MiB
for the training step of the nanoGPT CPU recipe, mostly the activations kept for the backward pass).
glibc serves a request above its mmap threshold (adaptive, but never above 32 MiB on 64-bit Linux)
with a fresh `mmap` and gives it back with `munmap` on free, so every step page-faults and the kernel
zero-fills all of those pages again: ~30 ms of system time per step on the 2-core CPU machine, a
third of the step. It also made the step cost super-linear in depth: the scratch of 1-2 layers
(27 MiB) stays below the 32 MiB cap and is reused from the heap, that of 3-4 layers is not.

`keep_heap()` sets glibc's M_MMAP_MAX = 0 (no mmap'd chunks: large requests come from the heap too),
M_TRIM_THRESHOLD = SIZE_MAX (the heap is never trimmed: freed memory is kept for the next step
instead of being returned to the OS, however large; a 1 GiB threshold still returned TRM's ~10 GB
per-step scratch at the recipe size, which was then page-faulted in again every step) and
M_ARENA_MAX = 1 (threads created afterwards share the main heap: a thread arena cannot
hold a block over 64 MiB and falls back to a fresh mmap whatever M_MMAP_MAX says). Numerics are
unchanged (it only changes where the bytes live); the price is that the process keeps the memory it
has freed (up to its peak). Threads that already have their own arena keep it, so scratch buffers
over 64 MiB are only covered when it runs before the JAX CPU backend starts its threads; the trainer
runs it once the run's devices are known (the CPU recipes' scratch is below that). It is
process-wide, so the trainer applies it only when the program is compiled for a CPU
(`config.cpu_tuning`, default True: experiments/common/layout.py `cpu_tuning`), and the benchmark
has `--no_keep_heap` to measure without it. Elsewhere than glibc (macOS, musl) it does nothing.

The heap reaches its steady size only after a few steps: glibc 2.36's aligned allocation does not
reuse a freed block of exactly its own size (it asks for the size plus the alignment), and XLA may
allocate a step's scratch before it has freed the last step's, so the first steps of a run can
extend the heap and fault the new pages in once more (TRM-Att float32 at batch 64: 1.84 GB, ~4 s,
in steps 0-3), until it holds enough free blocks. The benchmarks take 3 untimed steps for that
(docs/benchmarks.md, "Warm-up").

Shape glossary: none (host memory only).

Synopsis:

  from experiments.common import host_malloc
  host_malloc.keep_heap()                   # True when applied (glibc)
"""

from __future__ import annotations

import ctypes
import platform

# glibc's mallopt parameters (<malloc.h>).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# mallopt takes an int; glibc stores M_TRIM_THRESHOLD as a size_t, so -1 is SIZE_MAX: never trim
# (glibc's malloc.c: do_set_trim_threshold(size_t)). INT_MAX (2 GiB) would still trim a 10 GB block.
TRIM_THRESHOLD_NEVER = -1

_applied = False


def is_glibc() -> bool:
  """True on a glibc system (where `mallopt` has the parameters used here)."""
  return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_heap() -> bool:
  """Makes glibc keep large freed blocks for reuse (see the module doc); True when applied.

  Idempotent; False (and nothing changed) where the C library is not glibc or refuses a setting.
  """
  global _applied
  if _applied:
    return True
  if not is_glibc():
    return False
  libc = ctypes.CDLL("libc.so.6")
  libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  libc.mallopt.restype = ctypes.c_int
  ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_NEVER) == 1
  ok = ok and libc.mallopt(M_MMAP_MAX, 0) == 1
  ok = ok and libc.mallopt(M_ARENA_MAX, 1) == 1
  _applied = ok
  return ok
