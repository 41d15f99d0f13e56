"""Tests of the GPT layers and model (modules/layers.py GPT section, modules/gpt.py).

Expected values are float64 NumPy computations of docs/nanogpt.md's formulas
(pre-LN blocks, LayerNorm eps 1e-5, exact GELU, causal softmax attention with scale 1/sqrt(Dh),
tied head), never a second call of the code under test. Small sizes keep it fast.
"""
import dataclasses
import math
import re

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from modules import gpt
from modules import layers
from modules.kernels import dispatch
from modules.kernels import xla_cpu


def f64(x):
  return np.asarray(x, np.float64)


def np_ln(x, w, b=None, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(var + eps) * w
  return y if b is None else y + b


def np_gelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def np_attn(x, wqkv, bqkv, wo, bo, H):
  B, T, C = x.shape
  Dh = C // H
  qkv = x @ wqkv + (0 if bqkv is None else bqkv)
  q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
  out = np.zeros((B, T, C))
  for h in range(H):
    sl = slice(h * Dh, (h + 1) * Dh)
    s = q[..., sl] @ np.swapaxes(k[..., sl], -1, -2) / math.sqrt(Dh)    # [B, T, T]
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out[..., sl] = p @ v[..., sl]
  return out @ wo + (0 if bo is None else bo)


def np_gpt(params, idx, cfg):
  p = {k: {n: f64(v) for n, v in d.items()} for k, d in params.items()}
  T = idx.shape[1]
  x = p["gpt/wte"]["embedding"][idx] + p["gpt/wpe"]["embedding"][:T]
  g = lambda m, n: p[m].get(n)   # noqa: E731
  for i in range(cfg.n_layer):
    h = f"gpt/h_{i}"
    a = np_ln(x, g(f"{h}/ln_1", "weight"), g(f"{h}/ln_1", "bias"))
    x = x + np_attn(a, g(f"{h}/attn/qkv_proj", "w"), g(f"{h}/attn/qkv_proj", "b"),
                    g(f"{h}/attn/o_proj", "w"), g(f"{h}/attn/o_proj", "b"), cfg.n_head)
    m = np_ln(x, g(f"{h}/ln_2", "weight"), g(f"{h}/ln_2", "bias"))
    m = np_gelu(m @ g(f"{h}/mlp/c_fc", "w") + (g(f"{h}/mlp/c_fc", "b") if cfg.bias else 0))
    x = x + m @ g(f"{h}/mlp/c_proj", "w") + (g(f"{h}/mlp/c_proj", "b") if cfg.bias else 0)
  x = np_ln(x, g("gpt/ln_f", "weight"), g("gpt/ln_f", "bias"))
  return x @ p["gpt/wte"]["embedding"].T


def randomize(params, seed=0, scale=0.3):
  """Non-trivial values everywhere (biases and LayerNorm weights too)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: jnp.asarray(rng.normal(0.0, scale, x.shape) + (x == 1) * 1.0,
                                            jnp.float32), params)


SMALL = dict(block_size=12, vocab_size=17, n_layer=2, n_head=2, n_embd=16)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_numpy(bias):
  x = np.random.default_rng(1).normal(2.0, 3.0, (3, 5, 8)).astype(np.float32)
  f = hk.without_apply_rng(hk.transform(lambda x: gpt.LayerNorm(with_bias=bias)(x)))
  params = randomize(f.init(jax.random.key(0), x))
  y = f.apply(params, x)
  want = np_ln(f64(x), f64(params["layer_norm"]["weight"]),
               f64(params["layer_norm"]["bias"]) if bias else None)
  np.testing.assert_allclose(f64(y), want, atol=2e-5)
  assert ("bias" in params["layer_norm"]) == bias


def test_gelu_mlp_is_exact_gelu():
  x = np.random.default_rng(2).normal(0, 1, (2, 3, 8)).astype(np.float32)
  f = hk.without_apply_rng(hk.transform(lambda x: gpt.GeluMLP(with_bias=True)(x)))
  p = randomize(f.init(jax.random.key(0), x))
  y = f.apply(p, x)
  h = np_gelu(f64(x) @ f64(p["gelu_mlp/c_fc"]["w"]) + f64(p["gelu_mlp/c_fc"]["b"]))
  want = h @ f64(p["gelu_mlp/c_proj"]["w"]) + f64(p["gelu_mlp/c_proj"]["b"])
  np.testing.assert_allclose(f64(y), want, atol=1e-4)
  # The tanh approximation differs by more than the tolerance here: the test would notice it.
  h_tanh = f64(jax.nn.gelu(jnp.asarray(f64(x) @ f64(p["gelu_mlp/c_fc"]["w"])
                                       + f64(p["gelu_mlp/c_fc"]["b"]), jnp.float32)))
  assert np.abs(h_tanh - h).max() > 1e-4


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_logits_match_numpy(bias):
  cfg = gpt.GPTConfig(bias=bias, **SMALL)
  model = gpt.GPTModel(cfg)
  params = randomize(model.init(jax.random.key(0)), seed=3, scale=0.2)
  idx = np.random.default_rng(4).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
  got = f64(model.apply(params, idx))
  want = np_gpt(params, idx, cfg)
  np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(f64(model.apply(params, idx, last_only=True))[:, 0], want[:, -1],
                             atol=2e-4, rtol=1e-4)


def test_causal_mask_future_tokens_do_not_change_past_logits():
  cfg = gpt.GPTConfig(**SMALL)
  model = gpt.GPTModel(cfg)
  params = randomize(model.init(jax.random.key(0)), seed=5)
  a = np.random.default_rng(6).integers(0, 17, (1, 12)).astype(np.int32)
  b = a.copy()
  b[0, 7:] = (b[0, 7:] + 5) % 17
  la, lb = f64(model.apply(params, a)), f64(model.apply(params, b))
  np.testing.assert_array_equal(la[:, :7], lb[:, :7])
  assert np.abs(la[:, 7:] - lb[:, 7:]).max() > 1e-3


def test_kv_cache_logits_equal_full_forward():
  cfg = gpt.GPTConfig(**SMALL)
  model = gpt.GPTModel(cfg)
  params = randomize(model.init(jax.random.key(0)), seed=7, scale=0.2)
  idx = np.random.default_rng(8).integers(0, 17, (2, 12)).astype(np.int32)
  full = f64(model.apply(params, idx))
  cache = model.init_cache(2)
  logits, cache = model.apply_cached(params, idx[:, :5], cache, 0)         # prefill 5
  np.testing.assert_allclose(f64(logits), full[:, :5], atol=1e-5)
  for t in range(5, 12):                                                   # then one at a time
    logits, cache = model.apply_cached(params, idx[:, t:t + 1], cache, t)
    np.testing.assert_allclose(f64(logits)[:, 0], full[:, t], atol=1e-5)


def test_init_statistics_and_residual_projection_scaling():
  cfg = gpt.GPTConfig(block_size=64, vocab_size=512, n_layer=8, n_head=4, n_embd=256, bias=True)
  params = gpt.GPTModel(cfg).init(jax.random.key(0))
  proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
  for mod, leaves in params.items():
    for name, v in leaves.items():
      v = f64(v)
      if name in ("b", "bias"):
        assert np.all(v == 0), (mod, name)
      elif name == "weight":
        assert np.all(v == 1), (mod, name)
      else:
        want = proj_std if mod.endswith(("attn/o_proj", "mlp/c_proj")) else 0.02
        assert abs(v.std() / want - 1) < 0.03, (mod, v.std(), want)
        assert abs(v.mean()) < 4 * want / math.sqrt(v.size)
        assert np.abs(v).max() > 2.5 * want          # a plain normal, not truncated at 2 std


@pytest.mark.parametrize("args, want", [
    (dict(block_size=64, vocab_size=65, n_layer=4, n_head=4, n_embd=128, bias=False), 795_904),
    (dict(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, bias=False), 10_646_784),
    (dict(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, bias=False),
     123_587_328),
])
def test_parameter_counts(args, want):
  cfg = gpt.GPTConfig(**args)
  shapes = jax.eval_shape(gpt.GPTModel(cfg).init, jax.random.key(0))
  total = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))
  wpe = int(np.prod(shapes["gpt/wpe"]["embedding"].shape))
  assert total - wpe == want == gpt.analytic_param_count(cfg)


def test_num_params_excludes_wpe_only():
  cfg = gpt.GPTConfig(**SMALL)
  params = gpt.GPTModel(cfg).init(jax.random.key(0))
  assert gpt.num_params(params) == layers.count_params(params) - 12 * 16
  assert gpt.num_params(params) == gpt.analytic_param_count(cfg)


def test_decay_mask_two_dim_tensors_only():
  cfg = gpt.GPTConfig(bias=True, **SMALL)
  mask = gpt.decay_mask(gpt.GPTModel(cfg).init(jax.random.key(0)))
  decayed = sorted(f"{m}/{n}" for m, d in mask.items() for n, v in d.items() if v)
  assert decayed == sorted(
      ["gpt/wte/embedding", "gpt/wpe/embedding"]
      + [f"gpt/h_{i}/{m}/w" for i in range(2)
         for m in ("attn/qkv_proj", "attn/o_proj", "mlp/c_fc", "mlp/c_proj")])


def test_dropout_only_in_training_and_scaled():
  cfg = gpt.GPTConfig(dropout=0.5, **SMALL)
  model = gpt.GPTModel(cfg)
  params = model.init(jax.random.key(0))
  idx = np.zeros((1, 12), np.int32)
  a = f64(model.apply(params, idx))
  np.testing.assert_array_equal(a, f64(model.apply(params, idx, jax.random.key(1))))
  b = f64(model.apply(params, idx, jax.random.key(1), is_training=True))
  c = f64(model.apply(params, idx, jax.random.key(2), is_training=True))
  assert np.abs(a - b).max() > 1e-3 and np.abs(b - c).max() > 1e-3
  x = jnp.ones((100_000,))
  y = f64(gpt.dropout(x, 0.2, jax.random.key(0)))
  assert set(np.unique(y)) == {0.0, 1.25} and abs((y == 0).mean() - 0.2) < 0.01
  with pytest.raises(ValueError, match="rng"):
    model.apply(params, idx, is_training=True)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="n_embd=100.*n_head=3"):
    gpt.GPTConfig(n_embd=100, n_head=3)
  with pytest.raises(ValueError, match="dropout"):
    gpt.GPTConfig(dropout=1.5)


def _kernels(fast: bool) -> str:
  return "xla_cpu" if fast else "default"


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("w_transposed", [False, True])
def test_fast_grad_matmul_gradients_match_numpy(dtype, tol, w_transposed):
  """dispatch.ops("xla_cpu", dtype).matmul (`xla_cpu.matmul`: custom VJP, row-major transposes):
  value and both gradients of sum(c * (x @ w)) against float64 NumPy; float32 also equals plain
  autodiff to rounding."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((96, 40)).astype(np.float32)
  w = rng.standard_normal((24, 40) if w_transposed else (40, 24)).astype(np.float32) * 0.2
  c = rng.standard_normal((96, 24)).astype(np.float32)
  wm = f64(w).T if w_transposed else f64(w)

  def loss(x, w, fast):
    y = dispatch.ops(_kernels(fast), dtype).matmul(x, w, w_transposed)
    assert y.dtype == jnp.float32
    return jnp.sum(c * y)

  val, (gx, gw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)(x, w, True)
  eager = jax.grad(loss, argnums=(0, 1))(x, w, True)            # op by op: equal to rounding
  # (XLA:CPU may pick another product kernel for the jitted program: 3.7e-6 of entries ~17 seen on
  # an AMD EPYC; float32 sums of 96 products round at ~1e-7 of their size.)
  np.testing.assert_allclose(eager[1], gw, rtol=0, atol=1e-6 * np.abs(np.asarray(gw)).max())
  scale = np.abs(f64(c) @ wm.T).max()
  np.testing.assert_allclose(float(val), np.sum(f64(c) * (f64(x) @ wm)), rtol=tol)
  np.testing.assert_allclose(f64(gx), f64(c) @ wm.T, atol=tol * scale)
  want_w = f64(x).T @ f64(c)
  np.testing.assert_allclose(f64(gw), want_w.T if w_transposed else want_w,
                             atol=tol * np.abs(want_w).max())
  assert gx.dtype == jnp.float32 and gw.dtype == jnp.float32
  if dtype == "float32":
    plain = jax.grad(loss, argnums=(0, 1))(x, w, False)
    np.testing.assert_allclose(gw, plain[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, plain[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("fast", [True, False])
def test_wt_matmul_value_and_gradients_match_numpy(dtype, tol, fast):
  """dispatch.ops(kernels, dtype).wt_matmul(w, x) = w^T x for feature-major x [I, N]: value and
  both gradients of sum(c * w^T x) against float64 NumPy, with the CPU form (kernels="xla_cpu": fast_grad) and plain
  autodiff."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((40, 96)).astype(np.float32)          # [I, N]
  w = rng.standard_normal((40, 24)).astype(np.float32) * 0.2   # [I, O]
  c = rng.standard_normal((24, 96)).astype(np.float32)          # [O, N]

  def loss(w, x):
    y = dispatch.ops(_kernels(fast), dtype).wt_matmul(w, x)
    assert y.dtype == jnp.float32 and y.shape == (24, 96)
    return jnp.sum(c * y)

  val, (gw, gx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(w, x)
  want_y = f64(w).T @ f64(x)
  np.testing.assert_allclose(float(val), np.sum(f64(c) * want_y), rtol=tol)
  want_gx, want_gw = f64(w) @ f64(c), f64(x) @ f64(c).T
  np.testing.assert_allclose(f64(gx), want_gx, atol=tol * np.abs(want_gx).max())
  np.testing.assert_allclose(f64(gw), want_gw, atol=tol * np.abs(want_gw).max())
  assert gw.dtype == jnp.float32 and gx.dtype == jnp.float32
  # The same products as the row-major form matmul(x^T, w)^T.
  y_rows = dispatch.ops(_kernels(fast), dtype).matmul(jnp.asarray(x).T, w).T
  np.testing.assert_allclose(dispatch.ops(_kernels(fast), dtype).wt_matmul(w, x), y_rows,
                             rtol=1e-6, atol=1e-6)


def _dot_contractions(compiled_text):
  """The contracted sizes of every dot in an optimized HLO text ({lhs operand size})."""
  shapes = {m.group(1): [int(d) for d in m.group(2).split(",") if d]
            for m in re.finditer(r"%(\S+) = \w+\[([\d,]*)\]", compiled_text)}
  out = []
  for m in re.finditer(r"dot\(%(\S+), %\S+\), lhs_contracting_dims=\{(\d+)\}", compiled_text):
    out.append(shapes[m.group(1)][int(m.group(2))])
  return sorted(out)


def test_wt_matmul_pad_contraction():
  """pad_contraction (TRM's token mix over S = 97 positions, a CPU form): the bfloat16 products
  that contract over I (the value) or O (dx) run on K zero-padded to 128, and the value and both
  gradients are the unpadded ones (the padded products are exact zeros: equal up to the float32
  sums' order); float32 is never padded."""
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.standard_normal((97, 256)), jnp.bfloat16)            # [I, N]
  w1 = jnp.asarray(rng.standard_normal((97, 64)) * 0.1, jnp.float32)       # [I, O]: over I
  w2 = jnp.asarray(rng.standard_normal((64, 97)) * 0.1, jnp.float32)       # [O', I]: dx over I
  c = jnp.asarray(rng.standard_normal((97, 256)), jnp.float32)

  def loss(w1, w2, x, dtype, pad):
    h = xla_cpu.wt_matmul(w1, x, dtype, pad_contraction=pad)                 # [64, N]
    y = xla_cpu.wt_matmul(w2, h, dtype, pad_contraction=pad)                 # [97, N]
    return jnp.sum(c * y)

  for dtype in ("bfloat16", "float32"):
    out, ks = {}, {}
    for pad in (False, True):
      f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)), static_argnums=(3, 4))
      compiled = f.lower(w1, w2, x, dtype, pad).compile()
      ks[pad] = _dot_contractions(compiled.as_text())
      out[pad] = compiled(w1, w2, x)
    padded = dtype == "bfloat16"
    assert (128 in ks[True]) == padded and 97 in ks[False] and 128 not in ks[False], ks
    assert ks[True].count(97) == (ks[False].count(97) - 2 if padded else ks[False].count(97)), ks
    for a, b in zip(jax.tree.leaves(out[True]), jax.tree.leaves(out[False])):
      np.testing.assert_allclose(f64(a), f64(b), rtol=1e-5, atol=1e-5 * np.abs(f64(b)).max())


def test_feature_major_swiglu_equals_the_row_major_one():
  """SwiGLU(feature_major=True) on x^T [D, N] has the same parameters as the row-major SwiGLU and
  returns its result transposed (float32, kernels "default" and "xla_cpu"), gradients included."""
  x = jax.random.normal(jax.random.key(0), (50, 24), jnp.float32)          # [N, D]

  def make(feature_major, fast):
    def f(v):
      return layers.SwiGLU(expansion=2.0, dtype=jnp.float32, kernels=_kernels(fast),
                           feature_major=feature_major, name="mix")(v)
    return hk.without_apply_rng(hk.transform(f))

  params = make(False, False).init(jax.random.key(1), x)
  ref = make(False, False).apply(params, x)
  for fast in (False, True):
    fm = make(True, fast)
    assert jax.tree.map(jnp.shape, fm.init(jax.random.key(1), x.T)) == jax.tree.map(jnp.shape, params)
    np.testing.assert_allclose(fm.apply(params, x.T).T, ref, rtol=1e-5, atol=1e-5)
    g_ref = jax.grad(lambda p: jnp.sum(make(False, False).apply(p, x) ** 2))(params)
    g = jax.grad(lambda p: jnp.sum(fm.apply(p, x.T) ** 2))(params)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def test_gelu_exact_matches_erf_formula():
  x = np.linspace(-8.0, 8.0, 4001).astype(np.float32)
  np.testing.assert_allclose(f64(gpt.gelu_exact(jnp.asarray(x))), np_gelu(f64(x)), atol=2e-6)
  g = jax.grad(lambda v: jnp.sum(gpt.gelu_exact(v)))(jnp.asarray(x))
  want = 0.5 * (1 + np.vectorize(math.erf)(f64(x) / math.sqrt(2))) + f64(x) * np.exp(
      -f64(x) ** 2 / 2) / math.sqrt(2 * math.pi)
  np.testing.assert_allclose(f64(g), want, atol=3e-6)


@pytest.mark.slow        # make test: the autocast dtypes (test_bfloat16_autocast_activations_...)
def test_bfloat16_gpt_is_autocast_style_and_close_to_float32():
  """dtype="bfloat16": bfloat16 matmul operands, float32 activations; logits and gradients stay
  close to the float32 model (same params), and kernels="xla_cpu" does not change float32
  gradients."""
  args = dict(block_size=16, vocab_size=13, n_layer=2, n_head=2, n_embd=32, bias=True)
  cfg32 = gpt.GPTConfig(**args, kernels="xla_cpu")
  params = gpt.GPTModel(cfg32).init(jax.random.key(1))
  idx = jax.random.randint(jax.random.key(2), (3, 16), 0, 13)

  def loss(p, cfg):
    return gpt.cross_entropy(gpt.GPTModel(cfg).apply(p, idx), idx)

  vg = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  l32, g32 = vg(params, cfg32)
  l16, g16 = vg(params, gpt.GPTConfig(**args, dtype="bfloat16", kernels="xla_cpu"))
  lplain, gplain = vg(params, gpt.GPTConfig(**args, kernels="default"))
  assert abs(float(l16) - float(l32)) < 1e-2
  np.testing.assert_allclose(float(lplain), float(l32), rtol=1e-6)
  for (path, a), b, c in zip(jax.tree_util.tree_leaves_with_path(g32), jax.tree.leaves(g16),
                             jax.tree.leaves(gplain)):
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(f64(c), f64(a), rtol=1e-4, atol=1e-6, err_msg=str(path))
    assert np.abs(f64(b) - f64(a)).max() <= 0.05 * np.abs(f64(a)).max() + 1e-4, path


def _torch_nanogpt(torch, params, idx, targets, cfg):
  """nanoGPT's forward and loss as its model.py computes them (F.linear, F.layer_norm,
  scaled_dot_product_attention with is_causal, F.gelu, the tied head, F.cross_entropy) in torch on
  podlab's parameters; under torch.autocast when the caller opens one. Returns (logits, loss, grads
  by podlab's parameter path)."""
  F = torch.nn.functional
  flat = {f"{m}/{n}": v for m, d in params.items() for n, v in d.items()}
  P = {k: torch.tensor(np.asarray(v, np.float32), requires_grad=True) for k, v in flat.items()}
  g = lambda name: P.get(f"gpt/{name}")  # noqa: E731
  lin = lambda x, name: F.linear(x, g(f"{name}/w").T, g(f"{name}/b"))  # noqa: E731
  B, T = idx.shape
  C, H = cfg.n_embd, cfg.n_head
  ids = torch.from_numpy(np.asarray(idx, np.int64))
  x = g("wte/embedding")[ids] + g("wpe/embedding")[:T][None]
  for i in range(cfg.n_layer):
    h = F.layer_norm(x, (C,), g(f"h_{i}/ln_1/weight"), g(f"h_{i}/ln_1/bias"), 1e-5)
    q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2)
               for t in lin(h, f"h_{i}/attn/qkv_proj").split(C, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    x = x + lin(y, f"h_{i}/attn/o_proj")
    h = F.layer_norm(x, (C,), g(f"h_{i}/ln_2/weight"), g(f"h_{i}/ln_2/bias"), 1e-5)
    x = x + lin(F.gelu(lin(h, f"h_{i}/mlp/c_fc")), f"h_{i}/mlp/c_proj")
  x = F.layer_norm(x, (C,), g("ln_f/weight"), g("ln_f/bias"), 1e-5)
  logits = F.linear(x, g("wte/embedding"))
  loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                         torch.from_numpy(np.asarray(targets, np.int64)).reshape(-1))
  loss.backward()
  return logits, loss, {k: p.grad.numpy() for k, p in P.items()}


@pytest.mark.parametrize("bias", [pytest.param(False, marks=pytest.mark.slow), True])
def test_bfloat16_autocast_activations_follow_torch_autocast(bias):
  """model.dtype="bfloat16" with activations="autocast" (the default) computes what nanoGPT computes
  under torch.autocast(bfloat16): bfloat16 Linear outputs, attention and GELU, bfloat16 logits, a
  float32 residual stream. Against torch 2.13's autocast on the same parameters: of its bfloat16
  logits about half are torch's bit for bit (activations="float32": none), the rest
  a rounding apart (torch's attention kernel rounds the unnormalised probabilities; summation
  orders); loss and gradients agree to bfloat16 rounding, with kernels "xla_cpu" and "default"."""
  torch = pytest.importorskip("torch", reason="the torch cross-check needs torch (pip '.[torch]')")
  args = dict(block_size=32, vocab_size=67, n_layer=2, n_head=4, n_embd=64, bias=bias)
  params = gpt.GPTModel(gpt.GPTConfig(**args)).init(jax.random.key(3))
  if bias:   # nonzero biases, so that they take part
    params = {m: {n: v + 0.05 * jax.random.normal(jax.random.key(i), v.shape)
                  if n in ("b", "bias") else v for n, v in d.items()}
              for i, (m, d) in enumerate(params.items())}
  rng = np.random.default_rng(4)
  idx = rng.integers(0, 67, (3, 32))
  targets = rng.integers(0, 67, (3, 32))
  with torch.autocast("cpu", dtype=torch.bfloat16):
    t_logits, t_loss, t_grads = _torch_nanogpt(torch, params, idx, targets, gpt.GPTConfig(**args))
  assert t_logits.dtype == torch.bfloat16
  want = t_logits.float().detach().numpy()
  t_loss = float(t_loss.detach())

  equal = {}
  for act in ("autocast", "float32"):
    for fast in (False, True):
      cfg = gpt.GPTConfig(**args, dtype="bfloat16", activations=act, kernels=_kernels(fast))
      model = gpt.GPTModel(cfg)

      def loss_fn(p):
        logits = model.apply(p, jnp.asarray(idx))
        return gpt.cross_entropy(logits, jnp.asarray(targets)), logits

      (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
      got = f64(logits)
      equal[act, fast] = (got == want).mean()
      if act == "float32":
        continue
      assert logits.dtype == jnp.bfloat16
      assert np.abs(got - want).mean() < 4e-3 * np.abs(want).mean()
      assert abs(float(loss) - t_loss) < 2e-4
      for m, d in grads.items():
        for n, v in d.items():
          ref = t_grads[f"{m}/{n}"]
          assert np.linalg.norm(f64(v) - ref) < 0.02 * np.linalg.norm(ref), (m, n)
  assert min(equal["autocast", False], equal["autocast", True]) > 0.3, equal
  assert max(equal["float32", False], equal["float32", True]) < 0.05, equal


def _eqns(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it (jit, custom_vjp, ...)."""
  for e in jaxpr.eqns:
    yield e
    for v in e.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _eqns(inner)


def test_activations_config_field():
  """activations names the attention's operand dtype: bfloat16 in every dot of an "autocast" model,
  float32 in the attention's two per layer with "float32"; a bad value names the field."""
  args = dict(SMALL, dtype="bfloat16")
  idx = jnp.zeros((2, 12), jnp.int32)
  for act, want_f32 in (("autocast", 0), ("float32", 2 * SMALL["n_layer"])):
    model = gpt.GPTModel(gpt.GPTConfig(**args, activations=act))
    params = model.init(jax.random.key(0))
    jaxpr = jax.make_jaxpr(lambda p: model.apply(p, idx))(params)
    dots = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    f32 = [e for e in dots if e.invars[0].aval.dtype == jnp.float32]
    # The token lookup is a gather in the forward pass (its one-hot product is in the gradient only).
    assert len(dots) == 4 * SMALL["n_layer"] + 2 * SMALL["n_layer"] + 1
    assert len(f32) == want_f32
  with pytest.raises(ValueError, match="model.activations='bf16'.*autocast"):
    gpt.GPTConfig(activations="bf16")


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_remat_keeps_the_parameters_logits_and_gradients(dtype):
  """remat recomputes each block in the backward pass: the same parameter tree (names, init), the
  same training logits (dropout masks included) and the same gradients to float32 rounding."""
  cfg = gpt.GPTConfig(bias=True, dropout=0.1, dtype=dtype, **SMALL)
  plain, remat = gpt.GPTModel(cfg), gpt.GPTModel(dataclasses.replace(cfg, remat=True))
  params = plain.init(jax.random.key(0))
  jax.tree.map(np.testing.assert_array_equal, params, remat.init(jax.random.key(0)))
  params = randomize(params, seed=11, scale=0.2)
  idx = np.random.default_rng(12).integers(0, cfg.vocab_size, (2, 12)).astype(np.int32)
  rng = jax.random.key(13)

  def loss(model, p):
    return gpt.cross_entropy(model.apply(p, idx, rng, is_training=True), idx)
  np.testing.assert_array_equal(
      f64(plain.apply(params, idx, rng, is_training=True)),
      f64(remat.apply(params, idx, rng, is_training=True)))
  g_plain = jax.jit(jax.grad(lambda p: loss(plain, p)))(params)
  g_remat = jax.jit(jax.grad(lambda p: loss(remat, p)))(params)
  assert jax.tree.structure(g_plain) == jax.tree.structure(g_remat)
  scale = max(float(np.abs(f64(g)).max()) for g in jax.tree.leaves(g_plain))
  worst = max(float(np.abs(f64(a) - f64(b)).max())
              for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat)))
  assert worst <= 1e-6 * scale, (worst, scale)
  assert scale > 1e-3                                         # a real gradient
  # The backward pass recomputes the blocks: more dots in the remat program.
  dots = lambda m: len(re.findall(r"\bdot_general\b", str(jax.make_jaxpr(  # noqa: E731
      jax.grad(lambda p: loss(m, p)))(params))))
  assert dots(remat) > dots(plain)


def test_cross_entropy_keeps_only_the_logits_for_its_gradient():
  """gpt.cross_entropy is recomputed in the backward pass (jax.checkpoint): the only [B, T, V]
  residual it keeps is the logits as given (bfloat16 for a bfloat16 model), never a float32
  log-softmax copy (GPT-2 124M on a v4-32: 0.6 GiB per device, docs/tpu.md). Loss and gradient
  match a float64 NumPy log-softmax."""
  from jax._src.ad_checkpoint import saved_residuals  # not exported; the residual list jax keeps
  rng = np.random.default_rng(3)
  logits64 = rng.normal(0, 3, (2, 5, 37))
  targets = rng.integers(0, 37, (2, 5)).astype(np.int32)
  for dtype in (jnp.float32, jnp.bfloat16):
    logits = jnp.asarray(logits64, dtype)
    big = [r for r, _ in saved_residuals(gpt.cross_entropy, logits, targets)
           if r.shape == logits.shape]
    assert [r.dtype for r in big] == [jnp.dtype(dtype)], big
  x = f64(jnp.asarray(logits64, jnp.float32))
  logp = x - x.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  onehot = np.eye(37)[targets]
  want_loss = -(logp * onehot).sum(-1).mean()
  want_grad = (np.exp(logp) - onehot) / targets.size
  loss, grad = jax.value_and_grad(gpt.cross_entropy)(jnp.asarray(x, jnp.float32), targets)
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6)
  np.testing.assert_allclose(f64(grad), want_grad, atol=1e-7)
