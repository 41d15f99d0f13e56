"""Tests of experiments/trm/optim.py against independent float64 NumPy references."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.trm import optim


# --------------------------------------------------------------------------------------------------
# Float64 NumPy references (written from docs/trm.md section 4, not from optim.py).
# --------------------------------------------------------------------------------------------------


def np_lr(step: int, base: float, warmup: int, total: int, min_ratio: float) -> float:
  if step < warmup:
    return base * step / max(1, warmup)
  progress = (step - warmup) / max(1, total - warmup)
  return base * (min_ratio + max(0.0, (1.0 - min_ratio) * 0.5 * (1.0 + np.cos(np.pi * progress))))


class NpAdamAtan2:
  """The reference AdamATan2 update in float64."""

  def __init__(self, params, b1, b2, wd):
    self.p = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
    self.m = {k: np.zeros_like(v) for k, v in self.p.items()}
    self.v = {k: np.zeros_like(v) for k, v in self.p.items()}
    self.t, self.b1, self.b2, self.wd = 0, b1, b2, wd

  def step(self, grads, lr):
    self.t += 1
    for k in self.p:
      g = np.asarray(grads[k], np.float64)
      self.p[k] = self.p[k] * (1.0 - lr * self.wd)
      self.m[k] = self.b1 * self.m[k] + (1.0 - self.b1) * g
      self.v[k] = self.b2 * self.v[k] + (1.0 - self.b2) * g * g
      m_hat = self.m[k] / (1.0 - self.b1 ** self.t)
      v_hat = np.sqrt(self.v[k]) / np.sqrt(1.0 - self.b2 ** self.t)
      self.p[k] = self.p[k] - lr * np.arctan2(m_hat, v_hat)


def np_signsgd_step(table, ids, grads, lr, wd):
  """Reference sparse SignSGD: sum duplicate ids' grads, update present rows only (float64)."""
  table = np.asarray(table, np.float64).copy()
  summed = {}
  for i, g in zip(np.asarray(ids).tolist(), np.asarray(grads, np.float64)):
    summed[i] = summed.get(i, 0.0) + g
  for i, g in summed.items():
    table[i] = table[i] * (1.0 - lr * wd) - lr * np.sign(g)
  return table


