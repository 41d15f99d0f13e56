"""Tests of modules/trm.py (TRM model, recursion and ACT wrapper) against the facts of
docs/trm.md sections 1-2.

Expected values come from independent computations written here (float64 NumPy, hand-built carries,
closed-form probabilities), never from the code under test run a second way, except where a test's
point is an identity between two runs of the model (gradient-free cycles, float32 vs bfloat16).
Model sizes are tiny (hidden 64, 16 puzzle tokens) except the init statistics (D = 512, one cycle,
one block) and the parameter counts (jax.eval_shape, nothing computed).
"""
import dataclasses
import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from modules import trm
from modules.kernels import xla_cpu

TRUNC_STD = 0.87962566103423978
Q_HEAD = "trm/~/q_head"

# A tiny attention TRM (rope, puzzle prefix P = 16, S = 32), float32 compute unless stated.
TINY = trm.TRMConfig(seq_len=16, vocab_size=11, num_puzzle_identifiers=5, hidden_size=64,
                     num_heads=2, H_cycles=2, L_cycles=2, L_layers=1, forward_dtype="float32",
                     halt_max_steps=4, halt_exploration_prob=0.0)


def f64(x) -> np.ndarray:
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def np_rms(x, axis=-1, eps=1e-5):
  return x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + eps)


def np_swiglu(x, w_gate_up, w_down):
  gu = x @ w_gate_up
  f = w_gate_up.shape[1] // 2
  gate, up = gu[..., :f], gu[..., f:]
  return (gate / (1.0 + np.exp(-gate)) * up) @ w_down


def make_batch(cfg, B, seed):
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(1, cfg.vocab_size, (B, cfg.seq_len)), jnp.int32),
          "labels": jnp.asarray(rng.integers(2, cfg.vocab_size, (B, cfg.seq_len)), jnp.int32),
          "puzzle_identifiers": jnp.asarray(rng.integers(0, cfg.num_puzzle_identifiers, (B,)),
                                            jnp.int32)}


def set_q_head(params, bias, w_scale=0.0, seed=0):
  params = dict(params)
  w = params[Q_HEAD]["w"]
  w = w_scale * jax.random.normal(jax.random.key(seed), w.shape, jnp.float32)
  params[Q_HEAD] = {"w": w, "b": jnp.full((2,), bias, jnp.float32)}
  return params


@pytest.fixture(scope="module")
def tiny():
  """(model, params, state, puzzle table with random rows) for the TINY config."""
  model = trm.TRMModel(TINY)
  params, state = jax.jit(model.init)(jax.random.key(0))
  table = jax.random.normal(jax.random.key(1), (TINY.num_puzzle_identifiers, 64), jnp.float32)
  return model, params, state, table


# --------------------------------------------------------------------------------------------------
# Parameter counts (docs/trm.md section 5).
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,overrides,count", [
    ("TRM-MLP Sudoku", dict(seq_len=81, vocab_size=11, mlp_t=True, pos_encodings="none"), 5_028_866),
    ("TRM-Att Sudoku", dict(seq_len=81, vocab_size=11, pos_encodings="rope"), 6_828_034),
    ("TRM-Att Maze", dict(seq_len=900, vocab_size=6, L_cycles=4), 6_822_914),
    ("TRM-Att ARC", dict(seq_len=900, vocab_size=12, L_cycles=4), 6_829_058),
    ("TRM-MLP Maze", dict(seq_len=900, vocab_size=6, L_cycles=4, mlp_t=True, pos_encodings="none"),
     18_795_522),
    ("TRM-MLP ARC", dict(seq_len=900, vocab_size=12, L_cycles=4, mlp_t=True, pos_encodings="none"),
     18_801_666),
])
def test_reference_parameter_counts(name, overrides, count):
  cfg = trm.TRMConfig(**overrides)
  params = jax.eval_shape(trm.TRMModel(cfg).init, jax.random.key(0))[0]
  assert trm.adam_param_count(params) == count, name
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params)), name


# --------------------------------------------------------------------------------------------------
# Init statistics (D = 512; one cycle and one block so the init's forward pass is cheap).
# --------------------------------------------------------------------------------------------------


def test_init_statistics():
  D = 512
  cfg = trm.TRMConfig(seq_len=81, vocab_size=64, num_puzzle_identifiers=7, H_cycles=1, L_cycles=1,
                      L_layers=1)
  model = trm.TRMModel(cfg)
  params, state = jax.jit(model.init)(jax.random.key(0))
  # Q head: weight 0, bias -5.
  np.testing.assert_array_equal(params[Q_HEAD]["w"], np.zeros((D, 2)))
  np.testing.assert_array_equal(params[Q_HEAD]["b"], np.full((2,), -5.0))

  def check_std(w, target, tol):
    w = f64(w)
    assert abs(w.std() / target - 1.0) < tol, (w.shape, w.std(), target)
    assert np.abs(w).max() <= 2.0 * target / TRUNC_STD * (1 + 1e-6)

  check_std(params["trm/~/embed_tokens"]["embedding"], 1.0 / math.sqrt(D), 0.03)   # 32768 samples
  check_std(params["trm/~/lm_head"]["w"], 1.0 / math.sqrt(D), 0.03)
  assert set(params["trm/~/lm_head"]) == {"w"}                                      # no bias
  # block linears: std 1/sqrt(fan_in), no biases
  for name, leaves in params.items():
    if "L_level" in name:
      assert set(leaves) == {"w"}, name
      check_std(leaves["w"], 1.0 / math.sqrt(leaves["w"].shape[0]), 0.02)
  # H_init / L_init: fixed bfloat16 vectors, truncated normal std 1, different from each other.
  h_init, l_init = state["trm"]["H_init"], state["trm"]["L_init"]
  for v in (h_init, l_init):
    assert v.dtype == jnp.bfloat16 and v.shape == (D,)
    assert abs(f64(v).std() - 1.0) < 0.1
    assert np.abs(f64(v)).max() <= 2.0 / TRUNC_STD * (1 + 2 ** -8)
  assert np.abs(f64(h_init) - f64(l_init)).max() > 0.1
  # puzzle table: zeros, float32, not an Adam parameter
  table = model.init_puzzle_table()
  assert table.shape == (7, D) and table.dtype == jnp.float32
  np.testing.assert_array_equal(table, 0.0)
  assert not any("puzzle" in name for name in params)


