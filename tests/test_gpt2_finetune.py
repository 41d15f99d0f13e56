"""nanoGPT's finetune_shakespeare recipe (configs/finetune_shakespeare.py) and config.init_from.

The end-to-end run starts `train.train_and_evaluate` from a tiny random GPT-2 folder
(`hf_gpt2.make_random`, with a BPE vocabulary learned from a text written here) on that text at BPE
level; its iteration-0 evaluation (before any update) must be the imported model's loss on
nanoGPT's evaluation windows: replayed with torch_rng after the draws of nanoGPT's GPT(config) init,
computed with the independent PyTorch GPT-2 forward of tests/torch_gpt2_reference.py.
"""
import os

import numpy as np
import pytest

from experiments.common import config_utils
from experiments.common import errors
from experiments.common import trainer
from experiments.common import layout as layout_lib
from experiments.common import safetensors_io as st
from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import torch_rng
from experiments.nanogpt import train
from experiments.nanogpt.configs import finetune_shakespeare
from input_pipeline import gpt2_bpe


def test_recipe_is_nanogpts_finetune_shakespeare():
  c = finetune_shakespeare.get_config()
  assert (c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size) == (48, 25, 1600, 1024)
  assert (c.lr, c.decay_lr, c.max_iters, c.global_batch_size, c.grad_accum) == (3e-5, False, 20, 1, 32)
  assert (c.eval_interval, c.eval_iters, c.model.dropout, c.model.bias) == (5, 40, 0.0, True)
  assert c.model.vocab_size == 50257 and finetune_shakespeare.get_config("tiny").model.vocab_size == -1
  assert (c.weight_decay, c.beta1, c.beta2, c.grad_clip) == (0.1, 0.9, 0.95, 1.0)
  assert c.dataset.name == "text_corpus" and c.dataset.builder_kwargs.level == "bpe"
  assert all(train.lr_at(i, c) == 3e-5 for i in (0, 7, 20))
  c.init_from = "/models/gpt2-xl"                       # the tokenizer follows the folder
  assert c.dataset.builder_kwargs.to_dict()["tokenizer_dir"] == "/models/gpt2-xl"
  for size, spec in hf_gpt2.SIZES.items():
    assert finetune_shakespeare.SIZES[size] == (spec["n_layer"], spec["n_head"], spec["n_embd"],
                                                spec["n_positions"])
  small = finetune_shakespeare.get_config("gpt2,devices=8")
  assert (small.model.n_layer, small.num_devices, small.global_batch_size, small.grad_accum) == (12, 8, 8, 4)
  with pytest.raises(config_utils.ConfigError, match="unknown or repeated size"):
    finetune_shakespeare.get_config("gpt3")
  with pytest.raises(config_utils.ConfigError, match="must divide 32"):
    finetune_shakespeare.get_config("tiny,devices=3")


WORDS = ("the king and queen of verona speak of love and death in the night while the "
         "citizens of rome hear me speak before we proceed any further").split()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("ft")
  rng = np.random.default_rng(0)
  text = "".join(" ".join(rng.choice(WORDS, 8)) + (".\n" if i % 3 else ":\n") for i in range(700))
  (root / "texts").mkdir()
  (root / "texts" / "input.txt").write_text(text, encoding="utf-8")
  folder = str(root / "gpt2_tiny")
  hf_gpt2.make_random(folder, "tiny", seed=1, bpe_text=str(root / "texts" / "input.txt"),
                      bpe_vocab_size=300)
  c = finetune_shakespeare.get_config("tiny")
  c.init_from = folder
  c.dataset.manual_dir = str(root / "texts")
  c.dataset.data_dir = str(root / "tfds")
  c.async_checkpoints = False
  results = train.train_and_evaluate(c, str(root / "work"))
  return c, folder, results


def test_tiny_recipe_runs_end_to_end_from_a_gpt2_folder(tiny_run):
  c, folder, results = tiny_run
  val, tr = results["val_curve"], results["train_curve"]
  assert sorted(val) == sorted(tr) == [0, 5, 10, 15, 20]
  assert results["num_params"] == 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64 + 300 * 64
  assert val[20] < val[0] and tr[20] < tr[0]            # 21 updates at lr 3e-5 lower the loss
  assert abs(val[0] - np.log(300)) < 0.05               # a random model is ~uniform


