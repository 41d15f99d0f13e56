"""End-to-end tests of the TRM trainer on tiny configs (4 fake CPU devices, see conftest.py)."""

import dataclasses
import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from experiments.common import config_utils
from experiments.common import cpu_features
from experiments.common import device_step
from experiments.common import layout
from experiments.common import parallel
from experiments.common import trainer
from experiments.trm import cpu_tuning
from experiments.trm import evaluators
from experiments.trm import train
from experiments.trm.configs import arc1_att, arc2_att, base, cpu_demo, maze_att
from experiments.trm.configs import sudoku_att, sudoku_mlp, v4_64
from input_pipeline.puzzles import sudoku
from input_pipeline.puzzles import sudoku_generator
from modules import trm
from modules.kernels import xla_cpu

TRM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                       "trm")


def _smoke_config(tmp_path, **overrides):
  c = cpu_demo.get_config("smoke")
  c.dataset.data_dir = str(tmp_path / "tfds")
  for k, v in overrides.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


def _event_scalars(workdir):
  """{tag: {step: value}} from every TensorBoard event file in workdir."""
  out = {}
  for path in sorted(glob.glob(os.path.join(workdir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
          out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return out


def test_train_writes_metrics_checkpoints_table_and_resumes(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  config = _smoke_config(tmp_path)
  steps = []                     # the steps compiled with split_reduce's XLA option (a CPU target)
  init = parallel.Step.__init__

  def record(self, *args, **kwargs):
    init(self, *args, **kwargs)
    if self.compiler_options:
      steps.append(self)

  monkeypatch.setattr(parallel.Step, "__init__", record)
  results = train.train_and_evaluate(config, workdir)
  # The training step (precompiled at start from shapes) and the evaluation step: one compile each,
  # so the precompiled signature is the one the loop calls with.
  assert [len(p._compiled) for p in steps] == [1, 1]  # pylint: disable=protected-access
  assert all(p.compiler_options == cpu_features.CPU_DOTS_ONLY for p in steps)

  # Final table: every test puzzle counted once (40 puzzles in 3 padded batches of 16 on 4 devices).
  assert results["test"]["count"] == 40
  for key in ("exact_accuracy", "accuracy", "q_halt_accuracy", "steps", "lm_loss", "q_halt_loss"):
    assert np.isfinite(results["test"][key])
  assert results["test"]["steps"] == config.model.halt_max_steps   # evaluation runs every step
  with open(os.path.join(workdir, "final_eval.json")) as f:
    saved = json.load(f)
  assert saved["step"] == 6 and saved["test"]["count"] == 40

  # TensorBoard: train and eval scalars at the logged steps, progress, learning rate.
  scalars = _event_scalars(workdir)
  for tag in ("train/lm_loss", "train/q_halt_loss", "train/lr", "train/grad_norm", "train/count",
              "eval/exact_accuracy", "eval/accuracy", "eval/count", "steps_per_sec"):
    assert tag in scalars, (tag, sorted(scalars))
  assert sorted(scalars["train/lm_loss"]) == [2, 4, 6]
  assert sorted(scalars["eval/exact_accuracy"]) == [3, 6]
  assert scalars["train/lr"][2] == pytest.approx(config.lr * 2 / config.lr_warmup_steps, rel=1e-6)

  # Checkpoints every 3 steps (keep 2), the last one forced.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]

  # A second run on the same workdir with more steps resumes at step 6 and only runs 7..9.
  config.total_steps = 9
  config.allow_config_change = True          # a longer run: a config change, said explicitly
  train.train_and_evaluate(config, workdir)
  steps_logged = sorted(_event_scalars(workdir)["train/lm_loss"])
  assert steps_logged == [2, 4, 6, 8, 9]
  assert "9" in os.listdir(os.path.join(workdir, "checkpoints"))


def test_training_on_a_fixed_batch_lowers_the_loss():
  config = cpu_demo.get_config("smoke")
  config.model.halt_max_steps = 1          # every step is a fresh ACT episode on the same puzzles
  config.lr = 3e-3
  config.lr_warmup_steps = 1
  model = trm.TRMModel(train.model_config(config, sudoku.METADATA))
  adam, sign = train.make_optimizers(config, total_steps=30)
  n = jax.local_device_count()
  per_device = 4
  puzzles, solutions = sudoku_generator.generate_puzzles(n * per_device, seed=3, givens=45)
  batch = {"inputs": sudoku.grid_to_tokens(puzzles).reshape(n, per_device, 81).astype(np.int32),
           "labels": sudoku.grid_to_tokens(solutions).reshape(n, per_device, 81).astype(np.int32),
           "puzzle_identifiers": np.zeros((n, per_device), np.int32)}
  state = parallel.replicate(train.init_state(model, adam, sign, jax.random.key(0)))
  carry = parallel.shard(train.init_device_state(model, per_device, n, jax.device_count()))
  step = device_step.parallel_train_step(
      train.make_train_step(model, adam, sign, config, per_device), config.nonfinite,
      seed=config.seed, rng_step_offset=train.TRM.rng_step_offset)
  batch, dev = parallel.shard(batch), parallel.shard(parallel.device_indices())
  losses = []
  for _ in range(30):
    state, carry, sums = step(state, carry, batch, dev)
    host = parallel.unreplicate(sums)
    losses.append(float(np.asarray(host["lm_loss"]).reshape(-1)[0]) / (n * per_device))
  assert losses[-1] < 0.6 * losses[0], losses
  # Every row halts after one step and is counted: metrics count the whole global batch.
  assert float(np.asarray(host["count"]).reshape(-1)[0]) == n * per_device
  assert int(parallel.unreplicate(state.step)) == 30


@pytest.mark.parametrize("module,arg", [
    (base, None), (sudoku_mlp, None), (sudoku_att, None), (maze_att, None),
    (maze_att, "dihedral=False"), (arc1_att, None), (arc2_att, None), (v4_64, None),
    (v4_64, "batch=6144"), (v4_64, "recipe=maze_att"), (v4_64, "recipe=arc2_att"),
    (cpu_demo, None), (cpu_demo, "smoke")])
def test_every_config_validates(module, arg):
  config = module.get_config(arg) if arg else module.get_config()
  train.validate_config(config)
  if module is v4_64:
    assert config.num_devices == 32 and config.devices_per_host == 4
    assert config.global_batch_size == (6144 if arg == "batch=6144" else 768)
    assert config.ema
    assert config.model.mlp_t == (arg is None or arg.startswith("batch"))


def test_maze_and_arc_recipes_match_the_reference():
  m = maze_att.get_config()
  assert (m.dataset.name, m.model.L_cycles, m.model.mlp_t, m.epochs, m.eval_interval_epochs) == (
      "maze_hard", 4, False, 50000, 5000)
  assert (m.lr, m.puzzle_emb_lr, m.weight_decay, m.puzzle_emb_weight_decay, m.ema) == (
      1e-4, 1e-4, 1.0, 1.0, True)
  assert m.dataset.builder_kwargs.dihedral            # the paper's 8 transforms (explicit choice)
  assert not maze_att.get_config("dihedral=False").dataset.builder_kwargs.dihedral
  for module, variant in ((arc1_att, "arc1"), (arc2_att, "arc2")):
    a = module.get_config()
    assert (a.dataset.name, a.dataset.builder_kwargs.variant, a.dataset.builder_kwargs.num_aug) == (
        "arc_agi", variant, 1000)
    assert (a.model.L_cycles, a.epochs, a.eval_interval_epochs, a.lr, a.puzzle_emb_lr) == (
        4, 100000, 10000, 1e-4, 1e-2)
    assert (a.weight_decay, a.puzzle_emb_weight_decay, a.ema, a.shard_puzzle_table) == (
        0.1, 0.1, True, True)


def test_reference_recipe_fields():
  c = sudoku_mlp.get_config()
  assert (c.model.mlp_t, c.model.pos_encodings, c.epochs, c.lr, c.puzzle_emb_lr) == (
      True, "none", 50000, 1e-4, 1e-4)
  assert (c.weight_decay, c.puzzle_emb_weight_decay, c.global_batch_size, c.ema) == (
      1.0, 1.0, 768, True)
  # docs/trm.md section 4.5: 65,104 steps at batch 768 on 1000 training puzzles x 50000 epochs.
  assert train.num_train_steps(c, layout.batch_layout(c, devices=8, devices_per_host=8,
                                                     check_num_devices=False), 1000) == 65104
  a = sudoku_att.get_config()
  assert (a.model.mlp_t, a.model.pos_encodings) == (False, "rope")


def test_config_errors_name_field_value_and_fix():
  c = cpu_demo.get_config("smoke")
  c.unlock()
  c.model.hiden_size = 3
  with pytest.raises(config_utils.ConfigError, match=r"hiden_size.*hidden_size"):
    trainer.check_config(train.TRM(), c)

  c = v4_64.get_config()
  with pytest.raises(config_utils.ConfigError) as e:
    layout.batch_layout(c)
  msg = str(e.value)
  assert "num_devices=32" in msg and "4" in msg and "--config.num_devices=4" in msg

  c = cpu_demo.get_config("smoke")
  c.global_batch_size = 18
  with pytest.raises(config_utils.ConfigError, match=r"global_batch_size=18.*multiple of 4"):
    layout.batch_layout(c)

  c = cpu_demo.get_config("smoke")
  c.model.num_heads = 3
  with pytest.raises(config_utils.ConfigError, match="num_heads"):
    train.model_config(c, sudoku.METADATA)


def test_cpu_forms_pick_the_model_fields_and_never_reach_a_tpu_program():
  c = cpu_demo.get_config("smoke")
  names = ("fast_grad", "seq_major", "unroll", "head_major", "lean_swiglu")
  assert cpu_tuning.FORMS[:5] == names

  def carried(text="all", tuning=True):            # (the model's Forms, the steps' XLA options)
    with cpu_tuning.override(text):                # as the tuning tools turn forms off
      m = train.model_config(c, sudoku.METADATA, cpu_tuning.kernels(tuning))
      return m.forms, cpu_tuning.compiler_options(tuning)

  def forms(f):                                                         # on/off per model form
    return tuple(getattr(f, name) for name in names)

  on, options = carried()                                               # "all"
  assert forms(on) == (True, True, True, True, True)
  assert options == cpu_features.CPU_DOTS_ONLY
  assert forms(carried("seq_major, unroll")[0]) == (False, True, True, False, False)
  assert forms(carried("head_major")[0]) == (False, False, False, True, False)
  assert forms(carried("lean_swiglu")[0]) == (False, False, False, False, True)
  none, options = carried("none")
  assert not any(forms(none))
  assert options == {}                                                  # no split_reduce
  only, options = carried("split_reduce")
  assert not any(forms(only))
  assert options == cpu_features.CPU_DOTS_ONLY
  assert carried(tuning=False) == (xla_cpu.Forms(), {})                 # not a CPU target
  assert train.model_config(c, sudoku.METADATA).kernels == "default"
  # nograd_chunks: the cycles without gradient in chunks, for a bfloat16 forward on a CPU target.
  assert on.nograd_chunk_elements == 0 and c.model.forward_dtype == "float32"   # make run's model
  c.model.forward_dtype = "bfloat16"
  assert carried()[0].nograd_chunk_elements == 2 ** 19
  assert carried(tuning=False)[0].nograd_chunk_elements == 0
  chunks = carried("nograd_chunks")[0]
  assert chunks.nograd_chunk_elements == xla_cpu.NOGRAD_CHUNK_ELEMENTS and not any(forms(chunks))
  listed = "fast_grad,seq_major,unroll,head_major,lean_swiglu,split_reduce,batch_slices"
  assert carried(listed)[0].nograd_chunk_elements == 0
  # pad_contraction: the token mix's products over the sequence padded, bfloat16 on a CPU target.
  assert not on.pad_contraction                                          # float32 (make run)
  assert not carried(listed)[0].pad_contraction                          # not listed
  padded = carried("pad_contraction")[0]
  assert padded.pad_contraction and not any(forms(padded)) and padded.nograd_chunk_elements == 0
  assert not carried(tuning=False)[0].pad_contraction
  assert carried()[0].pad_contraction
  # split_gate_up: with fast_grad and lean_swiglu, bfloat16 on a CPU target.
  assert carried()[0].split_gate_up
  assert not carried(tuning=False)[0].split_gate_up
  assert not on.split_gate_up                                            # float32 (make run)
  assert not carried("split_gate_up")[0].split_gate_up                   # without its two forms
  assert carried("fast_grad,lean_swiglu,split_gate_up")[0].split_gate_up
  # A tool's unknown form name, and the one selector's bad value: the field, the value and the fix.
  with pytest.raises(ValueError, match=r"forms='fast_grad,seqmajor'.*seqmajor.*seq_major"):
    cpu_tuning.parse_forms("fast_grad,seqmajor")
  with pytest.raises(config_utils.ConfigError, match=r"kernels='cpu'.*default.*xla_cpu"):
    train.model_config(c, sudoku.METADATA, "cpu")


def test_config_path_resolves_inside_the_experiment(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  argv = config_utils.resolve_config_argv(["main", "--config=configs/v4_64.py:batch=6144"], TRM_DIR)
  assert argv[1] == f"--config={os.path.join(TRM_DIR, 'configs', 'v4_64.py')}:batch=6144"


def test_main_runs_the_used_by_command_and_names_the_device_mismatch(tmp_path):
  """`python -m experiments.trm.main --config=configs/v4_64.py` from the repo root, on a machine that
  is not a v4-64: it resolves the config inside experiments/trm/ and stops with the one-line error."""
  import subprocess
  import sys
  repo = os.path.dirname(TRM_DIR.rstrip("/").rsplit("/", 1)[0])
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4 "
             + os.environ.get("PODLAB_TEST_XLA_OPT_FLAGS", ""))
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.trm.main", "--config=configs/v4_64.py",
       f"--config.dataset.data_dir={tmp_path}"],
      cwd=repo, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "error: config.num_devices=32" in proc.stderr
  assert "--config.num_devices=4" in proc.stderr


@pytest.mark.slow        # the entry's dry run: tests/test_dry_run.py (tiny configs, v4-8) in make test
def test_dry_run_compiles_the_pod_config_on_this_machine():
  """`--dry_run --target=cpu` compiles one v4-64 host's steps with 4 fake devices and reports the
  pod layout."""
  import subprocess
  import sys
  repo = os.path.dirname(TRM_DIR.rstrip("/").rsplit("/", 1)[0])
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="")
  proc = subprocess.run([sys.executable, "-m", "experiments.trm.main", "--config=configs/v4_64.py",
                         "--dry_run", "--target=cpu"], cwd=repo, env=env, capture_output=True,
                        text=True, timeout=180)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "32 = 8 host(s) x 4" in out
  assert "global batch 768 = 8 host(s) x 4 cpu device(s) x 24" in out
  assert "65,104 updates" in out
  assert "5,028,866 Adam parameters" in out
  assert "42.72 GFLOP per example" in out
  assert "eval_step" in out


def test_sharded_puzzle_table_trains_and_evaluates_like_the_replicated_one(tmp_path):
  """The table split by rows over the 4 devices (the default) gives bitwise the reference's numbers."""
  from experiments.trm import sharded_table  # pylint: disable=g-import-not-at-top
  config = _smoke_config(tmp_path)
  config.model.puzzle_emb_ndim = config.model.hidden_size      # the puzzle-embedding prefix on
  config.model.puzzle_emb_len = 4
  config.lr_warmup_steps = 1
  num_ids = 10
  model = trm.TRMModel(train.model_config(config, dict(sudoku.METADATA,
                                                       num_puzzle_identifiers=num_ids)))
  adam, sign = train.make_optimizers(config, total_steps=4)
  n, per_device = jax.local_device_count(), 2
  rng = np.random.default_rng(0)
  puzzles, solutions = sudoku_generator.generate_puzzles(n * per_device, seed=5, givens=45)
  dev = parallel.shard(parallel.device_indices())
  text = train.parameter_table(train.init_state(model, adam, sign, jax.random.key(0), shard_table=True),
                                   model, num_devices=4)
  assert (f"Puzzle-embedding table (SignSGD, not counted above): ({num_ids}, "
          f"{config.model.hidden_size}) = {num_ids * config.model.hidden_size:,}, sharded: 3 rows "
          "on each of 4 devices") in text
  results = {}
  for shard in (False, True):
    state = parallel.replicate(train.init_state(model, adam, sign, jax.random.key(0), shard_table=shard))
    dstate = parallel.shard(train.init_device_state(model, per_device, n, jax.device_count(),
                                                    shard_table=shard))
    step = device_step.parallel_train_step(
        train.make_train_step(model, adam, sign, config, per_device), config.nonfinite,
        seed=config.seed, rng_step_offset=train.TRM.rng_step_offset)
    rng = np.random.default_rng(0)
    for _ in range(4):         # ids 0..9 over 4 devices of R = 3 rows: every shard gets updates
      ids = rng.integers(0, num_ids, (n, per_device)).astype(np.int32)
      batch = parallel.shard({
          "inputs": sudoku.grid_to_tokens(puzzles).reshape(n, per_device, 81).astype(np.int32),
          "labels": sudoku.grid_to_tokens(solutions).reshape(n, per_device, 81).astype(np.int32),
          "puzzle_identifiers": ids})
      state, dstate, sums = step(state, dstate, batch, dev)
    eval_step = parallel.compile_step(evaluators.make_eval_step(model, per_device, sharded=shard),
                                   state_in=(0, 1) if shard else (0, 1, 2), out_axes=0)
    eval_batch = {"inputs": np.asarray(batch["inputs"]), "labels": np.asarray(batch["labels"]),
                  "puzzle_identifiers": np.asarray(batch["puzzle_identifiers"]),
                  "mask": np.ones((n, per_device), bool)}
    ev = evaluators.evaluate(eval_step, state, [eval_batch], use_ema=True,
                        table=dstate.puzzle_shard if shard else None, device_index=dev)
    host = parallel.unreplicate(state)
    table = train.host_puzzle_table(host.puzzle_table, dstate, num_ids)
    if shard:
      assert host.puzzle_table is None
      assert dstate.puzzle_shard.shape == (n, sharded_table.rows_per_device(num_ids, n),
                                           model.config.emb_ndim)
    results[shard] = (jax.tree.leaves(host.params), table, ev)
  (p0, t0, e0), (p1, t1, e1) = results[False], results[True]
  assert np.any(t0 != 0) and t0.shape == (num_ids, model.config.emb_ndim)
  np.testing.assert_array_equal(t1, t0)
  for a, b in zip(p0, p1):
    np.testing.assert_array_equal(a, b)
  assert e0 == e1


@pytest.mark.parametrize("kernels", ["xla_cpu", pytest.param("default", marks=pytest.mark.slow)])
def test_batch_slices_give_the_whole_batch_step(tmp_path, kernels):
  """config.batch_slices = 2: each device's batch of 4 runs as two slices of 2, forward and backward,
  gradients summed. The recursion, the halting, the metrics and the puzzle-row updates are the whole
  batch's; the parameters agree to float32 rounding (the weight gradients' sums in another order)."""
  config = _smoke_config(tmp_path)
  config.model.puzzle_emb_ndim = config.model.hidden_size      # puzzle-row gradients too
  config.model.puzzle_emb_len = 2
  config.lr_warmup_steps = 1
  num_ids = 6
  model = trm.TRMModel(train.model_config(config, dict(sudoku.METADATA, num_puzzle_identifiers=num_ids),
                                          kernels))
  assert model.config.halt_max_steps > 1                        # halting with exploration
  adam, sign = train.make_optimizers(config, total_steps=3)
  n, per_device = jax.local_device_count(), 4
  puzzles, solutions = sudoku_generator.generate_puzzles(n * per_device, seed=7, givens=40)
  ids = np.random.default_rng(1).integers(0, num_ids, (n, per_device)).astype(np.int32)
  batch = parallel.shard({
      "inputs": sudoku.grid_to_tokens(puzzles).reshape(n, per_device, 81).astype(np.int32),
      "labels": sudoku.grid_to_tokens(solutions).reshape(n, per_device, 81).astype(np.int32),
      "puzzle_identifiers": ids})
  dev = parallel.shard(parallel.device_indices())
  runs = {}
  for slices in (1, 2):
    state = parallel.replicate(train.init_state(model, adam, sign, jax.random.key(0)))
    dstate = parallel.shard(train.init_device_state(model, per_device, n, jax.device_count()))
    step = device_step.parallel_train_step(
        train.make_train_step(model, adam, sign, config, per_device, slices), config.nonfinite,
        seed=config.seed, rng_step_offset=train.TRM.rng_step_offset)
    history = []
    for _ in range(3):
      state, dstate, sums = step(state, dstate, batch, dev)
      history.append((jax.tree.map(lambda x: np.asarray(parallel.unreplicate(x)), sums),
                      jax.tree.map(np.asarray, dstate.carry)))
    runs[slices] = (history, parallel.unreplicate(state))
  (h1, s1), (h2, s2) = runs[1], runs[2]
  sums1, carry1 = h1[0]
  sums2, carry2 = h2[0]
  # Step 1 (the same parameters): the forward values and so the halting and metrics are the batch's.
  np.testing.assert_array_equal(carry2.halted, carry1.halted)
  np.testing.assert_array_equal(carry2.steps, carry1.steps)
  np.testing.assert_allclose(carry2.z_H.astype(np.float32), carry1.z_H.astype(np.float32),
                             rtol=0, atol=1e-6)
  value = lambda sums, key: float(sums[key].reshape(-1)[0])    # noqa: E731
  for key in ("count", "exact_accuracy", "steps"):
    assert value(sums2, key) == value(sums1, key), key
  np.testing.assert_allclose(value(sums2, "lm_loss"), value(sums1, "lm_loss"), rtol=1e-6)
  np.testing.assert_allclose(value(sums2, "grad_norm"), value(sums1, "grad_norm"), rtol=1e-5)
  # After three steps: the same parameters and puzzle rows up to float32 rounding, and learning.
  for a, b in zip(jax.tree.leaves(s2.params), jax.tree.leaves(s1.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(s2.puzzle_table), np.asarray(s1.puzzle_table), atol=1e-6)
  assert np.any(np.asarray(s1.puzzle_table) != 0)
  # A slice count that does not divide the per-device batch: the field, the value and the fix.
  with pytest.raises(config_utils.ConfigError, match=r"batch_slices=3.*divide.*per-device batch"):
    train.make_train_step(model, adam, sign, config, per_device, 3)
  config.batch_slices = -1
  with pytest.raises(config_utils.ConfigError, match=r"batch_slices=-1.*>= 0"):
    train.validate_config(config)
  # Automatic (0, the default) on a CPU target with the form: the fewest slices (a power of two,
  # at least 2) of at most SLICE_ELEMENTS activations each; else the whole batch.
  config.batch_slices = 0
  auto = lambda batch, mc=model.config, tuning=True: cpu_tuning.batch_slices(  # noqa: E731
      config.batch_slices, mc, batch, cpu_tuning=tuning)
  assert auto(4) == 2                                                 # this tiny model
  assert auto(3) == 1                                                 # 2 does not divide 3
  assert auto(4, tuning=False) == 1                                   # a TPU target
  recipe = trm.TRMConfig(seq_len=81, vocab_size=11, hidden_size=512, puzzle_emb_ndim=512)  # 97 x 512
  demo = trm.TRMConfig(seq_len=81, vocab_size=11, hidden_size=64, puzzle_emb_ndim=0)  # make run
  assert (recipe.total_len, demo.total_len) == (97, 81)
  recipe_f32 = dataclasses.replace(recipe, forward_dtype="float32")
  assert [auto(b, recipe_f32) for b in (64, 128, 256, 512)] == [2, 4, 8, 16]   # slices of 32
  assert 32 * 97 * 512 <= cpu_tuning.SLICE_ELEMENTS < 64 * 97 * 512
  assert [auto(b, demo) for b in (128, 256)] == [2, 2]
  assert auto(150, recipe_f32) == 2       # 75 examples per slice are over the budget, 4 does not divide 150
  # A bfloat16 forward with the token mix (TRM-MLP): slices of at most TOKEN_MIX_SLICE_ELEMENTS,
  # 8 examples of the recipe; with attention (TRM-Att), BF16_ATTENTION_SLICE_ELEMENTS, 16
  # examples; float32 keeps SLICE_ELEMENTS (32 examples).
  token_mix = dataclasses.replace(recipe, mlp_t=True)
  assert [auto(b, token_mix) for b in (64, 256)] == [8, 32]        # slices of 8 examples
  assert 8 * 97 * 512 <= cpu_tuning.TOKEN_MIX_SLICE_ELEMENTS < 16 * 97 * 512
  assert [auto(b, dataclasses.replace(token_mix, forward_dtype="float32")) for b in (64, 256)] == [2, 8]
  assert recipe.forward_dtype == "bfloat16" and not recipe.mlp_t
  assert [auto(b, recipe) for b in (64, 256)] == [4, 16]           # slices of 16 examples
  assert 16 * 97 * 512 <= cpu_tuning.BF16_ATTENTION_SLICE_ELEMENTS < 32 * 97 * 512
  demo_bf16 = dataclasses.replace(demo, mlp_t=True)                    # make run's model in bfloat16
  assert auto(128, demo_bf16) == 2                                     # 64 x 81 x 64 fits the budget
  assert auto(150, token_mix) == 2                                     # 4 does not divide 150
  with cpu_tuning.override("fast_grad,split_reduce"):                 # without the form
    assert auto(4) == 1 and auto(256, recipe) == 1
  config.batch_slices = 4                                             # explicit: any target
  assert cpu_tuning.batch_slices(config.batch_slices, model.config, 8, cpu_tuning=False) == 4