# --------------------------------------------------------------------------------------------------
# The mlp_t block: first RMSNorm over the SEQUENCE axis (float64 NumPy recomputation of one block).
# --------------------------------------------------------------------------------------------------


def test_mlp_t_block_normalises_over_sequence():
  cfg = dataclasses.replace(TINY, mlp_t=True, pos_encodings="none", L_layers=1)
  S, D = cfg.total_len, cfg.hidden_size
  f = hk.without_apply_rng(hk.transform(lambda h: trm.TRMBlock(cfg, name="blk")(h, None)))
  h = jax.random.normal(jax.random.key(3), (2, S, D), jnp.float32) * 2.0 + 0.3
  params = jax.jit(f.init)(jax.random.key(4), h)
  w_t_gu, w_t_d = f64(params["blk/mlp_t/gate_up_proj"]["w"]), f64(params["blk/mlp_t/down_proj"]["w"])
  w_gu, w_d = f64(params["blk/mlp/gate_up_proj"]["w"]), f64(params["blk/mlp/down_proj"]["w"])
  assert w_t_gu.shape == (S, 2 * 256) and w_t_d.shape == (256, S)   # token MLP over S = 32
  x = f64(h)
  mixed = np_swiglu(x.transpose(0, 2, 1), w_t_gu, w_t_d).transpose(0, 2, 1)   # mix over S
  h1 = np_rms(x + mixed, axis=1)                                              # norm over S
  want = np_rms(h1 + np_swiglu(h1, w_gu, w_d), axis=-1)                      # norm over D
  got = f64(jax.jit(f.apply)(params, h))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # Normalising the first residual over D instead gives a clearly different block output.
  h1_wrong = np_rms(x + mixed, axis=-1)
  wrong = np_rms(h1_wrong + np_swiglu(h1_wrong, w_gu, w_d), axis=-1)
  assert np.abs(wrong - want).max() > 1e-2


# --------------------------------------------------------------------------------------------------
# Gradient-free cycles contribute exactly zero gradient.
# --------------------------------------------------------------------------------------------------


def test_gradient_free_cycles_contribute_no_gradient(tiny):
  """grad of H_cycles=3 from (z_H, z_L) == grad of H_cycles=1 from the z after two cycles, exactly.

  The T-1 gradient-free cycles map (z_H, z_L) -> (z_H', z_L'); if they contribute nothing to the
  gradient, the last cycle started from (z_H', z_L') with gradient gives bit-identical gradients for
  every parameter and the puzzle rows. Run op by op (jax.disable_jit) so that both sides execute the
  same float32 kernels (a compiled loop body and the same ops compiled outside a loop may differ in
  the last bit, which would hide nothing but defeat an exact comparison).
  """
  _, params, state, table = tiny
  params = set_q_head(params, bias=0.3, w_scale=0.1)           # make the Q path carry gradient
  m3 = trm.TRMModel(dataclasses.replace(TINY, H_cycles=3))
  m1 = trm.TRMModel(dataclasses.replace(TINY, H_cycles=1))
  batch = make_batch(TINY, B=2, seed=11)
  rows = table[batch["puzzle_identifiers"]]
  h_init, l_init = m3.latents(state)
  shape = (2, TINY.total_len, TINY.hidden_size)
  z_H0 = jnp.broadcast_to(h_init.astype(jnp.float32), shape)
  z_L0 = jnp.broadcast_to(l_init.astype(jnp.float32), shape)
  w_logits = jax.random.normal(jax.random.key(5), (2, TINY.seq_len, TINY.vocab_size))
  w_q = jax.random.normal(jax.random.key(6), (2, 2))

  def loss(model, params, rows, z_H, z_L):
    _, _, logits, q_halt, q_cont = model.inner(params, state, z_H, z_L, batch["inputs"], rows)
    return jnp.sum(logits * w_logits) + jnp.sum(q_halt * w_q[:, 0]) + jnp.sum(q_cont * w_q[:, 1])

  with jax.disable_jit():
    g3_params, g3_rows = jax.grad(lambda p, r: loss(m3, p, r, z_H0, z_L0), argnums=(0, 1))(
        params, rows)
    # The two gradient-free cycles, run by hand: one cycle (n L-updates then one H-update) is one
    # call of the H_cycles=1 model, whose returned carry is the new (z_H, z_L).
    z_H, z_L = z_H0, z_L0
    for _ in range(2):
      z_H, z_L, *_ = m1.inner(params, state, z_H, z_L, batch["inputs"], rows)
    g1_params, g1_rows = jax.grad(lambda p, r: loss(m1, p, r, z_H, z_L), argnums=(0, 1))(
        params, rows)
    # Same forward outputs: the hand-run cycles are the model's first two cycles.
    out3 = m3.inner(params, state, z_H0, z_L0, batch["inputs"], rows)
    out1 = m1.inner(params, state, z_H, z_L, batch["inputs"], rows)
  for a, b in zip(out3, out1):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  flat3 = jax.tree.leaves_with_path(g3_params)
  assert len(flat3) == len(jax.tree.leaves(params))
  for (path, a), b in zip(flat3, jax.tree.leaves(g1_params)):
    name = jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    assert np.abs(np.asarray(a)).max() > 0, name                # every parameter gets gradient
  np.testing.assert_array_equal(np.asarray(g3_rows), np.asarray(g1_rows))
  assert np.abs(np.asarray(g3_rows)).max() > 0                 # the puzzle rows get gradient

  # Nothing flows back into the incoming carry (the T-1 cycles and the returned carry are cut).
  with jax.disable_jit():
    g_z = jax.grad(lambda zh, zl: loss(m3, params, rows, zh, zl), argnums=(0, 1))(z_H0, z_L0)
  np.testing.assert_array_equal(np.asarray(g_z[0]), 0.0)
  np.testing.assert_array_equal(np.asarray(g_z[1]), 0.0)


