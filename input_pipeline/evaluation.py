"""Evaluation batches of one host (`create_eval_iterator`): no augmentation, split order, optional
seeded fixed subset; every host yields the same number of batches (`num_batches`, from the total
size), the last ones padded (inputs 0 = pad, labels -100, index -1) and marked by `mask` False.

Synopsis:
  from experiments.common import layout as layout_lib
  from input_pipeline import evaluation
  layout = layout_lib.batch_layout(config)
  ev = evaluation.create_eval_iterator("/tmp/tfds", "sudoku_generated", {"config": "medium"},
                                       layout=layout, subset_size=None)
  for batch in ev: ...                                         # ev.num_batches batches per host
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Optional

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline import pipeline
from input_pipeline import puzzles

Batch = pipeline.Batch


class EvalIterator:
  """Re-iterable eval batches of one host; every host yields `num_batches` batches.

  Attributes:
    num_batches: batches per pass (equal on every host).
    num_examples: real examples in the eval set over all hosts.
    num_local_examples: real examples of this host (the rest of its batches is padding).
  """

  def __init__(self, arrays: dict[str, np.ndarray], num_batches: int, num_examples: int,
               local_device_count: int, per_device: int,
               dtypes: Optional[Mapping[str, np.dtype]] = None):
    """`arrays` may be stored narrower than the batches' `dtypes` (default: as stored)."""
    self.num_batches = num_batches
    self._dtypes = {name: np.dtype((dtypes or {}).get(name, value.dtype))
                    for name, value in arrays.items()}
    self._dtypes["mask"] = np.dtype(bool)
    self.num_examples = num_examples
    self.num_local_examples = int(arrays["index"].shape[0])
    self._local_device_count = local_device_count
    self._per_device = per_device
    self._arrays = _pad_eval(arrays, num_batches * local_device_count * per_device)

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self) -> Iterator[Batch]:
    per_host = self._local_device_count * self._per_device
    for i in range(self.num_batches):
      sl = slice(i * per_host, (i + 1) * per_host)
      yield {name: value[sl].astype(self._dtypes[name], copy=False).reshape(
                 (self._local_device_count, self._per_device) + value.shape[1:])
             for name, value in self._arrays.items()}


def _pad_eval(arrays: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
  """Pad every feature to `size` rows and add `mask` (False on padding)."""
  n = int(arrays["index"].shape[0])
  pad_values = {"labels": puzzles.IGNORE_LABEL_ID, "index": -1}
  out = {}
  for name, value in arrays.items():
    pad = pad_values.get(name, 0)
    dtype = np.promote_types(value.dtype, np.min_scalar_type(pad))   # narrow storage: room for pad
    padded = np.full((size,) + value.shape[1:], pad, dtype)
    padded[:n] = value
    out[name] = padded
  out["mask"] = np.arange(size) < n
  return out


def eval_subset_indices(num_examples: int, subset_size: Optional[int],
                        subset_seed: int) -> np.ndarray:
  """Sorted split rows of the fixed eval subset (all rows when `subset_size` is None)."""
  if subset_size is None or subset_size >= num_examples:
    return np.arange(num_examples, dtype=np.int64)
  if subset_size < 0:
    raise ValueError(f"subset_size={subset_size} must be >= 0 or None")
  rng = np.random.default_rng(subset_seed)
  return np.sort(rng.choice(num_examples, size=subset_size, replace=False)).astype(np.int64)


def create_eval_iterator(
    data_dir: str,
    dataset_name: str,
    builder_kwargs: Optional[Mapping[str, Any]] = None,
    *,
    layout: Any,
    split: str = "test",
    subset_size: Optional[int] = None,
    subset_seed: int = 0,
) -> EvalIterator:
  """This host's eval batches of `split` (or of a seeded fixed subset of it), padded and masked.

  The full split is cut with `tfds.split_for_jax_process`; a subset (sorted rows drawn with
  `numpy.random.default_rng(subset_seed)`, the same on every host) is cut into contiguous
  near-equal chunks. Batches follow the split order.
  """
  per_device, local_device_count = layout.per_device_batch, layout.devices_per_host
  process_index, process_count = layout.process_index, layout.hosts
  builder = pipeline.prepared_builder(data_dir, dataset_name, builder_kwargs)
  total = builder.info.splits[split].num_examples
  if subset_size is None or subset_size >= total:
    num_examples = total
    arrays = pipeline.load_split(builder, tfds.split_for_jax_process(
        split, process_index=process_index, process_count=process_count), narrow=True)
  else:
    rows = np.array_split(eval_subset_indices(total, subset_size, subset_seed),
                          process_count)[process_index]
    num_examples = subset_size
    if rows.size:
      arrays = pipeline.load_split(builder, f"{split}[{int(rows[0])}:{int(rows[-1]) + 1}]",
                                   narrow=True)
      keep = np.isin(arrays["index"], rows)
      arrays = {name: value[keep] for name, value in arrays.items()}
    else:
      arrays = pipeline.empty_arrays(builder)
  batches = layout.eval_batches(num_examples)
  dtypes = {name: value.dtype for name, value in pipeline.empty_arrays(builder).items()}
  return EvalIterator(arrays, batches, num_examples, local_device_count, per_device, dtypes)
