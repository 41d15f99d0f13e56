"""GPT-2 weight import/export (experiments/nanogpt/hf_gpt2.py) against folders written here.

The folders are written by the tests themselves with podlab's safetensors writer in OpenAI's layout:
the real tensor names (h.i.attn.c_attn.weight, ...), Conv1D weights [in, out], the causal-mask
buffers h.i.attn.bias, GPT-2's config.json; a second folder in the layout of models saved from
GPT2LMHeadModel (`transformer.` prefix, lm_head.weight, masked_bias, sharded). Every tensor is
random (biases and LayerNorm parameters included). The reference is an independent PyTorch GPT-2
forward on the stored tensors (tests/torch_gpt2_reference.py), in float64.
"""
import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from experiments.common import safetensors_io as st
from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import sampling
from experiments.nanogpt import torch_rng
from modules import gpt
from tests import test_docstrings

L, H, C, P, V = 3, 4, 32, 24, 97          # layers, heads, width, positions, vocab


def gpt2_tensors(seed=0, n_layer=L, n_embd=C, n_positions=P, vocab=V):
  """OpenAI's tensor list for a GPT-2 of these sizes (names, shapes, [in, out] Conv1D), random."""
  rng = np.random.default_rng(seed)
  r = lambda *shape, s=0.05, m=0.0: (m + s * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
  t = {"wte.weight": r(vocab, n_embd, s=0.1), "wpe.weight": r(n_positions, n_embd, s=0.1)}
  mask = np.tril(np.ones((n_positions, n_positions), np.float32))[None, None]
  for i in range(n_layer):
    h = f"h.{i}"
    t[f"{h}.ln_1.weight"], t[f"{h}.ln_1.bias"] = r(n_embd, s=0.2, m=1.0), r(n_embd)
    t[f"{h}.attn.bias"] = mask
    t[f"{h}.attn.c_attn.weight"], t[f"{h}.attn.c_attn.bias"] = r(n_embd, 3 * n_embd, s=0.2), r(3 * n_embd)
    t[f"{h}.attn.c_proj.weight"], t[f"{h}.attn.c_proj.bias"] = r(n_embd, n_embd, s=0.1), r(n_embd)
    t[f"{h}.ln_2.weight"], t[f"{h}.ln_2.bias"] = r(n_embd, s=0.2, m=1.0), r(n_embd)
    t[f"{h}.mlp.c_fc.weight"], t[f"{h}.mlp.c_fc.bias"] = r(n_embd, 4 * n_embd, s=0.2), r(4 * n_embd)
    t[f"{h}.mlp.c_proj.weight"], t[f"{h}.mlp.c_proj.bias"] = r(4 * n_embd, n_embd, s=0.1), r(n_embd)
  t["ln_f.weight"], t["ln_f.bias"] = r(n_embd, s=0.2, m=1.0), r(n_embd)
  return t


def gpt2_config_json(n_layer=L, n_head=H, n_embd=C, n_positions=P, vocab=V, **extra):
  cfg = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
         "attn_pdrop": 0.1, "bos_token_id": vocab - 1, "embd_pdrop": 0.1, "eos_token_id": vocab - 1,
         "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
         "n_ctx": n_positions, "n_embd": n_embd, "n_head": n_head, "n_layer": n_layer,
         "n_positions": n_positions, "resid_pdrop": 0.1, "vocab_size": vocab}
  cfg.update(extra)
  return cfg


def write_folder(path, tensors, config=None, sharded=False):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config or gpt2_config_json(), f)
  if sharded:
    specs = [(n, a.shape, a.dtype) for n, a in tensors.items()]
    st.write_sharded(path, specs, tensors.__getitem__, max_shard_bytes=60_000)
  else:
    st.write_safetensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
  return str(path)


@pytest.fixture(scope="module")
def openai_folder(tmp_path_factory):
  tensors = gpt2_tensors()
  return write_folder(tmp_path_factory.mktemp("gpt2_openai"), tensors), tensors