# --------------------------------------------------------------------------------------------------
# ACT carry semantics.
# --------------------------------------------------------------------------------------------------


def test_act_reset_semantics():
  B, S, D = 4, 5, 3
  rng = np.random.default_rng(0)
  old = {"inputs": jnp.asarray(rng.integers(0, 9, (B, 7)), jnp.int32),
         "labels": jnp.asarray(rng.integers(0, 9, (B, 7)), jnp.int32),
         "puzzle_identifiers": jnp.asarray([10, 11, 12, 13], jnp.int32)}
  new = {"inputs": jnp.asarray(rng.integers(0, 9, (B, 7)) + 100, jnp.int32),
         "labels": jnp.asarray(rng.integers(0, 9, (B, 7)) + 100, jnp.int32),
         "puzzle_identifiers": jnp.asarray([20, 21, 22, 23], jnp.int32)}
  z_H = jnp.asarray(rng.standard_normal((B, S, D)), jnp.bfloat16)
  z_L = jnp.asarray(rng.standard_normal((B, S, D)), jnp.bfloat16)
  halted = np.array([True, False, True, False])
  carry = trm.ACTCarry(z_H=z_H, z_L=z_L, steps=jnp.asarray([3, 2, 5, 1], jnp.int32),
                       halted=jnp.asarray(halted), current_data=old)
  h_init = jnp.asarray([1.0, 2.0, 3.0], jnp.bfloat16)
  l_init = jnp.asarray([-1.0, -2.0, -3.0], jnp.bfloat16)
  out = jax.jit(trm.act_reset)(carry, new, h_init, l_init)
  np.testing.assert_array_equal(np.asarray(out.steps), [0, 2, 0, 1])
  for b in range(B):
    if halted[b]:
      np.testing.assert_array_equal(f64(out.z_H[b]), np.broadcast_to([1.0, 2.0, 3.0], (S, D)))
      np.testing.assert_array_equal(f64(out.z_L[b]), np.broadcast_to([-1.0, -2.0, -3.0], (S, D)))
    else:
      np.testing.assert_array_equal(f64(out.z_H[b]), f64(z_H[b]))
      np.testing.assert_array_equal(f64(out.z_L[b]), f64(z_L[b]))
    src = new if halted[b] else old
    for k in old:
      np.testing.assert_array_equal(np.asarray(out.current_data[k][b]), np.asarray(src[k][b]), k)
  assert out.z_H.dtype == jnp.bfloat16 and out.z_L.dtype == jnp.bfloat16
  # the new batch's rows for the non-halted slots (21, 23) are dropped
  assert set(np.asarray(out.current_data["puzzle_identifiers"]).tolist()) == {20, 11, 22, 13}


