"""Tests of the Maze input pipeline: encoding, BFS, validation, CSV reader, dihedral maps, builders.

A tiny `maze_generated` dataset (24 train / 8 test mazes, path > 110 moves) and a tiny `maze_hard`
manual dir are prepared in tmp dirs once per session. Shortest paths are checked against an
independent numpy BFS (distance relaxation over the whole grid), the dihedral transforms against
numpy's rot90/flip definitions and explicit index formulas.
"""

from __future__ import annotations

import importlib
import math
import pathlib
import textwrap

import numpy as np
import pytest

from experiments.common import layout as layout_lib
from input_pipeline import datasets
from input_pipeline.puzzles import augment
from input_pipeline.puzzles import maze
from input_pipeline.puzzles import maze_csv
from input_pipeline.puzzles import maze_generator
from input_pipeline import data_source
from input_pipeline import pipeline
from input_pipeline import prepare
from input_pipeline.builders import maze_generated
from input_pipeline.builders import maze_hard

GEN_KWARGS = {"train_size": 24, "test_size": 8, "seed": 0}
D8_KWARGS = dict(GEN_KWARGS, dihedral=True)
N = maze.SIDE


@pytest.fixture(scope="session")
def mazes() -> tuple[np.ndarray, np.ndarray]:
  return maze_generator.generate_mazes(12, seed=3)


@pytest.fixture(scope="session")
def gen_dir(tmp_path_factory) -> str:
  data_dir = str(tmp_path_factory.mktemp("tfds_maze_gen"))
  prepare.prepare("maze_generated", data_dir, GEN_KWARGS)
  prepare.prepare("maze_generated", data_dir, D8_KWARGS)
  return data_dir


def _flat(batch: dict[str, np.ndarray], name: str) -> np.ndarray:
  value = batch[name]
  return value.reshape((-1,) + value.shape[2:])


def _relaxation_distances(open_mask: np.ndarray, start: tuple[int, int]) -> np.ndarray:
  """Independent BFS: relax dist = min(dist, neighbour + 1) over the whole grid to a fixpoint."""
  big = 10**6
  dist = np.full(open_mask.shape, big, np.int64)
  dist[start] = 0
  while True:
    padded = np.pad(dist, 1, constant_values=big)
    best = np.minimum.reduce([padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2],
                              padded[1:-1, 2:]]) + 1
    new = np.where(open_mask, np.minimum(dist, best), big)
    new[start] = 0
    if np.array_equal(new, dist):
      return np.where(dist >= big, -1, dist)
    dist = new


def _cell(tokens: np.ndarray, token: int) -> tuple[int, int]:
  (cell,) = np.flatnonzero(np.asarray(tokens).reshape(-1) == token)
  return divmod(int(cell), N)


def _room(start=(0, 0), goal=(0, 4), walls=()) -> np.ndarray:
  """An open 30x30 room with S, G and some walls: question tokens [900]."""
  grid = np.full((N, N), maze.OPEN_ID, np.uint8)
  for w in walls:
    grid[w] = maze.WALL_ID
  grid[start] = maze.START_ID
  grid[goal] = maze.GOAL_ID
  return grid.reshape(-1)


def _mark(question: np.ndarray, cells) -> np.ndarray:
  answer = question.reshape(N, N).copy()
  for c in cells:
    answer[c] = maze.PATH_ID
  return answer.reshape(-1)


# ----------------------------------------------------------------------------------------------
# Encoding and BFS.


