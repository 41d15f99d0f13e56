"""Tests of modules/layers.py against independent float64 NumPy computations.

Every expected value is computed here in float64 NumPy from the formulas of docs/trm.md
section 1 (and the layers' documented contracts), never by calling the code under test a second time.
Sizes are small (hidden <= 64, sequence <= 12) to keep the file fast on a shared 2-core machine; the
init-statistics tests use one large matrix each (init only, no forward pass).
"""
import math

import haiku as hk
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from modules import layers
from modules.kernels import xla
from modules.kernels import xla_cpu

TRUNC_STD = 0.87962566103423978  # std of a standard normal truncated to [-2, 2]


# --------------------------------------------------------------------------------------------------
# Float64 NumPy references.
# --------------------------------------------------------------------------------------------------


def f64(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def bf16_round(x) -> np.ndarray:
  """Rounds float64 values to bfloat16 (what a cast to the bf16 compute dtype does) and back."""
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def np_rms(x, axis=-1, eps=1e-5):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + eps)


def np_rope(x, pos, head_dim, theta=10000.0):
  """'Rotate half' RoPE. x: [B, S, H, Dh]; pos: [S] or [B, S]."""
  half = head_dim // 2
  inv = theta ** (-(2.0 * np.arange(half)) / head_dim)               # [Dh/2]
  ang = np.asarray(pos, np.float64)[..., None] * inv                  # [(B,) S, Dh/2]
  cos, sin = np.cos(ang), np.sin(ang)
  if cos.ndim == 2:
    cos, sin = cos[None], sin[None]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]                   # [B|1, S, 1, Dh/2]
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def np_attention(x, w_qkv, w_o, *, H, K, Dh, b_qkv=None, b_o=None, mask=None, causal=False,
                 rope_pos=None, theta=10000.0):
  """Per-head loop; fused weight columns ordered q | k | v, head-major within each block.

  Query head h uses KV head h // (H // K). mask: bool [B, S, S] (True = attend). A query row with
  nothing to attend to gets uniform weights (the documented contract of layers.Attention).
  """
  x = np.asarray(x, np.float64)
  B, S, _ = x.shape
  qkv = x @ w_qkv + (0.0 if b_qkv is None else b_qkv)
  q = np.stack([qkv[..., h * Dh:(h + 1) * Dh] for h in range(H)], axis=2)              # [B,S,H,Dh]
  k = np.stack([qkv[..., (H + j) * Dh:(H + j + 1) * Dh] for j in range(K)], axis=2)    # [B,S,K,Dh]
  v = np.stack([qkv[..., (H + K + j) * Dh:(H + K + j + 1) * Dh] for j in range(K)], axis=2)
  if rope_pos is not None:
    q, k = np_rope(q, rope_pos, Dh, theta), np_rope(k, rope_pos, Dh, theta)
  allowed = np.ones((B, S, S), bool) if mask is None else np.asarray(mask, bool).copy()
  if causal:
    allowed &= np.tril(np.ones((S, S), bool))[None]
  out = np.zeros((B, S, H, Dh))
  for b in range(B):
    for h in range(H):
      j = h // (H // K)
      scores = q[b, :, h] @ k[b, :, j].T / math.sqrt(Dh)                                # [S, S]
      for i in range(S):
        row = allowed[b, i]
        if row.any():
          s = np.where(row, scores[i], -np.inf)
          p = np.exp(s - s.max())
          p /= p.sum()
        else:
          p = np.full(S, 1.0 / S)
        out[b, i, h] = p @ v[b, :, j]
  y = out.reshape(B, S, H * Dh) @ w_o
  return y + (0.0 if b_o is None else b_o)


def assert_close(got, want, rtol, atol, msg=""):
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=msg)


def transform(fn):
  return hk.without_apply_rng(hk.transform(fn))


# --------------------------------------------------------------------------------------------------
# Linear / Embed
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_numpy(dtype, with_bias):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 5, 24)).astype(np.float32)
  f = transform(lambda x: layers.Linear(16, with_bias=with_bias, dtype=dtype, name="lin")(x))
  params = f.init(jax.random.key(0), x)
  assert params["lin"]["w"].shape == (24, 16)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params)), "parameters must stay f32"
  if with_bias:
    assert params["lin"]["b"].shape == (16,)
    np.testing.assert_array_equal(params["lin"]["b"], 0.0)   # default bias init: zeros
    params = {"lin": {"w": params["lin"]["w"],
                      "b": jnp.asarray(rng.standard_normal(16), jnp.float32)}}
  else:
    assert set(params["lin"]) == {"w"}
  y = f.apply(params, x)
  assert y.dtype == dtype and y.shape == (3, 5, 16)
  w = f64(params["lin"]["w"])
  b = f64(params["lin"]["b"]) if with_bias else 0.0
  if dtype == jnp.float32:
    assert_close(y, f64(x) @ w + b, rtol=1e-5, atol=1e-5)
  else:
    # Inputs and weights rounded to bf16, float32 accumulation, result rounded to bf16.
    want = bf16_round(x) @ bf16_round(w) + (bf16_round(b) if with_bias else 0.0)
    assert_close(y, want, rtol=2e-2, atol=2e-2)


