"""experiments/nanogpt/torch_rng.py: nanoGPT's random draws replayed without torch.

Against torch itself (skipped without it: pip install '.[torch]'): raw/uniform/normal/randint draws,
nanoGPT's initial weights (the construction + _init_weights + c_proj order, as train.py runs it) and
the batch order of train.py's get_batch calls (prefetch, eval batches, gradient accumulation).
Without torch: the mt19937 reference outputs and the Box-Muller statistics.
"""

import math

import numpy as np
import pytest

from experiments.common import layout as layout_lib
from experiments.nanogpt import torch_rng
from modules import gpt


def _torch():
  return pytest.importorskip("torch", reason="the comparison with torch needs torch "
                                             "(pip install '.[torch]')")


def test_mt19937_matches_the_reference_outputs():
  # init_genrand(5489): the 1st output is 3499211612 and the 10,000th 4123659995 (C++ std::mt19937).
  g = torch_rng.Generator(5489)
  r = g.raw(10000)
  assert int(r[0]) == 3499211612 and int(r[-1]) == 4123659995
  assert g.draws == 10000


def test_normal_statistics_and_tail_recompute():
  g = torch_rng.Generator(0)
  x = g.normal(200_000, 0.0, 1.0).astype(np.float64)
  assert abs(x.mean()) < 0.01 and abs(x.std() - 1.0) < 0.01
  assert g.draws == 200_000
  g = torch_rng.Generator(0)
  y = g.normal(40, 3.0, 0.5)                       # 40 = 2 blocks + 8: the last 16 are redrawn
  assert g.draws == 56 and y.dtype == np.float32 and abs(float(y.mean()) - 3.0) < 0.5
  with pytest.raises(ValueError, match="16 elements"):
    g.normal(8)


def test_draws_match_torch():
  torch = _torch()
  for seed in (0, 1337, 2**40 + 3):
    torch.manual_seed(seed)
    g = torch_rng.Generator(seed)
    np.testing.assert_array_equal(g.randint(1003790, 12), torch.randint(1003790, (12,)).numpy())
    t = torch.empty(1000)
    t.uniform_()
    np.testing.assert_array_equal(g.uniform(1000), t.numpy())
    for n in (16, 8330, 8337):                    # whole blocks, and a recomputed tail
      t = torch.empty(n)
      t.normal_(0.0, 0.02)
      np.testing.assert_allclose(g.normal(n, 0.0, 0.02), t.numpy(), rtol=0, atol=2e-7)
    np.testing.assert_array_equal(g.randint(2**33 + 7, 9), torch.randint(2**33 + 7, (9,)).numpy())
    np.testing.assert_array_equal(g.randint(111476, 50), torch.randint(111476, (50,)).numpy())


def _torch_nanogpt_init(torch, cfg, seed):
  from experiments.nanogpt.tools import torch_reference as torch_gpt_reference  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  model = torch_gpt_reference.init_like_nanogpt(torch_gpt_reference.GPT(cfg.model_args()),
                                                cfg.n_layer)
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("bias", [False, True])
def test_init_matches_nanogpt_in_torch(bias):
  torch = _torch()
  cfg = gpt.GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, bias=bias)
  ref = _torch_nanogpt_init(torch, cfg, 1337)
  after = torch.randint(1003790, (12,)).numpy()    # the first batch: the stream position matches
  g = torch_rng.Generator(1337)
  sd = torch_rng.init_state_dict(cfg, g)
  assert set(ref) - set(sd) == {"lm_head.weight"}
  for k, v in sd.items():
    np.testing.assert_allclose(v, ref[k], rtol=0, atol=2e-7, err_msg=k)
  np.testing.assert_array_equal(g.randint(1003790, 12), after)
  # The residual projections have the scaled std; the Haiku tree is the import of this state_dict.
  std = float(np.std(sd["transformer.h.0.mlp.c_proj.weight"]))
  assert abs(std - 0.02 / math.sqrt(8)) < 0.0005
  params, draws = torch_rng.init_params(cfg, 1337)
  assert draws == g.draws - 12
  np.testing.assert_array_equal(params["gpt/h_0/attn/qkv_proj"]["w"],
                                sd["transformer.h.0.attn.c_attn.weight"].T)


