"""The TPU compiler's temporaries per device for each pod config, against the figures recorded in
docs/tpu.md's table (written by `make tpu-check`): a test that fails when a pod program's memory grew
by more than 2% (+ 16 MiB), before pod time is spent.

Slow: it compiles each pod config's programs for its slice again (minutes per config on 2 cores;
the ARC rows are left out: they read the ARC files, which a plain clone does not have).

  python -m pytest tests/test_tpu_memory.py -m slow -n 0
"""

import pathlib

import pytest

from experiments.tools import tpu_check
from experiments.tools import tpu_docs
from experiments.tools import tpu_target

REPO = pathlib.Path(__file__).resolve().parents[1]
GIB = 2 ** 30


def _gib(cell: str) -> float:
  return float(cell) * GIB


# Each pod config's programs compiled again (minutes per config on 2 cores; docs/tpu.md).
@pytest.mark.slow
def test_tpu_temporaries_per_pod_config_have_not_grown():
  try:
    tpu_target.load_libtpu()
  except tpu_target.LibtpuMissingError as e:
    pytest.skip(str(e))
  rows = tpu_docs.parse_table((REPO / "docs/tpu.md").read_text())
  recorded = {(r["program"], r["slice"]): r for r in rows if r["temp GiB"] not in ("-", "")}
  # The ARC rows count puzzle ids from the ARC files beside a development clone: not here.
  checks = [c for c in tpu_check.CHECKS if "arc" not in c.label
            and any(p.startswith(c.label + ": ") for p, _ in recorded)]
  assert checks, "no pod config of tpu_check has a recorded row in docs/tpu.md"
  checked = set()
  for r in tpu_check.run_checks(checks, log=lambda line: None, loop_aware=False):
    old = recorded.get((r.name, r.target.name))
    if old is None:
      continue
    assert r.compiled, f"{r.name} on {r.target.name} no longer compiles: {r.compiler_message}"
    limit = _gib(old["temp GiB"]) * 1.02 + 16 * 2 ** 20
    assert r.temp_bytes <= limit, (
        f"{r.name} on {r.target.name}: the TPU compiler's temporaries grew to "
        f"{r.temp_bytes / GIB:.2f} GiB per device from {old['temp GiB']} GiB (docs/tpu.md, commit "
        f"{old['commit']})")
    checked.add(r.name)
  assert checked == {p for p, _ in recorded if any(p.startswith(c.label + ": ") for c in checks)}
