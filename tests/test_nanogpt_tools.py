"""experiments/nanogpt/tools: the reference-curve re-run (nanoGPT's loop in PyTorch) and val_eval.

Expected values come from the nanoGPT reference facts (docs/nanogpt.md sections 2-4: data sizes,
first ids, the learning-rate formula, the published curve's first point) and from torch itself
(an independent forward of the same weights on the same windows), on the repository's Tiny
Shakespeare. Needs torch.

  .venv/bin/python -m pytest tests/test_nanogpt_tools.py -q
"""
import math
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the nanoGPT tools need torch (pip install '.[torch]')")

from experiments.nanogpt import nanogpt_checkpoint  # noqa: E402
from experiments.nanogpt import sampling  # noqa: E402
from experiments.nanogpt.tools import bench  # noqa: E402
from experiments.nanogpt.tools import torch_reference  # noqa: E402
from experiments.nanogpt.tools import reference_curve  # noqa: E402
from experiments.nanogpt.tools import val_eval  # noqa: E402
from input_pipeline import sources  # noqa: E402
from modules import gpt  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shakespeare():
  return reference_curve.prepare(sources.TINY_SHAKESPEARE)


def _tiny(**over):
  h = dict(reference_curve.CPU_RECIPE)
  h.update(over)
  return h


def _torch_batch_losses(model, val_ids, offsets, T):
  """Mean token cross-entropy of each batch, in torch (float64 accumulation of float32 losses)."""
  out = []
  with torch.no_grad():
    for row in offsets:
      w = np.stack([val_ids[i:i + T + 1] for i in row]).astype(np.int64)
      x, y = torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])
      logits = model(x)
      out.append(float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                         y.reshape(-1))))
  return np.array(out)


def test_prepare_is_nanogpts_shakespeare_char(shakespeare):
  train_ids, val_ids, chars = shakespeare
  assert (len(train_ids), len(val_ids), len(chars)) == (1_003_854, 111_540, 65)
  assert chars[0] == "\n" and chars[1] == " " and chars[13] == "A" and chars[39] == "a"
  np.testing.assert_array_equal(train_ids[:12], [18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43])


def test_learning_rate_is_nanogpts_get_lr():
  h = _tiny()                                     # lr 1e-3, min 1e-4, warmup 100, decay 2000
  lr, lo, w, d = 1e-3, 1e-4, 100, 2000

  def want(it):                                   # float64, written from docs/nanogpt.md section 2
    if it < w:
      return lr * (it + 1) / (w + 1)
    if it > d:
      return lo
    return lo + 0.5 * (1 + math.cos(math.pi * (it - w) / (d - w))) * (lr - lo)

  for it in (0, 1, 50, 99, 100, 101, 1050, 1999, 2000, 2001, 5000):
    assert reference_curve.get_lr(it, h) == pytest.approx(want(it), rel=1e-12), it
  assert reference_curve.get_lr(0, h) == pytest.approx(1e-3 / 101)
  assert reference_curve.get_lr(1050, h) == pytest.approx(5.5e-4)


def test_first_evaluation_is_the_published_curves_first_point(shakespeare):
  """Seed 1337, the CPU recipe's model: val at iteration 0 is 4.1649 (docs/nanogpt.md section 6),
  and 3 updates lower the loss."""
  train_ids, val_ids, chars = shakespeare
  lines = []
  curve, _, _, ms = reference_curve.run(_tiny(max_iters=3, eval_interval=3), train_ids, val_ids,
                                        len(chars), log=lines.append)
  assert sorted(curve) == [0, 3] and len(ms) == 4 and len(lines) == 2
  assert curve[0]["val"] == pytest.approx(4.1649, abs=1e-4)
  assert curve[0]["train"] == pytest.approx(math.log(65), abs=0.1)    # a fresh model: ~uniform
  assert curve[3]["val"] < curve[0]["val"] - 0.05
  assert "| iteration | 0 | 3 |" in reference_curve.curve_row(curve)


def test_checkpoint_round_trip_and_val_eval_equal_torch(shakespeare, tmp_path, capsys):
  """reference_curve --out writes a ckpt.pt that podlab imports; val_eval's JAX evaluation of it
  equals the torch model's loss on the same windows; main() prints the table."""
  train_ids, val_ids, chars = shakespeare
  h = _tiny(max_iters=2, eval_interval=2, eval_iters=1)
  curve, model, opt, _ = reference_curve.run(h, train_ids, val_ids, len(chars), log=lambda s: None)
  path = str(tmp_path / "ref" / "ckpt.pt")
  reference_curve.save_checkpoint(path, model, opt, h, len(chars), curve)
  cfg, params, meta = nanogpt_checkpoint.load(path)
  assert meta["iter_num"] == 2 and meta["best_val_loss"] == pytest.approx(min(
      v["val"] for v in curve.values()))
  assert cfg.model_args() == dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False,
                                  vocab_size=65, dropout=0.0)

  offsets = val_eval.windows(val_ids, 64, batches=3, batch_size=4, seed=0)       # [3, 4]
  assert offsets.shape == (3, 4) and offsets.min() >= 0 and offsets.max() < len(val_ids) - 64
  np.testing.assert_array_equal(offsets, val_eval.windows(val_ids, 64, 3, 4, 0))  # seeded
  ours = val_eval.evaluate(cfg, params, val_ids, offsets)
  theirs = _torch_batch_losses(model.eval(), val_ids, offsets, 64)
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)

  assert val_eval.main([f"--ckpt={path}", "--batches=3", "--batch_size=4"]) == 0   # default input
  out = capsys.readouterr().out
  assert f"| {path} | iter 2 | 64 | {ours.mean():.4f} |" in out, out


