"""The ARC evaluator of the TRM reference: vote over augmentations, pass@K, a Kaggle submission.

Pure numpy/Python (no JAX), after docs/trm.md section 3. Every prediction of an augmented
test example is cropped (the largest top-left rectangle of colour tokens, `arc.crop`), mapped back to
the original frame (inverse dihedral transform and inverse colour permutation of its puzzle id) and
counted as one vote for that grid on its (task, test input). Candidates of a test input are ranked by
vote count, then by the mean sigmoid(q_halt) of their votes, then by their grid key (so the order is
total and the same however the votes were split over hosts). pass@k of a test input: its solution is
among the top k; a task's score is the fraction of its test inputs passed; pass@k is the mean over
tasks (pass@2 is the headline). The submission holds, per test input in order, the top-2 non-empty
candidates as attempt_1 / attempt_2 (attempt_2 repeats attempt_1 when there is only one; [[0]] when
there is none).

Multi-host: each host calls `collect` on its own examples (any number of calls, e.g. per batch);
the results ("votes") are plain JSON-able dicts; `merge` adds any number of them exactly (counts and
q sums are integers), so merging per-host votes, in any order or grouping, equals a single-process
evaluation bit for bit. One process is just `merge([votes])` (or the votes themselves).

Glossary:
  N          examples of one `collect` call (leading dims are flattened: [D, b, 900] works)
  tokens     predictions [N, 900] int: argmax of the last ACT step's logits (0 pad, 1 EOS, 2..11)
  q_halt     logits [N] of the last ACT step (sigmoid taken here in float64)
  grid key   "HxW:" and the H*W colour digits row-major, e.g. "2x3:012345"; "0x0:" is an empty crop
  votes      {"format": "arc_votes/1", "num_examples": int,
              "votes": {task_id: {"<test index>": {grid key: [count, q_sum]}}}}
             q_sum = sum of sigmoid(q_halt) in units of 2**-53 (an exact int)
  metrics    {"pass@1": .., "pass@2": .., ..., "num_tasks", "num_test_inputs",
              "num_test_inputs_voted", "num_votes"}
  submission {task_id: [{"attempt_1": grid, "attempt_2": grid}, ...]} (Kaggle ARC Prize format)

Synopsis:

  import numpy as np
  from input_pipeline.puzzles import arc, arc_dataset
  from experiments.trm import arc_eval
  task = arc.Task("t1", [arc.Pair(np.array([[1, 2]], np.uint8), np.array([[2, 1]], np.uint8))],
                  [arc.Pair(np.array([[3, 4]], np.uint8), np.array([[4, 3]], np.uint8))])
  meta = arc_dataset.build_metadata([("toy", task)], arc_dataset.Variant("toy", ("toy",), "toy"),
                                    num_aug=3, seed=0)
  examples = list(arc_dataset.iter_examples([task], meta, "test"))    # one per augmentation
  preds = np.stack([e["labels"] for e in examples]).clip(0)            # [N, 900] a perfect model
  ids = np.array([e["puzzle_identifiers"] for e in examples])         # [N]
  test_index = np.array([e["test_index"] for e in examples])          # [N]
  q_halt = np.zeros(len(examples))                                    # [N]
  half = len(examples) // 2                                           # two "hosts"
  parts = [arc_eval.collect(meta, preds[s], q_halt[s], ids[s], test_index[s])
           for s in (slice(0, half), slice(half, None))]
  metrics, submission = arc_eval.finalize(meta, parts)
  assert metrics["pass@1"] == 1.0 and submission["t1"][0]["attempt_1"] == [[4, 3]]
  arc_eval.validate_submission(submission, meta)
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from experiments.common import workdir
from input_pipeline.puzzles import arc
from input_pipeline.puzzles import arc_dataset

PASS_KS = (1, 2, 5, 10, 100, 1000)
VOTES_FORMAT = "arc_votes/1"
_Q_SCALE = 2 ** 53


# --------------------------------------------------------------------------------------------
# Grid keys.

def grid_key(grid: np.ndarray) -> str:
  """The text key of a grid [H, W] of colours 0..9: "HxW:" + digits (row-major)."""
  grid = np.asarray(grid)
  if grid.ndim != 2:
    raise ValueError(f"grid_key: expected a 2-D grid, got shape {grid.shape}")
  h, w = grid.shape
  digits = (np.ascontiguousarray(grid, np.uint8) + ord("0")).tobytes().decode("ascii")
  return f"{h}x{w}:{digits}"


def key_grid(key: str) -> List[List[int]]:
  """The grid (list of rows) of a grid key."""
  shape, _, digits = key.partition(":")
  h, w = (int(x) for x in shape.split("x"))
  return [[int(ch) for ch in digits[r * w:(r + 1) * w]] for r in range(h)]


def _empty_votes() -> dict:
  return {"format": VOTES_FORMAT, "num_examples": 0, "votes": {}}


def _check_votes(votes: Any) -> None:
  if not isinstance(votes, dict) or votes.get("format") != VOTES_FORMAT:
    raise ValueError(f"not ARC votes: expected a dict with format {VOTES_FORMAT!r} as returned by "
                     "arc_eval.collect / merge (per-host files: workdir.read_json)")


# --------------------------------------------------------------------------------------------
# Per-host collection and merging.

def collect(meta: arc_dataset.ArcMetadata, predictions: np.ndarray, q_halt_logits: np.ndarray,
            puzzle_identifiers: np.ndarray, test_index: np.ndarray,
            mask: Optional[np.ndarray] = None) -> dict:
  """Votes of one host's (or one batch's) test-split predictions.

  Args:
    meta: the prepared dataset's metadata (`input_pipeline.builders.arc_agi.load_metadata`).
    predictions: predicted tokens [..., 900] (argmax of the last ACT step's logits).
    q_halt_logits: [...] q_halt logits of the last ACT step.
    puzzle_identifiers: [...] the examples' `puzzle_identifiers` feature.
    test_index: [...] the examples' `test_index` feature (test input within its task).
    mask: [...] bool, False on padding rows (the eval iterator's `mask`); rows with puzzle id 0
      (the blank, which padding carries) are skipped too.
  Returns:
    JSON-able votes (see the module glossary), to `merge` with the other hosts' votes.
  """
  predictions = np.asarray(predictions)
  if predictions.shape[-1:] != (arc.SEQ_LEN,):
    raise ValueError(f"arc_eval.collect: predictions must be [..., {arc.SEQ_LEN}] tokens, got shape "
                     f"{predictions.shape}")
  tokens = predictions.reshape(-1, arc.SEQ_LEN)
  n = tokens.shape[0]
  fields = {"q_halt_logits": q_halt_logits, "puzzle_identifiers": puzzle_identifiers,
            "test_index": test_index}
  if mask is not None:
    fields["mask"] = mask
  flat = {}
  for name, value in fields.items():
    value = np.asarray(value).reshape(-1)
    if value.shape[0] != n:
      raise ValueError(f"arc_eval.collect: {name} has {value.shape[0]} rows but predictions have {n} "
                       f"(shape {predictions.shape}); pass the same examples' fields")
    flat[name] = value
  pids = flat["puzzle_identifiers"].astype(np.int64)
  keep = pids != 0
  if mask is not None:
    keep &= flat["mask"].astype(bool)
  rows = np.flatnonzero(keep)
  votes = _empty_votes()
  if rows.size == 0:
    return votes
  x = flat["q_halt_logits"].astype(np.float64)[rows]
  q = np.exp(-np.logaddexp(0.0, -x))                       # sigmoid in float64, no overflow
  q_fixed = np.rint(q * _Q_SCALE).astype(np.int64)
  grids = arc.crop_batch(tokens[rows])
  puzzle_task = meta.puzzle_task
  table = votes["votes"]
  for j, row in enumerate(rows):
    pid = int(pids[row])
    if not 0 < pid < meta.num_puzzle_identifiers:
      meta.augmentation(pid)                                 # raises, naming the id and the fix
    task_id = meta.task_ids[puzzle_task[pid]]
    solutions = meta.test_outputs.get(task_id)
    if solutions is None:
      raise ValueError(f"arc_eval.collect: row {int(row)} has puzzle id {pid} of task {task_id} "
                       f"(set {meta.task_sets[puzzle_task[pid]]}), not of the test set "
                       f"{meta.test_set}; pass only test-split examples")
    t = int(flat["test_index"][row])
    if not 0 <= t < len(solutions):
      raise ValueError(f"arc_eval.collect: row {int(row)} (task {task_id}, puzzle id {pid}) has "
                       f"test_index {t} but the task has {len(solutions)} test inputs; pass the "
                       "examples' test_index feature")
    inverse_colours = np.argsort(meta.colours[pid]).astype(np.uint8)
    grid = inverse_colours[arc.inverse_dihedral_transform(grids[j], int(meta.dihedral[pid]))]
    cell = table.setdefault(task_id, {}).setdefault(str(t), {}).setdefault(grid_key(grid), [0, 0])
    cell[0] += 1
    cell[1] += int(q_fixed[j])
  votes["num_examples"] = int(rows.size)
  return votes


def merge(parts: Iterable[dict]) -> dict:
  """The sum of votes (per-host, per-batch ...); exact, so independent of order and grouping."""
  out = _empty_votes()
  table = out["votes"]
  for part in parts:
    _check_votes(part)
    out["num_examples"] += int(part["num_examples"])
    for task_id, inputs in part["votes"].items():
      mine = table.setdefault(task_id, {})
      for t, candidates in inputs.items():
        cells = mine.setdefault(str(t), {})
        for key, (count, q_sum) in candidates.items():
          cell = cells.setdefault(key, [0, 0])
          cell[0] += int(count)
          cell[1] += int(q_sum)
  return out


def rank(candidates: Dict[str, Sequence[int]]) -> List[Tuple[str, int, float]]:
  """(grid key, votes, mean sigmoid(q_halt)) of one test input's candidates, best first."""
  items = [(key, int(c), int(q) / (int(c) * _Q_SCALE)) for key, (c, q) in candidates.items()]
  return sorted(items, key=lambda item: (-item[1], -item[2], item[0]))


# --------------------------------------------------------------------------------------------
# Scores and the submission.

def score(meta: arc_dataset.ArcMetadata, votes: dict, pass_ks: Sequence[int] = PASS_KS,
          tasks: Optional[Sequence[str]] = None) -> Dict[str, float]:
  """pass@k (mean over tasks of the fraction of test inputs whose solution is in the top k).

  `tasks`: the task ids to score (default: every test-set task; a test input without votes counts
  as failed). Pass `voted_tasks(votes)` to score only the tasks an eval subset reached.
  """
  _check_votes(votes)
  task_ids = meta.test_task_ids if tasks is None else list(tasks)
  unknown = sorted(set(votes["votes"]) - set(meta.test_outputs))
  if unknown:
    raise ValueError(f"arc_eval.score: votes for tasks {unknown[:5]} that are not test tasks of "
                     f"{meta.variant}; were the votes and the metadata made from the same dataset?")
  passed = np.zeros(len(pass_ks))
  num_inputs = num_voted = 0
  for task_id in task_ids:
    if task_id not in meta.test_outputs:
      raise ValueError(f"arc_eval.score: {task_id!r} is not a test task of {meta.variant}")
    solutions = meta.test_outputs[task_id]
    task_votes = votes["votes"].get(task_id, {})
    right = np.zeros(len(pass_ks))
    for t, solution in enumerate(solutions):
      num_inputs += 1
      candidates = task_votes.get(str(t))
      if not candidates:
        continue
      num_voted += 1
      ranked = [key for key, _, _ in rank(candidates)]
      answer = grid_key(solution)
      if answer in ranked:
        position = ranked.index(answer)
        right += np.array([position < k for k in pass_ks], np.float64)
    passed += right / len(solutions)
  n = max(len(task_ids), 1)
  metrics = {f"pass@{k}": float(passed[i] / n) for i, k in enumerate(pass_ks)}
  metrics.update(num_tasks=len(task_ids), num_test_inputs=num_inputs,
                 num_test_inputs_voted=num_voted, num_votes=int(votes["num_examples"]))
  return metrics


def voted_tasks(votes: dict) -> List[str]:
  """The task ids that received at least one vote (sorted)."""
  _check_votes(votes)
  return sorted(votes["votes"])


def make_submission(meta: arc_dataset.ArcMetadata, votes: dict, attempts: int = 2
                    ) -> Dict[str, List[Dict[str, List[List[int]]]]]:
  """{task_id: [{"attempt_1": grid, ...}, ...]}: every test task, every test input, in order.

  Attempts are the top-ranked non-empty candidates (an empty crop is a vote but no Kaggle grid);
  missing attempts repeat the first one (as the reference does), or are [[0]] without candidates.
  """
  _check_votes(votes)
  out = {}
  for task_id in meta.test_task_ids:
    entries = []
    for t in range(len(meta.test_outputs[task_id])):
      candidates = votes["votes"].get(task_id, {}).get(str(t), {})
      keys = [key for key, _, _ in rank(candidates) if not key.startswith("0x")][:attempts]
      grids = [key_grid(key) for key in keys] or [[[0]]]
      grids += [grids[0]] * (attempts - len(grids))
      entries.append({f"attempt_{i + 1}": grid for i, grid in enumerate(grids)})
    out[task_id] = entries
  return out


def finalize(meta: arc_dataset.ArcMetadata, parts: Iterable[dict], pass_ks: Sequence[int] = PASS_KS,
             tasks: Optional[Sequence[str]] = None) -> Tuple[Dict[str, float], dict]:
  """(metrics, submission) of all hosts' votes: merge, score and make_submission in one call."""
  votes = merge(parts)
  return score(meta, votes, pass_ks, tasks), make_submission(meta, votes)


def validate_submission(submission: Any, meta: Optional[arc_dataset.ArcMetadata] = None,
                        attempts: int = 2) -> None:
  """Raise ValueError (naming task, test input and attempt) unless `submission` has the Kaggle
  format: {task_id: [{"attempt_1": grid, "attempt_2": grid}, ...]}, grids non-empty rectangular
  lists of rows of ints 0..9 (at most 30x30); with `meta`, exactly its test tasks and inputs."""
  if not isinstance(submission, dict):
    raise ValueError(f"submission: expected an object {{task_id: [...]}}, got "
                     f"{type(submission).__name__}")
  if meta is not None:
    missing = sorted(set(meta.test_outputs) - set(submission))
    extra = sorted(set(submission) - set(meta.test_outputs))
    if missing or extra:
      raise ValueError(f"submission: task ids differ from the test set {meta.test_set}: missing "
                       f"{missing[:5]}, unknown {extra[:5]}")
  names = [f"attempt_{i + 1}" for i in range(attempts)]
  for task_id, entries in submission.items():
    if not isinstance(entries, list) or not entries:
      raise ValueError(f"submission: task {task_id}: expected a non-empty list (one entry per test "
                       "input)")
    if meta is not None and len(entries) != len(meta.test_outputs[task_id]):
      raise ValueError(f"submission: task {task_id}: {len(entries)} entries for "
                       f"{len(meta.test_outputs[task_id])} test inputs")
    for t, entry in enumerate(entries):
      if not isinstance(entry, dict) or sorted(entry) != sorted(names):
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(f"submission: task {task_id} test input {t}: expected keys {names}, got "
                         f"{keys}")
      for name in names:
        grid = entry[name]
        where = f"submission: task {task_id} test input {t} {name}"
        if (not isinstance(grid, list) or not grid or len(grid) > arc.MAX_SIZE
            or not all(isinstance(row, list) and row for row in grid)):
          raise ValueError(f"{where}: a grid must be a non-empty list of at most 30 non-empty rows")
        if len({len(row) for row in grid}) != 1 or len(grid[0]) > arc.MAX_SIZE:
          raise ValueError(f"{where}: rows must have one length of at most 30")
        for row in grid:
          for cell in row:
            if isinstance(cell, bool) or not isinstance(cell, int) or not 0 <= cell <= 9:
              raise ValueError(f"{where}: {cell!r} is not a colour int 0..9")


# --------------------------------------------------------------------------------------------
# Files (per-host votes, the submission).

def write_json(path: str, obj: Any) -> None:
  """Write votes / metrics / a submission as JSON from this process (local or gs://, atomically);
  read back with experiments/common/workdir.read_json."""
  workdir.write_json(path, obj, every_process=True, compact=True)

