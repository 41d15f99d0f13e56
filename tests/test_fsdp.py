"""The "fsdp" state rules (experiments/common/parallel.py) against "replicated" (pmap's program).

One per-device step, two layouts of the one engine (`parallel.compile_step`): the same numbers to
float32 rounding, the state split over the devices between steps and inside them (blocks),
checkpoints that restore into either layout. On the suite's 4 fake CPU
devices (conftest.py); a subprocess with 2 devices restores a 4-device checkpoint.

  .venv/bin/python -m pytest tests/test_fsdp.py -q
"""

import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from experiments.common import checkpointing
from experiments.common import config_utils
from experiments.common import device_step
from experiments.common import errors
from experiments.common import optim
from experiments.common import parallel
from experiments.common import trainer
from experiments.trm import train as trm_train
from experiments.trm.configs import cpu_demo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _relative(a, b) -> float:
  """||a - b|| / ||a|| over every floating leaf of two pytrees, in float64."""
  num = den = 0.0
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    num += float(np.sum((x - y) ** 2))
    den += float(np.sum(x ** 2))
  return (num / max(den, 1e-300)) ** 0.5


def _split(tree) -> int:
  """How many leaves of a placed tree are split over the devices."""
  return sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(tree))


def test_fsdp_spec_splits_the_largest_axis_the_devices_divide(monkeypatch):
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 16)
  assert parallel.fsdp_spec((512, 2048), 4) == P(None, parallel.AXIS)
  assert parallel.fsdp_spec((2048, 512), 4) == P(parallel.AXIS, None)
  assert parallel.fsdp_spec((6, 8), 4) == P(None, parallel.AXIS)       # 6 is not divisible
  assert parallel.fsdp_spec((8, 8), 4) == P(parallel.AXIS, None)       # ties: the first axis
  assert parallel.fsdp_spec((7, 9), 4) == P()                          # nothing divisible
  assert parallel.fsdp_spec((3,), 4) == P()                            # under the size floor
  assert parallel.fsdp_spec((), 4) == P()
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 2 ** 14)
  assert parallel.fsdp_spec((64, 64), 4) == P()                        # 4,096 < 2^14 elements
  with pytest.raises(ValueError, match="sharding='zero3'"):
    parallel.Rules("zero3")


def _toy_problem():
  rng = np.random.RandomState(0)
  params = {"w1": rng.randn(16, 64).astype(np.float32), "b1": np.zeros(64, np.float32),
            "w2": rng.randn(64, 8).astype(np.float32)}
  tx = optax.chain(optim.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
  n = jax.local_device_count()
  batch = {"x": rng.randn(n, 8, 16).astype(np.float32), "y": rng.randn(n, 8, 8).astype(np.float32)}

  def loss_fn(p, b, key):
    del key
    h = jnp.tanh(b["x"] @ p["w1"] + p["b1"])           # [b, 64]
    return jnp.mean((h @ p["w2"] - b["y"]) ** 2), {}

  def step(state, batch, device_index):
    p, opt = state
    b = {"x": batch["x"][None] * (1.0 + 0.01 * device_index), "y": batch["y"][None]}
    u = device_step.accumulated_update(loss_fn, tx, p, opt, b, 1, jax.random.key(0))
    return (u.params, u.opt_state), u.loss
  return jax.device_get((params, tx.init(params))), batch, step   # host copies: donation-safe


@pytest.mark.parametrize("donate", [False, True])
def test_fsdp_step_equals_the_pmapped_step_after_ten_adamw_updates(monkeypatch, donate):
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 64)
  state0, batch, step = _toy_problem()
  results = {}
  for layout in parallel.SHARDINGS:
    rules = parallel.Rules(layout)
    p_step = parallel.compile_step(step, rules, state_in=(0,), out_axes=(None, 0),
                                   donate_argnums=(0,) if donate else (), blocks=True)
    state = parallel.put_state(state0, rules)
    device_index = parallel.shard(parallel.device_indices())
    b = parallel.shard(batch)
    for _ in range(10):
      state, loss = p_step(state, b, device_index)
    assert loss.shape == (jax.local_device_count(),)             # per-device: pmap's host rows
    results[layout] = (parallel.unreplicate(state), _split(state))
  (rep, rep_split), (fsdp, fsdp_split) = results["replicated"], results["fsdp"]
  assert rep_split == 0
  # w1 [16, 64], w2 [64, 8] and their two Adam moments are split; b1 (64 < 64? no: 64 elements)
  # too; the counters stay whole.
  assert fsdp_split == 9, fsdp_split
  assert _relative(rep, fsdp) < 1e-6
  assert not np.allclose(rep[0]["w1"], state0[0]["w1"])         # it trained


