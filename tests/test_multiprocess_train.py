"""The pmapped TRM train and eval steps give the same result on 1 x 1, 1 x 4 and 2 x 2 devices.

Three layouts (processes x devices per process) run tests/_mp_train_worker.py in subprocesses
(this test process already has 4 fake devices from conftest.py and cannot start a distributed
runtime), all at once, on the same global batches of 8, with the same seed and the puzzle embedding
on: 1 x 1 (8 rows per device, every collective has one participant), 1 x 4 and 2 x 2 (2 rows per
device; gradients pmean'd over all devices of all hosts, the SignSGD row gradients and ids
all-gathered across hosts, with ids repeated across hosts, metrics psummed). `make test` runs
1 x 4 against 2 x 2 (3 processes); `make test-slow` runs all three (4 processes).

Tolerances, from measured differences (run with -s to print them):

* 1 x 4 vs 2 x 2: the collectives are exact: the cross-host pmean/psum/all_gather give bit-identical
  results in both layouts, and so does the SignSGD table. The parameters are not bitwise equal: XLA's
  CPU code for one gradient (the channel-MLP down-projection weight) depends on the number of devices
  IN THE PROCESS (1 process x 2 devices matches 2 x 2 bitwise, 1 x 4 differs by ~1 ulp, with no
  collective involved), and AdamATan2 amplifies such ulps for entries whose gradients nearly cancel
  across steps (max |diff| ~1.7e-6 after 4 steps at lr 2e-3).
* 1 x 1 vs the others: with 8 rows per device instead of 2, every float32 sum over the batch (the
  gradient contraction over rows, the loss and metric sums) runs in a different order, and the pmean
  over 4 devices becomes one sum over 8 rows, so update 1's gradients differ by rounding: measured
  at most 4.4e-7 of each leaf's largest entry. AdamATan2's first update is lr atan2(g, |g|) = lr
  pi/4 sign(g) whatever |g| is, so an entry whose gradient is rounding noise steps by a full lr pi/4
  in the direction of its noise's sign. Measured (--xla_backend_optimization_level=0, this suite's
  level): one entry of 347,906 (an mlp_t gate_up weight, |g| 3.3e-8 of its leaf's largest) has
  opposite signs in 1 x 1 and 1 x 4, and is 3.14e-3 = lr pi/2 apart after update 1; every other
  entry agrees to 3e-8. Updates 2-4 then start from different parameters, and their gradients differ
  for real: after 4 updates 0.30% of the entries differ by more than 2e-5 (up to 3.1e-3), the EMA by
  up to 1.2e-4, train metrics by up to 1.7e-4 relative (gradient norm), the evaluation with the raw
  weights by one token of 1,053 (accuracy) and 5.1e-5 relative (lm_loss), with the EMA weights
  1.5e-6. It is this amplification alone: the same runs with the optimizer swapped for SGD agree to
  3e-8 after 4 updates, and at XLA's default optimization level no sign flips (9e-7 after 4
  updates). So 1 x 1 is compared where the amplification has not acted, tightly: update 1's
  gradients (to 1e-5 of each leaf's largest), its parameters (to 2e-5, except where the gradient's
  sign differs, which the gradient tolerance allows only for noise-level gradients, and there at
  most lr pi/2 apart; such entries at most 1e-4 of all), the metrics of update 1 (as below); then
  within bounds of its consequences: the later metrics and the evaluations' losses to 1e-3 relative,
  token accuracy to 2 tokens, integer counts exactly, at most 1% of the final parameter and EMA
  entries beyond 2e-5 (a real bug, e.g. another device's rows or divisor, moves most entries and the
  losses by percents). The SignSGD table only sees the sign of each id's summed row gradient and
  came out bit-identical in every pair (a flipped sign would move an entry by 2 lr = 2e-2; it is
  compared to 1e-7).

Between 1 x 4 and 2 x 2, parameters and EMA are compared with an absolute tolerance of 1% of one
learning-rate step (2e-5): a real bug moves them far more (process 1 taking the wrong rows: ~1e-2).
Train metrics are float32 sums, measured within 4e-7 relative, compared to 2e-6; their
integer-valued ones (counts) must match exactly in every pair.

Evaluation (after training, on every host): the trainer's own data path (`DataSource.eval_batches`:
a 13-example test split cut per host by `tfds.split_for_jax_process` and padded to whole global
batches of 8, the padding masked), `evaluators.make_eval_step` pmapped as in train.py, and
`evaluators.evaluate`, with the EMA weights (what the trainer reports) and with the raw weights. In
every layout `count` must be exactly 13 although 16 rows were fed, the hosts must have evaluated
disjoint rows that cover the split, and the ratios must agree with a direct computation on the 13
real examples (one unpadded batch, no pmap, no hosts) and between 1 x 4 and 2 x 2 to 2e-6 relative:
measured at most 2.4e-7, ~2 float32 ulps (the evaluated weights differ by the parameter differences
above, and the batch sums are float32 sums of different lengths); 1 x 1's against theirs as above.
Exact accuracy, q-halt accuracy and steps are ratios of integer counts, compared exactly. The
padding rows carry label -100, so they drop out of `count` even unmasked; what the mask guards is
the q-halt loss: evaluating the same batches with the mask forced on gives q_halt_loss 1.16 instead
of 0.0067 (measured), far outside the tolerance.

  .venv/bin/python -m pytest tests/test_multiprocess_train.py -q -s     # -s prints the differences
"""
import itertools
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
# A hang guard, not a deadline: all 4 workers together take 1-1.6 min on 2 (idle to busy) cores, and
# over 300 s with 0.15 of a CPU (a loaded machine).
TIMEOUT_S = 1200
ALL_LAYOUTS = {"1x1": (1, 1), "1x4": (1, 4), "2x2": (2, 2)}   # name: (processes, devices each)
GLOBAL_BATCH = 8                   # the worker's
ABSENT_IDS = (4, 7)                # never in the worker's batches
EVAL_SIZE = 13                     # the worker's test split (not a multiple of GLOBAL_BATCH)
SEQ_LEN = 81                       # the worker's (every label token is valid)
RTOL = 1e-5
ATOL_PARAMS = 2e-5                 # 1% of one step at the worker's lr 2e-3 (see the module doc)
RTOL_METRICS = 2e-6                # float32 sums: measured <= 4e-7 relative
ATOL_METRICS = 1e-7
ATOL_TABLE = 1e-7                  # a sign flip moves an entry by 2e-2 (see the module doc)
RTOL_EVAL = 2e-6                   # measured <= 2.4e-7 relative (see the module doc)
COUNT_METRICS = ("count", "exact_accuracy", "q_halt_accuracy", "steps")   # integer sums: exact
# 1 x 1 against 4 devices (see the module doc): update 1 tight, then what the trajectory computes.
ONE_DEVICE = "1x1"
RTOL_FIRST_GRAD = 1e-5             # update 1's gradients / each leaf's largest: measured <= 4.4e-7
MAX_SIGN_FLIPS = 1e-4              # of the Adam entries flipped at update 1: measured 1 of 347,906
RTOL_DIVERGED = 1e-3               # train metrics after update 1, eval losses: measured <= 1.7e-4
FRACTION_DIVERGED = 0.01           # final entries beyond ATOL_PARAMS: measured 0.30% (EMA 0.0006%)
ACCURACY_TOKENS = 2                # eval accuracy, in tokens of 13 x 81: measured 1 (raw weights)
EVAL_PREFIXES = ("eval/", "eval_raw/")
EVAL_EXACT = ("count", "exact_accuracy", "q_halt_accuracy", "steps")      # ratios of integers


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(num_processes: int, devices_per_process: int, out_path: pathlib.Path, cwd):
  env = dict(os.environ)
  for name in ("PODLAB_COORDINATOR", "PODLAB_NUM_PROCESSES", "PODLAB_PROCESS_ID"):
    env.pop(name, None)
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process} "
                       + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""),
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


