"""Tests of modules/dream.py (the Dream / DiffuCoder network) against a float64 NumPy reference.

The reference (tests/dream_numpy_reference.py) reads Hugging Face-layout tensors directly; the model
gets the same tensors through the converter's key mapping, so a wrong mapping, a causal mask, missing
biases, a wrong GQA grouping, wrong RoPE or norm numerics all show up as a mismatch. Sizes are tiny
(D 64, 2 layers, L <= 12) to keep the file to a few seconds.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dream_numpy_reference as ref
from experiments.diffucoder import convert
from experiments.diffucoder import hf_layout
from experiments.diffucoder import random_checkpoint
from modules import dream

F32 = dict(dtype="float32", param_dtype="float32")


def hf_tensors(cfg, seed=0, dtype=np.float32):
  """Random HF-layout tensors {name: array} for `cfg` (the converter's deterministic generator)."""
  return {name: random_checkpoint.random_tensor(name, shape, i, seed, dtype)
          for i, (name, shape) in enumerate(hf_layout.hf_tensor_specs(cfg))}


@functools.lru_cache(maxsize=None)
def model_and_tensors(cfg, seed=0):
  dtype = np.dtype(cfg.param_dtype)
  tensors = hf_tensors(cfg, seed, dtype)
  params = convert.params_from_tensors(tensors.__getitem__, cfg)
  return dream.dream_forward(cfg), params, tensors


@functools.lru_cache(maxsize=None)
def jitted_apply(cfg, return_kv):
  """One jit per (config, return_kv): compiling per shape is ~5x cheaper than eager op-by-op here."""
  model, _, _ = model_and_tensors(cfg)
  return jax.jit(functools.partial(model.apply, return_kv=return_kv))


def run(cfg, tokens, valid, positions=None, context=None, return_kv=False):
  _, params, _ = model_and_tensors(cfg)
  return jitted_apply(cfg, return_kv)(
      params, jnp.asarray(tokens), jnp.asarray(valid),
      None if positions is None else jnp.asarray(positions), context)


def np_ref(cfg, tokens, valid, positions=None, **kw):
  _, _, tensors = model_and_tensors(cfg)
  return ref.forward(tensors.__getitem__, cfg, np.asarray(tokens), np.asarray(valid), positions,
                     **kw)


def batch(seed=1, B=3, L=10, V=272, pads=(0, 3, 5)):
  """Left-padded token batch: row b has pads[b] leading pads (token 0, valid False)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, size=(B, L)).astype(np.int32)
  valid = np.ones((B, L), bool)
  for b, p in enumerate(pads[:B]):
    valid[b, :p] = False
    tokens[b, :p] = 0
  return tokens, valid


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# --------------------------------------------------------------------------------------------------
# Config.
# --------------------------------------------------------------------------------------------------


def test_7b_parameter_count_and_layout():
  assert dream.count_params(dream.DREAM_7B) == 7_615_616_512
  assert dream.DIFFUCODER_7B == dream.DREAM_7B
  cfg = dream.DREAM_7B
  assert (cfg.head_dim, cfg.group_size) == (128, 7)
  layout = dream.param_layout(cfg)
  assert layout["dream/layer_27/self_attn/qkv_proj"] == {"w": (3584, 4608), "b": (4608,)}
  assert layout["dream/layer_0/mlp/gate_up_proj"] == {"w": (3584, 2 * 18944)}
  assert layout["dream/lm_head"] == {"w": (3584, 152064)}
  # The same count from the checkpoint's 339 tensors.
  specs = hf_layout.hf_tensor_specs(cfg)
  assert len(specs) == 339
  assert sum(int(np.prod(s)) for _, s in specs) == 7_615_616_512
  shapes = dream.param_shapes(cfg)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("fields, message", [
    (dict(num_heads=5), "DreamConfig.num_heads=5"),
    (dict(num_kv_heads=3), "DreamConfig.num_kv_heads=3"),
    (dict(dtype="int8"), "DreamConfig.dtype='int8'"),
    (dict(hidden_size=0), "DreamConfig.hidden_size=0"),
])
def test_config_errors_name_the_field(fields, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    dream.tiny_config(**fields)


def test_from_dict_rejects_unknown_fields():
  with pytest.raises(ValueError, match="hidden_sise"):
    dream.DreamConfig.from_dict(dict(dream.tiny_config().to_dict(), hidden_sise=3))
  assert dream.DreamConfig.from_dict(dream.tiny_config().to_dict()) == dream.tiny_config()


# --------------------------------------------------------------------------------------------------
# Numerics vs float64.
# --------------------------------------------------------------------------------------------------


def test_float32_forward_matches_float64_reference():
  cfg = dream.tiny_config(**F32)
  tokens, valid = batch()
  logits = run(cfg, tokens, valid)
  assert logits.shape == (3, 10, 272) and logits.dtype == jnp.float32
  want = np_ref(cfg, tokens, valid)["logits"]
  assert rel_err(np.where(valid[..., None], logits, 0), np.where(valid[..., None], want, 0)) < 2e-5
  # Even fully masked pad rows follow the documented uniform-attention contract.
  assert rel_err(logits, want) < 2e-5


def test_bfloat16_default_forward_close_to_float64_reference():
  cfg = dream.tiny_config()
  assert cfg.dtype == jnp.bfloat16 and cfg.param_dtype == jnp.bfloat16
  model, params, _ = model_and_tensors(cfg)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  tokens, valid = batch()
  logits = run(cfg, tokens, valid)
  assert logits.dtype == jnp.bfloat16
  want = np_ref(cfg, tokens, valid)["logits"]           # float64 from the same bf16 weights
  err = rel_err(np.asarray(logits, np.float32)[valid], want[valid])
  assert err < 0.03, err
  # The argmax token agrees almost everywhere (ties within bf16 rounding aside).
  agree = np.mean(np.argmax(np.asarray(logits, np.float32), -1)[valid] == np.argmax(want, -1)[valid])
  assert agree >= 0.9, agree


def test_gqa_grouping_is_h_div_g():
  cfg = dream.tiny_config(**F32, num_heads=4, num_kv_heads=2)
  tokens, valid = batch(pads=(0, 0, 0))
  logits = np.asarray(run(cfg, tokens, valid))
  right = np_ref(cfg, tokens, valid)["logits"]
  wrong = np_ref(cfg, tokens, valid, kv_group="h%K")["logits"]
  assert rel_err(logits, right) < 2e-5
  assert rel_err(wrong, right) > 1e-2      # the test can tell the two groupings apart


def test_attention_is_bidirectional():
  cfg = dream.tiny_config(**F32)
  tokens, valid = batch(pads=(0, 0, 0))
  changed = tokens.copy()
  changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab_size
  a, b = np.asarray(run(cfg, tokens, valid)), np.asarray(run(cfg, changed, valid))
  assert np.all(np.max(np.abs(a[:, 0] - b[:, 0]), -1) > 1e-3)   # the FIRST position sees the LAST


def test_left_padding_invariance():
  for dtype, rows in (("float32", (1, 2)), ("bfloat16", (2,))):
    cfg = dream.tiny_config(dtype=dtype, param_dtype=dtype)
    pads = (0, 3, 5)
    tokens, valid = batch(pads=pads)
    padded = np.asarray(run(cfg, tokens, valid), np.float32)
    for b in rows:
      p = pads[b]
      alone = np.asarray(run(cfg, tokens[b:b + 1, p:], valid[b:b + 1, p:]), np.float32)[0]
      tol = 1e-5 if dtype == "float32" else 2e-2
      assert rel_err(padded[b, p:], alone) < tol, (dtype, b)


def test_fully_padded_row_is_finite_and_harmless():
  cfg = dream.tiny_config()
  tokens, valid = batch(pads=(0, 10, 4))               # row 1 is all padding
  logits = np.asarray(run(cfg, tokens, valid), np.float32)
  assert np.all(np.isfinite(logits))
  for b in (0, 2):
    alone = np.asarray(run(cfg, tokens[b:b + 1], valid[b:b + 1]), np.float32)
    np.testing.assert_array_equal(logits[b][valid[b]], alone[0][valid[b]])


def test_explicit_positions_equal_default():
  cfg = dream.tiny_config(**F32)
  tokens, valid = batch()
  pos = ref.positions_from_valid(valid).astype(np.int32)
  np.testing.assert_allclose(run(cfg, tokens, valid, pos), run(cfg, tokens, valid), rtol=0, atol=0)
  # RoPE is relative: shifting every position by 7 leaves the logits unchanged (up to float32)...
  shifted = np.asarray(run(cfg, tokens, valid, pos + 7))
  assert rel_err(shifted, run(cfg, tokens, valid)) < 1e-5
  # ...stretching them does not, and matches the float64 reference.
  stretched = np.asarray(run(cfg, tokens, valid, 3 * pos))
  assert rel_err(stretched, np_ref(cfg, tokens, valid, 3 * pos)["logits"]) < 2e-5
  assert rel_err(stretched, run(cfg, tokens, valid)) > 1e-3


def test_matches_an_independent_pytorch_forward():
  """torch float32 (HF-style code) vs float64 checks the reference pair; bfloat16 podlab vs bfloat16
  torch differ by no more than each differs from float64 (rounding noise, not a semantic gap)."""
  torch = pytest.importorskip("torch")
  import torch_dream_reference as tref  # pylint: disable=g-import-not-at-top
  cfg = dream.tiny_config()
  _, _, tensors = model_and_tensors(cfg)
  tokens, valid = batch()
  want = np_ref(cfg, tokens, valid)["logits"]
  th32 = tref.forward(tensors, cfg, tokens, valid, torch.float32)
  assert rel_err(th32[valid], want[valid]) < 1e-5
  th16 = tref.forward(tensors, cfg, tokens, valid, torch.bfloat16)
  ours = np.asarray(run(cfg, tokens, valid), np.float32)
  torch_err = rel_err(th16[valid], want[valid])
  ours_err = rel_err(ours[valid], want[valid])
  assert ours_err < 1.5 * torch_err, (ours_err, torch_err)
  assert rel_err(ours[valid], th16[valid]) < 2.0 * torch_err
  assert np.mean(ours.argmax(-1)[valid] == th16.argmax(-1)[valid]) >= 0.95


# --------------------------------------------------------------------------------------------------
# KV context (block-wise cache contract).
# --------------------------------------------------------------------------------------------------


def test_return_kv_matches_reference_keys_with_rope():
  cfg = dream.tiny_config(**F32)
  tokens, valid = batch()
  logits, kv = run(cfg, tokens, valid, return_kv=True)
  want = np_ref(cfg, tokens, valid)
  assert len(kv) == cfg.num_layers
  for n, (k, v) in enumerate(kv):
    assert k.shape == v.shape == (3, 10, cfg.num_kv_heads, cfg.head_dim)
    assert rel_err(k, want["k"][n]) < 2e-5 and rel_err(v, want["v"][n]) < 2e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefix_context_equals_joint_run(dtype):
  cfg = dream.tiny_config(dtype=dtype, param_dtype=dtype)
  tokens, valid = batch(L=12, pads=(0, 2, 5))
  C = 7                                                   # [prefix (7, left-padded); block (5)]
  joint, kv = run(cfg, tokens, valid, return_kv=True)
  context = ([(k[:, :C], v[:, :C]) for k, v in kv], jnp.asarray(valid[:, :C]))
  block = run(cfg, tokens[:, C:], valid[:, C:], context=context)   # positions continue after C
  j, b = np.asarray(joint[:, C:], np.float32), np.asarray(block, np.float32)
  if dtype == "float32":
    assert rel_err(b, j) < 1e-5
  else:
    assert rel_err(b, j) < 2e-2
  # And vs float64 with the float64 reference's own context.
  if dtype == "float32":
    full = np_ref(cfg, tokens, valid)
    ctx = ([k[:, :C] for k in full["k"]], [v[:, :C] for v in full["v"]], valid[:, :C])
    part = np_ref(cfg, tokens[:, C:], valid[:, C:], context=ctx)
    assert rel_err(part["logits"], full["logits"][:, C:]) < 1e-12
    assert rel_err(b, part["logits"]) < 2e-5


def test_dual_context_with_explicit_positions_equals_joint_run():
  """Dual cache: the block in the middle, prefix and suffix keys cached, explicit positions."""
  cfg = dream.tiny_config(**F32)
  tokens, valid = batch(L=12, pads=(0, 2, 5))
  pos = ref.positions_from_valid(valid).astype(np.int32)
  joint, kv = run(cfg, tokens, valid, return_kv=True)
  lo, hi = 6, 9
  ctx_idx = np.r_[0:lo, hi:12]
  context = ([(k[:, ctx_idx], v[:, ctx_idx]) for k, v in kv], jnp.asarray(valid[:, ctx_idx]))
  block = run(cfg, tokens[:, lo:hi], valid[:, lo:hi], pos[:, lo:hi], context=context)
  assert rel_err(block, joint[:, lo:hi]) < 1e-5


def test_context_errors():
  cfg = dream.tiny_config(**F32)
  tokens, valid = batch()
  _, kv = run(cfg, tokens, valid, return_kv=True)
  with pytest.raises(ValueError, match="num_layers=2"):
    run(cfg, tokens, valid, context=(kv[:1], jnp.asarray(valid)))
  with pytest.raises(ValueError, match=r"context k/v shapes"):
    run(cfg, tokens, valid, context=(kv, jnp.asarray(valid[:, :4])))


def test_init_layout_and_dtypes():
  cfg = dream.tiny_config()
  model = dream.dream_forward(cfg)
  tokens, valid = batch()
  params = jax.jit(model.init)(jax.random.key(0), jnp.asarray(tokens), jnp.asarray(valid))
  assert {m: {n: tuple(a.shape) for n, a in p.items()} for m, p in params.items()} == \
      dream.param_layout(cfg)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  logits, kv = run(cfg, tokens, valid, return_kv=True)
  assert logits.dtype == kv[0][0].dtype == kv[0][1].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(logits, np.float32),
                                np.asarray(run(cfg, tokens, valid), np.float32))


def test_module_synopsis_runs():
  from test_docstrings import synopsis  # pylint: disable=g-import-not-at-top
  exec(compile(synopsis("modules.dream"), "<modules.dream synopsis>", "exec"), {})


# --------------------------------------------------------------------------------------------------
# Configs.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, steps, temperature, chat", [
    ("diffucoder_7b_base", 256, 0.2, False), ("diffucoder_7b_instruct", 256, 0.4, True),
    ("dream_7b_base", 512, 0.2, False)])
def test_7b_configs(name, steps, temperature, chat):
  import importlib  # pylint: disable=g-import-not-at-top
  from experiments.diffucoder.configs import common  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(f"experiments.diffucoder.configs.{name}").get_config()
  assert common.dream_config(c) == dream.DREAM_7B
  assert c.tokens.to_dict() == dict(mask_id=151666, pad_id=151643, eos_id=151643, bos_id=151643,
                                    dlm_pad_id=151667, im_start_id=151644, im_end_id=151645)
  g = c.generate
  assert (g.max_new_tokens, g.steps, g.temperature, g.top_p, g.top_k, g.alg, g.alg_temp) == \
      (steps, steps, temperature, 0.95, 0, "entropy", 0.0)
  assert c.chat_template is chat


def test_tiny_config():
  from experiments.diffucoder.configs import common, tiny  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  cfg = common.dream_config(c)
  assert cfg == dream.tiny_config()
  ids = c.tokens.to_dict()
  assert all(0 <= i < cfg.vocab_size for i in ids.values())
  assert ids["pad_id"] == ids["eos_id"] and len({ids["mask_id"], ids["pad_id"], ids["dlm_pad_id"],
                                                 ids["im_start_id"], ids["im_end_id"]}) == 5
  assert common.dream_config(tiny.get_config("dtype=float32")).dtype == jnp.float32
  c.model.hidden_sise = 3
  with pytest.raises(ValueError, match="hidden_sise"):
    common.dream_config(c)