def _trm_config(data_dir, layout, steps=10):
  c = cpu_demo.get_config("smoke")
  c.dataset.data_dir = str(data_dir)
  c.sharding = layout
  c.async_checkpoints = False
  c.total_steps = steps
  c.checkpoint_every_steps = 5
  return c


@pytest.fixture(scope="module")
def trm_runs(tmp_path_factory):
  """TRM's smoke config, 10 updates, in each layout; and the replicated run resumed from its step-5
  checkpoint under fsdp (a resume in the other layout). {name: (config, workdir, results)}."""
  root = tmp_path_factory.mktemp("trm_fsdp")
  runs = {}
  with pytest.MonkeyPatch.context() as m:
    m.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)   # split the smoke model's small weights too
    for layout in parallel.SHARDINGS:
      c = _trm_config(root / "tfds", layout)
      workdir = str(root / layout)
      runs[layout] = (c, workdir, trm_train.train_and_evaluate(c, workdir))
      if layout == "replicated":         # a copy that forgets step 10, to resume from step 5
        resumed = str(root / "replicated-then-fsdp")
        shutil.copytree(workdir, resumed)
        shutil.rmtree(os.path.join(resumed, "checkpoints", "10"))
    c = _trm_config(root / "tfds", "fsdp")
    runs["replicated-then-fsdp"] = (c, resumed, trm_train.train_and_evaluate(c, resumed))
  return runs


def _params(run, layout):
  c, workdir, _ = run
  c = c.copy_and_resolve_references()
  c.sharding = layout
  step, p = trainer.restore_params(trm_train.TRM(), c, workdir, laid_out=True)
  assert step == 10
  return p


@pytest.mark.slow
def test_trm_trains_alike_in_both_layouts(trm_runs, monkeypatch):
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)
  rep = parallel.unreplicate(_params(trm_runs["replicated"], "replicated"))
  fsdp = _params(trm_runs["fsdp"], "fsdp")
  assert _split(fsdp) >= 8                                        # the split weights came back split
  fsdp = parallel.unreplicate(fsdp)
  resumed = parallel.unreplicate(_params(trm_runs["replicated-then-fsdp"], "replicated"))
  print(f"TRM after 10 updates: fsdp/replicated {_relative(rep, fsdp):.2e}, "
        f"replicated-then-fsdp {_relative(rep, resumed):.2e} relative")
  assert _relative(rep, fsdp) < 1e-6, _relative(rep, fsdp)
  assert _relative(rep, resumed) < 1e-6, _relative(rep, resumed)
  assert _relative(rep, jax.tree.map(np.zeros_like, rep)) == 1.0
  a, b = trm_runs["replicated"][2]["test"], trm_runs["fsdp"][2]["test"]
  assert a["count"] == b["count"] == 40
  np.testing.assert_allclose(b["lm_loss"], a["lm_loss"], rtol=1e-5)


@pytest.mark.slow
def test_checkpoints_restore_bitwise_into_either_layout(trm_runs, monkeypatch):
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)
  for name in ("replicated", "fsdp"):
    one, other = (parallel.unreplicate(_params(trm_runs[name], layout))
                  for layout in parallel.SHARDINGS)
    assert _relative(one, other) == 0.0


