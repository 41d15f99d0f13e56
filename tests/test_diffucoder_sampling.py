"""The masked-diffusion sampler's math (experiments/diffucoder/sampling.py) against numpy references.

No model is needed: schedules, filters, confidences and single steps run on random logits.
"""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import config_utils
from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampler_steps
from experiments.diffucoder import sampling
from experiments.diffucoder import unmasking

MASK = 15


# ------------------------------------------------------------------------------------------------
# Transfer schedule.


def _np_schedule(num_masked, steps, ts):
  """A float32 numpy transcription of the reference's k loop for equal rows."""
  ks, m = [], num_masked
  for i in range(steps):
    t, s = ts[i], ts[i + 1]
    ratio = np.float32(np.float32(1) - s / t)
    k = int(np.float32(m) * ratio) if i < steps - 1 else int(m)
    ks.append(k)
    m -= k
  return ks


def test_schedule_known_examples():
  assert unmasking.transfer_schedule(256, 256) == [0] + [1] * 254 + [2]
  assert unmasking.transfer_schedule(256, 128) == [1] + [2] * 126 + [3]
  assert unmasking.transfer_schedule(512, 512)[0] == 0
  assert sum(unmasking.transfer_schedule(512, 512)) == 512
  assert unmasking.transfer_schedule(5, 1) == [5]


def test_timesteps_match_the_torch_linspace_formula():
  for steps in (1, 2, 3, 7, 64, 255, 256, 512):
    ts = unmasking.timesteps(steps)
    assert ts.dtype == np.float32 and ts.shape == (steps + 1,)
    assert ts[0] == np.float32(1) and ts[-1] == np.float32(1e-3)
    exact = np.linspace(1.0, 1e-3, steps + 1)            # float64
    np.testing.assert_allclose(ts, exact, rtol=2e-7, atol=2e-7)
    assert np.all(np.diff(ts) < 0)


@pytest.mark.parametrize("steps", [1, 2, 5, 16, 37, 50, 100, 128, 200, 256, 512])
def test_schedule_equals_the_formula_for_many_lengths(steps):
  ts = unmasking.timesteps(steps)
  for length in (1, 7, 16, 100, 128, 256, 333, 512, 1000):
    ks = unmasking.transfer_schedule(length, steps)
    assert ks == _np_schedule(length, steps, ts), (length, steps)
    assert sum(ks) == length and min(ks) >= 0


def test_schedule_equals_torch_linspace_where_torch_is_installed():
  torch = pytest.importorskip("torch", reason="torch (the `torch` extra) cross-checks linspace")
  for steps in list(range(1, 70)) + [128, 256, 512, 1024]:
    ts = torch.linspace(1, 1e-3, steps + 1).numpy()
    for length in (steps, 2 * steps, 64, 100, 256, 1000):
      assert unmasking.transfer_schedule(length, steps) == _np_schedule(length, steps, ts)


def test_in_graph_num_transfer_matches_the_host_schedule():
  ratios = unmasking.transfer_ratios(32)
  for rows, counts in (((1,), [64]), ((3,), [40, 40, 40]), ((2,), [10, 31])):
    del rows
    m = sum(counts) / len(counts)
    mask = np.zeros((len(counts), 80), bool)
    for r, c in enumerate(counts):
      mask[r, :c] = True
    for i in (0, 5, 31):
      k = int(unmasking.num_transfer(jnp.asarray(mask), jnp.float32(ratios[i])))
      want = int(np.float32(np.float32(sum(counts)) / np.float32(len(counts))) * ratios[i])
      assert k == want and k == int(np.floor(np.float32(m) * ratios[i]))


# ------------------------------------------------------------------------------------------------
# Filtering and confidences.


def _np_softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_top_p(logits, p):
  out = np.array(logits, np.float32)
  for row in out.reshape(-1, out.shape[-1]):
    order = np.argsort(-row, kind="stable")
    cum = np.cumsum(_np_softmax(row[order]))
    remove = cum > p
    remove[1:] = remove[:-1].copy()
    remove[0] = False
    row[order[remove]] = np.finfo(np.float32).min
  return out


