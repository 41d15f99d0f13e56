"""The kernel seam (modules/kernels/dispatch.py): which attention a target gets, the splash kernel's
values and gradients against XLA attention (Pallas interpreter on CPU) and float64 NumPy, the GPT
model with each, and `numerics.float32_inside`'s backward pass."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from modules import gpt
from modules import numerics
from modules.kernels import dispatch
from modules.kernels import splash
from modules.kernels import xla


def _attention_f64(q, k, v, causal):
  """softmax(q k^T / sqrt(Dh)) v in float64 NumPy, grouped heads: q [B, Sq, H, Dh], k, v [B, Sk, K, Dh]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, Sq, H, Dh = q.shape
  Sk, K = k.shape[1], k.shape[2]
  k = np.repeat(k, H // K, axis=2)
  v = np.repeat(v, H // K, axis=2)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(Dh)
  if causal:
    s = np.where(np.tril(np.ones((Sq, Sk), bool), k=Sk - Sq), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", p, v)


def _rel(a, b):
  """The largest difference relative to b's largest entry (0 when both are all zeros)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("shape,causal", [
    ((2, 128, 4, 4, 64), True),      # B, S, H, K, Dh: multi-head, causal (GPT)
    ((1, 97, 4, 2, 32), False),      # grouped heads, a length padded to 128 (TRM's 97), no mask
])
def test_splash_matches_xla_and_float64(shape, causal):
  """Float32: the splash kernel (interpreted) equals XLA attention and float64 NumPy to float32
  rounding, in the value and the gradients of q, k and v."""
  B, S, H, K, Dh = shape
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (B, S, H, Dh), jnp.float32)
  k = jax.random.normal(keys[1], (B, S, K, Dh), jnp.float32)
  v = jax.random.normal(keys[2], (B, S, K, Dh), jnp.float32)
  g = jax.random.normal(keys[3], (B, S, H, Dh), jnp.float32)

  def grads(fn):
    return jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * g), argnums=(0, 1, 2))(q, k, v)

  out = splash.attention(q, k, v, causal=causal, interpret=True)
  assert out.shape == (B, S, H, Dh) and out.dtype == jnp.float32
  assert _rel(out, _attention_f64(q, k, v, causal)) < 2e-6
  assert _rel(out, xla.attention(q, k, v, causal=causal)) < 2e-6
  got = grads(lambda q, k, v: splash.attention(q, k, v, causal=causal, interpret=True))
  want = grads(lambda q, k, v: xla.attention(q, k, v, causal=causal))
  for a, b in zip(got, want):
    assert _rel(a, b) < 1e-5


def test_splash_layouts_give_the_same_values():
  """q, k, v read sequence-minor (what the kernel takes for head sizes off the 128-lane tile) or
  head-minor: the same output and gradients, bit for bit in float32 (interpreted)."""
  B, S, H, Dh = 1, 256, 2, 64
  assert splash.seq_minor(64) and splash.seq_minor(32) and not splash.seq_minor(128)
  keys = jax.random.split(jax.random.key(2), 4)
  q, k, v, g = (jax.random.normal(key, (B, H, S, Dh), jnp.float32) for key in keys)
  results = []
  for seq_minor in (True, False):
    kernel = jax.vmap(splash._kernel(H, S, S, S, S, True, False, True, seq_minor))  # pylint: disable=protected-access
    out, vjp = jax.vjp(kernel, q, k, v)
    results.append((out, *vjp(g)))
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)


def test_splash_bfloat16_within_bfloat16_rounding():
  """bfloat16 operands: the kernel keeps the probabilities float32 for the value product (XLA
  rounds them to bfloat16 first); both within bfloat16 rounding of float64."""
  keys = jax.random.split(jax.random.key(1), 3)
  q, k, v = (jax.random.normal(kk, (2, 128, 4, 64), jnp.float32).astype(jnp.bfloat16)
             for kk in keys)
  want = _attention_f64(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), True)
  out = splash.attention(q, k, v, causal=True, interpret=True)
  assert out.dtype == jnp.bfloat16
  assert _rel(out.astype(jnp.float32), want) < 1e-2
  assert _rel(xla.attention(q, k, v, causal=True).astype(jnp.float32), want) < 1e-2


def test_attention_choice_by_target_and_its_fallbacks():
  assert dispatch.attention_for("tpu", "bfloat16") == "splash"
  assert dispatch.attention_for("tpu", "float32") == "splash"
  assert dispatch.attention_for("tpu", "bfloat16", seq_len=916) == "splash"    # TRM's mazes
  assert dispatch.attention_for("tpu", "bfloat16", seq_len=97) == "xla"        # Sudoku: small scores
  assert dispatch.loss_for("tpu") == "pallas" and dispatch.loss_for("cpu") == "xla"
  assert dispatch.attention_for("gpu", "bfloat16") == "cudnn"
  assert dispatch.attention_for("gpu", "float32") == "xla"       # cuDNN's fused attention: 16-bit
  assert dispatch.attention_for("cpu", "bfloat16") == "xla"
  assert dispatch.attention_for("cpu", "bfloat16", "splash") == "splash"
  with pytest.raises(ValueError, match=r"attention='flash'.*use one of \('xla', 'splash', 'cudnn'\)"):
    dispatch.attention_for("tpu", "bfloat16", "flash")
  ops = dispatch.ops("default", jnp.bfloat16, "splash")
  assert ops.attention_used() == "splash"
  assert ops.attention_used(mask=jnp.ones((1, 1, 4, 4), bool)) == "xla"   # a padding mask
  assert ops.attention_used(dropout=0.1) == "xla"
  assert dispatch.ops("default", jnp.float32, "cudnn").attention_used() == "xla"
  assert dispatch.ops("default", jnp.bfloat16, "cudnn").attention_used() == "cudnn"


def test_gpt_with_splash_equals_xla_in_float32():
  """GPT's causal attention through the seam: attention="splash" (interpreted) gives the logits and
  gradients of the reference formulation (attention="xla") to float32 rounding."""
  cfg = gpt.GPTConfig(block_size=128, vocab_size=64, n_layer=2, n_head=2, n_embd=64, bias=True)
  idx = jax.random.randint(jax.random.key(2), (2, 128), 0, 64)
  params = gpt.GPTModel(cfg).init(jax.random.key(3))

  def run(attention):
    model = gpt.GPTModel(gpt.GPTConfig(**{**cfg.__dict__, "attention": attention}))
    loss = lambda p: gpt.cross_entropy(model.apply(p, idx, is_training=True), idx)  # noqa: E731
    return jax.value_and_grad(loss)(params)

  want_loss, want_grads = run("xla")
  with splash.interpreted():
    got_loss, got_grads = run("splash")
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    assert _rel(a, b) < 1e-5


def test_float32_inside_keeps_the_low_precision_input_only():
  """A bfloat16 activation through `float32_inside`: the value is fn in float32 rounded once; the
  gradient is fn' (float32) times the incoming bfloat16 gradient, rounded once; float32 is autodiff."""
  fn = numerics.float32_inside(lambda x: x * jnp.tanh(x))
  x = jnp.linspace(-4.0, 4.0, 257, dtype=jnp.float32).astype(jnp.bfloat16)
  g = jnp.cos(jnp.arange(257, dtype=jnp.float32)).astype(jnp.bfloat16)
  x64 = np.asarray(x, np.float64)
  y, vjp = jax.vjp(fn, x)
  np.testing.assert_array_equal(
      np.asarray(y, np.float32),
      np.asarray((x.astype(jnp.float32) * jnp.tanh(x.astype(jnp.float32))).astype(jnp.bfloat16),
                 np.float32))
  (dx,) = vjp(g)
  assert dx.dtype == jnp.bfloat16
  want = np.asarray(g, np.float64) * (np.tanh(x64) + x64 / np.cosh(x64) ** 2)
  np.testing.assert_allclose(np.asarray(dx, np.float64), want, rtol=1e-2, atol=1e-2)
  residuals = jax.vjp(fn, x)[1]
  leaves = [a for a in jax.tree.leaves(residuals) if hasattr(a, "dtype")]
  assert all(a.dtype != jnp.float32 for a in leaves if a.shape == x.shape)
  x32 = x.astype(jnp.float32)
  np.testing.assert_array_equal(jax.grad(lambda t: jnp.sum(fn(t)))(x32),
                                jax.grad(lambda t: jnp.sum(t * jnp.tanh(t)))(x32))


def test_splash_compiles_for_a_tpu_without_the_scores(libtpu):
  """GPT's attention on a v4-8 (TPU compiler, nothing run): with splash the program has the kernel
  as a custom call and no [B, H, S, S] buffer, and the compiler counts fewer bytes than XLA's."""
  from experiments.tools import tpu_compile  # pylint: disable=g-import-not-at-top
  from experiments.tools import tpu_target  # pylint: disable=g-import-not-at-top
  target = tpu_target.parse_target("v4-8")
  B, S, H, Dh = 2, 512, 4, 64

  def make_step(attention):
    ops = dispatch.ops("default", jnp.bfloat16, attention)

    def step(q, k, v):
      f = lambda q, k, v: jnp.sum(ops.attention(q, k, v, causal=True).astype(jnp.float32) ** 2)  # noqa: E731
      return jax.grad(f, argnums=(0, 1, 2))(q, k, v)
    return step

  arg = jax.ShapeDtypeStruct((B, S, H, Dh), jnp.bfloat16)
  reports, texts = {}, {}
  for attention in ("xla", "splash"):
    lowered = tpu_target.lower_step(make_step(attention), target, (arg, arg, arg))
    compiled = lowered.compile()
    texts[attention] = compiled.as_text()
    reports[attention] = tpu_compile.compile_report(compiled, target=target, name=attention)
  scores = f"[{B},{H},{S},{S}]"
  assert "tpu_custom_call" in texts["splash"] and scores not in texts["splash"].replace(" ", "")
  assert scores in texts["xla"].replace(" ", "")
  assert reports["splash"].compiler_bytes_accessed < 0.5 * reports["xla"].compiler_bytes_accessed


def test_fused_head_loss_matches_float64():
  """The fused head and loss (Pallas interpreter): per-row cross-entropy and both gradients of
  mean(rows) against float64 NumPy, with a vocabulary that is not a multiple of the kernels' blocks
  (the last block reads past V) and rows padded to a block."""
  from modules.kernels import fused_ce  # pylint: disable=g-import-not-at-top
  N, C, V = 300, 128, 1000
  keys = jax.random.split(jax.random.key(4), 3)
  x = jax.random.normal(keys[0], (N, C), jnp.float32)
  w = jax.random.normal(keys[1], (V, C), jnp.float32) * 0.1
  t = jax.random.randint(keys[2], (N,), 0, V)
  x64, w64, t64 = np.asarray(x, np.float64), np.asarray(w, np.float64), np.asarray(t)
  z = x64 @ w64.T
  m = z.max(1, keepdims=True)
  p = np.exp(z - m)
  lse = (m + np.log(p.sum(1, keepdims=True)))[:, 0]
  p /= p.sum(1, keepdims=True)
  rows = fused_ce.loss_rows(x, w, t, dtype="float32", logits_dtype="float32", interpret=True)
  np.testing.assert_allclose(rows, lse - z[np.arange(N), t64], rtol=1e-5, atol=1e-5)
  d = (p - np.eye(V)[t64]) / N                                   # d mean(rows) / d z
  gx, gw = jax.grad(lambda x, w: jnp.mean(fused_ce.loss_rows(
      x, w, t, dtype="float32", logits_dtype="float32", interpret=True)), argnums=(0, 1))(x, w)
  assert _rel(gx, d @ w64) < 1e-5 and _rel(gw, d.T @ x64) < 1e-5


def test_gpt_fused_loss_equals_logits_then_cross_entropy():
  """GPTModel.loss with loss="pallas" (interpreted) against loss="xla" (the logits, then
  `cross_entropy`): the same loss and gradients to float32 rounding; bfloat16 (autocast logits)
  to bfloat16 rounding."""
  idx = jax.random.randint(jax.random.key(5), (2, 64), 0, 200)
  tgt = jnp.roll(idx, -1, axis=1)
  for dtype, tol in (("float32", 1e-5), ("bfloat16", 2e-2)):
    cfg = dict(block_size=64, vocab_size=200, n_layer=1, n_head=2, n_embd=64, dtype=dtype)
    params = gpt.GPTModel(gpt.GPTConfig(**cfg)).init(jax.random.key(6))

    def run(loss):
      model = gpt.GPTModel(gpt.GPTConfig(**cfg, loss=loss))
      return jax.value_and_grad(lambda p: model.loss(p, idx, tgt, is_training=True))(params)

    want_loss, want_grads = run("xla")
    with splash.interpreted():
      got_loss, got_grads = run("pallas")
    np.testing.assert_allclose(got_loss, want_loss, rtol=tol)
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
      assert _rel(a, b) < tol, dtype


def test_fused_head_loss_compiles_for_a_tpu_without_the_logits(libtpu):
  """GPT-2's head and loss on a v4-8 (TPU compiler): the fused kernels write no [N, V] buffer and
  the compiler counts fewer bytes than the logits path (their cost estimate includes the block
  re-reads)."""
  from experiments.tools import tpu_compile  # pylint: disable=g-import-not-at-top
  from experiments.tools import tpu_target  # pylint: disable=g-import-not-at-top
  target = tpu_target.parse_target("v4-8")
  N, C, V = 2048, 768, 50304

  def make_step(loss):
    def step(x, w, t):
      if loss == "xla":
        f = lambda x, w: gpt.cross_entropy(  # noqa: E731
            (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16).T).astype(jnp.bfloat16)[None], t[None])
      else:
        f = lambda x, w: jnp.mean(dispatch.head_loss_rows(  # noqa: E731
            loss, x, w, t, dtype="bfloat16", logits_dtype="bfloat16"))
      return jax.grad(f, argnums=(0, 1))(x, w)
    return step

  args = (jax.ShapeDtypeStruct((N, C), jnp.float32), jax.ShapeDtypeStruct((V, C), jnp.float32),
          jax.ShapeDtypeStruct((N,), jnp.int32))
  got = {}
  for loss in ("xla", "pallas"):
    compiled = tpu_target.lower_step(make_step(loss), target, args, state_in=(1,)).compile()
    got[loss] = (compiled.as_text().replace(" ", ""),
                 tpu_compile.compile_report(compiled, target=target, name=loss))
  assert f"[{N},{V}]" in got["xla"][0] and f"[{N},{V}]" not in got["pallas"][0]
  assert got["pallas"][1].compiler_bytes_accessed < 0.5 * got["xla"][1].compiler_bytes_accessed


def test_fused_mlp_equals_the_layer_and_its_gradient():
  """The fused SwiGLU MLP (interpreted): the same values as the XLA layer, bit for bit in bfloat16
  and float32 at these sizes (unaligned feature axes: 97 -> 2F = 512 -> 97), and the same gradient
  (its backward is the XLA layer's)."""
  from modules.kernels import fused_mlp  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(7), 3)
  x = jax.random.normal(keys[0], (300, 97), jnp.float32)
  wgu = jax.random.normal(keys[1], (97, 512), jnp.float32) * 0.1
  wd = jax.random.normal(keys[2], (256, 97), jnp.float32) * 0.1
  for dtype in ("float32", "bfloat16"):
    got = fused_mlp.swiglu_mlp(x, wgu, wd, dtype=dtype, interpret=True)
    want = fused_mlp.reference(x, wgu, wd, dtype)
    assert got.dtype == jnp.dtype(dtype) and got.shape == (300, 97)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=1e-6, atol=1e-6)
  loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2)  # noqa: E731
  g1 = jax.grad(loss(lambda *a: fused_mlp.swiglu_mlp(*a, dtype="bfloat16", interpret=True)),
                argnums=(0, 1, 2))(x, wgu, wd)
  g2 = jax.grad(loss(lambda *a: fused_mlp.reference(*a, "bfloat16")), argnums=(0, 1, 2))(x, wgu, wd)
  for a, b in zip(g1, g2):
    np.testing.assert_array_equal(a, b)


