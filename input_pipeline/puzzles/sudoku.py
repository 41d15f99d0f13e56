"""Sudoku in pure numpy/Python: encoding, exact solver, puzzle generator, CSV reader, augmentation.

Everything the Sudoku datasets need that is not TensorFlow lives here, so it can be used (and
tested) without TF: the TFDS builders in `input_pipeline.builders` and the tf.data augmentation in
`input_pipeline.pipeline` are checked against these functions.

Grids and tokens:
  * a *grid* is an int array of 81 cells, row-major, 0 = blank and 1..9 = digits;
  * a *token* sequence is what the model sees (reference TRM encoding, vocab 11):
    0 = pad, 1 = blank, 2..10 = digits 1..9, i.e. `tokens = grid + 1`. Labels are the solution's
    tokens (2..10); Sudoku has no ignored label positions.
  * a *string* is 81 characters, '.' or '0' for a blank and '1'..'9' for a digit.

Solver: bitmask constraint propagation (naked and hidden singles to a fixpoint) plus depth-first
search on the cell with the fewest candidates (MRV). `count_solutions(grid, limit=2)` decides
uniqueness.

Generator: `generate_puzzles(n, seed, givens=30)` draws a random solved grid (random diagonal
boxes, completed by the solver with random digit order) and digs holes in random cell order,
removing a clue only when the puzzle stays uniquely solvable (removing cell c of value v keeps
uniqueness iff no solution has c != v, which the solver refutes cheaply), until exactly `givens`
clues remain. If the greedy dig gets stuck above `givens` (a minimal puzzle), a fresh grid is
drawn. The difficulty knobs:
  * `givens`: the number of clues (fewer = harder; 17 is the theoretical minimum, below ~23 the
    dig rarely succeeds and generation gets slow);
  * `min_rating` / `max_rating`: the technique rating of `rate_puzzle`: 0 = solvable by naked and
    hidden singles alone, r > 0 = the complete search tree of the singles-propagating MRV solver has
    r branching nodes (guesses). E.g. `min_rating=1` keeps only puzzles that need search.
Puzzle i is a pure function of (seed, stream, i, knobs), so the output is identical whatever
`num_workers` is. Measured on the 2-core development machine (AMD EPYC, Python 3.11, idle): 10,000
puzzles took 15.6 s with num_workers=1 and 8.4 s with 2 spawned workers at the default `givens=30`,
7.7 s and 4.0 s at `givens=45` (the `make run` dataset). Per puzzle and worker: givens=36 ~2 ms, 30 ~2 ms, 26 ~6-8 ms, 24 ~16 ms, 24 with
min_rating=1 ~57 ms (about half of the 24-clue puzzles need search).

Augmentation (numpy reference of the reference recipe's Sudoku augmentation): a digit permutation
(pad and blank fixed), transpose with probability 0.5, a permutation of the 3 bands and of the rows
within each band, and of the 3 stacks and the columns within each stack; the same map is applied to
puzzle and solution.

Synopsis:
  from input_pipeline.puzzles import sudoku
  q, s = sudoku.generate_puzzles(100, seed=0, givens=30)          # [100, 81] uint8 digits
  assert sudoku.count_solutions(q[0], limit=2) == 1
  tokens = sudoku.grid_to_tokens(q)                                # [100, 81] int32, 1..10
  data = sudoku.read_sudoku_csv("train.csv")                       # validated Sudoku-Extreme CSV
  t = sudoku.sample_transform(np.random.default_rng(0))
  aug_q = sudoku.apply_transform(tokens[0], t)                     # [81]
  aug_s = sudoku.apply_transform(sudoku.grid_to_tokens(s[0]), t)   # same map on the solution
"""

from __future__ import annotations

import csv
import dataclasses
import multiprocessing
import os
import random
from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np

from input_pipeline import errors
from input_pipeline import puzzles
from input_pipeline.puzzles import puzzle_csv

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
_QUESTION_ALPHABET = ".0123456789"
_ANSWER_ALPHABET = "123456789"


class SudokuDataError(errors.DataError):
  """A Sudoku string or CSV row is malformed (the message names the file, line and field)."""


