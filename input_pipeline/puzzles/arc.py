"""ARC-AGI in pure numpy: tasks, the TRM encoding and the augmentations.

Everything the ARC dataset builder (`input_pipeline.builders.arc_agi`) and the ARC evaluator
(`experiments.trm.arc_eval`) share lives here and in its two siblings, `arc_files` (the Kaggle
files, validated) and `arc_dataset` (the dataset variants, puzzle identifiers and examples),
without TensorFlow, following the TRM reference (docs/trm.md sections 3 and 6).

Glossary:
  grid       list of rows of ints 0..9, rectangular, 1..30 rows and 1..30 columns; here a numpy
             array [H, W] uint8
  pair       {"input": grid, "output": grid} (a demonstration, or a test input with its solution)
  task       {"train": [pair, ...], "test": [{"input": grid}, ...]} in `*_challenges.json`
  solutions  {task_id: [test output grid, ...]} in `*_solutions.json`, one per test input, in order
  tokens     the model's view of a grid: [900] int32 on a 30x30 canvas, row-major; 0 pad, 1 EOS,
             colours 0..9 -> 2..11 (vocab 12). The grid sits at an offset (r, c); an EOS row lies
             under it (row r+H, columns c..c+W-1) and an EOS column right of it (column c+W, rows
             r..r+H-1), each only when inside the canvas (no corner cell). Labels are encoded the
             same way with pad = -100 (ignored by the loss; EOS is trained).
  crop       tokens -> grid: the largest top-left rectangle of colour tokens (2..11), exactly as the
             reference's evaluator computes it (also on garbage predictions; may be 0x0).
  dihedral   ids 0 identity, 1 rot90, 2 rot180, 3 rot270 (counter-clockwise, np.rot90), 4 flip
             left-right, 5 flip up-down, 6 transpose, 7 anti-transpose; inverse ids DIHEDRAL_INVERSE.
  colours    a colour map [10]: colour c -> colours[c], with colours[0] == 0 and 1..9 permuted.
  augmentation  (dihedral id, colour map); applied as dihedral(colours[grid]); inverted as
             inverse_colours[inverse_dihedral(grid)]. Text form "t<d>_<10 digits>" (the reference's).
  puzzle     one (task, augmentation); its puzzle identifier is an int >= 1 (0 = blank), the same
             in the train and test splits. A task's augmentations are its "group".
  variant    "arc1": train split = training + evaluation demonstrations + concept, test split =
             evaluation test inputs; "arc2": training2 + evaluation2 demonstrations + concept,
             test = evaluation2 test inputs (VARIANTS).

Augmentations of a task (`generate_augmentations`): the identity first, then up to `num_aug`
distinct ones drawn like the reference (a uniform dihedral id and a uniform permutation of colours
1..9, at most 5 * num_aug draws); an augmented task equal to the original or to an earlier one (as a
multiset of (input, output) pairs over demonstrations and test pairs) is dropped. The draws come from
`numpy.random.default_rng` seeded by (seed, sha256(task id)), so a task's list does not depend on
which other tasks are built, and the list for a smaller num_aug is a prefix of a larger one's (when
found within the smaller budget of draws).

Synopsis:

  import numpy as np
  from input_pipeline.puzzles import arc
  grid = np.array([[1, 2, 3], [4, 5, 6]], np.uint8)
  tokens = arc.encode_grid(grid)                 # [900] int32: 3..8 top-left, EOS row and column
  assert np.array_equal(arc.crop(tokens), grid)
  task = arc.Task("00000001", [arc.Pair(grid, grid[:, ::-1])], [arc.Pair(grid.T, None)])
  augs = arc.generate_augmentations(task, num_aug=8, seed=0)   # identity first
  aug = augs[1]
  assert np.array_equal(aug.invert(aug.apply(grid)), grid)
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import List, Optional, Sequence, Tuple

import numpy as np

from input_pipeline import errors
from input_pipeline import puzzles

MAX_SIZE = 30
NUM_COLOURS = 10
SETS = ("training", "evaluation", "concept", "training2", "evaluation2")


class ArcFormatError(errors.DataError):
  """A file that is not ARC-shaped; the message names the file, the task id and the place."""


@dataclasses.dataclass(frozen=True)
class Pair:
  input: np.ndarray                   # [H, W] uint8 in 0..9
  output: Optional[np.ndarray]        # [H', W'] uint8, None for a test input without a solution


@dataclasses.dataclass(frozen=True)
class Task:
  task_id: str
  train: List[Pair]                   # demonstration pairs
  test: List[Pair]                    # test inputs (outputs from the solutions file, if read)


# --------------------------------------------------------------------------------------------
# Encoding (reference TRM: 0 pad, 1 EOS, colours 0..9 -> 2..11, 30x30 canvas).

PAD_ID = 0
EOS_ID = 1
COLOUR_OFFSET = 2
VOCAB_SIZE = 12
SEQ_LEN = MAX_SIZE * MAX_SIZE     # 900
IGNORE_LABEL_ID = puzzles.IGNORE_LABEL_ID

# The metadata every ARC dataset shares (num_puzzle_identifiers depends on the prepared data: see
# input_pipeline.builders.arc_agi.prepared_metadata).
METADATA: dict = dict(
    vocab_size=VOCAB_SIZE,
    seq_len=SEQ_LEN,
    num_puzzle_identifiers=None,
    pad_id=PAD_ID,
    eos_id=EOS_ID,
    ignore_label_id=IGNORE_LABEL_ID,
    augmentation="none",          # materialised in the dataset: nothing to do on the fly
)


def encode_grid(grid: np.ndarray, offset: Tuple[int, int] = (0, 0),
                pad: int = PAD_ID) -> np.ndarray:
  """Grid [H, W] (0..9) -> tokens [900] int32 with the grid at `offset` (row, column).

  Colours become 2..11, an EOS row goes under the grid and an EOS column right of it (inside the
  canvas only; no corner cell), everything else is `pad` (PAD_ID for inputs, IGNORE_LABEL_ID for
  labels).
  """
  grid = np.asarray(grid)
  if grid.ndim != 2 or grid.size == 0:
    raise ValueError(f"encode_grid: expected a non-empty 2-D grid, got shape {grid.shape}")
  h, w = grid.shape
  r, c = (int(x) for x in offset)
  if r < 0 or c < 0 or r + h > MAX_SIZE or c + w > MAX_SIZE:
    raise ValueError(f"encode_grid: a {h}x{w} grid at offset ({r}, {c}) does not fit the "
                     f"{MAX_SIZE}x{MAX_SIZE} canvas")
  if grid.min() < 0 or grid.max() >= NUM_COLOURS:
    raise ValueError(f"encode_grid: colours must lie in 0..9, got {grid.min()}..{grid.max()}")
  canvas = np.full((MAX_SIZE, MAX_SIZE), pad, np.int32)
  canvas[r:r + h, c:c + w] = grid.astype(np.int32) + COLOUR_OFFSET
  if r + h < MAX_SIZE:
    canvas[r + h, c:c + w] = EOS_ID
  if c + w < MAX_SIZE:
    canvas[r:r + h, c + w] = EOS_ID
  return canvas.reshape(SEQ_LEN)


def encode_pair(inp: np.ndarray, out: np.ndarray, offset: Tuple[int, int] = (0, 0)
                ) -> Tuple[np.ndarray, np.ndarray]:
  """(inputs [900], labels [900]) int32 of one pair at one offset; label padding is -100."""
  return encode_grid(inp, offset), encode_grid(out, offset, pad=IGNORE_LABEL_ID)


def random_offset(rng: np.random.Generator, *shapes: Tuple[int, int]) -> Tuple[int, int]:
  """A uniform top-left offset at which every grid of `shapes` fits the canvas (the reference's)."""
  rows = max(s[0] for s in shapes)
  cols = max(s[1] for s in shapes)
  return (int(rng.integers(0, MAX_SIZE - rows + 1)), int(rng.integers(0, MAX_SIZE - cols + 1)))


def crop_batch(tokens: np.ndarray) -> List[np.ndarray]:
  """Tokens [N, 900] (or [N, 30, 30]) -> N grids [h, w] uint8: the reference's crop, vectorised.

  The reference scans rows r = 1..30 keeping num_c = the number of leading colour tokens (2..11) of
  every row so far (it only shrinks) and keeps the first (r, num_c) of largest area r * num_c; the
  grid is tokens[:r, :num_c] - 2. A first token that is not a colour gives a 0x0 grid.
  """
  tokens = np.asarray(tokens)
  n = tokens.shape[0]
  canvas = tokens.reshape(n, MAX_SIZE, MAX_SIZE)
  colour = (canvas >= COLOUR_OFFSET) & (canvas < COLOUR_OFFSET + NUM_COLOURS)  # [N, 30, 30]
  # Leading colour run of each row: the index of the first non-colour token (30 if none).
  first_bad = np.where(colour.all(axis=2), MAX_SIZE, np.argmin(colour, axis=2))  # [N, 30]
  num_c = np.minimum.accumulate(first_bad, axis=1)  # [N, 30]
  area = num_c * np.arange(1, MAX_SIZE + 1)[None, :]  # [N, 30]
  best = np.argmax(area, axis=1)  # [N] the first maximum, like the reference's strict '>'
  out = []
  for i in range(n):
    if area[i, best[i]] == 0:
      out.append(np.zeros((0, 0), np.uint8))
      continue
    rows, cols = int(best[i]) + 1, int(num_c[i, best[i]])
    out.append((canvas[i, :rows, :cols] - COLOUR_OFFSET).astype(np.uint8))
  return out


def crop(tokens: np.ndarray) -> np.ndarray:
  """Tokens [900] (or [30, 30]) -> grid [h, w] uint8 (see `crop_batch`)."""
  return crop_batch(np.asarray(tokens)[None])[0]


# --------------------------------------------------------------------------------------------
# Augmentations: the 8 dihedral transforms and colour permutations (0 fixed).

NUM_DIHEDRAL = 8
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)
DIHEDRAL_NAMES = ("identity", "rot90", "rot180", "rot270", "flip_lr", "flip_ud", "transpose",
                  "anti_transpose")


