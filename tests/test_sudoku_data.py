"""Tests of the Sudoku input pipeline: encoding, solver, generator, CSV reader, builders, tf.data.

A tiny `sudoku_generated` dataset (64 train / 20 test) and a tiny `sudoku_extreme` manual dir are
prepared in a tmp dir once per session. TF outputs are checked with the numpy validators and the
numpy reference augmentation of `input_pipeline.puzzles.sudoku`.
"""

from __future__ import annotations

import itertools
import math
import pathlib

import numpy as np
import pytest

from experiments.common import errors as config_errors
from experiments.common import layout as layout_lib
from input_pipeline import data_source
from input_pipeline import datasets
from input_pipeline import evaluation
from input_pipeline import pipeline
from input_pipeline import prepare
from input_pipeline.puzzles import augment
from input_pipeline.puzzles import sudoku
from input_pipeline.puzzles import sudoku_csv
from input_pipeline.puzzles import sudoku_generator
from input_pipeline.builders import sudoku_extreme
from input_pipeline.builders import sudoku_generated

GEN_KWARGS = {"givens": 30, "train_size": 64, "test_size": 20, "seed": 0}
PUZZLE = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"
SOLUTION = "417369825632158947958724316825437169791586432346912758289643571573291684164875293"


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp("tfds_gen"))
  prepare.prepare("sudoku_generated", data_dir, GEN_KWARGS)
  return data_dir


def _train(data_dir: str, **kw) -> list[dict[str, np.ndarray]]:
  steps = kw.pop("steps")
  hosts, host = kw.pop("hosts", 1), kw.pop("process_index", 0)
  args = dict(layout=layout_lib.of(16, devices_per_host=2, hosts=hosts, process_index=host), seed=0)
  args.update(kw)
  it = pipeline.create_train_iterator(data_dir, "sudoku_generated", GEN_KWARGS, **args)
  return [next(it) for _ in range(steps)]


def _flat(batch: dict[str, np.ndarray], name: str) -> np.ndarray:
  value = batch[name]
  return value.reshape((-1,) + value.shape[2:])


# ----------------------------------------------------------------------------------------------
# Encoding, solver, generator.


def test_encoding_round_trip():
  tokens = sudoku.string_to_tokens(PUZZLE)
  assert tokens.dtype == np.int32 and tokens.shape == (81,)
  assert tokens[0] == 5 and tokens[1] == sudoku.BLANK_ID  # '4' -> 5, '.' -> 1
  assert set(np.unique(sudoku.string_to_tokens(SOLUTION))) == set(range(2, 11))
  assert np.array_equal(sudoku.string_to_tokens(PUZZLE.replace(".", "0")), tokens)
  assert sudoku.format_grid(sudoku.tokens_to_grid(tokens)) == PUZZLE
  with pytest.raises(ValueError):
    sudoku.tokens_to_grid(np.zeros(81, np.int32))  # pad is not a Sudoku cell


