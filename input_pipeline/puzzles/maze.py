"""Maze-Hard in numpy/Python: encoding, BFS, pair validation, dihedral maps.

Everything the Maze datasets need lives here and in its two siblings, `maze_generator` (the
generator) and `maze_csv` (the Maze-Hard CSV files), so it can be used (and tested) without TF: the
TFDS builders `maze_hard` and `maze_generated` in `input_pipeline.builders` are built on these
functions.
The on-the-fly tf.data augmentation `augment.augment_dihedral_batch` is checked against the numpy
transforms.

Glossary (shapes; N mazes, H = W = 30 the grid side, L = H * W = 900 cells, row-major):
  string      900 characters over "# SGo": '#' wall, ' ' open, 'S' start, 'G' goal, 'o' a path
              cell (answers only). The public Maze-Hard CSVs hold one such string per field.
  tokens      int array [..., 900] (a grid is the same array as [..., 30, 30]) in the reference
              TRM encoding, vocab 6: 0 pad (never inside a maze), 1 '#', 2 ' ', 3 'S', 4 'G',
              5 'o', i.e. `tokens = 1 + "# SGo".index(char)`.
  question    tokens over 1..4 with exactly one S (3) and one G (4): the model input.
  answer      the question with 5 ('o') on the interior cells of one SHORTEST S->G path, moving
              between 4-neighbours through non-wall cells; S and G keep their tokens. It is the
              label sequence; no label position is ignored.
  path length the number of moves of a shortest S->G path = (cells marked 'o') + 1. The Hard set's
              "shortest path > 110" is read as path length > 110 here (the reference page does not
              say whether it counts moves or cells; the two differ by one).
  rating      the CSV's integer `rating` column, kept as read; generated mazes: the path length.

Validation (`pair_error`, used on every CSV row and every generated maze): 900 cells each, the
alphabets above, exactly one S and one G, the answer equals the question except for 'o' on open
cells, S reaches G in the question, the 'o' cells connect S to G, and their number equals the BFS
shortest-path length - 1. The last two imply that the 'o' cells are exactly the interior of a
shortest S->G path (any S->G path through them has >= length - 1 interior cells).

Dihedral transforms of a [30, 30] grid (the reference's ids): 0 identity, 1 rot90, 2 rot180,
3 rot270 (counter-clockwise, `np.rot90(x, k)`), 4 flip left-right, 5 flip up-down, 6 transpose,
7 anti-transpose (`x[i, j] -> x[29 - j, 29 - i]`); `DIHEDRAL_INVERSE = [0, 3, 2, 1, 4, 5, 6, 7]`.
A transform maps valid (question, answer) pairs to valid pairs (BFS distances are invariant).
`augment_dihedral_batch` draws one uniformly random id per example, the distribution of the
reference's "8 materialised versions per maze, one random version per maze and epoch".

Synopsis:
  import numpy as np
  from input_pipeline.puzzles import maze
  from input_pipeline.puzzles import maze_generator
  questions, answers = maze_generator.generate_mazes(4, seed=0)    # [4, 900] uint8 tokens 1..5
  assert all(maze.pair_error(q, a) is None for q, a in zip(questions, answers))
  assert (maze.path_lengths(answers) > 110).all()
  text = maze.tokens_to_string(questions[0])                       # 900 chars over "# SG"
  assert np.array_equal(maze.string_to_tokens(text), questions[0])
  assert np.array_equal(maze.solve(questions[0]), answers[0])      # unique shortest path
  grid = questions[0].reshape(30, 30)
  for tid in range(8):                                             # the 8 dihedral transforms
    moved = maze.dihedral_transform(grid, tid)
    assert np.array_equal(maze.dihedral_transform(moved, maze.DIHEDRAL_INVERSE[tid]), grid)
"""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np

from input_pipeline import errors
from input_pipeline import puzzles

# --------------------------------------------------------------------------------------------
# Encoding.

