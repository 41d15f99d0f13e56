"""experiments/common/workdir_lock.py: one run per workdir, and the config fingerprint.

Every lock test runs on both stores: LocalStore (local paths: create-if-absent with os.link, an
flock guard) and GfileStore, the gs:// code path (tf.io.gfile, write + read-back), here on a local
folder (tf.io.gfile reads and writes local paths the same way; there is no network).

  .venv/bin/python -m pytest tests/test_workdir_lock.py -q
"""
import json
import multiprocessing
import textwrap
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from experiments.common import config_utils
from experiments.common import workdir_lock
from experiments.common.workdir_lock import ABSENT, ConfigChange, WorkdirLock

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
  """A settable time.time()."""

  def __init__(self, t=1_800_000_000.0):
    self.t = t

  def __call__(self):
    return self.t


@pytest.fixture(params=["local", "gfile"])
def store(request):
  return workdir_lock.LocalStore() if request.param == "local" else workdir_lock.GfileStore(settle_s=0.05)


def _lock(workdir, store, **kw):
  kw.setdefault("run_id", "run-a")
  return WorkdirLock(str(workdir), store=store, **kw)


def test_a_held_workdir_refuses_a_second_run_naming_the_holder(tmp_path, store):
  clock = Clock()
  with _lock(tmp_path, store, run_id="run-a", clock=clock):
    record = workdir_lock.read_lock(str(tmp_path), store)
    assert record["run_id"] == "run-a" and record["pid"] == os.getpid()
    assert record["host"] == socket.gethostname() and record["started"] == clock.t
    clock.t += 42
    with pytest.raises(config_utils.WorkdirError) as e:
      _lock(tmp_path, store, run_id="run-b", clock=clock).acquire()
    message = str(e.value)
    assert "\n" not in message
    assert f"belongs to run run-a (host {socket.gethostname()}, pid {os.getpid()}" in message
    assert "started 2027-01-15 08:00:00 UTC, last heartbeat 42 s ago" in message
    assert f"lock {tmp_path}/run.lock" in message and "Fix: " in message
    # The refused run did not touch the holder's record.
    assert workdir_lock.read_lock(str(tmp_path), store) == record
  assert workdir_lock.read_lock(str(tmp_path), store) is None          # released


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path, store, caplog):
  """A real holder process, SIGKILLed: its lock stays behind and is taken over by pid."""
  code = ("import sys, time; from experiments.common import workdir_lock as w\n"
          f"s = w.LocalStore() if {store.settle_s == 0} else w.GfileStore(settle_s=0.05)\n"
          "w.WorkdirLock(sys.argv[1], run_id='old-run', store=s).acquire()\n"
          "print('HELD', flush=True); time.sleep(600)\n")
  holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
  try:
    assert holder.stdout.readline().strip() == "HELD"
    with pytest.raises(config_utils.WorkdirError, match=r"belongs to run old-run .*pid "
                       rf"{holder.pid}, started"):
      _lock(tmp_path, store, run_id="new-run").acquire()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert workdir_lock.read_lock(str(tmp_path), store)["pid"] == holder.pid   # left behind
  with caplog.at_level("WARNING"):
    with _lock(tmp_path, store, run_id="new-run"):
      assert workdir_lock.read_lock(str(tmp_path), store)["run_id"] == "new-run"
  assert re.search(rf"taking it over from run old-run \(host \S+, pid {holder.pid}\): its process "
                   rf"{holder.pid} on \S+ is gone", caplog.text), caplog.text


def _write_holder(workdir, store, **fields):
  record = {"host": "other-host", "pid": 1, "run_id": "other-run", "started": 0.0,
            "heartbeat": 0.0, "token": "theirs"}
  record.update(fields)
  store.replace(f"{workdir}/run.lock", json.dumps(record))
  return record


def test_a_lock_with_an_old_heartbeat_is_taken_over_and_a_fresh_one_is_not(tmp_path, store, caplog):
  clock = Clock()
  # Another host (its pid means nothing here), heartbeat 599 s ago: still alive.
  _write_holder(tmp_path, store, heartbeat=clock.t - 599, started=clock.t - 3600)
  with pytest.raises(config_utils.WorkdirError, match=r"run other-run \(host other-host, pid 1, "
                     r"started .*, last heartbeat 599 s ago"):
    _lock(tmp_path, store, clock=clock, stale_after_s=600).acquire()
  clock.t += 2                        # 601 s: gone
  with caplog.at_level("WARNING"):
    lock = _lock(tmp_path, store, clock=clock, stale_after_s=600).acquire()
  assert "its last heartbeat is 601 s old (> 600 s)" in caplog.text
  assert workdir_lock.read_lock(str(tmp_path), store)["token"] == lock.token
  lock.release()