def test_config_and_params_follow_config_json(openai_folder):
  path, tensors = openai_folder
  config, params = hf_gpt2.load_pretrained(path, dropout=0.1)
  assert config == gpt.GPTConfig(block_size=P, vocab_size=V, n_layer=L, n_head=H, n_embd=C,
                                 dropout=0.1, bias=True, gelu="tanh")      # config.json: gelu_new
  assert hf_gpt2.load_pretrained(path, gelu="exact")[0].gelu == "exact"   # nanoGPT's choice
  for named, want in (("gelu", "exact"), ("gelu_new", "tanh"), ("gelu_pytorch_tanh", "tanh")):
    hf = gpt2_config_json(activation_function=named)
    assert hf_gpt2.config_from_hf(hf).gelu == want
    assert hf_gpt2.config_from_hf(hf, gelu="exact").gelu == "exact"
    assert hf_gpt2.hf_config(hf_gpt2.config_from_hf(hf))["activation_function"] == (
        "gelu" if want == "exact" else "gelu_new")
  assert hf_gpt2.describe_gelu(gpt2_config_json(), config) == "GELU tanh (config.json: gelu_new)"
  assert hf_gpt2.describe_gelu(gpt2_config_json(), dataclasses.replace(config, gelu="exact")) == (
      "GELU exact (nanoGPT's; config.json: gelu_new)")
  shapes = jax.eval_shape(gpt.GPTModel(config).init, jax.random.key(0))
  assert jax.tree.structure(shapes) == jax.tree.structure(params)
  for s, p in zip(jax.tree.leaves(shapes), jax.tree.leaves(params)):
    assert s.shape == p.shape and p.dtype == np.float32
  # Conv1D [in, out] is podlab's [in, out]: copied as stored, not transposed.
  np.testing.assert_array_equal(params["gpt/h_1/attn/qkv_proj"]["w"], tensors["h.1.attn.c_attn.weight"])
  np.testing.assert_array_equal(params["gpt/h_2/mlp/c_proj"]["b"], tensors["h.2.mlp.c_proj.bias"])
  np.testing.assert_array_equal(params["gpt/ln_f"]["weight"], tensors["ln_f.weight"])
  assert gpt.num_params(params) == gpt.analytic_param_count(config)


def test_logits_match_an_independent_torch_gpt2(openai_folder):
  torch_ref = pytest.importorskip("tests.torch_gpt2_reference",
                                  reason="the PyTorch reference needs torch (pip install '.[torch]')")
  path, tensors = openai_folder
  idx = np.random.default_rng(1).integers(0, V, (2, P))
  import torch  # pylint: disable=g-import-not-at-top
  # The folder's config.json says gelu_new: the tanh GELU by default; gelu="exact" is nanoGPT's.
  refs = {g: torch_ref.forward(tensors, H, idx, gelu=g) for g in ("tanh", "exact")}   # float64
  gap = np.max(np.abs(refs["tanh"] - refs["exact"])) / np.max(np.abs(refs["exact"]))
  assert gap > 1e-4, gap                                      # the tolerance below tells them apart
  for gelu, want in (("auto", "tanh"), ("exact", "exact")):
    config, params = hf_gpt2.load_pretrained(path, gelu=gelu)
    ours = np.asarray(gpt.GPTModel(config).apply(params, idx))               # [2, P, V] float32
    ref = refs[want]
    assert ours.dtype == np.float32
    rel = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
    assert rel < 1e-5, (gelu, rel)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.max(np.abs(ref)))
    # The float32 torch forward on the same tensors agrees too (same precision as ours).
    ref32 = torch_ref.forward(tensors, H, idx, dtype=torch.float32, gelu=want)
    np.testing.assert_allclose(ours, ref32, rtol=1e-5, atol=1e-5 * np.max(np.abs(ref)))


def test_transformer_prefix_lm_head_and_shards_import_identically(openai_folder, tmp_path):
  path, tensors = openai_folder
  hf = {f"transformer.{k}": v for k, v in tensors.items()}
  for i in range(L):
    hf[f"transformer.h.{i}.attn.masked_bias"] = np.asarray(-1e4, np.float32)
  hf["lm_head.weight"] = tensors["wte.weight"]
  other = write_folder(tmp_path / "hf", hf, sharded=True)
  assert len(st.ShardedCheckpoint(other).files) > 1
  config_a, a = hf_gpt2.load_pretrained(path)
  config_b, b = hf_gpt2.load_pretrained(other)
  assert config_a == config_b
  idx = np.arange(P)[None] % V
  logits_a = np.asarray(gpt.GPTModel(config_a).apply(a, idx))
  logits_b = np.asarray(gpt.GPTModel(config_b).apply(b, idx))
  assert np.array_equal(logits_a, logits_b)                  # identical float32 logits


def test_half_precision_tensors_read_as_float32(openai_folder, tmp_path):
  path, tensors = openai_folder
  half = {k: v.astype(np.float16) for k, v in tensors.items()}
  _, params = hf_gpt2.load_pretrained(write_folder(tmp_path / "f16", half))
  assert params["gpt/wte"]["embedding"].dtype == np.float32
  np.testing.assert_array_equal(params["gpt/wte"]["embedding"],
                                half["wte.weight"].astype(np.float32))


