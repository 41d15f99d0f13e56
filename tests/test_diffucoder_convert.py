"""Tests of the safetensors reader/writer and the Dream checkpoint conversion (no torch, no pickle).

Random tiny models are written in the real Hugging Face key layout (torch [out, in] weights, separate
q/k/v with biases, untied lm_head) over several shards + an index json; the converted parameters must
reproduce a float64 NumPy forward computed directly from the safetensors tensors, and every kind of
broken checkpoint must fail with a message that names the file / tensor and the fix.
"""
import json
import os
import struct
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dream_numpy_reference as ref
from experiments.diffucoder import convert
from experiments.diffucoder import hf_layout
from experiments.diffucoder import orbax_params
from experiments.diffucoder import random_checkpoint
from experiments.common import safetensors_io as st
from modules import dream

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F32 = dict(dtype="float32", param_dtype="float32")


def rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# --------------------------------------------------------------------------------------------------
# safetensors format.
# --------------------------------------------------------------------------------------------------


def test_reads_hand_written_bytes_per_the_spec(tmp_path):
  """An independent encoding of the format: 8-byte LE length, JSON, raw little-endian bytes."""
  header = json.dumps({
      "__metadata__": {"format": "pt"},
      "w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
      "i": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]}}).encode()
  # bf16 1.0 = 0x3F80, -2.0 = 0xC000, 0.5 = 0x3F00, 3.0 = 0x4040 (little-endian byte order).
  data = (struct.pack("<4H", 0x3F80, 0xC000, 0x3F00, 0x4040) + struct.pack("<2f", 1.5, -0.25) +
          struct.pack("<q", -7))
  path = tmp_path / "x.safetensors"
  path.write_bytes(struct.pack("<Q", len(header)) + header + data)
  f = st.SafetensorsFile(str(path))
  assert f.metadata == {"format": "pt"}
  w = f.get("w")
  assert w.dtype == ml_dtypes.bfloat16 and w.shape == (2, 2)
  np.testing.assert_array_equal(w.astype(np.float32), [[1.0, -2.0], [0.5, 3.0]])
  np.testing.assert_array_equal(f.get("b"), np.array([1.5, -0.25], np.float32))
  assert f.get("i").shape == () and int(f.get("i")) == -7