@pytest.mark.slow    # trains through the CLI in a subprocess (~20 s idle, a minute on a busy machine)
def test_val_eval_reads_a_podlab_workdir(tmp_path):
  """A real podlab run (the CLI, 2 updates): val_eval restores its newest checkpoint, and those
  weights, exported to nanoGPT's layout and run by the torch model, give the same losses."""
  wd = tmp_path / "run"
  cmd = [sys.executable, "-m", "experiments.nanogpt.main",
         "--config=configs/shakespeare_char_cpu.py:smoke", f"--workdir={wd}",
         f"--config.dataset.data_dir={tmp_path / 'tfds'}", "--config.max_iters=1",
         "--config.eval_interval=1", "--config.eval_iters=1", "--config.async_checkpoints=False"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  cfg, params, step, vocab = val_eval.load_workdir(str(wd))
  assert step == 2 and len(vocab) == 65 and cfg.n_layer == 4
  _, val_ids, _ = reference_curve.prepare(sources.TINY_SHAKESPEARE)
  offsets = val_eval.windows(val_ids, cfg.block_size, batches=2, batch_size=3, seed=1)
  ours = val_eval.evaluate(cfg, params, val_ids, offsets)
  model = torch_reference.GPT(cfg.model_args())
  sd = nanogpt_checkpoint.to_state_dict(params, cfg)
  model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in sd.items()})
  np.testing.assert_allclose(ours, _torch_batch_losses(model.eval(), val_ids, offsets,
                                                       cfg.block_size), rtol=1e-5)
  with pytest.raises(val_eval.EvalInputError, match="no model_args.json"):
    val_eval.load_workdir(str(tmp_path / "nothing"))


def test_bad_input_is_one_line(tmp_path, capsys):
  assert reference_curve.main([f"--input={tmp_path / 'missing.txt'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --input=") and "Fix:" in err and err.count("\n") == 1
  # No model_args.json here: one line, exit 2.
  assert val_eval.main([f"--workdir={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --") and "Fix:" in err and err.count("\n") == 1, err
  with pytest.raises(SystemExit):
    val_eval.main([])                               # nothing to evaluate: argparse's usage error


@pytest.mark.slow
def test_bench_sampling_verdicts_of_each_context_policy():
  """bench.py's sampling table: whether each policy's greedy tokens equal nanoGPT's crop (the
  PyTorch loop on the same weights) and the first position where they differ. A tiny GPT with
  block_size 8 and matrices scaled x 8 (so the argmax depends on the context) decodes 24 tokens,
  past the block: "exact" (cache or not) is nanoGPT's crop; "chunk" agrees while the context fits
  and may only differ after it; a crop with one token changed at position 12 is reported there."""
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, bias=True,
                      dropout=0.0, dtype="float32")
  model = gpt.GPTModel(cfg)
  params = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, model.init(jax.random.key(0)))
  prompt = np.zeros((1, 1), np.int32)
  crop, source = bench.crop_reference(model, params, prompt, 24)
  assert source == "nanoGPT's generate loop in PyTorch" and crop.shape == (1, 25)
  verdicts = bench.greedy_agreement(model, params, prompt, 24, crop)
  assert [(v[1], v[2]) for v in verdicts] == [(w, c) for _, w, c in bench.POLICIES]
  assert [v[3:] for v in verdicts[:2]] == [(True, None), (True, None)]      # exact = the crop
  for _, window, cache, same, first in verdicts[2:]:                      # chunk
    chunk = sampling.generate(model, params, prompt, 24, temperature=0.0, kv_cache=cache,
                              window=window)
    assert same == bool(np.array_equal(chunk, crop))
    assert first is None or first > cfg.block_size, first                  # the context fits
    assert same or chunk[0, first] != crop[0, first]
    assert same or np.array_equal(chunk[0, :first], crop[0, :first])
  changed = crop.copy()
  changed[0, 12] = (changed[0, 12] + 1) % cfg.vocab_size
  verdicts = bench.greedy_agreement(model, params, prompt, 24, changed)
  assert [v[3:] for v in verdicts[:2]] == [(False, 12), (False, 12)]
  assert all(v[3] is False and v[4] <= 12 for v in verdicts[2:])