def test_encoding_round_trip(mazes):
  questions, answers = mazes
  assert maze.CHARSET == "# SGo" and maze.VOCAB_SIZE == 6
  text = "#" + " " + "S" + "G" + " " * (maze.NUM_CELLS - 4)
  tokens = maze.string_to_tokens(text)
  assert tokens.shape == (900,) and list(tokens[:5]) == [1, 2, 3, 4, 2]
  assert maze.tokens_to_string(tokens) == text
  for q, a in zip(questions, answers):
    assert np.array_equal(maze.string_to_tokens(maze.tokens_to_string(q)), q)
    assert np.array_equal(maze.string_to_tokens(maze.tokens_to_string(a), answer=True), a)
    assert set(maze.tokens_to_string(a)) <= set("# SGo")
  rendered = maze.render(answers[0]).splitlines()
  assert len(rendered) == 30 and all(len(line) == 30 for line in rendered)
  with pytest.raises(maze.MazeDataError, match=r"characters \['o'\] outside '# SG'"):
    maze.string_to_tokens(text[:-1] + "o")
  with pytest.raises(maze.MazeDataError, match="899 characters, expected 900"):
    maze.string_to_tokens(text[:-1])
  with pytest.raises(ValueError, match="0 is pad"):
    maze.tokens_to_string(np.zeros(900, np.int32))


def test_bfs_matches_relaxation(mazes):
  questions, _ = mazes
  rng = np.random.default_rng(0)
  for q in questions[:4]:
    open_mask = q.reshape(N, N) != maze.WALL_ID
    cells = np.argwhere(open_mask)
    for r, c in cells[rng.choice(len(cells), 3, replace=False)]:
      assert np.array_equal(maze.bfs_distances(open_mask, (r, c)),
                            _relaxation_distances(open_mask, (r, c)))
  # A wall between S and G: unreachable.
  blocked = _room(walls=[(r, 2) for r in range(N)])
  assert maze.shortest_path_length(blocked) == -1
  assert maze.count_shortest_paths(blocked) == 0
  room = _room(goal=(2, 2))
  assert maze.shortest_path_length(room) == 4
  assert maze.count_shortest_paths(room, limit=10) == 6  # C(4, 2) monotone lattice paths
  with pytest.raises(ValueError, match="not an open cell"):
    maze.bfs_distances(np.zeros((N, N), bool), (0, 0))


# ----------------------------------------------------------------------------------------------
# Generator.


def test_generator_paths_are_unique_shortest_paths(mazes):
  questions, answers = mazes
  assert questions.shape == answers.shape == (12, 900) and questions.dtype == np.uint8
  for q, a in zip(questions, answers):
    assert (q == maze.START_ID).sum() == 1 and (q == maze.GOAL_ID).sum() == 1
    assert (a == maze.START_ID).sum() == 1 and (a == maze.GOAL_ID).sum() == 1
    assert set(np.unique(q)) <= {1, 2, 3, 4} and maze.PATH_ID in a
    keep = a != maze.PATH_ID
    assert np.array_equal(q[keep], a[keep]) and np.all(q[~keep] == maze.OPEN_ID)
    open_mask = q.reshape(N, N) != maze.WALL_ID
    s, g = _cell(q, maze.START_ID), _cell(q, maze.GOAL_ID)
    dist_s = _relaxation_distances(open_mask, s)
    dist_g = _relaxation_distances(open_mask, g)
    length = dist_s[g]
    assert length > 110 and maze.path_lengths(a) == length
    # Every 'o' cell lies on a shortest path, one per distance 1..length-1: one shortest path.
    path = a.reshape(N, N) == maze.PATH_ID
    assert np.all(dist_s[path] + dist_g[path] == length)
    assert sorted(dist_s[path].tolist()) == list(range(1, length))
    assert maze.count_shortest_paths(q, limit=2) == 1
    assert np.array_equal(maze.solve(q), a)
    assert maze.pair_error(q, a) is None and maze.check_pair(q, a) == length
  assert maze.is_valid_pair(questions, answers).all()
  assert len({q.tobytes() for q in questions}) == 12