def dihedral_transform(grid: np.ndarray, dihedral: int) -> np.ndarray:
  """The dihedral transform `dihedral` (0..7, see the glossary) of a 2-D grid (a contiguous copy)."""
  grid = np.asarray(grid)
  if grid.ndim != 2:
    raise ValueError(f"dihedral_transform: expected a 2-D grid, got shape {grid.shape}")
  d = int(dihedral)
  if d == 0:
    out = grid
  elif d in (1, 2, 3):
    out = np.rot90(grid, k=d)
  elif d == 4:
    out = np.fliplr(grid)
  elif d == 5:
    out = np.flipud(grid)
  elif d == 6:
    out = grid.T
  elif d == 7:
    out = np.fliplr(np.rot90(grid, k=1))
  else:
    raise ValueError(f"dihedral id {dihedral!r} must lie in 0..7")
  return np.ascontiguousarray(out)


def inverse_dihedral_transform(grid: np.ndarray, dihedral: int) -> np.ndarray:
  """Undo `dihedral_transform(., dihedral)`."""
  if not 0 <= int(dihedral) < NUM_DIHEDRAL:
    raise ValueError(f"dihedral id {dihedral!r} must lie in 0..7")
  return dihedral_transform(grid, DIHEDRAL_INVERSE[int(dihedral)])


