"""launch/pod.sh in the failures a replay against tests/fake_gcloud found (docs/pod.md's promises).

Each test is one of them, on the fake gcloud of tests/test_launch.py (its helpers), with the shims
tests/fake_gcloud/gcloud's docstring lists: a connection held until a file appears, a worker that
cannot be reached for some commands, a held `scp`, an unreachable slice, transient `describe`
errors. Two launches on one slice; a stop while a start ships its code or while `--watch` waits; a
worker lost at the run step; a full or read-only disk under a worker's records; Ctrl-C before
every worker started; the pre-ship check on what ships; an absolute --config; exit codes of an
unreachable slice and of gcloud's transient errors; what `--include .` ships.

  .venv/bin/python -m pytest tests/test_launch_failures.py -q
"""
import calendar
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from tests import test_launch as tl

REPO_ROOT = tl.REPO_ROOT
PYTHON = sys.executable
FAIL_BOUND_S = 120          # generous: how fast a launch whose worker is lost must end


def _popen(cmd, env, cwd=REPO_ROOT, **kwargs):
  return subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs)


def _wait_file(path, proc=None, timeout=300):
  """Waits until `path` exists; fails early when `proc` ended first (with its output)."""
  deadline = time.monotonic() + timeout
  while not os.path.exists(path):
    if proc is not None and proc.poll() is not None:
      pytest.fail(f"ended (exit {proc.returncode}) before {path} appeared:\n{proc.stdout.read()}")
    assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
    time.sleep(0.05)


def _kill(proc):
  if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _record(tmp_path, i):
  path = tl._home(tmp_path, i) / ".podlab" / f"worker-{i}.run"
  return dict(l.split("=", 1) for l in path.read_text().splitlines()) if path.exists() else {}


def _git_repo(path, files, copies=()):
  """A git checkout at `path` with `files` ({relative path: text}) and the repository's files
  `copies` committed, plus launch/ and the pins (what pod.sh and the workers' setup need)."""
  shutil.copytree(REPO_ROOT / "launch", path / "launch")
  for f in ("pyproject.toml", "constraints.txt", *copies):
    (path / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / f, path / f)
  for rel, text in files.items():
    (path / rel).parent.mkdir(parents=True, exist_ok=True)
    (path / rel).write_text(text)
  git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
  subprocess.run(git + ["init", "-q"], check=True)
  subprocess.run(git + ["add", "-A"], check=True)
  subprocess.run(git + ["commit", "-qm", "x"], check=True)
  return path


# A stand-in trainer that says whose code it is: it prints `code <name>`, records the run in
# $HOME/which.txt and holds until the test's release file exists (a worker's home is
# <tmp>/cloud/fake-pod/worker-<i>), so that a second launch meets it.
WHICH = """import os, sys, time
print("code {name}", flush=True)
with open(os.path.join(os.environ["HOME"], "which.txt"), "a") as f:
  f.write(os.environ["PODLAB_RUN_ID"] + " {name}\\n")
release = os.path.join(os.environ["HOME"], "..", "..", "..", "release")
while not os.path.exists(release):
  time.sleep(0.05)
print("done", flush=True)
"""


# --------------------------------------------------------------------------------------------------
# Two launches on one slice