SIDE = 30
NUM_CELLS = SIDE * SIDE
CHARSET = "# SGo"
PAD_ID = 0
WALL_ID = 1
OPEN_ID = 2
START_ID = 3
GOAL_ID = 4
PATH_ID = 5
VOCAB_SIZE = len(CHARSET) + 1
IGNORE_LABEL_ID = puzzles.IGNORE_LABEL_ID
DEFAULT_PATH_THRESHOLD = 110

# The metadata shared by every Maze dataset (the trainer validates its config against it). As in
# the reference builder every example has puzzle identifier 0 (num_puzzle_identifiers 1, also with
# augmentation: augmented versions share it). `blank_id` is the open cell, the cells an answer may
# change (Sudoku: the blank). `augmentation` names the on-the-fly hook of the tf.data pipeline.
METADATA: dict = dict(
    vocab_size=VOCAB_SIZE,
    seq_len=NUM_CELLS,
    num_puzzle_identifiers=1,
    pad_id=PAD_ID,
    blank_id=OPEN_ID,
    ignore_label_id=IGNORE_LABEL_ID,
    augmentation="maze_dihedral",
)

QUESTION_CHARS = "# SG"
_CHAR_TO_TOKEN = np.zeros(256, np.uint8)  # 0 = not a maze character
_CHAR_TO_TOKEN[np.frombuffer(CHARSET.encode("ascii"), np.uint8)] = np.arange(1, VOCAB_SIZE)
_TOKEN_TO_CHAR = np.frombuffer(("?" + CHARSET).encode("ascii"), np.uint8)


class MazeDataError(errors.DataError):
  """A maze string, pair or CSV row is malformed (the message names the file, line and field)."""


def _where(cell: int) -> str:
  """'row r, column c' (1-based) of a flat cell index."""
  r, c = divmod(int(cell), SIDE)
  return f"row {r + 1}, column {c + 1}"


def _char(token: int) -> str:
  return repr(CHARSET[token - 1]) if 1 <= token < VOCAB_SIZE else f"token {int(token)}"


def string_to_tokens(text: str, *, answer: bool = False) -> np.ndarray:
  """900-char maze string -> tokens uint8 [900] (1..4, or 1..5 with `answer`)."""
  alphabet = CHARSET if answer else QUESTION_CHARS
  if len(text) != NUM_CELLS:
    raise MazeDataError(f"maze string has {len(text)} characters, expected {NUM_CELLS}")
  if text.strip(alphabet):  # strip leaves a remainder iff a character is outside the alphabet
    bad = sorted(set(text) - set(alphabet))
    raise MazeDataError(f"maze string has characters {bad!r} outside {alphabet!r}")
  return _CHAR_TO_TOKEN[np.frombuffer(text.encode("ascii"), np.uint8)]


def tokens_to_string(tokens: np.ndarray) -> str:
  """Tokens [900] (or [30, 30]) in 1..5 -> the 900-char string; pad or unknown tokens raise."""
  tokens = np.asarray(tokens).reshape(-1)
  if tokens.size != NUM_CELLS:
    raise ValueError(f"a maze has {NUM_CELLS} tokens, got {tokens.size}")
  if tokens.min() < 1 or tokens.max() >= VOCAB_SIZE:
    bad = int(np.flatnonzero((tokens < 1) | (tokens >= VOCAB_SIZE))[0])
    raise ValueError(f"token {int(tokens[bad])} at {_where(bad)} is not a maze token 1..5 "
                     "(0 is pad)")
  return _TOKEN_TO_CHAR[tokens.astype(np.int64)].tobytes().decode("ascii")


def render(tokens: np.ndarray) -> str:
  """Tokens [900] -> 30 lines of 30 characters (for eyes and error reports)."""
  text = tokens_to_string(tokens)
  return "\n".join(text[r * SIDE:(r + 1) * SIDE] for r in range(SIDE))


def path_lengths(answers: np.ndarray) -> np.ndarray:
  """Answers [..., 900] -> int64 [...]: path length = cells marked 'o' + 1 (valid answers only)."""
  return (np.asarray(answers) == PATH_ID).sum(axis=-1).astype(np.int64) + 1


