"""A training run's claim on its workdir, before any compute, and what a failed start leaves.

  with cleanup_on_bad_input(root, existed):          bad input before the start: no empty
    with claim(workdir.Workdir(root), config) as lock:  workdir left; the lock (process 0, with a
      ...                                             heartbeat) and the config fingerprint
                                                      check, agreed by every process

The lock and the fingerprint are experiments/common/workdir_lock.py's; this module is the trainer's
use of them: a resume may change only RESUME_FREE_FIELDS without --config.allow_config_change,
and every process of a multi-process run raises alike (`agree`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from experiments.common import console
from experiments.common import errors
from experiments.common import workdir as workdir_lib
from experiments.common import workdir_lock


RESUME_FREE_FIELDS = ("dataset.data_dir", "dataset.manual_dir", "dataset.prepare_if_missing",
                      "log_every_steps", "profile_steps", "async_checkpoints", "keep_checkpoints",
                      "restore_fallback", "peak_flops", "target", "final_eval", "init_from",
                      "sharding", "model.attention", "model.loss", "model.mlp")
"""Config fields a resume may change without --config.allow_config_change: where the data lives,
what is logged or kept, how checkpoints are written, init_from (a resume starts from the
workdir's own checkpoint) and the state layout (the same numbers to float32 rounding).
Everything else (learning rate, steps, model, batch...) changes the run."""


def agree(ok: bool, error: Optional[BaseException], what: str) -> None:
  """Process 0 decided (`ok`, its `error`); every process raises alike (multi-process runs)."""
  if jax.process_count() > 1:
    ok = bool(multihost_utils.broadcast_one_to_all(np.int32(ok)))
  if not ok:
    raise error if error is not None else errors.WorkdirError(
        f"{what} (process 0 reports why, see its log)")


@contextlib.contextmanager
def claim(wd: workdir_lib.Workdir, config: ml_collections.ConfigDict):
  """The workdir's lock (process 0 holds it, with a heartbeat) and the config fingerprint check,
  before any compute; released when the run ends, whatever way."""
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = workdir_lock.WorkdirLock(wd.root, run_id=os.environ.get("PODLAB_RUN_ID") or None)
      lock.acquire()
      changes = workdir_lock.check_config(wd.root, workdir_lock.flatten(config.to_dict()),
                                          allow_change=bool(config.allow_config_change),
                                          ignore=RESUME_FREE_FIELDS)
      for change in changes:
        console.say(f"config change on resume (allow_config_change): {change}")
    except errors.USER_ERRORS as e:
      error = e
      if lock is not None:
        lock.release()
        lock = None
  agree(error is None, error, f"the workdir {wd.root} cannot be used")
  try:
    yield lock
  finally:
    if lock is not None:
      lock.release()


@contextlib.contextmanager
def cleanup_on_bad_input(root: str, existed: bool):
  """A run that fails on bad input before it starts leaves no empty workdir behind."""
  try:
    yield
  except errors.USER_ERRORS:
    if not existed:
      workdir_lib.remove_if_empty(root)
    raise
