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
applied = host_malloc.keep_heap() if sys.argv[1] == "keep" else False
libc = ctypes.CDLL("libc.so.6")
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


def _second_step_faults(mode: str) -> tuple:
  out = subprocess.run([sys.executable, "-c", CHILD, mode, str(BLOCK)], cwd=REPO, check=True,
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


@pytest.mark.skipif(not host_malloc.is_glibc(), reason="host_malloc only acts on glibc (Linux)")
def test_keep_heap_is_idempotent_and_on_by_default_in_the_config():
  assert base.get_config().cpu_tuning is True
  script = ("from experiments.common import host_malloc as h; "
            "print(h.keep_heap(), h.keep_heap())")
  out = subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, capture_output=True,
                       text=True, timeout=60).stdout.split()
  assert out == ["True", "True"]
