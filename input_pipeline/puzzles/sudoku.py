"""Sudoku in pure numpy/Python: encoding, validators, augmentation.

Everything the Sudoku datasets need that is not TensorFlow lives here and in its two siblings,
`sudoku_generator` (the exact solver and the puzzle generator) and `sudoku_csv` (the Sudoku-Extreme
CSV files), so it can be used (and tested) without TF: the TFDS builders in
`input_pipeline.builders` and the tf.data augmentation in `input_pipeline.pipeline` are checked
against these functions.

Grids and tokens:
  * a *grid* is an int array of 81 cells, row-major, 0 = blank and 1..9 = digits;
  * a *token* sequence is what the model sees (reference TRM encoding, vocab 11):
    0 = pad, 1 = blank, 2..10 = digits 1..9, i.e. `tokens = grid + 1`. Labels are the solution's
    tokens (2..10); Sudoku has no ignored label positions.
  * a *string* is 81 characters, '.' or '0' for a blank and '1'..'9' for a digit.

Augmentation (numpy reference of the reference recipe's Sudoku augmentation): a digit permutation
(pad and blank fixed), transpose with probability 0.5, a permutation of the 3 bands and of the rows
within each band, and of the 3 stacks and the columns within each stack; the same map is applied to
puzzle and solution.

Synopsis:
  import numpy as np
  from input_pipeline.puzzles import sudoku, sudoku_generator
  q, s = sudoku_generator.generate_puzzles(8, seed=0, givens=30)    # [8, 81] uint8 digits
  tokens = sudoku.grid_to_tokens(q)                                # [8, 81] int32, 1..10
  assert sudoku.is_valid_pair(q, s).all()
  t = sudoku.sample_transform(np.random.default_rng(0))
  aug_q = sudoku.apply_transform(tokens[0], t)                     # [81]
  aug_s = sudoku.apply_transform(sudoku.grid_to_tokens(s[0]), t)   # same map on the solution
"""
from __future__ import annotations

import dataclasses

import numpy as np

from input_pipeline import errors
from input_pipeline import puzzles

# --------------------------------------------------------------------------------------------
# Encoding.

PAD_ID = 0
BLANK_ID = 1
NUM_CELLS = 81
VOCAB_SIZE = 11
IGNORE_LABEL_ID = puzzles.IGNORE_LABEL_ID

# The metadata shared by every Sudoku dataset (the trainer validates its config against it).
METADATA: dict = dict(
    vocab_size=VOCAB_SIZE,
    seq_len=NUM_CELLS,
    num_puzzle_identifiers=1,
    pad_id=PAD_ID,
    blank_id=BLANK_ID,
    ignore_label_id=IGNORE_LABEL_ID,
    augmentation="sudoku",
)

_BLANK_CHARS = ".0"
QUESTION_ALPHABET = ".0123456789"
ANSWER_ALPHABET = "123456789"


class SudokuDataError(errors.DataError):
  """A Sudoku string or CSV row is malformed (the message names the file, line and field)."""


def parse_grid(text: str) -> np.ndarray:
  """81-char string ('.' or '0' blank, '1'..'9') -> grid [81] uint8 with 0 blank."""
  if len(text) != NUM_CELLS:
    raise SudokuDataError(f"grid string has {len(text)} characters, expected {NUM_CELLS}")
  bad = sorted(set(text) - set(QUESTION_ALPHABET))
  if bad:
    raise SudokuDataError(f"grid string has characters {bad!r} outside '.0-9'")
  arr = np.frombuffer(text.encode("ascii"), np.uint8)
  return np.where(arr == ord("."), 0, arr - ord("0")).astype(np.uint8)  # [81]


def format_grid(grid: np.ndarray) -> str:
  """Grid [81] (0 blank) -> 81-char string with '.' for blanks."""
  grid = np.asarray(grid).reshape(NUM_CELLS)
  return "".join("." if d == 0 else str(int(d)) for d in grid)


def grid_to_tokens(grid: np.ndarray) -> np.ndarray:
  """Grid(s) [..., 81] with 0 blank -> tokens int32 [..., 81] (1 blank, 2..10 digits)."""
  grid = np.asarray(grid)
  if grid.size and (grid.min() < 0 or grid.max() > 9):
    raise ValueError("grid values must lie in 0..9")
  return grid.astype(np.int32) + 1


def tokens_to_grid(tokens: np.ndarray) -> np.ndarray:
  """Tokens [..., 81] (1 blank, 2..10 digits) -> grid uint8 [..., 81]; pad (0) is an error."""
  tokens = np.asarray(tokens)
  if tokens.size and (tokens.min() < 1 or tokens.max() > 10):
    raise ValueError("Sudoku tokens must lie in 1..10 (pad or unknown token found)")
  return (tokens - 1).astype(np.uint8)


def string_to_tokens(text: str) -> np.ndarray:
  """81-char string -> tokens int32 [81]."""
  return grid_to_tokens(parse_grid(text))


# --------------------------------------------------------------------------------------------
# Numpy validators (batched).

def _unit_index() -> np.ndarray:
  """[27, 9] cell indices of the rows, columns and boxes."""
  cells = np.arange(NUM_CELLS).reshape(9, 9)
  rows = cells
  cols = cells.T
  boxes = cells.reshape(3, 3, 3, 3).transpose(0, 2, 1, 3).reshape(9, 9)
  return np.concatenate([rows, cols, boxes], axis=0)


UNIT_CELLS = _unit_index()  # [27, 9]


