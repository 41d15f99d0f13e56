"""The one trainer (experiments/common/trainer.py) on the docs' example experiment.

docs/adding-an-experiment.md's code block runs here as written: it trains, and the trainer's
contracts hold for it: final table and JSON files, resume, `init_from` a podlab workdir (weights
only, step 0), `--mode=eval`, the non-finite guard (stop and skip), no empty workdir after bad input.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.common import checkpointing
from experiments.common import errors
from experiments.common import layout
from experiments.common import trainer
from experiments.common import workdir_lock

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs/adding-an-experiment.md"


def _doc_code() -> str:
  return re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
  """The doc's block run once: its namespace (the MLP class, results) and workdir."""
  workdir = str(tmp_path_factory.mktemp("mlp"))
  scope = {"WORKDIR": workdir, "__name__": "docs_example"}
  exec(compile(_doc_code(), str(DOC), "exec"), scope)  # pylint: disable=exec-used
  return scope, workdir


def test_the_docs_example_trains(example, capsys):
  scope, workdir = example
  results = scope["results"]
  assert results["eval"]["accuracy"] > 0.9            # measured 0.97 (60 Adam steps, batch 64)
  final = json.loads(pathlib.Path(workdir, "final_eval.json").read_text())
  assert final["step"] == 60 and final["eval"]["accuracy"] == results["eval"]["accuracy"]
  evals = json.loads(pathlib.Path(workdir, "evals.json").read_text())
  assert sorted(evals, key=int) == ["30", "60"]       # every 30 updates and the final one
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["30", "60"]


def test_a_finished_run_resumes_to_the_same_table(example):
  scope, workdir = example
  mlp = scope["MLP"]()
  again = trainer.train_and_evaluate(mlp, mlp.base_config(), workdir)
  assert again["eval"] == scope["results"]["eval"]


def test_eval_mode_evaluates_the_workdir_without_training(example):
  scope, workdir = example
  mlp = scope["MLP"]()
  out = trainer.evaluate(mlp, mlp.base_config(), workdir)
  assert out["eval"]["accuracy"] == scope["results"]["eval"]["accuracy"]
  saved = json.loads(pathlib.Path(workdir, "eval_results.json").read_text())
  assert saved["step"] == 60 and saved["eval"] == out["eval"]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["30", "60"]   # no new save


def test_init_from_a_podlab_workdir_starts_from_its_weights_at_step_zero(example, tmp_path):
  scope, workdir = example
  mlp = scope["MLP"]()
  config = mlp.base_config()
  config.init_from = workdir
  config.total_steps = 0                     # no update: evaluate the imported weights
  out = trainer.evaluate(mlp, config, str(tmp_path / "eval_only"))
  assert out["eval"]["accuracy"] == scope["results"]["eval"]["accuracy"]
  step, params = trainer.restore_params(mlp, mlp.base_config(), workdir)
  assert step == 60
  config.total_steps = 10
  fine = str(tmp_path / "finetune")
  trainer.train_and_evaluate(mlp, config, fine)
  found = checkpointing.find_checkpoint(fine)
  assert found is not None and found[1] == 10          # its own steps, counted from 0
  _, tuned = trainer.restore_params(mlp, config, fine)
  assert not np.array_equal(tuned["w1"], params["w1"])  # trained on from the imported weights


def test_eval_mode_without_a_checkpoint_names_init_from(example, tmp_path):
  scope, _ = example
  mlp = scope["MLP"]()
  with pytest.raises(errors.ConfigError, match="init_from.*--mode=eval found no checkpoint"):
    trainer.evaluate(mlp, mlp.base_config(), str(tmp_path / "empty"))
  assert not (tmp_path / "empty").exists()              # no empty workdir left behind