def test_a_bad_sharding_value_is_one_line_naming_the_field():
  c = cpu_demo.get_config("smoke")
  c.sharding = "zero3"
  with pytest.raises(errors.ConfigError) as e:
    config_utils.validate_run_config(c)
  assert "sharding" in str(e.value) and "zero3" in str(e.value) and "fsdp" in str(e.value)


_RESTORE_ON_TWO = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2 " + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", "")
import numpy as np, jax
from experiments.common import parallel, trainer
from experiments.trm import train
from experiments.trm.configs import cpu_demo
parallel.FSDP_MIN_ELEMENTS = 256
c = cpu_demo.get_config("smoke"); c.sharding = "fsdp"; c.dataset.data_dir = sys.argv[3]
step, p = trainer.restore_params(train.TRM(), c, sys.argv[1], laid_out=True)
split = sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(p))
assert jax.device_count() == 2 and split > 0, (jax.device_count(), split)
leaves = [np.asarray(x) for x in jax.tree.leaves(parallel.unreplicate(p))]
np.savez(sys.argv[2], *[x for x in leaves if np.issubdtype(x.dtype, np.number)])
print("restored", step, split)
"""


@pytest.mark.slow
def test_a_four_device_fsdp_checkpoint_restores_onto_two_devices(trm_runs, monkeypatch):
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)
  c, workdir, _ = trm_runs["fsdp"]
  want = [x for x in map(np.asarray, jax.tree.leaves(
      parallel.unreplicate(_params(trm_runs["fsdp"], "fsdp")))) if np.issubdtype(x.dtype, np.number)]
  out = os.path.join(os.path.dirname(workdir), "two.npz")
  proc = subprocess.run([sys.executable, "-c", _RESTORE_ON_TWO, workdir, out, c.dataset.data_dir],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "restored 10" in proc.stdout
  got = np.load(out)
  assert len(got.files) == len(want)
  for i, w in enumerate(want):
    np.testing.assert_array_equal(got[f"arr_{i}"], w)


def _text_runs(tmp_path, make_config, train_and_evaluate, experiment, steps):
  """One config trained `steps` updates in each layout; the saved parameters of each."""
  params = {}
  for layout in parallel.SHARDINGS:
    c = make_config(tmp_path / "tfds")
    c.sharding = layout
    c.async_checkpoints = False
    workdir = str(tmp_path / layout)
    train_and_evaluate(c, workdir)
    step, p = trainer.restore_params(experiment, c, workdir, laid_out=True)
    assert step == steps
    params[layout] = parallel.unreplicate(p)
  return params


@pytest.mark.slow
def test_nanogpt_trains_alike_in_both_layouts(tmp_path, monkeypatch):
  from experiments.nanogpt import train as gpt_train  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt.configs import shakespeare_char_cpu  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)

  def config(data_dir):
    c = shakespeare_char_cpu.get_config("smoke")       # 4 x 4 x 128, block 64
    c.dataset.data_dir = str(data_dir)
    c.max_iters, c.eval_interval, c.eval_iters, c.grad_accum = 9, 9, 2, 2
    return c
  p = _text_runs(tmp_path, config, gpt_train.train_and_evaluate, gpt_train.NanoGPT(), 10)
  print(f"nanoGPT after 10 updates: fsdp/replicated {_relative(p['replicated'], p['fsdp']):.2e} "
        "relative")
  assert _relative(p["replicated"], p["fsdp"]) < 1e-6, _relative(p["replicated"], p["fsdp"])


@pytest.mark.slow
def test_masked_diffusion_trains_alike_in_both_layouts(tmp_path, monkeypatch):
  from experiments.diffucoder import train as mdm_train  # pylint: disable=g-import-not-at-top
  from experiments.diffucoder.configs import shakespeare_mdm  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)

  def config(data_dir):
    c = shakespeare_mdm.get_config("smoke")
    c.dataset.data_dir = str(data_dir)
    c.total_steps = 10
    return c
  p = _text_runs(tmp_path, config, mdm_train.train_and_evaluate, mdm_train.MaskedDiffusion(), 10)
  print(f"masked diffusion after 10 updates: fsdp/replicated "
        f"{_relative(p['replicated'], p['fsdp']):.2e} "
        "relative")
  assert _relative(p["replicated"], p["fsdp"]) < 1e-6, _relative(p["replicated"], p["fsdp"])


@pytest.mark.slow
def test_gpt_remat_under_fsdp_equals_the_plain_replicated_step(monkeypatch):
  """A small GPT trained 4 AdamW updates (2 micro-batches each, dropout on) on 4 fake devices: the
  fsdp step with remat gives the replicated step's parameters without remat to float32 rounding,
  and keeps the parameter tree (names, shapes)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from modules import gpt  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)
  cfg = gpt.GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
  tx = optax.chain(optim.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
  params0 = jax.device_get(gpt.GPTModel(cfg).init(jax.random.key(0)))
  n, accum = jax.local_device_count(), 2
  tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (n, accum, 2, cfg.block_size + 1))

  def make_step(model):
    def loss_fn(p, batch, key):
      logits = model.apply(p, batch[:, :-1], key, is_training=True)
      return gpt.cross_entropy(logits, batch[:, 1:]), {}

    def step(state, batch, device_index):
      p, opt = state
      u = device_step.accumulated_update(loss_fn, tx, p, opt, batch, accum,
                                         jax.random.fold_in(jax.random.key(2), device_index))
      return (u.params, u.opt_state), u.loss
    return step

  results = {}
  for layout, remat in (("replicated", False), ("fsdp", False), ("fsdp", True)):
    model = gpt.GPTModel(dataclasses.replace(cfg, remat=remat))
    rules = parallel.Rules(layout)
    p_step = parallel.compile_step(make_step(model), rules, state_in=(0,), out_axes=(None, 0),
                                   blocks=True)
    state = parallel.put_state((params0, tx.init(params0)), rules)
    batch, device_index = parallel.shard(tokens), parallel.shard(parallel.device_indices())
    for _ in range(4):
      state, loss = p_step(state, batch, device_index)
    results[layout, remat] = parallel.unreplicate(state[0]), _split(state)
  base, _ = results["replicated", False]
  assert jax.tree.structure(base) == jax.tree.structure(results["fsdp", True][0])
  assert results["fsdp", True][1] > 0                                # the state is split
  plain, remat = results["fsdp", False][0], results["fsdp", True][0]
  errs = (_relative(plain, remat), _relative(base, plain), _relative(base, remat))
  print("relative differences (fsdp remat/plain, replicated/fsdp, replicated/fsdp remat):", errs)
  # remat recomputes the same sums: equal to float32 rounding. The layouts add each gradient's
  # device sums in another order, which AdamW's normalisation makes visible at small gradients:
  # the same bound as the nanoGPT runs' (test_nanogpt_trains_alike_in_both_layouts).
  assert errs[0] < 1e-6, errs
  assert max(errs[1:]) < 5e-6, errs
  assert _relative(params0, base) > 1e-3                             # it trained