def test_embed_lookup_and_tied_attend():
  rng = np.random.default_rng(1)
  ids = rng.integers(0, 13, (2, 7)).astype(np.int32)
  x = rng.standard_normal((2, 7, 16)).astype(np.float32)

  def fn(ids, x):
    emb = layers.Embed(13, 16, init_std=0.5, dtype=jnp.float32, name="emb")
    return emb(ids), emb.attend(x)

  f = transform(fn)
  params = f.init(jax.random.key(0), ids, x)
  table = f64(params["emb"]["embedding"])
  assert table.shape == (13, 16) and params["emb"]["embedding"].dtype == jnp.float32
  looked, logits = f.apply(params, ids, x)
  assert looked.dtype == jnp.float32 and logits.shape == (2, 7, 13)
  np.testing.assert_array_equal(f64(looked), table[ids])
  assert_close(logits, f64(x) @ table.T, rtol=1e-5, atol=1e-5)

  # bfloat16 compute: the lookup is the table rounded to bf16, exactly.
  fb = transform(lambda ids: layers.Embed(13, 16, dtype=jnp.bfloat16, name="emb")(ids))
  out = fb.apply(params, ids)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(f64(out), bf16_round(table)[ids])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_embed_one_hot_and_gather_lookups(dtype):
  """Both lookups return the table's rows exactly; the one-hot's table gradient is the float64
  sum of each token's output gradient (float32 accumulation), the gather's the same sums."""
  rng = np.random.default_rng(2)
  V, D = 11, 16
  ids = rng.integers(0, V, (4, 9)).astype(np.int32)
  g = rng.standard_normal((4, 9, D)).astype(np.float32)
  assert layers.one_hot_lookup(layers.ONE_HOT_MAX_VOCAB)
  assert not layers.one_hot_lookup(layers.ONE_HOT_MAX_VOCAB + 1)           # GPT-2, Dream: gather
  assert not layers.one_hot_lookup(V, "gather") and layers.one_hot_lookup(50257, "one_hot")
  with pytest.raises(ValueError, match="lookup='take'"):
    layers.one_hot_lookup(V, "take")

  def loss(lookup):
    f = transform(lambda ids: layers.Embed(V, D, dtype=dtype, name="emb", lookup=lookup)(ids))
    return f, lambda p: jnp.sum(f.apply(p, ids).astype(jnp.float32) * jnp.asarray(g, dtype))

  f, _ = loss("one_hot")
  params = f.init(jax.random.key(0), ids)
  table = f64(params["emb"]["embedding"])
  rows = table if dtype == jnp.float32 else bf16_round(table)
  g_in = f64(g) if dtype == jnp.float32 else bf16_round(g)
  want = np.zeros((V, D))
  np.add.at(want, ids.reshape(-1), g_in.reshape(-1, D))          # [V, D] float64
  for lookup in ("one_hot", "gather"):
    f, fn = loss(lookup)
    out = f.apply(params, ids)
    assert out.dtype == dtype
    np.testing.assert_array_equal(f64(out), rows[ids])
    grad = jax.jit(jax.grad(fn))(params)["emb"]["embedding"]
    assert grad.dtype == jnp.float32
    tol = 1e-6 if dtype == jnp.float32 or lookup == "one_hot" else 2e-2  # gather: bf16 scatter sums
    assert_close(grad, want, rtol=tol, atol=tol * np.abs(want).max())