def _naive_count(grid: list[int], limit: int) -> int:
  """Independent check: plain backtracking with candidate sets, cell of fewest candidates."""
  grid = list(grid)
  empty = [i for i in range(81) if grid[i] == 0]
  if not empty:
    return 1

  def cands(i):
    r, c = divmod(i, 9)
    br, bc = 3 * (r // 3), 3 * (c // 3)
    used = {grid[r * 9 + k] for k in range(9)} | {grid[k * 9 + c] for k in range(9)}
    used |= {grid[(br + a) * 9 + bc + b] for a in range(3) for b in range(3)}
    return [d for d in range(1, 10) if d not in used]

  best = min(empty, key=lambda i: len(cands(i)))
  count = 0
  for d in cands(best):
    grid[best] = d
    count += _naive_count(grid, limit - count)
    if count >= limit:
      break
  grid[best] = 0
  return count


def test_solver():
  puzzle = sudoku.parse_grid(PUZZLE)
  (solution,) = sudoku_generator.solve(puzzle, limit=5)
  assert sudoku.format_grid(solution) == SOLUTION
  assert sudoku_generator.count_solutions(puzzle, limit=2) == 1
  assert sudoku_generator.count_solutions(np.zeros(81, np.uint8), limit=2) == 2
  assert sudoku_generator.count_solutions(np.zeros(81, np.uint8), limit=7) == 7
  clash = np.zeros(81, np.uint8)
  clash[0] = clash[1] = 3
  assert sudoku_generator.count_solutions(clash) == 0
  # A full grid minus a "deadly rectangle" (a b / b a in two rows, two columns, two boxes).
  full = sudoku.parse_grid(SOLUTION)
  for r1, r2, c1, c2 in itertools.product(range(9), range(9), range(9), range(9)):
    if r1 < r2 and r1 // 3 == r2 // 3 and c1 < c2 and c1 // 3 != c2 // 3:
      a, b = full[r1 * 9 + c1], full[r1 * 9 + c2]
      if full[r2 * 9 + c1] == b and full[r2 * 9 + c2] == a:
        break
  else:
    pytest.fail("no deadly rectangle in the test grid")
  holed = full.copy()
  holed[[r1 * 9 + c1, r1 * 9 + c2, r2 * 9 + c1, r2 * 9 + c2]] = 0
  assert sudoku_generator.count_solutions(holed, limit=5) == 2
  assert sudoku_generator.rate_puzzle(sudoku.parse_grid(SOLUTION)) == 0


def test_generator_unique_and_knob():
  puzzles, solutions = sudoku_generator.generate_puzzles(24, seed=7, givens=30)
  assert puzzles.shape == solutions.shape == (24, 81)
  assert np.all((puzzles > 0).sum(axis=1) == 30)
  assert sudoku.is_valid_pair(puzzles, solutions).all()
  for p, s in zip(puzzles, solutions):
    assert sudoku_generator.count_solutions(p, limit=2) == 1
    assert np.array_equal(sudoku_generator.solve(p)[0], s)
  for p in puzzles[:3]:  # the independent solver agrees on uniqueness
    assert _naive_count([int(x) for x in p], 2) == 1
  assert len({p.tobytes() for p in puzzles}) == 24
  # Deterministic, independent of the worker count; other seeds and streams differ.
  again = sudoku_generator.generate_puzzles(24, seed=7, givens=30, num_workers=2)
  assert np.array_equal(again[0], puzzles) and np.array_equal(again[1], solutions)
  assert not np.array_equal(sudoku_generator.generate_puzzles(4, seed=8, givens=30)[0], puzzles[:4])
  assert not np.array_equal(sudoku_generator.generate_puzzles(4, seed=7, givens=30, stream="x")[0],
                            puzzles[:4])
  tail = sudoku_generator.generate_puzzles(4, seed=7, givens=30, start_index=20)
  assert np.array_equal(tail[0], puzzles[20:])


def test_generator_difficulty_knobs():
  hard, _ = sudoku_generator.generate_puzzles(3, seed=1, givens=25, min_rating=1)
  assert np.all((hard > 0).sum(axis=1) == 25)
  for p in hard:
    assert sudoku_generator.count_solutions(p, limit=2) == 1
    assert sudoku_generator.rate_puzzle(p) >= 1
  easy, _ = sudoku_generator.generate_puzzles(3, seed=1, givens=40, max_rating=0)
  assert all(sudoku_generator.rate_puzzle(p) == 0 for p in easy)
  with pytest.raises(ValueError, match="givens=16"):
    sudoku_generator.generate_puzzles(1, seed=0, givens=16)


# ----------------------------------------------------------------------------------------------
# CSV reader.


def _write_csv(path: pathlib.Path, rows: list[list[str]],
               header: str = "source,question,answer,rating") -> pathlib.Path:
  path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows))
  return path


def _valid_rows(n: int, seed: int = 0) -> list[list[str]]:
  puzzles, solutions = sudoku_generator.generate_puzzles(n, seed=seed, givens=32)
  return [["gen", sudoku.format_grid(p), sudoku.format_grid(s), str(i % 5)]
          for i, (p, s) in enumerate(zip(puzzles, solutions))]


