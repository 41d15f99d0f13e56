"""Tests of the masked-diffusion experiment (experiments/diffucoder/train.py) and of the benchmark's
table on a trained model (experiments/diffucoder/tools/benchmark.py mode 4, decodings.py).

The objective and the evaluation are checked against float64 NumPy written from their definitions
(docs/diffucoder.md section 12); training runs end to end on the smoke config through the shared
trainer; `--mode=eval --config.init_from=<Dream folder>` runs through the real entry point.
"""
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import errors
from experiments.common import trainer
from experiments.diffucoder import convert
from experiments.diffucoder import random_checkpoint
from experiments.diffucoder import train
from experiments.diffucoder.configs import shakespeare_mdm
from experiments.diffucoder.tools import decodings
from experiments.diffucoder.tools import step_speed
from modules import dream

REPO = pathlib.Path(__file__).resolve().parents[1]


def _log_softmax64(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_objective_matches_float64_numpy_on_a_tiny_batch():
  B, L, V, mask_id, eps = 3, 7, 6, 5, 0.2
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, mask_id, (B, L)).astype(np.int32)
  logits = rng.normal(0, 2, (B, L, V)).astype(np.float32)
  key = jax.random.key(7)
  noisy, masked, t = train.noise(key, jnp.asarray(tokens), eps, mask_id)
  # The masks from the same keys, by the definition: t = 1 - (1 - eps) u; masked = v < t; not 0.
  key_t, key_m = jax.random.split(key)
  u = np.asarray(jax.random.uniform(key_t, (B,)), np.float64)
  v = np.asarray(jax.random.uniform(key_m, (B, L)), np.float64)
  t_ref = 1.0 - (1.0 - eps) * u
  m_ref = v < t_ref[:, None]
  m_ref[:, 0] = False
  np.testing.assert_allclose(np.asarray(t), t_ref, rtol=1e-6)
  assert np.all((t_ref > eps) & (t_ref <= 1.0))
  np.testing.assert_array_equal(np.asarray(masked), m_ref)
  assert 0 < m_ref.sum() < B * (L - 1)                        # the batch has both kinds
  np.testing.assert_array_equal(np.asarray(noisy), np.where(m_ref, mask_id, tokens))
  # loss = sum_{b, j >= 1} m_bj * -log softmax(logits[b, j - 1])[x_bj] / t_b / (B (L - 1)).
  logp = _log_softmax64(logits)
  nll = np.zeros((B, L))
  for b in range(B):
    for j in range(1, L):
      nll[b, j] = -logp[b, j - 1, tokens[b, j]]
  want = np.sum(nll * m_ref / t_ref[:, None]) / (B * (L - 1))
  loss, sums = train.masked_diffusion_loss(jnp.asarray(logits), jnp.asarray(tokens),
                                           jnp.asarray(m_ref), jnp.asarray(t_ref, jnp.float32))
  np.testing.assert_allclose(float(loss), want, rtol=1e-6)
  np.testing.assert_allclose(float(sums["masked_nll"]), np.sum(nll * m_ref), rtol=1e-6)
  assert float(sums["masked"]) == m_ref.sum()


def test_objective_is_an_unbiased_per_token_estimate():
  """With predictions that ignore the input, E[loss] = the mean cross-entropy over positions 1..L-1
  (the 1/t weight undoes the masking rate; the normalisation is per maskable position), and the
  masking rate of a row is its t."""
  B, L, V, mask_id, eps = 20000, 17, 4, 3, 1e-3
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, mask_id, (B, L)).astype(np.int32)
  row_logits = rng.normal(0, 1, (L, V)).astype(np.float32)
  _, masked, t = train.noise(jax.random.key(3), jnp.asarray(tokens), eps, mask_id)
  masked, t = np.asarray(masked), np.asarray(t, np.float64)
  assert not masked[:, 0].any()
  assert t.min() > eps and t.max() <= 1.0 and abs(t.mean() - (1 + eps) / 2) < 0.01
  rate = masked[:, 1:].mean(1)                                    # [B]
  for lo in np.arange(0.0, 1.0, 0.2):                             # E[rate | t] = t, per fifth
    rows = (t > lo) & (t <= lo + 0.2)
    assert abs(rate[rows].mean() - t[rows].mean()) < 0.01
  logits = jnp.broadcast_to(jnp.asarray(row_logits), (B, L, V))
  loss, _ = train.masked_diffusion_loss(logits, jnp.asarray(tokens), jnp.asarray(masked),
                                        jnp.asarray(t, jnp.float32))
  logp = _log_softmax64(row_logits)
  expected = np.mean(-logp[np.arange(L - 1)[None], tokens[:, 1:]])
  assert float(loss) == pytest.approx(expected, rel=0.03)


