"""Tests of the nanoGPT experiment: LR schedule, AdamW + decay mask + clipping, gradient
accumulation, nanoGPT checkpoint import, a short training run, and the pod launcher running it
(sampling: tests/test_nanogpt_sampling.py).

Expected values are the formulas of docs/nanogpt.md evaluated here in float64 NumPy
(or the PyTorch reference model of experiments/nanogpt/tools/torch_reference.py for the import).
"""
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import device_step
from experiments.common import parallel
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import train
from experiments.nanogpt.configs import shakespeare_char_cpu
from modules import gpt

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_lr_schedule_values_cpu_recipe():
  c = shakespeare_char_cpu.get_config()            # lr 1e-3, min 1e-4, warmup 100, decay 2000
  assert train.lr_at(0, c) == pytest.approx(1e-3 * 1 / 101)
  assert train.lr_at(99, c) == pytest.approx(1e-3 * 100 / 101)
  assert train.lr_at(100, c) == pytest.approx(1e-3)
  assert train.lr_at(1050, c) == pytest.approx(1e-4 + 0.5 * 9e-4)
  assert train.lr_at(2000, c) == pytest.approx(1e-4)
  assert train.lr_at(2001, c) == pytest.approx(1e-4)
  its = np.array([0, 50, 99, 100, 500, 1050, 1999, 2000, 2500])
  got = np.asarray(train.lr_at(jnp.asarray(its), c))
  np.testing.assert_allclose(got, [train.lr_at(int(i), c) for i in its], rtol=1e-6)


def _np_adamw(p, g, m, v, t, lr, b1, b2, wd, decay, clip):
  norm = math.sqrt(sum(float((x ** 2).sum()) for x in g.values()))
  scale = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
  out = {}
  for k in p:
    gk = g[k] * scale
    m[k] = b1 * m[k] + (1 - b1) * gk
    v[k] = b2 * v[k] + (1 - b2) * gk ** 2
    mh, vh = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
    out[k] = p[k] - lr * (mh / (np.sqrt(vh) + 1e-8) + (wd * p[k] if decay[k] else 0.0))
  return out


def test_adamw_decay_mask_and_clipping_match_numpy():
  c = shakespeare_char_cpu.get_config()
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, bias=True)
  params = gpt.GPTModel(cfg).init(jax.random.key(0))
  tx = train.make_optimizer(c)
  state = tx.init(params)
  rng = np.random.default_rng(0)
  flat = lambda t: {f"{m}/{n}": np.asarray(v, np.float64) for m, d in t.items() for n, v in d.items()}  # noqa: E731
  p64 = flat(params)
  m = {k: 0.0 * v for k, v in p64.items()}
  v2 = {k: 0.0 * v for k, v in p64.items()}
  decay = flat(gpt.decay_mask(params))
  for t in range(1, 4):
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 2.0, x.shape), jnp.float32), params)
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda a, b: a + b, params, updates)
    p64 = _np_adamw(p64, flat(grads), m, v2, t, train.lr_at(t - 1, c), 0.9, 0.99, 0.1,
                    {k: bool(x) for k, x in decay.items()}, 1.0)
    for k, x in flat(params).items():
      np.testing.assert_allclose(x, p64[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_gradient_accumulation_equals_the_big_batch():
  c = shakespeare_char_cpu.get_config()
  c.model.block_size = 8
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, bias=False)
  model = gpt.GPTModel(cfg)
  tx = train.make_optimizer(c)
  params = model.init(jax.random.key(0))
  n = jax.local_device_count()
  x = np.random.default_rng(1).integers(0, 11, (n, 4, 2, 9)).astype(np.int32)
  outs = []
  for accum, batch in ((4, x), (1, x.reshape(n, 1, 8, 9))):
    c.grad_accum = accum
    step = device_step.parallel_train_step(train.make_train_step(model, tx, c, accum), c.nonfinite,
                                           seed=c.seed, donate=False)
    state = parallel.replicate(train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params)))
    b = parallel.shard({"x": batch[..., :-1], "y": batch[..., 1:]})
    new, _, sums = step(state, None, b, parallel.shard(parallel.device_indices()))
    outs.append((parallel.unreplicate(new.params), float(parallel.first_local(sums["loss"])[0])))
  (pa, la), (pb, lb) = outs
  assert la == pytest.approx(lb, rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), pa, pb)