def test_csv_reader_valid(tmp_path):
  rows = _valid_rows(5)
  rows[1][1] = rows[1][1].replace(".", "0")  # '0' is accepted as a blank
  data = sudoku_csv.read_sudoku_csv(_write_csv(tmp_path / "train.csv", rows))
  assert len(data) == 5
  assert data.questions.shape == data.answers.shape == (5, 81)
  assert list(data.ratings) == [0, 1, 2, 3, 4]
  assert list(data.line_numbers) == [2, 3, 4, 5, 6]
  assert sudoku.format_grid(data.questions[1]) == rows[1][1].replace("0", ".")
  assert sudoku.is_valid_pair(data.questions, data.answers).all()


def _corrupt(rows: list[list[str]], i: int, field: int, fn) -> list[list[str]]:
  rows = [list(r) for r in rows]
  rows[i][field] = fn(rows[i][field])
  return rows


def _swap_blank_cells(question: str, answer: str) -> str:
  """Swap two answer cells of one row that are blank in the question and differ: the row stays a
  permutation and the givens still agree, but two columns break."""
  for r in range(9):
    blanks = [r * 9 + c for c in range(9) if question[r * 9 + c] == "."]
    if len(blanks) >= 2:
      a, b = blanks[:2]
      s = list(answer)
      s[a], s[b] = s[b], s[a]
      return "".join(s)
  raise AssertionError("no row with two blanks")


@pytest.mark.parametrize("case", ["short_question", "question_alphabet", "answer_alphabet",
                                  "answer_length", "inconsistent", "invalid_solution", "fields",
                                  "rating"])
def test_csv_reader_rejects_malformed_rows(tmp_path, case):
  rows = _valid_rows(4, seed=3)
  bad = 2  # row index 2 -> line 4 (line 1 is the header)
  q = rows[bad][1]
  given = next(i for i, ch in enumerate(q) if ch != ".")
  if case == "short_question":
    rows = _corrupt(rows, bad, 1, lambda s: s[:80])
    expect = "question has 80 characters, expected 81"
  elif case == "question_alphabet":
    rows = _corrupt(rows, bad, 1, lambda s: "x" + s[1:])
    expect = "question has characters ['x']"
  elif case == "answer_alphabet":
    rows = _corrupt(rows, bad, 2, lambda s: s[:5] + "0" + s[6:])
    expect = "answer has characters ['0']"
  elif case == "answer_length":
    rows = _corrupt(rows, bad, 2, lambda s: s + "1")
    expect = "answer has 82 characters, expected 81"
  elif case == "inconsistent":
    other = str(int(q[given]) % 9 + 1)
    rows = _corrupt(rows, bad, 1, lambda s: s[:given] + other + s[given + 1:])
    expect = "answer disagrees with the question"
  elif case == "invalid_solution":
    rows = _corrupt(rows, bad, 2, lambda s: _swap_blank_cells(q, s))
    expect = "answer is not a valid Sudoku solution (column"
  elif case == "fields":
    rows[bad] = rows[bad][:3]
    expect = "row has 3 fields, expected 4"
  else:
    rows = _corrupt(rows, bad, 3, lambda s: "hard")
    expect = "rating 'hard' is not an integer"
  path = _write_csv(tmp_path / "train.csv", rows)
  with pytest.raises(sudoku.SudokuDataError) as err:
    sudoku_csv.read_sudoku_csv(path)
  message = str(err.value)
  assert message.startswith(f"{path}:4: "), message
  assert expect in message, message


def test_csv_reader_rejects_bad_header(tmp_path):
  path = _write_csv(tmp_path / "test.csv", _valid_rows(1), header="question,answer")
  with pytest.raises(sudoku.SudokuDataError, match=r"test\.csv:1: header"):
    sudoku_csv.read_sudoku_csv(path)


# ----------------------------------------------------------------------------------------------
# Augmentation: numpy reference and TF.


