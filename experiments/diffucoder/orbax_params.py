"""Converted Dream parameters as an orbax checkpoint: writing, and reading them back (sharded too).

`save_params` writes the Haiku tree at DIR/params with the DreamConfig beside it
(DIR/dream_config.json); `restore_params` reads it back into any sharding, each array straight into
its devices (a device reads only its block), after `saved_config` checked the architecture;
`restore_sharded` restores into the model-parallel layout of a (data, model) mesh. Orbax and
TensorFlow are imported only when saving or restoring. experiments/diffucoder/convert.py's
`load_checkpoint` picks this or the Hugging Face reader by what a folder holds.

Synopsis:

  import tempfile
  import jax, jax.numpy as jnp
  from experiments.diffucoder import orbax_params
  from modules import dream

  cfg = dream.tiny_config()
  tokens = jnp.zeros((1, 4), jnp.int32)
  params = dream.dream_forward(cfg).init(jax.random.key(0), tokens, tokens >= 0)
  d = tempfile.mkdtemp()
  orbax_params.save_params(params, d, cfg)
  assert orbax_params.saved_config(d) == cfg
  restored = orbax_params.restore_params(d, cfg)
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Optional

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
import numpy as np

from experiments.diffucoder import model_sharding
from experiments.diffucoder.hf_layout import HF_FIELDS, ConversionError, model_overrides
from modules import dream

PODLAB_CONFIG_JSON = "dream_config.json"        # written next to an orbax checkpoint


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
  differ = [f for f in HF_FIELDS.values() if getattr(saved, f) != getattr(config, f)]
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
