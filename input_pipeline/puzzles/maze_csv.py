"""Maze-Hard CSV files (`source,question,answer,rating`, 900-character mazes): read with every
(question, answer) pair validated (`maze.pair_error`; the first bad row named by `path:line`), and
written. Reading and validating a 1,000-row CSV takes ~0.4 s.

Synopsis:
  import os, tempfile
  from input_pipeline.puzzles import maze_csv, maze_generator
  questions, answers = maze_generator.generate_mazes(3, seed=0)
  path = os.path.join(tempfile.mkdtemp(), "train.csv")
  maze_csv.write_maze_csv(path, questions, answers)
  data = maze_csv.read_maze_csv(path)                              # a validated MazeCsv
  assert len(data) == 3 and (data.questions == questions).all()
"""
from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Iterable
from typing import Optional

import numpy as np

from input_pipeline.puzzles import maze
from input_pipeline.puzzles import puzzle_csv

CSV_HEADER = ("source", "question", "answer", "rating")


@dataclasses.dataclass
class MazeCsv:
  """A validated Maze-Hard CSV file."""
  questions: np.ndarray  # [N, 900] uint8 tokens 1..4
  answers: np.ndarray  # [N, 900] uint8 tokens 1..5
  ratings: np.ndarray  # [N] int64, the `rating` column
  path_lengths: np.ndarray  # [N] int64, moves of the shortest S->G path
  line_numbers: np.ndarray  # [N] int64, 1-based line of each row in the file

  def __len__(self) -> int:
    return int(self.ratings.shape[0])


def _row_error(row: list[str]) -> Optional[str]:
  """Syntax error of one CSV row (field count, lengths, alphabets, rating), or None."""
  if len(row) != 4:
    return f"row has {len(row)} fields, expected 4 ({','.join(CSV_HEADER)})"
  _, question, answer, rating = row
  for what, text, alphabet in (("question", question, maze.QUESTION_CHARS),
                               ("answer", answer, maze.CHARSET)):
    if len(text) != maze.NUM_CELLS:
      return f"{what} has {len(text)} characters, expected {maze.NUM_CELLS} (30x30)"
    if text.strip(alphabet):
      bad = sorted(set(text) - set(alphabet))
      note = " ('o' marks the path in answers only)" if "o" in bad else ""
      return f"{what} has characters {bad!r} outside {alphabet!r}{note}"
  try:
    int(rating)
  except ValueError:
    return f"rating {rating!r} is not an integer"
  return None


def read_maze_csv(path: str | os.PathLike) -> MazeCsv:
  """Read and validate a Maze-Hard CSV (`source,question,answer,rating`, 900-char mazes).

  Every row is checked (`_row_error`, then `maze.pair_error`: one S, one G, the answer a shortest
  path); the first malformed row raises `maze.MazeDataError` naming `path:line`, the field and what
  is wrong. Nothing is dropped silently.
  """
  path_str = os.fspath(path)
  questions: list[np.ndarray] = []
  answers: list[np.ndarray] = []
  ratings: list[int] = []
  lines: list[int] = []
  for line, row in puzzle_csv.rows(path_str, CSV_HEADER, maze.MazeDataError):
    error = _row_error(row)
    if error is None:
      q = maze.string_to_tokens(row[1])
      a = maze.string_to_tokens(row[2], answer=True)
      error = maze.pair_error(q, a)
    if error is not None:
      raise maze.MazeDataError(f"{path_str}:{line}: {error}")
    questions.append(q)
    answers.append(a)
    ratings.append(int(row[3]))
    lines.append(line)
  q_all = np.stack(questions) if questions else np.zeros((0, maze.NUM_CELLS), np.uint8)
  a_all = np.stack(answers) if answers else np.zeros((0, maze.NUM_CELLS), np.uint8)
  return MazeCsv(questions=q_all, answers=a_all, ratings=np.asarray(ratings, np.int64),
                 path_lengths=maze.path_lengths(a_all), line_numbers=np.asarray(lines, np.int64))


def write_maze_csv(path: str | os.PathLike, questions: Iterable[np.ndarray],
                   answers: Iterable[np.ndarray], ratings: Optional[Iterable[int]] = None,
                   source: str = "podlab") -> None:
  """Write token pairs in the Maze-Hard CSV format; `ratings` default to the path lengths."""
  questions = [np.asarray(q) for q in questions]
  answers = [np.asarray(a) for a in answers]
  if ratings is None:
    ratings = [int(maze.path_lengths(a)) for a in answers]
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for q, a, r in zip(questions, answers, ratings, strict=True):
      writer.writerow([source, maze.tokens_to_string(q), maze.tokens_to_string(a), int(r)])
