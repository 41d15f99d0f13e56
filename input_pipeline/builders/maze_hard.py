"""TFDS builder `maze_hard`: the public Maze-Hard CSVs (30x30, 1000 train / 1000 test).

Reads `train.csv` and `test.csv` (columns `source,question,answer,rating`, 900-char mazes over
"# SGo", shortest paths > 110) of huggingface.co/datasets/sapientinc/maze-30x30-hard-1k: downloaded
by TFDS's download manager and checked against the Hub's record (base.py `fetch_sources`), or,
offline, from the TFDS manual dir; every row is validated
(`input_pipeline.puzzles.maze_csv.read_maze_csv`: one S, one G, the answer's 'o' cells a shortest
S->G path) and a malformed row stops preparation with `file:line: field ...`.

Options, the reference builder's made reproducible and explicit:
  * `subsample_size` (default None = all train rows, the reference default): draw that many train
    rows without replacement with `numpy.random.default_rng(seed)`, stored in CSV order (the
    reference draws unseeded).
  * `dihedral` (default False, the reference builder's default; the paper trains with the 8
    dihedral transforms) and `materialise`, exactly as in `maze_generated`: on the fly (train = N
    rows flagged `dihedral_augment`, one uniformly random transform per visit in the tf.data
    stream) or materialised like the reference with augmentation on (train = 8 * N rows, row
    8 r + t = transform t of maze r). The test split is the whole test.csv, never augmented.
Counts with the public files: train 1000 rows (8000 materialised), test 1000.

Configs: `nall_s0` (the reference builder, default), `nall_s0_d8` (the paper's 8 transforms, on
the fly) and `nall_s0_d8m` (materialised); others via
`make_config(subsample_size=..., seed=..., dihedral=..., materialise=...)`, named
`n{size|all}_s{seed}[_d8|_d8m]`. Features are those of `maze_generated`.

Synopsis:
  python -m input_pipeline.prepare --dataset=maze_hard --data_dir=/data/tfds \
      --builder_kwargs='{"dihedral": true}'            # downloads (offline: --manual_dir=FOLDER)
  builder = MazeHard(data_dir="/data/tfds", config=make_config(dihedral=True))
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline.puzzles import maze
from input_pipeline.puzzles import maze_csv
from input_pipeline.builders import maze_generated
from input_pipeline.builders import base

METADATA: dict = dict(maze.METADATA)

_VERSION = tfds.core.Version("1.0.0")


@dataclasses.dataclass(eq=False)
class MazeHardConfig(tfds.core.BuilderConfig):
  """The reference builder's options: train subsample (seeded) and the dihedral augmentation."""
  subsample_size: Optional[int] = None
  seed: int = 0
  dihedral: bool = False
  materialise: bool = False

  def knobs(self) -> dict:
    return dict(subsample_size=self.subsample_size, seed=self.seed, dihedral=self.dihedral,
                materialise=self.materialise)


def _new_config(subsample_size: Optional[int], seed: int, dihedral: bool,
                materialise: bool) -> MazeHardConfig:
  size = "all" if subsample_size is None else str(subsample_size)
  mode = maze_generated.dihedral_mode(dihedral, materialise)
  rows = ("8 rows per maze" if mode == maze_generated.MATERIALISED else "1 row per maze")
  return MazeHardConfig(
      name=f"n{size}_s{seed}{maze_generated.dihedral_suffix(dihedral, materialise)}",
      version=_VERSION,
      description=(f"train: {size} mazes of train.csv (seed {seed}), dihedral {mode} ({rows}); "
                   "test: all of test.csv"),
      subsample_size=subsample_size, seed=seed, dihedral=dihedral, materialise=materialise)


_PRESET_CONFIGS = [_new_config(None, 0, False, False), _new_config(None, 0, True, False),
                   _new_config(None, 0, True, True)]


def make_config(subsample_size: Optional[int] = None, seed: int = 0, dihedral: bool = False,
                materialise: bool = False) -> MazeHardConfig:
  """The config for these options (the preset object when one matches)."""
  if subsample_size is not None and subsample_size < 0:
    raise ValueError(f"subsample_size={subsample_size} must be >= 0 or None (all)")
  maze_generated.dihedral_mode(dihedral, materialise)
  knobs = dict(subsample_size=None if subsample_size is None else int(subsample_size),
               seed=int(seed), dihedral=bool(dihedral), materialise=bool(materialise))
  for config in _PRESET_CONFIGS:
    if config.knobs() == knobs:
      return config
  return _new_config(**knobs)


def select_train_rows(num_rows: int, subsample_size: Optional[int], seed: int) -> np.ndarray:
  """Row numbers (ascending) of the train subsample: a seeded draw without replacement."""
  if subsample_size is None:
    return np.arange(num_rows)
  if subsample_size > num_rows:
    raise ValueError(f"subsample_size={subsample_size} but train.csv has only {num_rows} rows; "
                     "lower subsample_size or use None (all)")
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(num_rows, size=subsample_size, replace=False))


class MazeHard(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
  """Maze-Hard (public CSVs) with a seeded subsample and an explicit dihedral option."""

  VERSION = _VERSION
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = _PRESET_CONFIGS
  SOURCES = (base.HubFiles("sapientinc/maze-30x30-hard-1k", ("train.csv", "test.csv")),)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "offline: download train.csv and test.csv (columns source,question,answer,rating) of "
      "huggingface.co/datasets/sapientinc/maze-30x30-hard-1k into a folder and pass it with --manual_dir "
      "(--config.dataset.manual_dir); without one they are downloaded")

  def _info(self) -> tfds.core.DatasetInfo:
    c: MazeHardConfig = self.builder_config
    return self.dataset_info_from_configs(
        description=__doc__.split("\n\n")[0],
        features=maze_generated.features(),
        supervised_keys=("inputs", "labels"),
        disable_shuffling=True,
        metadata=maze_generated.info_metadata(
            maze_generated.dihedral_mode(c.dihedral, c.materialise)),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    files = base.fetch_sources(dl_manager, "maze_hard", self.SOURCES)
    paths = {split: files[f"{split}.csv"] for split in ("train", "test")}
    c: MazeHardConfig = self.builder_config
    train = maze_csv.read_maze_csv(paths["train"])
    rows = select_train_rows(len(train), c.subsample_size, c.seed)
    test = maze_csv.read_maze_csv(paths["test"])
    mode = maze_generated.dihedral_mode(c.dihedral, c.materialise)
    return {
        "train": self._generate_examples(train.questions[rows], train.answers[rows], mode),
        "test": self._generate_examples(test.questions, test.answers, maze_generated.OFF),
    }

  def _generate_examples(self, questions: np.ndarray, answers: np.ndarray, mode: str):
    """Examples in CSV order (`index` = row in the split; shuffling is disabled)."""
    return maze_generated.examples(questions, answers, mode)
