"""launch/pod.sh, launch/local.sh and launch/worker.sh, run for real on this machine.

launch/pod.sh runs unchanged against tests/fake_gcloud/gcloud (first on PATH), which emulates a TPU
slice whose workers are local folders: `ssh --worker=all` starts the command once per worker with
the environment a TPU VM gives JAX (coordinator, process count and index, fake CPU devices). So the
script's real path is covered: describe, pack + scp, unpack + stop + setup, run with per-worker logs,
fail-fast. The experiment processes are the real `python -m experiments.trm.main` (2 workers x 2
devices), and the run is then resumed as 2 processes by launch/local.sh from the same workdir.

  .venv/bin/python -m pytest tests/test_launch.py -q
"""
import glob
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
POD = REPO_ROOT / "launch" / "pod.sh"
LOCAL = REPO_ROOT / "launch" / "local.sh"
WORKER = REPO_ROOT / "launch" / "worker.sh"
FAKE_GCLOUD_DIR = REPO_ROOT / "tests" / "fake_gcloud"
PYTHON = sys.executable
RUN_TIMEOUT_S = 400          # a 2-process training run on 2 cores takes ~75 s
FAIL_BOUND_S = 60            # a dead worker must end the run within this (the bound)


def _env(tmp_path, **extra):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("PODLAB_", "FAKE_")) and k != "XLA_FLAGS"}
  env.update(PATH=f"{FAKE_GCLOUD_DIR}:{env['PATH']}", FAKE_GCLOUD_ROOT=str(tmp_path / "cloud"),
             FAKE_TPUS="fake-pod:v4-16:2:2", TF_CPP_MIN_LOG_LEVEL="2", PYTHON=PYTHON)
  env.update(extra)
  return env


def _run(cmd, env, timeout=RUN_TIMEOUT_S, cwd=REPO_ROOT):
  start = time.monotonic()
  proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True,
                        timeout=timeout)
  return proc, time.monotonic() - start


def _pod(tmp_path, *args, env=None, timeout=RUN_TIMEOUT_S):
  return _run([POD, "fake-pod", "--python", PYTHON, "--log-dir", tmp_path / "podlogs", *args],
              env or _env(tmp_path), timeout=timeout)


