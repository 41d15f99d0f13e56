"""Tests of experiments/trm/reference_checkpoint.py against an independent PyTorch TRM.

tests/torch_trm_reference.py is written from docs/trm.md (no podlab code); its state_dict is
saved with torch.save, imported into podlab and the ACT steps are compared in float32.

A note on tolerances: a random TRM is a chaotic map; float32 rounding differences grow by ~2x
(attention) to ~5-10x (token MLP) per ACT step of free-running recursion, in the reference itself as
much as here (measured: reference float32 vs reference float64 drifts as far as podlab float32 does).
So the strict bound (2e-5, "well under 1e-4") is checked on every step from the SAME carry (the
reference's), and the free-running carries over the whole episode against 1e-4; the token-MLP case
uses H_cycles=2.
"""
import dataclasses
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")

from experiments.trm import reference_checkpoint as rc  # noqa: E402
from experiments.trm import reference_format  # noqa: E402
from modules import trm  # noqa: E402
from tests import torch_trm_reference as ref  # noqa: E402

B, L, V, N_PUZZLES = 4, 81, 11, 5
SAME_CARRY_TOL = 2e-5
FREE_RUN_TOL = 1e-4

CASES = {
    "mlp_t-none": dict(mlp_t=True, pos_encodings="none", H_cycles=2),
    "attention-rope": dict(mlp_t=False, pos_encodings="rope", H_cycles=3),
    "attention-learned": dict(mlp_t=False, pos_encodings="learned", H_cycles=3),
}


def rel_err(got, want) -> float:
  got = np.asarray(got, np.float64)
  want = np.asarray(want, np.float64)
  return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def norm_rel_err(got, want) -> float:
  got = np.asarray(got, np.float64)
  want = np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def make_batch(seed: int):
  g = torch.Generator().manual_seed(seed)
  return {"inputs": torch.randint(1, V, (B, L), generator=g, dtype=torch.int32),
          "labels": torch.randint(2, V, (B, L), generator=g, dtype=torch.int32),
          "puzzle_identifiers": torch.randint(0, N_PUZZLES, (B,), generator=g, dtype=torch.int32)}


def to_jax_batch(batch):
  return {k: jnp.asarray(v.numpy()) for k, v in batch.items()}


def to_jax_carry(c: "ref.Carry") -> trm.ACTCarry:
  return trm.ACTCarry(z_H=jnp.asarray(c.z_H.numpy()), z_L=jnp.asarray(c.z_L.numpy()),
                      steps=jnp.asarray(c.steps.numpy()), halted=jnp.asarray(c.halted.numpy()),
                      current_data=to_jax_batch(c.current_data))


def small_ref_config(**kw) -> "ref.RefConfig":
  return ref.RefConfig(seq_len=L, vocab_size=V, num_puzzle_identifiers=N_PUZZLES, hidden_size=64,
                       num_heads=2, L_cycles=2, L_layers=2, halt_max_steps=2, **kw)


def podlab_config(rcfg: "ref.RefConfig") -> trm.TRMConfig:
  return trm.TRMConfig(seq_len=rcfg.seq_len, vocab_size=rcfg.vocab_size,
                       num_puzzle_identifiers=rcfg.num_puzzle_identifiers,
                       hidden_size=rcfg.hidden_size, num_heads=rcfg.num_heads,
                       H_cycles=rcfg.H_cycles, L_cycles=rcfg.L_cycles, L_layers=rcfg.L_layers,
                       pos_encodings=rcfg.pos_encodings, mlp_t=rcfg.mlp_t,
                       halt_max_steps=rcfg.halt_max_steps, forward_dtype="float32")


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
  """A random torch reference, saved with and without `_orig_mod.`, loaded and imported."""
  torch.set_num_threads(1)
  rcfg = small_ref_config(**CASES[request.param])
  model = ref.randomize_(ref.TorchTRM(rcfg), seed=1).eval()
  sd = model.state_dict()
  tmp = tmp_path_factory.mktemp(request.param)
  plain, compiled = str(tmp / "plain.pt"), str(tmp / "compiled.pt")
  torch.save(sd, plain)
  torch.save({"_orig_mod." + k: v for k, v in sd.items()}, compiled)
  loaded = rc.load_state_dict(compiled)
  config = podlab_config(rcfg)
  return dict(name=request.param, rcfg=rcfg, model=model, sd=sd, plain=plain, compiled=compiled,
              loaded=loaded, config=config, imported=rc.import_reference(loaded, config))