@pytest.mark.parametrize("apart_s", [0.5, 2, 10])
def test_two_launches_on_one_slice_one_runs_its_own_code_the_other_names_it(tmp_path, apart_s):
  """Launches A and B from two checkouts with different code, B `apart_s` seconds after A (the
  scenario's timing, not a synchronisation). The workers' run commands are held until the loser
  ended or both launches reached their run step, so that the first one waits between prepare and
  run, however fast the machine: exactly one runs, on every worker, with its own code; the other
  exits 1 naming it, having started nothing. Before, B's prepare replaced the code in ~/podlab
  under A, A ran B's code and B said "nothing was started"."""
  hold = tmp_path / "runs-release"
  env = tl._env(tmp_path, FAKE_SSH_HOLD=f"*:worker.sh run:{hold}")
  procs = {}
  for name in ("A", "B"):
    repo = _git_repo(tmp_path / f"repo{name}", {"which_code.py": WHICH.format(name=name)})
    procs[name] = _popen([repo / "launch" / "pod.sh", "fake-pod", "--python", PYTHON,
                          "--log-dir", tmp_path / f"logs{name}", "--module", "which_code",
                          "--workdir", tmp_path / "wd", "--data_dir", tmp_path / "d"], env,
                         cwd=repo)
    if name == "A":
      time.sleep(apart_s)
  outs = {}
  waiting = pathlib.Path(f"{hold}.waiting")
  try:
    deadline = time.monotonic() + 600
    while not any(p.poll() is not None for p in procs.values()) and not (
        waiting.exists() and len(waiting.read_text().splitlines()) >= 4):
      assert time.monotonic() < deadline, "neither launch ended, nor did both reach their run"
      time.sleep(0.1)
    hold.touch()
    while not any(p.poll() is not None for p in procs.values()):     # the loser ends first
      assert time.monotonic() < deadline, "neither launch ended"
      time.sleep(0.1)
    loser = next(n for n, p in procs.items() if p.poll() is not None)
    winner = "B" if loser == "A" else "A"
    (tmp_path / "release").touch()
    outs[winner] = procs[winner].communicate(timeout=300)[0]
    outs[loser] = procs[loser].communicate()[0]
  finally:
    hold.touch()
    (tmp_path / "release").touch()
    for p in procs.values():
      _kill(p)
  assert procs[winner].returncode == 0, outs[winner]
  assert procs[loser].returncode == 1, outs[loser]
  run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{4})", outs[winner]).group(1)
  assert re.search(rf"FAILED \((claim|prepare)\): .*run {run_id} attempt 0", outs[loser]), \
      outs[loser]
  assert "[worker 0] code " + winner in outs[winner] and "[worker 1] code " + winner in outs[winner]
  for i in range(2):
    home = tl._home(tmp_path, i)
    assert (home / "which.txt").read_text() == f"{run_id} {winner}\n"     # one run, its own code
    assert f"code {winner}\n" in tl._remote_log(tmp_path, i)
    assert os.path.realpath(home / "podlab") == str(home / "podlab-runs" / run_id)


# --------------------------------------------------------------------------------------------------
# Stops win

@pytest.mark.parametrize("code_there", [False, True], ids=["fresh-slice", "after-a-run"])
def test_a_stop_while_a_start_ships_its_code_wins(tmp_path, code_there):
  """`stop` while the start copies its code: the stop exits 0 and records a stop request on every
  worker (on a slice that never had podlab code, too); the start finds it when it prepares,
  starts nothing and says so (exit 1). Before, stop said "no podlab run to stop" and the start
  ran to its end."""
  env = tl._env(tmp_path)
  if code_there:
    first, _ = tl._pod(tmp_path, *tl._steps_args(tmp_path, "--steps=1", "--interval=0.01"),
                       env=env, timeout=300)
    assert first.returncode == 0, tl._explain(first)
  hold = tmp_path / "scp-release"
  env_held = dict(env, FAKE_SCP_HOLD=str(hold))
  start = _popen(tl._pod_cmd(tmp_path, "--python", PYTHON, "--log-dir", tmp_path / "podlogs2",
                             *tl._steps_args(tmp_path, "--steps=50", "--interval=0.1")), env_held)
  try:
    _wait_file(f"{hold}.waiting", start)                      # the start is shipping its code
    stop, _ = tl._run([tl.POD, "fake-pod", "stop", "--grace", "5"], env, timeout=300)
    hold.touch()
    out = start.communicate(timeout=300)[0]
  finally:
    hold.touch()
    _kill(start)
  assert stop.returncode == 0, tl._explain(stop)
  if code_there:
    assert re.search(r"worker 0: run \S+ attempt 0 is being shipped \(claimed by \S+\): it will "
                     r"not start", stop.stdout), stop.stdout
  else:
    assert stop.stdout.count("the stop request is recorded (a launch being shipped now will not "
                             "start)") == 2, stop.stdout
  assert start.returncode == 1, out
  run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{4})", out).group(1)
  assert re.search(rf"run {run_id} was stopped by its user \(launch/pod.sh fake-pod stop, by \S+\) "
                   r"before it started: nothing was started", out), out
  assert not any("worker.sh run" in c and run_id in c for c in tl._ssh_commands(tmp_path))
  for i in range(2):
    assert [s for s in tl._starts(tmp_path, i) if s[1] == run_id] == []      # never started
  # A new launch is not blocked by it.
  again, _ = tl._pod(tmp_path, *tl._steps_args(tmp_path, "--steps=1", "--interval=0.01"), env=env,
                     timeout=300)
  assert again.returncode == 0, tl._explain(again)