def test_greedy_sampling_equals_the_torch_greedy_tokens(openai_folder):
  torch_ref = pytest.importorskip("tests.torch_gpt2_reference",
                                  reason="the PyTorch reference needs torch (pip install '.[torch]')")
  path, tensors = openai_folder
  config, params = hf_gpt2.load_pretrained(path)
  model = gpt.GPTModel(config)
  prompt = np.array([[5, 17, 3, 60], [1, 2, 90, 44]], np.int32)
  theirs = torch_ref.greedy(tensors, H, prompt, P - 4, P, gelu="tanh")    # up to the full block
  for kv_cache in (True, False):
    ours = sampling.generate(model, params, prompt, P - 4, temperature=0.0, kv_cache=kv_cache)
    np.testing.assert_array_equal(ours, theirs, err_msg=f"kv_cache={kv_cache}")
  assert len(set(theirs[0, 4:].tolist())) > 2                             # not a constant run


def test_export_round_trips_bitwise(openai_folder, tmp_path):
  path, tensors = openai_folder
  config, params = hf_gpt2.load_pretrained(path)
  written = hf_gpt2.save_pretrained(tmp_path / "out", config, params, masks=True)
  assert written == ["model.safetensors"]
  out = st.SafetensorsFile(str(tmp_path / "out" / "model.safetensors"))
  assert list(out.infos) == list(tensors)                                 # names and order
  for name, array in tensors.items():
    got = out.get(name)
    assert got.dtype == array.dtype and got.shape == array.shape, name
    assert got.tobytes() == array.tobytes(), name                        # bit for bit
  assert out.metadata == {"format": "pt"}
  with open(tmp_path / "out" / "config.json") as f:
    exported = json.load(f)
  original = gpt2_config_json()
  assert {k: exported[k] for k in original} == original
  # Without masks (default) and sharded: the same parameters again.
  hf_gpt2.save_pretrained(tmp_path / "out2", config, params, max_shard_bytes=50_000)
  ckpt = st.ShardedCheckpoint(str(tmp_path / "out2"))
  assert len(ckpt.files) > 1 and not any(n.split(".")[-2:] == ["attn", "bias"] for n in ckpt.infos)
  _, again = hf_gpt2.load_pretrained(str(tmp_path / "out2"))
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    assert a.tobytes() == b.tobytes()


def _edit(openai_folder, tmp_path, change, config=None):
  _, tensors = openai_folder
  tensors = dict(tensors)
  change(tensors)
  return write_folder(tmp_path / "edited", tensors, config)


def test_missing_tensor_names_it_and_the_fix(openai_folder, tmp_path):
  path = _edit(openai_folder, tmp_path, lambda t: t.pop("h.1.mlp.c_fc.bias"))
  with pytest.raises(hf_gpt2.GPT2FormatError, match=r"no tensor 'h\.1\.mlp\.c_fc\.bias'.*Fix:"):
    hf_gpt2.load_pretrained(path)


def test_misshaped_tensors_name_the_shape_and_the_fix(openai_folder, tmp_path):
  def linear_layout(t):                                  # stored [out, in] like a torch Linear
    t["h.0.attn.c_attn.weight"] = np.ascontiguousarray(t["h.0.attn.c_attn.weight"].T)
  path = _edit(openai_folder, tmp_path, linear_layout)
  with pytest.raises(hf_gpt2.GPT2FormatError,
                     match=r"'h\.0\.attn\.c_attn\.weight' has shape \(96, 32\).*needs \(32, 96\)"
                           r".*\[out, in\].*transpose"):
    hf_gpt2.load_pretrained(path)
  path = _edit(openai_folder, tmp_path / "b", lambda t: t.update({"wpe.weight": t["wpe.weight"][:20]}))
  with pytest.raises(hf_gpt2.GPT2FormatError,
                     match=r"'wpe\.weight' has shape \(20, 32\).*n_positions=24.*needs \(24, 32\).*"
                           r"Fix: use the config.json"):
    hf_gpt2.load_pretrained(path)