def test_train_steps_match_a_torch_nanogpt_step():
  """5 updates of our pmapped step == nanoGPT's loop in PyTorch on the same params and batches.

  torch side (experiments/nanogpt/tools/torch_reference.py + train.py's optimisation): AdamW with the >= 2-dim decay
  group, lr set per iteration by get_lr (warm-up, cosine, then min_lr), 2 micro-steps of loss / 2
  backward, clip_grad_norm_ on the accumulated gradient (clipping active), optimizer.step.
  """
  torch = pytest.importorskip(
      "torch", reason="the torch comparison needs torch (pip install '.[torch]')")
  from experiments.nanogpt.tools import torch_reference as torch_gpt_reference  # pylint: disable=g-import-not-at-top
  c = shakespeare_char_cpu.get_config()
  c.lr, c.min_lr, c.warmup_iters, c.lr_decay_iters = 1e-2, 1e-3, 1, 3   # its 0..4: all branches
  c.grad_clip, c.grad_accum = 0.1, 2
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, bias=False)
  model, tx = gpt.GPTModel(cfg), train.make_optimizer(c)
  params = model.init(jax.random.key(0))
  ref = torch_gpt_reference.GPT(cfg.model_args())
  ref.load_state_dict({k: torch.tensor(np.asarray(v))
                       for k, v in nanogpt_checkpoint.to_state_dict(params, cfg).items()})
  named = dict(ref.named_parameters())
  decay = [p for p in named.values() if p.dim() >= 2]
  no_decay = [p for p in named.values() if p.dim() < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=c.lr, betas=(c.beta1, c.beta2), eps=1e-8)
  n = jax.local_device_count()
  step = device_step.parallel_train_step(train.make_train_step(model, tx, c, c.grad_accum),
                                         c.nonfinite, seed=c.seed, donate=False)
  state = parallel.replicate(train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params)))
  rng = np.random.default_rng(0)
  for it in range(5):
    w = rng.integers(0, 11, (2, 4 * n, 9))                       # [A, B, T + 1]: A micro-steps
    batch = w.reshape(2, n, 4, 9).transpose(1, 0, 2, 3).astype(np.int32)   # [D, A, b, T + 1]
    state, _, sums = step(state, None, parallel.shard({"x": batch[..., :-1], "y": batch[..., 1:]}),
                       parallel.shard(parallel.device_indices()))
    if it < c.warmup_iters:                                      # the doc's get_lr, written out
      lr = c.lr * (it + 1) / (c.warmup_iters + 1)
    elif it > c.lr_decay_iters:
      lr = c.min_lr
    else:
      ratio = (it - c.warmup_iters) / (c.lr_decay_iters - c.warmup_iters)
      lr = c.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c.lr - c.min_lr)
    for group in opt.param_groups:
      group["lr"] = lr
    for micro in w:
      logits = ref(torch.as_tensor(micro[:, :-1]))
      loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11),
                                               torch.as_tensor(micro[:, 1:]).reshape(-1)) / 2
      loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), c.grad_clip))
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert norm > c.grad_clip                                    # the clipping is exercised
    assert float(parallel.first_local(sums["grad_norm"])[0]) == pytest.approx(norm, rel=1e-4)
  got = nanogpt_checkpoint.to_state_dict(parallel.unreplicate(state.params), cfg)
  for k, v in ref.state_dict().items():
    np.testing.assert_allclose(got[k], v.numpy(), rtol=0, atol=2e-6, err_msg=k)


