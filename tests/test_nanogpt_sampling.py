"""Tests of nanoGPT sampling (experiments/nanogpt/sampling.py): the default is nanoGPT's crop.

The model is context-sensitive on purpose: its weights are scaled x8 so that the greedy token
depends on the exact window (the "chunk" deviation gives other tokens past the block, checked
here). The reference is nanoGPT's `generate` loop written out: condition on the last block_size
tokens, a full forward, the last position's logits; in NumPy on podlab's forward, and in PyTorch on
the nanoGPT-layout model of experiments/nanogpt/tools/torch_reference.py with the same weights.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import sampling
from modules import gpt

T = 16                                   # block_size


@pytest.fixture(scope="module")
def small_model():
  cfg = gpt.GPTConfig(block_size=T, vocab_size=13, n_layer=2, n_head=2, n_embd=16, bias=False)
  model = gpt.GPTModel(cfg)
  params = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, model.init(jax.random.key(3)))
  return model, params


def _crop_loop(model, params, prompt, n):
  """nanoGPT's greedy generate: idx_cond = idx[:, -block_size:], argmax of the last logits."""
  rows = [list(r) for r in np.asarray(prompt)]
  apply = jax.jit(model.apply)                                   # one compile per context length
  for _ in range(n):
    for r in rows:
      ctx = np.array([r[-T:]], np.int32)
      r.append(int(np.argmax(np.asarray(apply(params, ctx))[0, -1])))
  return np.array(rows, np.int32)


# ~50 s; the default past the block is also checked (shorter) by test_prompt_longer_than_the_block
@pytest.mark.slow
def test_default_equals_nanogpt_crop_at_2_5x_the_block(small_model):
  model, params = small_model
  prompt = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
  n = 5 * T // 2 - 3                                             # 40 tokens = 2.5 x block_size
  want = _crop_loop(model, params, prompt, n)
  default = sampling.generate(model, params, prompt, n, temperature=0.0)   # KV cache + crop
  no_cache = sampling.generate(model, params, prompt, n, temperature=0.0, kv_cache=False)
  assert default.shape == (2, 5 * T // 2)
  np.testing.assert_array_equal(default, want)
  np.testing.assert_array_equal(no_cache, want)
  # The model is context-sensitive: the chunk policy (a deviation) changes tokens past the block,
  # and only there.
  chunk = sampling.generate(model, params, prompt, n, temperature=0.0, window="chunk")
  differ = np.flatnonzero((chunk != want).any(0))
  assert differ.size > 5 and differ.min() > T, differ
  assert len(np.unique(want[:, 3:])) > 3                           # not a constant output


def test_prompt_longer_than_the_block(small_model):
  model, params = small_model
  prompt = np.arange(1, 21, dtype=np.int32)[None] % 13           # 20 tokens > block_size 16
  want = _crop_loop(model, params, prompt, 12)
  for cache in (True, False):
    np.testing.assert_array_equal(
        sampling.generate(model, params, prompt, 12, temperature=0.0, kv_cache=cache), want)
  # A prompt of exactly block_size tokens: one cached token, then the crop.
  prompt = prompt[:, :T]
  np.testing.assert_array_equal(sampling.generate(model, params, prompt, 5, temperature=0.0),
                                _crop_loop(model, params, prompt, 5))


def test_default_equals_the_torch_nanogpt_loop(small_model):
  torch = pytest.importorskip("torch", reason="the PyTorch cross-check needs torch ('.[torch]')")
  from experiments.nanogpt.tools import torch_reference  # pylint: disable=g-import-not-at-top
  model, params = small_model
  cfg = model.config
  ref = torch_reference.GPT(dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                 block_size=T, vocab_size=cfg.vocab_size, bias=False))
  sd = nanogpt_checkpoint.to_state_dict(params, cfg)
  ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
  idx = torch.tensor([[7, 1]])
  with torch.no_grad():
    for _ in range(38):                                          # nanoGPT's generate, top_k = 1
      logits = ref(idx[:, -T:])[:, -1, :]
      idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
  got = sampling.generate(model, params, np.array([[7, 1]], np.int32), 38, temperature=1.0, top_k=1)
  np.testing.assert_array_equal(got, idx.numpy())


def test_cache_and_no_cache_agree_for_each_policy_and_seed(small_model):
  model, params = small_model
  prompt = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
  for window in sampling.WINDOWS:
    kw = dict(temperature=0.8, top_k=5, seed=7, window=window)
    a = sampling.generate(model, params, prompt, 40, kv_cache=True, **kw)
    b = sampling.generate(model, params, prompt, 40, kv_cache=False, **kw)
    np.testing.assert_array_equal(a, b)
    assert (a[:, :3] == prompt).all()
  greedy = sampling.generate(model, params, prompt, 40, temperature=0.0, window="chunk")
  np.testing.assert_array_equal(
      greedy, sampling.generate(model, params, prompt, 40, temperature=0.0, window="chunk",
                                kv_cache=False))
  np.testing.assert_array_equal(                               # top-k 1 == greedy
      greedy, sampling.generate(model, params, prompt, 40, temperature=1.0, top_k=1,
                                window="chunk"))
  # Within block_size tokens of context every policy is the same.
  exact = sampling.generate(model, params, prompt, 13, temperature=0.0)
  np.testing.assert_array_equal(exact, greedy[:, :16])


def test_bad_options_give_clear_errors(small_model):
  model, params = small_model
  prompt = np.array([[1]], np.int32)
  with pytest.raises(ValueError, match="window='slide'"):
    sampling.generate(model, params, prompt, 2, window="slide")
  with pytest.raises(ValueError, match="keep=4 is an option of window='chunk'"):
    sampling.generate(model, params, prompt, 2, keep=4)
  with pytest.raises(ValueError, match=r"keep=17: must be in \[1, block_size=16\]"):
    sampling.generate(model, params, prompt, 2, window="chunk", keep=17)
  with pytest.raises(ValueError, match="prompt must be"):
    sampling.generate(model, params, np.zeros((1, 0), np.int32), 2)


def test_top_k_keeps_logits_at_least_the_kth():
  logits = jnp.array([[0.0, 3.0, 1.0, 2.0]])
  draws = {int(sampling.select(logits, jax.random.key(i), 1.0, 2)[0]) for i in range(200)}
  assert draws == {1, 3}
