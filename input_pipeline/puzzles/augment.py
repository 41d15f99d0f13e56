"""The puzzles' on-the-fly augmentations in TensorFlow, applied per batch inside tf.data.

The builders name their augmentation in their metadata (`metadata["augmentation"]`); the pipeline
(input_pipeline/pipeline.py) looks it up in `AUGMENTATIONS` and calls it with the batch and a
stateless Philox seed [2] derived from (seed, host, step), so every augmentation is a pure function
of its inputs (resumable, the same on every machine):

  "sudoku"         the reference's Sudoku transforms: digit relabelling, transpose, band/row and
                   stack/column permutations (one per example, on inputs and labels [B, 81])
  "maze_dihedral"  one of the 8 dihedral transforms per example (inputs and labels [B, 900])
  "none"           no augmentation (ARC: its augmentations are materialised by the builder)

The numpy formats (parsing, generators, the numpy versions of these transforms) are in sudoku*.py,
maze*.py and arc*.py beside this file; this module is the only one of the package that imports
TensorFlow.

Synopsis:

  import numpy as np, tensorflow as tf
  from input_pipeline.puzzles import augment
  batch = {"inputs": tf.constant(np.ones((2, 81), np.int32)),
           "labels": tf.constant(np.full((2, 81), 2, np.int32))}
  out = augment.AUGMENTATIONS["sudoku"](batch, tf.constant([0, 7], tf.int64))
  assert out["inputs"].shape == (2, 81)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import tensorflow as tf

from input_pipeline.puzzles import maze
from input_pipeline.puzzles import sudoku

_ALG = "philox"


# --------------------------------------------------------------------------------------------
# Sudoku.


def _random_permutations(keys: tf.Tensor) -> tf.Tensor:
  """Uniform random permutations along the last axis: argsort of i.i.d. int64 keys [..., n]."""
  return tf.argsort(keys, axis=-1, stable=True, direction="ASCENDING")


def sample_sudoku_transforms(key: tf.Tensor, batch_size: int) -> dict[str, tf.Tensor]:
  """A random augmentation per example: the parameters of `input_pipeline.puzzles.sudoku.SudokuTransform`.

  Returns:
    digit_perm int32 [B, 9], transpose bool [B], row_perm int32 [B, 9], col_perm int32 [B, 9]
    (row_perm[3a + b] = 3 * band_perm[a] + rows_in_band[a, b]; col_perm likewise).
  """
  u = tf.random.stateless_uniform([batch_size, 34], seed=key, minval=None, maxval=None,
                                  dtype=tf.int64, alg=_ALG)  # [B, 34] i.i.d. full-range keys
  digit_perm = _random_permutations(u[:, 0:9])  # [B, 9]
  transpose = u[:, 9] < 0  # [B], p = 1/2
  bands = _random_permutations(u[:, 10:13])  # [B, 3]
  rows = _random_permutations(tf.reshape(u[:, 13:22], [-1, 3, 3]))  # [B, 3, 3]
  stacks = _random_permutations(u[:, 22:25])  # [B, 3]
  cols = _random_permutations(tf.reshape(u[:, 25:34], [-1, 3, 3]))  # [B, 3, 3]
  row_perm = tf.reshape(3 * bands[:, :, None] + rows, [-1, 9])  # [B, 9]
  col_perm = tf.reshape(3 * stacks[:, :, None] + cols, [-1, 9])  # [B, 9]
  return dict(digit_perm=tf.cast(digit_perm, tf.int32), transpose=transpose,
              row_perm=tf.cast(row_perm, tf.int32), col_perm=tf.cast(col_perm, tf.int32))


def apply_sudoku_transforms(tokens: tf.Tensor, params: Mapping[str, tf.Tensor]) -> tf.Tensor:
  """Apply per-example transforms to tokens [B, 81] (negative labels such as -100 stay put)."""
  rows = params["row_perm"][:, :, None]  # [B, 9, 1]
  cols = params["col_perm"][:, None, :]  # [B, 1, 9]
  positions = tf.where(params["transpose"][:, None, None], cols * 9 + rows, rows * 9 + cols)
  positions = tf.reshape(positions, [-1, sudoku.NUM_CELLS])  # [B, 81]
  moved = tf.gather(tokens, positions, batch_dims=1)  # [B, 81]
  batch = tf.shape(tokens)[0]
  fixed = tf.broadcast_to(tf.constant([sudoku.PAD_ID, sudoku.BLANK_ID], tf.int32), [batch, 2])
  table = tf.concat([fixed, 2 + params["digit_perm"]], axis=1)  # [B, 11]
  mapped = tf.gather(table, tf.maximum(moved, 0), batch_dims=1)  # [B, 81]
  return tf.where(moved < 0, moved, mapped)


def augment_sudoku_batch(batch: Mapping[str, tf.Tensor], key: tf.Tensor) -> dict[str, tf.Tensor]:
  """One random transform per example, applied to `inputs` and `labels` [B, 81]."""
  params = sample_sudoku_transforms(key, tf.shape(batch["inputs"])[0])
  out = dict(batch)
  out["inputs"] = apply_sudoku_transforms(batch["inputs"], params)
  out["labels"] = apply_sudoku_transforms(batch["labels"], params)
  return out


# --------------------------------------------------------------------------------------------
# Maze: dihedral transforms.


def apply_dihedral_tf(tokens: Any, ids: Any) -> Any:
  """Per-example transforms: tokens [B, 900] (any int dtype), ids int32 [B] in 0..7 -> [B, 900]."""
  positions = tf.gather(tf.constant(maze.DIHEDRAL_POSITIONS), ids)  # [B, 900]
  return tf.gather(tokens, positions, batch_dims=1)


def sample_dihedral_ids(key: Any, batch_size: Any, allowed: Optional[Any] = None) -> Any:
  """Uniform ids int32 [B] in 0..7 from a stateless seed [2] (Philox); 0 where `allowed` [B] is
  False."""
  ids = tf.random.stateless_uniform([batch_size], seed=key, minval=0, maxval=maze.NUM_DIHEDRAL,
                                    dtype=tf.int32, alg=_ALG)
  if allowed is not None:
    ids = tf.where(tf.cast(allowed, tf.bool), ids, tf.zeros_like(ids))
  return ids


def augment_dihedral_batch(batch: Mapping[str, Any], key: Any) -> dict[str, Any]:
  """The pipeline's "maze_dihedral" augmentation: one uniformly random dihedral transform per
  example, the same on `inputs` and `labels` [B, 900].

  Examples whose `dihedral_augment` feature is False (dihedral augmentation off, or the 8 versions
  materialised by the builder) stay as they are; `dihedral_id` becomes the transform from the
  original maze to the example shown.
  """
  ids = sample_dihedral_ids(key, tf.shape(batch["inputs"])[0], batch.get("dihedral_augment"))
  out = dict(batch)
  out["inputs"] = apply_dihedral_tf(batch["inputs"], ids)
  out["labels"] = apply_dihedral_tf(batch["labels"], ids)
  if "dihedral_id" in batch:
    stored = tf.cast(batch["dihedral_id"], tf.int32)
    composed = tf.gather(tf.reshape(tf.constant(maze.DIHEDRAL_COMPOSE), [-1]),
                         ids * maze.NUM_DIHEDRAL + stored)
    out["dihedral_id"] = tf.cast(composed, batch["dihedral_id"].dtype)
  return out


AUGMENTATIONS = {"sudoku": augment_sudoku_batch, "maze_dihedral": augment_dihedral_batch,
                 "none": None}
