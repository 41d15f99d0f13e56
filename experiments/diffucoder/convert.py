"""Hugging Face Dream / DiffuCoder safetensors -> podlab Haiku parameters (no torch, no pickle).

  # convert a checkpoint folder (or a Hub name, downloaded once) to an orbax checkpoint:
  python -m experiments.diffucoder.convert --hf_dir=/ckpt/DiffuCoder-7B-Instruct --out=/ckpt/dc_instruct
  python -m experiments.diffucoder.convert --hf_dir=apple/DiffuCoder-7B-Instruct --out=/ckpt/dc_instruct
  # check a folder against a config without writing anything:
  python -m experiments.diffucoder.convert --hf_dir=/ckpt/DiffuCoder-7B-Base \
      --config=configs/diffucoder_7b_base.py
  # a float32 folder (config.json "torch_dtype": "float32") stays float32; --dtype casts, logged:
  python -m experiments.diffucoder.convert --hf_dir=/ckpt/f32 --out=/ckpt/f32_orbax
  python -m experiments.diffucoder.convert --hf_dir=/ckpt/f32 --out=/ckpt/bf16_orbax --dtype=bfloat16
  # write a random model in the real checkpoint layout (tests, demos, benchmarks):
  python -m experiments.diffucoder.convert --write_random=/tmp/tiny_hf --config=configs/tiny.py \
      --shards=3

Dtypes: without --config the parameter (and compute) dtype is config.json's `torch_dtype` (bfloat16
for the released models). A checkpoint whose tensors are not in the target dtype is refused unless
the cast is asked for (`--dtype=...`, or `--cast` for config.model.param_dtype); a cast is logged as
"N tensors float32 -> bfloat16", never silent. `--config.model.FIELD=VALUE` overrides a field of
`--config` (as in generate.py).

Conversion reads the shard headers first and checks every tensor's name, shape and dtype against
the config (missing, unexpected, wrong shape, wrong dtype: one error listing them all, with the
`--config.model.*` overrides that would match), then streams
the tensors through np.memmap one Haiku parameter at a time: q/k/v are concatenated and transposed to
the fused `qkv_proj`, gate/up to `gate_up_proj`, torch [out, in] weights become [in, out]. Each result
is placed on the device (or `sharding`) as soon as it is built, so host memory holds at most the few
tensors of one parameter beyond what the device arrays use (on a CPU backend the device IS the host:
then the peak is the model once plus about one tensor, never the whole model twice).

Key layout (Hugging Face name -> Haiku parameter; see modules/dream.py):
  model.embed_tokens.weight [V, D]                        -> dream/embed_tokens/embedding
  model.layers.{n}.input_layernorm.weight [D]             -> dream/layer_{n}/input_layernorm/weight
  model.layers.{n}.self_attn.{q,k,v}_proj.weight/.bias    -> dream/layer_{n}/self_attn/qkv_proj/w, b
  model.layers.{n}.self_attn.o_proj.weight [D, H Dh]      -> dream/layer_{n}/self_attn/o_proj/w
  model.layers.{n}.post_attention_layernorm.weight [D]    -> dream/layer_{n}/post_attention_layernorm/...
  model.layers.{n}.mlp.{gate,up}_proj.weight [F, D]       -> dream/layer_{n}/mlp/gate_up_proj/w
  model.layers.{n}.mlp.down_proj.weight [D, F]            -> dream/layer_{n}/mlp/down_proj/w
  model.norm.weight [D]                                   -> dream/norm/weight
  lm_head.weight [V, D]                                   -> dream/lm_head/w

Shape glossary: V vocab, D hidden, H/K query/KV heads, Dh head dim, F SwiGLU width, n layer index.

Synopsis:

  import tempfile
  import jax, jax.numpy as jnp
  from experiments.diffucoder import convert
  from modules import dream

  cfg = dream.tiny_config()
  d = tempfile.mkdtemp()
  convert.write_random_checkpoint(d, cfg, seed=0, num_shards=3)   # 3 shards + index + config.json
  params = convert.load_params(d, cfg)                            # the Haiku tree, bfloat16
  tokens = jnp.array([[1, 2, 3]], jnp.int32)
  logits = jax.jit(dream.dream_forward(cfg).apply)(params, tokens, tokens >= 0)  # [1, 3, 272]
  convert.save_params(params, d + "/orbax", cfg)
  restored = convert.restore_params(d + "/orbax", cfg)
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
import numpy as np

from experiments.common import config_utils
from experiments.common import distributed
from experiments.common import errors
from experiments.common import safetensors_io as st
from experiments.diffucoder import model_sharding
from input_pipeline import hub
from modules import dream

CONFIG_JSON = "config.json"
PODLAB_CONFIG_JSON = "dream_config.json"        # written next to an orbax checkpoint

# Hugging Face config.json field -> DreamConfig field.
_HF_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
              "intermediate_size": "intermediate_size", "num_hidden_layers": "num_layers",
              "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
              "rope_theta": "rope_theta", "rms_norm_eps": "rms_norm_eps"}


class ConversionError(errors.FormatError):
  """The checkpoint does not match the config (names, shapes, dtypes) or cannot be read."""


# --------------------------------------------------------------------------------------------------
# The key layout.
# --------------------------------------------------------------------------------------------------


def hf_tensor_specs(config: dream.DreamConfig) -> List[Tuple[str, Tuple[int, ...]]]:
  """Every tensor of a Hugging Face Dream checkpoint, (name, torch shape), in checkpoint order."""
  D, F, V = config.hidden_size, config.intermediate_size, config.vocab_size
  Dq, Dkv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
  specs = [("model.embed_tokens.weight", (V, D))]
  for n in range(config.num_layers):
    p = f"model.layers.{n}."
    specs += [(p + "input_layernorm.weight", (D,)),
              (p + "self_attn.q_proj.weight", (Dq, D)), (p + "self_attn.q_proj.bias", (Dq,)),
              (p + "self_attn.k_proj.weight", (Dkv, D)), (p + "self_attn.k_proj.bias", (Dkv,)),
              (p + "self_attn.v_proj.weight", (Dkv, D)), (p + "self_attn.v_proj.bias", (Dkv,)),
              (p + "self_attn.o_proj.weight", (D, Dq)),
              (p + "post_attention_layernorm.weight", (D,)),
              (p + "mlp.gate_proj.weight", (F, D)), (p + "mlp.up_proj.weight", (F, D)),
              (p + "mlp.down_proj.weight", (D, F))]
  specs += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
  return specs


def param_sources(config: dream.DreamConfig) -> List[Tuple[str, str, Tuple[str, ...], bool]]:
  """(Haiku module, parameter, source HF tensors concatenated on axis 0, transpose?) per parameter."""
  out = [("dream/embed_tokens", "embedding", ("model.embed_tokens.weight",), False)]
  for n in range(config.num_layers):
    p, m = f"model.layers.{n}.", f"dream/layer_{n}/"
    out += [(m + "input_layernorm", "weight", (p + "input_layernorm.weight",), False),
            (m + "self_attn/qkv_proj", "w", tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv"),
             True),
            (m + "self_attn/qkv_proj", "b", tuple(p + f"self_attn.{x}_proj.bias" for x in "qkv"),
             False),
            (m + "self_attn/o_proj", "w", (p + "self_attn.o_proj.weight",), True),
            (m + "post_attention_layernorm", "weight", (p + "post_attention_layernorm.weight",),
             False),
            (m + "mlp/gate_up_proj", "w", (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
             True),
            (m + "mlp/down_proj", "w", (p + "mlp.down_proj.weight",), True)]
  out += [("dream/norm", "weight", ("model.norm.weight",), False),
          ("dream/lm_head", "w", ("lm_head.weight",), True)]
  return out


def model_parallel_placer(config: dream.DreamConfig, mesh: jax.sharding.Mesh
                          ) -> Callable[[str, str, np.ndarray], jax.Array]:
  """place_param(module, name, value) for a (data, model) mesh (`model_sharding.mesh_2d`): the value in
  `dream.model_parallel_layout` column order, put straight into its device blocks by
  `dream.param_partition_spec` (each device gets only its block; replicated over the data axis)."""
  m = mesh.shape[model_sharding.MODEL_AXIS]
  dream.check_model_degree(config, m)

  def place_param(module: str, name: str, value: np.ndarray) -> jax.Array:
    value = dream.model_parallel_layout(module, name, value, config, m)
    return model_sharding.put_sharded(value, mesh,
                                dream.param_partition_spec(module, name, model_sharding.MODEL_AXIS))
  return place_param


def params_from_tensors(get: Callable[[str], np.ndarray], config: dream.DreamConfig, *,
                        place: Optional[Callable[[np.ndarray], jax.Array]] = None,
                        progress: Optional[Callable[[str], None]] = None,
                        place_param: Optional[Callable[[str, str, np.ndarray], jax.Array]] = None
                        ) -> dict:
  """Builds the Haiku parameter tree from HF-layout tensors fetched one at a time by `get(name)`.

  Values are cast to config.param_dtype; `place` moves each finished parameter off the host
  (default jax.device_put) before the next one is read; `place_param(module, name, value)` instead
  when the placement depends on the parameter (`model_parallel_placer`: sharded over a mesh).
  """
  place = place or jax.device_put
  if place_param is None:
    place_param = lambda module, name, value: place(value)
  dtype = np.dtype(config.param_dtype)
  params: Dict[str, Dict[str, jax.Array]] = {}
  for module, name, sources, transpose in param_sources(config):
    parts = [get(s) for s in sources]
    value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    del parts
    if transpose:
      value = value.T
    value = np.ascontiguousarray(value, dtype=dtype)                # one host copy of this param
    params.setdefault(module, {})[name] = place_param(module, name, value)
    del value
    if progress is not None:
      progress(f"{module}/{name}")
  return params


# --------------------------------------------------------------------------------------------------
# Configs.
# --------------------------------------------------------------------------------------------------


DTYPES = ("bfloat16", "float32", "float16")


def config_from_hf_json(path: str, **overrides) -> dream.DreamConfig:
  """A DreamConfig from a Hugging Face config.json. dtype and param_dtype: its `torch_dtype`
  (bfloat16 when absent, as the released models), unless overridden."""
  try:
    with open(path) as f:
      hf = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConversionError(f"{path}: cannot read the model config ({type(e).__name__}: {e}). Fix: "
                          "pass --config=configs/<model>.py") from None
  missing = [k for k in _HF_FIELDS if k not in hf]
  if missing:
    raise ConversionError(f"{path}: lacks {missing}; not a Dream/Qwen2 config. Fix: pass "
                          "--config=configs/<model>.py")
  if hf.get("tie_word_embeddings", False):
    raise ConversionError(f"{path}: tie_word_embeddings=true, but Dream's output head is untied "
                          "(lm_head.weight). Fix: use a Dream / DiffuCoder checkpoint")
  fields = {ours: hf[theirs] for theirs, ours in _HF_FIELDS.items()}
  torch_dtype = hf.get("torch_dtype") or "bfloat16"
  if "dtype" not in overrides or "param_dtype" not in overrides:
    if torch_dtype not in DTYPES:
      raise ConversionError(f"{path}: torch_dtype={torch_dtype!r} is not one of {DTYPES}. Fix: pass "
                            "--dtype=bfloat16 (or float32) to cast the weights")
    fields.update(dtype=torch_dtype, param_dtype=torch_dtype)
  fields.update(overrides)
  return dream_config_from(fields, path)


def model_overrides(fields: Dict[str, object]) -> str:
  """`--config.model.F=V ...` for {field: value} (what a fix text tells the user to pass)."""
  return " ".join(f"--config.model.{k}={v}" for k, v in fields.items())


def shape_fields(infos: Dict[str, st.TensorInfo]) -> Dict[str, int]:
  """The DreamConfig fields a checkpoint's tensor shapes reveal: vocab_size and hidden_size
  (embed_tokens), intermediate_size (layer 0's gate_proj) and num_layers (the layers present).
  num_heads / num_kv_heads are not separable from the head dim: config.json holds them."""
  out = {}
  emb = infos.get("model.embed_tokens.weight")
  if emb is not None and len(emb.shape) == 2:
    out["vocab_size"], out["hidden_size"] = int(emb.shape[0]), int(emb.shape[1])
  gate = infos.get("model.layers.0.mlp.gate_proj.weight")
  if gate is not None and len(gate.shape) == 2:
    out["intermediate_size"] = int(gate.shape[0])
  layers = {int(n.split(".")[2]) for n in infos if n.startswith("model.layers.")
            and n.split(".")[2].isdigit()}
  if layers:
    out["num_layers"] = max(layers) + 1
  return out


def check_against_hf_json(hf_dir: str, config: dream.DreamConfig) -> None:
  """If hf_dir has a config.json, every architecture field must equal `config`'s."""
  path = os.path.join(hf_dir, CONFIG_JSON)
  if not os.path.isfile(path):
    return
  theirs = config_from_hf_json(path, dtype=config.dtype, param_dtype=config.param_dtype)
  differ = [f for f in _HF_FIELDS.values() if getattr(theirs, f) != getattr(config, f)]
  diffs = [f"{f}: config.json {getattr(theirs, f)!r} vs config.model {getattr(config, f)!r}"
           for f in differ]
  if diffs:
    raise ConversionError(
        f"{hf_dir}: the checkpoint's config.json disagrees with the config: {'; '.join(diffs)}. "
        "Fix: pass the config of this model, or override the fields: "
        + model_overrides({f: getattr(theirs, f) for f in differ}))


# --------------------------------------------------------------------------------------------------
# Loading.
# --------------------------------------------------------------------------------------------------


def check_checkpoint(ckpt: st.ShardedCheckpoint, config: dream.DreamConfig, *,
                     allow_cast: bool = False) -> None:
  """Names, shapes and dtypes of every tensor vs the config; raises one ConversionError listing all
  missing, unexpected, wrongly shaped and wrongly typed tensors."""
  want = dict(hf_tensor_specs(config))
  have = ckpt.infos
  problems = []
  missing = [n for n in want if n not in have]
  unexpected = sorted(n for n in have if n not in want)
  if missing:
    problems.append(f"{len(missing)} missing tensors (e.g. {missing[:4]})")
  if unexpected:
    problems.append(f"{len(unexpected)} unexpected tensors (e.g. {unexpected[:4]})")
  shapes = [f"{n}: {have[n].shape} in the checkpoint, {want[n]} expected"
            for n in want if n in have and have[n].shape != want[n]]
  if shapes:
    problems.append(f"{len(shapes)} wrong shapes ({'; '.join(shapes[:4])})")
  dtype = np.dtype(config.param_dtype)
  fixes = []
  if not allow_cast:
    wrong = [n for n in want if n in have and have[n].dtype != dtype]
    if wrong:
      theirs = collections.Counter(np.dtype(have[n].dtype).name for n in wrong).most_common(1)[0][0]
      problems.append(f"{len(wrong)} tensors are not {st.dtype_name(dtype)} = "
                      f"config.model.param_dtype ("
                      + "; ".join(f"{n}: {have[n].dtype_name}" for n in wrong[:4]) + ")")
      fixes.append(f"set config.model.param_dtype to the checkpoint's dtype (--config.model."
                   f"param_dtype={theirs} --config.model.dtype={theirs}), or cast to "
                   f"{dtype.name}: --dtype={dtype.name} / --cast (allow_cast=True; logged)")
  else:
    bad = [f"{n}: {have[n].dtype_name}" for n in want
           if n in have and not np.issubdtype(have[n].dtype, np.floating)
           and have[n].dtype != np.dtype("bfloat16")]
    if bad:
      problems.append(f"non-float tensors cannot be cast ({'; '.join(bad[:4])})")
  if problems:
    if missing or unexpected or shapes:
      seen = {f: v for f, v in shape_fields(have).items() if getattr(config, f) != v}
      fix = "pass the config of this checkpoint (or its config.json)"
      if seen:
        fix += (", or override the fields its shapes show: " + model_overrides(seen) +
                " (num_heads / num_kv_heads: see its config.json)")
      fixes.insert(0, fix)
    raise ConversionError(
        f"{ckpt.dir} does not match the config (V={config.vocab_size}, D={config.hidden_size}, "
        f"F={config.intermediate_size}, layers={config.num_layers}, heads={config.num_heads}/"
        f"{config.num_kv_heads}): " + " | ".join(problems) + ". Fix: " + "; and ".join(fixes))


def casts(ckpt: st.ShardedCheckpoint, config: dream.DreamConfig) -> Dict[str, int]:
  """{"float32 -> bfloat16": number of tensors, ...}: the casts loading `ckpt` as `config` makes."""
  to = np.dtype(config.param_dtype).name
  count = collections.Counter(f"{np.dtype(ckpt.infos[n].dtype).name} -> {to}"
                              for n, _ in hf_tensor_specs(config)
                              if n in ckpt.infos and ckpt.infos[n].dtype != np.dtype(to))
  return dict(sorted(count.items()))


def open_checked(hf_dir: str, config: dream.DreamConfig, *,
                 allow_cast: bool = False) -> st.ShardedCheckpoint:
  """The checks of `load_params` without reading any weight: config.json (if present), the shard
  headers and index, every tensor's name, shape and dtype. Returns the opened checkpoint."""
  check_against_hf_json(hf_dir, config)
  try:
    ckpt = st.ShardedCheckpoint(hf_dir)
  except st.SafetensorsError as e:
    raise ConversionError(str(e)) from None
  check_checkpoint(ckpt, config, allow_cast=allow_cast)
  return ckpt


def load_params(hf_dir: str, config: dream.DreamConfig, *, allow_cast: bool = False,
                place: Optional[Callable[[np.ndarray], jax.Array]] = None,
                progress: Optional[Callable[[str], None]] = None,
                log: Optional[Callable[[str], None]] = None,
                mesh: Optional[jax.sharding.Mesh] = None) -> dict:
  """Reads a Hugging Face checkpoint folder into the Haiku parameter tree, streaming (see top).

  Checks config.json (if present), the shard headers and every tensor's name, shape and dtype
  before reading any weights. `place` puts each parameter somewhere (default jax.device_put; pass
  e.g. `lambda x: jax.device_put(x, sharding)`); with `mesh` (a `model_sharding.mesh_2d`) each tensor
  goes straight into its model-parallel device blocks (`model_parallel_placer`), so the host holds
  about one tensor at a time and no device ever holds the whole model. With `allow_cast`, tensors not in
  config.param_dtype are cast, and `log` (default: absl logging.warning) gets one line
  "cast N tensors float32 -> bfloat16 (config.model.param_dtype)" per source dtype.
  """
  ckpt = open_checked(hf_dir, config, allow_cast=allow_cast)
  for change, n in casts(ckpt, config).items():
    (log or logging.warning)(f"{hf_dir}: cast {n} tensors {change} (config.model.param_dtype)")
  place_param = model_parallel_placer(config, mesh) if mesh is not None else None
  return params_from_tensors(ckpt.get, config, place=place, progress=progress,
                             place_param=place_param)


def save_params(params: dict, out_dir: str, config: dream.DreamConfig) -> None:
  """Writes an orbax checkpoint of `params` at out_dir/params (+ out_dir/dream_config.json)."""
  # pylint: disable-next=g-import-not-at-top  (orbax and TF: only saving and restoring need them)
  from experiments.common import checkpointing
  out_dir = os.path.abspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  checkpointing.write_tree(os.path.join(out_dir, "params"), params, force=True)
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, PODLAB_CONFIG_JSON), "w") as f:
      json.dump(config.to_dict(), f, indent=2)


