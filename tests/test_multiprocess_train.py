"""The pmapped TRM train step gives the same result on 2 processes x 2 devices as on 1 process x 4.

Both layouts run tests/_mp_train_worker.py in subprocesses (this test process already has 4 fake
devices from conftest.py and cannot start a distributed runtime) on the same global batches, with the
puzzle embedding on: gradients pmean'd over all devices of all hosts, the SignSGD row gradients and ids
all-gathered across hosts (with ids repeated across hosts), metrics psummed.

The collectives are exact: the cross-host pmean/psum/all_gather give bit-identical results in both
layouts, and so does the SignSGD table. The parameters are not bitwise equal: XLA's CPU code for one
gradient (the channel-MLP down-projection weight) depends on the number of devices IN THE PROCESS
(1 process x 2 devices matches 2 x 2 bitwise, 1 x 4 differs by ~1 ulp, with no collective involved),
and AdamATan2 amplifies such ulps for entries whose gradients nearly cancel across steps (~2e-6 after 4
steps at lr 2e-3). Parameters and EMA are therefore compared with an absolute tolerance of 1% of one
learning-rate step; a real bug moves them far more (process 1 taking the wrong rows: ~1e-2).

  .venv/bin/python -m pytest tests/test_multiprocess_train.py -q -s     # -s prints the differences
"""
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO_ROOT / "tests" / "_mp_train_worker.py"
TIMEOUT_S = 150                    # all workers together; they normally finish in well under a minute
ABSENT_IDS = (4, 7)                # never in the worker's batches
RTOL = 1e-5
ATOL_PARAMS = 2e-5                 # 1% of one step at the worker's lr 2e-3 (see the module doc)
ATOL_METRICS = 1e-7
COUNT_METRICS = ("count", "exact_accuracy", "q_halt_accuracy", "steps")   # integer sums: exact


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(num_processes: int, devices_per_process: int, out_path: pathlib.Path, cwd):
  env = dict(os.environ)
  for name in ("PODLAB_COORDINATOR", "PODLAB_NUM_PROCESSES", "PODLAB_PROCESS_ID"):
    env.pop(name, None)
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO_ROOT))
  port = _free_port()
  return [subprocess.Popen(
      [sys.executable, str(WORKER), str(p), str(num_processes), str(port), str(devices_per_process),
       str(out_path)], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for p in range(num_processes)]


def _wait_all(named_procs):
  """Waits for every (name, Popen) within TIMEOUT_S; fails with each one's stderr otherwise."""
  deadline = time.monotonic() + TIMEOUT_S
  outputs = {}
  try:
    for name, proc in named_procs:
      outputs[name] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    for _, proc in named_procs:
      proc.kill()
    details = "\n".join(f"--- {name} stderr ---\n{proc.communicate()[1][-3000:]}"
                        for name, proc in named_procs)
    pytest.fail(f"workers still running after {TIMEOUT_S}s\n{details}")
  for name, proc in named_procs:
    out, err = outputs[name]
    pid = name.rsplit("p", 1)[1]
    assert proc.returncode == 0 and f"WORKER_OK {pid}" in out, (
        f"{name} exited {proc.returncode}\n--- stdout ---\n{out[-2000:]}\n"
        f"--- stderr ---\n{err[-4000:]}")


def _load(path):
  with np.load(path, allow_pickle=False) as f:
    return {k: f[k] for k in f.files}


def _max_diff(a, b, prefix):
  keys = sorted(k for k in a if k.startswith(prefix))
  return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)), initial=0.0))
             for k in keys)


def _assert_close(a, b, prefix, what, atol):
  names = a["param_names"]
  for k in sorted(k for k in a if k.startswith(prefix)):
    x, y = a[k], b[k]
    assert x.shape == y.shape and x.dtype == y.dtype, (what, k, x.shape, y.shape)
    label = names[int(k.split("/")[1])] if prefix in ("params/", "ema/") else k
    np.testing.assert_allclose(
        x, y, rtol=RTOL, atol=atol,
        err_msg=f"{what} {prefix}{label}: max |diff| {np.max(np.abs(x - y)):.3g} "
                f"(overall max over {prefix}: {_max_diff(a, b, prefix):.3g})")


def test_two_processes_train_like_one(tmp_path):
  start = time.monotonic()
  one_path, two_path = tmp_path / "1x4.npz", tmp_path / "2x2.npz"
  procs = [("1x4 p0", p) for p in _launch(1, 4, one_path, tmp_path)]
  procs += [(f"2x2 p{i}", p) for i, p in enumerate(_launch(2, 2, two_path, tmp_path))]
  _wait_all(procs)
  one, two = _load(one_path), _load(two_path)
  two_p1 = _load(f"{two_path}.process1.npz")

  # Same inputs and structure in both layouts.
  np.testing.assert_array_equal(one["batch_ids"], two["batch_ids"])
  np.testing.assert_array_equal(one["param_names"], two["param_names"])
  assert int(one["sign_count"]) == int(two["sign_count"]) == one["batch_ids"].shape[0]

  diffs = {p: _max_diff(one, two, p) for p in ("params/", "ema/", "puzzle_table", "metric/")}
  host_diffs = {p: _max_diff(two, two_p1, p) for p in ("params/", "ema/", "puzzle_table")}
  print(f"\nmax |1x4 - 2x2|: {diffs}; max |2x2 process 0 - process 1|: {host_diffs}; "
        f"workers took {time.monotonic() - start:.1f}s")

  # The puzzle table: sign updates, equal up to rounding.
  table_one, table_two = one["puzzle_table"], two["puzzle_table"]
  np.testing.assert_allclose(table_two, table_one, rtol=0, atol=1e-7,
                             err_msg=f"puzzle tables differ: max |diff| {diffs['puzzle_table']:.3g}")
  # Not vacuous: every id that occurred was updated, the others were not touched.
  present = sorted(set(one["batch_ids"].reshape(-1).tolist()))
  assert not set(present) & set(ABSENT_IDS), present
  for table in (table_one, table_two):
    assert np.all(np.any(table[present] != 0, axis=1)), table[present]
    assert np.all(table[list(ABSENT_IDS)] == 0), table[list(ABSENT_IDS)]

  _assert_close(two, one, "params/", "2x2 vs 1x4", ATOL_PARAMS)
  _assert_close(two, one, "ema/", "2x2 vs 1x4", ATOL_PARAMS)
  _assert_close(two, one, "metric/", "2x2 vs 1x4", ATOL_METRICS)
  for name in COUNT_METRICS:
    np.testing.assert_array_equal(two[f"metric/{name}"], one[f"metric/{name}"], err_msg=name)
  # Halted rows were counted (psum over both hosts; halt_max_steps 2: every slot halts by step 2).
  assert np.sum(two["metric/count"][:2]) >= 8, two["metric/count"]
  assert np.all(np.isfinite(two["metric/lm_loss"])), two["metric/lm_loss"]
  # The two hosts of the 2 x 2 run hold the same replicated state, bit for bit.
  for k in sorted(k for k in two if k.startswith(("params/", "ema/", "puzzle_table"))):
    np.testing.assert_array_equal(two_p1[k], two[k], err_msg=f"2x2 process 1 vs process 0: {k}")