# --------------------------------------------------------------------------------------------
# Breadth-first search.


@functools.lru_cache(maxsize=None)
def neighbours(height: int, width: int) -> tuple[tuple[int, ...], ...]:
  """Flat 4-neighbours of every cell, in the fixed order up, down, left, right."""
  out = []
  for v in range(height * width):
    r, c = divmod(v, width)
    nb = []
    if r > 0:
      nb.append(v - width)
    if r < height - 1:
      nb.append(v + width)
    if c > 0:
      nb.append(v - 1)
    if c < width - 1:
      nb.append(v + 1)
    out.append(tuple(nb))
  return tuple(out)


def bfs(open_cells: list, start: int, nbrs: tuple, counts: Optional[list] = None) -> list[int]:
  """Level-synchronous BFS over flat cells: distances (-1 unreachable). With `counts` (a list of
  zeros), also the number of shortest paths from `start` to every cell, capped at 2."""
  dist = [-1] * len(open_cells)
  dist[start] = 0
  if counts is not None:
    counts[start] = 1
  frontier = [start]
  d = 0
  while frontier:
    d += 1
    nxt = []
    for v in frontier:
      for u in nbrs[v]:
        if not open_cells[u]:
          continue
        if dist[u] < 0:
          dist[u] = d
          nxt.append(u)
          if counts is not None:
            counts[u] = counts[v]
        elif counts is not None and dist[u] == d:
          counts[u] = min(2, counts[u] + counts[v])
    frontier = nxt
  return dist


def bfs_distances(open_mask: np.ndarray, start: tuple[int, int]) -> np.ndarray:
  """Moves from `start` to every cell of a bool grid [H, W] (True = passable); int32 [H, W], -1
  where unreachable (walls included)."""
  open_mask = np.asarray(open_mask, bool)
  if open_mask.ndim != 2:
    raise ValueError(f"open_mask must be a [H, W] grid, got shape {open_mask.shape}")
  h, w = open_mask.shape
  r, c = int(start[0]), int(start[1])
  if not (0 <= r < h and 0 <= c < w and open_mask[r, c]):
    raise ValueError(f"start {start} is not an open cell of the {h}x{w} grid")
  dist = bfs(open_mask.reshape(-1).tolist(), r * w + c, neighbours(h, w))
  return np.asarray(dist, np.int32).reshape(h, w)


def _the_cell(tokens: np.ndarray, token: int, what: str) -> int:
  cells = np.flatnonzero(tokens == token)
  if cells.size != 1:
    raise MazeDataError(f"{what} has {cells.size} {_char(token)} cells, expected exactly one")
  return int(cells[0])


def _as_maze(tokens: np.ndarray, what: str) -> np.ndarray:
  tokens = np.asarray(tokens)
  if tokens.size != NUM_CELLS:
    raise MazeDataError(f"{what} has {tokens.size} cells, expected {NUM_CELLS}")
  return tokens.reshape(NUM_CELLS)


def shortest_path_length(tokens: np.ndarray) -> int:
  """Moves of a shortest S->G path through non-wall cells of a question or answer [900]; -1 if G
  is unreachable."""
  tokens = _as_maze(tokens, "maze")
  s, g = _the_cell(tokens, START_ID, "maze"), _the_cell(tokens, GOAL_ID, "maze")
  return bfs((tokens != WALL_ID).tolist(), s, neighbours(SIDE, SIDE))[g]


def count_shortest_paths(tokens: np.ndarray, limit: int = 2) -> int:
  """Number of distinct shortest S->G paths of a maze [900], capped at `limit` (0: unreachable)."""
  tokens = _as_maze(tokens, "maze")
  s, g = _the_cell(tokens, START_ID, "maze"), _the_cell(tokens, GOAL_ID, "maze")
  open_cells = (tokens != WALL_ID).tolist()
  nbrs = neighbours(SIDE, SIDE)
  dist = bfs(open_cells, s, nbrs)
  if dist[g] < 0:
    return 0
  counts = [0] * NUM_CELLS  # exact counts, level by level, capped at `limit`
  counts[s] = 1
  for v in sorted(range(NUM_CELLS), key=dist.__getitem__):
    if dist[v] > 0:
      counts[v] = min(limit, sum(counts[u] for u in nbrs[v] if dist[u] == dist[v] - 1 >= 0))
  return counts[g]