def test_eval_set_is_fixed_and_follows_its_definition():
  val = np.arange(1000, dtype=np.int32) % 50
  a = train.eval_set(val, windows=8, seq_len=20, eps=0.1, seed=5)
  b = train.eval_set(val, windows=8, seq_len=20, eps=0.1, seed=5)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  offsets = np.round(np.linspace(0, 980, 8)).astype(int)
  np.testing.assert_array_equal(a["tokens"], np.stack([val[o:o + 20] for o in offsets]))
  rng = np.random.default_rng(5)
  t = 1.0 - 0.9 * rng.random(8)
  m = rng.random((8, 20)) < t.astype(np.float32)[:, None]
  m[:, 0] = False
  np.testing.assert_allclose(a["t"], t, rtol=1e-6)
  np.testing.assert_array_equal(a["masked"], m)
  logp = train.unigram_log_probs(np.array([0, 0, 1]), 3)
  np.testing.assert_allclose(np.exp(logp), [3 / 6, 2 / 6, 1 / 6])


def _smoke(data_dir):
  c = shakespeare_mdm.get_config("smoke")
  c.dataset.data_dir = str(data_dir)
  return c


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


def test_smoke_config_trains_through_the_shared_trainer(data_dir, tmp_path):
  c = _smoke(data_dir)
  results = train.train_and_evaluate(c, str(tmp_path / "run"))
  history = json.loads((tmp_path / "run" / "evals.json").read_text())
  first, last = history["15"]["eval"], history["30"]["eval"]
  assert set(last) == {"masked_ce", "unigram_ce", "masked_acc", "elbo", "unigram_elbo",
                       "masked_tokens"}
  assert results["eval"] == pytest.approx(last)
  assert last["masked_ce"] < first["masked_ce"] < np.log(c.model.vocab_size)
  assert first["unigram_ce"] == last["unigram_ce"]               # the same fixed positions
  assert 2.5 < last["unigram_ce"] < 4.0                          # character frequencies' loss
  assert last["masked_tokens"] == first["masked_tokens"] > 0
  run = json.loads((tmp_path / "run" / train.RUN_JSON).read_text())
  assert run["mask_id"] == 65 and len(run["vocab"]) == 65
  # The run's config and newest checkpoint are what the benchmark reads back.
  config, _ = train.read_run(str(tmp_path / "run"))
  step, params = trainer.restore_params(train.MaskedDiffusion(), config, str(tmp_path / "run"))
  assert step == 30 and dream.count_params(train.model_config(config)) == sum(
      x.size for x in jax.tree.leaves(params))


def _eval_reference(config, params, val, unigram):
  """The evaluator's numbers from their definitions, in float64 NumPy on the model's logits."""
  model = train.model_config(config)
  es = train.eval_set(val, windows=config.eval_windows, seq_len=config.seq_len, eps=config.eps,
                      seed=config.eval_seed)
  noisy = np.where(es["masked"], config.mask_id, es["tokens"])
  logits = np.asarray(jax.jit(train.model_forward(model))(params, jnp.asarray(noisy)), np.float64)
  logp = _log_softmax64(logits[:, :-1])
  tok = es["tokens"][:, 1:]
  nll = -np.take_along_axis(logp, tok[..., None], -1)[..., 0]
  hit = logits[:, :-1].argmax(-1) == tok
  m, t = es["masked"][:, 1:], es["t"].astype(np.float64)[:, None]
  uni = -unigram[tok]
  n, positions = m.sum(), m.shape[0] * m.shape[1]
  return {"masked_ce": (nll * m).sum() / n, "unigram_ce": (uni * m).sum() / n,
          "masked_acc": (hit * m).sum() / n, "elbo": (nll * m / t).sum() / positions,
          "unigram_elbo": (uni * m / t).sum() / positions, "masked_tokens": float(n)}