def test_bad_input_leaves_no_empty_workdir(example, tmp_path):
  scope, _ = example
  mlp = scope["MLP"]()
  config = mlp.base_config()
  config.global_batch_size = 7 * jax.device_count() + 1
  with pytest.raises(errors.ConfigError, match="global_batch_size"):
    trainer.train_and_evaluate(mlp, config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()
  config = mlp.base_config()
  config.lrr = 1.0
  with pytest.raises(errors.ConfigError, match="did you mean 'lr'"):
    trainer.train_and_evaluate(mlp, config, str(tmp_path / "w"))


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_the_nonfinite_guard(example, tmp_path, policy):
  """lr = inf makes the first update non-finite: "stop" ends the run naming the metric and the
  checkpoint situation; "skip" drops every such update (the weights stay the initial ones)."""
  scope, _ = example
  mlp = scope["MLP"]()
  config = mlp.base_config()
  config.lr, config.total_steps, config.nonfinite = float("inf"), 4, policy
  workdir = str(tmp_path / policy)
  if policy == "stop":
    with pytest.raises(errors.NonFiniteError, match="step 1: non-finite training metric.*no "
                       "checkpoint was saved yet"):
      trainer.train_and_evaluate(mlp, config, workdir)
    return
  trainer.train_and_evaluate(mlp, config, workdir)
  _, params = trainer.restore_params(mlp, config, workdir)
  initial = trainer.init_state(mlp.build(config, layout.batch_layout(config)), config)[0].params
  for k in params:
    np.testing.assert_array_equal(params[k], initial[k])


def test_a_second_run_on_a_held_workdir_stops_before_any_compute(example, tmp_path):
  """Another live run holds the workdir's lock: the trainer names it and writes nothing."""
  scope, _ = example
  mlp = scope["MLP"]()
  workdir = str(tmp_path / "held")
  with workdir_lock.WorkdirLock(workdir, run_id="the-other-run"):       # alive: this very process
    with pytest.raises(errors.WorkdirError, match="the-other-run"):
      trainer.train_and_evaluate(mlp, mlp.base_config(), workdir)
    assert not os.path.exists(os.path.join(workdir, "checkpoints"))
  trainer.train_and_evaluate(mlp, mlp.base_config(), workdir)           # free again: it trains
  assert workdir_lock.read_lock(workdir) is None                         # and releases the lock


def test_a_resume_with_another_config_names_the_changes(example, tmp_path):
  scope, _ = example
  mlp = scope["MLP"]()
  workdir = str(tmp_path / "w")
  config = mlp.base_config()
  config.total_steps = 30
  trainer.train_and_evaluate(mlp, config, workdir)
  changed = mlp.base_config()
  changed.total_steps, changed.lr = 40, 0.5
  changed.log_every_steps = 10                                  # a free field: not reported
  with pytest.raises(errors.ConfigError, match=r"allow_config_change.*lr: 0\.05 -> 0\.5.*"
                     r"total_steps: 30 -> 40") as e:
    trainer.train_and_evaluate(mlp, changed, workdir)
  assert "log_every_steps" not in str(e.value)
  changed.allow_config_change = True
  trainer.train_and_evaluate(mlp, changed, workdir)             # resumes at 30, runs to 40
  assert checkpointing.find_checkpoint(workdir)[1] == 40


def test_a_checkpoint_of_another_model_advises_a_new_workdir(example, tmp_path):
  scope, _ = example
  mlp = scope["MLP"]()
  workdir = str(tmp_path / "w")
  config = mlp.base_config()
  config.total_steps = 30
  trainer.train_and_evaluate(mlp, config, workdir)
  bigger = mlp.base_config()
  bigger.hidden, bigger.allow_config_change = 64, True
  with pytest.raises(errors.CheckpointError, match="another model or config.*new --workdir"):
    trainer.train_and_evaluate(mlp, bigger, workdir)


def _doc_program(root: pathlib.Path, commands: str) -> subprocess.CompletedProcess:
  """The doc's bash block run in `root`, a stand-in repository root whose `experiments/` holds links to
  the real packages and whose `experiments/mlp/train.py` is the doc's Python block down to its `# ---`
  line (the step the block's comment asks of the reader); the block's other lines as written, except
  that only the `python -m` lines in `commands` run (each with /tmp/mlp* inside `root`)."""
  repo = DOC.parents[1]
  (root / "experiments").mkdir(parents=True)
  for entry in (repo / "experiments").iterdir():
    if entry.name != "__pycache__":
      (root / "experiments" / entry.name).symlink_to(entry)
  for name in ("modules", "input_pipeline", "third_party"):
    (root / name).symlink_to(repo / name)
  block = re.search(r"```bash\n(.*?)```", DOC.read_text(), re.S).group(1)
  setup, runs = block.split("\npython -m", 1)
  runs = ["python -m" + r for r in ("\npython -m" + runs).split("\npython -m")[1:]]
  chosen = [r for r in runs if any(c in r for c in commands.split("|"))]
  assert chosen, commands
  train_py = _doc_code().split("\n# ---")[0]
  script = (setup.replace("# ... save the block above",
                          f"cat > experiments/$E/train.py <<'PYEOF'\n{train_py}\nPYEOF\n#")
            + "\n" + "\n".join(chosen)).replace("/tmp/mlp", str(root / "mlp"))
  env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
             PYTHONPATH=str(root))
  return subprocess.run(["bash", "-e", "-c", script], cwd=root, env=env, capture_output=True,
                        text=True, timeout=900)


def test_the_docs_files_make_a_program_whose_config_resolves(tmp_path):
  """docs/adding-an-experiment.md's four files, written as the doc says, make `python -m
  experiments.mlp.main`: `--config=configs/base.py` resolves inside the experiment's folder."""
  out = _doc_program(tmp_path, "--check_only")
  assert out.returncode == 0, out.stderr[-2000:]
  assert f"config ok: {tmp_path}/experiments/mlp/configs/base.py" in out.stdout + out.stderr


@pytest.mark.slow
def test_the_docs_commands_train_evaluate_finetune_and_compile(tmp_path, libtpu):
  """Every command of the doc's bash block, as written: train, --mode=eval, init_from, --check_only,
  --dry_run --target=v4-8."""
  del libtpu
  out = _doc_program(tmp_path, "python -m")
  text = out.stdout + out.stderr
  assert out.returncode == 0, text[-3000:]
  evals = json.loads((tmp_path / "mlp" / "final_eval.json").read_text())
  assert evals["step"] == 60 and evals["eval"]["accuracy"] > 0.9
  saved = json.loads((tmp_path / "mlp" / "eval_results.json").read_text())
  assert saved["eval"] == evals["eval"]                               # --mode=eval: same weights
  assert json.loads((tmp_path / "mlp_ft" / "final_eval.json").read_text())["step"] == 10
  assert "train_step" in text and "v4-8" in text
