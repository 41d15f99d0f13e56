"""TFDS builder `maze_generated`: seeded 30x30 mazes with a long unique shortest path (offline).

No download: the mazes come from `input_pipeline.puzzles.maze_generator.generate_mazes`, so the
dataset is a pure function of its config (path threshold, loop probability, split sizes, seed,
dihedral option). The train and test splits are drawn from independent generator streams and
checked to share no maze.

Dihedral augmentation of the train split (the paper trains with the 8 dihedral transforms; the
reference builder's default is off), a config option shared with `maze_hard`:
  * `dihedral=False` (default): train = N mazes as generated, never transformed.
  * `dihedral=True`: train = N mazes stored once, flagged `dihedral_augment`; the tf.data training
    stream shows each visit under a uniformly random one of the 8 transforms (the pipeline's
    "maze_dihedral" augmentation, `input_pipeline.puzzles.augment.augment_dihedral_batch`). This is
    the reference's sampling distribution (one random version of each maze per epoch) and keeps its
    epoch arithmetic (total_groups = N train examples).
  * `dihedral=True, materialise=True`: the reference builder with augmentation on: train = 8 * N
    rows, maze-major (row 8 r + t = transform t of maze r, `dihedral_id` = t), none flagged. An
    epoch of the pipeline then visits all 8 versions, i.e. 8 reference epochs: divide `epochs`
    by 8 to keep the reference's step count.
The test split is never augmented (M rows, `dihedral_id` 0).

Configs: presets `hard` (the default: path > 110 moves, loop_prob 0.05, 1000 train / 1000 test,
seed 0, no augmentation, like the Maze-Hard sizes) and `hard_d8` (the same with the 8 dihedral
transforms on the fly); any other combination via `make_config(...)`, named after its knobs (e.g.
`p60_l0p05_n200_t50_s3_d8m`). Preparing `hard` (2,000 mazes) takes ~8 s on one busy core of the
2-core development machine and 1.2 MB of disk (200 + 50 mazes: ~1 s and 168 KB; the same
materialised, 1,600 + 50 rows: ~2 s and 1 MB).

Features (shared with `maze_hard`): `inputs` int32 [900] question tokens (1 '#', 2 ' ', 3 'S',
4 'G'), `labels` int32 [900] answer tokens (5 'o' on the path), `puzzle_identifiers` int32 scalar
(0), `index` int64 scalar (row in the split, stored in generation order), `dihedral_id` int32
scalar (the transform applied to the stored maze), `dihedral_augment` bool scalar (the training
stream may transform it). Token arrays are zlib-compressed on disk.

Synopsis:
  from input_pipeline.builders import maze_generated
  builder = maze_generated.MazeGenerated(
      data_dir="/tmp/tfds", config=maze_generated.make_config(train_size=200, test_size=50))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  ds = builder.as_dataset(split="train")
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline.puzzles import maze
from input_pipeline.puzzles import maze_generator
from input_pipeline.builders import base

METADATA: dict = dict(maze.METADATA)

_VERSION = tfds.core.Version("1.0.0")

OFF, ON_THE_FLY, MATERIALISED = "off", "on_the_fly", "materialised"


def dihedral_mode(dihedral: bool, materialise: bool) -> str:
  """"off", "on_the_fly" or "materialised" (validates the combination)."""
  if materialise and not dihedral:
    raise ValueError("materialise=True needs dihedral=True (it stores the 8 dihedral versions of "
                     "every train maze); set dihedral=True or drop materialise")
  if not dihedral:
    return OFF
  return MATERIALISED if materialise else ON_THE_FLY


def dihedral_suffix(dihedral: bool, materialise: bool) -> str:
  """The config-name suffix of a dihedral option: "", "_d8" or "_d8m"."""
  return {OFF: "", ON_THE_FLY: "_d8", MATERIALISED: "_d8m"}[dihedral_mode(dihedral, materialise)]


def train_rows(num_mazes: int, dihedral: bool, materialise: bool) -> int:
  """Rows of the train split for `num_mazes` mazes (8 per maze when materialised)."""
  return num_mazes * (maze.NUM_DIHEDRAL if dihedral_mode(dihedral, materialise) == MATERIALISED
                      else 1)


@dataclasses.dataclass(eq=False)
class MazeGeneratedConfig(tfds.core.BuilderConfig):
  """Knobs of a generated maze dataset (see `maze_generator.generate_mazes`)."""
  path_threshold: int = maze.DEFAULT_PATH_THRESHOLD
  loop_prob: float = 0.05
  train_size: int = 1_000
  test_size: int = 1_000
  seed: int = 0
  dihedral: bool = False
  materialise: bool = False

  def knobs(self) -> dict:
    return dict(path_threshold=self.path_threshold, loop_prob=self.loop_prob,
                train_size=self.train_size, test_size=self.test_size, seed=self.seed,
                dihedral=self.dihedral, materialise=self.materialise)


def _config_name(path_threshold: int, loop_prob: float, train_size: int, test_size: int, seed: int,
                 dihedral: bool, materialise: bool) -> str:
  loops = f"{loop_prob:g}".replace(".", "p")
  return (f"p{path_threshold}_l{loops}_n{train_size}_t{test_size}_s{seed}"
          f"{dihedral_suffix(dihedral, materialise)}")


def _new_config(name: str, **knobs) -> MazeGeneratedConfig:
  k = MazeGeneratedConfig(name="tmp", **knobs)
  mode = dihedral_mode(k.dihedral, k.materialise)
  rows = train_rows(k.train_size, k.dihedral, k.materialise)
  description = (f"shortest path > {k.path_threshold} moves, loop_prob {k.loop_prob}, "
                 f"{k.train_size} train mazes ({rows} rows, dihedral {mode}) / {k.test_size} test, "
                 f"seed {k.seed}")
  return MazeGeneratedConfig(name=name, version=_VERSION, description=description, **knobs)


PRESETS: dict[str, dict] = {
    "hard": dict(),
    "hard_d8": dict(dihedral=True),
}

_PRESET_CONFIGS = [_new_config(name, **knobs) for name, knobs in PRESETS.items()]


def make_config(path_threshold: int = maze.DEFAULT_PATH_THRESHOLD, loop_prob: float = 0.05,
                train_size: int = 1_000, test_size: int = 1_000, seed: int = 0,
                dihedral: bool = False, materialise: bool = False) -> MazeGeneratedConfig:
  """The config for these knobs: a preset object when one matches, else a new named config."""
  if not 0 <= path_threshold < maze.NUM_CELLS:
    raise ValueError(f"path_threshold={path_threshold} must lie in 0..{maze.NUM_CELLS - 1}")
  if not 0.0 <= loop_prob <= 1.0:
    raise ValueError(f"loop_prob={loop_prob} must lie in [0, 1]")
  if train_size < 0 or test_size < 0:
    raise ValueError(f"train_size={train_size} and test_size={test_size} must be >= 0")
  dihedral_mode(dihedral, materialise)
  knobs = dict(path_threshold=int(path_threshold), loop_prob=float(loop_prob),
               train_size=int(train_size), test_size=int(test_size), seed=int(seed),
               dihedral=bool(dihedral), materialise=bool(materialise))
  for config in _PRESET_CONFIGS:
    if config.knobs() == knobs:
      return config
  return _new_config(_config_name(**knobs), **knobs)


def features() -> tfds.features.FeaturesDict:
  """The feature spec shared by every maze builder (token arrays zlib-compressed on disk)."""
  tokens = lambda: tfds.features.Tensor(  # pylint: disable=unnecessary-lambda-assignment
      shape=(maze.NUM_CELLS,), dtype=np.int32, encoding=tfds.features.Encoding.ZLIB)
  return tfds.features.FeaturesDict({
      "inputs": tokens(),
      "labels": tokens(),
      "puzzle_identifiers": tfds.features.Scalar(dtype=np.int32),
      "index": tfds.features.Scalar(dtype=np.int64),
      "dihedral_id": tfds.features.Scalar(dtype=np.int32),
      "dihedral_augment": tfds.features.Scalar(dtype=np.bool_),
  })


def info_metadata(mode: str) -> tfds.core.MetadataDict:
  """`METADATA` plus this config's dihedral mode and train rows per maze (8 when materialised:
  the reference's total_groups = train rows / train_rows_per_maze)."""
  rows_per_maze = maze.NUM_DIHEDRAL if mode == MATERIALISED else 1
  return tfds.core.MetadataDict(**METADATA, dihedral=mode, train_rows_per_maze=rows_per_maze)