def _gpt_fsdp_step_hlo(monkeypatch):
  """The compiled (4 fake CPU devices) fsdp train step of a small GPT, 2 micro-batches of one
  8-token sequence per device (activations far smaller than a weight, as GPT-2 XL's 1 x 1024
  tokens per chip against its 1600 x 6400 weights): (its HLO text, the parameters' shapes)."""
  from modules import gpt  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)
  cfg = gpt.GPTConfig(block_size=8, vocab_size=64, n_layer=2, n_head=2, n_embd=128)
  model = gpt.GPTModel(cfg)
  tx = optax.adamw(1e-3)
  params = jax.eval_shape(model.init, jax.random.key(0))
  n = jax.device_count()

  def loss_fn(p, batch, key):
    del key
    return gpt.cross_entropy(model.apply(p, batch[:, :-1]), batch[:, 1:]), {}

  def step(state, batch):
    u = device_step.accumulated_update(loss_fn, tx, state[0], state[1], batch, 2, jax.random.key(0))
    return (u.params, u.opt_state), u.loss
  p_step = parallel.compile_step(step, parallel.Rules("fsdp"), state_in=(0,), out_axes=(None, 0),
                                 blocks=True)
  state = (params, jax.eval_shape(tx.init, params))
  batch = jax.ShapeDtypeStruct((n, 2, 1, cfg.block_size + 1), jnp.int32)
  text = p_step.lower(state, batch).compile().as_text()
  return text, {tuple(x.shape) for x in jax.tree.leaves(params)}


