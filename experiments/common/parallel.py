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

  # Model parallelism: a (data, model) mesh, weights split over MODEL_AXIS, one shard_map step.
  from jax.sharding import PartitionSpec as P
  mesh = parallel.mesh_2d(1, jax.local_device_count())   # every device on the model axis
  def matvec(w, x):                                  # w: this device's rows, x: its columns
    return jax.lax.psum(x @ w, parallel.MODEL_AXIS)
  f = parallel.shard_map_step(matvec, mesh, in_specs=(P(parallel.MODEL_AXIS, None),
                              P(parallel.AXIS, parallel.MODEL_AXIS)), out_specs=P(parallel.AXIS))
  n = jax.local_device_count()
  y = f(jnp.ones((2 * n, 3)), jnp.ones((2, 2 * n)))  # [2, 3], every entry 2n

`mesh_2d(data, model)` and `shard_map_step(fn, mesh, in_specs, out_specs)` are the model-parallel
counterparts of `local_mesh` and `pmap_step`: the same per-device-program style, with
`PartitionSpec`s saying which mesh axes split each argument (`MODEL_AXIS` for weights).
"""

from __future__ import annotations

import concurrent.futures
import inspect
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"
"""The one mesh axis of podlab's data parallelism: pmapped steps' collectives, `global_mesh()`,
`local_mesh()` and the checkpoints' per-device arrays all use it."""

MODEL_AXIS = "model"
"""The mesh axis that model-parallel weights are split over (`mesh_2d`); collectives of a sharded
layer (`lax.psum` of row-split matmuls) run over it."""


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


CPU_DOTS_ONLY = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
"""XLA compiler options for a CPU program: YNNPACK (XLA:CPU's matmul library) gets single dots only,
never a dot fused with the reduction after it. XLA 0.10.2's default also fuses a dot with a following
reduce (e.g. a projection, the residual add and RMSNorm's sum of squares in one YNNPACK fusion), and
those fused kernels ran at a third to a half of the plain dot's rate on the dev CPU (docs/benchmarks.md).
Options of one compile (`pmap_step(compiler_options=...)`), not of the process: other programs keep
XLA's defaults."""


def _signature(args: Any) -> Any:
  """(tree structure, ((shape, dtype) per leaf)) of arrays or ShapeDtypeStructs."""
  leaves, tree = jax.tree.flatten(args)
  return tree, tuple((tuple(x.shape), np.dtype(x.dtype)) if hasattr(x, "dtype")
                     else (np.shape(x), np.result_type(x)) for x in leaves)


class _CompiledOnCall:
  """A pmapped function compiled ahead of time with XLA `compiler_options`, once per argument
  signature (tree structure, shapes, dtypes): on its first call with that signature, or in a
  background thread from `precompile`. Traced calls (`jax.eval_shape`) go to the pmapped function;
  `lower` is its own (callers compiling by hand pass `compiler_options` themselves)."""

  def __init__(self, pmapped: Callable[..., Any], compiler_options: dict):
    self._pmapped = pmapped
    self.compiler_options = dict(compiler_options)
    self.lower = pmapped.lower
    self._compiled = {}          # signature -> Compiled, or a Future of one (precompile)

  def precompile(self, *args) -> Any:
    """Lowers for `args` (arrays or ShapeDtypeStructs) on this thread and compiles in a background
    thread, so that the host can do other start-up work meanwhile (XLA compiles without the GIL);
    the first call with that signature waits for it. Returns the Lowered (`out_info`: the outputs'
    shapes)."""
    lowered = self._pmapped.lower(*args)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="podlab-compile")
    self._compiled[_signature(args)] = pool.submit(lowered.compile,
                                                   compiler_options=self.compiler_options)
    pool.shutdown(wait=False)
    return lowered

  def __call__(self, *args):
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
      return self._pmapped(*args)            # traced (jax.eval_shape, an outer jit): no compile
    key = _signature(args)
    compiled = self._compiled.get(key)
    if isinstance(compiled, concurrent.futures.Future):
      compiled = self._compiled[key] = compiled.result()
    if compiled is None:
      compiled = self._pmapped.lower(*args).compile(compiler_options=self.compiler_options)
      self._compiled[key] = compiled
    return compiled(*args)


def pmap_step(fn: Callable[..., Any], *, replicated_in: Sequence[int] = (), out_axes: Any = 0,
              donate_argnums: Sequence[int] = (),
              devices: Optional[Sequence[Any]] = None,
              compiler_options: Optional[dict] = None) -> Callable[..., Any]:
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
    compiler_options: XLA options for this step's compiles (e.g. `CPU_DOTS_ONLY`; callers pass
      them only for a CPU target). The step is then compiled ahead of time on its first call per
      argument signature. Single-process only: with several processes the options are not applied
      (JAX's ahead-of-time pmap has no host-local to global conversion) and the step is plain.
  """
  num_args = len(inspect.signature(fn).parameters)
  in_axes = tuple(None if i in replicated_in else 0 for i in range(num_args))
  pmapped = jax.pmap(fn, axis_name=AXIS, in_axes=in_axes, out_axes=out_axes,
                     donate_argnums=tuple(donate_argnums), devices=devices)
  if compiler_options and jax.process_count() == 1:
    return _CompiledOnCall(pmapped, compiler_options)
  return pmapped


def device_indices() -> np.ndarray:
  """Global index of each local device ([local_device_count] int32), passed INTO pmapped steps.

  Follows jaxline: the host and device ids are inputs of the step (for per-device RNG), not read inside.
  """
  n = jax.local_device_count()
  return (jax.process_index() * n + np.arange(n)).astype(np.int32)


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
  (`P()` = the same on every device). The model-parallel counterpart of `pmap_step` (which is
  `jit(shard_map)` over the 1-D `AXIS` mesh). Collectives inside name `AXIS` / `MODEL_AXIS`.
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
