"""tf.data input pipeline: per-host split, on-the-fly Sudoku augmentation, device-shaped batches.

This module: a host's examples loaded and its training streams. Evaluation batches are in
`evaluation`, a job's dataset (config -> builder -> these iterators) in `data_source`.

Training stream (`create_train_iterator`): each host reads its own disjoint shard of the split
(`tfds.split_for_jax_process`, shards cover the split) into memory. Step k of the stream is a pure
function of (seed, process_index, k):
  epoch = k // steps_per_epoch, b = k % steps_per_epoch,
  rows  = index_shuffle(b * B_host + [0, B_host), key(seed, process_index, "perm", epoch)),
  batch = augment(data[rows], key(seed, process_index, "augment", k)),
with stateless TF random ops (`tf.random.experimental.index_shuffle`, `stateless_uniform`), so each
epoch visits every example of the shard at most once (exactly once when the shard size is a multiple
of B_host) in a seeded random order, every visit gets a fresh random augmentation (nothing is
written to disk), and `start_step=k` starts at step k with no replay: the iterator is exactly the
tail of the uninterrupted one. steps_per_epoch = (N // hosts) // B_host (the layout's
`steps_per_epoch`), computed from the total split size so every host agrees (the trailing partial
batch of each epoch is dropped).
The shard is held in memory (uint8 where the values fit; the full 3.8M-puzzle Sudoku-Extreme train
split is ~0.6 GB on one host) and captured by the tf.data graph.

Datasets of materialised augmentations (ARC) use the reference's task sampling instead
(`create_group_train_iterator`): host h keeps only the tasks t with t % process_count == h, filtered
while the split is read, stored in the narrowest integer dtype (tokens uint8, labels int8) in file
order with a (puzzle, index) permutation instead of a sorted copy, and gathered per batch (cast back
to the builder's dtypes). arc1 with 1000 augmentations (3.6M rows x 2 x 900 tokens, 26 GB as int32)
is 6.5 GB on a single host and 1/process_count of it per host of a pod
(`python -m experiments.tools.stream_bench` measures a host's stream: load time, ms/batch, memory).

Sudoku augmentation (TF ops, one random group element per example, same map on inputs and labels):
digit permutation (pad and blank fixed), transpose with p = 0.5, a permutation of the bands and of
the rows within each band, and of the stacks and the columns within each stack. It is the
distribution of `input_pipeline.puzzles.sudoku.sample_transform` (the numpy reference). A fresh group
element per visit is what the reference's "pick one of 1000 materialised augmentations" converges
to, without the finite-sample repeats and without writing anything.

Batches are numpy dicts with leading dims [local_device_count, per_device_batch]:
  inputs int32 [D, b, 81], labels int32 [D, b, 81], puzzle_identifiers int32 [D, b],
  index int64 [D, b] (row in the split), and for eval mask bool [D, b].

Every batch figure (D, b, B_host, this host's index and the host count, steps per epoch, eval
batches) comes from the run's `layout`: an experiments/common/layout.BatchLayout, the one place
that divides batches (this package does not import experiments/; any object with its fields and
methods will do).

Synopsis:
  from experiments.common import layout as layout_lib
  layout = layout_lib.batch_layout(config)                     # e.g. 768 = 1 host x 4 x 192
  it = create_train_iterator("/tmp/tfds", "sudoku_generated", {"config": "medium"},
                             layout=layout, seed=0, start_step=step)
  batch = next(it)                                             # batch["inputs"]: [D, b, 81]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from input_pipeline import datasets
from input_pipeline import errors
from input_pipeline import puzzles
from input_pipeline.puzzles import augment

_ALG = "philox"
_TAG_PERMUTATION = 1
_TAG_AUGMENTATION = 2

Batch = dict[str, np.ndarray]

# --------------------------------------------------------------------------------------------
# Stateless seeds.


def fold_in(key: tf.Tensor, *data: Any) -> tf.Tensor:
  """Derive a stateless seed [2] int64 from `key` [2] and integers (Philox, device independent)."""
  key = tf.cast(key, tf.int64)
  for d in data:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(d, tf.int64), alg=_ALG)
  return key


def base_key(seed: int, process_index: int) -> tf.Tensor:
  """The stream's root seed [2] for (seed, process_index)."""
  return fold_in(tf.constant([0, seed], tf.int64), process_index)


_AUGMENTATIONS = augment.AUGMENTATIONS   # the builders' metadata["augmentation"] -> function

# --------------------------------------------------------------------------------------------
# Loading a host's examples into memory.