def test_fsdp_gathers_the_weights_not_the_activations(monkeypatch):
  """Under fsdp each micro-batch reads the parameters whole (parallel.gather_state): every
  all-gather of the compiled step is of a split parameter, none of the devices' activations, and
  each gradient is reduce-scattered onto its blocks (parallel.mean_state)."""
  text, shapes = _gpt_fsdp_step_hlo(monkeypatch)
  gathered = [tuple(int(d) for d in dims.split(",")) for dims in
              re.findall(r"= \w+\[([0-9,]+)\]\{[^}]*\} all-gather\(", text)]
  assert gathered, "no all-gather: the state is not split"
  assert all(s in shapes for s in gathered), (gathered, shapes)
  assert {(128, 384), (64, 128)} <= set(gathered)        # qkv_proj/w, wte (vocab 64 x C 128)
  assert re.search(r"reduce-scatter\(", text), "no reduce-scatter of the gradients"


# --------------------------------------------------------------------------------------------------
# fsdp with a model axis (config.model_parallel > 1): data groups of m devices, the weights split
# over the group's devices as well. Its numbers are those of data parallelism over the groups: the
# same per-device program, rng and rows run once per group.

def _megatron(module, name, ndim):
  """The toy MLP's model split: the first layer by columns, the second by rows."""
  del ndim
  if module.endswith("in"):
    return (None, parallel.MODEL_AXIS) if name == "w" else (parallel.MODEL_AXIS,)
  return (parallel.MODEL_AXIS, None) if name == "w" else ()


def test_fsdp_spec_keeps_the_model_split_and_takes_another_axis(monkeypatch):
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 16)
  m = parallel.MODEL_AXIS
  assert parallel.fsdp_spec((64, 128), 2, (None, m)) == P(parallel.AXIS, m)
  assert parallel.fsdp_spec((128, 64), 2, (m, None)) == P(m, parallel.AXIS)
  assert parallel.fsdp_spec((64,), 2, (m,)) == P(m)                   # nothing left for AXIS
  assert parallel.fsdp_spec((4, 2), 2, (None, m)) == P(None, m)       # under the floor: model only
  rules = parallel.Rules("fsdp", model_parallel=2, model_spec=_megatron)
  mesh = rules.mesh()
  assert dict(mesh.shape) == {parallel.AXIS: 2, m: 2}
  assert rules.local_rows == jax.local_device_count() // 2
  tree = {"mlp/~/in": {"w": np.zeros((16, 64)), "b": np.zeros(64)},
          "mlp/~/out": {"w": np.zeros((64, 8))}}
  # an optimizer moment of a parameter: the last two dict keys of its path name it
  opt = optax.adam(1e-3).init(tree)
  specs = jax.tree.map(lambda s: s.spec, rules.shardings((tree, opt)))
  assert specs[0]["mlp/~/in"] == {"w": P(parallel.AXIS, m), "b": P(m)}
  assert specs[0]["mlp/~/out"] == {"w": P(m, parallel.AXIS)}
  assert specs[1][0].mu == specs[0] and specs[1][0].nu == specs[0]
  assert specs[1][0].count == P()
  with pytest.raises(ValueError, match="needs sharding='fsdp'"):
    parallel.Rules("replicated", model_parallel=2, model_spec=_megatron)


