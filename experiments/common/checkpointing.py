"""Checkpoints for podlab trainers: the one checkpoint manager of the project (wraps orbax).

A checkpoint holds two pytrees:

* `replicated`: state identical on every device of every process (params, optimizer state, EMA,
  step, rng). Leaves may be numpy arrays/scalars, single-device jax arrays, fully replicated jax
  arrays, or pmap-stacked jax arrays `[local_device_count, ...]` whose rows are identical (the
  output of `jax.pmap`); only one copy is written (by process 0) and it comes back as host numpy
  *without* the pmap axis.
* `per_device`: host-local arrays `[local_device_count, ...]` that differ per device (e.g. the TRM
  ACT carry). They are saved as one global array `[process_count * local_device_count, ...]`
  sharded over all devices of all processes, so every host writes its own rows, and each host gets
  its own `[local_device_count, ...]` rows back on restore.

How each kind of leaf is copied, checked and restored: experiments/common/checkpoint_leaves.py.

The device counts (those leading axes, the topology a checkpoint records and checks on restore)
come from the run's `BatchLayout` (experiments/common/layout.py; the trainer passes its own), or
`layout.of_devices()` when none is given.

Synopsis (works unchanged on a laptop and on every host of a pod slice):

  import numpy as np
  from experiments.common import checkpointing, distributed, layout

  distributed.initialize()
  devices = layout.of_devices()              # a trainer passes its run's layout
  params = {"w": np.ones((3, 3), np.float32)}
  carry = {"z": np.zeros((devices.devices_per_host, 8), np.float32)}
  ckpt = checkpointing.CheckpointManager("/tmp/podlab_ckpt", layout=devices, max_to_keep=3,
                                         save_interval_steps=1000)
  ckpt.save(1000, replicated={"params": params, "step": np.int32(1000)}, per_device=carry)
  ckpt.save(1234, replicated={"params": params, "step": np.int32(1234)}, per_device=carry,
            force=True)                      # final / preemption save: ignores the interval
  step, replicated, per_device = ckpt.restore(
      replicated_like={"params": params, "step": np.int32(0)}, per_device_like=carry)
  ckpt.close()                               # waits for async writes; then distributed.finalize()

Atomicity: orbax writes step `N` into `N.orbax-checkpoint-tmp-<timestamp>/` and renames it to `N/`
once every host has finished (on `gs://`, where renames are not atomic, it writes
`N/commit_success.txt` last instead). A save interrupted by a crash or preemption therefore leaves
only a tmp directory (or, on GCS, a directory without the commit file), which `all_steps`,
`latest_step` and `restore` ignore; the previous complete checkpoint stays the latest. Leftover tmp
directories are kept unless `cleanup_tmp_directories=True` (off by default because it would also
delete a save in flight from another job sharing the directory, e.g. a trainer watched by an
evaluator).

A checkpoint that is complete but unreadable (files deleted or truncated, a different pytree
structure or shapes than the templates, a different device topology) raises `CheckpointError`
naming the checkpoint path; `restore_latest(..., fallback=True)` moves it aside instead and resumes
from the previous one.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from typing import Any, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_policies

from experiments.common import checkpoint_leaves as leaves
from experiments.common import errors
from experiments.common import layout as layout_lib
from experiments.common import lazy_import
from experiments.common import parallel

tf = lazy_import.module("tensorflow")   # tf.io.gfile, on the first file operation (lazy_import)

PyTree = Any

_REPLICATED = "replicated"
_PER_DEVICE = "per_device"
_META = "meta"
_FORMAT_VERSION = 1


CheckpointError = errors.CheckpointError


class CheckpointMismatch(errors.CheckpointError):
  """A complete checkpoint whose arrays do not match this run's (another model, batch or config)."""


MISMATCH_FIX = ("this workdir holds a run of another model or config. Fix: pass a new --workdir for "
                "this config, or go back to the config the workdir was written with (its "
                "run_config.json)")