def check_colour_permutation(colours: Sequence[int]) -> np.ndarray:
  """`colours` as uint8 [10] after checking it is a permutation of 0..9 with colours[0] == 0."""
  perm = np.asarray(colours)
  if perm.shape != (NUM_COLOURS,) or sorted(perm.tolist()) != list(range(NUM_COLOURS)) or perm[0]:
    raise ValueError(f"colour map {list(np.ravel(perm))} must be a permutation of 0..9 with 0 -> 0")
  return perm.astype(np.uint8)


def random_colour_permutation(rng: np.random.Generator) -> np.ndarray:
  """A uniform colour map [10] uint8: 0 fixed, 1..9 permuted (the reference's draw)."""
  return np.concatenate([np.zeros(1, np.uint8), 1 + rng.permutation(9).astype(np.uint8)])


def invert_colour_permutation(colours: Sequence[int]) -> np.ndarray:
  """The inverse colour map [10] uint8: inverse[colours[c]] == c."""
  return np.argsort(check_colour_permutation(colours)).astype(np.uint8)


def apply_colour_permutation(grid: np.ndarray, colours: Sequence[int]) -> np.ndarray:
  """colours[grid]: every cell of colour c becomes colours[c]."""
  return check_colour_permutation(colours)[np.asarray(grid)]


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """A dihedral transform id and a colour map; `apply` = dihedral(colours[grid])."""
  dihedral: int
  colours: Tuple[int, ...]        # [10], colours[0] == 0

  def __post_init__(self):
    if not 0 <= int(self.dihedral) < NUM_DIHEDRAL:
      raise ValueError(f"dihedral id {self.dihedral!r} must lie in 0..7")
    object.__setattr__(self, "dihedral", int(self.dihedral))
    object.__setattr__(self, "colours", tuple(int(c) for c in
                                              check_colour_permutation(self.colours)))

  @property
  def is_identity(self) -> bool:
    return self.dihedral == 0 and self.colours == tuple(range(NUM_COLOURS))

  def apply(self, grid: np.ndarray) -> np.ndarray:
    """The augmented grid."""
    return dihedral_transform(np.asarray(self.colours, np.uint8)[np.asarray(grid)], self.dihedral)

  def invert(self, grid: np.ndarray) -> np.ndarray:
    """The original grid of an augmented one (e.g. a cropped prediction)."""
    inverse = np.argsort(np.asarray(self.colours)).astype(np.uint8)
    return inverse[inverse_dihedral_transform(grid, self.dihedral)]

  def to_string(self) -> str:
    """The reference's text form "t<d>_<colours>", e.g. "t0_0123456789" (identity)."""
    return f"t{self.dihedral}_" + "".join(str(c) for c in self.colours)

  @classmethod
  def from_string(cls, text: str) -> "Augmentation":
    if (len(text) != 13 or text[0] != "t" or text[2] != "_" or not text[1].isdigit()
        or not text[3:].isdigit()):
      raise ValueError(f"augmentation {text!r} is not of the form t<d>_<10 digits>")
    return cls(int(text[1]), tuple(int(ch) for ch in text[3:]))