def saved_config(path: str, config: Optional[dream.DreamConfig] = None) -> dream.DreamConfig:
  """The DreamConfig stored beside an orbax checkpoint by `save_params`; with `config`, checks that
  its architecture equals the saved one (no weight is read)."""
  path = os.path.abspath(path)
  meta_path = os.path.join(path, PODLAB_CONFIG_JSON)
  if not os.path.isfile(meta_path):
    raise ConversionError(f"{path}: no {PODLAB_CONFIG_JSON}; not a checkpoint written by "
                          "experiments.diffucoder.convert. Fix: convert the Hugging Face folder "
                          "first, or pass it as a Hugging Face checkpoint")
  with open(meta_path) as f:
    saved = dream.DreamConfig(**json.load(f))
  config = config or saved
  differ = [f for f in _HF_FIELDS.values() if getattr(saved, f) != getattr(config, f)]
  diffs = [f"{f}: saved {getattr(saved, f)!r} vs config {getattr(config, f)!r}" for f in differ]
  if diffs:
    raise ConversionError(
        f"{path}: the checkpoint's architecture differs from the config: {'; '.join(diffs)}. "
        "Fix: pass the config of this checkpoint, or override the fields: "
        + model_overrides({f: getattr(saved, f) for f in differ}))
  return saved