def test_nanogpt_checkpoint_import_matches_torch(tmp_path):
  torch = pytest.importorskip("torch", reason="the import test needs torch (pip install '.[torch]')")
  from experiments.nanogpt.tools import torch_reference as torch_gpt_reference  # pylint: disable=g-import-not-at-top
  for bias in (True, False):
    args = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=bias, dropout=0.0)
    torch.manual_seed(0)
    ref = torch_gpt_reference.GPT(args)
    with torch.no_grad():
      for p in ref.parameters():
        p.add_(torch.randn_like(p) * 0.1)
    sd = {f"_orig_mod.{k}": v for k, v in ref.state_dict().items()}  # a torch.compile'd model
    path = tmp_path / f"ckpt_{bias}.pt"
    torch.save({"model": sd, "model_args": args, "iter_num": 250, "best_val_loss": torch.tensor(1.5),
                "config": {"dataset": "shakespeare_char"}}, path)
    config, params, meta = nanogpt_checkpoint.load(str(path))
    assert meta["iter_num"] == 250 and meta["best_val_loss"] == 1.5 and config.bias == bias
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    with torch.no_grad():
      want = ref(torch.as_tensor(idx)).double().numpy()
    got = np.asarray(gpt.GPTModel(config).apply(params, idx.astype(np.int32)), np.float64)
    np.testing.assert_allclose(got, want, atol=2e-5)
    back = nanogpt_checkpoint.to_state_dict(params, config)
    for k, v in ref.state_dict().items():
      np.testing.assert_array_equal(back[k], v.numpy())
  bad = tmp_path / "bad.pt"
  torch.save({"model": {"x": torch.zeros(1)}, "model_args": args}, bad)
  with pytest.raises(nanogpt_checkpoint.CheckpointFormatError, match="transformer.wte.weight"):
    nanogpt_checkpoint.load(str(bad))


