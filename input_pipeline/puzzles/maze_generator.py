"""The maze generator of the `maze_generated` dataset (pure Python/numpy; the encoding, BFS and
validation are in `maze`).

Generator (`generate_mazes`): a 15 x 15 lattice of open cells at every other row and column of the
30 x 30 grid (offset 0 or 1 per axis, at random), joined into a spanning tree by a randomized
depth-first search (long winding corridors, walls everywhere else), then every remaining wall
between two lattice cells opened with probability `loop_prob` (default 0.05, ~10 loops: so that
"shortest" matters; 0 = a perfect maze with a single path; loops shorten paths, and above ~0.1
paths longer than 110 get rare).
S is a uniformly random open cell and G a uniformly random open cell whose BFS distance from S
exceeds `path_threshold` (default 110, like the Hard set) and, with `unique_path` (default), whose
shortest path from S is unique, so the label is a function of the input; a new S, then a new maze,
is drawn when there is none. Every maze is checked with `maze.pair_error`. Maze i is a pure function
of (seed, stream, i, knobs). Measured on the 2-core development machine (Python 3.11, one process,
machine busy, load ~6): 300-330 mazes/s at the defaults (300 mazes in ~1 s, 1,000 in ~3 s), the
check included; path lengths 111-214, mean 123; about half the mazes would have several shortest
paths without `unique_path`.
This is podlab's own distribution: lattice-aligned corridors, about half the cells walls; it is
not the public Maze-Hard distribution (whose generator the reference page does not describe).

Synopsis:
  from input_pipeline.puzzles import maze, maze_generator
  questions, answers = maze_generator.generate_mazes(4, seed=0)    # [4, 900] uint8 tokens 1..5
  assert all(maze.pair_error(q, a) is None for q, a in zip(questions, answers))
  assert (maze.path_lengths(answers) > 110).all()
"""
from __future__ import annotations

import dataclasses
import random

import numpy as np

from input_pipeline.puzzles import maze

_LATTICE = maze.SIDE // 2  # 15 x 15 lattice cells


@dataclasses.dataclass(frozen=True)
class GeneratorOptions:
  """The knobs that define a generated maze distribution (see the module docstring)."""
  path_threshold: int = maze.DEFAULT_PATH_THRESHOLD
  loop_prob: float = 0.05
  unique_path: bool = True
  max_attempts: int = 1_000