def restore_params(path: str, config: Optional[dream.DreamConfig] = None, *,
                   sharding: Optional[jax.sharding.Sharding] = None,
                   shardings: Optional[dict] = None,
                   log: Optional[Callable[[str], None]] = None) -> dict:
  """Restores params written by `save_params`. With `config`, its architecture must equal the saved
  one and the arrays come back in config.param_dtype with the expected shapes (a saved dtype that
  differs is cast, and `log`, default absl logging.warning, says so from -> to). `sharding`: one
  sharding for every array (default the first device); `shardings`: a {module: {name: Sharding}}
  tree instead. Each array is read straight into its sharding (`checkpointing.read_tree(target=)`):
  a device reads only its block, so no host holds the whole model."""
  # pylint: disable-next=g-import-not-at-top  (orbax and TF: only saving and restoring need them)
  from experiments.common import checkpointing
  path = os.path.abspath(path)
  saved = saved_config(path, config)
  config = config or saved
  if saved.param_dtype != config.param_dtype:
    (log or logging.warning)(f"{path}: cast the saved parameters {saved.param_dtype.name} -> "
                             f"{config.param_dtype.name} (config.model.param_dtype)")
  shapes = dream.param_shapes(config)
  if shardings is None:
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda s: sharding, shapes)
  target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        shapes, shardings)
  return checkpointing.read_tree(os.path.join(path, "params"), target=target)


