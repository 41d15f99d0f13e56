"""Tests for experiments/common/distributed.py, including a real 2-process run on the CPU.

  .venv/bin/python -m pytest tests/test_distributed.py -q
"""
import os
import pathlib
import socket
import subprocess
import sys

import jax
import pytest

from experiments.common import distributed
from experiments.common import parallel

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO_ROOT / "tests" / "_mp_checkpoint_worker.py"
WORKER_TIMEOUT_S = 75


@pytest.fixture
def clean_env(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID):
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_initialize_without_arguments_off_tpu_is_single_process(clean_env):
  info = distributed.initialize()
  assert not jax.distributed.is_initialized()
  assert (info.process_index, info.process_count) == (0, 1)
  assert info.local_device_count == info.device_count == jax.device_count() == 4
  assert info.platform == "cpu" and info.device_kinds == ("cpu",)
  distributed.finalize()  # Single process: nothing to wait for or shut down.


@pytest.mark.parametrize("env, missing", [
    ({"PODLAB_COORDINATOR": "localhost:1"}, "PODLAB_NUM_PROCESSES, PODLAB_PROCESS_ID"),
    ({"PODLAB_NUM_PROCESSES": "2", "PODLAB_PROCESS_ID": "1"}, "PODLAB_COORDINATOR"),
])
def test_partial_settings_off_tpu_name_what_is_missing(clean_env, env, missing):
  for name, value in env.items():
    clean_env.setenv(name, value)
  with pytest.raises(ValueError, match=missing):
    distributed.initialize()


def test_bad_settings_are_rejected_before_initialising(clean_env):
  clean_env.setenv("PODLAB_NUM_PROCESSES", "two")
  with pytest.raises(ValueError, match="PODLAB_NUM_PROCESSES='two'"):
    distributed.initialize()
  with pytest.raises(ValueError, match=r"process_id=2: must be in \[0, num_processes=2\)"):
    distributed.initialize("localhost:1", num_processes=2, process_id=2)
  assert not jax.distributed.is_initialized()


def test_meshes_cover_all_and_local_devices():
  mesh = parallel.REPLICATED.mesh()
  assert mesh.axis_names == (parallel.AXIS,) == ("data",)
  assert list(mesh.devices) == sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  assert list(parallel.REPLICATED.local_mesh().devices) == jax.local_devices()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_initialize_save_restore_finalize(tmp_path):
  """2 processes x 2 CPU devices: each saves and gets its own per-device rows back bitwise.

  Process 0 initialises from explicit arguments, process 1 from the PODLAB_* environment variables.
  """
  port = _free_port()
  ckpt_dir = tmp_path / "ckpt"
  env = dict(os.environ)
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
             PYTHONPATH=str(REPO_ROOT))
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID):
    env.pop(name, None)
  env1 = dict(env, PODLAB_COORDINATOR=f"localhost:{port}", PODLAB_NUM_PROCESSES="2",
              PODLAB_PROCESS_ID="1")
  commands = [
      ([sys.executable, str(WORKER), "--process_id=0", f"--port={port}", f"--dir={ckpt_dir}"], env),
      ([sys.executable, str(WORKER), f"--dir={ckpt_dir}"], env1),
  ]
  procs = [subprocess.Popen(cmd, env=e, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for cmd, e in commands]
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=WORKER_TIMEOUT_S))
  except subprocess.TimeoutExpired:
    for proc in procs:
      proc.kill()
    details = "\n".join(f"--- process {i} stderr ---\n{p.communicate()[1][-3000:]}"
                        for i, p in enumerate(procs))
    pytest.fail(f"workers still running after {WORKER_TIMEOUT_S}s\n{details}")
  for i, (proc, (out, err)) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0 and f"WORKER_OK {i}" in out, (
        f"process {i} exited {proc.returncode}\n--- stdout ---\n{out[-2000:]}\n"
        f"--- stderr ---\n{err[-4000:]}")
  assert sorted(p.name for p in ckpt_dir.iterdir()) == ["5", "7"]
  # Each host wrote its own shard of the per-device state.
  assert {p.name for p in (ckpt_dir / "7" / "per_device").glob("ocdbt.process_*")} == {
      "ocdbt.process_0", "ocdbt.process_1"}


def test_every_program_that_uses_jax_skips_the_tpu_probe_off_a_tpu_vm():
  """Every `python -m` program under experiments/ that imports JAX picks the CPU off a TPU VM before
  its backend starts (`distributed.choose_platforms()`, or entry's run / run_program, which call
  it): with libtpu installed (the `tpu` extra) JAX would otherwise probe for a TPU and print
  libtpu's warnings about TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES."""
  import re  # pylint: disable=g-import-not-at-top
  missing = []
  for path in sorted((REPO_ROOT / "experiments").rglob("*.py")):
    text = path.read_text()
    if '__name__ == "__main__"' not in text or not re.search(r"^\s*(import|from) jax\b", text,
                                                               re.M):
      continue
    if "distributed.choose_platforms()" not in text and not re.search(
        r"entry\.(run|run_program)\(", text):
      missing.append(str(path.relative_to(REPO_ROOT)))
  assert not missing, ("call distributed.choose_platforms() first thing in main(): "
                       + ", ".join(missing))


def test_a_tool_prints_no_tpu_probe_lines_without_jax_platforms():
  """`make params` (a tool that starts JAX's backend) with JAX_PLATFORMS unset: the table, and no
  line from a TPU probe on stderr."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-m", "experiments.trm.tools.params"], cwd=REPO_ROOT,
                        env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "TRM-MLP Sudoku" in proc.stdout and "5,028,866" in proc.stdout
  for noise in ("TPU", "libtpu", "InitGoogle"):
    assert noise not in proc.stderr, proc.stderr[-3000:]