def test_numpy_reference_augmentation_keeps_valid_pairs():
  puzzles, solutions = sudoku_generator.generate_puzzles(8, seed=2, givens=30)
  rng = np.random.default_rng(0)
  for p, s in zip(puzzles, solutions):
    pt, st = sudoku.grid_to_tokens(p), sudoku.grid_to_tokens(s)
    for _ in range(20):
      ap, as_ = sudoku.augment_pair(pt, st, rng)
      assert sudoku.is_valid_pair(sudoku.tokens_to_grid(ap), sudoku.tokens_to_grid(as_))
      assert (ap == sudoku.BLANK_ID).sum() == (pt == sudoku.BLANK_ID).sum()
      assert sudoku_generator.count_solutions(sudoku.tokens_to_grid(ap), limit=2) == 1


def _tf_augment(n: int, seed: int, tokens: np.ndarray):
  import tensorflow as tf
  params = augment.sample_sudoku_transforms(pipeline.fold_in(tf.constant([0, seed]), 1), n)
  out = augment.apply_sudoku_transforms(tf.constant(tokens), params)
  return out.numpy(), {k: v.numpy() for k, v in params.items()}


def test_tf_augmentation_valid_and_reachable():
  puzzles, solutions = sudoku_generator.generate_puzzles(4, seed=5, givens=30)
  n = 256
  rows = np.arange(n) % 4
  inputs = sudoku.grid_to_tokens(puzzles)[rows]  # [n, 81]
  labels = sudoku.grid_to_tokens(solutions)[rows]  # [n, 81]
  import tensorflow as tf
  p = augment.sample_sudoku_transforms(pipeline.fold_in(tf.constant([0, 3]), 1), n)
  params = {k: v.numpy() for k, v in p.items()}
  aug_in = augment.apply_sudoku_transforms(tf.constant(inputs), p).numpy()
  aug_lab = augment.apply_sudoku_transforms(tf.constant(labels), p).numpy()
  # Valid pairs, givens preserved (count and agreement), still uniquely solvable.
  assert sudoku.is_valid_pair(sudoku.tokens_to_grid(aug_in), sudoku.tokens_to_grid(aug_lab)).all()
  assert np.array_equal((aug_in == 1).sum(1), (inputs == 1).sum(1))
  for i in range(8):
    assert sudoku_generator.count_solutions(sudoku.tokens_to_grid(aug_in[i]), limit=2) == 1
  # Every TF transform is an element of the reference group and gives the reference's output.
  for i in range(n):
    assert sorted(params["digit_perm"][i]) == list(range(9))
    assert sudoku.is_band_permutation(params["row_perm"][i])
    assert sudoku.is_band_permutation(params["col_perm"][i])
    t = sudoku.SudokuTransform(digit_perm=params["digit_perm"][i],
                               transpose=bool(params["transpose"][i]),
                               row_perm=params["row_perm"][i], col_perm=params["col_perm"][i])
    assert np.array_equal(sudoku.apply_transform(inputs[i], t), aug_in[i])
    assert np.array_equal(sudoku.apply_transform(labels[i], t), aug_lab[i])
  # Pad and ignored labels are fixed.
  special = np.array([[0, -100] + [1] * 79], np.int32)
  out = augment.apply_sudoku_transforms(tf.constant(special), {k: v[:1] for k, v in p.items()})
  assert sorted(out.numpy()[0].tolist()) == sorted(special[0].tolist())


def _chi2_ok(counts: np.ndarray) -> bool:
  """Chi-square goodness of fit to uniform, generous bound (mean + 5 sd) for a fixed-seed check."""
  k = counts.size
  expected = counts.sum() / k
  chi2 = float(((counts - expected) ** 2 / expected).sum())
  return chi2 < (k - 1) + 5 * math.sqrt(2 * (k - 1))