@functools.lru_cache(maxsize=None)
def _column_gather(sharding: jax.sharding.Sharding) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """jit(v[..., order]) whose result lands in `sharding` (one compile per sharding and shape)."""
  return jax.jit(lambda value, order: jnp.take(value, order, axis=-1), out_shardings=sharding)


def restore_sharded(path: str, config: dream.DreamConfig, mesh: jax.sharding.Mesh, *,
                    log: Optional[Callable[[str], None]] = None) -> dict:
  """An orbax folder (`save_params`) straight into the model-parallel layout on a (data, model)
  mesh: every array is restored into its partition spec's NamedSharding (each device reads only its
  block; no host holds the whole model), then the fused qkv_proj / gate_up_proj columns are put in
  `dream.model_parallel_layout` order on the devices, one tensor at a time (a gather between the
  model devices: that tensor is held twice while it runs)."""
  m = mesh.shape[model_sharding.MODEL_AXIS]
  dream.check_model_degree(config, m)
  specs = dream.param_partition_specs(config, model_sharding.MODEL_AXIS)
  shardings = jax.tree.map(lambda s, spec: NamedSharding(mesh, spec), dream.param_shapes(config),
                           specs)
  params = restore_params(path, config, shardings=shardings, log=log)
  for module, p in params.items():
    for name in list(p):
      value = p[name]
      order = dream.model_parallel_layout(module, name, np.arange(value.shape[-1]), config, m)
      if np.array_equal(order, np.arange(value.shape[-1])):
        continue
      p[name] = _column_gather(value.sharding)(value, jnp.asarray(order, jnp.int32))
      value.delete()
  return params