def test_generator_determinism_and_knobs(mazes):
  questions, answers = mazes
  again = maze_generator.generate_mazes(12, seed=3)
  assert np.array_equal(again[0], questions) and np.array_equal(again[1], answers)
  assert not np.array_equal(maze_generator.generate_mazes(2, seed=4)[0], questions[:2])
  assert not np.array_equal(maze_generator.generate_mazes(2, seed=3, stream="x")[0], questions[:2])
  tail = maze_generator.generate_mazes(3, seed=3, start_index=9)
  assert np.array_equal(tail[0], questions[9:])
  short, short_answers = maze_generator.generate_mazes(6, seed=0, path_threshold=30, loop_prob=0.0)
  assert (maze.path_lengths(short_answers) > 30).all()
  assert maze.is_valid_pair(short, short_answers).all()
  loose_q, loose_a = maze_generator.generate_mazes(6, seed=0, unique_path=False, loop_prob=0.2,
                                         path_threshold=60)
  assert maze.is_valid_pair(loose_q, loose_a).all()  # shortest, not necessarily unique
  with pytest.raises(ValueError, match="path_threshold=900"):
    maze_generator.generate_mazes(1, seed=0, path_threshold=900)
  with pytest.raises(RuntimeError, match="lower path_threshold"):
    maze_generator.generate_mazes(1, seed=0, path_threshold=800, max_attempts=2)


# ----------------------------------------------------------------------------------------------
# Validation of pairs.


def test_pair_error_cases():
  q = _room()
  straight = _mark(q, [(0, 1), (0, 2), (0, 3)])
  assert maze.pair_error(q, straight) is None
  detour = _mark(q, [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)])
  assert "not a shortest path: it takes 6 moves" in maze.pair_error(q, detour)
  extra = _mark(q, [(0, 1), (0, 2), (0, 3), (9, 9)])
  assert "1 'o' cells off the path" in maze.pair_error(q, extra)
  gap = _mark(q, [(0, 1), (0, 3)])
  assert "do not connect S" in maze.pair_error(q, gap)
  walled = _room(walls=[(5, 5)])
  broken = _mark(walled, [(0, 1), (0, 2), (0, 3)])
  broken[5 * N + 5] = maze.OPEN_ID
  assert "disagrees with the question at row 6, column 6" in maze.pair_error(walled, broken)
  two_s = q.copy()
  two_s[N * N - 1] = maze.START_ID
  assert "question has 2 'S' cells" in maze.pair_error(two_s, _mark(two_s, [(0, 1), (0, 2),
                                                                             (0, 3)]))
  assert "question has 'o'" in maze.pair_error(straight, straight)
  assert "900" in maze.pair_error(q[:899], straight)


# ----------------------------------------------------------------------------------------------
# Dihedral transforms.


def _anti_transpose(x: np.ndarray) -> np.ndarray:
  n = x.shape[0]
  return np.array([[x[n - 1 - j, n - 1 - i] for j in range(n)] for i in range(n)])


def test_dihedral_definitions_and_inverses():
  grid = np.arange(900).reshape(30, 30)
  expect = [grid, np.rot90(grid, 1), np.rot90(grid, 2), np.rot90(grid, 3), np.fliplr(grid),
            np.flipud(grid), grid.T, _anti_transpose(grid)]
  assert np.array_equal(np.rot90(grid, 1)[0], grid[:, -1])  # counter-clockwise
  for tid, want in enumerate(expect):
    got = maze.dihedral_transform(grid, tid)
    assert np.array_equal(got, want), maze.DIHEDRAL_NAMES[tid]
    assert np.array_equal(maze.apply_dihedral(grid.reshape(-1), tid), want.reshape(-1))
    inv = maze.DIHEDRAL_INVERSE[tid]
    assert np.array_equal(maze.dihedral_transform(got, inv), grid)
    assert np.array_equal(maze.inverse_dihedral_transform(got, tid), grid)
    assert maze.DIHEDRAL_COMPOSE[inv, tid] == 0 and maze.DIHEDRAL_COMPOSE[tid, inv] == 0
  assert list(maze.DIHEDRAL_INVERSE) == [0, 3, 2, 1, 4, 5, 6, 7]
  assert len({maze.dihedral_transform(grid, t).tobytes() for t in range(8)}) == 8
  for a in range(8):  # the compose table is the group law
    for b in range(8):
      twice = maze.dihedral_transform(maze.dihedral_transform(grid, b), a)
      assert np.array_equal(twice, maze.dihedral_transform(grid, maze.DIHEDRAL_COMPOSE[a, b]))
  batch = np.stack([grid, grid + 1])  # [..., H, W] batches
  assert np.array_equal(maze.dihedral_transform(batch, 1)[1], np.rot90(grid + 1))
  with pytest.raises(ValueError, match="dihedral id 8"):
    maze.dihedral_transform(grid, 8)