def test_act_step_carry_semantics(tiny):
  _, params, state, table = tiny
  B = B_ACT
  first, second = make_batch(TINY, B, seed=1), make_batch(TINY, B, seed=2)
  step = act_step_fn(TINY, training=False)
  # Initial carry: every slot halted, so the first call loads the whole first batch.
  carry0 = trm.initial_carry(TINY, first)
  assert np.asarray(carry0.halted).all() and not np.asarray(carry0.steps).any()
  carry1, _ = step(params, state, table, carry0, first, None)
  np.testing.assert_array_equal(np.asarray(carry1.steps), 1)
  for k in first:
    np.testing.assert_array_equal(np.asarray(carry1.current_data[k]), np.asarray(first[k]))
  # Mark the even slots halted by hand; the second call must reload exactly those.
  halted = jnp.asarray(np.arange(B) % 2 == 0)
  steps_in = np.arange(B) % 3 + 1
  carry1 = carry1._replace(halted=halted, steps=jnp.asarray(steps_in, jnp.int32))
  carry2, out2 = step(params, state, table, carry1, second, None)
  np.testing.assert_array_equal(np.asarray(carry2.steps), np.where(np.arange(B) % 2 == 0, 1,
                                                                   steps_in + 1))
  for k in first:
    want = np.where(np.asarray(halted).reshape((-1,) + (1,) * (first[k].ndim - 1)),
                    np.asarray(second[k]), np.asarray(first[k]))
    np.testing.assert_array_equal(np.asarray(carry2.current_data[k]), want, k)
  # z: halted rows restarted from H_init / L_init, others continued from their own z.
  h_init, l_init = trm.TRMModel(TINY).latents(state)
  shape = carry1.z_H.shape
  z_H_in = np.where(np.asarray(halted)[:, None, None],
                    np.broadcast_to(f64(h_init), shape), f64(carry1.z_H))
  z_L_in = np.where(np.asarray(halted)[:, None, None],
                    np.broadcast_to(f64(l_init), shape), f64(carry1.z_L))
  data = carry2.current_data
  rows = table[data["puzzle_identifiers"]]
  inner = jax.jit(trm.TRMModel(TINY).inner)
  z_H, z_L, logits, _, _ = inner(params, state, jnp.asarray(z_H_in, jnp.float32),
                                 jnp.asarray(z_L_in, jnp.float32), data["inputs"], rows)
  np.testing.assert_allclose(f64(carry2.z_H), f64(z_H), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(f64(carry2.z_L), f64(z_L), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(f64(out2["logits"]), f64(logits), rtol=1e-5, atol=1e-5)
  assert out2["logits"].shape == (B, TINY.seq_len, TINY.vocab_size)


# --------------------------------------------------------------------------------------------------
# Halting: evaluation, exploration bounds.
# --------------------------------------------------------------------------------------------------


_STEPS, _TRACES = {}, {}
B_ACT = 8  # batch of every act_step test (one compilation per (config, mode))


def act_step_fn(config, training):
  """One jitted ACT step per (config, mode), shared by the tests (params and table are arguments)."""
  key = (config, training)
  if key not in _STEPS:
    model = trm.TRMModel(config)
    _TRACES[key] = 0

    def step(params, state, table, carry, batch, rng):
      _TRACES[key] += 1
      return model.act_step(params, state, table, carry, batch, training=training, rng=rng)

    _STEPS[key] = jax.jit(step)
  return _STEPS[key]


def run_halting(config, params, state, table, B, *, training, seed=0, n_steps=None):
  """Runs act_step on fresh batches; returns halted [n_steps, B], steps [n_steps, B], last outputs."""
  n_steps = n_steps or config.halt_max_steps
  step = act_step_fn(config, training)
  carry = trm.initial_carry(config, make_batch(config, B, seed))
  halted, steps = [], []
  for i in range(n_steps):
    carry, out = step(params, state, table, carry, make_batch(config, B, seed + 1 + i),
                      jax.random.key(seed * 1000 + i))
    halted.append(np.asarray(carry.halted))
    steps.append(np.asarray(carry.steps))
  return np.stack(halted), np.stack(steps), out


def test_evaluation_runs_exactly_halt_max_steps(tiny):
  _, params, state, table = tiny
  M = TINY.halt_max_steps
  params = set_q_head(params, bias=5.0)                        # q_halt = 5 > 0 for every row
  halted, steps, out = run_halting(TINY, params, state, table, B_ACT, training=False, n_steps=M + 1)
  assert np.all(f64(out["q_halt_logits"]) > 0)
  np.testing.assert_array_equal(halted[:M - 1], False)
  np.testing.assert_array_equal(halted[M - 1], True)
  np.testing.assert_array_equal(steps[:M], np.arange(1, M + 1)[:, None].repeat(B_ACT, 1))
  np.testing.assert_array_equal(steps[M], 1)                   # then restarts with the new batch


def test_training_halting_with_exploration_bounds(tiny):
  _, params, state, table = tiny
  M = TINY.halt_max_steps
  B = B_ACT
  # q_halt > 0, exploration probability 1: no row halts at step 1, every row halts within M.
  explore = dataclasses.replace(TINY, halt_exploration_prob=1.0)
  halted, _, out = run_halting(explore, set_q_head(params, 5.0), state, table, B, training=True)
  assert np.all(f64(out["q_halt_logits"]) > 0)
  first = halted.argmax(0) + 1                                 # first halting step per row
  assert halted.any(0).all()
  assert first.min() >= 2 and first.max() <= M
  # q_halt < 0 (the init's bias -5): rows run to halt_max_steps even with exploration on.
  halted, _, out = run_halting(explore, params, state, table, B, training=True, seed=1)
  assert np.all(f64(out["q_halt_logits"]) < 0)
  np.testing.assert_array_equal(halted[:M - 1], False)
  np.testing.assert_array_equal(halted[M - 1], True)

  # exploration probability 0: q_halt > 0 halts every row at step 1; q_halt < 0 runs to M.
  assert TINY.halt_exploration_prob == 0.0
  halted, steps, _ = run_halting(TINY, set_q_head(params, 5.0), state, table, B, training=True,
                                 n_steps=2)
  np.testing.assert_array_equal(halted, True)
  np.testing.assert_array_equal(steps, 1)
  halted, _, _ = run_halting(TINY, params, state, table, B, training=True, seed=2)
  np.testing.assert_array_equal(halted[:M - 1], False)
  np.testing.assert_array_equal(halted[M - 1], True)


def test_exploration_halting_step_distribution():
  """With q_halt > 0 and exploration probability 1, the halting step lies in {2..M}.

  The reference draws min_halt_steps ~ U{2..M} afresh at EVERY step (it is not stored in the carry), so
  a row still running at step k halts there with probability P(U <= k) = (k - 1) / (M - 1): the
  halting step is not uniform. Expected: P(k) = (k-1)/(M-1) * prod_{j<k} (1 - (j-1)/(M-1)).
  """
  M, B = 5, 20000
  cfg = dataclasses.replace(TINY, halt_max_steps=M, halt_exploration_prob=1.0)
  carry = trm.ACTCarry(z_H=jnp.zeros((B, 1, 1)), z_L=jnp.zeros((B, 1, 1)),
                       steps=jnp.zeros((B,), jnp.int32), halted=jnp.zeros((B,), bool),
                       current_data={})
  halt = jax.jit(lambda c, r: trm.act_halt(cfg, c, jnp.full((B,), 5.0), training=True, rng=r))
  first = np.zeros(B, int)
  for k in range(1, M + 1):
    carry = halt(carry, jax.random.key(k))
    h = np.asarray(carry.halted)
    first = np.where((first == 0) & h, k, first)
  assert first.min() >= 2 and first.max() <= M
  survive, want = 1.0, {}
  for k in range(2, M + 1):
    hazard = (k - 1) / (M - 1)
    want[k] = survive * hazard
    survive *= 1 - hazard
  for k in range(2, M + 1):
    got = np.mean(first == k)
    assert abs(got - want[k]) < 0.015, (k, got, want[k])     # ~4.5 standard errors at B = 20000

  # Per-row exploration: with probability p a row explores; the others halt at step 1 (q_halt > 0).
  cfg = dataclasses.replace(cfg, halt_exploration_prob=0.3)
  carry = carry._replace(steps=jnp.zeros((B,), jnp.int32), halted=jnp.zeros((B,), bool))
  carry = trm.act_halt(cfg, carry, jnp.full((B,), 5.0), training=True, rng=jax.random.key(99))
  assert abs(1.0 - np.asarray(carry.halted).mean() - 0.3) < 0.015


# --------------------------------------------------------------------------------------------------
# The whole ACT step under jit, several steps on new batches.
# --------------------------------------------------------------------------------------------------


def test_act_step_is_one_jittable_static_shape_function(tiny):
  _, params, state, table = tiny
  config = dataclasses.replace(TINY, halt_exploration_prob=1.0)
  params = set_q_head(params, bias=0.0, w_scale=0.3)          # q_halt of either sign
  step = act_step_fn(config, training=True)
  B = B_ACT
  carry = trm.initial_carry(config, make_batch(TINY, B, 0))
  struct = jax.tree.map(lambda x: (x.shape, x.dtype), carry)
  data_prev = {k: np.asarray(v) for k, v in carry.current_data.items()}
  halted_prev, steps_prev = np.asarray(carry.halted), np.asarray(carry.steps)
  early = []
  for i in range(6):
    batch = make_batch(TINY, B, 100 + i)
    carry, out = step(params, state, table, carry, batch, jax.random.key(i))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), carry) == struct
    assert out["logits"].shape == (B, TINY.seq_len, TINY.vocab_size)
    assert out["q_halt_logits"].dtype == jnp.float32
    assert np.all(np.isfinite(f64(out["logits"])))
    # carry bookkeeping, recomputed here from the previous carry
    steps_want = np.where(halted_prev, 0, steps_prev) + 1
    np.testing.assert_array_equal(np.asarray(carry.steps), steps_want)
    for k, v in batch.items():
      want = np.where(halted_prev.reshape((-1,) + (1,) * (v.ndim - 1)), np.asarray(v), data_prev[k])
      np.testing.assert_array_equal(np.asarray(carry.current_data[k]), want, k)
    halted = np.asarray(carry.halted)
    assert np.all(halted[steps_want >= TINY.halt_max_steps])
    assert np.all(steps_want[halted] >= 2)                     # exploration prob 1: never at step 1
    early.append(halted & (steps_want < TINY.halt_max_steps))
    data_prev = {k: np.asarray(v) for k, v in carry.current_data.items()}
    halted_prev, steps_prev = halted, np.asarray(carry.steps)
  assert np.any(early), "no row halted early on q_halt > 0: the test exercised nothing"
  assert _TRACES[(config, True)] == 1, "act_step retraced: shapes or dtypes of the carry changed"