def is_hf_dir(path: str) -> bool:
  return any(os.path.isfile(os.path.join(path, n)) for n in (st.INDEX_NAME, st.SINGLE_NAME))


def resolve(path: str, what: str = "--config.checkpoint") -> str:
  """The local folder of a checkpoint (or tokenizer) setting: a folder as given, or a Hub name
  (owner/name[@revision], e.g. apple/DiffuCoder-7B-Instruct, Dream-org/Dream-v0-Instruct-7B): its
  safetensors shards, index, config and tokenizer files, downloaded once (input_pipeline/hub.py)."""
  return hub.resolve(path, what=what, fallback=f"pass the folder as {what}=FOLDER")


def _check_folder(path: str) -> str:
  folder = resolve(path)
  if not os.path.isdir(folder):
    raise ConversionError(f"checkpoint {path!r} is not a folder. Fix: set config.checkpoint to a "
                          "Hugging Face checkpoint folder, a converted orbax folder or a Hub name "
                          "(owner/name)")
  return folder


def check_checkpoint_folder(path: str, config: dream.DreamConfig) -> None:
  """Every check `load_checkpoint` makes before reading weights (config.json or the saved config,
  shard headers, tensor names / shapes / dtypes), reading no weight: raises ConversionError. A Hub
  name is downloaded first (`resolve`)."""
  path = _check_folder(path)
  if is_hf_dir(path):
    open_checked(path, config)
  else:
    saved_config(path, config)


