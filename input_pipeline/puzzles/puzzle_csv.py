"""The CSV layout shared by the public Sudoku-Extreme and Maze-Hard files: `source,question,answer,rating`.

`rows(path, header, error)` checks the header (a UTF-8 BOM is tolerated) and yields every data row
with its line number; an empty file, a wrong header or an empty row raises `error` naming
`path:line`. The callers validate the fields (input_pipeline.puzzles.sudoku, input_pipeline.puzzles.maze).

Synopsis:

  import os, tempfile
  from input_pipeline.puzzles import puzzle_csv
  path = os.path.join(tempfile.mkdtemp(), "x.csv")
  with open(path, "w") as f:
    f.write("source,question,answer,rating\\nme,ab,cd,3\\n")
  rows = list(puzzle_csv.rows(path, ("source", "question", "answer", "rating"), ValueError))
  assert rows == [(2, ["me", "ab", "cd", "3"])]
"""
from __future__ import annotations

import csv
import os
from typing import Iterator, Sequence, Type


def rows(path: str | os.PathLike, header: Sequence[str],
         error: Type[Exception]) -> Iterator[tuple[int, list[str]]]:
  """(line number, fields) of every data row of a CSV with the expected `header`."""
  path_str = os.fspath(path)
  header = tuple(header)
  with open(path_str, newline="", encoding="utf-8") as f:
    reader = csv.reader(f)
    try:
      found = next(reader)
    except StopIteration:
      raise error(f"{path_str}:1: file is empty, expected the header {','.join(header)}") from None
    if found and found[0].startswith("\ufeff"):
      found[0] = found[0][1:]
    if tuple(h.strip() for h in found) != header:
      raise error(f"{path_str}:{reader.line_num}: header is {','.join(found)!r}, "
                  f"expected {','.join(header)!r}")
    for row in reader:
      if not row:
        raise error(f"{path_str}:{reader.line_num}: empty row")
      yield reader.line_num, row