def test_state_dict_format_and_load(case):
  sd, loaded, config = case["sd"], case["loaded"], case["config"]
  plain = rc.load_state_dict(case["plain"])
  # The independent reference's keys are exactly the layout podlab expects (section 8).
  assert sorted(sd) == sorted(rc.reference_key_shapes(config))
  for key, (shape, dtype) in rc.reference_key_shapes(config).items():
    assert tuple(sd[key].shape) == shape, key
    assert str(sd[key].dtype).removeprefix("torch.") == dtype, key
  assert sorted(plain) == sorted(loaded) == sorted(sd)            # `_orig_mod.` stripped
  for key in sd:
    assert loaded[key].dtype == plain[key].dtype
    np.testing.assert_array_equal(loaded[key].view(np.uint8), plain[key].view(np.uint8))
  assert loaded["model.inner.H_init"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(loaded["model.inner.H_init"].astype(np.float32),
                                sd["model.inner.H_init"].float().numpy())
  params, state, table = case["imported"]
  assert state["trm"]["L_init"].dtype == jnp.bfloat16 and table.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(params["trm/~/lm_head"]["w"]),
                                sd["model.inner.lm_head.weight"].numpy().T)
  # The inferred config equals the true one given the non-inferable fields.
  inferred = rc.infer_config(loaded, num_heads=2, H_cycles=config.H_cycles, L_cycles=2,
                             halt_max_steps=2, seq_len=L, pos_encodings=config.pos_encodings,
                             forward_dtype="float32")
  assert inferred == config


def test_act_steps_match_torch_reference_float32(case):
  model, config = case["model"], case["config"]
  params, state, table = case["imported"]
  batches = [make_batch(s) for s in range(3)]
  t_carry = model.model.initial_carry(batches[0])
  j_carry = rc.initial_carry(config, to_jax_batch(batches[0]))
  errors = {"logits": 0.0, "q_halt_logits": 0.0, "q_continue_logits": 0.0, "z": 0.0}
  free_errors = dict(errors)
  for step, batch in enumerate(batches):
    if step == 1:                           # mixed slots: rows 0, 2 take a new example, 1, 3 continue
      mixed = torch.tensor([True, False, True, False])
      t_carry = dataclasses.replace(t_carry, halted=mixed)
      j_carry = j_carry._replace(halted=jnp.asarray(mixed.numpy()))
    jb = to_jax_batch(batch)
    same_carry, same_out = rc.act_step(config, params, state, table, to_jax_carry(t_carry), jb)
    j_carry, j_out = rc.act_step(config, params, state, table, j_carry, jb)
    t_carry, t_out = model.model(t_carry, batch)
    for k in ("logits", "q_halt_logits", "q_continue_logits"):
      errors[k] = max(errors[k], rel_err(same_out[k], t_out[k].numpy()))
      free_errors[k] = max(free_errors[k], rel_err(j_out[k], t_out[k].numpy()))
    for z in ("z_H", "z_L"):
      errors["z"] = max(errors["z"], rel_err(getattr(same_carry, z), getattr(t_carry, z).numpy()))
      free_errors["z"] = max(free_errors["z"], rel_err(getattr(j_carry, z),
                                                       getattr(t_carry, z).numpy()))
    for c in (same_carry, j_carry):
      np.testing.assert_array_equal(np.asarray(c.steps), t_carry.steps.numpy())
      np.testing.assert_array_equal(np.asarray(c.halted), t_carry.halted.numpy())
      for k, v in t_carry.current_data.items():
        np.testing.assert_array_equal(np.asarray(c.current_data[k]), v.numpy())
    assert j_out["logits"].shape == (B, L, V) and j_out["logits"].dtype == jnp.float32
  # The episode really exercised continuation, per-row reset and halting.
  assert t_carry.steps.tolist() == [2, 1, 2, 1] and t_carry.halted.tolist() == [True, False] * 2
  assert float(np.abs(t_out["q_halt_logits"].numpy()).max()) > 0.1      # Q head is informative
  assert max(errors.values()) < SAME_CARRY_TOL, errors
  assert max(free_errors.values()) < FREE_RUN_TOL, free_errors