def load_checkpoint(path: str, config: dream.DreamConfig, **kwargs) -> dict:
  """`path` is a Hugging Face folder (load_params), an orbax folder (restore_params) or a Hub name
  of a Hugging Face folder (downloaded once: `resolve`).

  With `mesh=` (model parallelism): a Hugging Face folder streams each tensor into its device
  blocks; an orbax folder is restored sharded (`restore_sharded`: each device reads its blocks).
  Neither holds the whole model on a host.
  """
  path = _check_folder(path)
  if is_hf_dir(path):
    return load_params(path, config, **kwargs)
  mesh = kwargs.get("mesh")
  if mesh is None:
    return restore_params(path, config, log=kwargs.get("log"))
  return restore_sharded(path, config, mesh, log=kwargs.get("log"))


# --------------------------------------------------------------------------------------------------
# Random checkpoints in the real layout.
# --------------------------------------------------------------------------------------------------


def random_tensor(name: str, shape: Sequence[int], index: int, seed: int,
                  dtype=np.float32) -> np.ndarray:
  """The deterministic random value of one tensor of a random checkpoint (see write_random_checkpoint).

  Linear weights ~ N(0, 1/in), biases ~ N(0, 0.1^2), norm weights ~ 1 + N(0, 0.1^2), embedding
  rows ~ N(0, 1): a well-conditioned random model whose biases and norm weights all matter.
  """
  rng = np.random.default_rng([seed, index])
  x = rng.standard_normal(tuple(shape), dtype=np.float32)
  if name.endswith("layernorm.weight") or name == "model.norm.weight":
    x = 1.0 + 0.1 * x
  elif name.endswith(".bias"):
    x *= 0.1
  elif name != "model.embed_tokens.weight":
    x *= 1.0 / np.sqrt(shape[1])
  return x.astype(dtype)