def trace_back(dist: list[int], goal: int, nbrs: tuple) -> list[int]:
  """Interior cells of a shortest path ending at `goal` (first predecessor in neighbour order)."""
  path = []
  v = goal
  while dist[v] > 1:
    v = next(u for u in nbrs[v] if dist[u] == dist[v] - 1)
    path.append(v)
  return path


def solve(question: np.ndarray) -> np.ndarray:
  """The answer [900] uint8 of a question: 'o' on one shortest S->G path (deterministic: walking
  back from G, the first predecessor in the order up, down, left, right)."""
  question = _as_maze(question, "question").astype(np.uint8)
  s, g = _the_cell(question, START_ID, "question"), _the_cell(question, GOAL_ID, "question")
  nbrs = neighbours(SIDE, SIDE)
  dist = bfs((question != WALL_ID).tolist(), s, nbrs)
  if dist[g] < 0:
    raise MazeDataError(f"question has no path from S ({_where(s)}) to G ({_where(g)})")
  answer = question.copy()
  answer[trace_back(dist, g, nbrs)] = PATH_ID
  return answer


# --------------------------------------------------------------------------------------------
# Validation of (question, answer) pairs.


def pair_error(question: np.ndarray, answer: np.ndarray) -> Optional[str]:
  """What is wrong with a (question, answer) token pair [900] each, or None if it is valid.

  Valid: question over 1..4 with one S and one G, answer = question plus 'o' (5) on open cells,
  and the 'o' cells are exactly the interior of a shortest S->G path (module docstring).
  """
  q = np.asarray(question).reshape(-1)
  a = np.asarray(answer).reshape(-1)
  for what, x, top in (("question", q, GOAL_ID), ("answer", a, PATH_ID)):
    if x.size != NUM_CELLS:
      return f"{what} has {x.size} cells, expected {NUM_CELLS}"
    bad = np.flatnonzero((x < WALL_ID) | (x > top))
    if bad.size:
      return (f"{what} has {_char(int(x[bad[0]]))} at {_where(bad[0])}, outside "
              f"{(QUESTION_CHARS if top == GOAL_ID else CHARSET)!r}")
  for token in (START_ID, GOAL_ID):
    cells = np.flatnonzero(q == token)
    if cells.size != 1:
      at = "; ".join(_where(c) for c in cells[:3])
      return (f"question has {cells.size} {_char(token)} cells{f' ({at})' if at else ''}, "
              "expected exactly one")
  disagree = np.flatnonzero((a != q) & ~((a == PATH_ID) & (q == OPEN_ID)))
  if disagree.size:
    c = disagree[0]
    return (f"answer disagrees with the question at {_where(c)} (question has "
            f"{_char(int(q[c]))}, answer has {_char(int(a[c]))}; only ' ' may become 'o')")
  s, g = int(np.flatnonzero(q == START_ID)[0]), int(np.flatnonzero(q == GOAL_ID)[0])
  nbrs = neighbours(SIDE, SIDE)
  shortest = bfs((q != WALL_ID).tolist(), s, nbrs)[g]
  if shortest < 0:
    return f"question has no path from S ({_where(s)}) to G ({_where(g)})"
  marked = int((a == PATH_ID).sum())
  along = bfs((a >= START_ID).tolist(), s, nbrs)[g]  # through S, G and 'o' cells only
  if along < 0:
    return (f"answer's {marked} 'o' cells do not connect S ({_where(s)}) to G ({_where(g)})")
  if along > shortest:
    return (f"answer path is not a shortest path: it takes {along} moves from S to G, a shortest "
            f"path takes {shortest}")
  if marked != shortest - 1:
    return (f"answer marks {marked} cells with 'o' but a shortest S->G path has {shortest - 1} "
            f"cells between S and G ({marked - shortest + 1} 'o' cells off the path)")
  return None