def test_the_same_run_relaunched_takes_its_lock_over(tmp_path, store, caplog):
  """launch/pod.sh --watch relaunches keep PODLAB_RUN_ID: the lock a killed attempt left is ours."""
  clock = Clock()
  _write_holder(tmp_path, store, run_id="run-7", heartbeat=clock.t - 1)
  with caplog.at_level("WARNING"):
    with _lock(tmp_path, store, run_id="run-7", clock=clock):
      pass
  assert "it is this run (run-7) started again" in caplog.text
  _write_holder(tmp_path, store, run_id=None, heartbeat=clock.t - 1)   # unknown ids never match
  with pytest.raises(config_utils.WorkdirError):
    _lock(tmp_path, store, run_id=None, clock=clock).acquire()


def test_release_deletes_only_our_own_lock(tmp_path, store):
  clock = Clock()
  first = _lock(tmp_path, store, run_id="first", clock=clock, heartbeat_s=1000,
                stale_after_s=2000).acquire()
  clock.t += 2001                     # first's heartbeat looks stale: a second run takes it over
  second = _lock(tmp_path, store, run_id="second", clock=clock, heartbeat_s=1000,
                 stale_after_s=2000).acquire()
  first.release()                     # must not delete second's lock
  assert workdir_lock.read_lock(str(tmp_path), store)["run_id"] == "second"
  second.release()
  assert workdir_lock.read_lock(str(tmp_path), store) is None
  second.release()                    # idempotent


def test_the_heartbeat_renews_the_lock_and_notices_when_it_is_lost(tmp_path, store):
  clock = Clock()
  lock = _lock(tmp_path, store, clock=clock, heartbeat_s=0.05, stale_after_s=1)
  lock.acquire()
  try:
    beats = []
    for _ in range(3):
      clock.t += 10
      deadline = time.monotonic() + 30
      while workdir_lock.read_lock(str(tmp_path), store)["heartbeat"] != clock.t:
        assert time.monotonic() < deadline, "the heartbeat thread did not renew the lock"
        time.sleep(0.01)
      beats.append(workdir_lock.read_lock(str(tmp_path), store)["heartbeat"])
    assert beats == [1_800_000_010.0, 1_800_000_020.0, 1_800_000_030.0]
    assert workdir_lock.read_lock(str(tmp_path), store)["started"] == 1_800_000_000.0
    lock.check()                      # still ours
    # Another run overwrote the lock (two runs on one workdir despite everything): detected.
    _write_holder(tmp_path, store, run_id="intruder", host="h2", pid=99)
    deadline = time.monotonic() + 30
    while lock.lost is None:
      assert time.monotonic() < deadline, "the heartbeat did not notice the lost lock"
      time.sleep(0.01)
    with pytest.raises(config_utils.WorkdirError, match=r"lost its lock .* to run intruder "
                       r"\(host h2, pid 99\)"):
      lock.check()
  finally:
    lock.release()
  assert workdir_lock.read_lock(str(tmp_path), store)["run_id"] == "intruder"   # not deleted


def test_a_reader_never_sees_a_half_written_lock(tmp_path, store):
  """A heartbeat replaces the lock while other processes read it: every read is a whole record.
  (tf.io.gfile truncates then writes on local paths and HDFS; a reader in between saw an empty
  lock, i.e. "free".)"""
  import threading  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / workdir_lock.LOCK_NAME)
  store.replace(path, json.dumps({"n": 0, "pad": "x" * 4096}))
  torn, done = [], threading.Event()

  def read_loop():
    while not done.is_set():
      text = store.read(path)
      if text is None or not text.endswith("}"):
        torn.append(text)

  reader = threading.Thread(target=read_loop)
  reader.start()
  try:
    for n in range(1, 301):
      store.replace(path, json.dumps({"n": n, "pad": "x" * 4096}))
  finally:
    done.set()
    reader.join()
  assert torn == []
  assert json.loads(store.read(path))["n"] == 300
  assert os.listdir(tmp_path) == [workdir_lock.LOCK_NAME]     # no temporary files left behind


def test_gs_protocol_loses_to_a_concurrent_writer(tmp_path):
  """gs:// has no create-if-absent: when another run's lease lands during the settle time, the
  read-back sees it and this run raises instead of training next to it."""

  class RacingStore(workdir_lock.GfileStore):
    def replace(self, path, text):
      super().replace(path, text)
      if json.loads(text)["run_id"] == "loser":     # the other run writes right after us
        _write_holder(tmp_path, workdir_lock.GfileStore(), run_id="winner", heartbeat=time.time())

  with pytest.raises(config_utils.WorkdirError, match="belongs to run winner"):
    WorkdirLock(str(tmp_path), run_id="loser", store=RacingStore(settle_s=0.01)).acquire()
  assert workdir_lock.read_lock(str(tmp_path))["run_id"] == "winner"


def _race(args):
  workdir, i = args
  try:
    WorkdirLock(workdir, run_id=f"racer-{i}", heartbeat_s=30, stale_after_s=600).acquire()
    time.sleep(1.0)                   # hold it while the others try
    return i
  except config_utils.WorkdirError:
    return None