def test_a_stop_while_watch_waits_for_the_slice_wins(tmp_path):
  """A maintenance event leaves the slice PREEMPTED; while pod.sh --watch waits for READY, `stop`
  cannot reach the workers: it records the stop request on this machine, names the --watch that
  honours it and exits 0; the watch ends without relaunching (exit 1). Before, stop exited 1 and
  the watch relaunched once the slice came back."""
  env = tl._env(tmp_path, FAKE_PREEMPT_ON=r"\] step 2$", FAKE_PREEMPT_STATES="PREEMPTED",
                FAKE_PREEMPT_GRACE_S="60")
  watch = _popen(tl._pod_cmd(tmp_path, "--watch", "--python", PYTHON, "--log-dir",
                             tmp_path / "podlogs", *tl._steps_args(tmp_path, "--steps=100",
                                                                   "--interval=0.1")), env)
  seen = []
  try:
    for line in watch.stdout:
      seen.append(line)
      if "waiting until it is READY" in line:
        break
    stop, _ = tl._run([tl.POD, "fake-pod", "stop"], env, timeout=300)
    seen.append(watch.communicate(timeout=300)[0])
  finally:
    _kill(watch)
  out = "".join(seen)
  assert stop.returncode == 0, tl._explain(stop)
  assert re.search(r"TPU 'fake-pod' is PREEMPTED: its workers cannot be reached; the stop request "
                   rf"is recorded here: the --watch of run \S+ \(pid {watch.pid}\) on this machine "
                   r"will not relaunch it", stop.stdout), tl._explain(stop)
  assert watch.returncode == 1, out
  assert re.search(r"run \S+ was stopped by its user \(launch/pod.sh fake-pod stop, by \S+\): "
                   r"--watch does not relaunch it", out), out
  assert "relaunch 1 of" in out                     # it was waiting to relaunch, then did not
  assert not any("--attempt 1 " in c for c in tl._ssh_commands(tmp_path))


# --------------------------------------------------------------------------------------------------
# Every worker accounted for

@pytest.mark.parametrize("fault", ["held", "down"])
def test_a_worker_lost_at_the_run_step_stops_the_others_and_is_named(tmp_path, fault):
  """Worker 1's run command never runs: its connection hangs (held: silent for --lost-after s) or
  it cannot be reached (down: gcloud gives up on it after its 10 attempts). Worker 1 is asked for
  its run: prepared, never started, so it is lost; worker 0's run is stopped, and the launch exits
  1 naming worker 1 and its last log line, never saying the run "may still be going". Before,
  pod.sh followed worker 0 to its end (10+ minutes here) without a word."""
  rule = {"held": {"FAKE_SSH_HOLD": f"1:worker.sh run:{tmp_path / 'never'}"},
          "down": {"FAKE_SSH_DOWN": "1:worker.sh run"}}[fault]
  env = tl._env(tmp_path, **rule)
  args = ["--lost-after", "3"] if fault == "held" else []
  proc, took = tl._pod(tmp_path, *args, *tl._steps_args(tmp_path, "--steps=3000",
                                                        "--interval=0.1"),
                       env=env, timeout=FAIL_BOUND_S + 300)
  print(f"\nlost worker ({fault}): pod.sh ended after {took:.1f} s")
  assert proc.returncode == 1, tl._explain(proc)
  assert re.search(r"worker 1 is lost: its run never started there \(state prepared\): no process "
                   r"and no exit code; stopping the run on every worker", proc.stderr), \
      tl._explain(proc)
  assert re.search(r"FAILED \(run\): worker 1 is lost \(.*\); the other workers were stopped",
                   proc.stderr), tl._explain(proc)
  assert "its last log line: (none: it logged nothing)" in proc.stderr
  assert "may still be going" not in proc.stdout + proc.stderr
  header = re.search(r"started (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC", tl._remote_log(tmp_path, 0))
  started = calendar.timegm(time.strptime(header.group(1), "%Y-%m-%d %H:%M:%S"))
  assert time.time() - started < FAIL_BOUND_S, took          # from worker 0's start on
  record = _record(tmp_path, 0)
  assert record["state"] == "ended" and record["rc"] in ("143", "137"), record
  assert tl._starts(tmp_path, 1) == [] and _record(tmp_path, 1)["state"] == "stopped"
  assert re.search(r"PODLAB_WORKER_EXIT worker=0 rc=(143|137)", proc.stdout), tl._explain(proc)