def test_bfloat16_forward_stays_close(case):
  model, config = case["model"], case["config"]
  params, state, table = case["imported"]
  batch = make_batch(7)
  jb = to_jax_batch(batch)
  _, t_out = model.model(model.model.initial_carry(batch), batch)
  carry, out = rc.act_step(config, params, state, table, rc.initial_carry(config, jb), jb,
                           dtype="bfloat16")
  assert out["logits"].dtype == jnp.bfloat16 and carry.z_H.dtype == jnp.bfloat16
  assert out["q_halt_logits"].dtype == jnp.float32
  # The reference itself in bfloat16 (same weights) drifts from its float32 forward by about as much:
  # bfloat16 keeps ~3 significant digits and the recursion amplifies rounding (most for mlp_t).
  bf16_model = ref.TorchTRM(dataclasses.replace(case["rcfg"], forward_dtype="bfloat16"))
  bf16_model.load_state_dict(case["sd"])
  _, t16_out = bf16_model.model(bf16_model.model.initial_carry(batch), batch)
  want = t_out["logits"].numpy()
  err = norm_rel_err(out["logits"], want)
  ref_err = norm_rel_err(t16_out["logits"].float().numpy(), want)
  assert err < 1e-1 and err < 1.5 * ref_err, (err, ref_err)


def test_export_import_round_trip_bitwise(case):
  config, sd = case["config"], case["sd"]
  params, state, table = case["imported"]
  for compiled in (False, True):
    exported = rc.export_reference(params, state, table, config, compiled_prefix=compiled)
    prefix = "_orig_mod." if compiled else ""
    assert sorted(exported) == sorted(prefix + k for k in sd)
    for k, v in sd.items():                                       # export(import(sd)) == sd
      np.testing.assert_array_equal(exported[prefix + k].view(np.uint8),
                                    reference_format.tensor_to_numpy(v).view(np.uint8))
    p2, s2, t2 = rc.import_reference(exported, config)           # import(export(x)) == x
    for a, b in zip(jax.tree.leaves((params, state, table)), jax.tree.leaves((p2, s2, t2))):
      assert a.dtype == b.dtype and a.shape == b.shape
      np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    assert jax.tree.structure((params, state)) == jax.tree.structure((p2, s2))


def test_round_trip_of_podlab_init_and_save(tmp_path):
  config = trm.TRMConfig(seq_len=L, vocab_size=V, num_puzzle_identifiers=3, hidden_size=64,
                         num_heads=2, pos_encodings="learned", H_cycles=2, L_cycles=2)
  model = trm.TRMModel(config)
  params, state = model.init(jax.random.key(0))
  table = jax.random.normal(jax.random.key(1), (3, 64), jnp.float32)
  path = str(tmp_path / "x.pt")
  rc.save_state_dict(rc.export_reference(params, state, table, config, compiled_prefix=True), path)
  raw = torch.load(path, map_location="cpu", weights_only=True)
  assert all(k.startswith("_orig_mod.model.inner.") for k in raw)
  assert raw["_orig_mod.model.inner.H_init"].dtype == torch.bfloat16
  p2, s2, t2 = rc.load_reference_checkpoint(path, config)
  assert jax.tree.structure((params, state)) == jax.tree.structure((p2, s2))
  for a, b in zip(jax.tree.leaves((params, state, table)), jax.tree.leaves((p2, s2, t2))):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


# Section 8's table for Sudoku TRM-MLP (D=512, V=11, S=97, one puzzle identifier).
SUDOKU_MLP_KEYS = {
    "model.inner.H_init": ((512,), "bfloat16"),
    "model.inner.L_init": ((512,), "bfloat16"),
    "model.inner.embed_tokens.embedding_weight": ((11, 512), "float32"),
    "model.inner.lm_head.weight": ((11, 512), "float32"),
    "model.inner.q_head.weight": ((2, 512), "float32"),
    "model.inner.q_head.bias": ((2,), "float32"),
    "model.inner.puzzle_emb.weights": ((1, 512), "float32"),
    **{f"model.inner.L_level.layers.{i}.{k}": (s, "float32") for i in range(2) for k, s in [
        ("mlp_t.gate_up_proj.weight", (1024, 97)), ("mlp_t.down_proj.weight", (97, 512)),
        ("mlp.gate_up_proj.weight", (3072, 512)), ("mlp.down_proj.weight", (512, 1536))]},
}