def _carve(rng: random.Random, loop_prob: float) -> list[bool]:
  """Open cells [900] of a random lattice maze: DFS spanning tree plus random loops."""
  oy, ox = rng.randrange(2), rng.randrange(2)
  open_cells = [False] * maze.NUM_CELLS

  def at(i: int, j: int) -> int:  # lattice (i, j) -> flat grid cell
    return (2 * i + oy) * maze.SIDE + 2 * j + ox

  lattice_nbrs = maze.neighbours(_LATTICE, _LATTICE)
  visited = [False] * (_LATTICE * _LATTICE)
  start = rng.randrange(_LATTICE * _LATTICE)
  visited[start] = True
  open_cells[at(*divmod(start, _LATTICE))] = True
  stack = [start]
  while stack:
    v = stack[-1]
    fresh = [u for u in lattice_nbrs[v] if not visited[u]]
    if not fresh:
      stack.pop()
      continue
    u = fresh[rng.randrange(len(fresh))]
    visited[u] = True
    a, b = at(*divmod(v, _LATTICE)), at(*divmod(u, _LATTICE))
    open_cells[(a + b) // 2] = True  # the wall cell between two lattice cells
    open_cells[b] = True
    stack.append(u)
  if loop_prob > 0:
    for v in range(_LATTICE * _LATTICE):
      for u in lattice_nbrs[v]:
        if u > v:
          wall = (at(*divmod(v, _LATTICE)) + at(*divmod(u, _LATTICE))) // 2
          if not open_cells[wall] and rng.random() < loop_prob:
            open_cells[wall] = True
  return open_cells


def _generate_one(seed: int, stream: str, index: int,
                  options: GeneratorOptions) -> tuple[np.ndarray, np.ndarray]:
  rng = random.Random(f"podlab-maze/{seed}/{stream}/{index}")  # str seeds hash with SHA-512
  nbrs = maze.neighbours(maze.SIDE, maze.SIDE)
  for _ in range(options.max_attempts):
    open_cells = _carve(rng, options.loop_prob)
    cells = [v for v in range(maze.NUM_CELLS) if open_cells[v]]
    for _ in range(4):  # a few starts per maze, then a new maze
      s = cells[rng.randrange(len(cells))]
      counts = [0] * maze.NUM_CELLS
      dist = maze.bfs(open_cells, s, nbrs, counts)
      goals = [v for v in cells if dist[v] > options.path_threshold and
               (counts[v] == 1 or not options.unique_path)]
      if not goals:
        continue
      g = goals[rng.randrange(len(goals))]
      question = np.where(np.asarray(open_cells), maze.OPEN_ID, maze.WALL_ID).astype(np.uint8)
      question[s] = maze.START_ID
      question[g] = maze.GOAL_ID
      answer = question.copy()
      answer[maze.trace_back(dist, g, nbrs)] = maze.PATH_ID
      error = maze.pair_error(question, answer)
      if error is not None:  # never expected: the generator and the validator disagree
        raise AssertionError(f"generated maze (seed={seed}, stream={stream!r}, index={index}) "
                             f"fails validation: {error}\n{maze.render(answer)}")
      return question, answer
  raise RuntimeError(
      f"no maze with path_threshold={options.path_threshold}, loop_prob={options.loop_prob}, "
      f"unique_path={options.unique_path} after {options.max_attempts} attempts (seed={seed}, "
      f"stream={stream!r}, index={index}); lower path_threshold or loop_prob")


def generate_mazes(n: int, seed: int, path_threshold: int = maze.DEFAULT_PATH_THRESHOLD, *,
                   loop_prob: float = 0.05, unique_path: bool = True, stream: str = "",
                   start_index: int = 0,
                   max_attempts: int = 1_000) -> tuple[np.ndarray, np.ndarray]:
  """Generate `n` valid 30x30 mazes whose shortest S->G path has more than `path_threshold` moves.

  Args:
    n: number of mazes.
    seed: integer seed; maze i is a pure function of (seed, stream, start_index + i, knobs).
    path_threshold: every maze's shortest path length (moves) exceeds it (0..~400; the Hard set:
      110).
    loop_prob: probability of opening each wall between two lattice cells left by the spanning
      tree (0 = a perfect maze with exactly one path; larger = more loops, shorter paths).
    unique_path: keep only goals with a unique shortest path (the label is then a function of the
      question).
    stream: a name separating independent streams with the same seed (e.g. "train", "test").
    start_index: index of the first maze in the stream.
    max_attempts: fresh mazes to try per output maze before giving up.
  Returns:
    (questions, answers): uint8 tokens [n, 900]; questions over 1..4, answers over 1..5.
  """
  if n < 0:
    raise ValueError(f"n={n} must be >= 0")
  if not 0 <= path_threshold < maze.NUM_CELLS:
    raise ValueError(f"path_threshold={path_threshold} must lie in 0..{maze.NUM_CELLS - 1}")
  if not 0.0 <= loop_prob <= 1.0:
    raise ValueError(f"loop_prob={loop_prob} must lie in [0, 1]")
  options = GeneratorOptions(path_threshold=path_threshold, loop_prob=loop_prob,
                             unique_path=unique_path, max_attempts=max_attempts)
  questions = np.zeros((n, maze.NUM_CELLS), np.uint8)
  answers = np.zeros((n, maze.NUM_CELLS), np.uint8)
  for i in range(n):
    questions[i], answers[i] = _generate_one(seed, stream, start_index + i, options)
  return questions, answers