def check_pair(question: np.ndarray, answer: np.ndarray) -> int:
  """Raise `MazeDataError` unless the pair is valid; returns its path length (moves)."""
  error = pair_error(question, answer)
  if error is not None:
    raise MazeDataError(error)
  return int(path_lengths(answer))


def is_valid_pair(questions: np.ndarray, answers: np.ndarray) -> np.ndarray:
  """Token pairs [..., 900] -> bool [...]: `pair_error` is None."""
  questions = np.asarray(questions)
  answers = np.asarray(answers)
  batch_shape = questions.shape[:-1]
  q = questions.reshape(-1, questions.shape[-1])
  a = answers.reshape(-1, answers.shape[-1])
  return np.array([pair_error(x, y) is None for x, y in zip(q, a)], bool).reshape(batch_shape)


# --------------------------------------------------------------------------------------------
# Dihedral transforms (numpy reference; TF below).

NUM_DIHEDRAL = 8
DIHEDRAL_NAMES = ("identity", "rot90", "rot180", "rot270", "flip_lr", "flip_ud", "transpose",
                  "anti_transpose")
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def dihedral_transform(grid: np.ndarray, tid: int) -> np.ndarray:
  """Transform `tid` (0..7, module docstring) of grids [..., H, W] over the last two axes."""
  grid = np.asarray(grid)
  axes = (-2, -1)
  if tid == 0:
    return grid
  if tid in (1, 2, 3):
    return np.rot90(grid, k=tid, axes=axes)  # counter-clockwise
  if tid == 4:
    return np.flip(grid, axis=-1)
  if tid == 5:
    return np.flip(grid, axis=-2)
  if tid == 6:
    return np.swapaxes(grid, -2, -1)
  if tid == 7:
    return np.swapaxes(np.rot90(grid, k=2, axes=axes), -2, -1)
  raise ValueError(f"dihedral id {tid!r} is not in 0..7 ({', '.join(DIHEDRAL_NAMES)})")


def inverse_dihedral_transform(grid: np.ndarray, tid: int) -> np.ndarray:
  """Undo `dihedral_transform(., tid)` (e.g. map a prediction back to the original frame)."""
  return dihedral_transform(grid, DIHEDRAL_INVERSE[tid])


def _position_table() -> np.ndarray:
  cells = np.arange(NUM_CELLS).reshape(SIDE, SIDE)
  return np.stack([dihedral_transform(cells, t).reshape(NUM_CELLS) for t in range(NUM_DIHEDRAL)])


# [8, 900]: transform t moves source cell DIHEDRAL_POSITIONS[t, i] to output cell i.
DIHEDRAL_POSITIONS = _position_table().astype(np.int32)


def _compose_table() -> np.ndarray:
  index = {row.tobytes(): t for t, row in enumerate(DIHEDRAL_POSITIONS)}
  table = np.zeros((NUM_DIHEDRAL, NUM_DIHEDRAL), np.int32)
  for a in range(NUM_DIHEDRAL):
    for b in range(NUM_DIHEDRAL):
      # Applying b, then a: out[i] = x[pos_b[pos_a[i]]].
      table[a, b] = index[DIHEDRAL_POSITIONS[b][DIHEDRAL_POSITIONS[a]].tobytes()]
  return table


# [8, 8]: dihedral_transform(dihedral_transform(x, b), a) == dihedral_transform(x, COMPOSE[a, b]).
DIHEDRAL_COMPOSE = _compose_table()


def apply_dihedral(tokens: np.ndarray, tid: int) -> np.ndarray:
  """Transform `tid` of token sequences [..., 900] (any values: pads and -100 labels move along)."""
  return np.asarray(tokens)[..., DIHEDRAL_POSITIONS[tid]]