def _assert_close(a, b, prefix, what, atol, rtol=RTOL):
  names = a["param_names"]
  for k in sorted(k for k in a if k.startswith(prefix)):
    x, y = a[k], b[k]
    assert x.shape == y.shape and x.dtype == y.dtype, (what, k, x.shape, y.shape)
    label = names[int(k.split("/")[1])] if prefix in ("params/", "ema/") else k
    np.testing.assert_allclose(
        x, y, rtol=rtol, atol=atol,
        err_msg=f"{what} {prefix}{label}: max |diff| {np.max(np.abs(x - y)):.3g} "
                f"(overall max over {prefix}: {_max_diff(a, b, prefix):.3g})")


def _check_eval(name, hosts):
  """One layout's evaluation: each host evaluated its own real rows, padding excluded, same result."""
  first = hosts[0]
  processes = int(first["layout"][0])
  assert len(hosts) == processes
  # The hosts' real rows are disjoint and cover the split; padding rows were fed but not counted.
  assert all(h["eval_index"].size for h in hosts), name      # every host had real rows
  index = np.concatenate([h["eval_index"] for h in hosts])
  assert sorted(index.tolist()) == list(range(EVAL_SIZE)), (name, [h["eval_index"] for h in hosts])
  fed = sum(int(h["eval_host_rows"]) for h in hosts)
  assert fed == int(first["eval_num_batches"]) * GLOBAL_BATCH > EVAL_SIZE, (name, fed)
  for h in hosts:
    assert int(h["eval_num_batches"]) == int(first["eval_num_batches"]), name
    assert int(h["eval_num_examples"]) == EVAL_SIZE, name
    np.testing.assert_array_equal(h["eval_inputs"], first["eval_inputs"], err_msg=name)
    np.testing.assert_array_equal(h["eval_labels"], first["eval_labels"], err_msg=name)
  assert first["eval_inputs"].shape[0] == EVAL_SIZE
  for prefix in EVAL_PREFIXES:
    # `count` is the number of real examples (13), not of the rows fed (16).
    count = float(first[f"{prefix}count"])
    assert count == EVAL_SIZE != fed, (name, prefix, count)
    # psummed over all hosts: every host has the same metrics, bit for bit.
    for h in hosts[1:]:
      for k in (k for k in first if k.startswith(prefix)):
        assert float(h[k]) == float(first[k]), (name, k, float(h[k]), float(first[k]))
    # Equal to the direct computation on the real examples (no padding, no pmap).
    direct = prefix.replace("eval", "direct")
    assert float(first[f"{direct}count"]) == EVAL_SIZE
    _assert_eval_equal(first, prefix, first, direct, f"{name} {prefix} vs direct")