def test_batch_stream_is_nanogpt_get_batch_order():
  torch = _torch()
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16, bias=False)
  _, draws = torch_rng.init_params(cfg, 7)
  T, B, A, every, E = 8, 4, 3, 5, 2
  train, val = np.arange(5000) % 11, (np.arange(700) * 7) % 11
  kw = dict(block_size=T, layout=layout_lib.of(B, devices_per_host=1, accum=A),
            eval_interval=every, eval_iters=E, init_draws=draws, seed=7)
  stream = torch_rng.BatchStream(train, val, **kw)
  # train.py: X, Y = get_batch('train') before the loop; per iteration the eval batches (train
  # split then val) when it % eval_interval == 0, then per micro-step forward + get_batch('train').
  torch.manual_seed(7)
  torch.empty(draws).uniform_()                     # exactly `draws` outputs (one per element)
  get = lambda n: torch.randint(n - T, (B,)).numpy()  # noqa: E731
  micro, evals = [get(len(train))], {}
  for it in range(12):
    if it % every == 0:
      evals[it] = ([get(len(train)) for _ in range(E)], [get(len(val)) for _ in range(E)])
    micro += [get(len(train)) for _ in range(A)]
  for it in range(12):
    np.testing.assert_array_equal(stream.offsets(it), np.stack(micro[it * A:(it + 1) * A]))
    batch = stream.train(it)
    assert batch["x"].shape == (1, A, B, T) and batch["x"].dtype == np.int32
    np.testing.assert_array_equal(batch["x"][0, :, :, 0], train[stream.offsets(it)])
    np.testing.assert_array_equal(batch["y"][0, :, :, :-1], batch["x"][0, :, :, 1:])
    if it in evals:
      for split, tokens, want in (("train", train, evals[it][0]), ("val", val, evals[it][1])):
        got = stream.eval(it, split)
        assert len(got) == E
        for e in range(E):
          np.testing.assert_array_equal(got[e]["x"][0, 0, :, 0], tokens[want[e]])
    else:
      with pytest.raises(ValueError, match="no evaluation"):
        stream.eval(it, "val")
  # Resuming at iteration 9 (a fresh stream) gives the same batches; so does going back.
  np.testing.assert_array_equal(torch_rng.BatchStream(train, val, **kw).offsets(9),
                                np.stack(micro[27:30]))
  np.testing.assert_array_equal(stream.offsets(2), np.stack(micro[6:9]))


def test_batch_stream_hosts_and_devices_split_the_global_batch():
  train, val = np.arange(3000), np.arange(500)
  kw = dict(block_size=8, eval_interval=3, eval_iters=2, init_draws=100, seed=3)
  one = layout_lib.of(8, devices_per_host=1, accum=2)
  whole = torch_rng.BatchStream(train, val, layout=one, **kw).train(4)["x"]    # [1, 2, 8, 8]
  parts = [torch_rng.BatchStream(train, val, **kw, layout=layout_lib.of(
      8, devices_per_host=2, hosts=2, process_index=p, accum=2)).train(4)["x"] for p in range(2)]
  assert parts[0].shape == (2, 2, 2, 8)                                    # [D, A, b, T]
  joined = np.concatenate([p.transpose(1, 0, 2, 3).reshape(2, 4, 8) for p in parts], axis=1)
  np.testing.assert_array_equal(joined, whole[0])
  with pytest.raises(ValueError, match="block_size=8: the val split has only 5 tokens"):
    torch_rng.BatchStream(train, val[:5], layout=one, **kw)
