"""`block_algorithm="fast_dllm"` (experiments/diffucoder/sampling.py) against Fast-dLLM's published
Dream generation loop, re-implemented here in float64 NumPy.

`_fast_dllm` below is written from the behaviour of Fast-dLLM's `dream/model/generation_utils_block.py`
(`_sample` with `block_length`, `dual_cache`, `threshold`; NVlabs/Fast-dLLM), not from podlab code:
per block one full forward over the canvas, whose shifted logits fix the block's first position;
the keys/values before the block (prefix cache) or all but the block's (dual cache) are kept; then
forwards on the window (the block and what follows it, or the block alone), the logits shifted
inside the window. With a threshold ("confidence_threshold", batch 1): the most probable masked
position plus every one whose probability >= threshold. Without: the schedule continues at i = 1 of
linspace(1, eps, steps_per_block + 1) in float32 (torch.linspace), k = int(M (1 - s/t)) (int(M) at
the last step), confidence = sum p log(p + 1e-10) (entropy, whatever the alg), top-k; at i =
steps_per_block the forward is made and the loop breaks. A block ends when it has no mask left. The
model forward is tests/dream_numpy_reference.py (float64, Hugging Face tensors; the keys/values of
a prefix or dual cache are its own returned keys/values).

The tiny random model's output head is scaled (confident predictions, so that thresholds fire) and
its <|mask|> row zeroed (a random model may otherwise predict <|mask|>, which Fast-dLLM writes back).
"""
import jax
import numpy as np
import pytest

import dream_numpy_reference as ref
from experiments.common import config_utils
from experiments.diffucoder import convert
from experiments.diffucoder import generate
from experiments.diffucoder import hf_layout
from experiments.diffucoder import random_checkpoint
from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampling
from modules import dream

torch = pytest.importorskip("torch", reason="Fast-dLLM's schedule is torch.linspace (pip '.[torch]')")

MASK = 259
CFG = dream.tiny_config(dtype="float32", param_dtype="float32")


@pytest.fixture(scope="module")
def model():
  tensors = {}
  for i, (name, shape) in enumerate(hf_layout.hf_tensor_specs(CFG)):
    tensors[name] = random_checkpoint.random_tensor(name, shape, i, seed=4)
  head = tensors["lm_head.weight"] * 6.0                     # [V, D]: confident predictions
  head[MASK] = 0.0                                           # never <|mask|>
  tensors["lm_head.weight"] = head
  params = convert.params_from_tensors(lambda n: tensors[n], CFG)
  return tensors, params


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _shift(logits):
  return np.concatenate([logits[:, :1], logits[:, :-1]], axis=1)


def _fast_dllm(tensors, prompt, gen_length, block_length, steps, threshold, cache, eps=1e-3):
  """Fast-dLLM's Dream loop (greedy), float64. cache: "prefix", "dual" or "none" (every forward on
  the whole canvas: not in Fast-dLLM, the loop its caches approximate). Returns (x, forwards)."""
  get = tensors.__getitem__
  B, P = prompt.shape
  x = np.concatenate([prompt, np.full((B, gen_length), MASK)], axis=1)
  L = x.shape[1]
  valid = np.ones((B, L), bool)
  num_blocks = gen_length // block_length
  assert steps % num_blocks == 0
  spb = steps // num_blocks
  ts = torch.linspace(1, eps, spb + 1).numpy()                     # float32
  forwards = 0
  for nb in range(num_blocks):
    s0 = P + nb * block_length
    e0 = s0 + block_length
    out = ref.forward(get, CFG, x, valid)
    forwards += 1
    x[:, s0] = _shift(out["logits"])[:, s0].argmax(-1)              # the refresh fixes s0
    if cache == "dual":
      keep = np.r_[0:s0, e0:L]
      w0, w1 = s0, e0
    elif cache == "prefix":
      keep = np.arange(s0)
      w0, w1 = s0, L
    ctx = None
    if cache != "none":
      ctx = ([k[:, keep] for k in out["k"]], [v[:, keep] for v in out["v"]], valid[:, keep])
    i = 1
    while True:
      if cache == "none":
        logits = _shift(ref.forward(get, CFG, x, valid)["logits"])[:, s0:e0]
      else:
        pos = np.broadcast_to(np.arange(w0, w1), (B, w1 - w0))
        win = ref.forward(get, CFG, x[:, w0:w1], valid[:, w0:w1], positions=pos, context=ctx)
        logits = _shift(win["logits"])[:, :block_length]            # shifted inside the window
      forwards += 1
      probs = _softmax(logits)                                      # [B, bl, V]
      x0 = probs.argmax(-1)
      blk = x[:, s0:e0]                                             # a view: writes go to x
      masked = blk == MASK
      if threshold:
        assert B == 1                                               # Fast-dLLM's branch: batch 1
        conf = np.where(masked[0], probs[0].max(-1), -np.inf)
        order = np.argsort(-conf, kind="stable")[:masked.sum()]
        take = [order[0]] + [j for j in order[1:] if conf[j] >= threshold]
        blk[0, take] = x0[0, take]
      else:
        if i == spb:
          break
        t, s = ts[i], ts[i + 1]
        m = np.float32(masked.sum()) / np.float32(B)
        k = int(m * (np.float32(1) - s / t)) if i < spb - 1 else int(m)
        conf = np.where(masked, np.sum(probs * np.log(probs + 1e-10), -1), -np.inf)
        if k > 0:
          for r in range(B):
            take = np.argsort(-conf[r], kind="stable")[:k]
            blk[r, take] = x0[r, take]
        i += 1
      if not (x[:, s0:e0] == MASK).any():
        break
  return x, forwards


