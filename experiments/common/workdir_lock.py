"""A workdir belongs to one run: an ownership lock with a heartbeat, and the config fingerprint.

Two runs writing checkpoints into one workdir destroy each other's work, and a resume with another
config silently mixes two experiments. Process 0 of a trainer therefore, before any compute:

  1. takes the workdir's lock (`WorkdirLock`): `<workdir>/run.lock`, JSON naming the holder (host,
     pid, run id, start time, last heartbeat), renewed by a heartbeat thread while the run lives and
     deleted when it ends. A second run stops with `config_utils.WorkdirError` naming the holder and
     the fix. A lock whose holder is gone (same host and its pid dead, or a heartbeat older than
     `stale_after_s`) or that the same run id holds (the run relaunched after a preemption:
     `launch/pod.sh --watch` keeps PODLAB_RUN_ID) is taken over, with a log line.
  2. compares the resolved config with the one stored at the first start (`check_config`,
     `<workdir>/run_config.json`): a difference raises `config_utils.ConfigError` listing each
     changed field `old -> new`, unless `allow_change` (each change logged, the stored config
     updated).

Both are plain file operations (no JAX, no collectives): only process 0 calls them, and the trainer
broadcasts the outcome to the other processes. Local paths and gs:// (or any tf.io.gfile URL) work.

Synopsis:

  import tempfile
  from experiments.common import workdir_lock

  workdir = tempfile.mkdtemp()
  config = {"lr": 1e-3, "model": {"depth": 2}}           # a ConfigDict in a trainer
  with workdir_lock.WorkdirLock(workdir, run_id="run-1", heartbeat_s=60):
    workdir_lock.check_config(workdir, workdir_lock.flatten(config), allow_change=False)
    ...                                           # train; the heartbeat thread renews the lock
  print(workdir_lock.read_lock(workdir))          # None: released

Atomicity. Local paths: the lock file appears with its whole content in one step (written to a
temporary file, then `os.link`ed to `run.lock`, which fails when it exists: create-if-absent, the
O_EXCL guarantee, also on NFS), and take-over and release run under an `flock` on
`<workdir>/.run.lock.guard`, so two processes of one host never both win. gs://: tf.io.gfile offers
no create-if-absent (GCS's `ifGenerationMatch=0` precondition is not exposed), so the lock relies on
what GCS guarantees, that an object write is atomic and that a read after a write returns it
(strong consistency): it writes its lease, waits `settle_s` (default 2 s), reads it back and holds
it only if the lease read is its own (the last writer wins; the other one raises). Two runs whose
writes land more than `settle_s` apart cannot both win; every heartbeat re-reads the lease, so a
run that lost it anyway finds out at its next renewal (`lost`, `check()` raises).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from absl import logging

from experiments.common import config_utils

LOCK_NAME = "run.lock"
CONFIG_NAME = "run_config.json"
ALWAYS_IGNORED = ("allow_config_change",)
"""Config fields never compared: the flag that allows the change is not itself a change."""


# ---------------------------------------------------------------------------------------------------
# Storage: the few file operations the lock needs, for local paths and for tf.io.gfile URLs.

class LocalStore:
  """Local files: create-if-absent with os.link, atomic replace with os.replace, an flock guard."""

  settle_s = 0.0

  def read(self, path: str) -> Optional[str]:
    try:
      with open(path) as f:
        return f.read()
    except FileNotFoundError:
      return None

  def _write_temp(self, path: str, text: str) -> str:
    tmp = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    return tmp

  def create(self, path: str, text: str) -> bool:
    """Writes `path` only if it does not exist; True when this call created it."""
    tmp = self._write_temp(path, text)
    try:
      os.link(tmp, path)
      return True
    except FileExistsError:
      return False
    finally:
      os.unlink(tmp)

  def replace(self, path: str, text: str) -> None:
    os.replace(self._write_temp(path, text), path)

  def delete(self, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(path)

  def makedirs(self, path: str) -> None:
    os.makedirs(path, exist_ok=True)

  @contextlib.contextmanager
  def guard(self, directory: str):
    """Serialises lock decisions of the processes of this host (an flock, released at exit)."""
    import fcntl  # pylint: disable=g-import-not-at-top  (POSIX only)
    with open(os.path.join(directory, ".run.lock.guard"), "a") as f:
      fcntl.flock(f, fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(f, fcntl.LOCK_UN)


class GfileStore:
  """tf.io.gfile (gs:// and other URLs): whole-object writes, no create-if-absent (module doc)."""

  def __init__(self, settle_s: float = 2.0):
    self.settle_s = settle_s

  @staticmethod
  def _gfile():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (heavy; only gs:// needs it)
    return tf.io.gfile

  def read(self, path: str) -> Optional[str]:
    gfile = self._gfile()
    if not gfile.exists(path):
      return None
    try:
      with gfile.GFile(path, "r") as f:
        return f.read()
    except Exception as e:  # pylint: disable=broad-except  (tf.errors.NotFoundError: deleted meanwhile)
      if type(e).__name__ == "NotFoundError":
        return None
      raise

  def create(self, path: str, text: str) -> bool:
    if self._gfile().exists(path):
      return False
    self.replace(path, text)
    return True

  def replace(self, path: str, text: str) -> None:
    """Whole-content replace: a temporary object renamed over `path`. GCS writes an object
    atomically anyway; other gfile file systems (a local path, HDFS) truncate then write, and a
    reader between the two would see an empty lock."""
    gfile = self._gfile()
    tmp = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    with gfile.GFile(tmp, "w") as f:
      f.write(text)
    try:
      gfile.rename(tmp, path, overwrite=True)
    except Exception:
      with contextlib.suppress(Exception):
        gfile.remove(tmp)
      raise

  def delete(self, path: str) -> None:
    gfile = self._gfile()
    if gfile.exists(path):
      with contextlib.suppress(Exception):
        gfile.remove(path)

  def makedirs(self, path: str) -> None:
    self._gfile().makedirs(path)

  @contextlib.contextmanager
  def guard(self, directory: str):  # pylint: disable=unused-argument
    yield


def store_for(workdir: str):
  """LocalStore for a local path, GfileStore for a URL such as gs://bucket/dir."""
  return GfileStore() if "://" in workdir else LocalStore()


def _join(workdir: str, name: str) -> str:
  return f"{workdir.rstrip('/')}/{name}"


# ---------------------------------------------------------------------------------------------------
# The lock

def _iso(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:          # another user's process: alive
    return True
  return True


def run_name(run_id: Optional[str]) -> str:
  """How messages name a run: `run ID`, or what a run without an id is (started by hand: only
  launch/pod.sh and launch/local.sh give a run its PODLAB_RUN_ID)."""
  if run_id:
    return f"run {run_id}"
  return "a run without a run id (started without launch/pod.sh or launch/local.sh)"


def read_lock(workdir: str, store=None) -> Optional[Dict[str, Any]]:
  """The holder record of `workdir`'s lock, or None when it is free (or unreadable)."""
  store = store or store_for(workdir)
  text = store.read(_join(workdir, LOCK_NAME))
  if text is None:
    return None
  try:
    record = json.loads(text)
  except json.JSONDecodeError:
    return None
  return record if isinstance(record, dict) else None


class WorkdirLock:
  """Ownership of a workdir by one run (module doc). Use as a context manager, or acquire/release.

  Args:
    workdir: the run's --workdir (local path or gs://...).
    run_id: this run's id (launch/pod.sh and launch/local.sh export PODLAB_RUN_ID); None if unknown.
      A lock held by the same run id is taken over: that is this run, relaunched.
    stale_after_s: a lock whose heartbeat is older than this is taken over (its holder is gone).
    heartbeat_s: how often the heartbeat thread renews the lock; must be below stale_after_s / 2.
    store: how the lock file is read and written; default `store_for(workdir)`.
    clock: seconds since the epoch (tests pass a fake).
  """

  def __init__(self, workdir: str, *, run_id: Optional[str], stale_after_s: float = 600,
               heartbeat_s: float = 60, store=None, clock: Callable[[], float] = time.time):
    if heartbeat_s <= 0 or stale_after_s < 2 * heartbeat_s:
      raise ValueError(f"WorkdirLock: stale_after_s={stale_after_s} must be at least twice "
                       f"heartbeat_s={heartbeat_s} (> 0), or a live holder would look stale")
    self.workdir = workdir
    self.run_id = run_id
    self.stale_after_s = stale_after_s
    self.heartbeat_s = heartbeat_s
    self.store = store or store_for(workdir)
    self.clock = clock
    self.path = _join(workdir, LOCK_NAME)
    self.token = uuid.uuid4().hex
    self.host = socket.gethostname()
    self.pid = os.getpid()
    self.started = 0.0
    self.held = False
    self.lost: Optional[Dict[str, Any]] = None   # the record that replaced ours, if any
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._io = threading.Lock()

  # -- records -----------------------------------------------------------------------------------

  def _record(self) -> Dict[str, Any]:
    now = self.clock()
    return {"host": self.host, "pid": self.pid, "run_id": self.run_id, "started": self.started,
            "started_utc": _iso(self.started), "heartbeat": now, "heartbeat_utc": _iso(now),
            "token": self.token}

  def _stale_reason(self, holder: Mapping[str, Any]) -> Optional[str]:
    """Why `holder` no longer owns the workdir, or None when it does."""
    if self.run_id is not None and holder.get("run_id") == self.run_id:
      return f"it is this run ({self.run_id}) started again"
    if holder.get("host") == self.host and isinstance(holder.get("pid"), int):
      if not _pid_alive(holder["pid"]):
        return f"its process {holder['pid']} on {self.host} is gone"
    age = self.clock() - float(holder.get("heartbeat", 0))
    if age > self.stale_after_s:
      return f"its last heartbeat is {age:.0f} s old (> {self.stale_after_s:.0f} s)"
    return None

  def _held_error(self, holder: Mapping[str, Any]) -> config_utils.WorkdirError:
    age = self.clock() - float(holder.get("heartbeat", 0))
    return config_utils.WorkdirError(
        f"--workdir={self.workdir!r} belongs to {run_name(holder.get('run_id'))} (host "
        f"{holder.get('host')}, pid {holder.get('pid')}, started "
        f"{holder.get('started_utc') or _iso(float(holder.get('started', 0)))}, last heartbeat "
        f"{age:.0f} s ago; lock {self.path}). Fix: let that run finish or stop it "
        f"(launch/pod.sh NAME stop), or pass another --workdir; if that run is gone, delete "
        f"{self.path} (it is taken over by itself once its heartbeat is older than "
        f"{self.stale_after_s:.0f} s)")

  # -- acquire / release --------------------------------------------------------------------------

  def acquire(self) -> "WorkdirLock":
    """Takes the lock or raises config_utils.WorkdirError naming its holder; starts the heartbeat."""
    if self.held:
      return self
    self.store.makedirs(self.workdir)
    self.started = self.clock()
    with self.store.guard(self.workdir):
      for _ in range(3):
        if self.store.create(self.path, json.dumps(self._record())):
          break
        holder = read_lock(self.workdir, self.store)
        if holder is None:         # released (or unreadable) meanwhile: try again
          if self.store.read(self.path) is None:
            continue
          holder = {}
        reason = self._stale_reason(holder)
        if reason is None:
          raise self._held_error(holder)
        logging.warning("workdir lock %s: taking it over from %s (host %s, pid %s): %s",
                        self.path, run_name(holder.get("run_id")), holder.get("host"), holder.get("pid"),
                        reason)
        self.store.replace(self.path, json.dumps(self._record()))
        break
      else:
        raise config_utils.WorkdirError(
            f"--workdir={self.workdir!r}: could not create the lock {self.path} (it keeps "
            f"appearing and vanishing). Fix: check that no other run uses this workdir")
    if self.store.settle_s:
      time.sleep(self.store.settle_s)
    holder = read_lock(self.workdir, self.store)
    if holder is None or holder.get("token") != self.token:
      raise self._held_error(holder or {})
    self.held = True
    logging.info("workdir lock %s: held by %s (host %s, pid %d)", self.path, run_name(self.run_id),
                 self.host, self.pid)
    self._stop.clear()
    self._thread = threading.Thread(target=self._heartbeat_loop, name="workdir-lock-heartbeat",
                                    daemon=True)
    self._thread.start()
    return self

  def renew(self) -> bool:
    """One heartbeat: rewrites the lock with the current time if it is still ours. False (and
    `lost` set) when another run has replaced it."""
    with self._io:
      if not self.held:
        return False
      with self.store.guard(self.workdir):
        holder = read_lock(self.workdir, self.store)
        if holder is None or holder.get("token") != self.token:
          self.lost = holder or {"run_id": None, "host": None, "pid": None}
          self.held = False
          logging.error("workdir lock %s: no longer ours: now %s", self.path,
                        "deleted" if holder is None else
                        f"held by {run_name(holder.get('run_id'))} (host {holder.get('host')}, pid "
                        f"{holder.get('pid')})")
          return False
        self.store.replace(self.path, json.dumps(self._record()))
      return True

  def _heartbeat_loop(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        if not self.renew():
          return
      except Exception as e:  # pylint: disable=broad-except  (a flaky write: try at the next beat)
        logging.warning("workdir lock %s: heartbeat failed (%s: %s); retrying in %.0f s",
                        self.path, type(e).__name__, e, self.heartbeat_s)

  def check(self) -> None:
    """Raises config_utils.WorkdirError when the lock was lost (call before writing checkpoints)."""
    if self.lost is not None:
      raise config_utils.WorkdirError(
          f"--workdir={self.workdir!r}: this run ({run_name(self.run_id)}) lost its lock {self.path} "
          f"to {run_name(self.lost.get('run_id'))} (host {self.lost.get('host')}, pid "
          f"{self.lost.get('pid')}). Fix: two runs share the workdir; stop one of them")

  def release(self) -> None:
    """Stops the heartbeat and deletes the lock if it is still ours (never another run's)."""
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join()
    self._thread = None
    with self._io:
      if not self.held:
        return
      self.held = False
      with self.store.guard(self.workdir):
        holder = read_lock(self.workdir, self.store)
        if holder is not None and holder.get("token") == self.token:
          self.store.delete(self.path)
          logging.info("workdir lock %s: released", self.path)
        else:
          logging.warning("workdir lock %s: not deleted: it is now %s", self.path,
                          "gone" if holder is None else f"{run_name(holder.get('run_id'))}'s")

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc_info) -> None:
    self.release()


# ---------------------------------------------------------------------------------------------------
# The config fingerprint

ABSENT = object()
"""`old` of a field added since the first start, `new` of a field removed."""


@dataclasses.dataclass(frozen=True)
class ConfigChange:
  field: str
  old: Any
  new: Any

  def __str__(self) -> str:
    show = lambda v: "(absent)" if v is ABSENT else repr(v)  # noqa: E731
    return f"{self.field}: {show(self.old)} -> {show(self.new)}"


def flatten(config: Any, prefix: str = "") -> Dict[str, Any]:
  """A nested config (ConfigDict, FrozenConfigDict or dict) as {"a.b": value}, the form
  `check_config` stores; tuples become lists, other leaves stay as they are."""
  out: Dict[str, Any] = {}
  for key, value in config.items():
    field = f"{prefix}{key}"
    if hasattr(value, "items") and callable(value.items):
      out.update(flatten(value, field + "."))
    else:
      out[field] = list(value) if isinstance(value, tuple) else value
  return out


def _normalize(value: Any) -> Any:
  """JSON's view of a value (tuples become lists), so that stored and new values compare."""
  return json.loads(json.dumps(value))


def _ignored(field: str, ignore: Tuple[str, ...]) -> bool:
  return any(field == p or field.startswith(p + ".") for p in ignore)


def diff_configs(old: Mapping[str, Any], new: Mapping[str, Any],
                 ignore: Iterable[str] = ()) -> List[ConfigChange]:
  """Fields that differ between two flat configs (`a.b` -> value), sorted; `ignore` entries (and
  their sub-fields `entry.*`) and ALWAYS_IGNORED are left out."""
  skip = tuple(ignore) + ALWAYS_IGNORED
  changes = []
  for field in sorted(set(old) | set(new)):
    if _ignored(field, skip):
      continue
    a, b = old.get(field, ABSENT), new.get(field, ABSENT)
    if a is ABSENT or b is ABSENT or _normalize(a) != _normalize(b):
      changes.append(ConfigChange(field, a, b))
  return changes


def check_config(workdir: str, flat_config: Mapping[str, Any], *, allow_change: bool,
                 ignore: Iterable[str] = (), store=None) -> List[ConfigChange]:
  """Stores the resolved config at a workdir's first start; on a resume, compares with it.

  Args:
    workdir: the run's --workdir (local path or gs://...).
    flat_config: the resolved config, flat: {"model.hidden_size": 512, "lr": 1e-4, ...}; values
      JSON scalars (or lists of them).
    allow_change: accept differences: each is logged and the stored config is updated.
    ignore: fields that may change freely (and their sub-fields), e.g. ("dataset.data_dir",).

  Returns:
    The differences found (empty at the first start and on an unchanged resume).

  Raises:
    config_utils.ConfigError (field `allow_config_change`) listing every change `old -> new`, when
    the config differs and allow_change is False.
  """
  store = store or store_for(workdir)
  path = _join(workdir, CONFIG_NAME)
  new = {k: _normalize(v) for k, v in flat_config.items()}
  text = store.read(path)
  if text is None:
    store.makedirs(workdir)
    store.replace(path, json.dumps(new, indent=1, sort_keys=True))
    logging.info("config fingerprint: %d fields stored in %s", len(new), path)
    return []
  old = json.loads(text)
  changes = diff_configs(old, new, ignore)
  if changes and not allow_change:
    raise config_utils.ConfigError(
        "allow_config_change", False,
        f"{workdir} holds a run started with another config ({len(changes)} change"
        f"{'s' if len(changes) != 1 else ''}: {'; '.join(map(str, changes))}; the first config is "
        f"in {path})",
        "resume with the same config, pass another --workdir for a new run, or pass "
        "--config.allow_config_change=True to continue this run with the changes")
  for change in changes:
    logging.warning("config change on resume (allow_config_change): %s", change)
  if old != new:
    store.replace(path, json.dumps(new, indent=1, sort_keys=True))
  return changes