# --------------------------------------------------------------------------------------------------
# float32 vs bfloat16 compute.
# --------------------------------------------------------------------------------------------------


def test_float32_and_bfloat16_compute_agree(tiny):
  _, params, state, table = tiny
  params = set_q_head(params, bias=0.1, w_scale=0.1)
  m32 = trm.TRMModel(TINY)
  m16 = trm.TRMModel(dataclasses.replace(TINY, forward_dtype="bfloat16"))
  batch = make_batch(TINY, 2, seed=7)
  rows = table[batch["puzzle_identifiers"]]
  h_init, l_init = m32.latents(state)
  shape = (2, TINY.total_len, TINY.hidden_size)

  def run(model, dtype):
    z_H = jnp.broadcast_to(h_init.astype(dtype), shape)
    z_L = jnp.broadcast_to(l_init.astype(dtype), shape)
    return jax.jit(model.inner)(params, state, z_H, z_L, batch["inputs"], rows)

  zh32, _, logits32, qh32, qc32 = run(m32, jnp.float32)
  zh16, zl16, logits16, qh16, qc16 = run(m16, jnp.bfloat16)
  assert logits32.dtype == jnp.float32
  assert logits16.dtype == jnp.bfloat16 and zh16.dtype == jnp.bfloat16 and zl16.dtype == jnp.bfloat16
  assert qh16.dtype == jnp.float32 and qc16.dtype == jnp.float32
  a, b = f64(logits32), f64(logits16)
  scale = np.abs(a).max()
  assert np.abs(a - b).max() < 0.1 * scale + 0.05, (np.abs(a - b).max(), scale)
  assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99
  np.testing.assert_allclose(f64(qh16), f64(qh32), atol=0.1)
  np.testing.assert_allclose(f64(qc16), f64(qc32), atol=0.1)


# --------------------------------------------------------------------------------------------------
# kernels="xla_cpu" (modules/kernels/xla_cpu.py), one form at a time (`xla_cpu.exactly`), against
# the default path.
# --------------------------------------------------------------------------------------------------

F = xla_cpu.Forms
XLA_CPU = F(fast_grad=True, seq_major=True, unroll=True, head_major=True, lean_swiglu=True)
"""The forms a float32 CPU target gets (`xla_cpu.forms`); bfloat16 adds the last three."""


def _cpu_form_case(cfg):
  """The model, weights (a non-trivial q_head), latents, puzzle table and batch the CPU-form tests
  compare on."""
  model = trm.TRMModel(cfg)
  params, state = jax.jit(model.init)(jax.random.key(0))
  params = set_q_head(params, bias=0.1, w_scale=0.1)
  table = jax.random.normal(jax.random.key(1), (cfg.num_puzzle_identifiers, 64), jnp.float32)
  return model, params, state, table, make_batch(cfg, 3, seed=4)


def _value_and_grads(cfg, params, state, table, batch, dtype, forms=None):
  """Value, logits and (weight, puzzle-row) gradients of a fixed loss; `forms` (xla_cpu.Forms): the
  model with kernels="xla_cpu" carrying exactly those forms."""
  if forms is not None:
    with xla_cpu.exactly(forms):
      return _value_and_grads(dataclasses.replace(cfg, kernels="xla_cpu"), params, state, table,
                              batch, dtype)
  model = trm.TRMModel(cfg)
  rows = table[batch["puzzle_identifiers"]]
  h_init, l_init = model.latents(state)
  shape = (batch["inputs"].shape[0], cfg.total_len, cfg.hidden_size)
  z_H = jnp.broadcast_to(h_init.astype(dtype), shape)
  z_L = jnp.broadcast_to(l_init.astype(dtype), shape)
  w_logits = jax.random.normal(jax.random.key(5), shape[:1] + (cfg.seq_len, cfg.vocab_size))

  def loss(p, r):
    _, _, logits, q_halt, q_cont = model.inner(p, state, z_H, z_L, batch["inputs"], r)
    return (jnp.sum(logits.astype(jnp.float32) * w_logits) + jnp.sum(q_halt) - jnp.sum(q_cont),
            logits)

  (value, logits), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
      params, rows)
  return value, logits, grads