def test_racing_processes_on_one_host_exactly_one_wins(tmp_path):
  with multiprocessing.get_context("spawn").Pool(4) as pool:
    winners = [w for w in pool.map(_race, [(str(tmp_path), i) for i in range(4)]) if w is not None]
  assert len(winners) == 1, winners


def test_store_for_picks_by_path():
  assert isinstance(workdir_lock.store_for("gs://bucket/run"), workdir_lock.GfileStore)
  assert isinstance(workdir_lock.store_for("/tmp/run"), workdir_lock.LocalStore)
  with pytest.raises(ValueError, match="stale_after_s=100 must be at least twice heartbeat_s=60"):
    WorkdirLock("/tmp/x", run_id=None, stale_after_s=100, heartbeat_s=60)


# ---------------------------------------------------------------------------------------------------
# The config fingerprint

BASE = {"lr": 1e-3, "total_steps": 6, "model.hidden_size": 32, "model.dims": (1, 2),
        "dataset.data_dir": "/data/a", "dataset.name": "sudoku", "note": None,
        "allow_config_change": False}


def test_first_start_stores_the_config_and_an_unchanged_resume_passes(tmp_path, store):
  assert workdir_lock.check_config(str(tmp_path), BASE, allow_change=False, store=store) == []
  stored = json.loads((tmp_path / "run_config.json").read_text())
  assert stored == {**BASE, "model.dims": [1, 2]}
  assert workdir_lock.check_config(str(tmp_path), dict(BASE), allow_change=False, store=store) == []


def test_a_changed_config_on_resume_is_refused_listing_every_change(tmp_path, store):
  workdir_lock.check_config(str(tmp_path), BASE, allow_change=False, store=store)
  new = dict(BASE, lr=0.5, total_steps=9, seed=3)
  del new["note"]
  with pytest.raises(config_utils.ConfigError) as e:
    workdir_lock.check_config(str(tmp_path), new, allow_change=False, store=store)
  assert e.value.field == "allow_config_change"
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"config.allow_config_change=False: {tmp_path} holds a run started "
                            "with another config (4 changes: lr: 0.001 -> 0.5; note: None -> "
                            "(absent); seed: (absent) -> 3; total_steps: 6 -> 9; the first config "
                            f"is in {tmp_path}/run_config.json). Fix: ")
  assert "--config.allow_config_change=True" in message
  assert json.loads((tmp_path / "run_config.json").read_text())["lr"] == 1e-3     # unchanged


def test_allow_change_logs_each_change_and_updates_the_stored_config(tmp_path, store, caplog):
  workdir_lock.check_config(str(tmp_path), BASE, allow_change=False, store=store)
  new = dict(BASE, lr=0.5, allow_config_change=True)
  with caplog.at_level("WARNING"):
    changes = workdir_lock.check_config(str(tmp_path), new, allow_change=True, store=store)
  assert changes == [ConfigChange("lr", 1e-3, 0.5)]
  assert "config change on resume (allow_config_change): lr: 0.001 -> 0.5" in caplog.text
  assert json.loads((tmp_path / "run_config.json").read_text())["lr"] == 0.5
  # The next resume compares with the updated config.
  assert workdir_lock.check_config(str(tmp_path), dict(new, allow_config_change=False),
                                   allow_change=False, store=store) == []


def test_ignored_fields_change_freely():
  old = dict(BASE)
  new = dict(BASE, **{"dataset.data_dir": "/data/b", "model.hidden_size": 64})
  assert workdir_lock.diff_configs(old, new, ignore=["dataset.data_dir"]) == [
      ConfigChange("model.hidden_size", 32, 64)]
  assert workdir_lock.diff_configs(old, new, ignore=["dataset", "model"]) == []   # sub-fields
  assert workdir_lock.diff_configs(old, new, ignore=["model.h"]) == [               # not a prefix
      ConfigChange("dataset.data_dir", "/data/a", "/data/b"),
      ConfigChange("model.hidden_size", 32, 64)]
  assert str(ConfigChange("x", ABSENT, "a")) == "x: (absent) -> 'a'"


def test_flatten_gives_the_dotted_fields_of_a_config():
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"lr": 0.1, "model": {"dims": (1, 2), "act": "gelu"},
                                      "data": {"kwargs": {"n": 3}}, "none": None})
  assert workdir_lock.flatten(config) == {"lr": 0.1, "model.dims": [1, 2], "model.act": "gelu",
                                          "data.kwargs.n": 3, "none": None}
  assert workdir_lock.flatten(ml_collections.FrozenConfigDict(config)) == workdir_lock.flatten(config)


def test_the_module_synopsis_runs(capsys):
  doc = workdir_lock.__doc__.partition("Synopsis:")[2]
  lines = []
  for line in doc.splitlines()[1:]:
    if line and not line.startswith("  "):
      break
    lines.append(line)
  exec(compile(textwrap.dedent("\n".join(lines)), "<synopsis>", "exec"), {})  # pylint: disable=exec-used
  assert capsys.readouterr().out == "None\n"
