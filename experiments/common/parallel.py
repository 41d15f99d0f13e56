"""The one parallel-step wrapper of podlab: `pmap` over this host's devices, collectives over all hosts.

JAX 0.10's `pmap` is `jit(shard_map)`. State that is the same on every device (parameters, optimizer
state, EMA) is passed with `in_axes=None` and returned with `out_axes=None`: it stays replicated on the
devices between steps, with no per-device copies made by the caller. Per-device values (the batch, the
TRM ACT carry, metrics) have a leading axis of length `jax.local_device_count()`. Collectives
(`lax.pmean`/`psum`/`all_gather` over `AXIS`) span every device of every host.

Synopsis:

  import jax, jax.numpy as jnp
  from experiments.common import parallel

  def step(w, x):                                  # w replicated, x per device
    g = jax.lax.pmean(jnp.sum(x) * w, parallel.AXIS)
    return w - 0.1 * g, jnp.sum(x)
  p_step = parallel.pmap_step(step, replicated_in=(0,), out_axes=(None, 0))
  w = parallel.replicate(jnp.ones(3))
  x = jnp.ones((jax.local_device_count(), 2))
  w, s = p_step(w, x)                              # w: replicated [3]; s: [local_devices]
  parallel.unreplicate(w)                          # host numpy copy of the replicated value
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"
"""The one mesh axis of podlab's data parallelism: pmapped steps' collectives, `global_mesh()`,
`local_mesh()` and the checkpoints' per-device arrays all use it."""


def global_mesh() -> Mesh:
  """1-D mesh over all devices of all processes, ordered by (process index, device id), so each
  process owns one contiguous block: row `i` of a host-local `[local_device_count, ...]` array is
  global row `process_index * local_device_count + i` when sharded `P(AXIS)`."""
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  return Mesh(np.array(devices), (AXIS,))


def local_mesh() -> Mesh:
  """1-D mesh over this process's devices (the devices a pmapped step runs on)."""
  return Mesh(np.array(jax.local_devices()), (AXIS,))


def replicate(tree: Any) -> Any:
  """Puts every leaf on all local devices, replicated (no leading device axis)."""
  return jax.device_put(tree, NamedSharding(local_mesh(), PartitionSpec()))


def shard(tree: Any) -> Any:
  """Puts host arrays with leading axis `local_device_count` onto the local devices, one slice each."""
  return jax.device_put(tree, NamedSharding(local_mesh(), PartitionSpec(AXIS)))


def unreplicate(tree: Any) -> Any:
  """Host numpy copy of a replicated value: reads one device's copy (not `x[0]`, which gathers)."""
  def one(x):
    if isinstance(x, jax.Array) and len(x.addressable_shards) > 1 and x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_shards[0].data)
    return np.asarray(x)
  return jax.tree.map(one, tree)


def first_local(x: Any) -> np.ndarray:
  """Host copy of the first local device's part of `x` (a per-device output keeps its length-1
  device axis); no cross-device gather, unlike `x[0]`."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)


def pmap_step(fn: Callable[..., Any], *, replicated_in: Sequence[int] = (), out_axes: Any = 0,
              donate_argnums: Sequence[int] = (),
              devices: Optional[Sequence[Any]] = None) -> Callable[..., Any]:
  """`jax.pmap(fn)` over local devices (or `devices`) with axis name `AXIS`.

  Args:
    fn: the per-device step (positional arguments only).
    replicated_in: positions of arguments that are the same on every device (`in_axes=None`); the
      others carry a leading device axis.
    out_axes: as in `jax.pmap`: None for outputs that are the same on every device (they stay
      replicated, with no device axis), 0 for per-device outputs; a tuple for a tuple of outputs.
    donate_argnums: arguments whose buffers may be reused for outputs (state updated in place).
    devices: the devices to map over, in order (default: this process's devices, as `jax.pmap`);
      `experiments.common.tpu` passes a TPU topology's devices to compile for a whole slice.
  """
  num_args = len(inspect.signature(fn).parameters)
  in_axes = tuple(None if i in replicated_in else 0 for i in range(num_args))
  return jax.pmap(fn, axis_name=AXIS, in_axes=in_axes, out_axes=out_axes,
                  donate_argnums=tuple(donate_argnums), devices=devices)


def device_indices() -> np.ndarray:
  """Global index of each local device ([local_device_count] int32), passed INTO pmapped steps.

  Follows jaxline: the host and device ids are inputs of the step (for per-device RNG), not read inside.
  """
  n = jax.local_device_count()
  return (jax.process_index() * n + np.arange(n)).astype(np.int32)