@pytest.mark.slow     # ~1 min: the real trainer (2 processes x 2 devices)
def test_a_worker_lost_at_the_run_step_of_the_real_trainer(tmp_path):
  """The same with the trainer: worker 0 waits for worker 1 in jax.distributed's initialization.
  Before, pod.sh ended ~6 minutes later here (~35 with the real defaults) saying the run "may still
  be going", worker 0 having aborted (134) and worker 1 never started."""
  env = tl._env(tmp_path, FAKE_SSH_HOLD=f"1:worker.sh run:{tmp_path / 'never'}")
  proc, took = tl._pod(tmp_path, "--lost-after", "20", "--workdir", tmp_path / "wd", "--data_dir",
                       tmp_path / "tfds", "--config", tl.SMOKE, env=env,
                       timeout=FAIL_BOUND_S + 600)
  print(f"\nlost worker, real trainer: pod.sh ended after {took:.1f} s")
  assert proc.returncode == 1, tl._explain(proc)
  assert re.search(r"FAILED \(run\): worker 1 is lost \(its run never started there",
                   proc.stderr), tl._explain(proc)
  assert "may still be going" not in proc.stdout + proc.stderr
  assert _record(tmp_path, 0)["state"] == "ended"
  assert not tl._home(tmp_path, 1).joinpath("podlab-logs").exists()


# --------------------------------------------------------------------------------------------------
# Nothing runs without its record