def test_tf_augmentation_frequencies_match_reference():
  n = 6000
  _, tf_params = _tf_augment(n, 11, np.ones((n, 81), np.int32))
  rng = np.random.default_rng(11)
  ref = [sudoku.sample_transform(rng) for _ in range(n)]
  ref_params = dict(digit_perm=np.stack([t.digit_perm for t in ref]),
                    transpose=np.array([t.transpose for t in ref]),
                    row_perm=np.stack([t.row_perm for t in ref]),
                    col_perm=np.stack([t.col_perm for t in ref]))
  sd = math.sqrt(0.25 / n)
  for params in (tf_params, ref_params):
    assert abs(params["transpose"].mean() - 0.5) < 4.5 * sd
    # Digit 1 goes to each of the 9 digits equally often; so does the image of digit 5.
    assert _chi2_ok(np.bincount(params["digit_perm"][:, 0], minlength=9))
    assert _chi2_ok(np.bincount(params["digit_perm"][:, 4], minlength=9))
    # Band order: each of the 6 permutations equally often; rows within a band likewise.
    for perm in (params["row_perm"], params["col_perm"]):
      bands = perm[:, ::3] // 3  # [n, 3]
      codes = {p: i for i, p in enumerate(itertools.permutations(range(3)))}
      assert _chi2_ok(np.bincount([codes[tuple(b)] for b in bands], minlength=6))
      within = perm[:, 3:6] % 3
      assert _chi2_ok(np.bincount([codes[tuple(w)] for w in within], minlength=6))
      # Row 0 of the output comes from each of the 9 rows equally often.
      assert _chi2_ok(np.bincount(perm[:, 0], minlength=9))
  # Rows and columns are permuted independently of each other and of the transpose.
  same = (tf_params["row_perm"][:, 0] == tf_params["col_perm"][:, 0]).mean()
  assert abs(same - 1 / 9) < 4.5 * math.sqrt((1 / 9) * (8 / 9) / n)


# ----------------------------------------------------------------------------------------------
# Builders and preparation.


def test_metadata():
  for name in ("sudoku_extreme", "sudoku_generated"):
    meta = datasets.get_metadata(name)
    assert meta["vocab_size"] == 11 and meta["seq_len"] == 81
    assert meta["num_puzzle_identifiers"] == 1
    assert meta["pad_id"] == 0 and meta["blank_id"] == 1 and meta["ignore_label_id"] == -100
  assert sudoku_extreme.METADATA == sudoku_generated.METADATA
  with pytest.raises(ValueError, match="unknown dataset"):
    datasets.get_metadata("sudoku")
  with pytest.raises(ValueError, match="unknown builder kwargs"):
    datasets.make_config("sudoku_generated", {"givns": 3})
  assert datasets.make_config("sudoku_generated", {"givens": 30}).name == "medium"
  assert datasets.make_config("sudoku_extreme", {}).name == "n1000_r0_s0"


def test_generated_builder(gen_dir):
  builder = datasets.get_builder("sudoku_generated", gen_dir, GEN_KWARGS)
  assert builder.is_prepared()
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 64, "test": 20}
  train = pipeline.load_split(builder, "train")
  test = pipeline.load_split(builder, "test")
  assert train["inputs"].dtype == np.int32 and train["inputs"].shape == (64, 81)
  assert train["index"].dtype == np.int64 and list(train["index"]) == list(range(64))
  assert np.all(train["puzzle_identifiers"] == 0)
  grids = sudoku.tokens_to_grid(train["inputs"])
  assert np.all((grids > 0).sum(1) == 30)
  assert sudoku.is_valid_pair(grids, sudoku.tokens_to_grid(train["labels"])).all()
  # The stored data are exactly the generator's streams; test is disjoint from train.
  expect, _ = sudoku_generator.generate_puzzles(64, seed=0, givens=30, stream="train")
  assert np.array_equal(grids, expect)
  train_set = {r.tobytes() for r in train["inputs"]} | {r.tobytes() for r in train["labels"]}
  assert not any(r.tobytes() in train_set for r in test["inputs"])
  assert not any(r.tobytes() in train_set for r in test["labels"])