def test_write_read_round_trip_is_bitwise(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {
      "bf16": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
      "f32": rng.standard_normal((7,)).astype(np.float32),
      "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
      "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
      "bool": np.array([True, False, True]),
      "empty": np.zeros((0, 4), np.float32),
      "scalar": np.array(2.5, np.float64),
  }
  path = str(tmp_path / "t.safetensors")
  st.write_safetensors(path, tensors, metadata={"k": "v"})
  raw = open(path, "rb").read()
  (n,) = struct.unpack("<Q", raw[:8])
  assert n % 8 == 0 and json.loads(raw[8:8 + n])["__metadata__"] == {"k": "v"}
  f = st.SafetensorsFile(path)
  assert f.keys() == list(tensors)
  for name, t in tensors.items():
    got = f.get(name)
    assert got.dtype == t.dtype and got.shape == t.shape
    assert got.tobytes() == t.tobytes()


def test_sharded_writer_and_index(tmp_path):
  tensors = {f"t{i}": np.full((10,), i, np.float32) for i in range(5)}       # 40 bytes each
  names = st.write_sharded(str(tmp_path), [(n, t.shape, t.dtype) for n, t in tensors.items()],
                           tensors.__getitem__, max_shard_bytes=100)
  assert names == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
  index = json.load(open(tmp_path / st.INDEX_NAME))
  assert index["metadata"]["total_size"] == 200
  assert index["weight_map"] == {"t0": names[0], "t1": names[0], "t2": names[1], "t3": names[1],
                                 "t4": names[2]}
  ckpt = st.ShardedCheckpoint(str(tmp_path))
  for n, t in tensors.items():
    np.testing.assert_array_equal(ckpt.get(n), t)


def _corrupt(path, how):
  raw = bytearray(open(path, "rb").read())
  (n,) = struct.unpack("<Q", raw[:8])
  if how == "truncated":
    raw = raw[:-10]
  elif how == "trailing":
    raw += b"\0" * 4
  elif how == "huge_header":
    raw[:8] = struct.pack("<Q", 10 ** 12)
  elif how == "bad_json":
    raw[8] = ord("[")
    raw[9:12] = b"!!!"
  elif how == "short":
    raw = raw[:5]
  elif how == "bad_offsets":
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] -= 2
    text = json.dumps(header).encode()
    raw = bytearray(struct.pack("<Q", len(text))) + text + raw[8 + n:]
  elif how == "bad_dtype":
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["dtype"] = "Q7"
    text = json.dumps(header).encode()
    raw = bytearray(struct.pack("<Q", len(text))) + text + raw[8 + n:]
  open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("how, message", [
    ("truncated", "truncated: the header describes"),
    ("trailing", "has trailing bytes"),
    ("huge_header", "header length 1000000000000 exceeds"),
    ("bad_json", "header is not valid JSON"),
    ("short", "too short for a safetensors header"),
    ("bad_offsets", "data_offsets"),
    ("bad_dtype", "unsupported dtype 'Q7'"),
])
def test_corrupt_files_give_clear_errors(tmp_path, how, message):
  path = str(tmp_path / "c.safetensors")
  st.write_safetensors(path, {"a": np.ones((4, 4), np.float32), "b": np.zeros(3, np.float32)})
  _corrupt(path, how)
  with pytest.raises(st.SafetensorsError, match=message) as e:
    st.SafetensorsFile(path)
  assert path in str(e.value)


# --------------------------------------------------------------------------------------------------
# Conversion of random models in the real layout.
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bf16_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tiny_bf16"))
  random_checkpoint.write_random_checkpoint(d, dream.tiny_config(), seed=3, num_shards=3)
  return d


def test_random_checkpoint_layout(tiny_bf16_dir):
  cfg = dream.tiny_config()
  ckpt = st.ShardedCheckpoint(tiny_bf16_dir)
  assert len(ckpt.files) == 3
  assert [(n, s) for n, s in hf_layout.hf_tensor_specs(cfg)] == \
      [(n, ckpt.infos[n].shape) for n, _ in hf_layout.hf_tensor_specs(cfg)]
  assert set(ckpt.infos) == {n for n, _ in hf_layout.hf_tensor_specs(cfg)}
  assert {i.dtype_name for i in ckpt.infos.values()} == {"BF16"}
  assert ckpt.infos["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)   # [out, in]
  assert ckpt.infos["lm_head.weight"].shape == (272, 64)
  hf = json.load(open(os.path.join(tiny_bf16_dir, "config.json")))
  assert hf_layout.config_from_hf_json(os.path.join(tiny_bf16_dir, "config.json")) == cfg
  assert hf["num_key_value_heads"] == 2 and hf["tie_word_embeddings"] is False


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conversion_reproduces_float64_forward_of_the_shards(tmp_path, dtype):
  cfg = dream.tiny_config(dtype=dtype, param_dtype=dtype)
  random_checkpoint.write_random_checkpoint(str(tmp_path), cfg, seed=5, num_shards=4)
  params = convert.load_params(str(tmp_path), cfg)
  assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree.leaves(params))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (2, 9)).astype(np.int32)
  valid = np.ones((2, 9), bool)
  valid[1, :3] = False
  apply = jax.jit(dream.dream_forward(cfg).apply)
  logits = np.asarray(apply(params, tokens, valid), np.float32)
  ckpt = st.ShardedCheckpoint(str(tmp_path))
  want = ref.forward(ckpt.get, cfg, tokens, valid)["logits"]    # float64 from the raw tensors
  err = rel_err(logits[valid], want[valid])
  assert err < (2e-5 if dtype == "float32" else 0.03), err
  # Exactly the forward of the same tensors mapped in memory (no shard reading involved).
  direct = convert.params_from_tensors(lambda n: np.array(ckpt.get(n)), cfg)
  np.testing.assert_array_equal(logits, np.asarray(apply(direct, tokens, valid), np.float32))