@pytest.mark.slow    # make test: a Dream folder read by init_from (the wrong-shape case below)
def test_eval_of_a_dream_folder_through_the_entry_point(data_dir, tmp_path):
  c = _smoke(data_dir)
  model = train.model_config(c)
  folder = tmp_path / "dream_hf"
  random_checkpoint.write_random_checkpoint(str(folder), model, seed=3, num_shards=2,
                                            tokens={"mask_id": c.mask_id})
  wd = tmp_path / "eval"
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.diffucoder.main", "--config=configs/shakespeare_mdm.py:smoke",
       "--mode=eval", f"--workdir={wd}", f"--config.init_from={folder}",
       f"--config.dataset.data_dir={data_dir}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "masked_ce" in proc.stdout
  got = json.loads((wd / "eval_results.json").read_text())
  assert got["source"] == str(folder) and got["step"] == 0
  data = train.text_data(c)
  params = convert.load_params(str(folder), model)
  want = _eval_reference(c, params, data.tokens["val"],
                         train.unigram_log_probs(data.tokens["train"], data.vocab_size))
  for k, v in want.items():
    assert got["eval"][k] == pytest.approx(v, rel=2e-5, abs=1e-6), k
  assert got["eval"]["masked_ce"] > got["eval"]["unigram_ce"]     # random weights know nothing


def test_init_from_a_dream_folder_of_another_shape_names_the_fix(data_dir, tmp_path):
  c = _smoke(data_dir)
  folder = tmp_path / "wide"
  random_checkpoint.write_random_checkpoint(str(folder), train.model_config(c).__class__(
      **{**train.model_config(c).to_dict(), "num_layers": 3}), num_shards=1)
  c.init_from = str(folder)
  with pytest.raises(errors.FormatError, match=r"--config\.model\.num_layers=3"):
    trainer.evaluate(train.MaskedDiffusion(), c, str(tmp_path / "e1"))
  hf = tmp_path / "other_mask"
  random_checkpoint.write_random_checkpoint(str(hf), train.model_config(c), tokens={"mask_id": 64})
  c.init_from = str(hf)
  with pytest.raises(errors.FormatError, match=r"--config\.mask_id=64"):
    trainer.evaluate(train.MaskedDiffusion(), c, str(tmp_path / "e2"))
  c.init_from = str(tmp_path)
  with pytest.raises(errors.ConfigError, match="neither a podlab checkpoint nor a Dream folder"):
    trainer.evaluate(train.MaskedDiffusion(), c, str(tmp_path / "e3"))


def test_trained_table_rows_and_completion_likelihood():
  cfg = dream.tiny_config(vocab_size=16, dtype="float32", param_dtype="float32")
  params = step_speed.random_params(cfg, seed=2)
  mask_id, B, P, N = 15, 2, 4, 8
  rng = np.random.default_rng(0)
  prompt = rng.integers(0, mask_id, (B, P)).astype(np.int32)
  truth = rng.integers(0, mask_id, (B, N)).astype(np.int32)
  variants = [v for v in decodings.compare_variants(N, 4, 0.5)
              if v[0] in ("plain (reference)", "blocks of 4, no cache", "dual cache")]
  rows = decodings.trained_table(cfg, params, prompt, truth, mask_id=mask_id, new_tokens=N,
                                 block_length=4, threshold=0.5, repeats=1, variants=variants)
  assert [r["decoding"] for r in rows] == [v[0] for v in variants] + ["held-out text"]
  for r in rows:
    assert set(decodings.TRAINED_COLUMNS) <= set(r)
  plain = rows[0]
  assert plain["agreement"] == 1.0 and plain["forwards"] == N and plain["forwards_per_token"] == 1.0
  assert rows[2]["forwards_per_token"] == rows[2]["forwards"] / N
  assert rows[-1]["agreement"] == float(np.mean(truth == plain["tokens"]))
  # nll: the chain rule, one canvas per position, from the model's raw logits in float64.
  apply = jax.jit(dream.dream_forward(cfg).apply)
  for r in (plain, rows[-1]):
    y = r["tokens"]
    nll = np.zeros((B, N))
    for b in range(B):
      for j in range(N):
        canvas = np.concatenate([prompt[b], y[b, :j], np.full(N - j, mask_id)]).astype(np.int32)
        logits = np.asarray(apply(params, canvas[None], np.ones((1, P + N), bool)))[0]
        nll[b, j] = -_log_softmax64(logits[P + j - 1])[y[b, j]]
    np.testing.assert_allclose(
        decodings.completion_nll(cfg, params, prompt, y, mask_id=mask_id, rows_per_call=5), nll,
        rtol=1e-5)
    assert r["nll"] == pytest.approx(nll.mean(), rel=1e-5)