def prepared_builder(data_dir: str, dataset_name: str,
                     builder_kwargs: Optional[Mapping[str, Any]]) -> tfds.core.DatasetBuilder:
  """The dataset's TFDS builder; `errors.NotPrepared` (with the command that prepares it) when it
  is not prepared in `data_dir`."""
  builder = datasets.get_builder(dataset_name, data_dir, builder_kwargs)
  if not builder.is_prepared():
    raise errors.NotPrepared(
        builder.info.full_name, data_dir,
        f"run `python -m input_pipeline.prepare --dataset={dataset_name} --data_dir={data_dir}"
        f" --builder_kwargs='{json.dumps(dict(builder_kwargs or {}))}'`, or set "
        "--config.dataset.prepare_if_missing=True (public data is downloaded; offline, pass "
        "--config.dataset.manual_dir)")
  return builder


def _fit_dtype(lo: int, hi: int, dtype: np.dtype) -> np.dtype:
  """The smallest integer dtype holding [lo, hi] (at most as wide as `dtype`)."""
  for candidate in (np.uint8, np.int8, np.int16, np.int32):
    info = np.iinfo(candidate)
    if info.min <= lo and hi <= info.max and np.dtype(candidate).itemsize < np.dtype(dtype).itemsize:
      return np.dtype(candidate)
  return np.dtype(dtype)


def _narrow(array: np.ndarray) -> np.ndarray:
  """Store integer features in the smallest dtype holding their values (memory of the shard)."""
  if array.size == 0 or array.dtype.kind not in "iu":
    return array
  return array.astype(_fit_dtype(int(array.min()), int(array.max()), array.dtype), copy=False)


def empty_arrays(builder: tfds.core.DatasetBuilder) -> dict[str, np.ndarray]:
  """Zero-row arrays with the builder's feature shapes and dtypes."""
  return {name: np.zeros((0,) + tuple(spec.shape), spec.np_dtype)
          for name, spec in builder.info.features.items()}


_READ_CHUNK = 16384   # rows decoded per step while loading (ARC: 16384 x 2 x 900 int32 = 118 MB)


def load_split(builder: tfds.core.DatasetBuilder, split: Any, *,
               keep: Optional[Callable[[Batch], np.ndarray]] = None,
               narrow: bool = False, sort: bool = True) -> dict[str, np.ndarray]:
  """All examples of `split` (a TFDS split spec) as numpy arrays, sorted by `index`.

  Rows are decoded chunk by chunk straight into arrays sized for the whole split (pages that are
  never written cost no memory), so loading needs no second copy; peak memory is what is kept plus
  one chunk, and one feature more when sorting.

  Args:
    builder: a prepared builder.
    split: a TFDS split spec ("train", "test[0:100]", `tfds.split_for_jax_process(...)`).
    keep: `keep(chunk) -> bool [rows]` drops rows while reading (a host keeps its groups).
    narrow: store integer features in the smallest dtype holding their values (ARC's 3.6M train rows
      x 2 x 900 tokens: 26 GB as int32, 6.5 GB as uint8); the caller casts batches back.
    sort: order rows by `index`; with False rows stay in file order (the caller indexes them).
  Returns:
    {feature: array [rows, ...]}, in the builder's dtypes unless `narrow`.
  """
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(try_autocache=False))
  capacity = builder.info.splits[split].num_examples
  out: dict[str, np.ndarray] = {}
  n = 0
  for chunk in tfds.as_numpy(ds.batch(_READ_CHUNK)):
    mask = None if keep is None else np.asarray(keep(chunk), bool)
    m = int(chunk["index"].shape[0] if mask is None else np.count_nonzero(mask))
    if m == 0:
      continue
    if n + m > capacity:
      raise ValueError(f"{builder.info.full_name}: split {split!r} yielded more than the "
                       f"{capacity} rows its metadata states; the prepared files are inconsistent, "
                       "prepare the dataset again")
    for name, value in chunk.items():
      dtype = value.dtype
      if narrow and value.dtype.kind in "iu":
        dtype = _fit_dtype(int(value.min()), int(value.max()), value.dtype)
      buffer = out.get(name)
      if buffer is None:
        buffer = out[name] = np.empty((capacity,) + value.shape[1:], dtype)
      elif not np.can_cast(dtype, buffer.dtype):       # a later chunk needs a wider type
        buffer = out[name] = buffer.astype(np.promote_types(buffer.dtype, dtype))
      if mask is None:
        buffer[n:n + m] = value
      else:                    # kept rows straight into place: no filtered copy (heap fragmentation)
        np.compress(mask, value, axis=0, out=buffer[n:n + m])
    n += m
  if not out:
    return empty_arrays(builder)
  out = {name: buffer[:n] for name, buffer in out.items()}
  if sort:
    order = np.argsort(out["index"], kind="stable")
    if np.any(order != np.arange(n)):
      for name in list(out):                            # one feature's copy at a time
        out[name] = out[name][order]
  return out