_RUNNERS = {}


def _podlab(params, prompt, gen_length, block_length, steps, threshold, cache,
            block_algorithm="fast_dllm"):
  opts = sampler_options.SamplerOptions(steps=steps, alg="entropy", block_length=block_length,
                                        cache=cache, threshold=threshold,
                                        block_algorithm=block_algorithm)
  if opts not in _RUNNERS:                                 # compiled once per options and shape
    _RUNNERS[opts] = sampling.Runner(generate.model_forward(CFG), opts, mask_id=MASK)
  out = _RUNNERS[opts].generate(params, prompt, np.ones(prompt.shape, bool), jax.random.key(0),
                                max_new_tokens=gen_length)
  return out.tokens, out.forwards


PROMPTS = np.array([[3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2, 8]])


CACHES = ["prefix", "dual", pytest.param("none", marks=pytest.mark.slow)]   # "none": podlab's own


@pytest.mark.parametrize("cache", CACHES)
def test_entropy_branch_equals_fast_dllm(model, cache):
  tensors, params = model
  want, n_want = _fast_dllm(tensors, PROMPTS, 16, 8, 16, None, cache)     # 2 blocks, 8 steps each
  got, n_got = _podlab(params, PROMPTS, 16, 8, 16, 0.0, cache)
  np.testing.assert_array_equal(got, want)
  assert n_got == n_want == 16 and not (got == MASK).any()


@pytest.mark.parametrize("cache", CACHES)
def test_threshold_branch_equals_fast_dllm(model, cache):
  tensors, params = model
  fired = 0
  for row in PROMPTS:
    prompt = row[None]
    want, n_want = _fast_dllm(tensors, prompt, 16, 8, 2, 0.5, cache)       # steps = blocks
    got, n_got = _podlab(params, prompt, 16, 8, 2, 0.5, cache)
    np.testing.assert_array_equal(got, want)
    assert n_got == n_want
    fired += 2 * 8 - n_want                          # forwards saved by parallel unmasking
  assert fired > 0
  if cache != "dual":
    return
  # Fast-dLLM's branch handles one row; podlab applies it to each row of a batch independently.
  both, _ = _podlab(params, PROMPTS, 16, 8, 2, 0.5, cache)
  for r, row in enumerate(PROMPTS):
    np.testing.assert_array_equal(both[r], _podlab(params, row[None], 16, 8, 2, 0.5, cache)[0][0])


def test_fast_dllm_is_not_podlabs_variant(model):
  _, params = model
  fast, _ = _podlab(params, PROMPTS, 16, 8, 16, 0.0, "prefix")
  own, _ = _podlab(params, PROMPTS, 16, 8, 16, 0.0, "prefix", block_algorithm="podlab")
  assert (fast != own).any()


def test_fast_dllm_options_give_clear_errors():
  opts = lambda **kw: sampler_options.SamplerOptions(**{
      "steps": 16, "alg": "entropy", "block_length": 8, "cache": "prefix",
      "block_algorithm": "fast_dllm", **kw})
  opts().validate(16)
  with pytest.raises(config_utils.ConfigError, match="block_algorithm='fast_dllm'.*block_length"):
    opts(block_length=0, cache="none").validate(16)
  with pytest.raises(config_utils.ConfigError, match="generate.alg='maskgit_plus'.*entropy"):
    opts(alg="maskgit_plus").validate(16)
  with pytest.raises(config_utils.ConfigError, match=r"generate.steps=2: gives 1 step per block"):
    opts(steps=2).validate(16)
  with pytest.raises(config_utils.ConfigError, match="not divisible by the 2 blocks"):
    opts(steps=3, threshold=0.9).validate(16)
  with pytest.raises(config_utils.ConfigError, match="block_algorithm='fastdllm'"):
    opts(block_algorithm="fastdllm").validate(16)