def test_trm_with_the_fused_mlp_in_its_cycles_without_gradient():
  """TRM-MLP with mlp="pallas" (interpreted; the kernel runs in the cycles without gradient)
  against mlp="xla": the same latents, logits and gradients in float32."""
  from modules import trm  # pylint: disable=g-import-not-at-top
  base = dict(seq_len=9, vocab_size=11, hidden_size=64, num_heads=2, H_cycles=2, L_cycles=2,
              L_layers=1, mlp_t=True, puzzle_emb_ndim=0, forward_dtype="float32")
  batch = {"inputs": jax.random.randint(jax.random.key(8), (4, 9), 0, 11),
           "labels": jax.random.randint(jax.random.key(9), (4, 9), 0, 11),
           "puzzle_identifiers": jnp.zeros((4,), jnp.int32)}
  params, state = trm.TRMModel(trm.TRMConfig(**base)).init(jax.random.key(10))

  def run(mlp):
    model = trm.TRMModel(trm.TRMConfig(**base, mlp=mlp))
    carry = model.initial_carry(batch)

    def f(p):
      _, out = model.act_step(p, state, None, carry, batch, training=False)
      return jnp.sum(out["logits"] ** 2), out
    return jax.value_and_grad(f, has_aux=True)(params)

  (want_loss, want_out), want_grads = run("xla")
  with splash.interpreted():
    (got_loss, got_out), got_grads = run("pallas")
  np.testing.assert_allclose(got_out["logits"], want_out["logits"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    assert _rel(a, b) < 1e-5


def test_fused_head_loss_blocks_fit_vmem_for_wide_models():
  """GPT-2 124M (C = 768) keeps the default blocks; a wider model (GPT-2 XL, C = 1600) halves the
  blocks that multiply C until the estimate is within the VMEM budget (the dx kernel's
  double-buffered float32 [1024, C] result alone is 13 MB there)."""
  from modules.kernels import fused_ce  # pylint: disable=g-import-not-at-top
  bv = fused_ce.DX_BLOCK_VOCAB

  def dx_vmem(C):
    return lambda b: 2 * (b + bv) * C * 2 + 2 * b * C * 4 + 2 * b * bv * 4
  fits = fused_ce._fits  # pylint: disable=protected-access
  assert fits(fused_ce.BLOCK_ROWS, dx_vmem(768)) == fused_ce.BLOCK_ROWS
  wide = fits(fused_ce.BLOCK_ROWS, dx_vmem(1600))
  assert wide == fused_ce.BLOCK_ROWS // 2 and dx_vmem(1600)(wide) <= fused_ce.VMEM_BUDGET
  assert fits(64, lambda b: 10**12, floor=8) == 8
