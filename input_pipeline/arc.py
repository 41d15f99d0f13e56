"""ARC-AGI files in the Kaggle "combined" format: read and validate, naming the file and task on error.

Glossary:
  grid       list of rows of ints 0..9, rectangular, 1..30 rows and 1..30 columns
  pair       {"input": grid, "output": grid} (a demonstration, or a test input with its solution)
  task       {"train": [pair, ...], "test": [{"input": grid}, ...]} in `*_challenges.json`
  solutions  {task_id: [test output grid, ...]} in `*_solutions.json`, one per test input, in order

Files are `arc-agi_{training,evaluation,concept,training2,evaluation2}_{challenges,solutions}.json`
(ARC-AGI-1, ARC-AGI-2 and ConceptARC). Everything is plain JSON (`json.load`; nothing is unpickled).

Synopsis:

  import json, os, tempfile
  from input_pipeline import arc
  folder = tempfile.mkdtemp()
  task = {"train": [{"input": [[1, 2]], "output": [[2, 1]]}], "test": [{"input": [[3, 4]]}]}
  with open(os.path.join(folder, "arc-agi_toy_challenges.json"), "w") as f:
    json.dump({"00000001": task}, f)
  with open(os.path.join(folder, "arc-agi_toy_solutions.json"), "w") as f:
    json.dump({"00000001": [[[4, 3]]]}, f)
  tasks = arc.load_split(folder, "toy")          # {task_id: Task}, solutions attached
  assert tasks["00000001"].test[0].output.tolist() == [[4, 3]]
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional

import numpy as np

MAX_SIZE = 30
NUM_COLOURS = 10
SETS = ("training", "evaluation", "concept", "training2", "evaluation2")


class ArcFormatError(ValueError):
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


def _fail(path: str, where: str, problem: str) -> None:
  raise ArcFormatError(f"{path}: {where}: {problem}")


def _grid(value: Any, path: str, where: str) -> np.ndarray:
  if not isinstance(value, list) or not value:
    _fail(path, where, f"a grid must be a non-empty list of rows, got {type(value).__name__}"
          f"{'' if value else ' (empty)'}")
  if len(value) > MAX_SIZE:
    _fail(path, where, f"{len(value)} rows; ARC grids have at most {MAX_SIZE}")
  width = None
  for r, row in enumerate(value):
    if not isinstance(row, list) or not row:
      _fail(path, f"{where} row {r}", "a row must be a non-empty list of ints")
    if width is None:
      width = len(row)
    if len(row) != width:
      _fail(path, f"{where} row {r}", f"{len(row)} cells but row 0 has {width}: not rectangular")
    for c, cell in enumerate(row):
      if isinstance(cell, bool) or not isinstance(cell, int) or not 0 <= cell < NUM_COLOURS:
        _fail(path, f"{where} row {r} column {c}", f"{cell!r} is not a colour 0..9")
  if width > MAX_SIZE:
    _fail(path, where, f"{width} columns; ARC grids have at most {MAX_SIZE}")
  return np.asarray(value, np.uint8)


def _load_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ArcFormatError(f"{path}: line {e.lineno} column {e.colno}: not valid JSON ({e.msg})") from None


def read_challenges(path: str) -> Dict[str, Task]:
  """`{task_id: Task}` of a `*_challenges.json` file (test outputs None); validates everything."""
  data = _load_json(path)
  if not isinstance(data, dict) or not data:
    _fail(path, "top level", "expected a non-empty object {task_id: task}")
  tasks = {}
  for task_id, task in data.items():
    where = f"task {task_id}"
    if not isinstance(task, dict) or set(task) - {"train", "test"} or not {"train", "test"} <= set(task):
      keys = sorted(task) if isinstance(task, dict) else type(task).__name__
      _fail(path, where, f"expected an object with keys 'train' and 'test', got {keys}")
    pairs = {}
    for split in ("train", "test"):
      items = task[split]
      if not isinstance(items, list) or not items:
        _fail(path, f"{where} {split}", "expected a non-empty list of pairs")
      out = []
      for i, item in enumerate(items):
        at = f"{where} {split}[{i}]"
        need = {"input", "output"} if split == "train" else {"input"}
        if not isinstance(item, dict) or not need <= set(item):
          _fail(path, at, f"expected keys {sorted(need)}")
        output = _grid(item["output"], path, f"{at} output") if "output" in item else None
        out.append(Pair(_grid(item["input"], path, f"{at} input"), output))
      pairs[split] = out
    tasks[task_id] = Task(task_id, pairs["train"], pairs["test"])
  return tasks


def attach_solutions(tasks: Dict[str, Task], path: str) -> Dict[str, Task]:
  """Tasks with the test outputs of a `*_solutions.json` file; every task and test input must match."""
  data = _load_json(path)
  if not isinstance(data, dict):
    _fail(path, "top level", "expected an object {task_id: [grid, ...]}")
  missing, extra = sorted(set(tasks) - set(data)), sorted(set(data) - set(tasks))
  if missing or extra:
    _fail(path, "task ids", f"do not match the challenges: missing {missing[:5]}, unknown {extra[:5]}")
  out = {}
  for task_id, task in tasks.items():
    grids = data[task_id]
    if not isinstance(grids, list) or len(grids) != len(task.test):
      n = len(grids) if isinstance(grids, list) else type(grids).__name__
      _fail(path, f"task {task_id}", f"{n} solutions for {len(task.test)} test inputs")
    test = [Pair(p.input, _grid(g, path, f"task {task_id} solution[{i}]"))
            for i, (p, g) in enumerate(zip(task.test, grids))]
    out[task_id] = Task(task_id, task.train, test)
  return out


def load_split(folder: str, name: str, with_solutions: bool = True) -> Dict[str, Task]:
  """`arc-agi_<name>_challenges.json` (+ `_solutions.json`) of `folder`, validated."""
  challenges = os.path.join(folder, f"arc-agi_{name}_challenges.json")
  if not os.path.exists(challenges):
    raise FileNotFoundError(f"{challenges} not found. Fix: point the manual dir at the folder with the "
                            "Kaggle combined ARC-AGI files (arc-agi_<set>_challenges.json)")
  tasks = read_challenges(challenges)
  solutions = os.path.join(folder, f"arc-agi_{name}_solutions.json")
  if with_solutions:
    if not os.path.exists(solutions):
      raise FileNotFoundError(f"{solutions} not found (needed for the test outputs)")
    tasks = attach_solutions(tasks, solutions)
  return tasks