UNSHARE_OK = shutil.which("unshare") is not None and subprocess.run(
    ["unshare", "-Urm", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not UNSHARE_OK, reason="needs user and mount namespaces (unshare -Urm)")
@pytest.mark.parametrize("where, fault, message", [
    ("state", "full", "cannot write the run record {state}/worker-0.run: No space left on device; "
                      "nothing was started"),
    ("state", "read-only", "cannot create the lock {state}/worker-0.lock: Read-only file system"),
    ("log", "full", "cannot write the log {log}/worker-0.log: No space left on device; nothing was "
                    "started"),
])
def test_a_record_or_log_that_cannot_be_written_starts_nothing(tmp_path, where, fault, message):
  """The worker's state or log folder on a full (tmpfs of 64 KB, filled) or read-only filesystem,
  in a mount namespace: `worker.sh run --detach` refuses with the reason (exit 2) and the command
  never starts; status then shows no live run. Before, with a full state folder the command kept
  running while run said it "did not start", and status and stop saw nothing: an orphan."""
  state, log = tmp_path / "state", tmp_path / "logs"
  state.mkdir()
  log.mkdir()
  target = state if where == "state" else log
  marker = tmp_path / "started"
  fill = (f"dd if=/dev/zero of={target}/fill bs=4k 2>/dev/null; " if fault == "full" else
          f"mount -o remount,ro {target}; ")
  script = (f"mount -t tmpfs -o size=64k tmpfs {target} && {fill}"
            f"{tl.WORKER} run --run-id r1 --log-dir {log} --detach -- bash -c "
            f"'touch {marker}; sleep 300'; echo rc=$?; {tl.WORKER} status")
  env = tl._worker_env(tmp_path)
  proc = subprocess.run(["unshare", "-Urm", "bash", "-c", script], env=env, capture_output=True,
                        text=True, timeout=120)
  assert "rc=2\n" in proc.stdout, (proc.stdout, proc.stderr)
  assert message.format(state=state, log=log) in proc.stderr, proc.stderr
  time.sleep(0.5)                          # a command started by mistake would have touched it
  assert not marker.exists()
  assert subprocess.run(["pgrep", "-f", str(marker)], capture_output=True).returncode == 1
  status = [l for l in proc.stdout.splitlines() if l.startswith("PODLAB_STATUS")]
  if where == "log":                        # the record says why nothing started
    assert status[0].startswith("PODLAB_STATUS worker=0 state=ended run=r1 attempt=0 pid=- rc=2 ")
    reason = message.format(state=state, log=log).split(";")[0]
    assert status[0].split(" last=", 1)[1] == reason[:200], status   # status cuts it at 200
  else:
    assert status == ["PODLAB_STATUS worker=0 state=none run=- attempt=- pid=- rc=- step=- "
                      "stopped=0 log=- last="], proc.stdout


def test_the_states_a_record_is_read_in(tmp_path):
  """How `worker.sh status` reads records of runs that never started (one record per worker index
  here, claimed a minute ago): prepared and fresh holds the worker; prepared but given up by its
  launcher (a release line) or shipping with its prepare process gone is lost, as is one prepared
  too long ago; a stop request older than the claims changes nothing, one after them stops all."""
  state = tmp_path / "state"
  state.mkdir()
  now = time.time()
  for i, (run_id, st, prepared_ago) in enumerate([("r0", "prepared", 5), ("r1", "prepared", 5),
                                                   ("r2", "prepared", 700), ("r3", "shipping", 5)]):
    (state / f"worker-{i}.run").write_text(
        f"run_id={run_id}\nattempt=0\nstate={st}\nclaimed_at={now - 60:.6f}\n"
        f"prepared={now - prepared_ago:.6f}\nprepare_pid=999999999\nprepare_start=1\n")

  def states(journal):
    (state / "journal").write_text(journal)
    proc, _ = tl._run([tl.WORKER, "status"], tl._env(tmp_path, PODLAB_STATE_DIR=str(state)))
    return [st for _, st in re.findall(r"^PODLAB_STATUS worker=(\d) state=(\S+) ", proc.stdout,
                                       re.M)]

  release = f"release r1 0 {now - 1:.6f}\n"
  assert states(release) == ["prepared", "lost", "lost", "lost"]
  assert states(release + f"stop {now - 120:.6f} earlier\n") == ["prepared", "lost", "lost", "lost"]
  assert states(release + f"stop {now - 2:.6f} someone\n") == ["stopped"] * 4


def test_ctrl_c_before_every_worker_started_stops_those_that_did(tmp_path):
  """Worker 1's run command is held (its connection hangs) while worker 0's run starts; Ctrl-C
  then stops worker 0's run and says so (exit 130), and worker 1, reached later with the same
  command (as a late gcloud retry would), refuses to start it. Before, pod.sh said "detached: run
  goes on on the workers" and worker 0 ran alone."""
  hold = tmp_path / "hold"
  env = tl._env(tmp_path, FAKE_SSH_HOLD=f"1:worker.sh run:{hold}")
  pod = _popen(tl._pod_cmd(tmp_path, "--python", PYTHON, "--log-dir", tmp_path / "podlogs",
                           *tl._steps_args(tmp_path, "--steps=3000", "--interval=0.1")), env,
               preexec_fn=tl._terminal_signals)
  seen = []
  try:
    for line in pod.stdout:
      seen.append(line)
      if line.startswith("[worker 0] step 1"):
        os.killpg(pod.pid, signal.SIGINT)
        break
    seen.append(pod.communicate(timeout=300)[0])
  finally:
    _kill(pod)
  out = "".join(seen)
  assert pod.returncode == 130, out
  run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{4})", out).group(1)
  assert (f"interrupted while run {run_id} attempt 0 was starting: worker(s) 0 had started, "
          "worker(s) 1 had not; stopping it on every worker") in out, out
  assert f"stopped: run {run_id} runs on no worker now" in out, out
  assert "goes on on the workers" not in out
  record = _record(tmp_path, 0)
  assert record["state"] == "ended" and record["rc"] == "143", record
  # The run command reaches worker 1 after all: it refuses, naming the stop.
  run_cmd = next(c for c in tl._ssh_commands(tmp_path) if "worker.sh run" in c)
  run_cmd = run_cmd[len("--command="):]
  hold.touch()
  late, _ = tl._run(["gcloud", "compute", "tpus", "tpu-vm", "ssh", "fake-pod", "--worker=1",
                     "--zone=us-central2-b", f"--command={run_cmd}"], env, timeout=300)
  assert late.returncode == 2, tl._explain(late)
  assert re.search(rf"PODLAB_WORKER_STOPPED worker=1 run={run_id} attempt=0 by=\S+", late.stdout)
  assert tl._starts(tmp_path, 1) == []


