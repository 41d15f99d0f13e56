"""The TPU compiler's temporaries per device of representative pod programs, against the figures
recorded in docs/tpu.md's table (written by `make tpu-check`): a test that fails when one of them
grew by more than 2% (+ 16 MiB), before pod time is spent.

A subset sized for CI, one program per experiment, the cheapest of each (GROUPS): the train steps of
TRM's v4_64 sudoku_mlp (v4-64) and of nanoGPT's v4_32 GPT-2 124M at grad_accum=1 (v4-32), and one
Dream 7.6B sampler step (greedy, batch 1, model_parallel 1 on a v3-8). Evaluation steps are left
out: recorded at 0.03-0.04 GiB (to 0.01 GiB), the 16 MiB slack makes theirs a ~50% check. Each
program compiles in a process of its own (tests/_tpu_memory_worker.py), one after another, so that
each compile's memory goes back before the next starts. Every row of the table (every pod config:
tens of minutes, and more than 16 GB in one process) is `make tpu-check`'s, not this test's: run it
after changing a pod program and read its table's diff. The recorded figures are read when the test
runs, so rows that `make tpu-check` rewrote are what it compares with.

Measured on 2 shared cores at load ~10-13: the test 14.8 min (255 CPU-s), peak RSS 5.7 GB (the
GPT-2 compile); TRM's train step 4 min, GPT-2's 9 min, the Dream step 1.7 min. The same groups
with their evaluation steps too, alone: TRM 5.5 min and 4.9 GB, GPT-2 7.1 min and 5.7 GB (load ~9).

  python -m pytest tests/test_tpu_memory.py -m slow -n 0 -s     # -s prints each program's figures
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from experiments.tools import tpu_docs

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "_tpu_memory_worker.py"
GIB = 2 ** 30
GROWTH = 1.02                     # + 2%
SLACK_BYTES = 16 * 2 ** 20        # + 16 MiB
# The worker's arguments per group: a tpu_check.CHECKS label, or one Dream sampler step of a
# tpu_check.PROGRAM_CHECKS group (sampler, target, batch, model_parallel).
GROUPS = (("check", "trm v4_64 sudoku_mlp", "train_step"),
          ("check", "nanogpt v4_32 gpt2_124m grad_accum=1", "train_step"),
          ("sampling", "greedy", "v3-8", "1", "1"))
# A hang guard per group, not a deadline: the slowest (GPT-2) took 9 min at load ~12.
TIMEOUT_S = 3600


def _compile(group):
  """The worker's JSON reports of `group`, or None when this environment has no libtpu."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  # As `make tpu-check` compiles: no test XLA flags (the CPU device count, the suite's optimization
  # level), and no compilation cache, so that every run compiles anew.
  for name in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR"):
    env.pop(name, None)
  start = time.monotonic()
  proc = subprocess.run([sys.executable, str(WORKER), *group], env=env, cwd=REPO, text=True,
                        capture_output=True, timeout=TIMEOUT_S, check=False)
  assert proc.returncode == 0, (f"{group} exited {proc.returncode}\n--- stdout ---\n"
                                f"{proc.stdout[-2000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
  lines = proc.stdout.splitlines()
  if any(line.startswith("LIBTPU_MISSING ") for line in lines):
    return None
  assert "WORKER_OK" in lines, (group, proc.stdout[-2000:], proc.stderr[-4000:])
  reports = [json.loads(line) for line in lines if line.startswith("{")]
  print(f"{' '.join(group)}: {len(reports)} programs in {time.monotonic() - start:.0f} s")
  return reports


@pytest.mark.slow
def test_tpu_temporaries_of_representative_pod_programs_have_not_grown():
  rows = tpu_docs.parse_table((REPO / "docs/tpu.md").read_text())
  recorded = {(r["program"], r["slice"]): r for r in rows}
  problems = []
  for group in GROUPS:
    reports = _compile(group)
    if reports is None:
      pytest.skip("the TPU compile tests need libtpu (pip install -e '.[tpu]')")
    assert reports, group
    for r in reports:
      key = (r["program"], r["slice"])
      old = recorded.get(key)
      assert old is not None and old["temp GiB"] not in ("-", ""), (
          f"{key} has no recorded temporaries in docs/tpu.md's table: `make tpu-check "
          f"TPU_CHECK_ARGS=--only=...` records them")
      if not r["compiled"]:
        problems.append(f"{key} no longer compiles: {r['message']}")
        continue
      limit = float(old["temp GiB"]) * GIB * GROWTH + SLACK_BYTES
      print(f"  {key}: {r['temp_bytes'] / GIB:.3f} GiB (recorded {old['temp GiB']} at "
            f"{old['commit']}, limit {limit / GIB:.3f})")
      if r["temp_bytes"] > limit:
        problems.append(
            f"{r['program']} on {r['slice']}: the TPU compiler's temporaries grew to "
            f"{r['temp_bytes'] / GIB:.2f} GiB per device from {old['temp GiB']} GiB (docs/tpu.md, "
            f"commit {old['commit']})")
  assert not problems, "\n".join(problems)