@pytest.mark.parametrize("m", [2, 4])
def test_a_model_axis_step_equals_data_parallelism_over_its_groups(monkeypatch, m):
  """Ten AdamW updates of a toy MLP on the 4 devices as (4 / m) groups of m (fsdp over the groups,
  weights split over each group's devices) against pmap over 4 / m devices (replicated state): the
  same parameters to float32 rounding, the state split over both mesh axes."""
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 64)
  rng = np.random.RandomState(0)
  params = {"mlp/~/in": {"w": rng.randn(16, 64).astype(np.float32), "b": np.zeros(64, np.float32)},
            "mlp/~/out": {"w": rng.randn(64, 8).astype(np.float32)}}
  tx = optax.chain(optim.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))
  groups = jax.local_device_count() // m
  batch = {"x": rng.randn(groups, 8, 16).astype(np.float32),
           "y": rng.randn(groups, 8, 8).astype(np.float32)}

  def loss_fn(p, b, key):
    del key
    h = jnp.tanh(b["x"] @ p["mlp/~/in"]["w"] + p["mlp/~/in"]["b"])       # [b, 64]
    return jnp.mean((h @ p["mlp/~/out"]["w"] - b["y"]) ** 2), {}

  def step(state, batch, device_index):
    p, opt = state
    b = {"x": batch["x"][None] * (1.0 + 0.01 * device_index), "y": batch["y"][None]}
    u = device_step.accumulated_update(loss_fn, tx, p, opt, b, 1, jax.random.key(0))
    return (u.params, u.opt_state), u.loss
  state0 = jax.device_get((params, tx.init(params)))

  ref = parallel.compile_step(step, state_in=(0,), out_axes=(None, 0), blocks=True,
                              devices=jax.local_devices()[:groups])
  state, index = state0, np.arange(groups, dtype=np.int32)
  for _ in range(10):
    state, _ = ref(state, batch, index)
  want = parallel.unreplicate(state)

  rules = parallel.Rules("fsdp", model_parallel=m, model_spec=_megatron)
  p_step = parallel.compile_step(step, rules, state_in=(0,), out_axes=(None, 0),
                                 donate_argnums=(0,), blocks=True)
  state = parallel.put_state(state0, rules)
  index, b = parallel.shard(parallel.device_indices(rules), rules), parallel.shard(batch, rules)
  for _ in range(10):
    state, loss = p_step(state, b, index)
  assert loss.shape == (groups,)                                   # per group: the host's rows
  w = state[0]["mlp/~/in"]["w"]
  assert w.sharding.spec == P(parallel.AXIS, parallel.MODEL_AXIS)
  assert w.addressable_shards[0].data.shape == (16 // groups, 64 // m)
  got = parallel.unreplicate(state)
  assert _relative(want, got) < 1e-6, _relative(want, got)
  assert not np.allclose(want[0]["mlp/~/in"]["w"], params["mlp/~/in"]["w"])    # it trained


def test_model_parallel_is_checked_against_the_layout_and_the_experiment():
  from experiments.common import layout as layout_lib  # pylint: disable=g-import-not-at-top
  from experiments.diffucoder import train as mdm_train  # pylint: disable=g-import-not-at-top
  from experiments.diffucoder.configs import shakespeare_mdm  # pylint: disable=g-import-not-at-top
  c = shakespeare_mdm.get_config("smoke")
  c.model_parallel = 2
  with pytest.raises(errors.ConfigError, match="model_parallel.*sharding=fsdp"):
    config_utils.validate_run_config(c)               # replicated: no model axis
  c.sharding = "fsdp"
  config_utils.validate_run_config(c)
  l = layout_lib.batch_layout(c)                      # 4 devices: 2 groups of 2, 4 rows each
  assert (l.devices, l.devices_per_host, l.per_device_batch, l.chips) == (2, 2, 4, 4)
  c.model_parallel = 3
  with pytest.raises(errors.ConfigError, match="model_parallel.*divisor of the 4 devices"):
    layout_lib.batch_layout(c)
  c.model_parallel = 4                                # the smoke model has 2 KV heads
  with pytest.raises(errors.ConfigError, match=r"model_parallel.*num_kv_heads=2.*\[1, 2\]"):
    trainer.run_layout(mdm_train.MaskedDiffusion(), c)
  t = cpu_demo.get_config("smoke")
  t.sharding, t.model_parallel = "fsdp", 2
  with pytest.raises(errors.ConfigError, match="model_parallel.*names no split.*use 1"):
    trainer.run_layout(trm_train.TRM(), t)


_MDM_DATA_PARALLEL = """
import os, sys
os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={sys.argv[1]} "
                           + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""))
import numpy as np, jax
from experiments.common import parallel, trainer
from experiments.diffucoder import train
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from test_fsdp import _mdm_model_axis_config
c = _mdm_model_axis_config(sys.argv[2], "replicated", 1)
train.train_and_evaluate(c, sys.argv[3])
step, p = trainer.restore_params(train.MaskedDiffusion(), c, sys.argv[3])
np.savez(sys.argv[4], *[np.asarray(x) for x in jax.tree.leaves(parallel.unreplicate(p))])
print("trained", step, jax.device_count())
"""


def _mdm_model_axis_config(data_dir, sharding, model_parallel):
  """shakespeare_mdm's smoke config with 4 KV heads (model_parallel 4 divides it), 10 updates."""
  from experiments.diffucoder.configs import shakespeare_mdm  # pylint: disable=g-import-not-at-top
  c = shakespeare_mdm.get_config("smoke")
  c.dataset.data_dir = str(data_dir)
  c.model.num_kv_heads, c.model.vocab_size = 4, 68
  c.total_steps, c.async_checkpoints = 10, False
  c.sharding, c.model_parallel = sharding, model_parallel
  return c


@pytest.mark.slow
@pytest.mark.parametrize("m", [2, 4])
def test_masked_diffusion_with_a_model_axis_trains_as_data_parallelism_over_its_groups(
    tmp_path, monkeypatch, m):
  """The small diffusion model, 10 updates on the 4 devices as (4 / m) x m (fsdp x model): the
  parameters of a replicated run on 4 / m devices (a subprocess) to float32 rounding; its
  checkpoint restores bitwise into the replicated and the 1-D fsdp layouts."""
  from experiments.diffucoder import train as mdm_train  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(parallel, "FSDP_MIN_ELEMENTS", 256)
  experiment = mdm_train.MaskedDiffusion()
  c = _mdm_model_axis_config(tmp_path / "tfds", "fsdp", m)
  workdir = str(tmp_path / f"model{m}")
  mdm_train.train_and_evaluate(c, workdir)
  step, p = trainer.restore_params(experiment, c, workdir, laid_out=True)
  assert step == 10
  qkv = [x for path, x in jax.tree_util.tree_leaves_with_path(p) if "qkv_proj" in str(path)
         and x.ndim == 2][0]
  assert parallel.MODEL_AXIS in qkv.sharding.spec          # the weights came back split over it
  got = parallel.unreplicate(p)
  for sharding in parallel.SHARDINGS:
    c1 = _mdm_model_axis_config(tmp_path / "tfds", sharding, 1)
    assert _relative(got, parallel.unreplicate(
        trainer.restore_params(experiment, c1, workdir, laid_out=True)[1])) == 0.0
  # A tool restoring with the run's own config (a sampler, a benchmark) reads the arrays whole.
  assert _relative(got, parallel.unreplicate(trainer.restore_params(experiment, c, workdir)[1])) == 0
  out = str(tmp_path / "ref.npz")
  proc = subprocess.run([sys.executable, "-c", _MDM_DATA_PARALLEL, str(4 // m),
                         str(tmp_path / "tfds"), str(tmp_path / "ref"), out],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"trained 10 {4 // m}" in proc.stdout
  ref = np.load(out)
  want = [ref[f"arr_{i}"] for i in range(len(ref.files))]
  assert _relative(want, jax.tree.leaves(got)) < 1e-6, _relative(want, jax.tree.leaves(got))


@pytest.mark.slow
def test_a_model_axis_across_two_processes_trains_as_one_device_per_process(tmp_path):
  """launch/local.sh: 2 processes x 2 devices as one data group of 2 per process (fsdp x
  model_parallel=2, the groups' rows and state blocks converted host-local <-> global) against 2
  processes x 1 device replicated: the same parameters to float32 rounding and the same held-out
  loss."""
  from experiments.diffucoder import train as mdm_train  # pylint: disable=g-import-not-at-top
  experiment = mdm_train.MaskedDiffusion()
  common = ["--module", "experiments.diffucoder.main", "--config", "configs/shakespeare_mdm.py:smoke"]
  extra = ["--config.total_steps=10", "--config.model.num_kv_heads=4", "--config.model.vocab_size=68",
           f"--config.dataset.data_dir={tmp_path / 'tfds'}"]
  runs = {"2x2 model": ("2", ["--config.sharding=fsdp", "--config.model_parallel=2"]),
          "2x1": ("1", [])}
  for name, (devices, flags) in runs.items():
    workdir = tmp_path / name.replace(" ", "_")
    proc = subprocess.run(
        ["bash", "launch/local.sh", "-n", "2", "-d", devices, *common, "--workdir", str(workdir),
         "--log-dir", str(tmp_path / f"logs_{devices}"), "--", *extra, *flags],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  c = _mdm_model_axis_config(tmp_path / "tfds", "replicated", 1)
  params = {name: parallel.unreplicate(trainer.restore_params(
      experiment, c, str(tmp_path / name.replace(" ", "_")))[1]) for name in runs}
  assert _relative(params["2x1"], params["2x2 model"]) < 1e-6
  evals = [_final_eval(tmp_path / name.replace(" ", "_")) for name in runs]
  np.testing.assert_allclose(evals[0]["eval"]["masked_ce"], evals[1]["eval"]["masked_ce"],
                             rtol=1e-6)


def _final_eval(workdir):
  """The run's final_eval.json."""
  import json  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, "final_eval.json"), encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.usefixtures("libtpu")
def test_a_model_axis_step_compiles_for_a_tpu_slice_with_its_blocks_per_chip():
  """The toy step compiled for a v4-8 (4 chips) under fsdp x model_parallel=2
  (tpu_target.lower_step, as `--dry_run --target` does): per-device arguments get one row per data
  group (2), and each chip's argument bytes are the state's / 4 (split over both axes) plus the
  rows."""
  from experiments.tools import tpu_compile  # pylint: disable=g-import-not-at-top
  from experiments.tools import tpu_target  # pylint: disable=g-import-not-at-top
  params = {"mlp/~/in": {"w": jax.ShapeDtypeStruct((256, 512), jnp.float32)},
            "mlp/~/out": {"w": jax.ShapeDtypeStruct((512, 256), jnp.float32)}}
  tx = optax.adam(1e-3)

  def loss_fn(p, x, key):
    del key
    return jnp.mean((jnp.tanh(x @ p["mlp/~/in"]["w"]) @ p["mlp/~/out"]["w"]) ** 2), {}

  def step(state, x):
    u = device_step.accumulated_update(loss_fn, tx, state[0], state[1], x[None], 1,
                                       jax.random.key(0))
    return u.params, u.opt_state
  state = (params, jax.eval_shape(tx.init, params))
  target = tpu_target.parse_target("v4-8")
  lowered = tpu_target.lower_step(
      step, target, (state, jax.ShapeDtypeStruct((8, 256), jnp.float32)),
      rules=parallel.Rules("fsdp", model_parallel=2, model_spec=_megatron),
      state_in=(0,), out_axes=None, donate_argnums=(0,), blocks=True)
  assert lowered.args_info[0][1].shape == (2, 8, 256)                       # 2 data groups
  report = tpu_compile.compile_report(lowered, target=target, name="toy")
  state_bytes = 3 * 2 * 256 * 512 * 4                # params and two Adam moments, float32
  assert report.compiled and report.fits
  assert state_bytes / 4 <= report.argument_bytes < state_bytes / 4 + 2 ** 16, report.argument_bytes
