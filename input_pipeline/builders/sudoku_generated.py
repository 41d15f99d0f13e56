"""TFDS builder `sudoku_generated`: seeded, uniquely solvable Sudoku puzzles (the embedded default).

No download: the puzzles come from `input_pipeline.puzzles.sudoku_generator.generate_puzzles`, so
the dataset is a pure function of its config (difficulty knobs, split sizes, seed). The train and
test splits are drawn from independent generator streams and checked to share no puzzle and no
solution grid.

Configs: presets `easy` (36 givens), `medium` (30 givens, the default), `hard` (26 givens) and
`extreme` (24 givens, rating >= 1, i.e. needs search), each 10,000 train / 1,000 test, seed 0; any
other combination via `make_config(...)`, named after its knobs (e.g. `g28_r0-any_n5000_t1000_s3`).
Preparing 10,000 + 1,000 puzzles takes ~20 s (easy, medium), ~1.5 min (hard) and ~10 min (extreme)
of CPU, in one process by default (`num_workers` > 1 spreads it over spawned processes).

Features (shared with `sudoku_extreme`): `inputs` int32 [81] puzzle tokens (1 blank, 2..10 digits),
`labels` int32 [81] solution tokens, `puzzle_identifiers` int32 scalar (0), `index` int64 scalar
(row in the split, examples are stored in generation order).

Synopsis:
  from input_pipeline.builders import sudoku_generated
  builder = sudoku_generated.SudokuGenerated(
      data_dir="/tmp/tfds", config=sudoku_generated.make_config(givens=28, train_size=2000))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  ds = builder.as_dataset(split="train")
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline.builders import base
from input_pipeline.puzzles import sudoku
from input_pipeline.puzzles import sudoku_generator

METADATA: dict = dict(sudoku.METADATA)

_VERSION = tfds.core.Version("1.0.0")


@dataclasses.dataclass(eq=False)
class SudokuGeneratedConfig(tfds.core.BuilderConfig):
  """Knobs of a generated Sudoku dataset (see `sudoku_generator.generate_puzzles`)."""
  givens: int = 30
  min_rating: int = 0
  max_rating: Optional[int] = None
  train_size: int = 10_000
  test_size: int = 1_000
  seed: int = 0

  def knobs(self) -> dict:
    return dict(givens=self.givens, min_rating=self.min_rating, max_rating=self.max_rating,
                train_size=self.train_size, test_size=self.test_size, seed=self.seed)


def _config_name(givens: int, min_rating: int, max_rating: Optional[int], train_size: int,
                 test_size: int, seed: int) -> str:
  top = "any" if max_rating is None else str(max_rating)
  return f"g{givens}_r{min_rating}-{top}_n{train_size}_t{test_size}_s{seed}"


def _new_config(name: str, **knobs) -> SudokuGeneratedConfig:
  k = SudokuGeneratedConfig(name="tmp", **knobs)
  description = (f"{k.givens} givens, rating in [{k.min_rating}, "
                 f"{'inf' if k.max_rating is None else k.max_rating}], "
                 f"{k.train_size} train / {k.test_size} test, seed {k.seed}")
  return SudokuGeneratedConfig(name=name, version=_VERSION, description=description, **knobs)


PRESETS: dict[str, dict] = {
    "medium": dict(givens=30),
    "easy": dict(givens=36),
    "hard": dict(givens=26),
    "extreme": dict(givens=24, min_rating=1),
}

_PRESET_CONFIGS = [_new_config(name, **knobs) for name, knobs in PRESETS.items()]


def make_config(givens: int = 30, min_rating: int = 0, max_rating: Optional[int] = None,
                train_size: int = 10_000, test_size: int = 1_000,
                seed: int = 0) -> SudokuGeneratedConfig:
  """The config for these knobs: a preset object when one matches, else a new named config."""
  if not 17 <= givens <= sudoku.NUM_CELLS:
    raise ValueError(f"givens={givens} must lie in 17..81")
  if train_size < 0 or test_size < 0:
    raise ValueError(f"train_size={train_size} and test_size={test_size} must be >= 0")
  if max_rating is not None and max_rating < min_rating:
    raise ValueError(f"max_rating={max_rating} < min_rating={min_rating}")
  knobs = dict(givens=givens, min_rating=min_rating, max_rating=max_rating,
               train_size=train_size, test_size=test_size, seed=seed)
  for config in _PRESET_CONFIGS:
    if config.knobs() == knobs:
      return config
  return _new_config(_config_name(**knobs), **knobs)


def features() -> tfds.features.FeaturesDict:
  """The feature spec shared by every Sudoku builder."""
  return tfds.features.FeaturesDict({
      "inputs": tfds.features.Tensor(shape=(sudoku.NUM_CELLS,), dtype=np.int32),
      "labels": tfds.features.Tensor(shape=(sudoku.NUM_CELLS,), dtype=np.int32),
      "puzzle_identifiers": tfds.features.Scalar(dtype=np.int32),
      "index": tfds.features.Scalar(dtype=np.int64),
  })


def examples(puzzles: np.ndarray, solutions: np.ndarray):
  """Yield (key, example) for digit grids [N, 81] in order; `index` = row."""
  inputs = sudoku.grid_to_tokens(puzzles)  # [N, 81]
  labels = sudoku.grid_to_tokens(solutions)  # [N, 81]
  for i in range(inputs.shape[0]):
    yield i, {
        "inputs": inputs[i],
        "labels": labels[i],
        "puzzle_identifiers": np.int32(0),
        "index": np.int64(i),
    }


class SudokuGenerated(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
  """Generated, uniquely solvable Sudoku puzzles with a difficulty knob."""

  VERSION = _VERSION
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = _PRESET_CONFIGS

  def __init__(self, *, num_workers: Optional[int] = None, **kwargs):
    """`num_workers` only affects generation speed, never the data."""
    self._num_workers = num_workers
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__.split("\n\n")[0],
        features=features(),
        supervised_keys=("inputs", "labels"),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(**{k: v for k, v in METADATA.items()}),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # nothing to download
    c: SudokuGeneratedConfig = self.builder_config
    workers = self._num_workers or 1   # no subprocesses from a process running TF/JAX threads
    kw = dict(givens=c.givens, min_rating=c.min_rating, max_rating=c.max_rating,
              num_workers=workers)
    train = sudoku_generator.generate_puzzles(c.train_size, c.seed, stream="train", **kw)
    test = sudoku_generator.generate_puzzles(c.test_size, c.seed, stream="test", **kw)
    check_disjoint(train, test)
    return {"train": self._generate_examples(*train), "test": self._generate_examples(*test)}

  def _generate_examples(self, puzzles: np.ndarray, solutions: np.ndarray):
    """Examples in generation order (`index` = row; shuffling is disabled)."""
    return examples(puzzles, solutions)


def check_disjoint(train: tuple[np.ndarray, np.ndarray],
                   test: tuple[np.ndarray, np.ndarray]) -> None:
  """Raise if a test puzzle or solution grid also occurs in train (or test repeats itself)."""
  for what, a, b in (("puzzle", train[0], test[0]), ("solution grid", train[1], test[1])):
    seen = {row.tobytes() for row in a}
    for j, row in enumerate(b):
      if row.tobytes() in seen:
        raise RuntimeError(f"test example {j}: its {what} also occurs in the train split; "
                           "change the seed")
  if len({row.tobytes() for row in test[0]}) != len(test[0]):
    raise RuntimeError("the test split repeats a puzzle; change the seed")