def test_sudoku_mlp_export_has_section8_keys():
  config = trm.TRMConfig(seq_len=81, vocab_size=11, mlp_t=True, pos_encodings="none")
  assert rc.reference_key_shapes(config) == SUDOKU_MLP_KEYS
  shapes = jax.eval_shape(trm.TRMModel(config).init, jax.random.key(0))   # no init compute
  params, state = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  table = np.zeros((1, 512), np.float32)
  sd = rc.export_reference(params, state, table, config)
  assert {k: (v.shape, v.dtype.name) for k, v in sd.items()} == SUDOKU_MLP_KEYS
  assert rc.adam_param_count(sd) == 5_028_866                  # the published TRM-MLP count
  assert rc.infer_config(sd) == config                         # defaults + shapes = the recipe
  p2, s2, t2 = rc.import_reference(sd, config)
  assert p2["trm/~/L_level/~/layers_0/mlp_t/gate_up_proj"]["w"].shape == (97, 1024)
  att = dataclasses.replace(config, mlp_t=False, pos_encodings="rope")
  att_counts = {k: s for k, (s, _) in rc.reference_key_shapes(att).items()}
  assert rc.adam_param_count({k: np.empty(s, np.float32) for k, s in att_counts.items()}) == 6_828_034


def small_sd(**kw):
  """(numpy state_dict, podlab config, torch state_dict) of a random small reference."""
  rcfg = small_ref_config(**{"H_cycles": 2, **kw})
  tsd = ref.randomize_(ref.TorchTRM(rcfg), seed=3).state_dict()
  return {k: reference_format.tensor_to_numpy(v) for k, v in tsd.items()}, podlab_config(rcfg), tsd


def test_float32_run_checkpoint_imports_and_exports_the_same(tmp_path, capsys):
  """A forward_dtype="float32" reference run stores H_init/L_init in float32 (the reference creates
  them in its forward dtype): imported as they are (logged) or cast (logged), exported back the
  same, and the kept values give the reference's float32 ACT step."""
  rcfg = small_ref_config(mlp_t=False, pos_encodings="rope", H_cycles=2, init_dtype="float32")
  model = ref.randomize_(ref.TorchTRM(rcfg), seed=5).eval()
  tsd = model.state_dict()
  assert tsd["model.inner.H_init"].dtype == torch.float32
  path = str(tmp_path / "f32.pt")
  torch.save({"_orig_mod." + k: v for k, v in tsd.items()}, path)
  sd = rc.load_state_dict(path)
  assert sd["model.inner.L_init"].dtype == np.float32
  config = podlab_config(rcfg)
  assert rc.infer_config(sd, num_heads=2, H_cycles=2, L_cycles=2, halt_max_steps=2,
                         seq_len=L) == config                # forward_dtype float32, inferred
  lines = []
  params, state, table = rc.import_reference(sd, config, log=lines.append)
  assert lines == ["H_init/L_init are stored float32 (a forward_dtype='float32' reference run): "
                   "kept float32"]
  for k in ("H_init", "L_init"):
    assert state["trm"][k].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(state["trm"][k]), tsd[f"model.inner.{k}"].numpy())
  # Export gives back the same tensors, bitwise (float32 buffers included).
  back = rc.export_reference(params, state, table, config)
  assert sorted(back) == sorted(tsd)
  for k, v in tsd.items():
    assert back[k].dtype == v.numpy().dtype
    np.testing.assert_array_equal(back[k], v.numpy())
  # The kept buffers give the reference's step; a cast (logged) rounds them and drifts.
  lines.clear()
  _, s16, _ = rc.import_reference(sd, config, init_dtype="bfloat16", log=lines.append)
  assert lines == ["H_init/L_init: cast float32 -> bfloat16 (init_dtype='bfloat16')"]
  assert s16["trm"]["H_init"].dtype == jnp.bfloat16
  batch = make_batch(11)
  jb = to_jax_batch(batch)
  _, t_out = model.model(model.model.initial_carry(batch), batch)
  want = t_out["logits"].numpy()
  _, kept = rc.act_step(config, params, state, table, rc.initial_carry(config, jb), jb)
  _, cast = rc.act_step(config, params, s16, table, rc.initial_carry(config, jb), jb)
  kept_err, cast_err = rel_err(kept["logits"], want), rel_err(cast["logits"], want)
  assert kept_err < SAME_CARRY_TOL and cast_err > 10 * kept_err, (kept_err, cast_err)
  # Through the CLI: import keeps float32 (and says so), export writes the same file contents.
  out_dir = str(tmp_path / "podlab")
  assert rc.main(["import", path, "--out", out_dir, "--num_heads", "2", "--H_cycles", "2",
                  "--L_cycles", "2", "--halt_max_steps", "2", "--seq_len", str(L)]) == 0
  assert "kept float32" in capsys.readouterr().err
  pt = str(tmp_path / "back.pt")
  assert rc.main(["export", out_dir, "--out", pt]) == 0
  again = rc.load_state_dict(pt)
  for k, v in tsd.items():
    assert again[k].dtype == v.numpy().dtype
    np.testing.assert_array_equal(again[k], v.numpy())
  # A mixed pair is refused on export, as on import.
  mixed = {"trm": {"H_init": state["trm"]["H_init"], "L_init": s16["trm"]["L_init"]}}
  with pytest.raises(rc.ReferenceCheckpointError, match="mixed dtypes: state H_init/L_init"):
    rc.export_reference(params, mixed, table, config)