@pytest.mark.parametrize("mlp_t", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["att", "mlp"])
def test_fast_grad_equals_autodiff_in_float32_and_keeps_bfloat16_tolerances(mlp_t):
  """fast_grad reorders the weight-gradient sums (row-major transposes) and, in bfloat16, keeps
  the backward operands bfloat16: float32 values and gradients equal plain autodiff's to rounding;
  bfloat16 stays within the float32-vs-bfloat16 tolerances of test_float32_and_bfloat16_compute_agree
  and its gradients as close to float32's as plain autodiff's bfloat16 gradients are."""
  cfg = dataclasses.replace(TINY, mlp_t=mlp_t, pos_encodings="none" if mlp_t else "rope")
  model, params, state, table, batch = _cpu_form_case(cfg)

  v0, l0, (g0, r0) = _value_and_grads(cfg, params, state, table, batch, jnp.float32)
  v1, l1, (g1, r1) = _value_and_grads(cfg, params, state, table, batch, jnp.float32,
                                      F(fast_grad=True))
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6)
  np.testing.assert_allclose(f64(l1), f64(l0), rtol=1e-6, atol=1e-6)
  for (path, a), b in zip(jax.tree.leaves_with_path(g1), jax.tree.leaves(g0)):
    scale = np.abs(f64(b)).max()
    assert scale > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(f64(a), f64(b), rtol=1e-5, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))
  np.testing.assert_allclose(f64(r1), f64(r0), rtol=1e-5, atol=1e-5 * np.abs(f64(r0)).max())

  c16 = dataclasses.replace(cfg, forward_dtype="bfloat16")
  _, l16, (g16, _) = _value_and_grads(c16, params, state, table, batch, jnp.bfloat16)
  _, l16f, (g16f, _) = _value_and_grads(c16, params, state, table, batch, jnp.bfloat16,
                                        F(fast_grad=True))
  a = f64(l0)
  for b in (f64(l16), f64(l16f)):                               # the forward is the same program
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max() + 0.05
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99
  for (path, ref), plain, fast in zip(jax.tree.leaves_with_path(g0), jax.tree.leaves(g16),
                                      jax.tree.leaves(g16f)):
    ref, plain, fast = f64(ref).ravel(), f64(plain).ravel(), f64(fast).ravel()
    if ref.size < 4:                                            # q_head bias: 2 numbers
      np.testing.assert_allclose(fast, ref, rtol=0.1, atol=0.1 * np.abs(ref).max())
      continue
    err_plain = np.linalg.norm(plain - ref) / np.linalg.norm(ref)
    err_fast = np.linalg.norm(fast - ref) / np.linalg.norm(ref)
    # Measured: err_fast within 1% of err_plain for every weight (0.7-22% relative L2 error).
    assert err_fast < 1.25 * err_plain + 0.01, (jax.tree_util.keystr(path), err_fast, err_plain)
    assert np.corrcoef(ref, fast)[0, 1] > np.corrcoef(ref, plain)[0, 1] - 0.005


# fast_grad off (the forms without the row-major weight gradients: a subset the tuning tools
# measure) is `make test-slow`; the CPU default, fast_grad with seq_major and unroll, is `make test`.
@pytest.mark.parametrize("fast_grad", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["autodiff", "fast_grad"])
def test_seq_major_and_unroll_equal_the_reference_layout(fast_grad):
  """seq_major (the [S, B, D] recursion of mlp_t models) and unroll (the cycle with gradient written
  out) are CPU forms of the same computation: float32 value, logits, latents and every gradient
  equal the reference layout's to float32 rounding; an attention model ignores seq_major; bfloat16
  stays within the float32-vs-bfloat16 tolerances."""
  cfg = dataclasses.replace(TINY, mlp_t=True, pos_encodings="none")
  model, params, state, table, batch = _cpu_form_case(cfg)
  v0, l0, (g0, r0) = _value_and_grads(cfg, params, state, table, batch, jnp.float32)
  for fields in (dict(seq_major=True), dict(unroll=True), dict(seq_major=True, unroll=True)):
    f = F(fast_grad=fast_grad, **fields)
    c = dataclasses.replace(cfg, kernels="xla_cpu")
    with xla_cpu.exactly(f):
      assert c.seq_first == f.seq_major
    v1, l1, (g1, r1) = _value_and_grads(cfg, params, state, table, batch, jnp.float32, f)
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    np.testing.assert_allclose(f64(l1), f64(l0), rtol=1e-5, atol=1e-5 * np.abs(f64(l0)).max())
    for (path, a), b in zip(jax.tree.leaves_with_path(g1), jax.tree.leaves(g0)):
      scale = np.abs(f64(b)).max()
      np.testing.assert_allclose(f64(a), f64(b), rtol=1e-4, atol=1e-5 * scale,
                                 err_msg=f"{fields} {jax.tree_util.keystr(path)}")
    np.testing.assert_allclose(f64(r1), f64(r0), rtol=1e-4, atol=1e-5 * np.abs(f64(r0)).max())
    # The latents come back in the carry's [B, S, D] layout.
    m = trm.TRMModel(c)
    shape = (3, c.total_len, c.hidden_size)
    z = jnp.broadcast_to(m.latents(state)[0].astype(jnp.float32), shape)
    rows = table[batch["puzzle_identifiers"]]
    out0 = model.inner(params, state, z, z, batch["inputs"], rows)
    with xla_cpu.exactly(f):
      out1 = m.inner(params, state, z, z, batch["inputs"], rows)
    for a, b in zip(out1, out0):
      assert a.shape == b.shape
      np.testing.assert_allclose(f64(a), f64(b), rtol=1e-5, atol=1e-5 * np.abs(f64(b)).max())
  att = dataclasses.replace(TINY, kernels="xla_cpu")
  with xla_cpu.exactly(F(seq_major=True)):
    assert not att.seq_first                                    # attention keeps [B, S, D]

  c16 = dataclasses.replace(cfg, forward_dtype="bfloat16")
  _, l16, _ = _value_and_grads(c16, params, state, table, batch, jnp.bfloat16,
                               F(fast_grad=fast_grad, seq_major=True, unroll=True))
  a, b = f64(l0), f64(l16)
  assert np.abs(a - b).max() < 0.1 * np.abs(a).max() + 0.05
  assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99