def _assert_eval_equal(a, prefix_a, b, prefix_b, what, rtol=RTOL_EVAL, accuracy_atol=0.0):
  """Equal evaluation metrics: counts and ratios of integer counts exactly, the others to `rtol`
  (token `accuracy` also to `accuracy_atol`)."""
  keys_a = sorted(k[len(prefix_a):] for k in a if k.startswith(prefix_a))
  keys_b = sorted(k[len(prefix_b):] for k in b if k.startswith(prefix_b))
  assert keys_a == keys_b and "count" in keys_a and "lm_loss" in keys_a, (what, keys_a, keys_b)
  for k in keys_a:
    x, y = float(a[prefix_a + k]), float(b[prefix_b + k])
    if k in EVAL_EXACT:
      assert x == y, (what, k, x, y)
    else:
      atol = accuracy_atol if k == "accuracy" else 0.0
      assert np.isfinite(x) and abs(x - y) <= max(rtol * abs(y), atol), (what, k, x, y, abs(x - y))


def _assert_first_update_alike(a, b, what):
  """Update 1 of 1 x 1 against 4 devices (the module doc): its gradients (AdamATan2's first moment
  over 1 - b1) agree to RTOL_FIRST_GRAD of each leaf's largest, so a gradient's sign can differ only
  where the gradient is below that (rounding noise); the new parameters agree to ATOL_PARAMS except
  at those entries, which moved by one first step each way (lr pi/4: at most lr pi/2 apart), and
  they are at most MAX_SIGN_FLIPS of all."""
  lr, beta1 = float(a["first_lr"]), float(a["beta1"])
  assert lr > 0 and float(b["first_lr"]) == lr, (what, lr, float(b["first_lr"]))
  names = a["param_names"]
  flips, total = 0, 0
  for k in sorted(k for k in a if k.startswith("first_mu/")):
    i = k.split("/")[1]
    label = names[int(i)]
    grad_a, grad_b = (x[k].astype(np.float64) / (1 - beta1) for x in (a, b))
    noise = RTOL_FIRST_GRAD * np.max(np.abs(grad_b))
    np.testing.assert_allclose(grad_a, grad_b, rtol=0, atol=noise,
                               err_msg=f"{what} update 1's gradient {label}")
    flipped = np.sign(grad_a) != np.sign(grad_b)          # implies |gradient| <= noise in both
    params_a, params_b = a[f"first_params/{i}"], b[f"first_params/{i}"]
    np.testing.assert_allclose(params_a[~flipped], params_b[~flipped], rtol=0, atol=ATOL_PARAMS,
                               err_msg=f"{what} update 1's parameters {label} (same gradient sign)")
    step_apart = np.abs(params_a[flipped].astype(np.float64) - params_b[flipped])
    assert np.all(step_apart <= lr * np.pi / 2 + ATOL_PARAMS), (what, label, step_apart)
    flips += int(np.sum(flipped))
    total += flipped.size
  print(f"{what}: update 1 flipped the sign of {flips} of {total} gradient entries")
  assert flips <= MAX_SIGN_FLIPS * total, (what, flips, total)