def test_mismatches_give_clear_errors():
  sd, config, _ = small_sd(mlp_t=True, pos_encodings="none")
  # Config without mlp_t: self_attn missing, mlp_t unexpected, and the fix named.
  with pytest.raises(rc.ReferenceCheckpointError) as e:
    rc.import_reference(sd, dataclasses.replace(config, mlp_t=False))
  msg = str(e.value)
  assert ("missing: model.inner.L_level.layers.0.self_attn.qkv_proj.weight "
          "(expected shape (192, 64) float32)") in msg
  assert "unexpected: model.inner.L_level.layers.1.mlp_t.down_proj.weight" in msg
  assert "mlp_t keys found: set mlp_t=True" in msg
  # Missing + unexpected + wrong shape + wrong dtype in one message.
  bad = dict(sd)
  del bad["model.inner.lm_head.weight"]
  bad["model.inner.extra.weight"] = np.zeros((3,), np.float32)
  bad["model.inner.puzzle_emb.weights"] = np.zeros((9, 64), np.float32)
  bad["model.inner.H_init"] = bad["model.inner.H_init"].astype(np.float32)   # L_init stays bf16
  with pytest.raises(rc.ReferenceCheckpointError) as e:
    rc.import_reference(bad, config)
  msg = str(e.value)
  assert "missing: model.inner.lm_head.weight (expected shape (11, 64) float32)" in msg
  assert "unexpected: model.inner.extra.weight" in msg
  assert ("wrong shape: model.inner.puzzle_emb.weights expected (5, 64), got (9, 64)" in msg)
  assert "set num_puzzle_identifiers=9 (config has 5)" in msg
  assert ("mixed dtypes: model.inner.H_init is float32, model.inner.L_init is bfloat16 (the "
          "reference creates both in its forward dtype)") in msg
  f16 = {**sd, **{k: sd[k].astype(np.float16) for k in ("model.inner.H_init", "model.inner.L_init")}}
  with pytest.raises(rc.ReferenceCheckpointError, match="wrong dtype: model.inner.H_init expected "
                     r"bfloat16 or float32, got float16 \(the reference stores"):
    rc.import_reference(f16, config)
  # Sequence length mismatch: the fix names seq_len.
  with pytest.raises(rc.ReferenceCheckpointError, match=r"set seq_len=81 \(config has 49\)"):
    rc.import_reference(sd, dataclasses.replace(config, seq_len=49))
  # Learned positions missing from a rope checkpoint.
  att_sd, att_config, _ = small_sd(pos_encodings="rope")
  with pytest.raises(rc.ReferenceCheckpointError, match="set pos_encodings='rope' or 'none'"):
    rc.import_reference(att_sd, dataclasses.replace(att_config, pos_encodings="learned"))
  with pytest.raises(rc.ReferenceCheckpointError, match="seq_len cannot be inferred"):
    rc.infer_config(att_sd, num_heads=2)
  with pytest.raises(rc.ReferenceCheckpointError, match=r"unknown TRMConfig field\(s\) \['heads'\]"):
    rc.infer_config(att_sd, heads=2)
  # Export checks the podlab trees the same way.
  params, state, table = rc.import_reference(sd, config)
  with pytest.raises(rc.ReferenceCheckpointError, match=r"missing: puzzle_table"):
    rc.export_reference(params, state, None, config)
  with pytest.raises(rc.ReferenceCheckpointError, match=r"unexpected: params\['trm/~/mlp'\]"):
    rc.export_reference({**params, "trm/~/mlp": {"w": np.zeros((2, 2), np.float32)}}, state,
                        table, config)
  with pytest.raises(ValueError, match="needs rng"):
    rc.act_step(config, params, state, table, None, {}, training=True)