def _assert_float32_equal(got, ref, label):
  """Two `_value_and_grads` results in float32 agree to rounding: value, logits, every weight
  gradient (each non-zero) and the puzzle-row gradient."""
  (v1, l1, (g1, r1)), (v0, l0, (g0, r0)) = got, ref
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  np.testing.assert_allclose(f64(l1), f64(l0), rtol=1e-5, atol=1e-5 * np.abs(f64(l0)).max())
  for (path, a), b in zip(jax.tree.leaves_with_path(g1), jax.tree.leaves(g0)):
    scale = np.abs(f64(b)).max()
    assert scale > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(f64(a), f64(b), rtol=1e-4, atol=1e-5 * scale,
                               err_msg=f"{label} {jax.tree_util.keystr(path)}")
  np.testing.assert_allclose(f64(r1), f64(r0), rtol=1e-4, atol=1e-5 * np.abs(f64(r0)).max())


def test_head_major_equals_the_reference_layout():
  """head_major (the attention's q, k, v copied head-major once: a CPU form) is the same computation
  in an attention TRM: float32 value, logits and every gradient equal the reference layout's to
  rounding, alone and with the other CPU forms of an attention model (fast_grad, unroll); bfloat16
  stays within the float32-vs-bfloat16 tolerances."""
  cfg = TINY                                                    # attention, RoPE, puzzle prefix
  model, params, state, table, batch = _cpu_form_case(cfg)
  ref = _value_and_grads(cfg, params, state, table, batch, jnp.float32)
  l0 = ref[1]
  for fields in (dict(head_major=True), dict(head_major=True, fast_grad=True, unroll=True)):
    _assert_float32_equal(_value_and_grads(cfg, params, state, table, batch, jnp.float32,
                                           F(**fields)), ref, str(fields))

  c16 = dataclasses.replace(cfg, forward_dtype="bfloat16")
  _, l16, _ = _value_and_grads(c16, params, state, table, batch, jnp.bfloat16,
                               F(head_major=True, fast_grad=True, unroll=True))
  a, b = f64(l0), f64(l16)
  assert np.abs(a - b).max() < 0.1 * np.abs(a).max() + 0.05
  assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99


@pytest.mark.parametrize("mlp_t", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["att", "mlp"])
def test_lean_swiglu_equals_the_reference_gradients(mlp_t):
  """lean_swiglu (every SwiGLU's backward pass recomputes sigmoid and silu from gate|up: a CPU form)
  is the same computation: float32 value and logits equal the default's to rounding and every
  gradient agrees to rounding, alone and with the other CPU forms; bfloat16 stays within the
  float32-vs-bfloat16 tolerances."""
  cfg = dataclasses.replace(TINY, mlp_t=mlp_t, pos_encodings="none" if mlp_t else "rope")
  model, params, state, table, batch = _cpu_form_case(cfg)
  ref = _value_and_grads(cfg, params, state, table, batch, jnp.float32)
  l0, g0 = ref[1], ref[2][0]
  others = dict(fast_grad=True, unroll=True, seq_major=True, head_major=True)
  for fields in (dict(lean_swiglu=True), dict(lean_swiglu=True, **others)):
    _assert_float32_equal(_value_and_grads(cfg, params, state, table, batch, jnp.float32,
                                           F(**fields)), ref, str(fields))

  c16 = dataclasses.replace(cfg, forward_dtype="bfloat16")
  _, l16, (g16, _) = _value_and_grads(c16, params, state, table, batch, jnp.bfloat16,
                                      F(lean_swiglu=True, **others))
  a, b = f64(l0), f64(l16)
  assert np.abs(a - b).max() < 0.1 * np.abs(a).max() + 0.05
  assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99
  for (path, ref), got in zip(jax.tree.leaves_with_path(g0), jax.tree.leaves(g16)):
    ref, got = f64(ref).ravel(), f64(got).ravel()
    if ref.size >= 4:                                           # q_head bias: 2 numbers
      assert np.corrcoef(ref, got)[0, 1] > 0.9, jax.tree_util.keystr(path)


def test_nograd_chunk_rule_and_its_field_check():
  """xla_cpu.nograd_chunk(B): the largest power of two dividing B whose chunk x S x D latents fit
  nograd_chunk_elements; the whole batch when the field is 0; a negative field is refused."""
  recipe = trm.TRMConfig(seq_len=81, vocab_size=11, puzzle_emb_len=16, hidden_size=512)
  per_example = recipe.total_len * recipe.hidden_size             # S x D = 97 x 512 = 49,664
  chunk = lambda f, b: xla_cpu.nograd_chunk(f, b, per_example)    # noqa: E731
  on = F(nograd_chunk_elements=2 ** 19)
  assert [chunk(on, b) for b in (64, 32, 12, 8, 6, 7, 1)] == [8, 8, 4, 8, 2, 1, 1]
  assert [chunk(F(), b) for b in (64, 7)] == [64, 7]
  assert chunk(F(nograd_chunk_elements=1000), 64) == 1            # less than one example: 1
  with pytest.raises(ValueError, match=r"nograd_chunk_elements=-1.*use 0"):
    F(nograd_chunk_elements=-1)
  # What kernels="xla_cpu" picks: the budget for a bfloat16 forward, the whole batch in float32.
  assert xla_cpu.forms("xla_cpu", "bfloat16").nograd_chunk_elements == 2 ** 19
  assert xla_cpu.forms("xla_cpu", "float32").nograd_chunk_elements == 0
  assert xla_cpu.forms("default", "bfloat16") == F()
  with pytest.raises(ValueError, match=r"kernels='tpu'.*default.*xla_cpu"):
    trm.TRMConfig(seq_len=81, vocab_size=11, kernels="tpu")