def test_prepare_idempotent_and_crash_safe(tmp_path, monkeypatch, gen_dir):
  builder = datasets.get_builder("sudoku_generated", gen_dir, GEN_KWARGS)
  files = sorted(pathlib.Path(builder.data_dir).iterdir())
  mtimes = [f.stat().st_mtime_ns for f in files]
  prepare.prepare("sudoku_generated", gen_dir, GEN_KWARGS)  # second call: a no-op
  assert sorted(pathlib.Path(builder.data_dir).iterdir()) == files
  assert [f.stat().st_mtime_ns for f in files] == mtimes

  kwargs = {"givens": 34, "train_size": 12, "test_size": 4, "seed": 1}
  data_dir = str(tmp_path)
  original = sudoku_generated.examples

  def crashing(puzzles, solutions):
    for i, example in enumerate(original(puzzles, solutions)):
      if i == 5:
        raise RuntimeError("simulated crash")
      yield example

  monkeypatch.setattr(sudoku_generated, "examples", crashing)
  with pytest.raises(RuntimeError, match="simulated crash"):
    prepare.prepare("sudoku_generated", data_dir, kwargs)
  monkeypatch.setattr(sudoku_generated, "examples", original)
  crashed = datasets.get_builder("sudoku_generated", data_dir, kwargs)
  assert not crashed.is_prepared()
  assert not pathlib.Path(crashed.data_dir).exists()  # nothing half-written under the final name
  done = prepare.prepare("sudoku_generated", data_dir, kwargs)
  assert done.info.splits["train"].num_examples == 12


@pytest.fixture(scope="session")
def extreme_manual_dir(tmp_path_factory) -> pathlib.Path:
  manual = tmp_path_factory.mktemp("sudoku_extreme_manual")
  rows = _valid_rows(30, seed=4)
  _write_csv(manual / "train.csv", rows[:24])
  _write_csv(manual / "test.csv", rows[24:])
  return manual


def test_extreme_builder_seeded_subsample(tmp_path, extreme_manual_dir):
  def build(name: str, **kw):
    builder = prepare.prepare("sudoku_extreme", str(tmp_path / name), kw, extreme_manual_dir)
    return pipeline.load_split(builder, "train"), pipeline.load_split(builder, "test")

  a_train, a_test = build("a", subsample_size=8, min_rating=1, seed=3)
  b_train, _ = build("b", subsample_size=8, min_rating=1, seed=3)
  c_train, _ = build("c", subsample_size=8, min_rating=1, seed=4)
  for name in ("inputs", "labels", "index"):
    assert np.array_equal(a_train[name], b_train[name])
  assert not np.array_equal(a_train["inputs"], c_train["inputs"])
  assert a_train["inputs"].shape == (8, 81) and a_test["inputs"].shape == (6, 81)
  csv = sudoku_csv.read_sudoku_csv(extreme_manual_dir / "train.csv")
  rows = sudoku_extreme.select_train_rows(csv.ratings, 8, 1, 3)
  assert np.all(csv.ratings[rows] >= 1)
  assert np.array_equal(a_train["inputs"], sudoku.grid_to_tokens(csv.questions[rows]))
  test_csv = sudoku_csv.read_sudoku_csv(extreme_manual_dir / "test.csv")
  assert np.array_equal(a_test["labels"], sudoku.grid_to_tokens(test_csv.answers))


