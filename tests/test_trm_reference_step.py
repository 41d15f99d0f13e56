"""The reference's TRAINING step in PyTorch (tests/torch_trm_reference.py `TrainStep`) against
podlab's real step (experiments/trm/train.py `make_train_step`, pmapped on one device), float32.

The torch step is written from docs/trm.md sections 2 and 4 (no podlab code); both start from the
same random weights and puzzle table (the torch state_dict imported by reference_checkpoint) and
run two optimizer steps on the same batches: the ACT carry (steps, halting, data), the summed
losses, and the updated Adam parameters, EMA and puzzle table must agree. Exploration is off
(probability 0) so that halting depends only on q_halt, which both compute.

Tolerances: the losses and halting are compared to float32 rounding; parameters after the updates
within 1e-4 x the learning rate (plus float32 rounding of the value), except for at most 0.1% of the elements: the first AdamATan2 step
moves each weight by lr * atan2(g, |g|) = +-lr pi/4 and SignSGD by +-lr, so a gradient within
rounding of 0 may take the other sign in one of the two (measured: 1 weight of 49,664), an error of
at most lr pi/2 (2 lr for the table) per step. Such a weight changes the second step's forward
(measured: q_halt_loss 9.4694 vs 9.4703 after one flipped weight of the token MLP), so the second
step's losses are checked to 1e-3 (the first step's to 2e-5) and its AdamATan2 update, sensitive
to the gradient's direction, to 5% of lr (measured: 1.8%).
"""
import jax
import ml_collections
import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from experiments.common import device_step  # noqa: E402
from experiments.common import parallel  # noqa: E402
from experiments.trm import optim  # noqa: E402
from experiments.trm import reference_checkpoint as rc  # noqa: E402
from experiments.trm import train  # noqa: E402
from modules import trm  # noqa: E402
from tests import torch_trm_reference as ref  # noqa: E402

B, L, V, N_PUZZLES = 6, 81, 11, 4

OPT = dict(lr=1e-3, puzzle_emb_lr=1e-2, weight_decay=0.1, puzzle_emb_weight_decay=0.1,
           beta1=0.9, beta2=0.95, lr_warmup_steps=3, total_steps=10, lr_min_ratio=0.1)
EMA_RATE = 0.9


def _assert_close_but_sign_flips(got, want, tol: float, flip_bound: float, what: str):
  """|got - want| <= tol (+ float32 rounding of the value) everywhere but <= 0.1% of the
  elements, and <= flip_bound there."""
  want = np.asarray(want, np.float64)
  err = np.abs(np.asarray(got, np.float64) - want)
  off = err > tol + 2.5e-7 * np.abs(want)
  assert off.mean() <= 1e-3, (what, int(off.sum()), err.size, float(err.max()))
  assert err.max() <= flip_bound, (what, float(err.max()), flip_bound)


def _batch(seed: int):
  g = torch.Generator().manual_seed(seed)
  labels = torch.randint(2, V, (B, L), generator=g, dtype=torch.int32)
  labels[0, :40] = ref.IGNORE_LABEL_ID                 # ignored positions
  return {"inputs": torch.randint(1, V, (B, L), generator=g, dtype=torch.int32),
          "labels": labels,
          "puzzle_identifiers": torch.tensor([0, 1, 1, 2, 3, 1], dtype=torch.int32)}


def _to_numpy_sd(module) -> dict:
  """The state_dict as numpy COPIES (a torch tensor's .numpy() shares its memory, which the torch
  optimizer then updates in place under podlab's feet)."""
  out = {}
  for k, v in module.state_dict().items():
    v = v.detach()
    out[k] = (v.float().numpy().astype(ml_dtypes.bfloat16)
              if v.dtype == torch.bfloat16 else v.numpy().copy())
  return out