def test_dihedral_keeps_valid_pairs(mazes):
  questions, answers = mazes
  for tid in range(8):
    q, a = maze.apply_dihedral(questions[:3], tid), maze.apply_dihedral(answers[:3], tid)
    assert maze.is_valid_pair(q, a).all()
    assert np.array_equal(maze.path_lengths(a), maze.path_lengths(answers[:3]))


def test_tf_dihedral_matches_numpy(mazes):
  import tensorflow as tf
  questions, answers = mazes
  ids = np.arange(12) % 8
  out = augment.apply_dihedral_tf(tf.constant(questions.astype(np.int32)), tf.constant(ids, tf.int32))
  for i, tid in enumerate(ids):
    assert np.array_equal(out.numpy()[i], maze.apply_dihedral(questions[i], tid))
  n = 8000
  key = tf.constant([0, 7], tf.int64)
  drawn = augment.sample_dihedral_ids(key, n).numpy()
  counts = np.bincount(drawn, minlength=8)
  chi2 = float(((counts - n / 8) ** 2 / (n / 8)).sum())
  assert counts.size == 8 and chi2 < 7 + 5 * math.sqrt(14)
  allowed = np.arange(n) % 2 == 0
  masked = augment.sample_dihedral_ids(key, n, tf.constant(allowed)).numpy()
  assert np.all(masked[~allowed] == 0) and np.array_equal(masked[allowed], drawn[allowed])
  # The batch hook: same transform on inputs and labels, flags respected, ids composed.
  batch = {"inputs": tf.constant(np.repeat(questions[:1], 64, 0).astype(np.int32)),
           "labels": tf.constant(np.repeat(answers[:1], 64, 0).astype(np.int32)),
           "dihedral_augment": tf.constant(np.arange(64) < 48),
           "dihedral_id": tf.constant(np.where(np.arange(64) < 48, 0, 5).astype(np.int32))}
  aug = {k: v.numpy() for k, v in augment.augment_dihedral_batch(batch, key).items()}
  assert maze.is_valid_pair(aug["inputs"], aug["labels"]).all()
  assert np.all(aug["dihedral_id"][48:] == 5) and np.all(aug["inputs"][48:] == questions[0])
  assert len(set(aug["dihedral_id"][:48].tolist())) > 4
  for i in range(48):
    assert np.array_equal(aug["labels"][i], maze.apply_dihedral(answers[0], aug["dihedral_id"][i]))


# ----------------------------------------------------------------------------------------------
# CSV reader.


def _rows(questions: np.ndarray, answers: np.ndarray) -> list[list[str]]:
  return [["gen", maze.tokens_to_string(q), maze.tokens_to_string(a), str(int(r))]
          for q, a, r in zip(questions, answers, maze.path_lengths(answers))]


def _write_csv(path: pathlib.Path, rows: list[list[str]],
               header: str = "source,question,answer,rating") -> pathlib.Path:
  path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows))
  return path


def test_csv_reader_valid(tmp_path, mazes):
  questions, answers = mazes
  path = tmp_path / "train.csv"
  maze_csv.write_maze_csv(path, questions[:5], answers[:5])
  data = maze_csv.read_maze_csv(path)
  assert len(data) == 5 and data.questions.shape == data.answers.shape == (5, 900)
  assert np.array_equal(data.questions, questions[:5]) and np.array_equal(data.answers, answers[:5])
  assert list(data.line_numbers) == [2, 3, 4, 5, 6]
  assert np.array_equal(data.ratings, maze.path_lengths(answers[:5]))
  assert np.array_equal(data.path_lengths, data.ratings) and (data.path_lengths > 110).all()
  # The public file's quoting (fields with spaces and '#') round-trips through csv.
  assert path.read_text().splitlines()[1].startswith("podlab,")


ROOM_Q = _room()
ROOM_A = _mark(ROOM_Q, [(0, 1), (0, 2), (0, 3)])


def _text(tokens: np.ndarray) -> str:
  return maze.tokens_to_string(tokens)


