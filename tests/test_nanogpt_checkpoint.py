"""The `python -m experiments.nanogpt.nanogpt_checkpoint` CLI: model args, parameter count and the
val loss of a nanoGPT ckpt.pt, the loss checked against the PyTorch nanoGPT-layout model
(experiments/nanogpt/tools/torch_reference.py) on the same shakespeare_char windows."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import train
from experiments.nanogpt.configs import shakespeare_char_cpu

REPO = pathlib.Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch", reason="ckpt.pt files need torch (pip install '.[torch]')")


def test_cli_prints_args_count_and_val_loss(tmp_path, capsys):
  from experiments.nanogpt.tools import torch_reference  # pylint: disable=g-import-not-at-top
  args = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=65, bias=False,
              dropout=0.0)
  torch.manual_seed(0)
  ref = torch_reference.init_like_nanogpt(torch_reference.GPT(args), 2)
  path = tmp_path / "ckpt.pt"
  torch.save({"model": ref.state_dict(), "model_args": args, "iter_num": 500,
              "best_val_loss": torch.tensor(2.25), "config": {"dataset": "shakespeare_char"}}, path)
  overrides = [f"--config.dataset.data_dir={tmp_path / 'tfds'}"]
  argv = ["prog", f"--ckpt={path}", "--max_windows=40", "--batch_size=16"] + overrides
  assert nanogpt_checkpoint.main(argv) == 0
  out = capsys.readouterr().out
  n = sum(p.numel() for k, p in ref.state_dict().items() if k != "transformer.wpe.weight"
          and k != "lm_head.weight")                                 # tied head counted once
  assert "iter_num 500, best_val_loss 2.2500" in out
  assert "'n_layer': 2, 'n_head': 2, 'n_embd': 32, 'block_size': 32" in out
  assert f"number of parameters: {n / 1e6:.2f}M ({n:,};" in out
  # The val loss: torch's cross-entropy over the first 40 non-overlapping windows of the val split.
  c = shakespeare_char_cpu.get_config()
  c.dataset.data_dir = str(tmp_path / "tfds")
  val = train.text_data(c).tokens["val"]
  idx = np.arange(40)[:, None] * 32 + np.arange(32)[None]
  with torch.no_grad():
    logits = ref(torch.as_tensor(val[idx].astype(np.int64)))
    want = float(torch.nn.functional.cross_entropy(logits.reshape(-1, 65),
                                                   torch.as_tensor(val[idx + 1].astype(np.int64))
                                                   .reshape(-1)))
  line = next(l for l in out.splitlines() if l.startswith("val loss: "))
  assert float(line.split()[2]) == pytest.approx(want, abs=1e-4), (line, want)
  assert "1,280 tokens in 40 windows of 32" in line
  # Errors: no --ckpt, a missing file.
  assert nanogpt_checkpoint.main(["prog"] + overrides) == 2
  assert "pass --ckpt=" in capsys.readouterr().err
  assert nanogpt_checkpoint.main(["prog", f"--ckpt={tmp_path / 'nope.pt'}"] + overrides) == 2
  assert "nope.pt: no such file" in capsys.readouterr().err


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
  """The real CLI as a subprocess: a file that is not a ckpt.pt is one `error:` line naming the
  file, exit 2, no traceback (the missing file's line: test_cli_prints_args_count_and_val_loss)."""
  bad = tmp_path / "not_a_ckpt.pt"
  torch.save({"weights": torch.zeros(2)}, bad)
  proc = subprocess.run([sys.executable, "-m", "experiments.nanogpt.nanogpt_checkpoint",
                         f"--ckpt={bad}"], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
  assert lines[0].startswith("error: ") and str(bad) in lines[0], lines
