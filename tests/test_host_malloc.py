"""Tests of experiments/common/host_malloc.py: with `keep_heap()` a large block that is freed and
allocated again (what XLA:CPU does with a training step's scratch buffer every step) comes back
without page faults, also from a thread and above glibc's 64 MiB thread-arena limit; without it,
every page of the block faults again.

Each case runs in a fresh Python (the setting is process-wide and cannot be undone), with no JAX.
"""
import pathlib
import subprocess
import sys

import pytest

from experiments.common import host_malloc
from experiments.nanogpt.configs import base

REPO = pathlib.Path(__file__).resolve().parents[1]
BLOCK = 80 << 20          # 80 MiB: over glibc's 32 MiB mmap-threshold cap and 64 MiB arena size
PAGE = 4096

CHILD = r"""
import ctypes, resource, sys, threading
from experiments.common import host_malloc
libc = ctypes.CDLL("libc.so.6")
applied = host_malloc.keep_heap() if sys.argv[1] == "keep" else False
if sys.argv[1] == "trim_1gib":          # the earlier setting: no mmap, one arena, trim above 1 GiB
  libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  for param, value in ((host_malloc.M_TRIM_THRESHOLD, 1 << 30), (host_malloc.M_MMAP_MAX, 0),
                       (host_malloc.M_ARENA_MAX, 1)):
    assert libc.mallopt(param, value) == 1
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
n = int(sys.argv[2])

def round_trip():                       # allocate, touch every page, free: one "step"
  p = libc.malloc(n)
  ctypes.memset(p, 1, n)
  libc.free(p)

faults = []

def worker():
  round_trip()                          # the first step faults its pages in either way
  f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  round_trip()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)

t = threading.Thread(target=worker)
t.start()
t.join()
print(int(applied), faults[0])
"""


def _second_step_faults(mode: str, block: int = BLOCK) -> tuple:
  out = subprocess.run([sys.executable, "-c", CHILD, mode, str(block)], cwd=REPO, check=True,
                       capture_output=True, text=True, timeout=60).stdout.split()
  return int(out[0]), int(out[1])


@pytest.mark.skipif(not host_malloc.is_glibc(), reason="host_malloc only acts on glibc (Linux)")
def test_keep_heap_reuses_a_freed_80_mib_block_without_page_faults():
  pages = BLOCK // PAGE                 # 20,480
  applied, faults = _second_step_faults("keep")
  assert applied == 1
  assert faults < 0.01 * pages          # measured: 0
  applied, faults = _second_step_faults("default")
  assert applied == 0
  assert faults > 0.9 * pages           # glibc's default: mmap + munmap every time, 20,480 faults


@pytest.mark.slow                      # 21 s (1.5 GiB faulted in three times); make test-slow
@pytest.mark.skipif(not host_malloc.is_glibc(), reason="host_malloc only acts on glibc (Linux)")
def test_keep_heap_never_trims_a_freed_block_over_1_gib():
  """TRM's per-step scratch at the recipe size is ~10 GB: with a finite trim threshold (1 GiB
  before) glibc returns the freed block to the OS and the next step faults every page in again.
  keep_heap() never trims, so a 1.5 GiB block comes back without faults."""
  block = 3 << 29                       # 1.5 GiB
  pages = block // PAGE                 # 393,216
  applied, faults = _second_step_faults("keep", block)
  assert applied == 1
  assert faults < 0.01 * pages          # measured: 0
  _, faults = _second_step_faults("trim_1gib", block)
  assert faults > 0.9 * pages           # trimmed on free: every page faults again
  _, faults = _second_step_faults("default", block)
  assert faults > 0.9 * pages           # glibc's default: mmap + munmap


@pytest.mark.skipif(not host_malloc.is_glibc(), reason="host_malloc only acts on glibc (Linux)")
def test_keep_heap_is_idempotent_and_on_by_default_in_the_config():
  assert base.get_config().cpu_tuning is True
  script = ("from experiments.common import host_malloc as h; "
            "print(h.keep_heap(), h.keep_heap())")
  out = subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, capture_output=True,
                       text=True, timeout=60).stdout.split()
  assert out == ["True", "True"]