def _is_url(directory: str) -> bool:
  return "://" in directory


def _step_dir(directory: str, step: int) -> str:
  return f"{directory.rstrip('/')}/{step}"


def write_tree(path: str, tree: PyTree, *, metadata: Optional[dict] = None,
               force: bool = False) -> None:
  """Saves a standalone pytree (numpy/jax leaves) at `path` with orbax, atomically (a tmp folder
  renamed when complete); `metadata` (JSON) is stored beside it. For converted weights, not runs:
  a run's checkpoints go through CheckpointManager."""
  ocp.PyTreeCheckpointer().save(path, tree, force=force, custom_metadata=metadata or {})


def read_tree(path: str, *, with_metadata: bool = False, target: Optional[PyTree] = None):
  """A pytree saved by `write_tree`, or one item folder of a run's checkpoint
  (`<workdir>/checkpoints/<step>/replicated`). Without `target`: numpy leaves. With `target` (a
  pytree of jax.ShapeDtypeStruct with shardings, the saved tree's structure), each array is read
  straight into its sharding and dtype (a saved dtype that differs is cast), never whole on the
  host. With `with_metadata`, returns (tree, metadata dict)."""
  if not tf.io.gfile.isdir(path):
    raise CheckpointError(f"{path}: no such checkpoint folder. Fix: check the path")
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    meta = checkpointer.metadata(path)
    if target is None:
      restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                  meta.item_metadata.tree)
      args = ocp.args.PyTreeRestore(restore_args=restore_args)
    else:
      args = ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))
    tree = checkpointer.restore(path, args=args)
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(f"{path} is not a readable orbax pytree ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}). Fix: point at a folder "
                          "written by podlab") from None
  if with_metadata:
    return tree, dict(meta.custom_metadata or {})
  return tree


def find_checkpoint(path: str) -> Optional[tuple[str, int]]:
  """(checkpoint directory, step) of the newest complete podlab checkpoint at `path`: a workdir, its
  `checkpoints/` folder, or one step's folder (`.../checkpoints/<step>`); None when `path` holds no
  podlab checkpoint (e.g. a file of another program's format)."""
  path = path.rstrip("/")
  if not tf.io.gfile.isdir(path):
    return None
  candidates = [(f"{path}/checkpoints", None), (path, None)]
  parent, _, last = path.rpartition("/")
  if last.isdigit():
    candidates.append((parent, int(last)))
  for directory, step in candidates:
    if not tf.io.gfile.isdir(directory):
      continue
    steps = sorted(int(name.rstrip("/")) for name in tf.io.gfile.listdir(directory)
                   if name.rstrip("/").isdigit()
                   and tf.io.gfile.exists(f"{directory}/{name.rstrip('/')}/{_META}"))
    if step is not None and step in steps:
      return directory, step
    if step is None and steps:
      return directory, steps[-1]
  return None