def test_extreme_builder_rejects_malformed_csv(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  rows = _valid_rows(3, seed=6)
  _write_csv(manual / "train.csv", _corrupt(rows, 1, 1, lambda s: s[:79]))
  _write_csv(manual / "test.csv", rows)
  with pytest.raises(sudoku.SudokuDataError, match=r"train\.csv:3: question has 79 characters"):
    prepare.prepare("sudoku_extreme", str(tmp_path / "tfds"), {"subsample_size": None}, manual)


# ----------------------------------------------------------------------------------------------
# Training stream.


def test_batch_size_must_divide():
  with pytest.raises(config_errors.ConfigError, match=r"global_batch_size=10: not divisible by "
                     r"the 4 devices.*use a multiple of 4, e.g. 8"):
    layout_lib.of(10, devices_per_host=2, hosts=2)
  assert layout_lib.of(768, devices_per_host=4, hosts=2).per_device_batch == 96


def test_train_batches_shapes_and_validity(gen_dir):
  batches = _train(gen_dir, steps=4)
  b = batches[0]
  assert b["inputs"].shape == (2, 8, 81) and b["inputs"].dtype == np.int32
  assert b["labels"].shape == (2, 8, 81) and b["labels"].dtype == np.int32
  assert b["puzzle_identifiers"].shape == (2, 8) and b["index"].dtype == np.int64
  builder = datasets.get_builder("sudoku_generated", gen_dir, GEN_KWARGS)
  raw = pipeline.load_split(builder, "train")
  for batch in batches:
    inputs, labels, index = _flat(batch, "inputs"), _flat(batch, "labels"), _flat(batch, "index")
    assert sudoku.is_valid_pair(sudoku.tokens_to_grid(inputs), sudoku.tokens_to_grid(labels)).all()
    assert np.array_equal((inputs == 1).sum(1), (raw["inputs"][index] == 1).sum(1))
    assert not np.array_equal(inputs, raw["inputs"][index])  # augmented
  plain = _train(gen_dir, steps=1, augment=False)[0]
  assert np.array_equal(_flat(plain, "inputs"), raw["inputs"][_flat(plain, "index")])


def test_train_stream_runs_without_autotuning(gen_dir):
  """The training stream runs without tf.data's autotuning (fixed parallelism): its model thread
  sleeps up to a minute between optimisations and deleting the iterator waited for that sleep, which
  paused `make run` for 12-36 s before the final evaluation in about half the runs."""
  args = dict(layout=layout_lib.of(16, devices_per_host=2), seed=0)
  ds = pipeline.create_train_dataset(gen_dir, "sudoku_generated", GEN_KWARGS, **args)
  assert ds.options().autotune.enabled is False
  assert ds.options().deterministic is True
  it = ds.as_numpy_iterator()
  for _ in range(3):
    assert next(it)["inputs"].shape == (2, 8, 81)


def test_epochs_visit_every_puzzle_once(gen_dir):
  batches = _train(gen_dir, steps=12)  # 64 examples / 16 per step: 4 steps per epoch
  assert layout_lib.of(16, devices_per_host=2).steps_per_epoch(64) == 4
  orders = []
  for e in range(3):
    index = np.concatenate([_flat(b, "index") for b in batches[4 * e:4 * e + 4]])
    assert sorted(index.tolist()) == list(range(64))
    orders.append(index)
  assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
  assert not np.array_equal(orders[0], np.arange(64))


def test_per_host_splits_disjoint_and_cover(gen_dir):
  builder = datasets.get_builder("sudoku_generated", gen_dir, GEN_KWARGS)
  shards = []
  for host in range(2):
    split = pipeline.tfds.split_for_jax_process("train", process_index=host, process_count=2)
    shards.append(set(pipeline.load_split(builder, split)["index"].tolist()))
  assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(64))
  # One epoch of the two hosts' streams (global batch 16 = 2 hosts x 2 devices x 4).
  seen = []
  for host in range(2):
    batches = _train(gen_dir, steps=4, process_index=host, hosts=2)
    index = np.concatenate([_flat(b, "index") for b in batches])
    assert set(index.tolist()) == shards[host] and index.size == 32
    seen.append(index)
  assert sorted(np.concatenate(seen).tolist()) == list(range(64))


def test_determinism_and_seeds(gen_dir):
  a = _train(gen_dir, steps=3, seed=5)
  b = _train(gen_dir, steps=3, seed=5)
  c = _train(gen_dir, steps=3, seed=6)
  for x, y in zip(a, b):
    for name in x:
      assert np.array_equal(x[name], y[name])
  assert not np.array_equal(a[0]["inputs"], c[0]["inputs"])
  assert not np.array_equal(a[0]["index"], c[0]["index"])


def test_start_step_resumes_exactly(gen_dir):
  full = _train(gen_dir, steps=11, seed=2)
  for k in (1, 4, 6):  # mid-epoch and on an epoch boundary (4 steps per epoch)
    resumed = _train(gen_dir, steps=11 - k, seed=2, start_step=k)
    for x, y in zip(full[k:], resumed):
      for name in x:
        assert np.array_equal(x[name], y[name]), (k, name)
  # Far ahead: skipping is arithmetic (no replay), and the batch is still a valid one.
  far = _train(gen_dir, steps=1, seed=2, start_step=10**9)[0]
  assert sudoku.is_valid_pair(sudoku.tokens_to_grid(_flat(far, "inputs")),
                              sudoku.tokens_to_grid(_flat(far, "labels"))).all()


# ----------------------------------------------------------------------------------------------
# Eval stream.