# --------------------------------------------------------------------------------------------------
# Schedule.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("min_ratio", [1.0, 0.1])
def test_warmup_cosine_lr_values(min_ratio):
  base, warmup, total = 3e-4, 10, 110
  # Hand-computed values: step 1, last warm-up step, end of warm-up, mid-cosine, last step.
  expected = {
      1: base * 0.1,
      9: base * 0.9,
      10: base,
      60: base * (min_ratio + (1.0 - min_ratio) * 0.5),
      35: base * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * 0.25))),
      110: base * min_ratio,
  }
  for step, want in expected.items():
    assert want == pytest.approx(np_lr(step, base, warmup, total, min_ratio), rel=1e-12)
    got_py = optim.warmup_cosine_lr(step, base, warmup, total, min_ratio)
    assert isinstance(got_py, float)
    assert got_py == pytest.approx(want, rel=1e-12)
    got_jnp = optim.warmup_cosine_lr(jnp.asarray(step), base, warmup, total, min_ratio)
    np.testing.assert_allclose(np.asarray(got_jnp), want, rtol=1e-6)
  # Vectorised and jitted over every step of the run.
  steps = np.arange(1, total + 1)
  got = jax.jit(lambda s: optim.warmup_cosine_lr(s, base, warmup, total, min_ratio))(steps)
  want = np.array([np_lr(int(s), base, warmup, total, min_ratio) for s in steps])
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_warmup_cosine_schedule_maps_optax_count():
  base, warmup, total, min_ratio = 1e-2, 5, 20, 0.1
  sched = optim.warmup_cosine_schedule(base, warmup, total, min_ratio)
  for count in range(total):
    np.testing.assert_allclose(
        np.asarray(sched(jnp.asarray(count))), np_lr(count + 1, base, warmup, total, min_ratio),
        rtol=1e-6)
  assert sched(0) == pytest.approx(base / warmup, rel=1e-12)  # first update = reference step 1
  # Inside optax: scale_by_schedule calls the schedule with the 0-based count.
  tx = optax.scale_by_schedule(sched)
  state = tx.init(jnp.zeros(()))
  for count in range(3):
    u, state = tx.update(jnp.ones(()), state)
    np.testing.assert_allclose(np.asarray(u), np_lr(count + 1, base, warmup, total, min_ratio),
                               rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# AdamATan2.
# --------------------------------------------------------------------------------------------------


def test_adam_atan2_matches_float64_reference():
  rng = np.random.default_rng(0)
  b1, b2, wd = 0.9, 0.95, 0.1
  base, warmup, total, min_ratio = 1e-2, 3, 8, 0.1
  params = {
      "w": rng.standard_normal((4, 3)).astype(np.float32),
      "b": rng.standard_normal((5,)).astype(np.float32),
  }
  tx = optim.adam_atan2(optim.warmup_cosine_schedule(base, warmup, total, min_ratio), b1, b2, wd)
  jparams = jax.tree.map(jnp.asarray, params)
  state = tx.init(jparams)
  assert state.mu["w"].dtype == jnp.float32 and state.nu["b"].dtype == jnp.float32

  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  ref = NpAdamAtan2(params, b1, b2, wd)
  for t in range(1, total + 1):
    grads = {k: (rng.standard_normal(v.shape) * 10.0 ** rng.integers(-3, 2)).astype(np.float32)
             for k, v in params.items()}
    if t == 4:
      grads["b"][0] = 0.0  # A zero gradient after non-zero ones.
    prev = {k: np.asarray(v) for k, v in jparams.items()}
    jparams, state = step(jparams, state, jax.tree.map(jnp.asarray, grads))
    ref.step(grads, np_lr(t, base, warmup, total, min_ratio))
    if t == 1:
      # t = 1: bias correction makes the step exactly -lr * atan2(g, |g|) = -lr * sign(g) * pi / 4.
      lr1 = base / warmup
      for k in params:
        want = prev[k] * (1 - lr1 * wd) - lr1 * np.sign(grads[k]) * np.pi / 4
        np.testing.assert_allclose(np.asarray(jparams[k]), want, rtol=1e-6, atol=1e-7)
    for k in params:
      np.testing.assert_allclose(np.asarray(jparams[k]), ref.p[k], rtol=1e-5, atol=1e-7)
    assert int(state.count) == t


def test_adam_atan2_constant_lr_and_zero_grad_is_pure_decay():
  tx = optim.adam_atan2(0.5, weight_decay=0.2)
  p = {"x": jnp.array([1.0, -2.0, 0.0])}
  u, _ = tx.update({"x": jnp.zeros(3)}, tx.init(p), p)
  new = optax.apply_updates(p, u)
  np.testing.assert_allclose(np.asarray(new["x"]), np.array([1.0, -2.0, 0.0]) * (1 - 0.5 * 0.2),
                             rtol=1e-6)
  with pytest.raises(ValueError):
    tx.update({"x": jnp.zeros(3)}, tx.init(p))


# --------------------------------------------------------------------------------------------------
# Sparse SignSGD.
# --------------------------------------------------------------------------------------------------


def test_sparse_signsgd_matches_reference_over_steps():
  rng = np.random.default_rng(1)
  rows, dim, n, wd = 12, 4, 6, 0.1
  base, warmup, total = 0.05, 2, 6
  table0 = rng.standard_normal((rows, dim)).astype(np.float32)
  opt = optim.sparse_signsgd(optim.warmup_cosine_schedule(base, warmup, total, 0.1), wd)
  table = jnp.asarray(table0)
  state = opt.init(table)
  update = jax.jit(opt.update)
  ref = table0.astype(np.float64)
  for t in range(1, total + 1):
    ids = rng.integers(0, 5, n).astype(np.int32)  # Rows 5.. never appear; duplicates likely.
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    if t == 1:
      # id 3 twice with opposite gradients: the sum is exactly 0 -> only the decay.
      ids = np.array([3, 1, 3, 0, 0, 4], np.int32)
      grads[2] = -grads[0]
    prev = np.asarray(table)
    table, state = update(table, jnp.asarray(ids), jnp.asarray(grads), state)
    lr = np_lr(t, base, warmup, total, 0.1)
    ref = np_signsgd_step(ref, ids, grads, lr, wd)
    got = np.asarray(table)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    absent = np.setdiff1d(np.arange(rows), ids)
    np.testing.assert_array_equal(got[absent], prev[absent])  # untouched, bit for bit
    if t == 1:
      np.testing.assert_allclose(got[3], prev[3] * (1 - lr * wd), rtol=1e-6)
    assert int(state.count) == t
  np.testing.assert_array_equal(np.asarray(table)[5:], table0[5:])


def test_sparse_signsgd_pmap_all_gather():
  devices = jax.local_devices()
  assert len(devices) == 4, "tests/conftest.py should give 4 fake CPU devices"
  rng = np.random.default_rng(2)
  rows, dim, n, lr, wd = 16, 3, 3, 0.01, 0.5
  table0 = rng.standard_normal((rows, dim)).astype(np.float32)
  ids = rng.integers(0, 10, (4, n)).astype(np.int32)  # Different ids per device, cross-device dups.
  grads = rng.standard_normal((4, n, dim)).astype(np.float32)
  ids[0, 0], ids[2, 1] = 7, 7  # id 7 on two devices with opposite gradients: sign 0, decay only.
  grads[2, 1] = -grads[0, 0]
  ids[1, 2] = 7
  grads[1, 2] = 0.0
  opt = optim.sparse_signsgd(lr, wd)

  def step(table, state, local_ids, local_grads):
    all_ids, all_grads = optim.all_gather_rows(local_ids, local_grads, "dev")
    return opt.update(table, all_ids, all_grads, state)

  table = jnp.broadcast_to(jnp.asarray(table0), (4, rows, dim))
  state = jax.tree.map(lambda x: jnp.broadcast_to(x, (4,) + x.shape), opt.init(table[0]))
  new_table, new_state = jax.pmap(step, axis_name="dev")(
      table, state, jnp.asarray(ids), jnp.asarray(grads))
  want = np_signsgd_step(table0, ids.reshape(-1), grads.reshape(-1, dim), lr, wd)
  got = np.asarray(new_table)
  for d in range(4):
    np.testing.assert_array_equal(got[d], got[0])
    np.testing.assert_allclose(got[d], want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got[0, 7], table0[7] * (1 - lr * wd), rtol=1e-6)
  absent = np.setdiff1d(np.arange(rows), ids)
  np.testing.assert_array_equal(got[0, absent], table0[absent])
  np.testing.assert_array_equal(np.asarray(new_state.count), [1, 1, 1, 1])


# --------------------------------------------------------------------------------------------------
# EMA.
# --------------------------------------------------------------------------------------------------


def test_ema_matches_numpy():
  rng = np.random.default_rng(3)
  params = {"a": jnp.asarray(rng.standard_normal((3, 2)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal((4,)), jnp.bfloat16)}
  ema = optim.ema_init(params)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(ema))
  assert ema["a"].unsafe_buffer_pointer() != params["a"].unsafe_buffer_pointer()
  ref = {k: np.asarray(v.astype(jnp.float32), np.float64) for k, v in params.items()}
  update = jax.jit(optim.ema_update, static_argnames="rate")
  for _ in range(5):
    params = {k: v + jnp.asarray(rng.standard_normal(v.shape), v.dtype) for k, v in params.items()}
    ema = update(ema, params, rate=0.9)
    for k in ref:
      ref[k] = 0.9 * ref[k] + 0.1 * np.asarray(params[k].astype(jnp.float32), np.float64)
  for k in ref:
    assert ema[k].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(ema[k]), ref[k], rtol=1e-6, atol=1e-7)
  default = optim.ema_update(ema, params)
  np.testing.assert_allclose(
      np.asarray(default["a"]),
      0.999 * np.asarray(ema["a"], np.float64) + 0.001 * np.asarray(params["a"], np.float64),
      rtol=1e-6)