@pytest.mark.parametrize("mlp_t", [True, False], ids=["mlp", "att"])
def test_one_training_step_equals_the_reference(mlp_t, tmp_path):
  torch.manual_seed(0)
  torch.set_num_threads(1)
  rcfg = ref.RefConfig(seq_len=L, vocab_size=V, num_puzzle_identifiers=N_PUZZLES, hidden_size=64,
                       num_heads=2, H_cycles=2, L_cycles=2, L_layers=2, halt_max_steps=2,
                       mlp_t=mlp_t, pos_encodings="none" if mlp_t else "rope")
  model = ref.randomize_(ref.TorchTRM(rcfg), seed=3)
  config = trm.TRMConfig(seq_len=L, vocab_size=V, num_puzzle_identifiers=N_PUZZLES, hidden_size=64,
                         num_heads=2, H_cycles=2, L_cycles=2, L_layers=2, halt_max_steps=2,
                         mlp_t=mlp_t, pos_encodings=rcfg.pos_encodings, forward_dtype="float32",
                         halt_exploration_prob=0.0)
  params, model_state, table = rc.import_reference(_to_numpy_sd(model), config)

  tcfg = ref.TrainConfig(global_batch_size=B, halt_exploration_prob=0.0, ema_rate=EMA_RATE, **OPT)
  t_step = ref.TrainStep(model, tcfg)

  c = ml_collections.ConfigDict(dict(OPT, seed=0, ema=True, ema_rate=EMA_RATE))
  del c.total_steps
  adam, sign = train.make_optimizers(c, total_steps=OPT["total_steps"])
  jmodel = trm.TRMModel(config)
  state = train.TrainState(step=np.zeros((), np.int32), params=params, opt_state=adam.init(params),
                           ema=optim.ema_init(params), puzzle_table=table,
                           sign_state=sign.init(table), model_state=model_state)
  one = jax.local_devices()[:1]
  p_step = device_step.parallel_train_step(train.make_train_step(jmodel, adam, sign, c, B), "raise",
                                           seed=c.seed, rng_step_offset=train.TRM.rng_step_offset,
                                           devices=one, donate=False)
  batches = [_batch(s) for s in (1, 2)]
  j_carry = jax.tree.map(lambda x: np.asarray(x)[None],
                         train.DeviceState(carry=jmodel.initial_carry(
                             {k: np.asarray(v.numpy()) for k, v in batches[0].items()}),
                             puzzle_shard=None))
  t_carry = model.model.initial_carry(batches[0])
  state = jax.device_put(state, one[0])
  halted_early = False
  lr_sum = emb_lr_sum = 0.0
  for i, batch in enumerate(batches):
    jb = {k: v.numpy()[None] for k, v in batch.items()}
    state, j_carry, sums = p_step(state, j_carry, jb, np.zeros((1,), np.int32))
    t_carry, t_metrics = t_step(t_carry, batch)
    np.testing.assert_array_equal(np.asarray(j_carry.carry.steps)[0], t_carry.steps.numpy())
    np.testing.assert_array_equal(np.asarray(j_carry.carry.halted)[0], t_carry.halted.numpy())
    halted_early |= bool(np.any(t_carry.halted.numpy() & (t_carry.steps.numpy() < 2)))
    sums = parallel.unreplicate(sums)
    for k in ("lm_loss", "q_halt_loss"):
      np.testing.assert_allclose(float(np.asarray(sums[k]).reshape(-1)[0]),
                                 float(t_metrics[k]), rtol=2e-5 if i == 0 else 1e-3,
                                 err_msg=f"{k} step {i + 1}")

    # The updated parameters, EMA and table, read back into podlab's layout.
    sd = _to_numpy_sd(model)
    want_params, _, want_table = rc.import_reference(sd, config)
    ema_sd = dict(sd, **{"model.inner." + k: v.numpy() for k, v in t_step.ema.items()})
    want_ema, _, _ = rc.import_reference(ema_sd, config)
    lr = optim.warmup_cosine_lr(t_step.step_count, OPT["lr"], OPT["lr_warmup_steps"],
                                OPT["total_steps"], OPT["lr_min_ratio"])
    emb_lr = optim.warmup_cosine_lr(t_step.step_count, OPT["puzzle_emb_lr"],
                                    OPT["lr_warmup_steps"], OPT["total_steps"],
                                    OPT["lr_min_ratio"])
    lr_sum, emb_lr_sum = lr_sum + lr, emb_lr_sum + emb_lr
    for name, got, want in (("params", state.params, want_params), ("ema", state.ema, want_ema)):
      for (path, a), b in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want)):
        _assert_close_but_sign_flips(a, b, (1e-4 if i == 0 else 0.05) * lr, 1.01 * np.pi / 2 * lr_sum,
                                     f"{name} {jax.tree_util.keystr(path)}")
    _assert_close_but_sign_flips(state.puzzle_table, want_table, 1e-4 * emb_lr, 2.02 * emb_lr_sum,
                                 "puzzle_table")
    assert np.abs(np.asarray(state.puzzle_table) - np.asarray(table)).max() > 0.5 * emb_lr
  assert int(np.asarray(state.step)) == 2 and t_step.step_count == 2
  assert halted_early, "no row halted on q_halt > 0: the Q-halting path was not exercised"