IDENTITY = Augmentation(0, tuple(range(NUM_COLOURS)))

_AUGMENT_TRIES_FACTOR = 5          # the reference's ARCAugmentRetriesFactor
TAG_AUGMENT = 1
TAG_TRANSLATE = 2


def task_key(task_id: str) -> int:
  """A stable 64-bit integer of a task id (for seeding)."""
  return int.from_bytes(hashlib.sha256(task_id.encode("utf-8")).digest()[:8], "little")


def _grid_key(grid: np.ndarray) -> bytes:
  return bytes(grid.shape) + np.ascontiguousarray(grid, np.uint8).tobytes()


def _task_pairs(task: Task) -> List[Tuple[np.ndarray, Optional[np.ndarray]]]:
  return [(p.input, p.output) for p in task.train + task.test]


def _task_signature(pairs: Sequence[Tuple[np.ndarray, Optional[np.ndarray]]]) -> Tuple[bytes, ...]:
  """The task as a sorted tuple of its pairs' bytes: equal iff the same multiset of pairs."""
  return tuple(sorted(_grid_key(i) + b"|" + (b"-" if o is None else _grid_key(o))
                      for i, o in pairs))


def generate_augmentations(task: Task, num_aug: int, seed: int) -> List[Augmentation]:
  """The identity, then up to `num_aug` distinct augmentations of `task` (see the module docstring).

  Deterministic in (task id, num_aug, seed). An augmentation is dropped when the augmented task
  (every demonstration and test pair, outputs included when known) equals the original or one
  already kept; at most 5 * num_aug draws are made, so symmetric or few-colour tasks get fewer.
  """
  if num_aug < 0 or seed < 0:
    raise ValueError(f"task {task.task_id}: num_aug={num_aug} and seed={seed} must be >= 0")
  pairs = _task_pairs(task)
  out = [IDENTITY]
  if num_aug == 0:
    return out
  seen = {_task_signature(pairs)}
  rng = np.random.default_rng(np.random.SeedSequence([seed, TAG_AUGMENT, task_key(task.task_id)]))
  for _ in range(_AUGMENT_TRIES_FACTOR * num_aug):
    dihedral = int(rng.integers(0, NUM_DIHEDRAL))
    colours = random_colour_permutation(rng)
    signature = _task_signature([
        (dihedral_transform(colours[i], dihedral),
         None if o is None else dihedral_transform(colours[o], dihedral)) for i, o in pairs])
    if signature not in seen:
      seen.add(signature)
      out.append(Augmentation(dihedral, tuple(int(c) for c in colours)))
      if len(out) >= num_aug + 1:
        break
  return out
