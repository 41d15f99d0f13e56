"""The one metrics path of podlab: CLU writers (TensorBoard on process 0) and periodic actions.

Metrics leave the devices once per log interval: steps return per-device SUMS (already `psum`med across
all devices), the loop adds them up on the device and reads them to the host only when it writes.

Synopsis:

  import tempfile
  from experiments.common import metrics
  writer = metrics.create_writer(tempfile.mkdtemp())
  acc = metrics.SumAccumulator()
  acc.add({"count": 2.0, "exact_accuracy": 1.0})
  acc.add({"count": 2.0, "exact_accuracy": 2.0})
  sums = acc.pop()                                  # {"count": 4.0, "exact_accuracy": 3.0}
  writer.write_scalars(10, metrics.ratios(sums, count_key="count", ratio_keys=["exact_accuracy"]))
  writer.flush()
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, Mapping, Optional

import jax
import numpy as np
from experiments.common import lazy_import
from experiments.common import parallel

# Imported where a writer is made or a file written (a training step needs neither: lazy_import).
tf = lazy_import.module("tensorflow")
metric_writers = lazy_import.module("clu.metric_writers")


def create_writer(workdir: str, *, asynchronous: bool = True) -> metric_writers.MetricWriter:
  """TensorBoard (+ log) writer on process 0; log-only elsewhere so hosts never write the same files."""
  return metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0, asynchronous=asynchronous)


class SumAccumulator:
  """Adds up dicts of device scalars without reading them to the host until `pop()`."""

  def __init__(self):
    self._sums: Optional[Dict[str, Any]] = None
    self.num_steps = 0

  def add(self, values: Mapping[str, Any]):
    self._sums = dict(values) if self._sums is None else jax.tree.map(
        lambda a, b: a + b, self._sums, dict(values))
    self.num_steps += 1

  def state(self, keys: Iterable[str]) -> Dict[str, Any]:
    """The running window as host values, to save in a checkpoint: {"sums": {k: float32 scalar for
    each of `keys` (0 when nothing was added)}, "steps": int32}. Reads the device values."""
    host = {} if self._sums is None else parallel.unreplicate(self._sums)
    sums = {}
    for k in keys:
      v = host.get(k)
      sums[k] = np.float32(0.0) if v is None else np.asarray(v, np.float32).reshape(-1)[0]
    return {"sums": sums, "steps": np.int32(self.num_steps)}

  def restore(self, state: Mapping[str, Any], local_device_count: int) -> None:
    """Continues a window saved by `state()`: the next `pop()` gives what it would have given had
    the run not been interrupted (same float32 additions in the same order)."""
    self.num_steps = int(state["steps"])
    self._sums = None if self.num_steps == 0 else {
        k: np.full((local_device_count,), v, np.float32) for k, v in state["sums"].items()}

  def pop(self) -> Dict[str, float]:
    """Host floats of the sums so far (replicated/per-device values are read once), then resets."""
    if self._sums is None:
      return {}
    host = parallel.unreplicate(self._sums)
    out = {k: float(np.sum(v)) if np.ndim(v) == 0 else float(np.asarray(v).reshape(-1)[0])
           for k, v in host.items()}
    self._sums, self.num_steps = None, 0
    return out


def ratios(sums: Mapping[str, float], *, count_key: str, ratio_keys: Iterable[str],
           divisors: Optional[Mapping[str, float]] = None, prefix: str = "") -> Dict[str, float]:
  """`sums[k] / sums[count_key]` for ratio_keys, `sums[k] / divisors[k]` for the others given."""
  count = max(float(sums.get(count_key, 0.0)), 1.0)
  out = {f"{prefix}{count_key}": float(sums.get(count_key, 0.0))}
  for k in ratio_keys:
    if k in sums:
      out[f"{prefix}{k}"] = float(sums[k]) / count
  for k, d in (divisors or {}).items():
    if k in sums:
      out[f"{prefix}{k}"] = float(sums[k]) / max(float(d), 1.0)
  return out


def write_json(path: str, payload: Mapping[str, Any]):
  """Writes JSON atomically (tmp file + rename) from process 0; local paths or gs://."""
  if jax.process_index() != 0:
    return
  tmp = f"{path}.tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(json.dumps(payload, indent=2, sort_keys=True))
  tf.io.gfile.rename(tmp, path, overwrite=True)


def format_table(rows: Mapping[str, Mapping[str, float]], columns: Iterable[str]) -> str:
  """A plain-text table: one row per name, one column per metric."""
  columns = list(columns)
  header = ["split"] + columns
  body = [[name] + [f"{vals.get(c, float('nan')):.4f}" for c in columns] for name, vals in rows.items()]
  widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
  line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths))
  return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])