def _np_top_k(logits, k):
  out = np.array(logits, np.float32)
  kth = np.sort(out, axis=-1)[..., -k][..., None]
  out[out < kth] = np.finfo(np.float32).min
  return out


def test_top_p_and_top_k_filters_match_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 50)).astype(np.float32) * 3
  cum = np.cumsum(np.sort(_np_softmax(logits), -1)[..., ::-1], -1)        # float64
  for p in (0.1, 0.5, 0.9, 0.95, 0.999):
    got = np.asarray(unmasking.top_p_filter(jnp.asarray(logits), p))
    # rows whose float64 cumulative mass comes within float32 rounding of p may keep one token more
    # or less; every other row must match exactly (most rows)
    clear = np.all(np.abs(cum - p) > 1e-5, -1)
    assert clear.mean() >= 0.6
    np.testing.assert_array_equal(got[clear], _np_top_p(logits, p)[clear])
    kept = got > np.finfo(np.float32).min
    assert np.all(kept.sum(-1) >= 1)
    probs = _np_softmax(logits)
    # the kept mass is the smallest prefix reaching p
    mass = np.where(kept, probs, 0).sum(-1)
    assert np.all(mass >= p - 1e-6)
  assert np.array_equal(np.asarray(unmasking.top_p_filter(jnp.asarray(logits), 1.0)), logits)
  for k in (1, 2, 7, 50):
    got = np.asarray(unmasking.top_k_filter(jnp.asarray(logits), k))
    np.testing.assert_array_equal(got, _np_top_k(logits, k))
    assert np.all((got > np.finfo(np.float32).min).sum(-1) == k)
  # The fill is the dtype's minimum, not -inf.
  assert np.isfinite(np.asarray(unmasking.top_k_filter(jnp.asarray(logits), 1))).all()


def test_top_k_keeps_ties():
  logits = jnp.array([[1.0, 3.0, 3.0, 2.0]])
  got = np.asarray(unmasking.top_k_filter(logits, 1))
  assert (got > -1e30).tolist() == [[False, True, True, False]]


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.0, None, None), (0.0, 0.9, None),
                                                     (0.7, 0.95, 20), (1.0, None, 5)])