def test_iteration0_eval_is_the_imported_models_loss_on_nanogpts_windows(tiny_run):
  torch_ref = pytest.importorskip("tests.torch_gpt2_reference",
                                  reason="the PyTorch reference needs torch (pip install '.[torch]')")
  c, folder, results = tiny_run
  tensors = {n: st.ShardedCheckpoint(folder).get(n) for n in st.ShardedCheckpoint(folder).infos}
  folder_config, _ = hf_gpt2.load_pretrained(folder)
  _, draws = torch_rng.init_params(folder_config, c.seed)    # nanoGPT's GPT(config) init, replayed
  data = train.text_data(c)
  stream = torch_rng.BatchStream(data.tokens["train"], data.tokens["val"], block_size=64,
                                 layout=layout_lib.batch_layout(c, devices=4, devices_per_host=4,
                                                                check_num_devices=False),
                                 eval_interval=c.eval_interval, eval_iters=c.eval_iters,
                                 init_draws=draws, seed=c.seed)
  losses = {}
  for split in ("train", "val"):
    per_batch = []
    for batch in stream.eval(0, split):
      x = batch["x"].reshape(-1, 64)
      y = batch["y"].reshape(-1, 64)
      logits = torch_ref.forward(tensors, 4, x, gelu="tanh")        # [B, 64, V] float64 (gelu_new)
      logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
          - logits.max(-1, keepdims=True)
      per_batch.append(-np.take_along_axis(logp, y[..., None], -1).mean())
    losses[split] = float(np.mean(per_batch))
  assert results["val_curve"][0] == pytest.approx(losses["val"], abs=2e-5)
  assert results["train_curve"][0] == pytest.approx(losses["train"], abs=2e-5)


def test_init_from_errors_name_the_field(tmp_path):
  folder = str(tmp_path / "g")
  hf_gpt2.make_random(folder, "tiny")                    # 257 ids, n_positions 128
  c = finetune_shakespeare.get_config("tiny")
  c.init_from = ""
  train.validate_config(c)                               # --dry_run needs no folder
  with pytest.raises(config_utils.ConfigError, match="tokenizer_dir.*Fix: set --config.init_from"):
    train.check_tokenizer(c)                             # reading BPE text needs its tokenizer
  c.init_from = folder
  train.validate_config(c)
  model = train.model_config(c, 257)
  folder_cfg, run = train.init_from_model_config(c, model)
  assert (run.block_size, folder_cfg.block_size, run.vocab_size, run.n_embd) == (64, 128, 257, 64)
  # GELU: the folder's config.json (gelu_new: tanh) by default, nanoGPT's exact on request; the
  # run's model line says which.
  assert run.gelu == "tanh" and train.gelu_line(c, run) == "GELU tanh (config.json: gelu_new)"
  c.model.gelu = "exact"
  _, exact = train.init_from_model_config(c, model)
  assert train.gelu_line(c, exact) == "GELU exact (nanoGPT's; config.json: gelu_new)"
  c.model.gelu = "erf"
  with pytest.raises(config_utils.ConfigError, match="model.gelu='erf': must be one of auto"):
    train.validate_config(c)
  c.model.gelu = "auto"
  with pytest.raises(config_utils.ConfigError, match="needs 300 token ids.*vocab_size is 257"):
    train.init_from_model_config(c, train.model_config(c, 300))
  c.model.block_size = 256
  with pytest.raises(config_utils.ConfigError, match="exceeds the GPT-2 folder's n_positions=128"):
    train.init_from_model_config(c, train.model_config(c, 257))
  c.model.block_size = 64
  _, built = trainer.build(train.NanoGPT(), c)
  with pytest.raises(config_utils.ConfigError, match=r"config.init_from=.*no such file"):
    trainer.load_init(train.NanoGPT(), built, c, str(tmp_path / "nothing"))
  st.write_safetensors(str(tmp_path / "g" / "model.safetensors"),
                       {"wte.weight": np.zeros((257, 64), np.float32)})
  with pytest.raises(errors.FormatError, match=r"no tensor 'wpe.weight'"):
    trainer.load_init(train.NanoGPT(), built, c, folder)   # the entry point: exit 2, one line
  assert gpt2_bpe.load(folder).vocab_size == 257
  # A folder without config.json (the tokenizer is there): named, before any data or weights.
  os.remove(os.path.join(folder, "config.json"))
  for call in (lambda: trainer.load_init(train.NanoGPT(), built, c, folder),
               lambda: trainer.build(train.NanoGPT(), c)):
    with pytest.raises(errors.FormatError, match=f"{folder}: no config.json. Fix: download"):
      call()
