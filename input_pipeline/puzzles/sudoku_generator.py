"""Sudoku's exact solver and the puzzle generator built on it (pure Python/numpy; the encoding and
validators are in `sudoku`).

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
7.7 s and 4.0 s at `givens=45` (the `make run` dataset). Per puzzle and worker: givens=36 ~2 ms,
30 ~2 ms, 26 ~6-8 ms, 24 ~16 ms, 24 with min_rating=1 ~57 ms (about half of the 24-clue puzzles
need search).

Synopsis:
  import numpy as np
  from input_pipeline.puzzles import sudoku_generator
  q, s = sudoku_generator.generate_puzzles(100, seed=0, givens=30)  # [100, 81] uint8 digits
  assert sudoku_generator.count_solutions(q[0], limit=2) == 1
  assert np.array_equal(sudoku_generator.solve(q[0])[0], s[0])
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
from collections.abc import Sequence
from typing import Optional

import numpy as np

from input_pipeline.puzzles import sudoku

NUM_CELLS = sudoku.NUM_CELLS

# --------------------------------------------------------------------------------------------
# Solver: bitmask singles propagation + MRV depth-first search.

_ROW = [c // 9 for c in range(NUM_CELLS)]
_COL = [c % 9 for c in range(NUM_CELLS)]
_BOX = [(c // 27) * 3 + (c % 9) // 3 for c in range(NUM_CELLS)]
_UNITS: list[tuple[int, ...]] = [tuple(int(c) for c in u) for u in sudoku.UNIT_CELLS]
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
