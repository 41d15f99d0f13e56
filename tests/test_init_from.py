"""`--config.init_from` and `--mode=eval` for the reference formats (issue 15, item 4).

A trained podlab TRM exported as a reference `.pt` and evaluated with `--mode=eval
--config.init_from=that.pt` gives the same metrics as the original run's final evaluation; a
trained podlab nanoGPT written as nanoGPT's `ckpt.pt` gives the same val loss as evaluating the
podlab checkpoint itself.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.common import trainer
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import train as gpt_train
from experiments.nanogpt.configs import shakespeare_char_cpu
from experiments.trm import train as trm_train
from experiments.trm.configs import cpu_demo
from experiments.trm.tools import export_reference

REPO = pathlib.Path(__file__).resolve().parents[1]


def _trm_config(tmp_path):
  c = cpu_demo.get_config("smoke")
  c.dataset.data_dir = str(tmp_path / "tfds")
  c.model.puzzle_emb_ndim = c.model.hidden_size          # the puzzle table (sharded) travels too
  c.model.puzzle_emb_len = 2
  c.async_checkpoints = False
  return c


@pytest.mark.slow    # ~45-55 s: two TRM runs (the export itself: test_reference_checkpoint)
def test_trm_exported_as_a_reference_pt_evaluates_to_the_same_metrics(tmp_path):
  pytest.importorskip("torch", reason="writing a .pt needs torch (pip install '.[torch]')")
  config = _trm_config(tmp_path)
  trained = str(tmp_path / "trained")
  results = trm_train.train_and_evaluate(config, trained)
  pt = str(tmp_path / "model.pt")
  summary = export_reference.export(config, trained, pt)
  assert "EMA weights of step 6" in summary
  again = trainer.evaluate(trm_train.TRM(), _with_init(config, pt), str(tmp_path / "eval_pt"))
  assert again["test"] == results["test"]                      # bitwise: the same weights
  # The same through the real entry point, as a user types it.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.trm.main", "--config=configs/cpu_demo.py:smoke",
       f"--config.dataset.data_dir={tmp_path / 'tfds'}", "--config.model.puzzle_emb_ndim=32",
       "--config.model.puzzle_emb_len=2", "--mode=eval", f"--config.init_from={pt}",
       f"--workdir={tmp_path / 'eval_cli'}"], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = json.loads((tmp_path / "eval_cli" / "eval_results.json").read_text())
  assert saved["test"] == results["test"] and saved["source"] == pt
  assert "Evaluation of" in proc.stdout and "exact_accuracy" in proc.stdout


def _with_init(config, path):
  c = config.copy_and_resolve_references()
  c.init_from = path
  return c


@pytest.mark.slow        # make test: ckpt.pt's tensors both ways (tests/test_nanogpt_checkpoint.py)
def test_nanogpt_ckpt_pt_evaluates_to_the_podlab_checkpoints_val_loss(tmp_path):
  torch = pytest.importorskip("torch", reason="writing a ckpt.pt needs torch")
  config = shakespeare_char_cpu.get_config("smoke")
  config.dataset.data_dir = str(tmp_path / "tfds")
  config.async_checkpoints = False
  trained = str(tmp_path / "trained")
  gpt_train.train_and_evaluate(config, trained)
  step, params = trainer.restore_params(gpt_train.NanoGPT(), config, trained)
  _, built = trainer.build(gpt_train.NanoGPT(), config)
  model = built.model_config
  sd = nanogpt_checkpoint.to_state_dict(jax.tree.map(np.asarray, params), model)
  ckpt = str(tmp_path / "ckpt.pt")
  torch.save({"model": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
              "model_args": model.model_args(), "iter_num": step - 1, "best_val_loss": 0.0,
              "config": {}}, ckpt)
  from_pt = trainer.evaluate(gpt_train.NanoGPT(), _with_init(config, ckpt), str(tmp_path / "a"))
  from_podlab = trainer.evaluate(gpt_train.NanoGPT(), _with_init(config, trained),
                                 str(tmp_path / "b"))
  assert from_pt["eval"]["val_loss"] == from_podlab["eval"]["val_loss"]
  assert np.isfinite(from_pt["eval"]["val_loss"]) and from_pt["eval"]["val_loss"] < 4.2