def _eval(gen_dir: str, host: int, **kw) -> evaluation.EvalIterator:
  args = dict(layout=layout_lib.of(8, devices_per_host=2, hosts=2, process_index=host))
  args.update(kw)
  return evaluation.create_eval_iterator(gen_dir, "sudoku_generated", GEN_KWARGS, **args)


def test_eval_padding_and_host_agreement(gen_dir):
  # 20 test examples, 2 hosts x 2 devices x 2 per device: 10 per host -> 3 batches of 4 each.
  iters = [_eval(gen_dir, h) for h in range(2)]
  assert [it.num_batches for it in iters] == [3, 3]
  assert layout_lib.of(8, devices_per_host=2, hosts=2).eval_batches(20) == 3
  builder = datasets.get_builder("sudoku_generated", gen_dir, GEN_KWARGS)
  test = pipeline.load_split(builder, "test")
  real = []
  for it in iters:
    batches = list(it)
    assert len(batches) == it.num_batches == 3
    assert batches[0]["mask"].shape == (2, 2) and batches[0]["mask"].dtype == bool
    mask = np.concatenate([_flat(b, "mask") for b in batches])
    index = np.concatenate([_flat(b, "index") for b in batches])
    inputs = np.concatenate([_flat(b, "inputs") for b in batches])
    labels = np.concatenate([_flat(b, "labels") for b in batches])
    assert mask.sum() == it.num_local_examples == 10
    assert np.all(index[~mask] == -1) and np.all(inputs[~mask] == 0)
    assert np.all(labels[~mask] == -100)
    assert list(index[mask]) == sorted(index[mask])  # split order, no augmentation
    assert np.array_equal(inputs[mask], test["inputs"][index[mask]])
    real.append(index[mask])
    again = [b["index"].tolist() for b in it]  # re-iterable: a second pass is the same
    assert again == [b["index"].tolist() for b in batches]
  assert sorted(np.concatenate(real).tolist()) == list(range(20))


def test_eval_subset(gen_dir):
  iters = [_eval(gen_dir, h, subset_size=7, subset_seed=1) for h in range(2)]
  assert [it.num_batches for it in iters] == [1, 1]  # ceil(7 / 2) = 4 rows per host, batch 4
  index = [np.concatenate([_flat(b, "index")[_flat(b, "mask")] for b in it]) for it in iters]
  chosen = evaluation.eval_subset_indices(20, 7, 1)
  assert sorted(np.concatenate(index).tolist()) == chosen.tolist()
  assert not set(index[0].tolist()) & set(index[1].tolist())
  again = _eval(gen_dir, 0, subset_size=7, subset_seed=1)
  assert [b["index"].tolist() for b in again] == [b["index"].tolist() for b in iters[0]]
  other = evaluation.eval_subset_indices(20, 7, 2)
  assert not np.array_equal(chosen, other)
  assert iters[0].num_examples == 7


def test_data_source(gen_dir, tmp_path):
  config = {"name": "sudoku_generated", "data_dir": str(tmp_path), "builder_config": "",
            "builder_kwargs": GEN_KWARGS, "prepare_if_missing": True, "manual_dir": ""}
  source = data_source.DataSource.from_config(config, seed=0)
  assert source.num_examples("train") == 64 and source.num_examples("test") == 20
  meta = source.metadata()
  assert meta["splits"] == {"train": 64, "test": 20} and meta["vocab_size"] == 11
  mine = next(source.train_iterator(layout=layout_lib.of(16, devices_per_host=2), start_step=3))
  ref = _train(gen_dir, steps=4)[3]  # same config prepared elsewhere: the same stream
  for name in ref:
    assert np.array_equal(mine[name], ref[name])
  layout = layout_lib.of(8, devices_per_host=2)
  full = source.eval_batches("test", layout=layout, subset_size=0)
  assert full.num_examples == 20 and full is source.eval_batches("test", layout=layout,
                                                                 subset_size=None)
  with pytest.raises(ValueError, match="unknown builder kwargs"):
    data_source.DataSource.from_config(dict(config, builder_kwargs={"subsample_size": 3}), seed=0)