def _unit_masks(grid: np.ndarray) -> np.ndarray:
  """Digit grid [N, 81] -> [N, 27] OR of 1 << (d - 1) over each unit's cells (blanks ignored)."""
  grid = np.asarray(grid).astype(np.int32)
  bits = np.where(grid > 0, np.left_shift(1, np.maximum(grid - 1, 0)), 0)  # [N, 81]
  return np.bitwise_or.reduce(bits[:, UNIT_CELLS], axis=-1)  # [N, 27]


def solution_errors(grids: np.ndarray) -> np.ndarray:
  """Index of the first unit (0-8 rows, 9-17 cols, 18-26 boxes) that is not a permutation of 1..9.

  Args:
    grids: digit grids [N, 81].
  Returns:
    int [N], -1 where the grid is a valid complete solution.
  """
  grids = np.asarray(grids).reshape(-1, NUM_CELLS)
  in_range = (grids >= 1) & (grids <= 9)  # [N, 81]
  masks = _unit_masks(np.where(in_range, grids, 0))  # [N, 27]
  bad = masks != 0x1FF  # [N, 27]
  first = np.where(bad.any(axis=1), bad.argmax(axis=1), -1)
  return first


def is_valid_solution(grids: np.ndarray) -> np.ndarray:
  """Digit grid(s) [..., 81] -> bool [...]: a complete grid whose 27 units each hold 1..9."""
  grids = np.asarray(grids)
  batch_shape = grids.shape[:-1]
  return (solution_errors(grids.reshape(-1, NUM_CELLS)) < 0).reshape(batch_shape)


def agrees_with_givens(puzzles: np.ndarray, solutions: np.ndarray) -> np.ndarray:
  """Digit grids [..., 81] -> bool [...]: every given (non-zero) puzzle cell equals the solution."""
  puzzles = np.asarray(puzzles)
  solutions = np.asarray(solutions)
  return np.all((puzzles == 0) | (puzzles == solutions), axis=-1)


def is_valid_pair(puzzles: np.ndarray, solutions: np.ndarray) -> np.ndarray:
  """bool [...]: the solution is valid and agrees with every given of the puzzle."""
  return is_valid_solution(solutions) & agrees_with_givens(puzzles, solutions)


def describe_unit(unit: int) -> str:
  kind = ("row", "column", "box")[unit // 9]
  return f"{kind} {unit % 9 + 1}"


# --------------------------------------------------------------------------------------------
# Augmentation (numpy reference).

@dataclasses.dataclass(frozen=True)
class SudokuTransform:
  """One validity-preserving Sudoku symmetry.

  Applied to a [9, 9] token grid x: if `transpose`, x = x.T; then out[i, j] = x[row_perm[i],
  col_perm[j]]; then digit tokens are renamed: token 2 + d -> 2 + digit_perm[d] (pad 0 and
  blank 1 fixed).
  """
  digit_perm: np.ndarray  # [9], a permutation of 0..8
  transpose: bool
  row_perm: np.ndarray  # [9], 3 * band_perm[a] + rows_in_band[a, b] at 3 * a + b
  col_perm: np.ndarray  # [9], likewise with stacks and columns within a stack


def band_permutation(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
  """[3] band (or stack) permutation and [3, 3] within-band permutations -> [9] row permutation."""
  outer = np.asarray(outer)
  inner = np.asarray(inner)
  return (3 * outer[:, None] + inner).reshape(9)


def is_band_permutation(perm: np.ndarray) -> bool:
  """Whether a [9] row (column) permutation keeps every band (stack) together."""
  perm = np.asarray(perm)
  if sorted(perm.tolist()) != list(range(9)):
    return False
  bands = perm.reshape(3, 3) // 3
  return bool(np.all(bands == bands[:, :1]))


def sample_transform(rng: np.random.Generator) -> SudokuTransform:
  """A uniformly random element of the Sudoku augmentation group (transpose with p = 0.5)."""
  digit_perm = rng.permutation(9)
  transpose = bool(rng.random() < 0.5)
  row_perm = band_permutation(rng.permutation(3), np.stack([rng.permutation(3) for _ in range(3)]))
  col_perm = band_permutation(rng.permutation(3), np.stack([rng.permutation(3) for _ in range(3)]))
  return SudokuTransform(digit_perm=digit_perm, transpose=transpose, row_perm=row_perm,
                         col_perm=col_perm)


def transform_positions(t: SudokuTransform) -> np.ndarray:
  """[81] source cell of each output cell: out.flat[i] = src.flat[positions[i]]."""
  rows = np.asarray(t.row_perm)[:, None]  # [9, 1]
  cols = np.asarray(t.col_perm)[None, :]  # [1, 9]
  pos = cols * 9 + rows if t.transpose else rows * 9 + cols  # [9, 9]
  return pos.reshape(NUM_CELLS)


def digit_token_map(digit_perm: np.ndarray) -> np.ndarray:
  """[9] digit permutation -> [11] token lookup table (pad and blank fixed)."""
  return np.concatenate([[PAD_ID, BLANK_ID], 2 + np.asarray(digit_perm)]).astype(np.int32)


def apply_transform(tokens: np.ndarray, t: SudokuTransform) -> np.ndarray:
  """Apply a transform to token sequences [..., 81] (tokens 0..10)."""
  tokens = np.asarray(tokens)
  moved = tokens[..., transform_positions(t)]  # [..., 81]
  return digit_token_map(t.digit_perm)[moved]


def augment_pair(puzzle_tokens: np.ndarray, solution_tokens: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """The reference augmentation: one random transform applied to puzzle and solution tokens [81]."""
  t = sample_transform(rng)
  return apply_transform(puzzle_tokens, t), apply_transform(solution_tokens, t)