def test_other_bad_folders_raise_one_clear_error(openai_folder, tmp_path):
  extra = _edit(openai_folder, tmp_path / "extra",
                lambda t: t.update({"h.3.ln_1.weight": t["h.0.ln_1.weight"]}))
  with pytest.raises(hf_gpt2.GPT2FormatError, match=r"unexpected tensor 'h\.3\.ln_1\.weight'.*n_layer"):
    hf_gpt2.load_pretrained(extra)
  untied = _edit(openai_folder, tmp_path / "untied",
                 lambda t: t.update({"lm_head.weight": t["wte.weight"] + 1}))
  with pytest.raises(hf_gpt2.GPT2FormatError, match="lm_head.weight differs"):
    hf_gpt2.load_pretrained(untied)
  wide = _edit(openai_folder, tmp_path / "inner", lambda t: None, gpt2_config_json(n_inner=64))
  with pytest.raises(hf_gpt2.GPT2FormatError, match=r"n_inner=64.*Fix: use null"):
    hf_gpt2.load_pretrained(wide)
  relu = _edit(openai_folder, tmp_path / "relu", lambda t: None,
               gpt2_config_json(activation_function="relu"))
  with pytest.raises(hf_gpt2.GPT2FormatError, match="activation_function='relu'"):
    hf_gpt2.load_pretrained(relu)
  with pytest.raises(hf_gpt2.GPT2FormatError, match="no config.json"):
    hf_gpt2.load_pretrained(str(tmp_path))
  os.remove(os.path.join(extra, "model.safetensors"))
  with pytest.raises(st.SafetensorsError, match="neither"):
    hf_gpt2.load_pretrained(extra)
  with pytest.raises(hf_gpt2.GPT2FormatError, match="bias=False"):
    cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, bias=False)
    hf_gpt2.save_pretrained(tmp_path / "nobias", cfg, gpt.GPTModel(cfg).init(jax.random.key(0)))


def test_crop_block_size_keeps_the_first_positions(openai_folder):
  path, tensors = openai_folder
  config, params = hf_gpt2.load_pretrained(path)
  cropped, small = hf_gpt2.crop_block_size(config, params, 10)
  assert cropped.block_size == 10 and small["gpt/wpe"]["embedding"].shape == (10, C)
  idx = np.arange(10)[None] % V
  np.testing.assert_allclose(np.asarray(gpt.GPTModel(cropped).apply(small, idx)),
                             np.asarray(gpt.GPTModel(config).apply(params, idx)), rtol=1e-6,
                             atol=1e-6)
  with pytest.raises(hf_gpt2.GPT2FormatError, match="can only crop"):
    hf_gpt2.crop_block_size(config, params, P + 1)


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_init_draws_count_the_replayed_init(bias):
  for n_layer, n_embd, block, vocab in ((1, 16, 8, 11), (2, 32, 64, 257), (3, 48, 100, 301)):
    cfg = gpt.GPTConfig(block_size=block, vocab_size=vocab, n_layer=n_layer, n_head=2,
                        n_embd=n_embd, bias=bias)
    assert hf_gpt2.nanogpt_init_draws(cfg) == torch_rng.init_params(cfg, 7)[1]


def test_sizes_are_nanogpts_table():
  assert {k: (v["n_layer"], v["n_head"], v["n_embd"]) for k, v in hf_gpt2.SIZES.items()
          if k != "tiny"} == {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024),
                              "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600)}
  # GPT-2 124M as nanoGPT prints it: 124,439,808 parameters, 123.65M without wpe.
  cfg = gpt.GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)
  assert gpt.analytic_param_count(cfg) == 123_653_376


def test_make_random_cli_writes_an_importable_folder(tmp_path, capsys):
  d = str(tmp_path / "tiny")
  assert hf_gpt2.main(["--make_random", d, "--size", "tiny", "--seed", "3", "--info", d]) == 0
  out = capsys.readouterr().out
  assert "'n_layer': 2" in out and "<|endoftext|> = 256" in out and "number of parameters" in out
  config, params = hf_gpt2.load_pretrained(d)
  assert (config.n_layer, config.n_head, config.n_embd, config.block_size, config.vocab_size) == (
      2, 4, 64, 128, 257)
  with open(os.path.join(d, "config.json")) as f:
    assert json.load(f) == hf_gpt2.hf_config(config)
  biases = params["gpt/h_0/attn/qkv_proj"]["b"]
  assert 0.01 < np.std(biases) < 0.03                              # non-trivial biases
  # Large folders are written one tensor at a time into shards; the same seed, the same tensors.
  hf_gpt2.make_random(str(tmp_path / "sharded"), "tiny", seed=3, max_shard_bytes=100_000)
  assert len(st.ShardedCheckpoint(str(tmp_path / "sharded")).files) > 1
  _, again = hf_gpt2.load_pretrained(str(tmp_path / "sharded"))
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    assert np.array_equal(a, b)
  assert hf_gpt2.main(["--info", str(tmp_path / "missing")]) == 2
  assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("module_name", ["experiments.nanogpt.hf_gpt2", "input_pipeline.gpt2_bpe"])
def test_synopsis_runs(module_name):
  code = test_docstrings.synopsis(module_name)
  exec(compile(code, f"<{module_name} synopsis>", "exec"), {})