def hf_config_json(config: dream.DreamConfig, tokens: Optional[dict] = None) -> dict:
  """The Hugging Face config.json of a Dream model with this architecture."""
  tokens = tokens or {}
  return {"architectures": ["DreamModel"], "model_type": "Dream",
          "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
          "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
          "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
          "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
          "hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0,
          "torch_dtype": config.param_dtype.name,
          **{k.replace("_id", "_token_id"): v for k, v in tokens.items()}}


def write_random_checkpoint(out_dir: str, config: dream.DreamConfig, *, seed: int = 0,
                            num_shards: Optional[int] = None,
                            max_shard_bytes: Optional[int] = None,
                            tokens: Optional[dict] = None) -> List[str]:
  """Writes a random Dream model as a Hugging Face folder: shards + index json + config.json.

  Tensors are in the real key layout and torch [out, in] shapes, in config.param_dtype, generated
  one at a time (`random_tensor`, so any size can be written with little memory). Give either the
  number of shards (contiguous, about equal bytes) or the shard size limit. Returns the shard names.
  """
  specs = hf_tensor_specs(config)
  dtype = np.dtype(config.param_dtype)
  index = {name: i for i, (name, _) in enumerate(specs)}
  shapes = dict(specs)
  if max_shard_bytes is None and num_shards is None:
    num_shards = 1
  make = lambda name: random_tensor(name, shapes[name], index[name], seed, dtype)
  names = st.write_sharded(out_dir, [(n, s, dtype) for n, s in specs], make,
                           max_shard_bytes=max_shard_bytes, num_shards=num_shards)
  with open(os.path.join(out_dir, CONFIG_JSON), "w") as f:
    json.dump(hf_config_json(config, tokens), f, indent=2)
  return names


# --------------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------------


def _load_config_file(path: str):
  """`configs/tiny.py[:arg]` (relative to the working directory or this folder) -> ConfigDict."""
  argv = config_utils.resolve_config_argv(["x", f"--config={path}"], os.path.dirname(__file__))
  file_path, _, arg = argv[1].split("=", 1)[1].partition(":")
  spec = importlib.util.spec_from_file_location("_diffucoder_config", file_path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg or None)