def test_orbax_round_trip_and_cli(tmp_path, tiny_bf16_dir, capsys):
  cfg = dream.tiny_config()
  out = str(tmp_path / "orbax")
  assert convert.main(["--hf_dir", tiny_bf16_dir, "--out", out]) == 0
  assert "loaded 121,408 parameters" in capsys.readouterr().out
  per_layer = 2 * 64 + 64 * 128 + 128 + 64 * 64 + 3 * 64 * 160     # norms, qkv + bias, o, mlp
  assert dream.count_params(cfg) == 121_408 == 2 * 272 * 64 + 2 * per_layer + 64
  restored = orbax_params.restore_params(out, cfg)
  loaded = convert.load_checkpoint(tiny_bf16_dir, cfg)
  again = convert.load_checkpoint(out, cfg)
  for a, b, c in zip(jax.tree.leaves(restored), jax.tree.leaves(loaded), jax.tree.leaves(again)):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    np.testing.assert_array_equal(np.asarray(c, np.float32), np.asarray(b, np.float32))
  with pytest.raises(convert.ConversionError, match="num_layers: saved 2 vs config 3.*Fix: pass "
                     "the config of this checkpoint, or override the fields: "
                     "--config.model.num_layers=2$"):
    orbax_params.restore_params(out, dream.tiny_config(num_layers=3))
  convert.check_checkpoint_folder(out, cfg)                     # the saved config: no weight read
  with pytest.raises(convert.ConversionError, match="--config.model.num_layers=2$"):
    convert.check_checkpoint_folder(out, dream.tiny_config(num_layers=3))
  with pytest.raises(convert.ConversionError, match="not a checkpoint written by"):
    orbax_params.restore_params(str(tmp_path), cfg)


def test_cli_write_random_with_config_file(tmp_path, capsys):
  d = str(tmp_path / "r")
  assert convert.main(["--write_random", d, "--config", "configs/tiny.py:dtype=float32",
                       "--shards", "2", "--seed", "1"]) == 0
  assert "wrote 2 shards of a random 121,408-parameter Dream" in capsys.readouterr().out
  hf = json.load(open(os.path.join(d, "config.json")))
  assert hf["mask_token_id"] == 259 and hf["torch_dtype"] == "float32"