@pytest.mark.slow    # ~55 s: a podlab run and nanoGPT in torch (one step: make test)
def test_torch_rng_run_is_nanogpt_run_in_torch(tmp_path):
  """config.rng="torch": our trainer's eval curve == nanoGPT's train.py loop re-enacted in torch.

  torch side: torch.manual_seed(seed), GPT built and initialised as nanoGPT's, first batch fetched
  before the loop, eval_iters batches per split at it % eval_interval == 0 (before the update),
  forward, next batch, backward, clip, AdamW step; max_iters + 1 updates. Ours stops after 4
  updates and resumes from its checkpoint.
  """
  torch = pytest.importorskip(
      "torch", reason="the torch comparison needs torch (pip install '.[torch]')")
  from experiments.nanogpt.tools import torch_reference as torch_gpt_reference  # pylint: disable=g-import-not-at-top
  c = shakespeare_char_cpu.get_config("smoke")           # 4 x 4 x 128, block 64, batch 12
  c.dataset.data_dir = str(tmp_path / "tfds")
  c.async_checkpoints = False
  c.max_iters, c.eval_interval, c.eval_iters, c.grad_accum = 3, 3, 2, 2
  assert c.rng == "torch"
  train.train_and_evaluate(c, str(tmp_path / "work"))        # 4 updates, then resumed to 7:
  c.max_iters = 6                                            # the stream replays to iteration 4
  c.allow_config_change = True
  ours = train.train_and_evaluate(c, str(tmp_path / "work"))["val_curve"]

  data = train.text_data(c)
  splits = {"train": data.tokens["train"], "val": data.tokens["val"]}
  T, B, A = c.model.block_size, c.global_batch_size, c.grad_accum
  torch.manual_seed(c.seed)
  args = dict(n_layer=4, n_head=4, n_embd=128, block_size=T, vocab_size=65, bias=False)
  model = torch_gpt_reference.init_like_nanogpt(torch_gpt_reference.GPT(args), 4)
  named = dict(model.named_parameters())
  opt = torch.optim.AdamW(
      [{"params": [p for p in named.values() if p.dim() >= 2], "weight_decay": c.weight_decay},
       {"params": [p for p in named.values() if p.dim() < 2], "weight_decay": 0.0}],
      lr=c.lr, betas=(c.beta1, c.beta2), eps=1e-8)

  def get_batch(split):
    d = splits[split]
    ix = torch.randint(len(d) - T, (B,)).numpy()
    w = torch.as_tensor(np.stack([d[i:i + T + 1] for i in ix]).astype(np.int64))
    return w[:, :-1], w[:, 1:]

  def loss_of(x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

  theirs = {}
  x, y = get_batch("train")
  for it in range(c.max_iters + 1):
    for group in opt.param_groups:
      group["lr"] = train.lr_at(it, c)
    if it % c.eval_interval == 0:
      with torch.no_grad():
        losses = {s: float(np.mean([loss_of(*get_batch(s)).item() for _ in range(c.eval_iters)]))
                  for s in ("train", "val")}
      theirs[it] = losses["val"]
    for _ in range(A):
      loss = loss_of(x, y) / A
      x, y = get_batch("train")
      loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
  assert sorted(ours) == sorted(theirs) == [0, 3, 6]
  for it in theirs:
    assert ours[it] == pytest.approx(theirs[it], abs=2e-4), it
  assert ours[6] < ours[0] - 0.3


@pytest.mark.slow    # ~40 s here: 21 updates + 3 evaluations + a resume
def test_short_training_run_lowers_val_loss(tmp_path):
  """rng="stateless" (tf.data Philox windows; the default "torch" stream is tested against torch
  in test_torch_rng_run_is_nanogpt_run_in_torch): a short run learns and resumes."""
  c = shakespeare_char_cpu.get_config("smoke")
  c.rng = "stateless"
  c.dataset.data_dir = str(tmp_path / "tfds")
  c.async_checkpoints = False
  results = train.train_and_evaluate(c, str(tmp_path / "work"))
  val = results["val_curve"]
  assert sorted(val) == [0, 10, 20]
  assert val[0] == pytest.approx(math.log(65), abs=0.15)        # a fresh model is ~uniform
  assert val[20] < val[0] - 0.8
  assert results["num_params"] == 795_904
  # Rerunning the same command resumes from the final checkpoint and trains nothing more.
  again = train.train_and_evaluate(c, str(tmp_path / "work"))
  assert again["val_curve"] == val


def test_pod_launcher_runs_the_nanogpt_main(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PODLAB_", "FAKE_"))}
  env.update(PATH=f"{REPO / 'tests' / 'fake_gcloud'}:{env['PATH']}", PODLAB_BUCKET="bkt",
             FAKE_GCLOUD_ROOT=str(tmp_path / "cloud"))
  # A hang guard, not a deadline: 7 s alone, 33 s with 0.15 of a CPU, over 600 s once in a suite run
  # while the shared machine stalled on memory.
  proc = subprocess.run([str(REPO / "launch" / "pod.sh"), "stable-1", "--dry-run", "--module",
                         "experiments.nanogpt.main", "--config", "configs/v4_32.py", "--",
                         "--config.lr=3e-4"], env=env, capture_output=True, text=True, timeout=1200,
                        cwd=REPO)
  assert proc.returncode == 0, proc.stderr
  run = [l for l in proc.stdout.splitlines() if "-m experiments.nanogpt.main" in l]
  assert run and "--config=configs/v4_32.py" in run[0] and "--config.lr=3e-4" in run[0]
  assert os.path.exists(REPO / "experiments" / "nanogpt" / "configs" / "v4_32.py")


def test_shapes_only_init_draws_no_torch_weights(monkeypatch):
  """config.rng = "torch": the eager init is nanoGPT's torch draws; `jax.eval_shape` of it (dry
  runs, TPU compiles, restore templates) gives the same tree, shapes and dtypes without drawing
  them (GPT-2 XL's 1.56B weights filled the host's memory in `make tpu-check`)."""
  pytest.importorskip("torch", reason="the torch init needs torch")
  from experiments.nanogpt import torch_rng  # pylint: disable=g-import-not-at-top
  config = shakespeare_char_cpu.get_config("smoke")
  config.rng = "torch"
  model = gpt.GPTConfig(block_size=16, vocab_size=13, n_layer=2, n_head=2, n_embd=32, bias=True)
  eager = train.init_params(config, model, jax.random.key(0))
  want = jax.tree.map(np.asarray, torch_rng.init_params(model, config.seed)[0])
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(want)))

  def refuse(*a, **k):
    raise AssertionError("the torch init ran under jax.eval_shape")
  monkeypatch.setattr(torch_rng, "init_params", refuse)
  shapes = jax.eval_shape(lambda r: train.init_params(config, model, r), jax.random.key(0))
  assert jax.tree.structure(shapes) == jax.tree.structure(eager)
  assert [(s.shape, s.dtype) for s in jax.tree.leaves(shapes)] == [
      (x.shape, x.dtype) for x in jax.tree.leaves(eager)]