@pytest.mark.parametrize("case", [
    "short_question", "question_alphabet", "path_in_question", "answer_length", "answer_alphabet",
    "two_starts", "no_goal", "not_shortest", "off_path", "contradiction", "wall_marked", "fields",
    "rating"])
def test_csv_reader_rejects_malformed_rows(tmp_path, mazes, case):
  rows = _rows(*(m[:4] for m in mazes))
  bad = 2  # row index 2 -> line 4 (line 1 is the header)
  q, a = rows[bad][1], rows[bad][2]
  blank = q.index(" ")
  wall = q.index("#")
  if case == "short_question":
    rows[bad][1] = q[:899]
    expect = "question has 899 characters, expected 900"
  elif case == "question_alphabet":
    rows[bad][1] = "x" + q[1:]
    expect = "question has characters ['x'] outside '# SG'"
  elif case == "path_in_question":
    rows[bad][1] = a
    expect = "question has characters ['o'] outside '# SG' ('o' marks the path in answers only)"
  elif case == "answer_length":
    rows[bad][2] = a + "#"
    expect = "answer has 901 characters, expected 900"
  elif case == "answer_alphabet":
    rows[bad][2] = a[:7] + "." + a[8:]
    expect = "answer has characters ['.'] outside '# SGo'"
  elif case == "two_starts":
    rows[bad][1] = q[:blank] + "S" + q[blank + 1:]
    rows[bad][2] = a[:blank] + "S" + a[blank + 1:]
    expect = "question has 2 'S' cells"
  elif case == "no_goal":
    g = q.index("G")
    rows[bad][1] = q[:g] + " " + q[g + 1:]
    rows[bad][2] = a[:g] + " " + a[g + 1:]
    expect = "question has 0 'G' cells, expected exactly one"
  elif case == "not_shortest":
    detour = _mark(ROOM_Q, [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)])
    rows[bad][1:3] = [_text(ROOM_Q), _text(detour)]
    expect = ("answer path is not a shortest path: it takes 6 moves from S to G, a shortest path "
              "takes 4")
  elif case == "off_path":
    rows[bad][1:3] = [_text(ROOM_Q), _text(_mark(ROOM_A, [(20, 20), (21, 20)]))]
    expect = "answer marks 5 cells with 'o' but a shortest S->G path has 3 cells"
  elif case == "contradiction":
    rows[bad][2] = a[:wall] + " " + a[wall + 1:]
    r, c = divmod(wall, 30)
    expect = (f"answer disagrees with the question at row {r + 1}, column {c + 1} (question has "
              "'#', answer has ' '")
  elif case == "wall_marked":
    rows[bad][2] = a[:wall] + "o" + a[wall + 1:]
    expect = "answer disagrees with the question"
  elif case == "fields":
    rows[bad] = rows[bad][:3]
    expect = "row has 3 fields, expected 4"
  else:
    rows[bad][3] = "hard"
    expect = "rating 'hard' is not an integer"
  path = _write_csv(tmp_path / "train.csv", rows)
  with pytest.raises(maze.MazeDataError) as err:
    maze_csv.read_maze_csv(path)
  message = str(err.value)
  assert message.startswith(f"{path}:4: "), message
  assert expect in message, message


def test_csv_reader_rejects_bad_header_and_empty(tmp_path, mazes):
  path = _write_csv(tmp_path / "test.csv", _rows(*(m[:1] for m in mazes)),
                    header="question,answer")
  with pytest.raises(maze.MazeDataError, match=r"test\.csv:1: header"):
    maze_csv.read_maze_csv(path)
  empty = tmp_path / "empty.csv"
  empty.write_text("")
  with pytest.raises(maze.MazeDataError, match=r"empty\.csv:1: file is empty"):
    maze_csv.read_maze_csv(empty)


# ----------------------------------------------------------------------------------------------
# Builders, registry and metadata.