# --------------------------------------------------------------------------------------------
# Training.


TRAIN_MAP_PARALLELISM = 2
TRAIN_PREFETCH_BATCHES = 2
"""The training stream's fixed parallelism: batches built at once, batches ready ahead. Not
tf.data's autotuning: its model thread sleeps up to a minute between optimisations, and deleting
the iterator (the end of training) waits for that sleep to end. With it, `make run` paused 12-36 s
between its last step and the final evaluation in about half the runs (docs/benchmarks.md, "make
run"). One batch is one map call of a few milliseconds (more than 400,000 augmented examples/s
either way), so two in flight and two ready keep far ahead of any training step."""


def create_train_dataset(
    data_dir: str,
    dataset_name: str,
    builder_kwargs: Optional[Mapping[str, Any]] = None,
    *,
    layout: Any,
    seed: int,
    start_step: int = 0,
    split: str = "train",
    augment: bool = True,
) -> tf.data.Dataset:
  """The infinite training stream of this host from `start_step` on (see the module docstring).

  Args:
    data_dir: TFDS data dir the dataset was prepared into (`input_pipeline.prepare`).
    dataset_name: "sudoku_generated" or "sudoku_extreme".
    builder_kwargs: {"config": "<preset>"} or config knobs (`input_pipeline.datasets`).
    layout: the run's BatchLayout (this host, the hosts, D, b, steps per epoch).
    seed: the stream's seed.
    start_step: first step to yield (exact resume: equals the uninterrupted stream from there).
    split: the split to train on.
    augment: apply the dataset's random augmentation.
  Returns:
    A dataset of dicts of tensors with leading dims [local_device_count, per_device_batch].
  """
  per_device, local_device_count = layout.per_device_batch, layout.devices_per_host
  process_index, process_count = layout.process_index, layout.hosts
  if start_step < 0:
    raise ValueError(f"start_step={start_step} must be >= 0")
  builder = prepared_builder(data_dir, dataset_name, builder_kwargs)
  total = builder.info.splits[split].num_examples
  per_host = layout.per_host_batch
  steps_per_epoch = layout.steps_per_epoch(total)
  if steps_per_epoch == 0:
    raise ValueError(
        f"split {split!r} of {builder.info.full_name} has {total} examples: fewer than one batch "
        f"of {per_host} per host for {process_count} hosts; lower the global batch "
        f"({layout.global_batch})")
  host_split = tfds.split_for_jax_process(split, process_index=process_index,
                                          process_count=process_count)
  arrays = load_split(builder, host_split, narrow=True)
  num_local = int(arrays["index"].shape[0])
  data = {name: tf.constant(value) for name, value in arrays.items()}
  dtypes = {name: tf.as_dtype(value.dtype) for name, value in empty_arrays(builder).items()}
  del arrays
  augment_fn = None
  if augment:
    augment_fn = _AUGMENTATIONS[datasets.get_metadata(dataset_name)["augmentation"]]
  root = base_key(seed, process_index)
  perm_root = fold_in(root, _TAG_PERMUTATION)
  aug_root = fold_in(root, _TAG_AUGMENTATION)

  def make_batch(step: tf.Tensor) -> dict[str, tf.Tensor]:
    epoch = step // steps_per_epoch
    b = step % steps_per_epoch
    positions = b * per_host + tf.range(per_host, dtype=tf.int64)  # [B_host]
    rows = tf.random.experimental.index_shuffle(
        positions, seed=fold_in(perm_root, epoch), max_index=tf.constant(num_local - 1, tf.int64))
    batch = {name: tf.cast(tf.gather(value, rows), dtypes[name]) for name, value in data.items()}
    if augment_fn is not None:
      batch = augment_fn(batch, fold_in(aug_root, step))
    return {name: tf.reshape(value, [local_device_count, per_device] + value.shape[1:].as_list())
            for name, value in batch.items()}

  ds = tf.data.Dataset.counter(start=start_step, dtype=tf.int64)
  # make_batch has no Python control flow on tensors: AutoGraph would only rewrite it (0.72 ->
  # 0.45 s to the first batch of cpu_demo:smoke without it; the graph is the same).
  ds = ds.map(tf.autograph.experimental.do_not_convert(make_batch),
              num_parallel_calls=TRAIN_MAP_PARALLELISM, deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  options.autotune.enabled = False          # see TRAIN_MAP_PARALLELISM
  return ds.with_options(options).prefetch(TRAIN_PREFETCH_BATCHES)


def create_train_iterator(*args: Any, **kwargs: Any) -> Iterator[Batch]:
  """Numpy batches of `create_train_dataset` (same arguments): step `start_step`, `start_step + 1`,
  ... forever."""
  return create_train_dataset(*args, **kwargs).as_numpy_iterator()


def create_group_train_iterator(
    data_dir: str,
    dataset_name: str,
    builder_kwargs: Optional[Mapping[str, Any]] = None,
    *,
    layout: Any,
    seed: int,
    start_step: int = 0,
    split: str = "train",
    group_key: str = "task_index",
) -> Iterator[Batch]:
  """The reference's sampling for datasets of materialised augmentations (ARC), from `start_step`.

  A group is an original puzzle (`group_key`, e.g. an ARC task), its puzzles are its augmented
  versions (`puzzle_identifiers`), each with several examples. As in the reference, an epoch visits
  the groups in a seeded random order, takes ONE random puzzle of each and appends its examples to
  the batch (a random subset of them when the batch has less room left; the rest of that puzzle is
  dropped), so every original task weighs the same however many augmentations it has. Host h samples
  the groups g with g % process_count == h (each host visits its groups once per epoch; the global
  batch is the union of the hosts' batches). An epoch is a fixed number of steps,
  (examples of one puzzle per group on this host) // per-host batch, so the stream is a pure function
  of (seed, host, step) and resumes in O(1); the reference's epoch ends where its random fill runs
  out, which differs by at most one batch.
  """
  per_device, local_device_count = layout.per_device_batch, layout.devices_per_host
  process_index, process_count = layout.process_index, layout.hosts
  per_host = layout.per_host_batch
  builder = prepared_builder(data_dir, dataset_name, builder_kwargs)
  dtypes = {name: value.dtype for name, value in empty_arrays(builder).items()}
  # Only this host's groups, in the narrowest dtypes, in file order: nothing is copied afterwards.
  arrays = load_split(builder, split, narrow=True, sort=False,
                      keep=lambda chunk: chunk[group_key] % process_count == process_index)
  if arrays["index"].size == 0:
    raise ValueError(f"{dataset_name}: host {process_index} of {process_count} has no groups in "
                     f"split {split!r}; use fewer hosts or a larger dataset")
  puzzles = arrays["puzzle_identifiers"].astype(np.int64)
  # Position i of the (puzzle, index) order is stored row order[i]: rows of a puzzle are contiguous
  # positions. The plan below works on positions; batches gather rows order[positions].
  order = np.lexsort((arrays["index"], puzzles))
  puzzles, groups = puzzles[order], arrays[group_key][order].astype(np.int64)
  starts = np.flatnonzero(np.r_[True, puzzles[1:] != puzzles[:-1]])   # first row of each puzzle
  sizes = np.diff(np.r_[starts, puzzles.size])
  puzzle_group = groups[starts]                                        # [P] group of each puzzle
  by_puzzle_group = np.argsort(puzzle_group, kind="stable")
  _, counts = np.unique(puzzle_group[by_puzzle_group], return_counts=True)
  by_group = np.split(by_puzzle_group, np.cumsum(counts)[:-1])         # puzzle numbers per group
  mean_size = float(sizes.mean())          # docs/trm.md section 4.5: mean examples per puzzle
  steps_per_epoch = layout.host_steps_per_epoch(int(len(by_group) * mean_size))
  if steps_per_epoch < 1:
    raise ValueError(f"{dataset_name}: one epoch on host {process_index} is {len(by_group)} groups x "
                     f"{mean_size:.1f} examples < the per-host batch {per_host}; lower "
                     "the global batch")

  def epoch_plan(epoch: int) -> np.ndarray:
    """Row indices [steps_per_epoch, per_host] of one epoch."""
    rng = np.random.default_rng([seed, process_index, epoch, 0x9e0])
    rows, batch, room = [], [], per_host
    while len(rows) < steps_per_epoch:
      for g in rng.permutation(len(by_group)):
        p = by_group[g][rng.integers(len(by_group[g]))]
        take = min(int(sizes[p]), room)
        picked = starts[p] + (rng.choice(int(sizes[p]), take, replace=False) if take < sizes[p]
                              else np.arange(take))
        batch.extend(picked.tolist())
        room -= take
        if room == 0:
          rows.append(batch)
          batch, room = [], per_host
          if len(rows) == steps_per_epoch:
            break
    return np.asarray(rows, np.int64)

  def batches() -> Iterator[Batch]:
    epoch, plan = None, None
    step = start_step
    while True:
      e, b = divmod(step, steps_per_epoch)
      if e != epoch:
        epoch, plan = e, epoch_plan(e)
      rows = order[plan[b]]
      yield {k: v[rows].astype(dtypes[k]).reshape((local_device_count, per_device) + v.shape[1:])
             for k, v in arrays.items()}
      step += 1

  return batches()