def dream_config_from(fields: Dict[str, object], source: str) -> dream.DreamConfig:
  """DreamConfig.from_dict(fields); a bad field (DreamConfig's ValueError, which names the field,
  the value and what it must be) becomes a ConversionError naming `source` (one line, exit 2)."""
  try:
    return dream.DreamConfig.from_dict(fields)
  except ValueError as e:
    raise ConversionError(f"{source}: {e}. Fix: correct that field (or its "
                          "--config.model. override)") from None


def main(argv: Sequence[str]) -> int:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  parser = argparse.ArgumentParser(
      prog="python -m experiments.diffucoder.convert",
      description="Hugging Face Dream/DiffuCoder safetensors -> podlab orbax params.")
  parser.add_argument("--hf_dir", help="Hugging Face checkpoint folder (shards + index json)")
  parser.add_argument("--out", help="orbax output folder (omitted: check and load only)")
  parser.add_argument("--config", help="configs/<model>.py[:arg] (default: the folder's config.json)")
  parser.add_argument("--cast", action="store_true",
                      help="cast tensors to config.model.param_dtype instead of requiring it (logged)")
  parser.add_argument("--dtype", choices=DTYPES,
                      help="parameter and compute dtype of the result (default: --config's, else "
                      "config.json's torch_dtype); tensors in another dtype are cast (logged)")
  parser.add_argument("--write_random", metavar="DIR",
                      help="write a random model in the real layout to DIR (needs --config)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--shards", type=int, default=2)
  args, rest = parser.parse_known_args(argv)
  overrides = {}
  fields = dream.DreamConfig().to_dict()
  for item in rest:
    name, eq, value = item.partition("=")
    field = name[len("--config.model."):] if name.startswith("--config.model.") else None
    if field is None or not eq:
      parser.error(f"unrecognized argument {item!r} (overrides read --config.model.FIELD=VALUE)")
    if field not in fields:
      parser.error(f"{name}: unknown field; DreamConfig fields: {', '.join(sorted(fields))}")
    try:
      overrides[field] = type(fields[field])(value)
    except ValueError:
      parser.error(f"{item}: expected a {type(fields[field]).__name__}")
  if args.dtype:
    overrides.update(dtype=args.dtype, param_dtype=args.dtype)

  config, tokens = None, None
  if args.config:
    c = _load_config_file(args.config)
    try:
      config = dream_config_from({**c.model.to_dict(), **overrides}, f"--config={args.config}")
    except errors.USER_ERRORS as e:
      print(f"error: {e}", file=sys.stderr)
      return errors.exit_code(e)
    tokens = c.tokens.to_dict()
  if args.write_random:
    if config is None:
      parser.error("--write_random needs --config (the architecture to write)")
    names = write_random_checkpoint(args.write_random, config, seed=args.seed,
                                    num_shards=args.shards, tokens=tokens)
    print(f"wrote {len(names)} shards of a random {dream.count_params(config):,}-parameter Dream "
          f"to {args.write_random}")
    return 0
  if not args.hf_dir:
    parser.error("pass --hf_dir (or --write_random)")
  try:
    args.hf_dir = resolve(args.hf_dir, "--hf_dir")     # a Hub name: downloaded once
    if config is None:
      config = config_from_hf_json(os.path.join(args.hf_dir, CONFIG_JSON), **overrides)
  except errors.USER_ERRORS as e:          # podlab's errors: one line; anything else is a bug
    print(f"error: {e}", file=sys.stderr)
    return errors.exit_code(e)
  start = time.time()
  done = [0]
  total = len(param_sources(config))

  def progress(name):
    done[0] += 1
    print(f"\r[{done[0]}/{total}] {name:<60}", end="", file=sys.stderr, flush=True)

  log = lambda line: print(f"\n{line}", file=sys.stderr, flush=True)
  try:
    params = load_params(args.hf_dir, config, allow_cast=args.cast or bool(args.dtype),
                         progress=progress, log=log)
  except errors.USER_ERRORS as e:
    print(f"\nerror: {e}", file=sys.stderr)
    return errors.exit_code(e)
  print(file=sys.stderr)
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  print(f"loaded {n:,} parameters ({len(jax.tree.leaves(params))} arrays, "
        f"{config.param_dtype.name}) in {time.time() - start:.1f} s")
  if args.out:
    save_params(params, args.out, config)
    print(f"wrote orbax checkpoint {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