def examples(questions: np.ndarray, answers: np.ndarray, mode: str = OFF):
  """Yield (key, example) for token pairs [N, 900] in order; `index` = row of the split.

  `mode` (of this split; a test split is always "off"): "off" and "on_the_fly" store each maze once
  (flagged `dihedral_augment` on the fly); "materialised" stores its 8 dihedral versions,
  row 8 r + t = transform t of maze r.
  """
  if mode not in (OFF, ON_THE_FLY, MATERIALISED):
    raise ValueError(f"dihedral mode {mode!r} is not one of {OFF}, {ON_THE_FLY}, {MATERIALISED}")
  inputs = np.asarray(questions).astype(np.int32)  # [N, 900]
  labels = np.asarray(answers).astype(np.int32)  # [N, 900]
  versions = range(maze.NUM_DIHEDRAL) if mode == MATERIALISED else (0,)
  row = 0
  for i in range(inputs.shape[0]):
    for t in versions:
      yield row, {
          "inputs": maze.apply_dihedral(inputs[i], t),
          "labels": maze.apply_dihedral(labels[i], t),
          "puzzle_identifiers": np.int32(0),
          "index": np.int64(row),
          "dihedral_id": np.int32(t),
          "dihedral_augment": mode == ON_THE_FLY,
      }
      row += 1