def parse_grid(text: str) -> np.ndarray:
  """81-char string ('.' or '0' blank, '1'..'9') -> grid [81] uint8 with 0 blank."""
  if len(text) != NUM_CELLS:
    raise SudokuDataError(f"grid string has {len(text)} characters, expected {NUM_CELLS}")
  bad = sorted(set(text) - set(_QUESTION_ALPHABET))
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


def _describe_unit(unit: int) -> str:
  kind = ("row", "column", "box")[unit // 9]
  return f"{kind} {unit % 9 + 1}"


# --------------------------------------------------------------------------------------------
# Solver: bitmask singles propagation + MRV depth-first search.

_ROW = [c // 9 for c in range(NUM_CELLS)]
_COL = [c % 9 for c in range(NUM_CELLS)]
_BOX = [(c // 27) * 3 + (c % 9) // 3 for c in range(NUM_CELLS)]
_UNITS: list[tuple[int, ...]] = [tuple(int(c) for c in u) for u in UNIT_CELLS]
_POPCOUNT = [bin(m).count("1") for m in range(512)]
_BIT_TO_DIGIT = {1 << d: d + 1 for d in range(9)}
_ALL = 0x1FF
_FULL_ALLOWED = [_ALL] * NUM_CELLS


class _State:
  """Solver state: cell bit per cell (0 = empty), used-digit masks per row/col/box, empty cells."""

  __slots__ = ("cells", "rows", "cols", "boxes", "empties")

  def __init__(self, cells, rows, cols, boxes, empties):
    self.cells = cells
    self.rows = rows
    self.cols = cols
    self.boxes = boxes
    self.empties = empties

  def copy(self) -> "_State":
    return _State(self.cells[:], self.rows[:], self.cols[:], self.boxes[:], self.empties)

  def assign(self, c: int, bit: int) -> None:
    self.cells[c] = bit
    self.rows[_ROW[c]] |= bit
    self.cols[_COL[c]] |= bit
    self.boxes[_BOX[c]] |= bit

  def unassign(self, c: int) -> None:
    bit = self.cells[c]
    self.cells[c] = 0
    self.rows[_ROW[c]] &= ~bit
    self.cols[_COL[c]] &= ~bit
    self.boxes[_BOX[c]] &= ~bit


def _state_from_grid(grid: Sequence[int]) -> Optional[_State]:
  """Build a state; None if two givens clash."""
  cells = [0] * NUM_CELLS
  rows = [0] * 9
  cols = [0] * 9
  boxes = [0] * 9
  empties = []
  for c in range(NUM_CELLS):
    d = int(grid[c])
    if d == 0:
      empties.append(c)
      continue
    if not 1 <= d <= 9:
      raise ValueError(f"grid cell {c} has value {d}, expected 0..9")
    bit = 1 << (d - 1)
    r, k, b = _ROW[c], _COL[c], _BOX[c]
    if (rows[r] | cols[k] | boxes[b]) & bit:
      return None
    cells[c] = bit
    rows[r] |= bit
    cols[k] |= bit
    boxes[b] |= bit
  return _State(cells, rows, cols, boxes, empties)


def _propagate(s: _State, allowed: list[int]) -> Optional[tuple[int, int]]:
  """Apply naked and hidden singles to a fixpoint, in place.

  Returns:
    None on a contradiction; (-1, 0) when solved; else (cell, candidate mask) of an empty cell with
    the fewest candidates (the branching cell).
  """
  rows, cols, boxes, cells = s.rows, s.cols, s.boxes, s.cells
  row_of, col_of, box_of, popcount = _ROW, _COL, _BOX, _POPCOUNT
  empties = s.empties
  while True:
    cand = [0] * NUM_CELLS
    rest = []
    changed = False
    for c in empties:
      if cells[c]:
        continue  # filled by a hidden single in the previous pass
      r = row_of[c]
      k = col_of[c]
      b = box_of[c]
      m = allowed[c] & ~(rows[r] | cols[k] | boxes[b])
      if not m:
        s.empties = rest
        return None
      if m & (m - 1):
        cand[c] = m
        rest.append(c)
      else:  # naked single
        cells[c] = m
        rows[r] |= m
        cols[k] |= m
        boxes[b] |= m
        changed = True
    empties = rest
    s.empties = rest
    if changed:
      continue
    if not empties:
      return (-1, 0)
    # Hidden singles: a digit with exactly one candidate cell in a unit goes there.
    used_of_unit = rows + cols + boxes
    for u, unit in enumerate(_UNITS):
      once = 0
      twice = 0
      for c in unit:
        m = cand[c]
        twice |= once & m
        once |= m
      placed = used_of_unit[u]
      if (once | placed) != _ALL:
        return None  # some digit has no place left in this unit
      hidden = once & ~twice
      if not hidden:
        continue
      for c in unit:
        m = cand[c] & hidden
        if not m:
          continue
        if m & (m - 1):
          return None  # one cell is the only place for two digits
        r = row_of[c]
        k = col_of[c]
        b = box_of[c]
        if cells[c] or (rows[r] | cols[k] | boxes[b]) & m:
          continue  # stale: an earlier deduction of this pass interferes; the next pass decides
        cells[c] = m
        rows[r] |= m
        cols[k] |= m
        boxes[b] |= m
        changed = True
    if changed:
      continue
    best = -1
    best_n = 10
    for c in empties:
      n = popcount[cand[c]]
      if n < best_n:
        best_n = n
        best = c
        if n == 2:
          break
    return (best, cand[best])


def _search(s: _State, allowed: list[int], limit: int, out: list, rng: Optional[random.Random],
            stats: Optional[list[int]]) -> int:
  """Depth-first search: appends solutions (cell-bit lists) to `out`, up to `limit`; their count."""
  res = _propagate(s, allowed)
  if res is None:
    return 0
  cell, mask = res
  if cell < 0:
    out.append(s.cells[:])
    return 1
  if stats is not None:
    stats[0] += 1
  bits = []
  m = mask
  while m:
    low = m & -m
    bits.append(low)
    m ^= low
  if rng is not None:
    rng.shuffle(bits)
  found = 0
  for bit in bits:
    child = s.copy()
    child.assign(cell, bit)
    child.empties = [c for c in s.empties if c != cell]
    found += _search(child, allowed, limit - found, out, rng, stats)
    if found >= limit:
      break
  return found


def _cells_to_grid(cells: list[int]) -> np.ndarray:
  return np.array([_BIT_TO_DIGIT[b] for b in cells], np.uint8)


def solve(grid: np.ndarray | Sequence[int], limit: int = 1) -> list[np.ndarray]:
  """Up to `limit` solutions (digit grids [81] uint8) of the digit grid [81] (0 blank)."""
  state = _state_from_grid(list(np.asarray(grid).reshape(NUM_CELLS)))
  if state is None:
    return []
  out: list = []
  _search(state, _FULL_ALLOWED, limit, out, None, None)
  return [_cells_to_grid(c) for c in out]


def count_solutions(grid: np.ndarray | Sequence[int], limit: int = 2) -> int:
  """Number of solutions of the digit grid [81], stopping at `limit` (2 decides uniqueness)."""
  state = _state_from_grid(list(np.asarray(grid).reshape(NUM_CELLS)))
  if state is None:
    return 0
  return _search(state, _FULL_ALLOWED, limit, [], None, None)


def rate_puzzle(grid: np.ndarray | Sequence[int]) -> int:
  """Technique rating of a uniquely solvable puzzle [81].

  0 = naked and hidden singles suffice; otherwise the number of guesses (branching nodes) in the
  complete search tree of the singles-propagating MRV solver, which does not depend on the order
  in which digits are tried. -1 if there is no solution. (Meant for proper puzzles: the tree of a
  puzzle with very many solutions is huge.)
  """
  state = _state_from_grid(list(np.asarray(grid).reshape(NUM_CELLS)))
  if state is None:
    return -1
  stats = [0]
  found = _search(state, _FULL_ALLOWED, 1 << 30, [], None, stats)
  return stats[0] if found else -1


# --------------------------------------------------------------------------------------------
# Generator.

def _random_solution(rng: random.Random) -> list[int]:
  """A random solved grid as a list of 81 digits."""
  while True:
    state = _State([0] * NUM_CELLS, [0] * 9, [0] * 9, [0] * 9, [])
    for box in (0, 4, 8):  # the diagonal boxes are independent of each other
      digits = list(range(9))
      rng.shuffle(digits)
      r0, c0 = (box // 3) * 3, (box % 3) * 3
      for i, d in enumerate(digits):
        state.assign((r0 + i // 3) * 9 + c0 + i % 3, 1 << d)
    state.empties = [c for c in range(NUM_CELLS) if not state.cells[c]]
    out: list = []
    if _search(state, _FULL_ALLOWED, 1, out, rng, None):
      return [_BIT_TO_DIGIT[b] for b in out[0]]


def _has_other_solution(state: _State, cell: int, bit: int) -> bool:
  """Whether a puzzle, uniquely solvable before `cell` (solution value `bit`) was blanked, now has a
  solution with a different value at `cell`."""
  allowed_mask = _ALL & ~bit & ~(state.rows[_ROW[cell]] | state.cols[_COL[cell]] |
                                 state.boxes[_BOX[cell]])
  if not allowed_mask:
    return False  # naked single: every other digit is seen by a peer
  allowed = _FULL_ALLOWED[:]
  allowed[cell] = allowed_mask
  probe = state.copy()
  probe.empties = [c for c in range(NUM_CELLS) if not probe.cells[c]]
  return _search(probe, allowed, 1, [], None, None) > 0


def _dig(solution: list[int], givens: int, rng: random.Random) -> Optional[list[int]]:
  """Greedy random dig down to `givens` clues keeping uniqueness; None if it gets stuck above."""
  state = _state_from_grid(solution)
  assert state is not None
  order = list(range(NUM_CELLS))
  rng.shuffle(order)
  count = NUM_CELLS
  for cell in order:
    if count == givens:
      break
    bit = state.cells[cell]
    state.unassign(cell)
    if _has_other_solution(state, cell, bit):
      state.assign(cell, bit)
    else:
      count -= 1
  if count != givens:
    return None
  return [_BIT_TO_DIGIT[b] if b else 0 for b in state.cells]


@dataclasses.dataclass(frozen=True)
class GeneratorOptions:
  """The knobs that define a generated puzzle distribution (see the module docstring)."""
  givens: int = 30
  min_rating: int = 0
  max_rating: Optional[int] = None
  max_attempts: int = 10_000


def _generate_one(seed: int, stream: str, index: int,
                  options: GeneratorOptions) -> tuple[list[int], list[int]]:
  rng = random.Random(f"podlab-sudoku/{seed}/{stream}/{index}")  # str seeds hash with SHA-512
  for _ in range(options.max_attempts):
    solution = _random_solution(rng)
    puzzle = _dig(solution, options.givens, rng)
    if puzzle is None:
      continue
    if options.min_rating > 0 or options.max_rating is not None:
      rating = rate_puzzle(puzzle)
      if rating < options.min_rating or (options.max_rating is not None and
                                         rating > options.max_rating):
        continue
    return puzzle, solution
  raise RuntimeError(
      f"no puzzle with givens={options.givens}, min_rating={options.min_rating}, "
      f"max_rating={options.max_rating} after {options.max_attempts} attempts "
      f"(seed={seed}, stream={stream!r}, index={index}); use more givens or a wider rating range")


def _generate_range(args: tuple[int, str, int, int, GeneratorOptions]) -> tuple[bytes, bytes]:
  seed, stream, start, stop, options = args
  puzzles = np.zeros((stop - start, NUM_CELLS), np.uint8)
  solutions = np.zeros((stop - start, NUM_CELLS), np.uint8)
  for i in range(start, stop):
    p, s = _generate_one(seed, stream, i, options)
    puzzles[i - start] = p
    solutions[i - start] = s
  return puzzles.tobytes(), solutions.tobytes()


def generate_puzzles(n: int, seed: int, givens: int = 30, *, min_rating: int = 0,
                     max_rating: Optional[int] = None, stream: str = "", start_index: int = 0,
                     num_workers: int = 1,
                     max_attempts: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
  """Generate `n` uniquely solvable puzzles with exactly `givens` clues.

  Args:
    n: number of puzzles.
    seed: integer seed; puzzle i is a pure function of (seed, stream, start_index + i, knobs).
    givens: number of clues (17..81).
    min_rating, max_rating: keep only puzzles whose `rate_puzzle` lies in the range.
    stream: a name separating independent streams with the same seed (e.g. "train", "test").
    start_index: index of the first puzzle in the stream.
    num_workers: processes to use (the output does not depend on it).
    max_attempts: fresh solution grids to try per puzzle before giving up.
  Returns:
    (puzzles, solutions): uint8 digit grids [n, 81], 0 = blank in puzzles.
  """
  if not 17 <= givens <= NUM_CELLS:
    raise ValueError(f"givens={givens} is out of range: a unique Sudoku needs 17..81 clues")
  if n < 0:
    raise ValueError(f"n={n} must be >= 0")
  options = GeneratorOptions(givens=givens, min_rating=min_rating, max_rating=max_rating,
                             max_attempts=max_attempts)
  # Puzzle i depends only on i, so the chunking (and the worker count) never changes the output.
  chunk = max(1, min(256, -(-n // (4 * max(1, num_workers)))))
  tasks = [(seed, stream, start_index + a, start_index + min(a + chunk, n), options)
           for a in range(0, n, chunk)]
  num_workers = max(1, min(num_workers, len(tasks)))
  if num_workers == 1:
    results = [_generate_range(t) for t in tasks]
  else:
    # "spawn": the caller may already run JAX/TF threads, and forking a multithreaded process can
    # deadlock. Spawned workers start clean, but re-import the caller's __main__: call this from a
    # script guarded by `if __name__ == "__main__":` (as every podlab entry point is).
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(num_workers) as pool:
      results = pool.map(_generate_range, tasks, chunksize=1)
  puzzles = np.frombuffer(b"".join(r[0] for r in results), np.uint8).reshape(n, NUM_CELLS)
  solutions = np.frombuffer(b"".join(r[1] for r in results), np.uint8).reshape(n, NUM_CELLS)
  return puzzles.copy(), solutions.copy()


def default_num_workers() -> int:
  """Worker processes for generation: the CPUs this process may use, at most 8."""
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:
    cpus = os.cpu_count() or 1
  return max(1, min(8, cpus))


# --------------------------------------------------------------------------------------------
# Sudoku-Extreme CSV.

CSV_HEADER = ("source", "question", "answer", "rating")


@dataclasses.dataclass
class SudokuCsv:
  """A validated Sudoku-Extreme CSV file."""
  questions: np.ndarray  # [N, 81] uint8 digit grids, 0 = blank
  answers: np.ndarray  # [N, 81] uint8 digit grids
  ratings: np.ndarray  # [N] int64
  line_numbers: np.ndarray  # [N] int64, 1-based line of each row in the file

  def __len__(self) -> int:
    return int(self.ratings.shape[0])


def _bulk_check(path: str, questions: list[str], answers: list[str], lines: list[int]) -> None:
  """Vectorised checks of already syntax-checked rows: givens agree, answer is a valid solution."""
  if not questions:
    return
  n = len(questions)
  q = np.frombuffer("".join(questions).encode("ascii"), np.uint8).reshape(n, NUM_CELLS)
  a = np.frombuffer("".join(answers).encode("ascii"), np.uint8).reshape(n, NUM_CELLS)
  q = np.where((q == ord(".")) | (q == ord("0")), 0, q - ord("0")).astype(np.uint8)
  a = (a - ord("0")).astype(np.uint8)
  disagree = (q != 0) & (q != a)  # [n, 81]
  bad_consistency = disagree.any(axis=1)
  unit_errors = solution_errors(a)
  bad = bad_consistency | (unit_errors >= 0)
  if not bad.any():
    return
  i = int(bad.argmax())
  if unit_errors[i] >= 0:
    unit = int(unit_errors[i])
    raise SudokuDataError(
        f"{path}:{lines[i]}: answer is not a valid Sudoku solution "
        f"({_describe_unit(unit)} does not hold each digit 1-9 once)")
  cell = int(disagree[i].argmax())
  raise SudokuDataError(
      f"{path}:{lines[i]}: answer disagrees with the question at row {cell // 9 + 1}, column "
      f"{cell % 9 + 1} (question gives {questions[i][cell]}, answer has {answers[i][cell]})")


def _row_error(row: list[str]) -> Optional[str]:
  """Syntax error of one CSV row, or None."""
  if len(row) != 4:
    return f"row has {len(row)} fields, expected 4 ({','.join(CSV_HEADER)})"
  _, question, answer, rating = row
  if len(question) != NUM_CELLS:
    return f"question has {len(question)} characters, expected {NUM_CELLS}"
  if question.strip(_QUESTION_ALPHABET):  # strip leaves a remainder iff a character is outside
    bad = sorted(set(question) - set(_QUESTION_ALPHABET))
    return f"question has characters {bad!r} outside '.1-9' (or '0' for a blank)"
  if len(answer) != NUM_CELLS:
    return f"answer has {len(answer)} characters, expected {NUM_CELLS}"
  if answer.strip(_ANSWER_ALPHABET):
    bad = sorted(set(answer) - set(_ANSWER_ALPHABET))
    return f"answer has characters {bad!r} outside '1-9'"
  try:
    int(rating)
  except ValueError:
    return f"rating {rating!r} is not an integer"
  return None


def read_sudoku_csv(path: str | os.PathLike, chunk_rows: int = 262_144) -> SudokuCsv:
  """Read and validate a Sudoku-Extreme CSV (`source,question,answer,rating`).

  Every row is checked; the first malformed row raises `SudokuDataError` naming
  `path:line`, the field and what is wrong. Nothing is dropped silently.
  """
  path_str = os.fspath(path)
  questions_all: list[np.ndarray] = []
  answers_all: list[np.ndarray] = []
  ratings: list[int] = []
  lines_all: list[int] = []
  qs: list[str] = []
  ans: list[str] = []
  lines: list[int] = []

  def flush() -> None:
    _bulk_check(path_str, qs, ans, lines)
    if qs:
      n = len(qs)
      q = np.frombuffer("".join(qs).encode("ascii"), np.uint8).reshape(n, NUM_CELLS)
      questions_all.append(np.where((q == ord(".")) | (q == ord("0")), 0,
                                    q - ord("0")).astype(np.uint8))
      a = np.frombuffer("".join(ans).encode("ascii"), np.uint8).reshape(n, NUM_CELLS)
      answers_all.append((a - ord("0")).astype(np.uint8))
      lines_all.extend(lines)
    qs.clear()
    ans.clear()
    lines.clear()

  for line, row in puzzle_csv.rows(path_str, CSV_HEADER, SudokuDataError):
    error = _row_error(row)
    if error is not None:
      _bulk_check(path_str, qs, ans, lines)  # report an earlier bad row first
      raise SudokuDataError(f"{path_str}:{line}: {error}")
    qs.append(row[1])
    ans.append(row[2])
    lines.append(line)
    ratings.append(int(row[3]))
    if len(qs) >= chunk_rows:
      flush()
  flush()
  if questions_all:
    questions = np.concatenate(questions_all)
    answers = np.concatenate(answers_all)
  else:
    questions = np.zeros((0, NUM_CELLS), np.uint8)
    answers = np.zeros((0, NUM_CELLS), np.uint8)
  return SudokuCsv(questions=questions, answers=answers, ratings=np.asarray(ratings, np.int64),
                   line_numbers=np.asarray(lines_all, np.int64))


def write_sudoku_csv(path: str | os.PathLike, questions: Iterable[np.ndarray],
                     answers: Iterable[np.ndarray], ratings: Iterable[int],
                     source: str = "podlab") -> None:
  """Write digit grids in the Sudoku-Extreme CSV format ('.' blanks)."""
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for q, a, r in zip(questions, answers, ratings):
      writer.writerow([source, format_grid(q), format_grid(a).replace(".", "0"), int(r)])


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