@pytest.mark.parametrize("mlp_t", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["att", "mlp"])
def test_nograd_chunks_equal_the_whole_batch(mlp_t):
  """nograd_chunk_elements (the cycles without gradient on chunks of the batch, one after another:
  a CPU form, for bfloat16) treats every example on its own, as the whole batch does: with the
  other CPU forms on (seq_major's [S, B, D] latents split along their batch axis), the value,
  logits and every gradient equal the whole batch's to float32 rounding in float32 and to
  bfloat16 rounding in bfloat16 (the dtype the trainer uses it for), in chunks of 2 examples, and
  in bfloat16 of 1. (Measured: bfloat16 equal bit for bit in chunks of 2; in chunks of 1 an mlp_t
  model's differ by 0.6% of each gradient's norm, because XLA keeps float32 between operations in
  different places in the two programs: with `xla_allow_excess_precision` off they are equal.)"""
  base = dataclasses.replace(TINY, mlp_t=mlp_t, pos_encodings="none" if mlp_t else "rope")
  _, params, state, table, _ = _cpu_form_case(base)
  batch = make_batch(base, 4, seed=6)
  per_example = base.total_len * base.hidden_size
  for dtype in ("float32", "bfloat16"):
    cfg = dataclasses.replace(base, forward_dtype=dtype)
    ref = _value_and_grads(cfg, params, state, table, batch, cfg.dtype, XLA_CPU)
    sizes = ((2 * per_example, 2),) + (((per_example, 1),) if dtype == "bfloat16" else ())
    for elements, chunk in sizes:
      f = dataclasses.replace(XLA_CPU, nograd_chunk_elements=elements)
      assert xla_cpu.nograd_chunk(f, 4, per_example) == chunk
      assert xla_cpu.nograd_chunk(XLA_CPU, 4, per_example) == 4
      got = _value_and_grads(cfg, params, state, table, batch, cfg.dtype, f)
      if dtype == "float32":
        _assert_float32_equal(got, ref, f"chunk {chunk}")
        continue
      (v1, l1, (g1, r1)), (v0, l0, (g0, r0)) = got, ref
      scale = np.abs(f64(l0)).max()
      assert np.abs(f64(l1) - f64(l0)).max() <= 2 ** -7 * scale, chunk   # bfloat16's rounding
      for (path, a), b in zip(jax.tree.leaves_with_path((g1, r1)), jax.tree.leaves((g0, r0))):
        a, b = f64(a), f64(b)
        assert np.linalg.norm(a - b) <= 2 ** -7 * np.linalg.norm(b), (chunk,
                                                                        jax.tree_util.keystr(path))


def _with_and_without(base: trm.TRMConfig, forms: xla_cpu.Forms, seed: int, **fields):
  """(dtype, `_value_and_grads` with `forms` and `fields`, the same with `forms` alone) in
  bfloat16, then float32, on one batch of 4 from the same parameters."""
  _, params, state, table, _ = _cpu_form_case(base)
  batch = make_batch(base, 4, seed=seed)
  for dtype in ("bfloat16", "float32"):
    cfg = dataclasses.replace(base, forward_dtype=dtype)
    ref = _value_and_grads(cfg, params, state, table, batch, cfg.dtype, forms)
    got = _value_and_grads(cfg, params, state, table, batch, cfg.dtype,
                           dataclasses.replace(forms, **fields))
    yield dtype, got, ref


def _assert_bfloat16_equal(got, ref):
  """Two bfloat16 `_value_and_grads` results agree to bfloat16 rounding: value, logits, every
  weight gradient and the puzzle-row gradient."""
  (v1, l1, (g1, r1)), (v0, l0, (g0, r0)) = got, ref
  np.testing.assert_allclose(float(v1), float(v0), rtol=2 ** -7)
  assert np.abs(f64(l1) - f64(l0)).max() <= 2 ** -7 * np.abs(f64(l0)).max()
  for (path, a), b in zip(jax.tree.leaves_with_path((g1, r1)), jax.tree.leaves((g0, r0))):
    a, b = f64(a), f64(b)
    assert np.linalg.norm(a - b) <= 2 ** -7 * np.linalg.norm(b), jax.tree_util.keystr(path)


@pytest.mark.parametrize("mlp_t", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["att", "mlp"])
def test_split_gate_up_equals_lean_swiglu(mlp_t):
  """split_gate_up (every SwiGLU's gate|up gradient fed into its products as two halves: a CPU
  form, for bfloat16) is lean_swiglu's computation: with the other CPU forms on, the bfloat16
  logits equal lean_swiglu's bit for bit and the value and every gradient to bfloat16 rounding
  (only the input gradients' float32 sums run in another order); float32 to float32 rounding."""
  base = dataclasses.replace(TINY, mlp_t=mlp_t, pos_encodings="none" if mlp_t else "rope")
  for dtype, got, ref in _with_and_without(base, XLA_CPU, 8, split_gate_up=True):
    if dtype == "float32":
      _assert_float32_equal(got, ref, "split_gate_up")
      continue
    np.testing.assert_array_equal(f64(got[1]), f64(ref[1]))     # the forward is the same
    _assert_bfloat16_equal(got, ref)


@pytest.mark.slow    # make test: the padded contraction against float64 numpy in tests/test_layers.py
def test_pad_contraction_equals_the_unpadded_token_mix():
  """pad_contraction (seq_major's token mix with S zero-padded to a multiple of 32 in its two
  products over S: a CPU form, for bfloat16) is the same computation: with the other CPU forms on
  and S = 33 (padded to 64), the bfloat16 value, logits and every gradient equal the unpadded
  model's to bfloat16 rounding (the padded products are exact zeros; only the float32 sums' order
  may differ); in float32 the field changes nothing (it pads bfloat16 only)."""
  base = dataclasses.replace(TINY, seq_len=17, mlp_t=True, pos_encodings="none")
  assert base.total_len == 33
  forms = F(fast_grad=True, unroll=True, seq_major=True, lean_swiglu=True)
  for dtype, got, ref in _with_and_without(base, forms, 7, pad_contraction=True):
    if dtype == "float32":
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(f64(a), f64(b))
      continue
    _assert_bfloat16_equal(got, ref)
