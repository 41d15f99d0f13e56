"""TFDS builder `sudoku_extreme`: the public Sudoku-Extreme CSVs, downloaded or from a manual dir.

Reads `train.csv` and `test.csv` (columns `source,question,answer,rating`, 81-char grids with '.'
blanks) of huggingface.co/datasets/sapientinc/sudoku-extreme: downloaded by TFDS's download manager
and checked against the Hub's sha256 (base.py `fetch_sources`), or, offline, from the TFDS manual
dir; every row is validated (`input_pipeline.puzzles.sudoku_csv.read_sudoku_csv`)
and a malformed row stops preparation with `file:line: field ...`. The train split follows the
reference recipe, made reproducible: keep rows with `rating >= min_rating`, then draw
`subsample_size` of them without replacement with `numpy.random.default_rng(seed)`
(`subsample_size=None` keeps all), stored in CSV order. The test split is the whole test.csv.

Configs: `n1000_r0_s0` (the reference recipe, default) and `all_r0_s0`; others via
`make_config(subsample_size=..., min_rating=..., seed=...)`, named
`n{size|all}_r{min_rating}_s{seed}`.
Features are those of `sudoku_generated` (`inputs`, `labels`, `puzzle_identifiers`, `index`).

Synopsis:
  python -m input_pipeline.prepare --dataset=sudoku_extreme --data_dir=/data/tfds   # downloads
  python -m input_pipeline.prepare --dataset=sudoku_extreme --data_dir=/data/tfds \
      --manual_dir=/data/sudoku-extreme                                           # offline
  builder = SudokuExtreme(data_dir="/data/tfds",
                          config=make_config(subsample_size=1000, seed=0))
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline.puzzles import sudoku
from input_pipeline.puzzles import sudoku_csv
from input_pipeline.builders import base
from input_pipeline.builders import sudoku_generated

METADATA: dict = dict(sudoku.METADATA)

_VERSION = tfds.core.Version("1.0.0")


@dataclasses.dataclass(eq=False)
class SudokuExtremeConfig(tfds.core.BuilderConfig):
  """The reference recipe's options: train subsample size, minimum rating, subsampling seed."""
  subsample_size: Optional[int] = 1000
  min_rating: int = 0
  seed: int = 0

  def knobs(self) -> dict:
    return dict(subsample_size=self.subsample_size, min_rating=self.min_rating, seed=self.seed)


def _new_config(subsample_size: Optional[int], min_rating: int,
                seed: int) -> SudokuExtremeConfig:
  size = "all" if subsample_size is None else str(subsample_size)
  return SudokuExtremeConfig(
      name=f"n{size}_r{min_rating}_s{seed}", version=_VERSION,
      description=(f"train: {size} puzzles with rating >= {min_rating} (seed {seed}); "
                   "test: all of test.csv"),
      subsample_size=subsample_size, min_rating=min_rating, seed=seed)


_PRESET_CONFIGS = [_new_config(1000, 0, 0), _new_config(None, 0, 0)]


def make_config(subsample_size: Optional[int] = 1000, min_rating: int = 0,
                seed: int = 0) -> SudokuExtremeConfig:
  """The config for these options (the preset object when one matches)."""
  if subsample_size is not None and subsample_size < 0:
    raise ValueError(f"subsample_size={subsample_size} must be >= 0 or None (all)")
  knobs = dict(subsample_size=subsample_size, min_rating=min_rating, seed=seed)
  for config in _PRESET_CONFIGS:
    if config.knobs() == knobs:
      return config
  return _new_config(**knobs)


def select_train_rows(ratings: np.ndarray, subsample_size: Optional[int], min_rating: int,
                      seed: int) -> np.ndarray:
  """Row numbers (ascending) of the train subsample: rating filter, then a seeded draw."""
  eligible = np.flatnonzero(np.asarray(ratings) >= min_rating)  # [E]
  if subsample_size is None:
    return eligible
  if subsample_size > eligible.size:
    raise ValueError(f"subsample_size={subsample_size} but only {eligible.size} train rows "
                     f"have rating >= {min_rating}")
  rng = np.random.default_rng(seed)
  chosen = rng.choice(eligible.size, size=subsample_size, replace=False)
  return eligible[np.sort(chosen)]


class SudokuExtreme(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
  """Sudoku-Extreme (public CSVs) with the reference recipe's seeded train subsample."""

  VERSION = _VERSION
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = _PRESET_CONFIGS
  SOURCES = (base.HubFiles("sapientinc/sudoku-extreme", ("train.csv", "test.csv")),)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "offline: download train.csv and test.csv (columns source,question,answer,rating) of "
      "huggingface.co/datasets/sapientinc/sudoku-extreme into a folder and pass it with --manual_dir "
      "(--config.dataset.manual_dir); without one they are downloaded")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__.split("\n\n")[0],
        features=sudoku_generated.features(),
        supervised_keys=("inputs", "labels"),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(**METADATA),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    files = base.fetch_sources(dl_manager, "sudoku_extreme", self.SOURCES)
    paths = {split: files[f"{split}.csv"] for split in ("train", "test")}
    c: SudokuExtremeConfig = self.builder_config
    train = sudoku_csv.read_sudoku_csv(paths["train"])
    rows = select_train_rows(train.ratings, c.subsample_size, c.min_rating, c.seed)
    test = sudoku_csv.read_sudoku_csv(paths["test"])
    return {
        "train": self._generate_examples(train.questions[rows], train.answers[rows]),
        "test": self._generate_examples(test.questions, test.answers),
    }

  def _generate_examples(self, questions: np.ndarray, answers: np.ndarray):
    """Examples in CSV order (`index` = row in the split; shuffling is disabled)."""
    return sudoku_generated.examples(questions, answers)