def test_confidences_match_numpy(temperature, top_p, top_k):
  rng = np.random.default_rng(1)
  logits = (rng.normal(size=(2, 6, 40)) * 2).astype(np.float32)
  ref = logits / np.float32(temperature) if temperature > 0 else logits
  if top_p is not None:
    ref = _np_top_p(ref, top_p)
  if top_k is not None:
    ref = _np_top_k(ref, top_k)
  probs = _np_softmax(ref)
  key = jax.random.key(3)
  for alg in ("maskgit_plus", "topk_margin", "entropy", "origin"):
    conf, tok, p_chosen = unmasking.sample_tokens(key, jnp.asarray(logits), temperature=temperature,
                                                  top_p=top_p, top_k=top_k, alg=alg)
    tok = np.asarray(tok)
    if temperature == 0:
      np.testing.assert_array_equal(tok, probs.argmax(-1))
    assert np.all(probs[np.arange(2)[:, None], np.arange(6)[None], tok] > 0)   # never filtered out
    chosen = np.take_along_axis(probs, tok[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(p_chosen), chosen, rtol=1e-5, atol=1e-7)
    if alg in ("maskgit_plus", "origin"):
      want = chosen
    elif alg == "topk_margin":
      top2 = np.sort(probs, -1)[..., ::-1]
      want = top2[..., 0] - top2[..., 1]
    else:
      want = np.sum(probs * np.log(probs + 1e-10), -1)
    np.testing.assert_allclose(np.asarray(conf), want, rtol=1e-5, atol=1e-6)


def test_temperature_sampling_follows_the_filtered_distribution():
  logits = jnp.array([2.0, 1.0, 0.5, -1.0, -3.0])
  n = 40000
  keys = jax.random.split(jax.random.key(0), n)
  draw = jax.vmap(lambda k: unmasking.sample_tokens(k, logits[None], temperature=0.8, top_k=3,
                                                    alg="maskgit_plus")[1][0])
  freq = np.bincount(np.asarray(draw(keys)), minlength=5) / n
  want = _np_softmax(_np_top_k(np.asarray(logits)[None] / 0.8, 3))[0]
  np.testing.assert_allclose(freq, want, atol=0.01)
  assert freq[3] == 0 and freq[4] == 0


def test_shift_logits():
  logits = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
  got = np.asarray(unmasking.shift_logits(logits))
  np.testing.assert_array_equal(got[:, 1:], np.asarray(logits)[:, :-1])
  np.testing.assert_array_equal(got[:, 0], np.asarray(logits)[:, 0])


# ------------------------------------------------------------------------------------------------
# Position selection and steps.


def test_select_transfer_picks_the_k_most_confident_masked():
  conf = jnp.array([[0.9, 0.1, 0.5, 0.7, 0.3], [0.2, 0.8, 0.8, 0.1, 0.6]])
  mask = jnp.array([[False, True, True, True, True], [True, True, False, True, True]])
  got = np.asarray(unmasking.select_transfer(jax.random.key(0), conf, mask, jnp.int32(2)))
  assert got.tolist() == [[False, False, True, True, False], [False, True, False, False, True]]
  # k larger than a row's masked count never selects an unmasked position (never re-masks)
  got = np.asarray(unmasking.select_transfer(jax.random.key(0), conf, mask, jnp.int32(5)))
  np.testing.assert_array_equal(got, np.asarray(mask))


def test_alg_temp_samples_without_replacement_from_softmax():
  conf = jnp.array([[-0.5, -1.0, -2.0, -0.2]])
  mask = jnp.array([[True, True, True, False]])
  alg_temp = 0.5
  n = 30000
  keys = jax.random.split(jax.random.key(1), n)
  pick = jax.vmap(lambda k: unmasking.select_transfer(k, conf, mask, jnp.int32(2), alg_temp)[0])
  sel = np.asarray(pick(keys))
  assert np.all(sel.sum(-1) == 2) and not sel[:, 3].any()
  w = _np_softmax(np.array([-0.5, -1.0, -2.0]) / alg_temp)
  pair = lambda i, j: w[i] * w[j] / (1 - w[i]) + w[j] * w[i] / (1 - w[j])   # sequential draws
  for i, j in ((0, 1), (0, 2), (1, 2)):
    freq = np.mean(sel[:, i] & sel[:, j])
    assert abs(freq - pair(i, j)) < 0.012, (i, j, freq, pair(i, j))


def _step(alg, tokens, logits, ratio, key=0, **kw):
  opts = sampler_options.SamplerOptions(steps=4, alg=alg, **kw)
  region = jnp.ones(tokens.shape, bool)
  return np.asarray(unmasking.unmask_step(jax.random.key(key), jnp.asarray(tokens),
                                          jnp.asarray(logits), region, jnp.float32(ratio), opts,
                                          MASK))


def test_origin_unmasks_each_position_with_probability_ratio():
  b, l = 64, 64
  tokens = np.full((b, l), MASK, np.int32)
  tokens[:, :8] = 3
  logits = np.random.default_rng(0).normal(size=(b, l, 16)).astype(np.float32)
  logits[..., MASK] = -1e9
  out = _step("origin", tokens, logits, 0.3)
  np.testing.assert_array_equal(out[:, :8], 3)                     # never re-masked
  frac = np.mean(out[:, 8:] != MASK)
  assert abs(frac - 0.3) < 0.02
  assert np.all(out[:, 8:][out[:, 8:] != MASK] == logits[:, 8:].argmax(-1)[out[:, 8:] != MASK])
  assert np.all(_step("origin", tokens, logits, 1.0)[:, 8:] != MASK)   # last step: everything


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_confidence_step_unmasks_k_per_row_and_never_remasks(alg):
  rng = np.random.default_rng(2)
  tokens = np.full((3, 12), MASK, np.int32)
  tokens[:, :4] = [1, 2, 3, 4]
  tokens[1, 6] = 9                                                  # an already decoded position
  logits = rng.normal(size=(3, 12, 16)).astype(np.float32) * 3
  logits[..., MASK] = -1e9              # a real model may predict <|mask|>: the position stays masked
  ratio = np.float32(0.5)
  out = _step(alg, tokens, logits, ratio)
  decoded = (tokens == MASK) & (out != MASK)
  m = np.float32(np.sum(tokens == MASK)) / np.float32(3)
  k = int(np.float32(m) * ratio)
  assert decoded.sum(-1).tolist() == [k, k, k]
  np.testing.assert_array_equal(out[tokens != MASK], tokens[tokens != MASK])
  # the decoded positions are the k most confident (numpy) among the masked ones
  # (unmask_step takes logits already shifted: here the random logits play that part)
  conf = np.asarray(unmasking.sample_tokens(jax.random.key(0), jnp.asarray(logits), alg=alg)[0])
  for r in range(3):
    masked = np.flatnonzero(tokens[r] == MASK)
    best = masked[np.argsort(-conf[r, masked], kind="stable")[:k]]
    assert sorted(best.tolist()) == np.flatnonzero(decoded[r]).tolist()


def test_threshold_step_unmasks_the_best_plus_confident_ones():
  tokens = np.full((1, 6), MASK, np.int32)
  logits = np.full((1, 6, 16), -5.0, np.float32)
  # raw logits at j - 1 decide position j: make positions 2 and 4 confident, 5 the best of the rest
  logits[0, 1, 7] = 9.0
  logits[0, 3, 8] = 9.0
  logits[0, 4, 9] = -3.0
  shifted = unmasking.shift_logits(jnp.asarray(logits))
  opts = sampler_options.SamplerOptions(steps=1, alg="maskgit_plus", block_length=6, threshold=0.9)
  region = jnp.array([[False, True, True, True, True, True]])
  out = np.asarray(unmasking.threshold_step(jax.random.key(0), jnp.asarray(tokens), shifted, region,
                                            opts, MASK))
  assert out.tolist() == [[MASK, MASK, 7, MASK, 8, MASK]]
  opts = sampler_options.SamplerOptions(steps=1, alg="maskgit_plus", block_length=6,
                                        threshold=0.99999)
  out = np.asarray(unmasking.threshold_step(jax.random.key(0), jnp.asarray(tokens), shifted, region,
                                            opts, MASK))
  assert (out != MASK).sum() == 1                                   # always at least the best one


# ------------------------------------------------------------------------------------------------
# The loop with a toy model.


def _toy_forward(table, pos_table):
  """Logits that depend only on each token and its position (no mixing between positions)."""
  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    del params, valid
    logits = table[tokens] + pos_table[positions]                   # [B, W, V]
    if return_kv:
      b, w = tokens.shape
      kv = [(jnp.zeros((b, w, 1, 2)), jnp.zeros((b, w, 1, 2)))]
      return logits, kv
    return logits
  return forward


def _toy(seed=0, v=16, length=64):
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(v, v)).astype(np.float32) * 2
  table[:, MASK] = -30.0                                            # never predicts <|mask|>
  table = jnp.asarray(table)
  pos_table = jnp.asarray(rng.normal(size=(length, v)).astype(np.float32) * 2)
  return _toy_forward(table, pos_table)