class CheckpointManager:
  """Saves and restores `(step, replicated, per_device)` checkpoints; see the module doc.

  All methods must be called by every process of the run (they synchronise internally).
  """

  def __init__(
      self,
      directory: str | os.PathLike[str],
      *,
      layout: Optional[layout_lib.BatchLayout] = None,
      max_to_keep: Optional[int] = 3,
      save_interval_steps: int = 1000,
      enable_async: bool = True,
      cleanup_tmp_directories: bool = False,
  ):
    """Opens (and creates) a checkpoint directory.

    Args:
      directory: local path (made absolute) or a `gs://` URL.
      layout: the run's devices (processes x devices per process: the per-device rows and the
        topology the metadata records); default `layout.of_devices()`, this run's devices.
      max_to_keep: newest checkpoints kept; older ones are deleted. None keeps all.
      save_interval_steps: `save` writes only when `step % save_interval_steps == 0` (or `force`:
        final and preemption saves).
      enable_async: write in a background thread; `save` returns once arrays are copied to host.
      cleanup_tmp_directories: delete leftover tmp dirs of interrupted saves on start-up.
    """
    directory = os.fspath(directory)
    if not _is_url(directory):
      directory = os.path.abspath(os.path.expanduser(directory))
    if save_interval_steps < 1:
      raise ValueError(f"save_interval_steps={save_interval_steps}: must be >= 1. Fix: pass a "
                       "positive interval (use force=True for one-off saves).")
    if max_to_keep is not None and max_to_keep < 1:
      raise ValueError(f"max_to_keep={max_to_keep}: must be >= 1 or None (keep all).")
    self._directory = directory
    self._layout = layout or layout_lib.of_devices()
    self._mesh = self._layout.rules.mesh()
    if self._mesh.shape[parallel.AXIS] != self._layout.devices:
      raise ValueError(f"layout of {self._layout.devices} devices ({self._layout.hosts} x "
                       f"{self._layout.devices_per_host}) but this run's mesh has "
                       f"{self._mesh.shape[parallel.AXIS]} on its {parallel.AXIS!r} axis. Fix: "
                       "pass the run's own layout (layout.batch_layout(config) or "
                       "layout.of_devices()).")
    self._sharding = NamedSharding(self._mesh, PartitionSpec(parallel.AXIS))
    options = ocp.CheckpointManagerOptions(
        # Preemption saves are forced by the trainer (experiments.common.preemption), which
        # agrees on the step across hosts; orbax's own preemption policy would race with it.
        save_decision_policy=ocp_policies.FixedIntervalPolicy(save_interval_steps),
        preservation_policy=ocp_policies.LatestN(n=max_to_keep),
        enable_async_checkpointing=enable_async,
        cleanup_tmp_directories=cleanup_tmp_directories,
        create=True,
    )
    self._manager = ocp.CheckpointManager(
        directory, options=options, item_names=(_REPLICATED, _PER_DEVICE, _META))
    logging.info("checkpointing: %s (max_to_keep=%s, every %d steps, async=%s), steps %s",
                 directory, max_to_keep, save_interval_steps, enable_async, self.all_steps())

  @property
  def directory(self) -> str:
    """The checkpoint directory (absolute path or URL)."""
    return self._directory

  def save(self, step: int, *, replicated: PyTree, per_device: PyTree, force: bool = False) -> bool:
    """Saves a checkpoint at `step` if the interval (or `force`) says so; returns whether it did.

    A step that already has a checkpoint is not overwritten (returns False).
    """
    step = int(step)
    if step < 0:
      raise ValueError(f"step={step}: must be >= 0.")
    if not force and not self._manager.should_save(step):
      return False
    if step in self.all_steps():
      logging.info("checkpointing: step %d already saved in %s; not saving again", step,
                   self._directory)
      return False
    replicated_np = jax.tree_util.tree_map_with_path(
        lambda p, x: leaves.replicated_to_numpy(leaves.keystr(_REPLICATED, p), x,
                                                self._layout.rules.split),
        replicated)
    per_device_global = jax.tree_util.tree_map_with_path(
        lambda p, x: leaves.to_global(leaves.keystr(_PER_DEVICE, p), x,
                                      self._layout.devices_per_host, self._layout.hosts,
                                      self._sharding), per_device)
    # Orbax refuses empty pytrees ("Found empty item"): leafless trees are not written at all.
    items = {}
    if jax.tree.leaves(replicated_np):
      items[_REPLICATED] = ocp.args.PyTreeSave(replicated_np)
    if jax.tree.leaves(per_device_global):
      items[_PER_DEVICE] = ocp.args.PyTreeSave(per_device_global)
    meta = {
        "format_version": _FORMAT_VERSION,
        "step": step,
        "process_count": self._layout.hosts,
        "local_device_count": self._layout.devices_per_host,
        "items": sorted(items),
    }
    items[_META] = ocp.args.JsonSave(meta)
    with self._disk_errors(step):
      saved = self._manager.save(
          step, args=ocp.args.Composite(**items), force=True)  # The interval was checked above.
    if saved:
      logging.info("checkpointing: saving step %d to %s", step, _step_dir(self._directory, step))
    return saved

  def restore(
      self,
      step: Optional[int] = None,
      *,
      replicated_like: PyTree,
      per_device_like: PyTree,
      restore_per_device: bool = True,
      partial: bool = False,
  ) -> Optional[tuple[int, PyTree, Optional[PyTree]]]:
    """Restores `(step, replicated, per_device)`, or returns None when there is no checkpoint.

    Args:
      step: the step to restore; default the newest complete checkpoint.
      replicated_like: template pytree (arrays, scalars or jax.ShapeDtypeStruct) fixing the
        structure and dtypes; pmap-stacked jax arrays count without their device axis. A
        ShapeDtypeStruct with a `sharding` restores as a jax.Array with that sharding (each
        process reads its blocks: the "fsdp" state), whichever layout saved it.
      per_device_like: template with leaves `[local_device_count, ...]`.
      restore_per_device: False skips the per-device state (returned as None), e.g. to resume on
        a different number of devices and re-initialise it.
      partial: `replicated_like` may name a subset of the saved tree (e.g. only {"state": ...}
        without the metric window): only that subset is read.

    Returns:
      `replicated` as host numpy arrays (or jax.Arrays where the template has a sharding); `per_device` as this process' `[local_device_count, ...]`
      host numpy rows.
    """
    self._manager.wait_until_finished()
    self._manager.reload()
    steps = self.all_steps()
    if step is None:
      if not steps:
        return None
      step = max(steps)
    step = int(step)
    path = _step_dir(self._directory, step)
    if step not in steps:
      raise CheckpointError(f"no complete checkpoint {path}; complete steps in "
                            f"{self._directory}: {sorted(steps)}. Fix: pass one of those steps.")
    try:
      meta = self._manager.restore(
          step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))[_META]
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"checkpoint {path} is corrupt or incomplete: cannot read its "
                            f"{_META} item ({type(e).__name__}: {e}).") from e

    saved_items = set(meta.get("items", (_REPLICATED, _PER_DEVICE)))

    def require(item: str) -> None:
      if item not in saved_items:
        raise CheckpointError(
            f"checkpoint {path} has no {item} state (it was saved empty) but {item}_like has "
            f"leaves. Fix: pass an empty {item}_like, or restore a checkpoint that has it.")

    args = {}
    rep_specs = jax.tree_util.tree_map_with_path(
        lambda p, x: leaves.replicated_spec(leaves.keystr(_REPLICATED, p), x), replicated_like)
    if jax.tree.leaves(rep_specs):
      require(_REPLICATED)
      args[_REPLICATED] = ocp.args.PyTreeRestore(
          rep_specs,
          restore_args=jax.tree.map(
              lambda s: (ocp.RestoreArgs(restore_type=np.ndarray, dtype=s.dtype)
                         if s.sharding is None else
                         ocp.ArrayRestoreArgs(sharding=s.sharding, global_shape=s.shape,
                                              dtype=s.dtype)), rep_specs),
          partial_restore=partial)
    hosts, local = self._layout.hosts, self._layout.devices_per_host
    pd_specs = None
    if restore_per_device:
      pd_specs = jax.tree_util.tree_map_with_path(
          lambda p, x: leaves.per_device_spec(leaves.keystr(_PER_DEVICE, p), x, local),
          per_device_like)
    if jax.tree.leaves(pd_specs):
      require(_PER_DEVICE)
      if meta["process_count"] * meta["local_device_count"] != hosts * local:
        raise CheckpointError(
            f"checkpoint {path} holds per-device state of {meta['process_count']} processes x "
            f"{meta['local_device_count']} devices, this run has {hosts} x {local}. "
            "Fix: restore with restore_per_device=False and re-initialise the per-device state.")
      global_specs = jax.tree.map(
          lambda s: jax.ShapeDtypeStruct((hosts * local,) + s.shape[1:], s.dtype,
                                         sharding=self._sharding), pd_specs)
      args[_PER_DEVICE] = ocp.args.PyTreeRestore(
          global_specs,
          restore_args=jax.tree.map(
              lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, global_shape=s.shape,
                                             dtype=s.dtype), global_specs))
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**args)) if args else {}
    except Exception as e:  # pylint: disable=broad-except
      text = str(e)
      if re.search(r"shape|[Ss]tructure|tree|key", text) and "corrupt" not in text.lower():
        raise CheckpointMismatch(
            f"checkpoint {path} does not match this run's arrays ({type(e).__name__}: "
            f"{text.splitlines()[0][:200] if text else ''}): {MISMATCH_FIX}") from e
      raise CheckpointError(
          f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: "
          f"{text.splitlines()[0][:200] if text else ''}). Fix: restore an older step from "
          f"{sorted(steps)}.") from e

    # Leafless templates ({}, None, ...) come back as given.
    replicated = replicated_like
    if _REPLICATED in args:
      replicated = restored[_REPLICATED]
      self._check_shapes(path, _REPLICATED, replicated, rep_specs)
    per_device = per_device_like if restore_per_device else None
    if _PER_DEVICE in args:
      per_device = jax.tree.map(leaves.to_local, restored[_PER_DEVICE])
      self._check_shapes(path, _PER_DEVICE, per_device, pd_specs)
    logging.info("checkpointing: restored step %d from %s", step, path)
    return step, replicated, per_device

  def restore_latest(
      self,
      *,
      replicated_like: PyTree,
      per_device_like: PyTree,
      fallback: bool = False,
  ) -> Optional[tuple[int, PyTree, Optional[PyTree]]]:
    """`restore()` of the newest complete checkpoint; None when there is none.

    When the newest one cannot be restored (corrupt, truncated, wrong structure), raises
    CheckpointError naming it, unless `fallback`: then that checkpoint is moved aside to
    `<step>.unreadable-<time>` (kept for inspection, ignored from then on, so a restart never
    loops on it) and the previous one is tried, and so on.
    """
    self._manager.wait_until_finished()
    self._manager.reload()
    steps = self.all_steps()
    for step in reversed(steps):
      result, error = None, None
      try:
        result = self.restore(step, replicated_like=replicated_like,
                              per_device_like=per_device_like)
      except CheckpointError as e:
        error = e
      if self._layout.hosts > 1:   # every host must agree, or they would resume differently
        ok = np.asarray(multihost_utils.process_allgather(np.int32(error is None))).reshape(-1)
        if error is None and not ok.all():
          error = CheckpointError(
              f"checkpoint {_step_dir(self._directory, step)} could not be restored on "
              f"process(es) {np.flatnonzero(ok == 0).tolist()} (see their logs).")
      if error is None:
        return result
      if isinstance(error, CheckpointMismatch):
        raise error          # every checkpoint of the workdir is another run's: no fallback helps
      if not fallback:
        raise CheckpointError(
            f"{error} To resume from the previous checkpoint instead, enable the fallback "
            "(trainers: --config.restore_fallback=True), which moves this one aside.") from error
      aside = self._set_aside(step)
      logging.warning("checkpointing: %s; moved it aside to %s and trying the previous one", error,
                      aside)
    if steps:
      raise CheckpointError(
          f"none of the checkpoints {steps} in {self._directory} could be restored; all were moved "
          "aside (*.unreadable-*). Fix: inspect them, or rerun to start from scratch.")
    return None

  def _set_aside(self, step: int) -> str:
    """Renames checkpoint `step` to `<step>.unreadable-<unix time>` (process 0; all wait)."""
    src = _step_dir(self._directory, step)
    stamp = int(time.time())
    if self._layout.hosts > 1:
      stamp = int(multihost_utils.broadcast_one_to_all(np.int32(stamp)))
    dest = f"{src}.unreadable-{stamp}"
    if jax.process_index() == 0:
      if _is_url(src):      # object stores have no directory rename: copy, then delete
        for root, _, files in tf.io.gfile.walk(src):
          rel = root[len(src):].lstrip("/")
          tf.io.gfile.makedirs(f"{dest}/{rel}" if rel else dest)
          for name in files:
            tf.io.gfile.copy(f"{root}/{name}", f"{dest}/{rel}/{name}" if rel else f"{dest}/{name}")
        tf.io.gfile.rmtree(src)
      else:
        os.rename(src, dest)
    if self._layout.hosts > 1:
      multihost_utils.sync_global_devices(f"podlab_set_aside_{step}")
    self._manager.reload()
    return dest

  @staticmethod
  def _check_shapes(path: str, item: str, restored: PyTree, specs: PyTree) -> None:
    def check(p, value, spec):
      dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype
      got, want = (tuple(np.shape(value)), dtype), (tuple(spec.shape), spec.dtype)
      if got != want:
        raise CheckpointMismatch(
            f"checkpoint {path}: {leaves.keystr(item, p)} has shape/dtype {got} but this run's is "
            f"{want}: {MISMATCH_FIX}")
    try:
      jax.tree_util.tree_map_with_path(check, restored, specs)
    except ValueError as e:  # Structure mismatch.
      raise CheckpointMismatch(f"checkpoint {path}: its {item} structure differs from this "
                               f"run's ({str(e).splitlines()[0][:200]}): {MISMATCH_FIX}") from e

  def latest_step(self) -> Optional[int]:
    """Newest saved step (None if none); a save still in flight counts once `save` returned."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """All saved steps, ascending (interrupted saves excluded)."""
    return sorted(self._manager.all_steps())

  def wait_until_finished(self) -> None:
    """Blocks until this process' async save (if any) is committed."""
    with self._disk_errors(None):
      self._manager.wait_until_finished()

  @contextlib.contextmanager
  def _disk_errors(self, step: Optional[int]):
    """A full disk (or a read-only one) while saving: errors.WorkdirError naming the directory, the
    free space and the newest complete checkpoint, instead of orbax's traceback."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      text = f"{type(e).__name__}: {e}"
      reasons = {"No space left": "no space left on the device", "ENOSPC": "no space left on the "
                 "device", "Read-only file system": "the file system is read-only",
                 "Disk quota exceeded": "the disk quota is exceeded"}
      reason = next((v for k, v in reasons.items() if k in text), None)
      if reason is None:
        raise
      free = ""
      if not _is_url(self._directory):
        try:
          free = f" ({shutil.disk_usage(self._directory).free / 2**20:.1f} MiB free)"
        except OSError:
          pass
      try:
        complete = [s for s in self._manager.all_steps() if s != step]
      except Exception:  # pylint: disable=broad-except
        complete = []
      intact = (f"the newest complete checkpoint is step {max(complete)}, intact" if complete
                else "no checkpoint was complete yet")
      failed = re.search(r"/checkpoints/(\d+)", text)     # the save that failed (async: an earlier one)
      if failed:
        step = int(failed.group(1))
      what = f"checkpoint {step}" if step is not None else "a checkpoint"
      raise errors.WorkdirError(
          f"cannot write {what} to {self._directory}: {reason}{free}; "
          f"{intact}. Fix: free space there (or pass another --workdir) and rerun the same "
          "command to resume") from None

  def close(self) -> None:
    """Waits for pending saves and releases resources; call before `distributed.finalize()`."""
    with self._disk_errors(None):
      self._manager.close()

  def __enter__(self) -> "CheckpointManager":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
