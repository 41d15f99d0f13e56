"""Model parallelism for Dream / DiffuCoder: a (data, model) mesh, weights split over `MODEL_AXIS`,
one `shard_map` step. Only this experiment splits a model's weights over devices (a 7.6B sampler
does not fit one chip); the trainer's data parallelism and FSDP are experiments/common/parallel.py.

`mesh_2d(data, model)` and `shard_map_step(fn, mesh, in_specs, out_specs)` are the sampler's
hand-written model-parallel counterparts of `parallel.Rules.local_mesh` and `parallel.compile_step`
(whose model axis is left to XLA's partitioner): the same per-device-program style,
with `PartitionSpec`s saying which mesh axes split each argument (`MODEL_AXIS` for weights,
`parallel.AXIS` for the batch rows). `put_sharded` places one host array block by block.

Synopsis:

  import jax, jax.numpy as jnp
  from jax.sharding import PartitionSpec as P
  from experiments.common import parallel
  from experiments.diffucoder import model_sharding

  ms = model_sharding
  mesh = ms.mesh_2d(1, jax.local_device_count())     # every device on the model axis
  def matvec(w, x):                                  # w: this device's rows, x: its columns
    return jax.lax.psum(x @ w, ms.MODEL_AXIS)
  f = ms.shard_map_step(matvec, mesh, in_specs=(P(ms.MODEL_AXIS, None),
                        P(parallel.AXIS, ms.MODEL_AXIS)), out_specs=P(parallel.AXIS))
  n = jax.local_device_count()
  y = f(jnp.ones((2 * n, 3)), jnp.ones((2, 2 * n)))  # [2, 3], every entry 2n
  w = ms.put_sharded(jnp.ones((2 * n, 3)), mesh, P(ms.MODEL_AXIS, None))   # 2 rows per device
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from experiments.common.parallel import AXIS, MODEL_AXIS    # noqa: F401  (MODEL_AXIS: `mesh_2d`'s
                                                            # second axis; a sharded layer's psums)


def mesh_2d(data: int, model: int, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A (data, model) mesh of `data * model` devices: rows of the batch split over `AXIS`, weights
  over `MODEL_AXIS`. Device d * model + j is at [d, j], so a model group is `model` consecutive
  devices (neighbours on the chip grid / the same host). `devices`: default this process's devices;
  the first data * model of them are used. A mesh larger than the devices is a ValueError naming
  both sizes."""
  devices = list(jax.local_devices() if devices is None else devices)
  for name, n in (("data", data), ("model", model)):
    if not isinstance(n, (int, np.integer)) or n < 1:
      raise ValueError(f"mesh_2d: {name}={n!r} must be a positive integer")
  if data * model > len(devices):
    raise ValueError(f"mesh_2d: a {data} x {model} (data x model) mesh needs {data * model} devices "
                     f"and there are {len(devices)}; use data * model <= {len(devices)}")
  return Mesh(np.array(devices[:data * model]).reshape(data, model), (AXIS, MODEL_AXIS))


def shard_map_step(fn: Callable[..., Any], mesh: Mesh, *, in_specs: Any, out_specs: Any,
                   donate_argnums: Sequence[int] = ()) -> Callable[..., Any]:
  """`jit(shard_map(fn))` over `mesh`: `fn` is the per-device program; `in_specs` / `out_specs`
  (PartitionSpec pytrees, a prefix of the arguments / outputs) say which mesh axes split each array
  (`P()` = the same on every device). Manual over both axes, unlike `parallel.compile_step`
  (manual over `AXIS`, the model axis left to XLA's partitioner). Collectives inside name `AXIS` / `MODEL_AXIS`.
  `check_vma` is off: values made equal over an axis by a collective (psum, pmax) are returned
  unsplit over it without the replication checker's proof (inference programs; no autodiff)."""
  mapped = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
  return jax.jit(mapped, donate_argnums=tuple(donate_argnums))


def put_sharded(x: Any, mesh: Mesh, spec: PartitionSpec) -> jax.Array:
  """One host array onto `mesh`, split by `spec`: each device gets only its block (built by slicing
  the host array per device, so no device ever holds the whole array)."""
  sharding = NamedSharding(mesh, spec)
  x = np.asarray(x) if not isinstance(x, jax.Array) else x
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