def test_metadata_and_configs():
  for name in ("maze_hard", "maze_generated"):
    meta = datasets.get_metadata(name)
    assert meta["vocab_size"] == 6 and meta["seq_len"] == 900
    assert meta["num_puzzle_identifiers"] == 1 and meta["pad_id"] == 0
    assert meta["ignore_label_id"] == -100 and meta["augmentation"] == "maze_dihedral"
  assert maze_hard.METADATA == maze_generated.METADATA == maze.METADATA
  assert {"maze_hard", "maze_generated", "sudoku_extreme", "sudoku_generated"} <= set(
      datasets.names())
  assert datasets.make_config("maze_hard", {}).name == "nall_s0"
  assert datasets.make_config("maze_hard", {"dihedral": True}).name == "nall_s0_d8"
  assert datasets.make_config("maze_hard", {"dihedral": True, "materialise": True}).name == (
      "nall_s0_d8m")
  assert datasets.make_config("maze_hard", {"subsample_size": 500, "seed": 2}).name == "n500_s2"
  assert datasets.make_config("maze_generated", {}).name == "hard"
  assert datasets.make_config("maze_generated", {"dihedral": True}).name == "hard_d8"
  assert datasets.make_config("maze_generated", GEN_KWARGS).name == "p110_l0p05_n24_t8_s0"
  assert datasets.make_config("maze_generated", {"config": "hard_d8"}).dihedral
  with pytest.raises(ValueError, match="unknown builder kwargs"):
    datasets.make_config("maze_generated", {"givens": 30})
  with pytest.raises(ValueError, match="materialise=True needs dihedral=True"):
    datasets.make_config("maze_hard", {"materialise": True})
  with pytest.raises(ValueError, match="loop_prob=2"):
    datasets.make_config("maze_generated", {"loop_prob": 2})
  assert maze_generated.train_rows(1000, True, True) == 8000
  assert maze_generated.train_rows(1000, True, False) == 1000


def test_generated_builder(gen_dir):
  builder = datasets.get_builder("maze_generated", gen_dir, GEN_KWARGS)
  assert builder.is_prepared()
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 24, "test": 8}
  assert builder.info.metadata["dihedral"] == "off"
  assert builder.info.metadata["vocab_size"] == 6
  train = pipeline.load_split(builder, "train")
  test = pipeline.load_split(builder, "test")
  assert train["inputs"].dtype == np.int32 and train["inputs"].shape == (24, 900)
  assert train["labels"].dtype == np.int32 and test["labels"].shape == (8, 900)
  assert list(train["index"]) == list(range(24)) and np.all(train["puzzle_identifiers"] == 0)
  assert not train["dihedral_augment"].any() and np.all(train["dihedral_id"] == 0)
  assert maze.is_valid_pair(train["inputs"], train["labels"]).all()
  assert (maze.path_lengths(test["labels"]) > 110).all()
  # The stored data are exactly the generator's streams; test is disjoint from train.
  expect_q, expect_a = maze_generator.generate_mazes(24, seed=0, stream="train")
  assert np.array_equal(train["inputs"], expect_q) and np.array_equal(train["labels"], expect_a)
  assert not {r.tobytes() for r in test["inputs"]} & {r.tobytes() for r in train["inputs"]}
  # The on-the-fly dihedral config stores the same mazes, flagged for augmentation.
  d8 = datasets.get_builder("maze_generated", gen_dir, D8_KWARGS)
  d8_train = pipeline.load_split(d8, "train")
  assert d8.info.metadata["dihedral"] == "on_the_fly" and d8.info.splits["train"].num_examples == 24
  assert np.array_equal(d8_train["inputs"], train["inputs"]) and d8_train["dihedral_augment"].all()
  assert not pipeline.load_split(d8, "test")["dihedral_augment"].any()


def test_materialised_builder_counts(tmp_path):
  kwargs = {"train_size": 3, "test_size": 2, "seed": 1, "dihedral": True, "materialise": True,
            "path_threshold": 60}
  builder = prepare.prepare("maze_generated", str(tmp_path), kwargs)
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 24, "test": 2}
  assert builder.info.metadata["train_rows_per_maze"] == 8
  train = pipeline.load_split(builder, "train")
  test = pipeline.load_split(builder, "test")
  q, a = maze_generator.generate_mazes(3, seed=1, path_threshold=60, stream="train")
  for row in range(24):
    r, t = divmod(row, 8)
    assert train["dihedral_id"][row] == t and not train["dihedral_augment"][row]
    assert np.array_equal(train["inputs"][row], maze.apply_dihedral(q[r], t))
    assert np.array_equal(train["labels"][row], maze.apply_dihedral(a[r], t))
  assert maze.is_valid_pair(train["inputs"], train["labels"]).all()
  assert np.all(test["dihedral_id"] == 0)
  assert np.array_equal(test["inputs"], maze_generator.generate_mazes(2, seed=1, path_threshold=60,
                                                            stream="test")[0])


