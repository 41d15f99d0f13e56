"""experiments.trm.arc_eval: votes pooled over augmentations, pass@k on synthetic predictions with
known answers (ties broken by q_halt, tasks with several test inputs), merge over fake hosts equal to
one process, padding ignored, submission.json validated; perfect predictions on the real ARC-AGI-1
test split score 1."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from experiments.common import layout
from experiments.common import workdir
from experiments.trm import arc_eval
from experiments.trm import evaluators
from input_pipeline import sources
from input_pipeline.puzzles import arc
from input_pipeline.puzzles import arc_dataset

RNG = np.random.default_rng(0)
VARIANT = arc_dataset.Variant("toy", ("toy_train", "toy_test"), "toy_test")


def _grid(shape):
  return RNG.integers(0, 10, shape).astype(np.uint8)


def _task(task_id, num_test):
  pairs = [arc.Pair(_grid((3, 4)), _grid((4, 3))) for _ in range(2)]
  return arc.Task(task_id, pairs, [arc.Pair(_grid((2, 5)), _grid((3, 3))) for _ in range(num_test)])


@pytest.fixture(scope="module")
def toy():
  """A train-set task and test tasks A (1 test input), B (2) and C (1), 5 augmentations each."""
  tasks = [("toy_train", _task("T", 1)), ("toy_test", _task("A", 1)), ("toy_test", _task("B", 2)),
           ("toy_test", _task("C", 1))]
  meta = arc_dataset.build_metadata(tasks, VARIANT, num_aug=5, seed=0)
  test = list(arc_dataset.iter_examples([t for _, t in tasks], meta, "test"))
  assert len(test) == 4 * 6 and meta.num_puzzle_identifiers == 1 + 4 * 6
  return dict(tasks=dict((t.task_id, t) for _, t in tasks), meta=meta, test=test)


def _wrong(i):
  return np.full((2, 2), i % 10, np.uint8)


def _predict(toy, plan, q=None):
  """Predicted tokens per test example: plan[(task, test index)] lists, per augmentation in order,
  the original-frame grid voted for (None = the solution); each is drawn in the example's frame."""
  meta, preds, qs = toy["meta"], [], []
  seen = {}
  for e in toy["test"]:
    pid, t = int(e["puzzle_identifiers"]), int(e["test_index"])
    task_id = meta.task_of(pid)
    i = seen.setdefault((task_id, t), 0)
    seen[(task_id, t)] += 1
    grid = plan[(task_id, t)][i]
    grid = toy["tasks"][task_id].test[t].output if grid is None else grid
    tokens = arc.encode_grid(meta.augmentation(pid).apply(grid))
    tokens[tokens == 0] = RNG.integers(0, 2, (tokens == 0).sum())   # pad/EOS noise outside
    preds.append(tokens)
    qs.append(0.0 if q is None else q[(task_id, t)][i])
  arrays = {k: np.array([e[k] for e in toy["test"]]) for k in ("puzzle_identifiers", "test_index")}
  return np.stack(preds), np.array(qs), arrays["puzzle_identifiers"], arrays["test_index"]


W1, W2, W3 = _wrong(1), _wrong(2), _wrong(3)
# A/0: right x3 -> rank 1.  B/0: W1 x3, right x2 -> rank 2.  B/1: W1 x2, W2 x2, right x1, W3 -> rank 3.
# C/0: right x3 and W1 x3 tie on votes; q_halt decides.
PLAN = {("A", 0): [None, None, None, W1, W1, W2], ("B", 0): [W1, W1, W1, None, None, W2],
        ("B", 1): [W1, W1, W2, W2, None, W3], ("C", 0): [None, None, None, W1, W1, W1]}
Q_C_WRONG_FIRST = {k: [0.0] * 6 for k in PLAN}
Q_C_WRONG_FIRST[("C", 0)] = [-1.0, -2.0, 0.5, 1.0, 1.0, 1.0]
Q_C_RIGHT_FIRST = dict(Q_C_WRONG_FIRST)
Q_C_RIGHT_FIRST[("C", 0)] = [3.0, 3.0, 3.0, 1.0, 1.0, 1.0]


def test_pass_at_k_with_known_answers_and_q_halt_ties(toy):
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN, Q_C_WRONG_FIRST)
  votes = arc_eval.collect(meta, preds, q, ids, test_index)
  assert votes["num_examples"] == 24
  assert votes["votes"]["B"]["0"][arc_eval.grid_key(W1)][0] == 3
  metrics = arc_eval.score(meta, votes)
  # Tasks: A = 1 at k >= 1; B = (rank 2, rank 3) -> 0 / 0.5 / 1 at k = 1 / 2 / 5; C = rank 2.
  assert metrics["pass@1"] == pytest.approx(1 / 3)
  assert metrics["pass@2"] == pytest.approx((1 + 0.5 + 1) / 3)
  for k in (5, 10, 100, 1000):
    assert metrics[f"pass@{k}"] == 1.0
  assert (metrics["num_tasks"], metrics["num_test_inputs"], metrics["num_test_inputs_voted"],
          metrics["num_votes"]) == (3, 4, 4, 24)
  ranked = arc_eval.rank(votes["votes"]["C"]["0"])
  assert [r[1] for r in ranked] == [3, 3]
  assert ranked[0][0] == arc_eval.grid_key(W1) and ranked[0][2] == pytest.approx(1 / (1 + np.e ** -1))

  preds, q, ids, test_index = _predict(toy, PLAN, Q_C_RIGHT_FIRST)
  metrics = arc_eval.score(meta, arc_eval.collect(meta, preds, q, ids, test_index))
  assert metrics["pass@1"] == pytest.approx(2 / 3)
  assert arc_eval.score(meta, arc_eval.collect(meta, preds, q, ids, test_index), pass_ks=(1,),
                        tasks=["C"]) == {"pass@1": 1.0, "num_tasks": 1, "num_test_inputs": 1,
                                         "num_test_inputs_voted": 1, "num_votes": 24}