def test_loop_fills_every_mask_and_keeps_the_prompt():
  forward = _toy()
  prompt, valid = sampling.left_pad([[1, 2, 3], [4]], pad_id=0)
  opts = sampler_options.SamplerOptions(steps=8, alg="entropy")
  out = sampling.generate(forward, None, prompt, valid, jax.random.key(0), opts,
                          max_new_tokens=8, mask_id=MASK)
  assert out.tokens.shape == (2, 11) and out.forwards == 8
  np.testing.assert_array_equal(out.tokens[:, :3], prompt)
  assert not np.any(out.tokens == MASK)


def test_determinism_for_a_seed():
  forward = _toy(1)
  prompt, valid = sampling.left_pad([[1, 2, 3]], pad_id=0)
  for opts in (sampler_options.SamplerOptions(steps=8, alg="entropy", temperature=1.0, top_p=0.95),
               sampler_options.SamplerOptions(steps=8, alg="origin", temperature=1.0),
               sampler_options.SamplerOptions(steps=8, alg="maskgit_plus", temperature=1.0,
                                              alg_temp=0.5)):
    runner = sampling.Runner(forward, opts, mask_id=MASK)          # compiles once
    run = lambda seed: runner.generate(None, prompt, valid, jax.random.key(seed),
                                       max_new_tokens=16).tokens
    a, b, c = run(0), run(0), run(1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("cache,threshold", [("prefix", 0.0), ("dual", 0.0), ("dual", 0.5)])
def test_block_caches_are_exact_for_a_model_without_mixing(cache, threshold):
  """Windows, shifts and the boundary logit: with no attention, every cache equals block decoding."""
  forward = _toy(2)
  prompt, valid = sampling.left_pad([[1, 2, 3, 4], [5, 6]], pad_id=0)
  kw = dict(steps=8, alg="maskgit_plus", block_length=4, threshold=threshold)
  ref = sampling.generate(forward, None, prompt, valid, jax.random.key(0),
                          sampler_options.SamplerOptions(**kw), max_new_tokens=8, mask_id=MASK)
  out = sampling.generate(forward, None, prompt, valid, jax.random.key(0),
                          sampler_options.SamplerOptions(cache=cache, **kw), max_new_tokens=8,
                          mask_id=MASK)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert not np.any(out.tokens == MASK)
  if threshold == 0:
    assert out.forwards == ref.forwards == 8


def test_block_decoding_fills_blocks_left_to_right():
  forward = _toy(3)
  prompt, valid = sampling.left_pad([[1, 2]], pad_id=0)
  opts = sampler_options.SamplerOptions(steps=2, alg="entropy", block_length=4)
  step = sampler_steps.block_fn(forward, opts, mask_id=MASK, start=2)
  tokens = np.concatenate([prompt, np.full((1, 8), MASK, np.int32)], 1)
  v = np.ones_like(tokens, bool)
  pos = np.asarray(sampling.positions_from_valid(jnp.asarray(v)))
  out, n = step(None, jnp.asarray(tokens), v, pos, jax.random.key(0),
                jnp.asarray(unmasking.transfer_ratios(2)), jnp.int32(2))
  out = np.asarray(out)
  assert int(n) == 2
  assert not np.any(out[:, 2:6] == MASK) and np.all(out[:, 6:] == MASK)


def test_options_give_clear_errors():
  with pytest.raises(config_utils.ConfigError, match="generate.alg"):
    sampler_options.SamplerOptions(alg="greedy").validate(16)
  with pytest.raises(config_utils.ConfigError, match="block_length"):
    sampler_options.SamplerOptions(cache="dual").validate(16)
  with pytest.raises(config_utils.ConfigError, match="does not divide"):
    sampler_options.SamplerOptions(steps=16, block_length=5).validate(16)
  with pytest.raises(config_utils.ConfigError, match="generate.steps"):
    sampler_options.SamplerOptions(steps=3, block_length=4).validate(16)


def test_left_pad_and_cut():
  tokens, valid = sampling.left_pad([[5, 6, 7], [8]], pad_id=0)
  assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
  assert valid.tolist() == [[True, True, True], [False, False, True]]
  pos = np.asarray(sampling.positions_from_valid(jnp.asarray(valid)))
  assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]
  assert sampling.cut_at_stop([4, 5, 9, 6, 9], [9]) == [4, 5]
  assert sampling.cut_at_stop([4, 5], [9]) == [4, 5]


def test_module_synopsis_runs():
  body = sampling.__doc__.partition("Synopsis")[2].split(":", 1)[1]
  lines = []
  for line in body.splitlines()[1:]:
    if line and not line.startswith("  "):
      break
    lines.append(line)
  exec(compile(textwrap.dedent("\n".join(lines)), "<sampling synopsis>", "exec"), {})