# --------------------------------------------------------------------------------------------------
# The check runs on what ships

def test_the_config_is_checked_on_the_code_that_ships(tmp_path):
  """A tracked config importing a module git does not track: the check here runs in an extraction
  of the archive, fails with one line naming the module and the fix (exit 2), before any gcloud
  TPU call. With --include of that module it passes. Before, "checked here ... passes", then an
  ImportError on every worker after shipping."""
  code = [rel for rel in subprocess.run(
      ["git", "-C", str(REPO_ROOT), "ls-files", "experiments", "modules", "input_pipeline"],
      capture_output=True, text=True, check=True).stdout.split()
      if (REPO_ROOT / rel).is_file() and not rel.startswith("input_pipeline/data/")]
  config = ("from experiments.trm.configs import mine_helper  # git does not track it\n\n\n"
            "def get_config(arg=None):\n  return mine_helper.get_config(arg)\n")
  repo = _git_repo(tmp_path / "repo", {"experiments/trm/configs/mine.py": config}, code)
  (repo / "experiments" / "trm" / "configs" / "mine_helper.py").write_text(
      "from experiments.trm.configs.cpu_demo import get_config  # noqa: F401\n")
  args = [repo / "launch" / "pod.sh", "fake-pod", "--dry-run", "--bucket", "bkt", "--config",
          "configs/mine.py"]
  proc, _ = tl._run(args, tl._env(tmp_path), timeout=600, cwd=repo)
  assert proc.returncode == 2, tl._explain(proc)
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert ("ImportError: cannot import name 'mine_helper' from 'experiments.trm.configs' (<the code "
          "that ships>/experiments/trm/configs/__init__.py); the check ran on the code that ships "
          "(the files git tracks, and --include): a module it imports is not among them. Fix: git "
          "add it, or pass --include with its path") in proc.stderr, proc.stderr
  assert "checked here" not in proc.stdout
  proc, _ = tl._run(args + ["--include", "experiments/trm/configs/mine_helper.py"],
                    tl._env(tmp_path), timeout=600, cwd=repo)
  assert proc.returncode == 0, tl._explain(proc)
  assert ("pod.sh: checked here: --config=configs/mine.py loads with the experiment args and "
          "passes experiments.trm.main's checks") in proc.stdout
  assert tl._calls(tmp_path) == [["config", "get", "compute/zone"],
                                 ["config", "get", "core/project"]] * 2     # no TPU call


def test_an_absolute_config_is_sent_relative_to_the_code(tmp_path):
  """--config as an absolute path in the checkout reaches the workers relative to the code they
  run (and resolves there); one outside the checkout is refused (exit 2). Before, the laptop's
  path was sent verbatim."""
  config = REPO_ROOT / "experiments" / "trm" / "configs" / "v4_64.py"
  proc, _ = tl._pod(tmp_path, "--module", "tests._argv_worker", "--config", f"{config}:small",
                    "--workdir", tmp_path / "wd", "--data_dir", tmp_path / "d", timeout=300)
  assert proc.returncode == 0, tl._explain(proc)
  assert (f"--config {config}:small is sent to the workers as "
          "experiments/trm/configs/v4_64.py:small (relative to the code)") in proc.stdout
  for i in range(2):
    home = tl._home(tmp_path, i)
    got = json.loads((home / f"argv-{i}.json").read_text())
    assert got["argv"][0] == "--config=experiments/trm/configs/v4_64.py:small", got
    assert (pathlib.Path(got["cwd"]) / "experiments" / "trm" / "configs" / "v4_64.py").is_file()
  outside = tmp_path / "mine.py"
  outside.write_text("")
  proc, _ = tl._pod(tmp_path, "--module", "tests._argv_worker", "--config", outside, "--workdir",
                    tmp_path / "wd", "--data_dir", tmp_path / "d", timeout=300)
  assert proc.returncode == 2, tl._explain(proc)
  assert (f"--config '{outside}' is outside the repository {REPO_ROOT}: the workers would not have "
          "it") in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------------
# Exit codes: 2 is bad input; a slice that cannot be reached, or gcloud failing, is 1.