def test_full_ties_are_broken_by_grid_key():
  candidates = {"1x1:5": [2, 2 ** 52], "1x1:3": [2, 2 ** 52], "1x1:4": [3, 0]}
  assert [r[0] for r in arc_eval.rank(candidates)] == ["1x1:4", "1x1:3", "1x1:5"]


def test_merge_over_two_hosts_equals_one_process(toy):
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN, Q_C_WRONG_FIRST)
  single = arc_eval.collect(meta, preds, q, ids, test_index)
  host = RNG.integers(0, 2, len(ids)).astype(bool)
  parts = []
  for h in (host, ~host):
    # Each host pads its batch like the eval iterator (puzzle id 0, mask False) and collects
    # in two batches.
    p, qq, i, t = preds[h], q[h], ids[h], test_index[h]
    p = np.concatenate([p, np.zeros((3, 900), p.dtype)])
    qq, i, t = (np.concatenate([x, np.zeros(3, x.dtype)]) for x in (qq, i, t))
    mask = np.arange(len(i)) < h.sum()
    cut = len(i) // 2
    batches = [arc_eval.collect(meta, p[s], qq[s], i[s], t[s], mask[s])
               for s in (slice(0, cut), slice(cut, None))]
    parts.append(json.loads(json.dumps(arc_eval.merge(batches))))   # through JSON, as files
  assert arc_eval.merge(parts) == arc_eval.merge([single]) == single
  assert arc_eval.merge(parts[::-1]) == single
  assert arc_eval.finalize(meta, parts) == arc_eval.finalize(meta, [single])


def test_the_scorer_merges_the_votes_of_its_layouts_hosts(toy, tmp_path):
  """ArcPassAtK exchanges votes between the hosts of the layout it is given (here 2 hosts played by
  one process: host 1 writes its votes, host 0 merges them with its own)."""
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN, Q_C_WRONG_FIRST)
  cut = len(ids) // 3
  half = lambda s: arc_eval.collect(meta, preds[s], q[s], ids[s], test_index[s])  # noqa: E731
  host = lambda i: evaluators.ArcPassAtK(  # noqa: E731
      meta, layout.of(8, devices_per_host=4, hosts=2, process_index=i))
  two = str(tmp_path / "two")
  assert host(1).finalize([half(slice(cut, None))], step=3, workdir=two, final=False) == {}
  got = host(0).finalize([half(slice(0, cut))], step=3, workdir=two, final=False)
  one = evaluators.ArcPassAtK(meta, layout.of(4, devices_per_host=4))
  want = one.finalize([half(slice(None))], step=3, workdir=str(tmp_path / "one"), final=False)
  assert got == want and got["num_votes"] == len(ids)
  assert sorted(p.name for p in (tmp_path / "two" / "arc_eval" / "step_3").iterdir()) == [
      "submission.json", "votes_0.json", "votes_1.json"]


def test_padding_rows_are_ignored(toy):
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN)
  single = arc_eval.collect(meta, preds, q, ids, test_index)
  mask = np.ones(len(ids), bool)
  mask[:5] = False
  assert arc_eval.collect(meta, preds, q, ids, test_index, mask)["num_examples"] == len(ids) - 5
  batched = arc_eval.collect(meta, preds.reshape(4, 6, 900), q.reshape(4, 6), ids.reshape(4, 6),
                             test_index.reshape(4, 6))          # [D, b, ...] leading dims
  assert batched == single


def test_submission_format(toy, tmp_path):
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN, Q_C_WRONG_FIRST)
  metrics, sub = arc_eval.finalize(meta, [arc_eval.collect(meta, preds, q, ids, test_index)])
  arc_eval.validate_submission(sub, meta)
  assert list(sub) == ["A", "B", "C"] and [len(v) for v in sub.values()] == [1, 2, 1]
  right = lambda task_id, t: toy["tasks"][task_id].test[t].output.tolist()
  assert sub["A"][0] == {"attempt_1": right("A", 0), "attempt_2": W1.tolist()}
  assert sub["B"][0] == {"attempt_1": W1.tolist(), "attempt_2": right("B", 0)}
  assert sub["C"][0]["attempt_1"] == W1.tolist()
  path = str(tmp_path / "submission.json")
  arc_eval.write_json(path, sub)
  back = workdir.read_json(path)
  arc_eval.validate_submission(back, meta)
  assert back == sub and all(isinstance(c, int) for e in back["B"] for g in e.values()
                             for row in g for c in row)


