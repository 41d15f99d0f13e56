"""Sudoku-Extreme CSV files (`source,question,answer,rating`): read with every row validated (the
first bad row named by `path:line`), and written (the format of the public dataset).

Synopsis:
  import tempfile, os
  from input_pipeline.puzzles import sudoku_csv, sudoku_generator
  q, s = sudoku_generator.generate_puzzles(4, seed=0, givens=30)
  path = os.path.join(tempfile.mkdtemp(), "train.csv")
  sudoku_csv.write_sudoku_csv(path, q, s, ratings=[0] * 4)
  data = sudoku_csv.read_sudoku_csv(path)                          # validated SudokuCsv
  assert len(data) == 4 and (data.questions == q).all()
"""
from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Iterable
from typing import Optional

import numpy as np

from input_pipeline.puzzles import puzzle_csv
from input_pipeline.puzzles import sudoku

NUM_CELLS = sudoku.NUM_CELLS
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
  unit_errors = sudoku.solution_errors(a)
  bad = bad_consistency | (unit_errors >= 0)
  if not bad.any():
    return
  i = int(bad.argmax())
  if unit_errors[i] >= 0:
    unit = int(unit_errors[i])
    raise sudoku.SudokuDataError(
        f"{path}:{lines[i]}: answer is not a valid Sudoku solution "
        f"({sudoku.describe_unit(unit)} does not hold each digit 1-9 once)")
  cell = int(disagree[i].argmax())
  raise sudoku.SudokuDataError(
      f"{path}:{lines[i]}: answer disagrees with the question at row {cell // 9 + 1}, column "
      f"{cell % 9 + 1} (question gives {questions[i][cell]}, answer has {answers[i][cell]})")


def _row_error(row: list[str]) -> Optional[str]:
  """Syntax error of one CSV row, or None."""
  if len(row) != 4:
    return f"row has {len(row)} fields, expected 4 ({','.join(CSV_HEADER)})"
  _, question, answer, rating = row
  if len(question) != NUM_CELLS:
    return f"question has {len(question)} characters, expected {NUM_CELLS}"
  # strip leaves a remainder iff a character is outside the alphabet
  if question.strip(sudoku.QUESTION_ALPHABET):
    bad = sorted(set(question) - set(sudoku.QUESTION_ALPHABET))
    return f"question has characters {bad!r} outside '.1-9' (or '0' for a blank)"
  if len(answer) != NUM_CELLS:
    return f"answer has {len(answer)} characters, expected {NUM_CELLS}"
  if answer.strip(sudoku.ANSWER_ALPHABET):
    bad = sorted(set(answer) - set(sudoku.ANSWER_ALPHABET))
    return f"answer has characters {bad!r} outside '1-9'"
  try:
    int(rating)
  except ValueError:
    return f"rating {rating!r} is not an integer"
  return None


def read_sudoku_csv(path: str | os.PathLike, chunk_rows: int = 262_144) -> SudokuCsv:
  """Read and validate a Sudoku-Extreme CSV (`source,question,answer,rating`).

  Every row is checked; the first malformed row raises `sudoku.SudokuDataError` naming
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

  for line, row in puzzle_csv.rows(path_str, CSV_HEADER, sudoku.SudokuDataError):
    error = _row_error(row)
    if error is not None:
      _bulk_check(path_str, qs, ans, lines)  # report an earlier bad row first
      raise sudoku.SudokuDataError(f"{path_str}:{line}: {error}")
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
      writer.writerow([source, sudoku.format_grid(q), sudoku.format_grid(a).replace(".", "0"),
                       int(r)])
