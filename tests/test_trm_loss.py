"""Tests of experiments/trm/losses.py against independent float64 NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.trm import losses

IGNORE = -100
V = 11


# --------------------------------------------------------------------------------------------------
# Float64 NumPy references, written from docs/trm.md section 2 (the reference's formulas).
# --------------------------------------------------------------------------------------------------


def np_stablemax_ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """-log(s(x_label) / sum s(x)) in float64, 0 where ignored (the reference's own formula)."""
  x = np.asarray(logits, np.float64)
  s = np.where(x < 0, 1.0 / (1.0 - np.minimum(x, 0.0)), x + 1.0)
  log_p = np.log(s / s.sum(-1, keepdims=True))
  valid = labels != IGNORE
  safe = np.where(valid, labels, 0)
  return np.where(valid, -np.take_along_axis(log_p, safe[..., None], -1)[..., 0], 0.0)


def np_act_loss(logits, labels, q_halt, halted, steps, divisor):
  x = np.asarray(logits, np.float64)
  valid = labels != IGNORE
  n_valid = valid.sum(-1)
  div = np.maximum(n_valid, 1)
  lm_loss = (np_stablemax_ce(x, labels).sum(-1) / div).sum()
  correct = valid & (x.argmax(-1) == labels)
  exact = correct.sum(-1) == n_valid  # The reference: True for a row without valid tokens.
  q = np.asarray(q_halt, np.float64)
  z = exact.astype(np.float64)
  sig = 1.0 / (1.0 + np.exp(-q))
  bce = -(z * np.log(sig) + (1.0 - z) * np.log1p(-sig))
  q_halt_loss = bce.sum()
  counted = halted & (n_valid > 0)
  metrics = {
      "count": counted.sum(),
      "accuracy": np.where(counted, correct.sum(-1) / div, 0.0).sum(),
      "exact_accuracy": (counted & exact).sum(),
      "q_halt_accuracy": (counted & ((q >= 0) == exact)).sum(),
      "steps": np.where(counted, steps, 0).sum(),
      "lm_loss": lm_loss,
      "q_halt_loss": q_halt_loss,
  }
  return (lm_loss + 0.5 * q_halt_loss) / divisor, metrics


def rel_err(got, want, valid=None):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  err = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
  return float(err[valid].max() if valid is not None else err.max())


def make_logits(rng: np.random.Generator, b: int, l: int, scale: float):
  """Random logits with very confident correct rows, very wrong rows and ignored tokens."""
  x = (rng.standard_normal((b, l, V)) * scale).astype(np.float32)  # [B, L, V]
  labels = rng.integers(0, V, (b, l)).astype(np.int32)  # [B, L]
  rows = np.arange(l)
  # Row 0: very confident and correct (losses ~1e-6).
  x[0] = -3000.0
  x[0, rows, labels[0]] = 3000.0
  # Row 1: very wrong (label far negative, another class far positive; losses ~log(1e5)).
  x[1] = rng.standard_normal((l, V)) * 3
  x[1, rows, labels[1]] = -500.0
  x[1, rows, (labels[1] + 1) % V] = 200.0
  # Row 2: right but barely; row 3: logits exactly 0 (s = 1 for every class).
  x[2, rows, labels[2]] = x[2].max(-1) + 0.25
  x[3] = 0.0
  labels[4, rng.random(l) < 0.3] = IGNORE  # Partly ignored.
  return x, labels


# --------------------------------------------------------------------------------------------------
# stablemax_cross_entropy.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 8.0, 40.0])
def test_stablemax_ce_float64_relative_accuracy(dtype, scale):
  rng = np.random.default_rng(int(scale))
  x, labels = make_logits(rng, 24, 81, scale)
  xj = jnp.asarray(x).astype(dtype)
  got = jax.jit(losses.stablemax_cross_entropy)(xj, jnp.asarray(labels))
  assert got.dtype == jnp.float32 and got.shape == labels.shape
  # The reference casts the (possibly bfloat16) logits to float64: exact from the float32 cast.
  want = np_stablemax_ce(np.asarray(xj.astype(jnp.float32)), labels)
  valid = labels != IGNORE
  assert want[0][valid[0]].max() < 2e-6  # the confident rows really have tiny losses
  assert want[1][valid[1]].min() > 10.0  # and the wrong ones huge
  err = rel_err(got, want, valid)
  print(f"stablemax float32 vs float64, {jnp.dtype(dtype).name} scale {scale}: max rel err {err:.3e}")
  assert err <= 1e-6
  np.testing.assert_array_equal(np.asarray(got)[~valid], 0.0)


def test_stablemax_ce_gradient_matches_float64():
  rng = np.random.default_rng(7)
  x = (rng.standard_normal((3, 5, V)) * 4).astype(np.float32)
  x[0, 0, :4] = 0.0  # The kink of s at 0.
  labels = rng.integers(0, V, (3, 5)).astype(np.int32)
  labels[2, 1] = IGNORE
  got = jax.jit(jax.grad(lambda z: losses.stablemax_cross_entropy(z, jnp.asarray(labels)).sum()))(
      jnp.asarray(x))                               # one compile (op by op: many tiny ones)
  # d/dx_j [log S - log s_l] = s'(x_j) / S - [j == l] s'(x_l) / s_l, with s'(x) = 1/(1-x)^2 (x<0), 1.
  xd = x.astype(np.float64)
  s = np.where(xd < 0, 1.0 / (1.0 - np.minimum(xd, 0.0)), xd + 1.0)
  ds = np.where(xd < 0, 1.0 / (1.0 - np.minimum(xd, 0.0)) ** 2, 1.0)
  safe = np.where(labels == IGNORE, 0, labels)
  onehot = np.eye(V)[safe]
  want = ds / s.sum(-1, keepdims=True) - onehot * ds / s
  want[labels == IGNORE] = 0.0
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# act_loss_and_metrics.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,b,l", [(jnp.bfloat16, 32, 81), (jnp.float32, 8, 900)])
def test_act_loss_and_metrics_match_float64(dtype, b, l):
  rng = np.random.default_rng(b)
  x, labels = make_logits(rng, b, l, 6.0)
  # Rows 5, 6: exactly right (exact = 1) on every valid token; row 6 also partly ignored.
  for r in (5, 6):
    labels[r] = x[r].argmax(-1)
    x[r, np.arange(l), labels[r]] += 1.0  # no ties after a bfloat16 cast
  labels[6, : l // 2] = IGNORE
  labels[7] = IGNORE  # Row 7: no valid token at all.
  q_halt = (rng.standard_normal(b) * 6).astype(np.float32)  # [B]
  q_halt[0], q_halt[5], q_halt[7] = 30.0, -0.0, -5.0
  q_halt[1] = -40.0
  halted = rng.random(b) < 0.6  # [B]
  halted[[0, 1, 5, 6, 7]] = True
  halted[2] = False
  steps = rng.integers(1, 17, b).astype(np.int32)  # [B]
  q_continue = rng.standard_normal(b).astype(np.float32)

  xj = jnp.asarray(x).astype(dtype)
  fn = jax.jit(losses.act_loss_and_metrics, static_argnames="loss_divisor")
  loss, metrics = fn(xj, jnp.asarray(labels), jnp.asarray(q_halt), jnp.asarray(q_continue),
                     jnp.asarray(halted), jnp.asarray(steps), loss_divisor=b)
  want_loss, want = np_act_loss(np.asarray(xj.astype(jnp.float32)), labels, q_halt, halted, steps,
                                b)
  assert set(metrics) == set(want)
  assert want["count"] == halted.sum() - 1  # the row without valid tokens is never counted
  assert want["exact_accuracy"] >= 2
  for k in ("count", "exact_accuracy", "q_halt_accuracy", "steps"):
    assert float(metrics[k]) == want[k], k
  errs = {k: rel_err(metrics[k], want[k]) for k in ("accuracy", "lm_loss", "q_halt_loss")}
  errs["loss"] = rel_err(loss, want_loss)
  print(f"act loss float32 vs float64 ({jnp.dtype(dtype).name}, B={b}, L={l}): {errs}")
  for k, e in errs.items():
    assert e <= 1e-6, (k, e)
  for v in jax.tree.leaves(metrics):
    assert v.dtype == jnp.float32 and v.shape == ()


def test_act_loss_row_without_valid_tokens_targets_exact():
  """As in the reference, a row with no valid token has exact = True (q_halt target 1)."""
  logits = jnp.zeros((1, 4, V))
  labels = jnp.full((1, 4), IGNORE)
  q = jnp.array([0.7])
  _, m = jax.jit(losses.act_loss_and_metrics, static_argnums=6)(     # one compile, not op by op
      logits, labels, q, q, jnp.array([True]), jnp.array([3]), 1)
  np.testing.assert_allclose(float(m["q_halt_loss"]), np.log1p(np.exp(-0.7)), rtol=1e-6)
  assert float(m["lm_loss"]) == 0.0 and float(m["count"]) == 0.0 and float(m["steps"]) == 0.0


def test_act_loss_gradients_finite_and_divided():
  rng = np.random.default_rng(5)
  b, l = 4, 9
  x, labels = make_logits(rng, b + 4, l, 3.0)
  x, labels = jnp.asarray(x[:b]), jnp.asarray(labels[:b])
  q = jnp.asarray(rng.standard_normal(b), jnp.float32)
  halted, steps = jnp.ones(b, bool), jnp.ones(b, jnp.int32)

  def f(lg, qh, div):
    return losses.act_loss_and_metrics(lg, labels, qh, qh, halted, steps, div)[0]

  grad = jax.jit(jax.grad(f, argnums=(0, 1)))   # one compile (op by op: ~15 s of tiny compiles)
  g_lg, g_q = grad(x, q, 1.0)
  assert np.all(np.isfinite(np.asarray(g_lg))) and np.all(np.isfinite(np.asarray(g_q)))
  g_lg4, _ = grad(x, q, 4.0)
  np.testing.assert_allclose(np.asarray(g_lg4) * 4.0, np.asarray(g_lg), rtol=1e-6, atol=1e-9)
  # q_halt gradient of 0.5 * BCE: 0.5 * (sigmoid(q) - exact).
  n_valid = np.asarray(labels != IGNORE).sum(-1)
  exact = (np.asarray((jnp.argmax(x, -1) == labels) & (labels != IGNORE)).sum(-1) == n_valid)
  want = 0.5 * (1.0 / (1.0 + np.exp(-np.asarray(q, np.float64))) - exact)
  np.testing.assert_allclose(np.asarray(g_q), want, rtol=1e-5, atol=1e-7)
