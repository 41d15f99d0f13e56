"""A run's workdir: its layout, and the one place that writes and reads its JSON files.

A workdir (a local path or gs://...) belongs to one run (see experiments/common/workdir_lock.py):

  <workdir>/
    checkpoints/<step>/      orbax checkpoints (experiments/common/checkpointing.py); its
                             replicated/ item holds the state every device shares
    events.out.tfevents.*    TensorBoard scalars, hparams and texts (CLU writers, process 0)
    evals.json               every evaluation so far: {step: {evaluator: {metric: value}}}
    final_eval.json          the final evaluation: {"step": N, evaluator: metrics, ...}
    eval_results.json        what `--mode=eval` measured (no training)
    <experiment files>       e.g. TRM's arc_eval/ and submission.json, nanoGPT's model_args.json

Every JSON file is written by process 0 only, atomically (a temporary file, then a rename), so a
kill never leaves half a file; readers accept local paths and gs://.

Synopsis:

  import tempfile
  from experiments.common import workdir
  w = workdir.Workdir(tempfile.mkdtemp())
  workdir.write_json(w.final_eval, {"step": 10, "test": {"accuracy": 0.5}})
  workdir.read_json(w.final_eval)["test"]["accuracy"]        # 0.5
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Optional

import jax

from experiments.common import errors
from experiments.common import lazy_import

tf = lazy_import.module("tensorflow")   # tf.io.gfile, on the first file operation (lazy_import)


@dataclasses.dataclass(frozen=True)
class Workdir:
  """The paths of one workdir (no I/O until used)."""
  root: str

  def path(self, *parts: str) -> str:
    return "/".join([self.root.rstrip("/")] + [p.strip("/") for p in parts])

  @property
  def checkpoints(self) -> str:
    return self.path("checkpoints")

  def checkpoint(self, step: int) -> str:
    """One step's checkpoint folder (complete only when checkpointing.find_checkpoint says so)."""
    return self.path("checkpoints", str(step))

  def replicated(self, step: int) -> str:
    """The `replicated` item of one step's checkpoint (for checkpointing.read_tree)."""
    return self.path("checkpoints", str(step), "replicated")

  @property
  def evals(self) -> str:
    return self.path("evals.json")

  @property
  def final_eval(self) -> str:
    return self.path("final_eval.json")

  @property
  def eval_results(self) -> str:
    return self.path("eval_results.json")

  @property
  def profile(self) -> str:
    return self.path("profile")


def exists(path: str) -> bool:
  return tf.io.gfile.exists(path)


def write_json(path: str, payload: Any, *, every_process: bool = False,
               compact: bool = False) -> None:
  """Writes JSON atomically (a temporary file, then a rename); local paths or gs://.

  Process 0 only, unless `every_process` (each host writes its own file, e.g. ARC votes_<i>.json).
  """
  text = (json.dumps(payload, separators=(",", ":")) if compact
          else json.dumps(payload, indent=2, sort_keys=True))
  write_text(path, text, every_process=every_process)


def write_text(path: str, text: str, *, every_process: bool = False) -> None:
  """Writes `text` atomically, as `write_json` (e.g. a JSONL file rewritten as it grows)."""
  if jax.process_index() != 0 and not every_process:
    return
  tmp = f"{path}.tmp{jax.process_index()}"
  try:
    parent = path.rpartition("/")[0]
    if parent:
      tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)
  except (tf.errors.OpError, OSError) as e:
    message = (getattr(e, "message", None) or str(e)).strip()
    raise errors.WorkdirError(
        f"cannot write {path} ({type(e).__name__}: {message}). Fix: free space or fix the "
        "permissions of the workdir; the checkpoints already written there are intact") from None


def read_json(path: str) -> Dict[str, Any]:
  """The JSON object at `path` (local or gs://); errors.WorkdirError when it is missing or broken."""
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  except tf.errors.NotFoundError:
    raise errors.WorkdirError(f"{path} does not exist. Fix: check the --workdir") from None
  except json.JSONDecodeError as e:
    raise errors.WorkdirError(f"{path} is not valid JSON ({e}). Fix: delete it; it is rewritten "
                              "by the next run") from None


def read_json_if_exists(path: str) -> Optional[Dict[str, Any]]:
  return read_json(path) if exists(path) else None


def check_writable(root: str) -> None:
  """Creates `root` (local path or gs://...) and proves it is writable, before any compute.

  Writes and deletes a small probe file (per process, so every host checks its own access).
  Raises errors.WorkdirError with the path, the underlying error and the fix.
  """
  probe = f"{root.rstrip('/')}/.podlab-write-probe-{jax.process_index()}"
  try:
    tf.io.gfile.makedirs(root)
    with tf.io.gfile.GFile(probe, "w") as f:
      f.write("ok")
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    message = getattr(e, "message", None) or str(e)
    raise errors.WorkdirError(
        f"--workdir={root!r}: cannot write there ({type(e).__name__}: {message.strip()}). Fix: "
        "pass a writable local path or a gs:// bucket path you can write to") from None


def remove_if_empty(root: str) -> None:
  """Deletes `root` if a run that failed before starting left nothing in it but empty folders
  (process 0)."""
  if jax.process_index() != 0:
    return
  try:
    if not tf.io.gfile.isdir(root):
      return
    for _, _, files in tf.io.gfile.walk(root):
      if files:
        return
    tf.io.gfile.rmtree(root)
  except (tf.errors.OpError, OSError):
    pass