def test_garbage_predictions_and_missing_inputs_still_give_a_valid_submission(toy):
  meta = toy["meta"]
  ids = np.array([e["puzzle_identifiers"] for e in toy["test"]])
  test_index = np.array([e["test_index"] for e in toy["test"]])
  garbage = RNG.integers(0, 12, (len(ids), 900))
  garbage[::2, 0] = 1                                        # empty crops (0x0) for half
  keep = np.array([meta.task_of(int(p)) != "B" for p in ids])  # task B gets no predictions
  votes = arc_eval.collect(meta, garbage[keep], RNG.normal(size=keep.sum()), ids[keep],
                           test_index[keep])
  assert any(k.startswith("0x0:") for c in votes["votes"]["A"].values() for k in c)
  metrics, sub = arc_eval.finalize(meta, [votes])
  arc_eval.validate_submission(sub, meta)
  assert metrics["pass@1000"] == 0.0 and metrics["num_test_inputs_voted"] == 2
  assert sub["B"] == [{"attempt_1": [[0]], "attempt_2": [[0]]}] * 2
  assert arc_eval.score(meta, votes, tasks=arc_eval.voted_tasks(votes))["num_tasks"] == 2


def test_collect_names_bad_inputs(toy):
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN)
  train_pid = int(meta.puzzle_offsets[0])                     # task T is in the train set only
  with pytest.raises(ValueError, match=f"puzzle id {train_pid} of task T .*not of the test set"):
    arc_eval.collect(meta, preds[:1], q[:1], [train_pid], [0])
  with pytest.raises(ValueError, match="puzzle id 99 outside 0..24"):
    arc_eval.collect(meta, preds[:1], q[:1], [99], [0])
  with pytest.raises(ValueError, match="has test_index 4 but the task has 1 test inputs"):
    arc_eval.collect(meta, preds[:1], q[:1], ids[:1], [4])
  with pytest.raises(ValueError, match="q_halt_logits has 2 rows but predictions have 1"):
    arc_eval.collect(meta, preds[:1], q[:2], ids[:1], test_index[:1])
  with pytest.raises(ValueError, match="predictions must be \\[..., 900\\]"):
    arc_eval.collect(meta, preds[:, :81], q, ids, test_index)
  with pytest.raises(ValueError, match="not ARC votes"):
    arc_eval.merge([{"votes": {}}])


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["A"][0].pop("attempt_2"), "task A test input 0: expected keys"),
    (lambda s: s["A"][0].update(attempt_1=[[1, True]]), "True is not a colour int"),
    (lambda s: s["A"][0].update(attempt_1=[[10]]), "10 is not a colour int"),
    (lambda s: s["A"][0].update(attempt_2=[]), "attempt_2: a grid must be a non-empty list"),
    (lambda s: s["A"][0].update(attempt_1=[[1, 2], [3]]), "rows must have one length"),
    (lambda s: s["B"].pop(), "task B: 1 entries for 2 test inputs"),
    (lambda s: s.pop("C"), "missing \\['C'\\]"),
])
def test_validate_submission_names_the_problem(toy, mutate, message):
  meta = toy["meta"]
  preds, q, ids, test_index = _predict(toy, PLAN)
  _, sub = arc_eval.finalize(meta, [arc_eval.collect(meta, preds, q, ids, test_index)])
  sub = json.loads(json.dumps(sub))
  mutate(sub)
  with pytest.raises(ValueError, match=message):
    arc_eval.validate_submission(sub, meta)


def test_perfect_predictions_on_the_arc1_test_split_score_one(arc_manual_dir):
  tasks = arc_dataset.load_variant(str(arc_manual_dir), "arc1")
  meta = arc_dataset.build_metadata(tasks, "arc1", num_aug=1, seed=0)
  test = list(arc_dataset.iter_examples([t for _, t in tasks], meta, "test"))
  assert len(test) == meta.num_test_examples and 419 < len(test) <= 2 * 419
  labels = np.stack([e["labels"] for e in test])
  preds = np.where(labels < 0, 0, labels)
  ids = np.array([e["puzzle_identifiers"] for e in test])
  test_index = np.array([e["test_index"] for e in test])
  metrics, sub = arc_eval.finalize(meta, [arc_eval.collect(meta, preds, np.zeros(len(ids)), ids,
                                                           test_index)])
  assert metrics["pass@1"] == 1.0 and metrics["num_tasks"] == 400
  assert metrics["num_test_inputs"] == metrics["num_test_inputs_voted"] == 419
  arc_eval.validate_submission(sub, meta)
  evaluation, _ = sources.arc_package_set("evaluation")
  solutions = {k: [p["output"] for p in t["test"]] for k, t in evaluation.items()}
  assert {k: [e["attempt_1"] for e in v] for k, v in sub.items()} == solutions


def test_synopsis_runs():
  body = arc_eval.__doc__.split("Synopsis:")[1]
  exec(compile(textwrap.dedent(body), "<arc_eval synopsis>", "exec"), {})