def test_missing_torch_gives_install_hint(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` now raises ImportError
  with pytest.raises(ImportError, match=r"pip install 'podlab\[torch\]'"):
    rc.load_state_dict(tmp_path / "x.pt")
  with pytest.raises(ImportError, match=r"torch==2\.13\.0"):
    rc.save_state_dict({}, tmp_path / "x.pt")
  assert rc.main(["inspect", str(tmp_path / "x.pt")]) == 2


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
  """A missing .pt, a file that is not a state_dict and an existing --out are each one `error:` line
  naming the file and the fix, exit 2, no traceback: the second through the real CLI as a
  subprocess (nothing else on stderr: no native library's log lines), all three through `main`, the
  function the CLI exits with (one subprocess, not three: each starts TensorFlow, JAX and torch)."""
  not_sd = tmp_path / "list.pt"
  torch.save([1, 2], not_sd)
  sd_path = tmp_path / "ref.pt"
  torch.save(small_sd(mlp_t=True, pos_encodings="none")[2], sd_path)
  (tmp_path / "taken").mkdir()
  cases = ((["inspect", str(tmp_path / "nope.pt")], "nope.pt' does not exist. Fix: "),
           (["inspect", str(not_sd)], str(not_sd)),
           (["import", str(sd_path), "--out", str(tmp_path / "taken")],
            f"--out={tmp_path / 'taken'} exists. Fix: "))
  for args, expect in cases:
    assert rc.main(args) == 2, args
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines
  args, expect = cases[1]
  proc = subprocess.run([sys.executable, "-m", "experiments.trm.reference_checkpoint"] + args,
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (args, proc.returncode, proc.stderr[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines


def test_cli_inspect_import_export(tmp_path, capsys):
  sd, _, tsd = small_sd(mlp_t=True, pos_encodings="none")
  path = str(tmp_path / "ref.pt")
  torch.save({"_orig_mod." + k: v for k, v in tsd.items()}, path)
  assert rc.main(["inspect", path, "--num_heads", "2"]) == 0
  out = capsys.readouterr().out
  for text in ("model.inner.L_level.layers.1.mlp_t.gate_up_proj.weight", "hidden_size=64",
               "vocab_size=11", "mlp_t=True", "L_layers=2", "num_puzzle_identifiers=5",
               "seq_len=81", "Adam parameters: ", "matches that config: importable",
               "H_cycles=3"):
    assert text in out, text
  count = sum(v.size for k, v in sd.items()
              if k not in ("model.inner.H_init", "model.inner.L_init",
                           "model.inner.puzzle_emb.weights"))
  assert f"Adam parameters: {count:,}" in out
  out_dir = str(tmp_path / "podlab")
  assert rc.main(["import", path, "--out", out_dir, "--num_heads", "2", "--H_cycles", "2",
                  "--L_cycles", "2", "--halt_max_steps", "2"]) == 0
  assert rc.main(["import", path, "--out", out_dir]) == 2          # exists, no --force
  assert "--force" in capsys.readouterr().err
  pt = str(tmp_path / "back.pt")
  assert rc.main(["export", out_dir, "--out", pt, "--compiled_prefix"]) == 0
  assert "L_cycles=2" in capsys.readouterr().out                   # the stored config came back
  raw = torch.load(pt, map_location="cpu", weights_only=True)
  assert all(k.startswith("_orig_mod.") for k in raw)
  back = rc.load_state_dict(pt)
  assert sorted(back) == sorted(sd)
  for k, v in sd.items():
    assert back[k].dtype == v.dtype
    np.testing.assert_array_equal(back[k].view(np.uint8), v.view(np.uint8))
