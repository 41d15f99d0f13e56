"""The ARC datasets built from the tasks (`arc`, read by `arc_files`): the variants (which sets
train and which set's test inputs form the test split), the puzzle identifiers of every (task,
augmentation) and the metadata needed to invert predictions (`ArcMetadata`), and the examples of
each split. Train-split examples are translated by a seeded random offset (the same for input and
output), except one randomly chosen example per puzzle; the test split is never translated.

Synopsis:

  import numpy as np
  from input_pipeline.puzzles import arc, arc_dataset
  grid = np.array([[1, 2], [3, 4]], np.uint8)
  task = arc.Task("00000001", [arc.Pair(grid, grid.T)], [arc.Pair(grid[::-1], grid[:, ::-1])])
  augs = arc.generate_augmentations(task, num_aug=8, seed=0)
  meta = arc_dataset.build_metadata([("toy", task)], arc_dataset.Variant("toy", ("toy",), "toy"),
                                    num_aug=8, seed=0)
  train = list(arc_dataset.iter_examples([task], meta, "train"))   # dicts of numpy values
  test = list(arc_dataset.iter_examples([task], meta, "test"))
  assert meta.num_puzzle_identifiers == 1 + len(augs) == 1 + len(test)
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

from input_pipeline.puzzles import arc
from input_pipeline.puzzles import arc_files


@dataclasses.dataclass(frozen=True)
class Variant:
  """The sets a dataset is built from: every pair of `sets` trains, except the test pairs of
  `test_set`, which form the test split (its demonstrations train)."""
  name: str
  sets: Tuple[str, ...]
  test_set: str

  def __post_init__(self):
    if self.test_set not in self.sets:
      raise ValueError(f"variant {self.name}: test set {self.test_set!r} not in {self.sets}")


VARIANTS: Dict[str, Variant] = {
    "arc1": Variant("arc1", ("training", "evaluation", "concept"), "evaluation"),
    "arc2": Variant("arc2", ("training2", "evaluation2", "concept"), "evaluation2"),
}


def get_variant(name: str) -> Variant:
  if name not in VARIANTS:
    raise ValueError(f"unknown ARC variant {name!r}; known: {', '.join(VARIANTS)}")
  return VARIANTS[name]


def load_variant(folder: str, variant: Variant | str) -> List[Tuple[str, arc.Task]]:
  """(set name, task) of every task of the variant: sets in the variant's order, task ids sorted
  within a set; solutions attached. A task id in two sets is an error."""
  variant = get_variant(variant) if isinstance(variant, str) else variant
  out: List[Tuple[str, arc.Task]] = []
  where: Dict[str, str] = {}
  for name in variant.sets:
    tasks = arc_files.load_split(folder, name)
    for task_id in sorted(tasks):
      if task_id in where:
        raise arc.ArcFormatError(
            f"{os.path.join(folder, f'arc-agi_{name}_challenges.json')}: task {task_id}: also in "
            f"set {where[task_id]!r}; variant {variant.name} needs each task once (fix the files or "
            "the variant's sets)")
      where[task_id] = name
      out.append((name, tasks[task_id]))
  return out


def _train_pairs(set_name: str, task: arc.Task, test_set: str) -> List[arc.Pair]:
  """The pairs of a task that go to the train split (all but the test set's test pairs)."""
  return list(task.train) + ([] if set_name == test_set else list(task.test))


@dataclasses.dataclass(frozen=True)
class ArcMetadata:
  """Per puzzle identifier: its task and augmentation; per test task: the solutions.

  Puzzle ids of task t are puzzle_offsets[t] .. puzzle_offsets[t + 1] - 1, the first being the
  identity; id 0 is the blank (task -1, identity). JSON form (`to_json`): scalars, lists of task
  ids / sets, `puzzle_offsets`, `augmentations` (one string of 11 digits per puzzle id 1..P-1: the
  dihedral id then the colour map), `test_outputs` {task_id: [grid, ...]} and split counts.
  """
  variant: str
  test_set: str
  num_aug: int
  seed: int
  task_ids: Tuple[str, ...]            # [T] every task, in puzzle-id order (feature task_index)
  task_sets: Tuple[str, ...]           # [T] the set of each task
  puzzle_offsets: np.ndarray           # [T + 1] int64, puzzle_offsets[0] == 1
  dihedral: np.ndarray                 # [P] int8 per puzzle id (0 for the blank)
  colours: np.ndarray                  # [P, 10] uint8 per puzzle id (identity for the blank)
  test_outputs: Dict[str, List[np.ndarray]]   # solutions of the test-set tasks, in test order
  num_train_examples: int
  num_test_examples: int

  @property
  def num_puzzle_identifiers(self) -> int:
    """Rows of the puzzle-embedding table (the blank included)."""
    return int(self.puzzle_offsets[-1])

  @property
  def test_task_ids(self) -> List[str]:
    """The test-set tasks in order (keys of the submission)."""
    return [t for t, s in zip(self.task_ids, self.task_sets) if s == self.test_set]

  @property
  def puzzle_task(self) -> np.ndarray:
    """[P] int: the task index of each puzzle id (-1 for the blank)."""
    counts = np.diff(self.puzzle_offsets)
    return np.concatenate([[-1], np.repeat(np.arange(len(self.task_ids)), counts)]).astype(np.int64)

  def augmentation(self, puzzle_id: int) -> arc.Augmentation:
    self._check_id(puzzle_id)
    return arc.Augmentation(int(self.dihedral[puzzle_id]), tuple(self.colours[puzzle_id].tolist()))

  def task_of(self, puzzle_id: int) -> str:
    self._check_id(puzzle_id)
    if puzzle_id == 0:
      raise ValueError("puzzle id 0 is the blank identifier: it belongs to no task")
    t = int(np.searchsorted(self.puzzle_offsets, puzzle_id, side="right")) - 1
    return self.task_ids[t]

  def _check_id(self, puzzle_id: int) -> None:
    if not 0 <= int(puzzle_id) < self.num_puzzle_identifiers:
      raise ValueError(f"puzzle id {puzzle_id} outside 0..{self.num_puzzle_identifiers - 1} of ARC "
                       f"variant {self.variant} (num_aug={self.num_aug}, seed={self.seed}); are the "
                       "predictions and the metadata from the same prepared dataset?")

  def to_json(self) -> dict:
    digits = np.concatenate([self.dihedral[1:, None].astype(np.uint8), self.colours[1:]], axis=1)
    return dict(
        format="arc_metadata/1", variant=self.variant, test_set=self.test_set,
        num_aug=self.num_aug, seed=self.seed, task_ids=list(self.task_ids),
        task_sets=list(self.task_sets), puzzle_offsets=[int(x) for x in self.puzzle_offsets],
        augmentations=(digits + ord("0")).astype(np.uint8).tobytes().decode("ascii"),
        test_outputs={k: [g.tolist() for g in v] for k, v in self.test_outputs.items()},
        num_puzzle_identifiers=self.num_puzzle_identifiers,
        num_train_examples=self.num_train_examples, num_test_examples=self.num_test_examples)

  @classmethod
  def from_json(cls, data: dict) -> "ArcMetadata":
    if not isinstance(data, dict) or data.get("format") != "arc_metadata/1":
      raise ValueError("not ARC metadata (expected a dict with format 'arc_metadata/1', as written "
                       "by ArcMetadata.to_json / the arc_agi builder)")
    offsets = np.asarray(data["puzzle_offsets"], np.int64)
    digits = np.frombuffer(data["augmentations"].encode("ascii"), np.uint8).reshape(-1, 11)
    digits = digits - ord("0")
    if digits.shape[0] != offsets[-1] - 1:
      raise ValueError(f"ARC metadata: {digits.shape[0]} augmentations for "
                       f"{offsets[-1] - 1} puzzle ids")
    dihedral = np.concatenate([[0], digits[:, 0]]).astype(np.int8)
    colours = np.concatenate([np.arange(arc.NUM_COLOURS, dtype=np.uint8)[None], digits[:, 1:]])
    return cls(variant=data["variant"], test_set=data["test_set"], num_aug=int(data["num_aug"]),
               seed=int(data["seed"]), task_ids=tuple(data["task_ids"]),
               task_sets=tuple(data["task_sets"]), puzzle_offsets=offsets, dihedral=dihedral,
               colours=colours.astype(np.uint8),
               test_outputs={k: [np.asarray(g, np.uint8) for g in v]
                             for k, v in data["test_outputs"].items()},
               num_train_examples=int(data["num_train_examples"]),
               num_test_examples=int(data["num_test_examples"]))


def build_metadata(tasks: Sequence[Tuple[str, arc.Task]], variant: Variant | str, num_aug: int,
                   seed: int) -> ArcMetadata:
  """Augmentations and puzzle ids of `tasks` ((set, task) in order, e.g. from `load_variant`)."""
  variant = get_variant(variant) if isinstance(variant, str) else variant
  offsets = [1]
  dihedral = [np.zeros(1, np.int8)]
  colours = [np.arange(arc.NUM_COLOURS, dtype=np.uint8)[None]]
  test_outputs: Dict[str, List[np.ndarray]] = {}
  num_train = num_test = 0
  for set_name, task in tasks:
    if set_name not in variant.sets:
      raise ValueError(f"task {task.task_id}: set {set_name!r} is not one of variant "
                       f"{variant.name}'s sets {variant.sets}")
    augs = arc.generate_augmentations(task, num_aug, seed)
    offsets.append(offsets[-1] + len(augs))
    dihedral.append(np.array([a.dihedral for a in augs], np.int8))
    colours.append(np.array([a.colours for a in augs], np.uint8))
    num_train += len(augs) * len(_train_pairs(set_name, task, variant.test_set))
    if set_name == variant.test_set:
      if any(p.output is None for p in task.test):
        raise ValueError(f"task {task.task_id} of the test set {set_name!r} has no solutions: load "
                         "it with its *_solutions.json (load_split(..., with_solutions=True))")
      test_outputs[task.task_id] = [p.output for p in task.test]
      num_test += len(augs) * len(task.test)
  return ArcMetadata(
      variant=variant.name, test_set=variant.test_set, num_aug=num_aug, seed=seed,
      task_ids=tuple(t.task_id for _, t in tasks), task_sets=tuple(s for s, _ in tasks),
      puzzle_offsets=np.asarray(offsets, np.int64), dihedral=np.concatenate(dihedral),
      colours=np.concatenate(colours), test_outputs=test_outputs, num_train_examples=num_train,
      num_test_examples=num_test)


def iter_examples(tasks: Sequence[arc.Task], meta: ArcMetadata, split: str) -> Iterator[dict]:
  """The examples of `split` ("train" or "test") in order: task, augmentation, pair.

  `tasks` are the metadata's tasks in its order. Each example: inputs [900] int32, labels [900]
  int32 (padding -100), puzzle_identifiers, index (row in the split), task_index (into
  meta.task_ids), test_index (the test input's position in its task; -1 on the train split).
  Train-split examples are translated (seeded per puzzle) except one per puzzle.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split {split!r} must be 'train' or 'test'")
  if tuple(t.task_id for t in tasks) != meta.task_ids:
    raise ValueError("iter_examples: the tasks are not the metadata's tasks in its order")
  index = 0
  for t, (task, set_name) in enumerate(zip(tasks, meta.task_sets)):
    if split == "train":
      pairs = _train_pairs(set_name, task, meta.test_set)
    else:
      pairs = list(task.test) if set_name == meta.test_set else []
    if not pairs:
      continue
    key = arc.task_key(task.task_id)
    for a, pid in enumerate(range(int(meta.puzzle_offsets[t]), int(meta.puzzle_offsets[t + 1]))):
      aug = meta.augmentation(pid)
      rng = None
      if split == "train":
        rng = np.random.default_rng(np.random.SeedSequence([meta.seed, arc.TAG_TRANSLATE, key, a]))
        keep = int(rng.integers(0, len(pairs)))      # the one example left untranslated
      for i, pair in enumerate(pairs):
        inp, out = aug.apply(pair.input), aug.apply(pair.output)
        offset = (0, 0)
        if rng is not None and i != keep:
          offset = arc.random_offset(rng, inp.shape, out.shape)
        inputs, labels = arc.encode_pair(inp, out, offset)
        yield dict(inputs=inputs, labels=labels, puzzle_identifiers=np.int32(pid),
                   index=np.int64(index), task_index=np.int32(t),
                   test_index=np.int32(i if split == "test" else -1))
        index += 1