def test_an_unreachable_slice_exits_1_and_starts_nothing(tmp_path):
  proc, _ = tl._pod(tmp_path, *tl._steps_args(tmp_path, "--steps=1"),
                    env=tl._env(tmp_path, FAKE_UNREACHABLE="1", PODLAB_GCLOUD_RETRY_S="0.1"),
                    timeout=300)
  assert proc.returncode == 1, tl._explain(proc)
  assert ("FAILED: could not reach worker 0 of fake-pod (gcloud exit code 255, 3 tries); nothing "
          "was started") in proc.stderr, tl._explain(proc)
  assert [c[3] for c in tl._tpu_calls(tmp_path)] == ["describe", "ssh", "ssh", "ssh"]


def test_transient_describe_errors_are_retried_then_exit_1(tmp_path):
  env = tl._env(tmp_path, FAKE_DESCRIBE_ERRORS="2", PODLAB_GCLOUD_RETRY_S="0.1")
  proc, _ = tl._run([tl.POD, "fake-pod", "stop"], env, timeout=300)
  assert proc.returncode == 0, tl._explain(proc)
  assert proc.stderr.count("describe failed (ERROR: (gcloud) UNAVAILABLE") == 2, proc.stderr
  assert "stopping the podlab run on every worker of fake-pod" in proc.stdout
  env = tl._env(tmp_path / "again", FAKE_DESCRIBE_ERRORS="3", PODLAB_GCLOUD_RETRY_S="0.1")
  proc, _ = tl._run([tl.POD, "fake-pod", "status"], env, timeout=300)
  assert proc.returncode == 1, tl._explain(proc)
  assert ("FAILED: could not describe TPU 'fake-pod' in zone us-central2-b after 3 tries (gcloud "
          "or the network failed, not the name)") in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------------------
# What ships

def test_include_never_ships_git_keys_or_env_files_and_the_summary_names_the_commit(tmp_path):
  """`--include .` leaves out .git/, key files and *.env (each named); naming one is refused with
  one line. The summary names the commit and the tracked files modified and not committed."""
  repo = _git_repo(tmp_path / "repo", {"kept.txt": "old\n", "gone.txt": "x\n"})
  (repo / "kept.txt").write_text("new\n")
  (repo / "gone.txt").unlink()
  for name in ("id_rsa", "secret.env", ".env", "server.pem", "notes.csv"):
    (repo / name).write_text("x\n")
  (repo / "sub").mkdir()
  (repo / "sub" / "id_ed25519").write_text("x\n")
  pack = [PYTHON, REPO_ROOT / "launch" / "pack.py", repo]
  proc, _ = tl._run(pack + ["--out", tmp_path / "code.tgz", "--include", "."], os.environ)
  assert proc.returncode == 0, tl._explain(proc)
  with tarfile.open(tmp_path / "code.tgz") as tar:
    names = set(tar.getnames())
  assert "notes.csv" in names and "kept.txt" in names and "gone.txt" not in names
  assert not [n for n in names if n.startswith(".git/") or n == ".git"], sorted(names)[:10]
  for secret in ("id_rsa", "secret.env", ".env", "server.pem", "sub/id_ed25519"):
    assert secret not in names
  for line in ("not shipped: .git (never shipped: .git, launch/pack.py's deny list)",
               "not shipped: id_rsa (never shipped: id_rsa*, launch/pack.py's deny list)",
               "not shipped: secret.env (never shipped: *.env, launch/pack.py's deny list)",
               "not shipped: sub/id_ed25519 (never shipped: id_ed25519*, launch/pack.py's deny "
               "list)"):
    assert line in proc.stdout, proc.stdout
  commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
  assert (f"commit {commit}, with 2 tracked files modified and not committed (shipped as in the "
          "work tree): gone.txt (deleted), kept.txt") in proc.stdout, proc.stdout
  for include, pattern in (("secret.env", "*.env"), ("sub/id_ed25519", "id_ed25519*"),
                           (".git", ".git")):
    proc, _ = tl._run(pack + ["--include", include], os.environ)
    assert proc.returncode == 2, tl._explain(proc)
    assert proc.stderr.startswith(f"--include {include}: never shipped ({pattern}: "
                                  "launch/pack.py's deny list"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