@pytest.fixture(scope="session")
def hard_manual_dir(tmp_path_factory) -> pathlib.Path:
  manual = tmp_path_factory.mktemp("maze_hard_manual")
  q, a = maze_generator.generate_mazes(16, seed=5, path_threshold=60)
  maze_csv.write_maze_csv(manual / "train.csv", q[:12], a[:12])
  maze_csv.write_maze_csv(manual / "test.csv", q[12:], a[12:])
  return manual


def test_hard_builder_subsample_and_dihedral(tmp_path, hard_manual_dir):
  def build(name: str, **kw):
    builder = prepare.prepare("maze_hard", str(tmp_path / name), kw, hard_manual_dir)
    return builder, pipeline.load_split(builder, "train"), pipeline.load_split(builder, "test")

  full, full_train, full_test = build("full")
  assert full.builder_config.name == "nall_s0"
  assert {k: v.num_examples for k, v in full.info.splits.items()} == {"train": 12, "test": 4}
  csv = maze_csv.read_maze_csv(hard_manual_dir / "train.csv")
  assert np.array_equal(full_train["inputs"], csv.questions)
  assert not full_train["dihedral_augment"].any()
  test_csv = maze_csv.read_maze_csv(hard_manual_dir / "test.csv")
  assert np.array_equal(full_test["labels"], test_csv.answers)
  _, a_train, _ = build("a", subsample_size=5, seed=3)
  _, b_train, _ = build("b", subsample_size=5, seed=3)
  _, c_train, _ = build("c", subsample_size=5, seed=4)
  assert np.array_equal(a_train["inputs"], b_train["inputs"])
  assert not np.array_equal(a_train["inputs"], c_train["inputs"])
  rows = maze_hard.select_train_rows(12, 5, 3)
  assert np.array_equal(a_train["inputs"], csv.questions[rows])
  d8m, d8m_train, d8m_test = build("d8m", subsample_size=5, seed=3, dihedral=True,
                                   materialise=True)
  assert d8m.builder_config.name == "n5_s3_d8m"
  assert d8m.info.splits["train"].num_examples == 40 and d8m.info.splits["test"].num_examples == 4
  assert np.array_equal(d8m_train["inputs"][8 * 2 + 6], maze.apply_dihedral(csv.questions[rows[2]],
                                                                             6))
  assert not d8m_test["dihedral_augment"].any() and np.all(d8m_test["dihedral_id"] == 0)
  with pytest.raises(ValueError, match="subsample_size=13 but train.csv has only 12 rows"):
    build("too_many", subsample_size=13)


def test_hard_builder_rejects_malformed_csv(tmp_path, mazes):
  manual = tmp_path / "manual"
  manual.mkdir()
  rows = _rows(*(m[:3] for m in mazes))
  rows[1][2] = rows[1][2].replace("o", " ", 1)  # a gap in the path
  _write_csv(manual / "train.csv", rows)
  maze_csv.write_maze_csv(manual / "test.csv", mazes[0][:2], mazes[1][:2])
  with pytest.raises(maze.MazeDataError, match=r"train\.csv:3: answer"):
    prepare.prepare("maze_hard", str(tmp_path / "tfds"), {}, manual)
  (manual / "test.csv").unlink()
  with pytest.raises(FileNotFoundError, match=r"test\.csv: not in .*manual\. Fix: download"):
    prepare.prepare("maze_hard", str(tmp_path / "tfds2"), {}, manual)


# ----------------------------------------------------------------------------------------------
# The tf.data pipeline.


