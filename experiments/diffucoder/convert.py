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

Key layout (Hugging Face name -> Haiku parameter; see modules/dream.py and hf_layout.py):
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

This module reads checkpoints (a Hugging Face folder, streamed; an orbax folder; a Hub name) and is
the CLI. Beside it: hf_layout.py (the tensors and config.json of the Hugging Face layout,
ConversionError), orbax_params.py (`save_params`, `restore_params`, `restore_sharded`: the orbax
folders `--out` writes) and random_checkpoint.py (`write_random_checkpoint`: `--write_random`).

Synopsis:

  import tempfile
  import jax, jax.numpy as jnp
  from experiments.diffucoder import convert
  from experiments.diffucoder import orbax_params
  from experiments.diffucoder import random_checkpoint
  from modules import dream

  cfg = dream.tiny_config()
  d = tempfile.mkdtemp()
  random_checkpoint.write_random_checkpoint(d, cfg, seed=0, num_shards=3)  # shards, index, config
  params = convert.load_params(d, cfg)                            # the Haiku tree, bfloat16
  tokens = jnp.array([[1, 2, 3]], jnp.int32)
  logits = jax.jit(dream.dream_forward(cfg).apply)(params, tokens, tokens >= 0)  # [1, 3, 272]
  orbax_params.save_params(params, d + "/orbax", cfg)
  restored = convert.load_checkpoint(d + "/orbax", cfg)           # an orbax folder: restore_params
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
import time
from typing import Callable, Dict, Optional, Sequence

from absl import logging
import jax
import numpy as np

from experiments.common import config_utils
from experiments.common import distributed
from experiments.common import errors
from experiments.common import safetensors_io as st
from experiments.diffucoder import hf_layout
from experiments.diffucoder import model_sharding
from experiments.diffucoder import orbax_params
from experiments.diffucoder import random_checkpoint
from experiments.diffucoder.hf_layout import ConversionError
from input_pipeline import hub
from modules import dream


# --------------------------------------------------------------------------------------------------
# Loading a Hugging Face folder.
# --------------------------------------------------------------------------------------------------


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
  for module, name, sources, transpose in hf_layout.param_sources(config):
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



def check_checkpoint(ckpt: st.ShardedCheckpoint, config: dream.DreamConfig, *,
                     allow_cast: bool = False) -> None:
  """Names, shapes and dtypes of every tensor vs the config; raises one ConversionError listing all
  missing, unexpected, wrongly shaped and wrongly typed tensors."""
  want = dict(hf_layout.hf_tensor_specs(config))
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
      seen = {f: v for f, v in hf_layout.shape_fields(have).items() if getattr(config, f) != v}
      fix = "pass the config of this checkpoint (or its config.json)"
      if seen:
        fix += (", or override the fields its shapes show: " + hf_layout.model_overrides(seen) +
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
                              for n, _ in hf_layout.hf_tensor_specs(config)
                              if n in ckpt.infos and ckpt.infos[n].dtype != np.dtype(to))
  return dict(sorted(count.items()))


def open_checked(hf_dir: str, config: dream.DreamConfig, *,
                 allow_cast: bool = False) -> st.ShardedCheckpoint:
  """The checks of `load_params` without reading any weight: config.json (if present), the shard
  headers and index, every tensor's name, shape and dtype. Returns the opened checkpoint."""
  hf_layout.check_against_hf_json(hf_dir, config)
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



# --------------------------------------------------------------------------------------------------
# Any checkpoint folder (Hugging Face, orbax, a Hub name).
# --------------------------------------------------------------------------------------------------


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
    orbax_params.saved_config(path, config)


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
    return orbax_params.restore_params(path, config, log=kwargs.get("log"))
  return orbax_params.restore_sharded(path, config, mesh, log=kwargs.get("log"))



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
  parser.add_argument("--dtype", choices=hf_layout.DTYPES,
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
      config = hf_layout.dream_config_from({**c.model.to_dict(), **overrides},
                                           f"--config={args.config}")
    except errors.USER_ERRORS as e:
      print(f"error: {e}", file=sys.stderr)
      return errors.exit_code(e)
    tokens = c.tokens.to_dict()
  if args.write_random:
    if config is None:
      parser.error("--write_random needs --config (the architecture to write)")
    names = random_checkpoint.write_random_checkpoint(args.write_random, config, seed=args.seed,
                                                      num_shards=args.shards, tokens=tokens)
    print(f"wrote {len(names)} shards of a random {dream.count_params(config):,}-parameter Dream "
          f"to {args.write_random}")
    return 0
  if not args.hf_dir:
    parser.error("pass --hf_dir (or --write_random)")
  try:
    args.hf_dir = resolve(args.hf_dir, "--hf_dir")     # a Hub name: downloaded once
    if config is None:
      config = hf_layout.config_from_hf_json(os.path.join(args.hf_dir, hf_layout.CONFIG_JSON),
                                             **overrides)
  except errors.USER_ERRORS as e:          # podlab's errors: one line; anything else is a bug
    print(f"error: {e}", file=sys.stderr)
    return errors.exit_code(e)
  start = time.time()
  done = [0]
  total = len(hf_layout.param_sources(config))

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
    orbax_params.save_params(params, args.out, config)
    print(f"wrote orbax checkpoint {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