def _fraction_beyond(a, b, prefix, atol):
  """The fraction of all entries under `prefix` that differ by more than `atol`."""
  keys = [k for k in a if k.startswith(prefix)]
  beyond = sum(int(np.sum(np.abs(a[k].astype(np.float64) - b[k]) > atol)) for k in keys)
  return beyond / sum(a[k].size for k in keys)


def _eval_diff(a, b, prefix, prefix_b=None):
  """max |a[prefix k] - b[prefix_b k]| over the evaluation metrics k (prefix_b: default prefix)."""
  prefix_b = prefix_b or prefix
  return max(abs(float(a[k]) - float(b[prefix_b + k[len(prefix):]]))
             for k in a if k.startswith(prefix))


@pytest.mark.parametrize("names", [
    ("1x4", "2x2"),                                   # across hosts: 3 processes
    pytest.param(("1x1", "1x4", "2x2"), marks=pytest.mark.slow)])   # + one device: 4 processes
def test_layouts_train_and_evaluate_alike(tmp_path, names):
  """`make test` compares 1 x 4 with 2 x 2 (the cross-host collectives); `make test-slow` adds
  1 x 1 (8 rows on one device against 2 on each of 4)."""
  LAYOUTS = {name: ALL_LAYOUTS[name] for name in names}  # pylint: disable=invalid-name
  start = time.monotonic()
  paths = {name: tmp_path / f"{name}.npz" for name in LAYOUTS}
  procs = []
  for name, (processes, devices) in LAYOUTS.items():
    procs += [(f"{name} p{i}", p) for i, p in enumerate(_launch(processes, devices, paths[name],
                                                                   tmp_path))]
  _wait_all(procs)
  took = time.monotonic() - start
  runs = {name: [_load(path)] + [_load(f"{path}.process{p}.npz")
                                 for p in range(1, LAYOUTS[name][0])]
          for name, path in paths.items()}
  res = {name: hosts[0] for name, hosts in runs.items()}

  # Same inputs and structure in every layout; the split of the global batch is the intended one.
  for name, (processes, devices) in LAYOUTS.items():
    np.testing.assert_array_equal(res[name]["layout"],
                                  [processes, devices, GLOBAL_BATCH // (processes * devices)])
    np.testing.assert_array_equal(res[name]["batch_ids"], res["1x4"]["batch_ids"])
    np.testing.assert_array_equal(res[name]["param_names"], res["1x4"]["param_names"])
    np.testing.assert_array_equal(res[name]["eval_inputs"], res["1x4"]["eval_inputs"])
    np.testing.assert_array_equal(res[name]["eval_labels"], res["1x4"]["eval_labels"])
    assert int(res[name]["sign_count"]) == res[name]["batch_ids"].shape[0]

  pairs = list(itertools.combinations(LAYOUTS, 2))
  print()
  for a, b in pairs:
    diffs = {p: _max_diff(res[a], res[b], p)
             for p in ("params/", "ema/", "puzzle_table", "metric/")}
    diffs.update({p: _eval_diff(res[a], res[b], p) for p in EVAL_PREFIXES})
    print(f"max |{a} - {b}|: " + ", ".join(f"{k} {v:.3g}" for k, v in diffs.items()))
  for name in LAYOUTS:
    print(f"max |{name} eval - direct|: " + ", ".join(
        f"{p} {_eval_diff(res[name], res[name], p, p.replace('eval', 'direct')):.3g}"
        for p in EVAL_PREFIXES))
  two, two_p1 = runs["2x2"]
  host_diffs = {p: _max_diff(two, two_p1, p) for p in ("params/", "ema/", "puzzle_table")}
  print(f"max |2x2 process 0 - process 1|: {host_diffs}; eval: "
        + ", ".join(f"{k} {float(v):.6g}" for k, v in res["1x4"].items() if k.startswith("eval/"))
        + f"; workers took {took:.1f}s")

  # The puzzle table: sign updates, equal up to rounding.
  present = sorted(set(res["1x4"]["batch_ids"].reshape(-1).tolist()))
  assert not set(present) & set(ABSENT_IDS), present
  for name in LAYOUTS:
    table = res[name]["puzzle_table"]
    # Not vacuous: every id that occurred was updated, the others were not touched.
    assert np.all(np.any(table[present] != 0, axis=1)), (name, table[present])
    assert np.all(table[list(ABSENT_IDS)] == 0), (name, table[list(ABSENT_IDS)])

  for a, b in pairs:
    what = f"{b} vs {a}"
    np.testing.assert_allclose(
        res[b]["puzzle_table"], res[a]["puzzle_table"], rtol=0, atol=ATOL_TABLE,
        err_msg=f"{what}: puzzle tables differ: max |diff| "
                f"{_max_diff(res[a], res[b], 'puzzle_table'):.3g}")
    for name in COUNT_METRICS:
      np.testing.assert_array_equal(res[b][f"metric/{name}"], res[a][f"metric/{name}"],
                                    err_msg=f"{what}: {name}")
    if ONE_DEVICE not in (a, b):
      _assert_close(res[b], res[a], "params/", what, ATOL_PARAMS)
      _assert_close(res[b], res[a], "ema/", what, ATOL_PARAMS)
      _assert_close(res[b], res[a], "metric/", what, ATOL_METRICS, rtol=RTOL_METRICS)
      for prefix in EVAL_PREFIXES:
        _assert_eval_equal(res[b], prefix, res[a], prefix, f"{what} {prefix}")
      continue
    # 1 x 1: update 1 tight; after it, the trajectory's metrics and evaluations within the bounds of
    # its one flipped step (the module doc).
    _assert_first_update_alike(res[b], res[a], what)
    for k in sorted(k for k in res[a] if k.startswith("metric/")):
      x, y = res[b][k], res[a][k]
      np.testing.assert_allclose(x[:1], y[:1], rtol=RTOL_METRICS, atol=ATOL_METRICS,
                                 err_msg=f"{what} {k} of update 1")
      np.testing.assert_allclose(x[1:], y[1:], rtol=RTOL_DIVERGED, atol=ATOL_METRICS,
                                 err_msg=f"{what} {k} after update 1")
    for prefix in ("params/", "ema/"):
      fraction = _fraction_beyond(res[b], res[a], prefix, ATOL_PARAMS)
      print(f"{what}: {fraction:.4%} of the entries of {prefix} differ by more than {ATOL_PARAMS}")
      assert fraction <= FRACTION_DIVERGED, (what, prefix, fraction)
    for prefix in EVAL_PREFIXES:
      _assert_eval_equal(res[b], prefix, res[a], prefix, f"{what} {prefix}", rtol=RTOL_DIVERGED,
                         accuracy_atol=ACCURACY_TOKENS / (EVAL_SIZE * SEQ_LEN))
  for name in LAYOUTS:
    # Halted rows were counted (psum over all devices; halt_max_steps 2: all slots halt by step 2).
    assert np.sum(res[name]["metric/count"][:2]) >= GLOBAL_BATCH, (name, res[name]["metric/count"])
    assert np.all(np.isfinite(res[name]["metric/lm_loss"])), (name, res[name]["metric/lm_loss"])
    _check_eval(name, runs[name])
  # The two hosts of the 2 x 2 run hold the same replicated state, bit for bit.
  for k in sorted(k for k in two if k.startswith(("params/", "ema/", "puzzle_table"))):
    np.testing.assert_array_equal(two_p1[k], two[k], err_msg=f"2x2 process 1 vs process 0: {k}")