def _dot_operand_dtypes(fn, *args):
  """The operand dtypes of every dot_general in fn's jaxpr (nested jaxprs included)."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(tuple(jnp.dtype(v.aval.dtype).name for v in eqn.invars))
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if hasattr(sub, "eqns"):
            walk(sub)
          elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):   # a ClosedJaxpr
            walk(sub.jaxpr)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


@pytest.mark.parametrize("spec,a_shape,b_shape", [
    ("ni,io->no", (6, 8), (8, 5)),                          # Linear
    ("ni,oi->no", (6, 8), (5, 8)),                          # tied head
    ("bqkgd,bskd->bkgqs", (2, 3, 2, 2, 4), (2, 5, 2, 4)),   # attention scores
    ("bkgqs,bskd->bqkgd", (2, 2, 2, 3, 5), (2, 5, 2, 4)),   # attention values
])
def test_einsum_bfloat16_backward_runs_bfloat16_products(spec, a_shape, b_shape):
  """`xla.einsum` in bfloat16: float32 values of the bfloat16 operands, and the gradient's two
  products on bfloat16 operands (the output gradient rounded first) with float32 accumulation,
  a's gradient in a's dtype (bfloat16 here), b's in b's (a float32 weight: unrounded)."""
  rng = np.random.default_rng(3)
  a = jnp.asarray(rng.standard_normal(a_shape), jnp.bfloat16)
  b = jnp.asarray(rng.standard_normal(b_shape), jnp.float32)
  out_shape = np.einsum(spec, f64(a), f64(b)).shape
  g = rng.standard_normal(out_shape).astype(np.float32)

  def fn(a, b):
    return jnp.sum(xla.einsum(spec, a, b, jnp.bfloat16) * g)

  y = xla.einsum(spec, a, b, jnp.bfloat16)
  assert y.dtype == jnp.float32
  assert_close(y, np.einsum(spec, f64(a), bf16_round(b)), rtol=1e-5, atol=1e-5)
  da, db = jax.jit(jax.grad(fn, argnums=(0, 1)))(a, b)
  assert da.dtype == jnp.bfloat16 and db.dtype == jnp.float32
  ins, out = spec.split("->")
  sa, sb = ins.split(",")
  gb = bf16_round(g)
  want_da = np.einsum(f"{out},{sb}->{sa}", gb, bf16_round(b))
  want_db = np.einsum(f"{sa},{out}->{sb}", f64(a), gb)
  assert_close(da, want_da, rtol=1e-2, atol=1e-2 * np.abs(want_da).max())   # one bf16 rounding
  assert_close(db, want_db, rtol=1e-5, atol=1e-5 * np.abs(want_db).max())
  # Every product of the value and the gradient reads bfloat16 operands (autodiff's would read
  # the float32 output gradient and float32 copies of the operands).
  dots = _dot_operand_dtypes(jax.grad(fn, argnums=(0, 1)), a, b)
  assert len(dots) == 3 and all(d == ("bfloat16", "bfloat16") for d in dots), dots
  # a's gradient comes out of its product in bfloat16 (float32 accumulation), with no float32
  # [a_shape] written first: the same value as the float32 result rounded once.
  assert "preferred_element_type=bfloat16" in str(jax.make_jaxpr(jax.grad(fn, argnums=(0, 1)))(a, b))
  np.testing.assert_array_equal(f64(da), bf16_round(want_da))


# --------------------------------------------------------------------------------------------------
# RMS norms
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_norm_matches_numpy(axis):
  rng = np.random.default_rng(2)
  x = (3.0 * rng.standard_normal((2, 6, 10)) + 0.5).astype(np.float32)
  y = layers.rms_norm(jnp.asarray(x), axis=axis, eps=1e-5)
  assert y.dtype == jnp.float32
  want = np_rms(x, axis=axis, eps=1e-5)
  assert_close(y, want, rtol=1e-5, atol=1e-6)
  # the normalised axis has mean square 1 (up to eps): checks the axis, not just the formula
  ms = np.mean(f64(y) ** 2, axis=axis)
  np.testing.assert_allclose(ms, 1.0, rtol=1e-4)

  # dtype preserved for bfloat16 input; float32 math inside then one rounding.
  xb = jnp.asarray(x, jnp.bfloat16)
  yb = layers.rms_norm(xb, axis=axis)
  assert yb.dtype == jnp.bfloat16
  assert_close(yb, np_rms(f64(xb), axis=axis), rtol=1e-2, atol=1e-2)


def test_rms_norm_module_with_weight():
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 5, 8)).astype(np.float32)
  f = transform(lambda x: layers.RMSNorm(eps=1e-6, name="norm")(x))
  params = f.init(jax.random.key(0), x)
  assert params["norm"]["weight"].dtype == jnp.float32
  np.testing.assert_array_equal(params["norm"]["weight"], np.ones(8))   # init ones
  weight = rng.standard_normal(8).astype(np.float32)
  y = f.apply({"norm": {"weight": jnp.asarray(weight)}}, x)
  assert y.dtype == jnp.float32
  assert_close(y, weight.astype(np.float64) * np_rms(x, eps=1e-6), rtol=1e-5, atol=1e-6)
  yb = f.apply({"norm": {"weight": jnp.asarray(weight)}}, jnp.asarray(x, jnp.bfloat16))
  assert yb.dtype == jnp.bfloat16


# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------


def test_rope_tables_and_apply_match_numpy():
  rng = np.random.default_rng(4)
  B, S, H, Dh = 2, 9, 3, 16
  x = rng.standard_normal((B, S, H, Dh)).astype(np.float32)
  cos, sin = layers.rope_tables(jnp.arange(S), head_dim=Dh, theta=10000.0)
  assert cos.shape == (S, Dh) and cos.dtype == jnp.float32
  ang = np.arange(S)[:, None] * 10000.0 ** (-(2.0 * np.arange(Dh // 2)) / Dh)
  assert_close(cos, np.cos(np.concatenate([ang, ang], -1)), rtol=0, atol=1e-5)
  assert_close(sin, np.sin(np.concatenate([ang, ang], -1)), rtol=0, atol=1e-5)
  y = layers.apply_rope(jnp.asarray(x), cos, sin)
  assert y.dtype == jnp.float32
  assert_close(y, np_rope(f64(x), np.arange(S), Dh), rtol=1e-5, atol=1e-5)
  # bf16 input keeps its dtype
  assert layers.apply_rope(jnp.asarray(x, jnp.bfloat16), cos, sin).dtype == jnp.bfloat16


def test_rope_per_row_positions():
  rng = np.random.default_rng(5)
  B, S, H, Dh = 3, 6, 2, 8
  x = rng.standard_normal((B, S, H, Dh)).astype(np.float32)
  pos = np.stack([np.arange(S), np.arange(S) + 5, np.maximum(np.arange(S) - 2, 0)]).astype(np.int32)
  cos, sin = layers.rope_tables(jnp.asarray(pos), head_dim=Dh, theta=500.0)
  assert cos.shape == (B, S, Dh)
  y = layers.apply_rope(jnp.asarray(x), cos, sin)
  assert_close(y, np_rope(f64(x), pos, Dh, theta=500.0), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# SwiGLU
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width,expansion,inner", [(512, 4, 1536), (97, 4, 512), (916, 4, 2560),
                                                   (64, 4, 256)])
def test_swiglu_width(width, expansion, inner):
  assert layers.swiglu_width(width, expansion) == inner


def test_swiglu_matches_numpy():
  rng = np.random.default_rng(6)
  x = rng.standard_normal((2, 5, 64)).astype(np.float32)
  f = transform(lambda x: layers.SwiGLU(expansion=4.0, dtype=jnp.float32, name="mlp")(x))
  params = f.init(jax.random.key(0), x)
  w_gu = f64(params["mlp/gate_up_proj"]["w"])
  w_d = f64(params["mlp/down_proj"]["w"])
  assert w_gu.shape == (64, 512) and w_d.shape == (256, 64)   # inner = swiglu_width(64, 4) = 256
  gu = f64(x) @ w_gu
  gate, up = gu[..., :256], gu[..., 256:]                       # first half gate, second half up
  want = (gate / (1.0 + np.exp(-gate)) * up) @ w_d
  y = f.apply(params, x)
  assert y.dtype == jnp.float32 and y.shape == x.shape
  assert_close(y, want, rtol=1e-4, atol=1e-5)
  # Swapping the halves (up first) gives a clearly different result: the test pins the order.
  swapped = (up / (1.0 + np.exp(-up)) * gate) @ w_d
  assert np.abs(swapped - want).max() > 1e-2


def _round_to_bf16(v):
  """float64 -> the nearest bfloat16 (ties to even), exactly: the float32 detour can land on the
  wrong side of a tie, so the two bfloat16 neighbours of its result compete as well."""
  b = v.astype(np.float32).astype(ml_dtypes.bfloat16)
  best, best_err = b, np.abs(b.astype(np.float64) - v)
  for step in (-1, 1):
    c = (b.view(np.uint16).astype(np.int32) + step).clip(0, 65535).astype(np.uint16).view(
        ml_dtypes.bfloat16)
    err = np.abs(c.astype(np.float64) - v)
    even = (c.view(np.uint16) % 2 == 0) & (best.view(np.uint16) % 2 == 1)
    take = np.isfinite(err) & ((err < best_err) | ((err == best_err) & even))
    best, best_err = np.where(take, c, best), np.where(take, err, best_err)
  return best


def test_silu_rounds_once_like_torch():
  """layers.silu on bfloat16 is the correctly rounded x / (1 + exp(-x)) for every bfloat16 x in
  [-80, 80] whose silu is a normal number (what torch's F.silu gives, from float32); jax.nn.silu
  rounds the sigmoid first and misses it for ~39% of standard-normal inputs. float32: unchanged."""
  x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
  with np.errstate(invalid="ignore"):                           # the NaN bit patterns
    x64 = x.astype(np.float64)
  keep = np.isfinite(x64) & (np.abs(x64) <= 80)
  x, x64 = x[keep], x64[keep]
  want64 = x64 / (1.0 + np.exp(-x64))
  normal = np.abs(want64) >= np.finfo(np.float32).tiny        # XLA:CPU flushes subnormals to zero
  want = _round_to_bf16(want64)
  got = np.asarray(jax.jit(layers.silu)(jnp.asarray(x)))
  assert got.dtype == jnp.bfloat16 and normal.sum() > 32000
  np.testing.assert_array_equal(f64(got)[normal], f64(want)[normal])
  r = np.random.default_rng(3).standard_normal(1 << 16).astype(ml_dtypes.bfloat16)
  twice = np.mean(f64(jax.nn.silu(jnp.asarray(r))) == f64(layers.silu(jnp.asarray(r))))
  assert 0.5 < twice < 0.7, twice                               # why layers.silu exists
  r32 = jnp.asarray(np.random.default_rng(4).standard_normal(4096), jnp.float32)
  np.testing.assert_array_equal(np.asarray(layers.silu(r32)), np.asarray(jax.nn.silu(r32)))


def test_silu_equals_torch_bit_for_bit():
  torch = pytest.importorskip("torch", reason="the torch cross-check needs torch (pip '.[torch]')")
  r = np.random.default_rng(5).standard_normal(1 << 16).astype(np.float32) * 4
  t = torch.nn.functional.silu(torch.from_numpy(r).to(torch.bfloat16)).float().numpy()
  got = layers.silu(jnp.asarray(r, jnp.bfloat16))
  np.testing.assert_array_equal(f64(got), t.astype(np.float64))
  # SwiGLU (one more rounding) and its gradient: torch's autograd of F.silu(gate) * up, bit for bit,
  # from JAX's autodiff and from xla_cpu's lean_swiglu hand-written backward alike.
  gate_up = jnp.asarray(r.reshape(256, 256), jnp.bfloat16)
  ct = jnp.asarray(np.random.default_rng(6).standard_normal((256, 128)), jnp.bfloat16)
  tg = torch.from_numpy(np.array(gate_up.astype(jnp.float32))).to(torch.bfloat16).requires_grad_()
  out = torch.nn.functional.silu(tg[:, :128]) * tg[:, 128:]
  out.backward(torch.from_numpy(np.array(ct.astype(jnp.float32))).to(torch.bfloat16))
  for lean in (False, True):
    h, vjp = jax.vjp(lambda v: _swiglu_activation(lean)(v), gate_up)
    np.testing.assert_array_equal(f64(h), out.detach().float().numpy())
    np.testing.assert_array_equal(f64(vjp(ct)[0]), tg.grad.float().numpy())
    # Jitted too (as a training step runs): there XLA drops a bfloat16 round trip between float32
    # operations unless it is a reduce_precision; d silu = g * up is rounded as torch rounds it.
    jitted = jax.jit(lambda v, c: jax.vjp(
        lambda w: _swiglu_activation(lean)(w), v)[1](c)[0])
    np.testing.assert_array_equal(f64(jitted(gate_up, ct)), tg.grad.float().numpy())


def _swiglu_activation(lean):
  """The default swiglu_activation, or xla_cpu's lean_swiglu form of it."""
  return xla_cpu.swiglu_activation if lean else layers.swiglu_activation


def _np_swiglu_grads(gate, up, ct):
  """float64 d gate, d up of sum(ct * silu(gate) * up) (torch's SiLU backward formula)."""
  s = 1.0 / (1.0 + np.exp(-gate))
  return ct * up * s * (1.0 + gate * (1.0 - s)), ct * gate * s


@pytest.mark.parametrize("axis", [-1, 0], ids=["rows", "feature_major"])
def test_swiglu_lean_grad_values_and_gradients(axis):
  """xla_cpu.swiglu_activation (the lean_swiglu CPU form): the same values bit for bit;
  float32 gradients equal float64's to rounding; bfloat16 gradients no further from float64's than
  JAX's own gradient of silu(gate) * up (it rounds d gate once, from float32, as torch does)."""
  rng = np.random.default_rng(11)
  F, N = 24, 10
  shape = (N, 2 * F) if axis == -1 else (2 * F, N)
  gu = rng.standard_normal(shape) * 2.0
  ct = rng.standard_normal((N, F) if axis == -1 else (F, N))
  gate, up = np.split(gu, 2, axis=axis)
  want = np.concatenate(_np_swiglu_grads(gate, up, ct), axis=axis)
  errs = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    x, c = jnp.asarray(gu, dtype), jnp.asarray(ct, dtype)
    out = {}
    for lean in (False, True):
      h, vjp = jax.vjp(lambda v: _swiglu_activation(lean)(v, axis=axis), x)
      out[lean] = (h, vjp(c)[0])
    assert out[True][0].dtype == dtype and out[True][1].shape == shape
    np.testing.assert_array_equal(f64(out[True][0]), f64(out[False][0]))     # the same forward
    if dtype == jnp.float32:
      assert_close(out[True][1], want, rtol=1e-5, atol=1e-5)
    else:
      ref = np.concatenate(_np_swiglu_grads(f64(x)[:F] if axis == 0 else f64(x)[:, :F],
                                            f64(x)[F:] if axis == 0 else f64(x)[:, F:], f64(c)),
                           axis=axis)                           # float64 on the bfloat16 inputs
      errs = {lean: np.linalg.norm(f64(out[lean][1]) - ref) / np.linalg.norm(ref)
              for lean in (False, True)}
      assert errs[True] < 0.01 and errs[True] <= errs[False] * 1.05, errs


@pytest.mark.parametrize("axis", [-1, 0], ids=["rows", "feature_major"])
def test_swiglu_lean_grad_keeps_fewer_buffers_and_equal_gradients(axis):
  """Why lean_swiglu exists: in a compiled gradient of L SwiGLU layers XLA keeps sigmoid(gate) and
  silu(gate) of every layer for the backward pass ([N, F] each); with lean_swiglu it keeps neither
  (at least 2L - 1 buffers of [N, F] less compiled scratch). The weight gradients stay equal."""
  N, D, F, L = 512, 64, 256, 3
  rng = np.random.default_rng(12)
  ws = [(jnp.asarray(rng.standard_normal((D, 2 * F)) / 8, jnp.float32),
         jnp.asarray(rng.standard_normal((F, D)) / 16, jnp.float32)) for _ in range(L)]
  x = jnp.asarray(rng.standard_normal((N, D) if axis == -1 else (D, N)), jnp.float32)

  def loss(ws, x, lean):
    for w1, w2 in ws:
      if axis == -1:                                            # rows: [N, D]
        x = x + _swiglu_activation(lean)(x @ w1, axis=-1) @ w2
      else:                                                     # feature-major: [D, N]
        x = x + w2.T @ _swiglu_activation(lean)(w1.T @ x, axis=0)
    return jnp.sum(jnp.sin(x))

  temp, grads = {}, {}
  for lean in (False, True):
    c = jax.jit(jax.grad(lambda ws, x: loss(ws, x, lean))).lower(ws, x).compile()
    temp[lean] = c.memory_analysis().temp_size_in_bytes
    grads[lean] = c(ws, x)
  assert temp[False] - temp[True] >= (2 * L - 1) * N * F * 4, temp
  for (path, a), b in zip(jax.tree.leaves_with_path(grads[True]), jax.tree.leaves(grads[False])):
    scale = np.abs(f64(b)).max()
    np.testing.assert_allclose(f64(a), f64(b), rtol=1e-5, atol=1e-6 * scale,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("feature_major", [False, True], ids=["rows", "feature_major"])
def test_gate_up_swiglu_equals_the_projection_then_lean_swiglu(feature_major):
  """xla_cpu.gate_up_swiglu (the split_gate_up CPU form) is `xla_cpu.matmul` (`wt_matmul`) followed
  by `xla_cpu.swiglu_activation` with one gradient: the same values bit for bit and the same
  weight gradient bit for bit; the input gradient sums the gate and up halves' products apart, so
  it agrees to float32 rounding (bfloat16: within one rounding of the result). float32 matches
  float64 numpy. feature_major with bfloat16 also pads the contraction (I = 33 -> 64)."""
  rng = np.random.default_rng(13)
  N, I, F = 40, 33, 24
  x64 = rng.standard_normal((I, N) if feature_major else (N, I))
  w64 = rng.standard_normal((I, 2 * F)) / 4
  ct64 = rng.standard_normal((F, N) if feature_major else (N, F))
  for dtype in (jnp.float32, jnp.bfloat16):
    pad = feature_major and dtype == jnp.bfloat16
    x, w, ct = jnp.asarray(x64, dtype), jnp.asarray(w64, jnp.float32), jnp.asarray(ct64, dtype)

    def two_steps(x, w):
      if feature_major:
        gu = xla_cpu.wt_matmul(w, x, dtype, pad_contraction=pad).astype(dtype)
      else:
        gu = xla_cpu.matmul(x, w, dtype).astype(dtype)
      return xla_cpu.swiglu_activation(gu, axis=0 if feature_major else -1)

    def one_step(x, w):
      return xla_cpu.gate_up_swiglu(x, w, dtype, feature_major=feature_major, pad_contraction=pad)

    out = {}
    for name, f in (("two", two_steps), ("one", one_step)):
      h, vjp = jax.jit(lambda x, w: jax.vjp(f, x, w))(x, w)
      out[name] = (h,) + tuple(vjp(ct))
    (h1, dx1, dw1), (h0, dx0, dw0) = out["one"], out["two"]
    assert h1.dtype == dtype and dx1.dtype == dtype and dw1.dtype == jnp.float32
    np.testing.assert_array_equal(f64(h1), f64(h0))
    np.testing.assert_array_equal(f64(dw1), f64(dw0))
    tol = 1e-6 if dtype == jnp.float32 else 2.0 ** -8
    assert np.abs(f64(dx1) - f64(dx0)).max() <= tol * np.abs(f64(dx0)).max()
    if dtype == jnp.float32:                                    # float64 numpy on the same inputs
      gu = (x64.T @ w64).T if feature_major else x64 @ w64
      gate, up = np.split(gu, 2, axis=0 if feature_major else 1)
      s_ = 1.0 / (1.0 + np.exp(-gate))
      assert_close(h1, gate * s_ * up, rtol=1e-5, atol=1e-5)
      d_gate, d_up = _np_swiglu_grads(gate, up, ct64)
      d_gu = np.concatenate([d_gate, d_up], axis=0 if feature_major else 1)
      assert_close(dx1, w64 @ d_gu if feature_major else d_gu @ w64.T, rtol=1e-5, atol=1e-5)
      assert_close(dw1, x64 @ d_gu.T if feature_major else x64.T @ d_gu, rtol=1e-5, atol=1e-5)


def test_swiglu_split_grad_keeps_the_parameters_and_values():
  """SwiGLU(kernels="xla_cpu") with split_gate_up (bfloat16, with fast_grad and lean_swiglu)
  creates the same parameters, initialised the same, and returns the same values as without it;
  without fast_grad and lean_swiglu it is off."""
  x = jnp.asarray(np.random.default_rng(14).standard_normal((2, 5, 16)), jnp.bfloat16)
  outs, params = {}, {}
  for split in (False, True):
    f = hk.transform(lambda v: layers.SwiGLU(expansion=2.0, kernels="xla_cpu")(v))
    with xla_cpu.override(split_gate_up=split):
      assert xla_cpu.forms("xla_cpu", jnp.bfloat16).split_gate_up == split
      params[split] = f.init(jax.random.PRNGKey(3), x)
      outs[split] = f.apply(params[split], None, x)
  with xla_cpu.override(fast_grad=False):
    assert not xla_cpu.forms("xla_cpu", jnp.bfloat16).split_gate_up
  with xla_cpu.override(lean_swiglu=False):
    assert not xla_cpu.forms("xla_cpu", jnp.bfloat16).split_gate_up
  assert not xla_cpu.forms("xla_cpu", jnp.float32).split_gate_up
  assert jax.tree.structure(params[True]) == jax.tree.structure(params[False])
  assert sorted(params[True]["swi_glu/gate_up_proj"]) == ["w"]
  for a, b in zip(jax.tree.leaves(params[True]), jax.tree.leaves(params[False])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(f64(outs[True]), f64(outs[False]))


# --------------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------------

D = 32


def run_attention(x, *, H, K, Dh, causal=False, qkv_bias=False, out_bias=False, mask=None,
                  rope_pos=None, theta=10000.0, seed=0, head_major=False):
  with xla_cpu.override(fast_grad=False):    # xla_cpu's head_major form alone, when asked for
    return _run_attention(x, H=H, K=K, Dh=Dh, causal=causal, qkv_bias=qkv_bias,
                          out_bias=out_bias, mask=mask, rope_pos=rope_pos, theta=theta, seed=seed,
                          kernels="xla_cpu" if head_major else "default")


def _run_attention(x, *, H, K, Dh, causal, qkv_bias, out_bias, mask, rope_pos, theta, seed,
                   kernels):
  rng = np.random.default_rng(seed + 100)

  def fn(x, mask):
    rope = None
    if rope_pos is not None:
      rope = layers.rope_tables(jnp.asarray(rope_pos), head_dim=Dh, theta=theta)
    attn = layers.Attention(num_heads=H, head_dim=Dh, num_kv_heads=K, causal=causal,
                            qkv_bias=qkv_bias, out_bias=out_bias, dtype=jnp.float32, name="attn",
                            kernels=kernels)
    return attn(x, rope=rope, mask=mask)

  f = transform(fn)
  jmask = None if mask is None else jnp.asarray(mask)[:, None]   # [B, 1, S, S]
  params = f.init(jax.random.key(seed), x, jmask)
  assert params["attn/qkv_proj"]["w"].shape == (D, (H + 2 * K) * Dh)
  assert params["attn/o_proj"]["w"].shape == (H * Dh, D)
  if qkv_bias:
    params["attn/qkv_proj"]["b"] = jnp.asarray(
        rng.standard_normal((H + 2 * K) * Dh), jnp.float32)
  if out_bias:
    params["attn/o_proj"]["b"] = jnp.asarray(rng.standard_normal(D), jnp.float32)
  y = f.apply(params, x, jmask)
  want = np_attention(
      f64(x), f64(params["attn/qkv_proj"]["w"]), f64(params["attn/o_proj"]["w"]),
      H=H, K=K, Dh=Dh,
      b_qkv=f64(params["attn/qkv_proj"]["b"]) if qkv_bias else None,
      b_o=f64(params["attn/o_proj"]["b"]) if out_bias else None,
      mask=mask, causal=causal, rope_pos=rope_pos, theta=theta)
  return y, want


def _x(seed=7, B=2, S=6):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((B, S, D)), jnp.float32)


def test_attention_noncausal_mha():
  y, want = run_attention(_x(), H=4, K=4, Dh=8)
  assert y.dtype == jnp.float32 and y.shape == (2, 6, D)
  assert_close(y, want, rtol=1e-4, atol=1e-5)


def test_attention_is_noncausal_by_default():
  # A later token changes an earlier token's output (no causal mask).
  x = _x()
  y1, _ = run_attention(x, H=2, K=2, Dh=16)
  y2, _ = run_attention(x.at[:, -1].add(1.0), H=2, K=2, Dh=16)
  assert np.abs(f64(y1[:, 0]) - f64(y2[:, 0])).max() > 1e-4


def test_attention_causal():
  y, want = run_attention(_x(), H=4, K=4, Dh=8, causal=True)
  assert_close(y, want, rtol=1e-4, atol=1e-5)


def test_attention_grouped_kv_heads():
  # H = 4, K = 2: query head h uses KV head h // 2.
  y, want = run_attention(_x(), H=4, K=2, Dh=8, seed=1)
  assert_close(y, want, rtol=1e-4, atol=1e-5)
  # The interleaved grouping (query head h -> KV head h % K) gives a clearly different answer, so
  # the comparison above pins h // (H // K). Emulate it in NumPy by permuting the query heads.
  x = _x()
  f = transform(lambda x: layers.Attention(num_heads=4, head_dim=8, num_kv_heads=2,
                                           dtype=jnp.float32, name="attn")(x))
  params = f.init(jax.random.key(1), x)
  w, wo = f64(params["attn/qkv_proj"]["w"]), f64(params["attn/o_proj"]["w"])
  perm = [0, 2, 1, 3]
  w_perm = np.concatenate([w[:, h * 8:(h + 1) * 8] for h in perm] + [w[:, 32:]], axis=1)
  wo_perm = np.concatenate([wo[h * 8:(h + 1) * 8] for h in perm], axis=0)
  want_interleaved = np_attention(f64(x), w_perm, wo_perm, H=4, K=2, Dh=8)
  assert np.abs(f64(y) - want_interleaved).max() > 1e-3


def test_attention_with_biases():
  y, want = run_attention(_x(), H=2, K=2, Dh=16, qkv_bias=True, out_bias=True, seed=2)
  assert_close(y, want, rtol=1e-4, atol=1e-5)


def test_attention_padding_mask_with_fully_masked_row():
  B, S = 2, 6
  mask = np.ones((B, S, S), bool)
  mask[0, :, 4:] = False          # row 0: keys 4, 5 are padding
  mask[1, :, 3:] = False          # row 1: keys 3.. are padding
  mask[1, 2, :] = False           # and query 2 of row 1 may attend to nothing
  y, want = run_attention(_x(), H=4, K=2, Dh=8, mask=mask, seed=3)
  assert np.all(np.isfinite(f64(y)))
  assert_close(y, want, rtol=1e-4, atol=1e-5)
  # the masked keys have no effect on the other rows
  x2 = _x().at[0, 4:].add(5.0)
  y2, _ = run_attention(x2, H=4, K=2, Dh=8, mask=mask, seed=3)
  assert_close(y2[0, :4], f64(y[0, :4]), rtol=1e-5, atol=1e-5)


def test_attention_with_rope():
  S = 6
  y, want = run_attention(_x(S=S), H=2, K=2, Dh=16, rope_pos=np.arange(S), seed=4)
  assert_close(y, want, rtol=1e-4, atol=1e-5)
  # with grouped heads, per-row positions and a small theta
  pos = np.stack([np.arange(S), np.arange(S) + 3])
  y, want = run_attention(_x(S=S), H=4, K=2, Dh=8, rope_pos=pos, theta=100.0, causal=True, seed=5)
  assert_close(y, want, rtol=1e-4, atol=1e-5)


def test_attention_head_major_matches_numpy_and_the_default_gradients():
  """head_major (an xla_cpu form: q, k, v copied head-major before the batched matmuls) is the same
  attention: float64 NumPy's values with grouped heads, a padding mask with a fully masked row, RoPE
  and a causal mask; its float32 gradients equal the default layout's to rounding."""
  B, S = 2, 6
  mask = np.ones((B, S, S), bool)
  mask[1, :, 3:] = False
  mask[1, 2, :] = False
  pos = np.stack([np.arange(S), np.arange(S) + 3])
  for kw in (dict(H=4, K=4, Dh=8), dict(H=4, K=2, Dh=8, mask=mask, seed=3),
             dict(H=4, K=2, Dh=8, rope_pos=pos, theta=100.0, causal=True, seed=5)):
    y, want = run_attention(_x(), head_major=True, **kw)
    assert y.shape == (B, S, D), kw
    assert_close(y, want, rtol=1e-4, atol=1e-5, msg=str(kw))

  x = _x()
  jmask = jnp.asarray(mask)[:, None]
  def loss(head_major):
    f = transform(lambda x: layers.Attention(num_heads=4, head_dim=8, num_kv_heads=2,
                                             dtype=jnp.float32, name="attn",
                                             kernels="xla_cpu" if head_major else "default"
                                             )(x, mask=jmask))
    return f, lambda p, x: jnp.sum(jnp.sin(f.apply(p, x)))
  f0, l0 = loss(False)
  _, l1 = loss(True)
  params = f0.init(jax.random.key(1), x)
  g0 = jax.jit(jax.grad(l0, argnums=(0, 1)))(params, x)
  with xla_cpu.override(fast_grad=False):                         # head_major alone
    g1 = jax.jit(jax.grad(l1, argnums=(0, 1)))(params, x)
  for (path, a), b in zip(jax.tree.leaves_with_path(g1), jax.tree.leaves(g0)):
    scale = np.abs(f64(b)).max()
    assert scale > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(f64(a), f64(b), rtol=1e-5, atol=1e-6 * scale,
                               err_msg=jax.tree_util.keystr(path))


def test_split_qkv_gradient_is_the_slices_gradient_concatenated():
  """head_major's q|k|v split (`xla_cpu.split_qkv`): the same slices; its gradient is exactly
  autodiff's (pure data movement), built by concatenation instead of pads; through RoPE and the
  bfloat16 attention it equals autodiff's but for float32 rounding in RoPE's backward pass."""
  B, S, H, K, Dh = 2, 13, 4, 2, 8
  rng = np.random.default_rng(0)
  qkv = jnp.asarray(rng.standard_normal((B, S, H + 2 * K, Dh)), jnp.float32)
  c = [jnp.asarray(rng.standard_normal((B, S, n, Dh)), jnp.float32) for n in (H, K, K)]
  plain = lambda x: (x[:, :, :H], x[:, :, H:H + K], x[:, :, H + K:])   # noqa: E731
  for a, b in zip(xla_cpu.split_qkv(qkv, H, K), plain(qkv)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  loss = lambda split: (lambda x: sum(jnp.sum(jnp.sin(p) * w)          # noqa: E731
                                      for p, w in zip(split(x), c)))
  ours = jax.jit(jax.grad(loss(lambda x: xla_cpu.split_qkv(x, H, K))))
  want = jax.grad(loss(plain))(qkv)
  np.testing.assert_array_equal(np.asarray(ours(qkv)), np.asarray(want))
  assert " pad(" not in ours.lower(qkv).compile().as_text()
  assert " pad(" in jax.jit(jax.grad(loss(plain))).lower(qkv).compile().as_text()
  # TRM-Att's use: RoPE on q and k, head_major bfloat16 attention, the gradient of q|k|v.
  B, S, H, Dh = 4, 97, 8, 64
  cos, sin = layers.rope_tables(jnp.arange(S), head_dim=Dh)
  qkv = jnp.asarray(rng.standard_normal((B, S, 3 * H, Dh)), jnp.bfloat16)
  g = jnp.asarray(rng.standard_normal((B, S, H, Dh)), jnp.float32)
  def attention(split):
    def f(x):
      q, k, v = split(x)
      q, k = layers.apply_rope(q, cos, sin), layers.apply_rope(k, cos, sin)
      out = layers.dot_product_attention(q, k, v, kernels="xla_cpu")
      return jnp.sum(out.astype(jnp.float32) * g)
    return jax.jit(jax.grad(f))
  a = f64(attention(lambda x: xla_cpu.split_qkv(x, H, H))(qkv))
  b = f64(attention(lambda x: (x[:, :, :H], x[:, :, H:2 * H], x[:, :, 2 * H:]))(qkv))
  # Entries apart only where RoPE's g cos + g' sin nearly cancels (float32 contraction differs):
  # measured 4 of 595,968, each by 1-2 bfloat16 ulps of a value ~1e-5 of the gradient's largest.
  np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.abs(b).max())
  assert np.mean(a != b) < 1e-4
  np.testing.assert_array_equal(a[:, :, 2 * H:], b[:, :, 2 * H:])      # v's part: no RoPE


def _np_attention_grads(q, k, v, c):
  """float64 out and (dq, dk, dv) of sum(c * attention(q, k, v)), no mask; q [B, S, H, Dh], k, v
  [B, S, K, Dh] (query head h uses KV head h // (H // K))."""
  H, K, Dh = q.shape[2], k.shape[2], q.shape[3]
  ke, ve = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)
  s = np.einsum("bqhd,bshd->bhqs", q, ke) / math.sqrt(Dh)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  out = np.einsum("bhqs,bshd->bqhd", p, ve)
  dp = np.einsum("bqhd,bshd->bhqs", c, ve)
  ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) / math.sqrt(Dh)
  dq = np.einsum("bhqs,bshd->bqhd", ds, ke)
  dk = np.einsum("bhqs,bqhd->bshd", ds, q)
  dv = np.einsum("bhqs,bqhd->bshd", p, c)
  fold = lambda a: a.reshape(a.shape[:2] + (K, H // K, Dh)).sum(3)     # sum over each KV group
  return out, (dq, fold(dk), fold(dv))


@pytest.mark.parametrize("H,K", [(4, 4), (4, 2)], ids=["heads", "grouped"])
def test_head_major_bfloat16_backward_pass(H, K):
  """head_major in bfloat16 without a mask (TRM-Att's attention) has its backward pass written out:
  the forward values are the default layout's to bfloat16 rounding, and dq, dk, dv against float64
  (on the same bfloat16 inputs, 97 positions) are as close as the default layout's autodiff."""
  B, S, Dh = 2, 97, 16
  rng = np.random.default_rng(21)
  q, k, v = (jnp.asarray(rng.standard_normal((B, S, n, Dh)), jnp.bfloat16) for n in (H, K, K))
  c = jnp.asarray(rng.standard_normal((B, S, H, Dh)), jnp.float32)
  want_out, want = _np_attention_grads(f64(q), f64(k), f64(v), f64(c))
  out, errs = {}, {}
  for hm in (False, True):
    f = lambda q, k, v, hm=hm: layers.dot_product_attention(  # noqa: E731
        q, k, v, kernels="xla_cpu" if hm else "default")
    if hm:
      assert "custom_vjp_call" in str(jax.make_jaxpr(f)(q, k, v))
    loss = lambda q, k, v, f=f: jnp.sum(c * f(q, k, v).astype(jnp.float32))
    out[hm] = f64(jax.jit(f)(q, k, v))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert all(g.dtype == jnp.bfloat16 for g in grads)
    errs[hm] = [np.linalg.norm(f64(g) - w) / np.linalg.norm(w) for g, w in zip(grads, want)]
  scale = np.abs(want_out).max()
  assert np.abs(out[True] - out[False]).max() <= 2 ** -7 * scale
  assert np.abs(out[True] - want_out).max() <= 2 ** -7 * scale
  for e_new, e_ref in zip(errs[True], errs[False]):
    assert e_new < 0.01 and e_new <= 1.1 * e_ref + 1e-4, errs


def test_head_majors_softmax_is_jax_softmax_bit_for_bit_with_the_same_gradient():
  """head_major's softmax takes the row max as a tree of elementwise maxima: the max is exact, so
  the values are jax.nn.softmax's bit for bit (rows of odd and even lengths, TRM-Att's 97, a row
  masked to the float32 minimum, large and tiny scores); the gradient equals jax.nn.softmax's to
  float32 rounding."""
  rng = np.random.default_rng(0)
  for n in (1, 2, 3, 8, 97):
    s = rng.standard_normal((3, 4, n)).astype(np.float32) * 30.0
    s[0, 1] = np.finfo(np.float32).min                            # a fully masked row
    s[1, 2, : (n + 1) // 2] = -1e30                               # half a row far below the rest
    s = jnp.asarray(s)
    tree_softmax = xla_cpu._softmax_tree_max                      # pylint: disable=protected-access
    got = jax.jit(tree_softmax)(s)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(
        lambda x: jax.nn.softmax(x, axis=-1))(s)), err_msg=f"n={n}")
    np.testing.assert_allclose(f64(got).sum(-1), 1.0, rtol=1e-6)
    w = jnp.asarray(rng.standard_normal(s.shape).astype(np.float32))
    g_tree = jax.jit(jax.grad(lambda x: jnp.sum(tree_softmax(x) * w)))(s)
    g_ref = jax.jit(jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=-1) * w)))(s)
    np.testing.assert_allclose(f64(g_tree), f64(g_ref), rtol=1e-5,
                               atol=1e-6 * max(np.abs(f64(g_ref)).max(), 1e-30), err_msg=f"n={n}")