def _calls(tmp_path):
  path = tmp_path / "cloud" / "calls.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _explain(proc):
  return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def _scalars(event_file):
  """{tag: {step: value}} from a TensorBoard event file."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for event in tf.compat.v1.train.summary_iterator(event_file):
    for value in event.summary.value:
      if value.metadata.plugin_data.plugin_name == "scalars" or value.HasField("tensor"):
        try:
          out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
        except (TypeError, ValueError):
          pass
  return out


# --------------------------------------------------------------------------------------------------
# The real training run: pod.sh on a fake 2 x 2 slice, then resumed as 2 processes by local.sh.

def test_pod_trains_on_every_worker_then_local_pod_resumes(tmp_path):
  workdir, data_dir = tmp_path / "workdir", tmp_path / "tfds"
  proc, took = _pod(tmp_path, "--workdir", workdir, "--data_dir", data_dir,
                    "--config", "configs/cpu_demo.py:smoke")
  assert proc.returncode == 0, _explain(proc)
  out = proc.stdout
  print(f"\npod.sh 2 workers x 2 devices, cpu_demo:smoke: {took:.1f} s")

  # The gcloud commands, in order, with the zone default and --worker=all.
  calls = _calls(tmp_path)
  verbs = [c[3] for c in calls]
  assert verbs == ["describe", "scp", "ssh", "ssh"], calls
  for c in calls:
    assert c[:3] == ["compute", "tpus", "tpu-vm"], c
    assert "fake-pod" in c or "fake-pod:podlab-code.tgz" in c, c
    assert "--zone=us-central2-b" in c, c
  assert all("--worker=all" in c for c in calls[1:]), calls
  assert "worker.sh prepare --python" in calls[2][-1] and "worker.sh run" in calls[3][-1], calls

  # Every worker got the code (tests included: git's files), prepared, and ran from its copy.
  for i in range(2):
    home = tmp_path / "cloud" / "fake-pod" / f"worker-{i}"
    assert (home / "podlab" / "launch" / "worker.sh").is_file()
    assert (home / "podlab" / "experiments" / "trm" / "main.py").is_file()
    assert not (home / "podlab" / ".venv").exists() and not (home / "podlab.new").exists()
    remote_logs = glob.glob(str(home / "podlab-logs" / "*" / f"worker-{i}.log"))
    assert len(remote_logs) == 1, remote_logs
    remote = pathlib.Path(remote_logs[0]).read_text()
    assert f"distributed: process {i}/2, 2 local / 4 global devices" in remote, remote[-3000:]
    local = (tmp_path / "podlogs" / f"worker-{i}.log").read_text()
    assert f"distributed: process {i}/2" in local and "pinned stack present" in local
    assert f"PODLAB_WORKER_EXIT worker={i} rc=0 phase=prepare" in out
    assert re.search(rf"PODLAB_WORKER_EXIT worker={i} rc=0 log=\S+worker-{i}.log", out), out[-3000:]
  assert "TensorBoard: tensorboard --logdir " + str(workdir) in out
  assert "all 2 workers finished" in out

  # One TensorBoard event file (process 0 only), one result file, checkpoints of the 2-process run.
  events = glob.glob(str(workdir / "events.out.tfevents.*"))
  assert len(events) == 1, events
  scalars = _scalars(events[0])
  assert sorted(scalars["train/lm_loss"]) == [2, 4, 6], scalars.get("train/lm_loss")
  final = json.loads((workdir / "final_eval.json").read_text())
  assert final["step"] == 6 and final["test"]["count"] == 40.0, final   # padding excluded
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]

  # Resume as a local 2-process pod (launch/local.sh) with more steps: both processes restore the
  # 2-process checkpoint of step 6 and continue to step 9.
  proc, took = _run([LOCAL, "-n", "2", "-d", "2", "--config", "configs/cpu_demo.py:smoke",
                     "--workdir", workdir, "--log-dir", tmp_path / "locallogs", "--",
                     f"--config.dataset.data_dir={data_dir}", "--config.total_steps=9"],
                    _env(tmp_path))
  assert proc.returncode == 0, _explain(proc)
  print(f"local.sh resume 2 x 2 to step 9: {took:.1f} s")
  for i in range(2):
    log = (tmp_path / "locallogs" / f"worker-{i}.log").read_text()
    assert "Resumed from" in log and "at step 6" in log, log[-3000:]
    assert "Training from step 6 to 9" in log, log[-3000:]
  assert json.loads((workdir / "final_eval.json").read_text())["step"] == 9
  assert len(glob.glob(str(workdir / "events.out.tfevents.*"))) == 2   # process 0's second run
  assert sorted(os.listdir(workdir / "checkpoints")) == ["6", "9"]


# --------------------------------------------------------------------------------------------------
# Fail-fast and bounded hangs: one process dies (tests/_mp_die_worker.py), the others block in a
# collective.

def test_local_pod_fails_fast_naming_the_dead_process(tmp_path):
  proc, took = _run([LOCAL, "-n", "2", "-d", "2", "--module", "tests._mp_die_worker", "--config", "",
                     "--workdir", "", "--log-dir", tmp_path / "logs"],
                    _env(tmp_path, PODLAB_STOP_GRACE_S="2"), timeout=FAIL_BOUND_S + 60)
  print(f"\nlocal.sh fail-fast: {took:.1f} s")
  assert proc.returncode == 1, _explain(proc)
  assert "process 1 exited with code 3" in proc.stderr, _explain(proc)
  assert "FAILED: process 1" in proc.stderr and "DYING" in proc.stderr, _explain(proc)
  assert took < FAIL_BOUND_S, took
  assert "READY 0/2" in (tmp_path / "logs" / "worker-0.log").read_text()
  assert subprocess.run(["pgrep", "-f", str(tmp_path / "logs")], capture_output=True).returncode == 1


def test_pod_fails_fast_and_stops_every_worker(tmp_path):
  proc, took = _pod(tmp_path, "--module", "tests._mp_die_worker", "--workdir", tmp_path / "wd",
                    "--data_dir", tmp_path / "tfds", timeout=FAIL_BOUND_S + 60)
  print(f"\npod.sh fail-fast: {took:.1f} s")
  assert proc.returncode == 1, _explain(proc)
  assert "worker 1 failed (exit 3); stopping the run on every worker" in proc.stderr, _explain(proc)
  assert "FAILED (run): worker 1 exited with code 3" in proc.stderr, _explain(proc)
  assert "DYING" in proc.stderr                         # the tail of the failed worker's log
  assert took < FAIL_BOUND_S + 30, took                 # includes setup; the stop grace is 10 s
  calls = _calls(tmp_path)
  assert [c[3] for c in calls] == ["describe", "scp", "ssh", "ssh", "ssh"], calls
  assert "worker.sh stop" in calls[-1][-1] and "--worker=all" in calls[-1], calls[-1]
  # Worker 0 was stopped (killed out of its blocked collective), not left running.
  assert re.search(r"PODLAB_WORKER_EXIT worker=0 rc=(137|143)", proc.stdout), _explain(proc)
  home0 = tmp_path / "cloud" / "fake-pod" / "worker-0"
  assert not glob.glob(str(home0 / ".podlab" / "worker-*.pid"))


@pytest.mark.parametrize("mode, code", [("exit", 3), ("raise", 1)])
def test_a_dead_process_ends_the_others_without_a_launcher(tmp_path, mode, code):
  """Started by hand (no fail-fast launcher), the survivor still exits: the runtime's heartbeat.

  mode "raise": an exception inside distributed.fail_fast() exits at once; without it the failing
  process would sit in JAX's exit-time shutdown barrier and keep the survivor alive for minutes.
  """
  port = subprocess.run([PYTHON, "-c", "import socket; s = socket.socket(); "
                         "s.bind(('localhost', 0)); print(s.getsockname()[1])"],
                        capture_output=True, text=True, check=True).stdout.strip()
  env = _env(tmp_path, PODLAB_COORDINATOR=f"localhost:{port}", PODLAB_NUM_PROCESSES="2",
             PODLAB_HEARTBEAT_TIMEOUT_S="10", JAX_PLATFORMS="cpu", DIE_MODE=mode,
             XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=str(REPO_ROOT))
  start = time.monotonic()
  procs = [subprocess.Popen([PYTHON, str(REPO_ROOT / "tests" / "_mp_die_worker.py")],
                            env=dict(env, PODLAB_PROCESS_ID=str(i)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    outs = [p.communicate(timeout=FAIL_BOUND_S + 30) for p in procs]
  finally:
    for p in procs:
      p.kill()
  took = time.monotonic() - start
  print(f"\n{mode}: survivor exited {took:.1f} s after start (heartbeat timeout 10 s)")
  assert procs[1].returncode == code and "DYING" in outs[1][0], outs[1]
  if mode == "raise":
    assert "this process fails on purpose" in outs[1][1] and "exiting now with code 1" in outs[1][1]
  assert procs[0].returncode != 0, outs[0]
  assert "READY 0/2" in outs[0][0]
  assert re.search(r"unhealthy|another task died", outs[0][1]), outs[0][1][-3000:]
  assert took < FAIL_BOUND_S


# --------------------------------------------------------------------------------------------------
# Quoting, dry run, validation, setup.

NASTY = ["--config.note=a b", "it's $(touch PWNED); echo `touch PWNED2` > PWNED3", "*", "",
         "--flag=\"x\" ; rm -rf ~", "new\nline"]


def test_pod_passes_arguments_literally(tmp_path):
  data_dir = tmp_path / "data dir; $(touch PWNED4)"
  proc, _ = _pod(tmp_path, "--module", "tests._argv_worker", "--config", "configs/x y.py",
                 "--workdir", tmp_path / "w d", "--data_dir", data_dir, "--", *NASTY, timeout=120)
  assert proc.returncode == 0, _explain(proc)
  for i in range(2):
    home = tmp_path / "cloud" / "fake-pod" / f"worker-{i}"
    got = json.loads((home / f"argv-{i}.json").read_text())
    assert got["argv"] == ["--config=configs/x y.py", f"--workdir={tmp_path / 'w d'}", *NASTY], got
    assert got["TFDS_DATA_DIR"] == str(data_dir)
    assert got["cwd"] == str(home / "podlab")
  for pattern in ("**/PWNED*",):
    assert not glob.glob(str(tmp_path / pattern), recursive=True)
    assert not glob.glob(str(REPO_ROOT / "PWNED*"))


def test_pod_dry_run_prints_the_commands_and_runs_nothing(tmp_path):
  env = _env(tmp_path, PODLAB_BUCKET="my-bucket", PODLAB_ZONE="europe-west4-a",
             PODLAB_PROJECT="my-project")
  proc, _ = _run([POD, "stable-1", "--dry-run", "--", "--config.lr=3e-4"], env, timeout=30)
  assert proc.returncode == 0, _explain(proc)
  lines = proc.stdout.splitlines()
  assert any(l.startswith("gcloud compute tpus tpu-vm describe stable-1 --zone=europe-west4-a "
                          "--project=my-project") for l in lines), proc.stdout
  run = [l for l in lines if "worker.sh run" in l]
  assert len(run) == 1 and "--worker=all" in run[0], proc.stdout
  assert "-m experiments.trm.main" in run[0] and "--config=configs/v4_64.py" in run[0]
  assert "--workdir=gs://my-bucket/podlab/stable-1/v4_64" in run[0]
  assert "TFDS_DATA_DIR=" in run[0] and "gs://my-bucket/podlab/tfds" in run[0]
  assert "--config.lr=3e-4" in run[0]
  assert "tensorboard --logdir gs://my-bucket/podlab/stable-1/v4_64" in proc.stdout
  assert _calls(tmp_path) == []                       # nothing ran


@pytest.mark.parametrize("args, message", [
    ([], "missing the TPU name"),
    (["Bad_Name"], "TPU name 'Bad_Name' is not a valid Cloud TPU name"),
    (["x;touch PWNED"], "is not a valid Cloud TPU name"),
    (["stable-1"], "no bucket: pass --bucket"),
    (["stable-1", "--bucket", "bkt", "--zone", "mars"], "--zone 'mars' is not a zone name"),
    (["stable-1", "--bucket", "bkt", "--module", "os;id"], "--module 'os;id' is not a Python module"),
    (["stable-1", "--bucket", "bkt", "--frobnicate"], "unknown option '--frobnicate'"),
    (["nope", "--bucket", "bkt"], "cannot describe TPU 'nope' in zone us-central2-b"),
])
def test_pod_rejects_bad_input_with_a_clear_error(tmp_path, args, message):
  proc, _ = _run([POD, *args], _env(tmp_path), timeout=30)
  assert proc.returncode == 2, _explain(proc)
  assert message in proc.stderr, _explain(proc)
  assert [c[3] for c in _calls(tmp_path)] in ([], ["describe"])   # never got as far as copying
  assert not glob.glob(str(tmp_path / "**" / "PWNED*"), recursive=True)


def test_pod_refuses_a_slice_that_is_not_ready(tmp_path):
  proc, _ = _run([POD, "fake-pod", "--bucket", "bkt"], _env(tmp_path, FAKE_TPU_STATE="CREATING"),
                 timeout=30)
  assert proc.returncode == 2 and "is CREATING, not READY" in proc.stderr, _explain(proc)


def test_worker_setup_checks_the_pins_of_a_given_interpreter(tmp_path):
  env = _env(tmp_path, PODLAB_STATE_DIR=str(tmp_path / "state"))
  proc, _ = _run([WORKER, "setup", "--python", PYTHON], env, timeout=60)
  assert proc.returncode == 0, _explain(proc)
  assert proc.stdout.strip().splitlines()[-1] == f"PODLAB_PYTHON={PYTHON}"
  # An interpreter without the stack (site-packages off) is named, with each missing pin.
  bare = tmp_path / "bare-python"
  bare.write_text(f"#!/bin/sh\nexec {PYTHON} -S \"$@\"\n")
  bare.chmod(0o755)
  proc, _ = _run([WORKER, "setup", "--python", bare], env, timeout=60)
  assert proc.returncode == 2, _explain(proc)
  assert "does not have the pinned stack" in proc.stderr
  assert re.search(r"jax: installed nothing, pinned \d", proc.stderr), proc.stderr


def test_worker_stop_ends_a_recorded_run(tmp_path):
  env = _env(tmp_path, PODLAB_STATE_DIR=str(tmp_path / "state"), PODLAB_PROCESS_ID="0",
             PODLAB_STOP_GRACE_S="5")
  run = subprocess.Popen([str(WORKER), "run", "--log-dir", str(tmp_path / "logs"), "--", "sleep",
                          "300"], env=env, stdout=subprocess.PIPE, text=True)
  pid_file = tmp_path / "state" / "worker-0.pid"
  for _ in range(100):
    if pid_file.exists() and pid_file.read_text().strip():
      break
    time.sleep(0.05)
  pid = int(pid_file.read_text())
  proc, _ = _run([WORKER, "stop"], env, timeout=60)
  assert proc.returncode == 0 and f"stopping stale processes on" in proc.stdout, _explain(proc)
  out, _ = run.communicate(timeout=30)
  assert re.search(r"PODLAB_WORKER_EXIT worker=0 rc=143 ", out), out
  assert run.returncode == 143
  assert not pid_file.exists()
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)
  proc, _ = _run([WORKER, "stop"], env, timeout=30)
  assert proc.returncode == 0 and "no stale podlab processes" in proc.stdout


def test_pod_stops_before_the_run_when_a_worker_cannot_be_set_up(tmp_path):
  proc, _ = _run([POD, "fake-pod", "--python", "/nonexistent/python", "--log-dir",
                  tmp_path / "podlogs", "--workdir", tmp_path / "wd", "--data_dir", tmp_path / "d"],
                 _env(tmp_path), timeout=120)
  assert proc.returncode == 1, _explain(proc)
  assert re.search(r"FAILED \(prepare\): worker [01] exited with code 2; the run was not started",
                   proc.stderr), _explain(proc)
  assert "is not an executable interpreter" in proc.stdout + proc.stderr
  assert [c[3] for c in _calls(tmp_path)] == ["describe", "scp", "ssh"]     # no run
