"""How a checkpoint's leaves travel between a run's arrays and orbax (experiments/common/
checkpointing.py's two kinds of state).

  replicated   one host copy of a leaf every device holds alike (`replicated_to_numpy`: a
               pmap-stacked array loses its device axis; under fsdp a split leaf stays the global
               array it is) and the shape it restores to (`replicated_spec`)
  per-device   a host's rows `[local_device_count, ...]` as one global array over every device of
               every process (`to_global`, checked by `per_device_spec`) and back (`to_local`)

Errors name the leaf (`keystr`: the item and its path) and the fix (errors.CheckpointError).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding
import numpy as np

from experiments.common import errors


def keystr(prefix: str, path: tuple[Any, ...]) -> str:
  """A leaf's name in messages: the item (`prefix`) and its path in the tree."""
  return prefix + jax.tree_util.keystr(path)


def is_pmap_stacked(x: jax.Array) -> bool:
  """True for a `[n, ...]` array whose leading axis is split one row per device (pmap layout)."""
  sharding = x.sharding
  if x.ndim == 0 or not isinstance(sharding, NamedSharding):
    return False
  spec = sharding.spec
  if len(spec) == 0 or spec[0] is None:
    return False
  axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
  rows = int(np.prod([sharding.mesh.shape[a] for a in axes]))
  return rows == x.shape[0] and all(s is None for s in spec[1:])


def replicated_to_numpy(name: str, x: Any, split: bool) -> Any:
  """One host copy of a replicated leaf (pmap-stacked arrays lose their device axis); with `split`
  (a state laid out by `parallel.Rules("fsdp")`) a leaf split over the devices stays the global
  array it is (every process writes its blocks)."""
  if not isinstance(x, jax.Array):
    return np.asarray(x)
  if split and not x.sharding.is_fully_replicated:
    return x
  # `x[0]` would run a computation (and fail on non-addressable arrays): read a local shard.
  data = np.array(x.addressable_shards[0].data, copy=True)
  if is_pmap_stacked(x):
    return data[0]
  if x.sharding.is_fully_replicated:
    return data
  raise errors.CheckpointError(
      f"{name}: jax.Array of shape {x.shape} with sharding {x.sharding} is neither replicated nor "
      "pmap-stacked, so no single shard holds its value. Fix: pass it in `per_device` "
      "(leading axis = local_device_count) or replicate it first.")


def replicated_spec(name: str, x: Any) -> jax.ShapeDtypeStruct:
  """Shape/dtype a replicated template leaf restores to (the value `replicated_to_numpy` gives);
  a ShapeDtypeStruct with a `sharding` keeps it (restored as a jax.Array split that way)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  if isinstance(x, jax.Array):
    shape = x.shape[1:] if is_pmap_stacked(x) else x.shape
    return jax.ShapeDtypeStruct(shape, x.dtype)
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype))
  try:
    value = np.asarray(x)
  except Exception as e:  # pylint: disable=broad-except
    raise errors.CheckpointError(f"{name}: template leaf {x!r} is not an array. Fix: use an array "
                                 "or jax.ShapeDtypeStruct.") from e
  return jax.ShapeDtypeStruct(value.shape, value.dtype)


def per_device_spec(name: str, x: Any, local_devices: int) -> jax.ShapeDtypeStruct:
  """Shape/dtype of a per-device leaf `[local_devices, ...]` (checked: its leading axis, and a
  dtype a jax.Array keeps)."""
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    shape, dtype = tuple(x.shape), np.dtype(x.dtype)
  else:
    value = np.asarray(x)
    shape, dtype = value.shape, value.dtype
  if len(shape) == 0 or shape[0] != local_devices:
    raise errors.CheckpointError(
        f"{name}: shape {shape} must have leading axis local_device_count={local_devices}. Fix: "
        "stack one row per local device (pmap layout), or move replicated state to `replicated`.")
  if jax.dtypes.canonicalize_dtype(dtype) != dtype:
    raise errors.CheckpointError(
        f"{name}: dtype {dtype} does not survive a jax.Array with jax_enable_x64 off (it would "
        f"become {jax.dtypes.canonicalize_dtype(dtype)}). Fix: cast it, e.g. to float32/int32.")
  return jax.ShapeDtypeStruct(shape, dtype)


def to_global(name: str, x: Any, local_devices: int, hosts: int,
              sharding: jax.sharding.Sharding) -> jax.Array:
  """A host-local per-device leaf `[local_devices, ...]` as one global array `[hosts *
  local_devices, ...]` with `sharding` (rows over every device of every process)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    raise errors.CheckpointError(f"{name}: already a global array spanning other processes. Fix: "
                                 "pass this host's `[local_device_count, ...]` rows.")
  value = np.asarray(x)
  per_device_spec(name, value, local_devices)
  return jax.make_array_from_process_local_data(sharding, value,
                                                (hosts * local_devices,) + value.shape[1:])


def to_local(x: jax.Array) -> np.ndarray:
  """This process' rows of a global array sharded over the run's mesh, in row order (one copy
  of each: a data group's devices hold the same rows)."""
  shards = sorted((s for s in x.addressable_shards if s.replica_id == 0),
                  key=lambda s: s.index[0].start or 0)
  return np.concatenate([np.asarray(s.data) for s in shards], axis=0)