def test_attention_bfloat16_close_to_float64():
  x = _x()

  def fn(x):
    return layers.Attention(num_heads=4, head_dim=8, dtype=jnp.bfloat16, name="attn")(x)

  f = transform(fn)
  params = f.init(jax.random.key(0), x)
  y = f.apply(params, x)
  assert y.dtype == jnp.bfloat16
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  want = np_attention(f64(x), f64(params["attn/qkv_proj"]["w"]),
                      f64(params["attn/o_proj"]["w"]), H=4, K=4, Dh=8)
  assert_close(y, want, rtol=5e-2, atol=5e-2)


# --------------------------------------------------------------------------------------------------
# Init statistics (one large matrix each; init only).
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("std", [1.0, 0.02])
def test_truncated_normal_std_and_bounds(std):
  init = transform(lambda: hk.get_parameter("w", [1000, 1000], jnp.float32,
                                            init=layers.TruncatedNormal(std)))
  w = f64(init.init(jax.random.key(0))["~"]["w"])
  assert abs(w.std() / std - 1.0) < 0.02, w.std()
  assert abs(w.mean()) < 0.01 * std
  bound = 2.0 * std / TRUNC_STD
  assert np.abs(w).max() <= bound * (1 + 1e-6)
  # the samples do reach close to the bound (a plain std-s truncated normal would stop at 2 s)
  assert np.abs(w).max() > 0.99 * bound


def test_linear_default_init_std_is_one_over_sqrt_fan_in():
  fan_in = 1024
  f = transform(lambda x: layers.Linear(1024, dtype=jnp.float32, name="lin")(x))
  params = jax.eval_shape(f.init, jax.random.key(0), jnp.zeros((1, fan_in)))
  assert params["lin"]["w"].shape == (fan_in, 1024)
  # initialise only (no forward pass): materialise the parameter with the same initialiser
  w = f64(jax.jit(f.init)(jax.random.key(0), jnp.zeros((1, fan_in)))["lin"]["w"])
  target = 1.0 / math.sqrt(fan_in)
  assert abs(w.std() / target - 1.0) < 0.02, (w.std(), target)
  assert np.abs(w).max() <= 2.0 * target / TRUNC_STD * (1 + 1e-6)


def test_count_params():
  tree = {"a": {"w": jnp.zeros((3, 4))}, "b": {"w": jnp.zeros((5,)), "b": jnp.zeros((2, 2, 2))}}
  assert layers.count_params(tree) == 12 + 5 + 8