def test_torch_dtype_is_honoured_and_casts_are_logged(tmp_path, capsys):
  d = str(tmp_path / "f32")
  random_checkpoint.write_random_checkpoint(d, dream.tiny_config(**F32), seed=2)
  assert hf_layout.config_from_hf_json(os.path.join(d, "config.json")) == dream.tiny_config(**F32)
  # A float32 folder becomes a float32 checkpoint, no cast.
  out = str(tmp_path / "f32_orbax")
  assert convert.main(["--hf_dir", d, "--out", out]) == 0
  cap = capsys.readouterr()
  assert "float32) in" in cap.out and " -> " not in cap.err
  saved = json.load(open(os.path.join(out, orbax_params.PODLAB_CONFIG_JSON)))
  assert saved["param_dtype"] == saved["dtype"] == "float32"
  restored = orbax_params.restore_params(out)
  ckpt = st.ShardedCheckpoint(d)
  np.testing.assert_array_equal(np.asarray(restored["dream/lm_head"]["w"]),
                                np.asarray(ckpt.get("lm_head.weight")).T)
  # --dtype casts, and says so (from -> to, how many tensors).
  out16 = str(tmp_path / "bf16_orbax")
  assert convert.main(["--hf_dir", d, "--dtype", "bfloat16", "--out", out16]) == 0
  assert f"{d}: cast 27 tensors float32 -> bfloat16 (config.model.param_dtype)" in \
      capsys.readouterr().err
  p16 = orbax_params.restore_params(out16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
  np.testing.assert_array_equal(np.asarray(p16["dream/lm_head"]["w"]),
                                np.asarray(restored["dream/lm_head"]["w"]).astype(jnp.bfloat16))
  # A bfloat16 config on the float32 folder: refused without a cast, with the fix; --cast logs.
  assert convert.main(["--hf_dir", d, "--config", "configs/tiny.py"]) == 2
  err = capsys.readouterr().err
  assert ("Fix: set config.model.param_dtype to the checkpoint's dtype (--config.model."
          "param_dtype=float32 --config.model.dtype=float32), or cast to bfloat16: "
          "--dtype=bfloat16 / --cast") in err
  assert convert.main(["--hf_dir", d, "--config", "configs/tiny.py", "--cast"]) == 0
  assert "cast 27 tensors float32 -> bfloat16" in capsys.readouterr().err
  assert convert.main(["--hf_dir", d, "--config", "configs/tiny.py",
                       "--config.model.param_dtype=float32",
                       "--config.model.dtype=float32"]) == 0   # the override, no cast
  assert " -> " not in capsys.readouterr().err
  # The library logs through `log` (absl logging by default), and restore_params too.
  lines = []
  convert.load_params(d, dream.tiny_config(), allow_cast=True, log=lines.append)
  assert lines == [f"{d}: cast 27 tensors float32 -> bfloat16 (config.model.param_dtype)"]
  lines.clear()
  orbax_params.restore_params(out, dream.tiny_config(), log=lines.append)
  assert lines == [f"{os.path.abspath(out)}: cast the saved parameters float32 -> bfloat16 "
                   "(config.model.param_dtype)"]
  # An unknown torch_dtype is an error naming the fix.
  hf = json.load(open(os.path.join(d, "config.json")))
  hf["torch_dtype"] = "float64"
  json.dump(hf, open(os.path.join(d, "config.json"), "w"))
  assert convert.main(["--hf_dir", d]) == 2
  assert "torch_dtype='float64' is not one of" in capsys.readouterr().err
  assert convert.main(["--hf_dir", d, "--dtype", "float32"]) == 0
  capsys.readouterr()
  # A bad architecture override: one line naming the source, the field, the value and the fix
  # (exit 2), from config.json + overrides and from --config + overrides alike.
  assert convert.main(["--hf_dir", d, "--dtype", "float32", "--config.model.num_kv_heads=3"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: {os.path.join(d, 'config.json')}: DreamConfig.num_kv_heads=3: must divide "
                 "num_heads=4. Fix: correct that field (or its --config.model. override)"]
  assert convert.main(["--hf_dir", d, "--config", "configs/tiny.py",
                       "--config.model.num_heads=3"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --config=configs/tiny.py: DreamConfig.num_heads=3")


# --------------------------------------------------------------------------------------------------
# Mismatched checkpoints.
# --------------------------------------------------------------------------------------------------


def _write_variant(d, cfg, edit):
  """A random checkpoint of cfg whose tensor list is changed by edit(specs) -> specs."""
  specs = [(n, s, np.dtype(cfg.param_dtype)) for n, s in hf_layout.hf_tensor_specs(cfg)]
  specs = edit(specs)
  st.write_sharded(d, specs, lambda n: np.zeros(dict((a, b) for a, b, _ in specs)[n],
                                                dict((a, c) for a, _, c in specs)[n]),
                   max_shard_bytes=60_000)


@pytest.mark.parametrize("edit, message", [
    (lambda s: [x for x in s if x[0] != "model.layers.1.self_attn.v_proj.bias"],
     r"1 missing tensors \(e.g. \['model.layers.1.self_attn.v_proj.bias'\]\)"),
    (lambda s: s + [("model.layers.2.mlp.up_proj.weight", (160, 64), np.dtype("bfloat16"))],
     r"1 unexpected tensors \(e.g. \['model.layers.2.mlp.up_proj.weight'\]\)"),
    (lambda s: [(n, (161, 64) if n.endswith("0.mlp.gate_proj.weight") else sh, dt)
                for n, sh, dt in s],
     r"model.layers.0.mlp.gate_proj.weight: \(161, 64\) in the checkpoint, \(160, 64\) expected"),
    (lambda s: [(n, sh, np.dtype(np.float16) if n == "lm_head.weight" else dt) for n, sh, dt in s],
     r"lm_head.weight: F16\).*Fix: set config.model.param_dtype"),
])
def test_mismatched_checkpoints_give_clear_errors(tmp_path, edit, message):
  cfg = dream.tiny_config()
  _write_variant(str(tmp_path), cfg, edit)
  with pytest.raises(convert.ConversionError, match=message) as e:
    convert.load_params(str(tmp_path), cfg)
  assert str(tmp_path) in str(e.value) and "Fix:" in str(e.value)


def test_wrong_config_and_missing_shard(tmp_path, tiny_bf16_dir):
  with pytest.raises(convert.ConversionError,
                     match="intermediate_size: config.json 160 vs config.model 128.*"
                     "or override the fields: --config.model.intermediate_size=160$"):
    convert.load_params(tiny_bf16_dir, dream.tiny_config(intermediate_size=128))
  with pytest.raises(convert.ConversionError, match="override the fields: "
                     "--config.model.hidden_size=64 --config.model.num_layers=2$"):
    convert.check_checkpoint_folder(tiny_bf16_dir, dream.tiny_config(hidden_size=128,
                                                                     num_layers=3))
  d = str(tmp_path)
  random_checkpoint.write_random_checkpoint(d, dream.tiny_config(), num_shards=3)
  os.remove(os.path.join(d, "config.json"))
  with pytest.raises(convert.ConversionError, match="wrong shapes.*override the fields its shapes "
                     r"show: --config.model.intermediate_size=160 \(num_heads"):
    convert.load_params(d, dream.tiny_config(intermediate_size=128))
  with pytest.raises(convert.ConversionError, match="missing tensors.*--config.model.num_layers=2 "):
    convert.check_checkpoint_folder(d, dream.tiny_config(num_layers=3))
  os.remove(os.path.join(d, "model-00002-of-00003.safetensors"))
  with pytest.raises(convert.ConversionError, match="model-00002-of-00003.safetensors: shard named "
                     "by the index .* is missing"):
    convert.load_params(d, dream.tiny_config())
  with pytest.raises(convert.ConversionError, match="neither model.safetensors.index.json nor"):
    convert.load_params(str(tmp_path / "nothing"), dream.tiny_config())


def test_index_and_shard_disagree(tmp_path):
  d = str(tmp_path)
  random_checkpoint.write_random_checkpoint(d, dream.tiny_config(), num_shards=2)
  index_path = os.path.join(d, st.INDEX_NAME)
  index = json.load(open(index_path))
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
  json.dump(index, open(index_path, "w"))
  with pytest.raises(convert.ConversionError, match="holds tensor 'model.norm.weight' but the index "
                     "maps it to 'model-00001-of-00002.safetensors'"):
    convert.load_params(d, dream.tiny_config())


def test_full_size_7b_layout_on_sparse_shards(tmp_path):
  """The real 339-tensor, 15.2 GB layout in 4 shards, written as sparse files (headers + holes: no
  disk, no time), passes every header, index and name/shape/dtype check; one wrong tensor fails."""
  cfg = dream.DREAM_7B
  specs = [(n, s, np.dtype(ml_dtypes.bfloat16)) for n, s in hf_layout.hf_tensor_specs(cfg)]

  def write(specs, d):
    os.makedirs(d)
    bounds = np.linspace(0, len(specs), 5).astype(int)
    weight_map = {}
    for i in range(4):
      part = specs[bounds[i]:bounds[i + 1]]
      name = f"model-{i + 1:05d}-of-00004.safetensors"
      head, sizes = st._header_bytes(part, {"format": "pt"})  # pylint: disable=protected-access
      with open(os.path.join(d, name), "wb") as f:
        f.write(head)
        f.truncate(len(head) + sum(sizes))                     # a hole where the weights would be
      weight_map.update({n: name for n, _, _ in part})
    with open(os.path.join(d, st.INDEX_NAME), "w") as f:
      json.dump({"metadata": {"total_size": 15_231_233_024}, "weight_map": weight_map}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
      json.dump(hf_layout.hf_config_json(cfg), f)

  good = str(tmp_path / "good")
  write(specs, good)
  ckpt = st.ShardedCheckpoint(good)
  assert len(ckpt.infos) == 339 and ckpt.total_bytes == 2 * 7_615_616_512 == 15_231_233_024
  hf_layout.check_against_hf_json(good, cfg)
  convert.check_checkpoint(ckpt, cfg)
  assert ckpt.get("model.layers.27.mlp.down_proj.weight").shape == (3584, 18944)
  bad = str(tmp_path / "bad")
  write([(n, (512, 3585) if n == "model.layers.5.self_attn.k_proj.weight" else s, d)
         for n, s, d in specs], bad)
  with pytest.raises(convert.ConversionError, match=r"k_proj.weight: \(512, 3585\) in the checkpoint, "
                     r"\(512, 3584\) expected"):
    convert.check_checkpoint(st.ShardedCheckpoint(bad), cfg)


# --------------------------------------------------------------------------------------------------
# Streaming: peak host memory.
# --------------------------------------------------------------------------------------------------

_RSS_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import jax, numpy as np
    from experiments.diffucoder import convert
    from experiments.common import safetensors_io as st
    from modules import dream
    cfg = dream.DreamConfig(**json.loads(sys.argv[2]))
    jax.numpy.zeros(1).block_until_ready()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    params = convert.load_params(sys.argv[1], cfg)
    jax.block_until_ready(params)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ckpt = st.ShardedCheckpoint(sys.argv[1])
    shard = max(sum(i.nbytes for i in f.infos.values()) for f in ckpt.files.values())
    print(json.dumps(dict(base=base, peak=peak, model=ckpt.total_bytes, shard=shard,
                          largest=max(i.nbytes for i in ckpt.infos.values()))))
""")


def measure_conversion_rss(hf_dir, cfg):
  """Peak RSS growth of load_params in a fresh process: {base, peak, model, shard, largest} bytes."""
  out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, hf_dir, json.dumps(cfg.to_dict())],
                       cwd=REPO, capture_output=True, text=True, check=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_conversion_peak_memory_is_model_plus_about_a_shard(tmp_path):
  # ~270 MB of bf16 over 4 shards (the real model is 15.2 GB over 4 shards).
  cfg = dream.DreamConfig(vocab_size=16384, hidden_size=1024, intermediate_size=2816, num_layers=8,
                          num_heads=8, num_kv_heads=2)
  random_checkpoint.write_random_checkpoint(str(tmp_path), cfg, num_shards=4)
  r = measure_conversion_rss(str(tmp_path), cfg)
  growth = r["peak"] - r["base"]
  # The device copy of the params (the CPU device is host memory) plus at most about one shard,
  # never the whole model twice.
  assert growth < r["model"] + r["shard"], r
  assert growth < 1.75 * r["model"], r


@pytest.mark.parametrize("module_name", ["experiments.common.safetensors_io",
                                         "experiments.diffucoder.convert"])
def test_module_synopsis_runs(module_name):
  from test_docstrings import synopsis  # pylint: disable=g-import-not-at-top
  exec(compile(synopsis(module_name), f"<{module_name} synopsis>", "exec"), {})