def check_disjoint(train_questions: np.ndarray, test_questions: np.ndarray) -> None:
  """Raise if a test maze also occurs in train (or test repeats itself)."""
  seen = {row.tobytes() for row in train_questions}
  for j, row in enumerate(test_questions):
    if row.tobytes() in seen:
      raise RuntimeError(f"test maze {j} also occurs in the train split; change the seed")
  if len({row.tobytes() for row in test_questions}) != len(test_questions):
    raise RuntimeError("the test split repeats a maze; change the seed")


class MazeGenerated(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
  """Generated 30x30 mazes with a long unique shortest path and an optional dihedral option."""

  VERSION = _VERSION
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = _PRESET_CONFIGS

  def _info(self) -> tfds.core.DatasetInfo:
    c: MazeGeneratedConfig = self.builder_config
    return self.dataset_info_from_configs(
        description=__doc__.split("\n\n")[0],
        features=features(),
        supervised_keys=("inputs", "labels"),
        disable_shuffling=True,
        metadata=info_metadata(dihedral_mode(c.dihedral, c.materialise)),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # nothing to download
    c: MazeGeneratedConfig = self.builder_config
    kw = dict(path_threshold=c.path_threshold, loop_prob=c.loop_prob)
    train = maze_generator.generate_mazes(c.train_size, c.seed, stream="train", **kw)
    test = maze_generator.generate_mazes(c.test_size, c.seed, stream="test", **kw)
    check_disjoint(train[0], test[0])
    mode = dihedral_mode(c.dihedral, c.materialise)
    return {"train": self._generate_examples(*train, mode),
            "test": self._generate_examples(*test, OFF)}

  def _generate_examples(self, questions: np.ndarray, answers: np.ndarray, mode: str):
    """Examples in generation order (`index` = row; shuffling is disabled)."""
    return examples(questions, answers, mode)