@pytest.fixture()
def maze_hook(monkeypatch):
  """The pipeline's "maze_dihedral" augmentation entry (registered in pipeline._AUGMENTATIONS)."""
  del monkeypatch
  hooks = pipeline._AUGMENTATIONS  # pylint: disable=protected-access
  assert hooks["maze_dihedral"] is augment.augment_dihedral_batch
  return hooks["maze_dihedral"]


def test_data_source_reads_generated_mazes(tmp_path, gen_dir, maze_hook):
  del maze_hook
  config = {"name": "maze_generated", "data_dir": str(tmp_path), "builder_config": "",
            "builder_kwargs": GEN_KWARGS, "prepare_if_missing": True, "manual_dir": ""}
  source = data_source.DataSource.from_config(config, seed=0)
  assert source.num_examples("train") == 24 and source.num_examples("test") == 8
  meta = source.metadata()
  assert meta["splits"] == {"train": 24, "test": 8}
  assert meta["vocab_size"] == 6 and meta["seq_len"] == 900
  raw = pipeline.load_split(datasets.get_builder("maze_generated", gen_dir, GEN_KWARGS), "train")
  for augment in (False, True):  # dihedral off: the hook leaves every example as stored
    it = source.train_iterator(layout=layout_lib.of(8, devices_per_host=2), augment=augment)
    for _ in range(4):
      batch = next(it)
      assert batch["inputs"].shape == (2, 4, 900) and batch["inputs"].dtype == np.int32
      assert batch["labels"].shape == (2, 4, 900) and batch["labels"].dtype == np.int32
      assert batch["puzzle_identifiers"].shape == (2, 4)
      inputs, labels = _flat(batch, "inputs"), _flat(batch, "labels")
      assert inputs.min() >= 1 and inputs.max() <= 4 and labels.min() >= 1 and labels.max() <= 5
      assert np.array_equal(inputs, raw["inputs"][_flat(batch, "index")])
      assert np.array_equal(labels, raw["labels"][_flat(batch, "index")])
  ev = source.eval_batches("test", layout=layout_lib.of(8, devices_per_host=2))
  batches = list(ev)
  assert ev.num_examples == 8 and len(batches) == 1 and batches[0]["mask"].all()


def test_on_the_fly_dihedral_stream(gen_dir, maze_hook):
  del maze_hook
  raw = pipeline.load_split(datasets.get_builder("maze_generated", gen_dir, D8_KWARGS), "train")
  it = pipeline.create_train_iterator(gen_dir, "maze_generated", D8_KWARGS,
                                      layout=layout_lib.of(8, devices_per_host=2), seed=0)
  ids = []
  for _ in range(6):
    batch = next(it)
    inputs, labels = _flat(batch, "inputs"), _flat(batch, "labels")
    index, tid = _flat(batch, "index"), _flat(batch, "dihedral_id")
    assert inputs.shape == (8, 900)
    assert maze.is_valid_pair(inputs, labels).all()
    for i in range(8):
      assert np.array_equal(inputs[i], maze.apply_dihedral(raw["inputs"][index[i]], tid[i]))
      assert np.array_equal(labels[i], maze.apply_dihedral(raw["labels"][index[i]], tid[i]))
      # The inverse transform maps the shown example back to the stored maze.
      back = maze.inverse_dihedral_transform(labels[i].reshape(30, 30), tid[i]).reshape(-1)
      assert np.array_equal(back, raw["labels"][index[i]])
    ids.extend(tid.tolist())
  assert len(set(ids)) >= 6  # 48 draws over 8 transforms


# ----------------------------------------------------------------------------------------------
# Docs.


def test_module_synopsis_runs():
  doc = importlib.import_module("input_pipeline.puzzles.maze").__doc__
  body = doc.partition("Synopsis:")[2]
  lines = []
  for line in body.splitlines()[1:]:
    if line and not line.startswith("  "):
      break
    lines.append(line)
  code = textwrap.dedent("\n".join(lines))
  assert "generate_mazes" in code
  exec(compile(code, "<input_pipeline.puzzles.maze synopsis>", "exec"), {})  # pylint: disable=exec-used
