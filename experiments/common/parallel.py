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

Model parallelism (a model's weights split over a second mesh axis, `MODEL_AXIS`): in training,
"fsdp" with `model_parallel` > 1 (below); Dream's sampler runs it by hand with `shard_map`
(experiments/diffucoder/model_sharding.py).

State sharding (`SHARDINGS`): `pmap_step` runs the same per-device program in one of two layouts of
the state that its `replicated_in` arguments carry, chosen per run (`use_sharding`, set by the
trainer from `config.sharding`), never by experiment code:
- "replicated": every device holds the whole state (pmap: data parallelism, the default);
- "fsdp": every state leaf larger than `FSDP_MIN_ELEMENTS` is split over the devices of all hosts
  along its largest axis that the device count divides (`fsdp_shardings`), between and during
  steps: parameters, optimizer moments, EMA. The step is `jit(vmap(fn, axis_name=AXIS))` with the
  state's `NamedSharding`s as in/out shardings and the per-device arguments split over `AXIS`:
  the named-axis collectives of `fn` (pmean/psum/pmin) reduce over the vmapped device axis, and
  XLA's SPMD partitioner reduces each gradient onto its owner's shard (reduce-scatters, or
  all-reduces and a slice). Where the step reads the state whole (`gather_state`, which
  `trainer.accumulated_update` applies to the parameters) XLA all-gathers the split leaves;
  elsewhere the partitioner chooses, and may gather the devices' activations instead. Per-device
  arguments and outputs keep pmap's host-local `[local devices, ...]` form.
- "fsdp" with `model_parallel` m > 1 (`use_sharding(..., model_parallel=m, model_spec=...)`): the
  mesh is (devices / m, m) of axes (AXIS, MODEL_AXIS); `fn` runs once per data group of m devices
  (per-device arguments: `[local_rows(), ...]`), each state leaf is also split over MODEL_AXIS as
  `model_spec` names, and `gather_state` gathers over AXIS only: XLA's partitioner splits the
  group's matmuls and places their collectives. The numbers are those of "replicated" on the
  groups.

  with parallel.use_sharding("fsdp"):
    p_step = parallel.pmap_step(step, replicated_in=(0,), out_axes=(None, 0))
    w = parallel.put_state(jnp.ones(4 * jax.device_count()))   # split over every device
    w, s = p_step(w, x)                                         # the same numbers as above
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
from typing import Any, Callable, Iterator, Optional, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"
"""The one mesh axis of podlab's data parallelism: pmapped steps' collectives, `global_mesh()`,
`local_mesh()` and the checkpoints' per-device arrays all use it."""

MODEL_AXIS = "model"
"""The second mesh axis: a model's weights split over the chips of a data group (Megatron style).
Dream's sampler runs on it by hand (experiments/diffucoder/model_sharding.py); the trainer's "fsdp"
layout with `model_parallel > 1` splits state leaves over it as the experiment names
(`Experiment.model_axis_spec`) and leaves the collectives to XLA's partitioner."""

SHARDINGS = ("replicated", "fsdp")
"""The layouts of a step's state (`use_sharding`; `config.sharding` in experiments/common/config_utils.py)."""

FSDP_MIN_ELEMENTS = 2 ** 14
"""State leaves with fewer elements stay whole on every device under "fsdp" (norm scales, biases,
scalars): splitting them saves little memory and costs a gather each."""

ModelSpec = Callable[[str, str, int], Optional[Sequence[Optional[str]]]]
"""model_spec(module, name, ndim) -> per-axis mesh axis names of a Haiku parameter (None: not
split over the model axis); e.g. `dream.param_partition_spec`."""

_sharding = "replicated"
_model_parallel = 1
_model_spec: Optional[ModelSpec] = None


def sharding() -> str:
  """The state layout `pmap_step` and `put_state` use now ("replicated" or "fsdp")."""
  return _sharding


def model_parallel() -> int:
  """Chips per data group now (`use_sharding`): 1, or the size of the `MODEL_AXIS` mesh axis."""
  return _model_parallel


@contextlib.contextmanager
def use_sharding(name: str, model_parallel: int = 1,
                 model_spec: Optional[ModelSpec] = None) -> Iterator[None]:
  """Within the block, `pmap_step` and `put_state` use the state layout `name` (one of SHARDINGS).
  The trainer wraps a run in it (config.sharding, config.model_parallel; `trainer.state_layout`);
  experiments never choose the layout.

  `model_parallel` > 1 (with "fsdp" only): the devices form a (devices / m) x m mesh of axes
  (AXIS, MODEL_AXIS); the per-device step runs once per data group of m chips, and every state
  leaf is split over MODEL_AXIS where `model_spec(module, name, ndim)` says (the last two dict keys
  of its path: a Haiku parameter, or an optimizer moment of one) and over AXIS as "fsdp" splits."""
  global _sharding, _model_parallel, _model_spec
  if name not in SHARDINGS:
    raise ValueError(f"sharding={name!r}: must be one of {SHARDINGS}")
  if not isinstance(model_parallel, (int, np.integer)) or model_parallel < 1:
    raise ValueError(f"model_parallel={model_parallel!r}: must be a positive integer")
  if model_parallel > 1 and (name != "fsdp" or model_spec is None):
    raise ValueError(f"model_parallel={model_parallel} needs sharding='fsdp' and a model_spec "
                     f"(got sharding={name!r}, model_spec={model_spec!r})")
  previous = _sharding, _model_parallel, _model_spec
  _sharding, _model_parallel, _model_spec = name, int(model_parallel), model_spec
  try:
    yield
  finally:
    _sharding, _model_parallel, _model_spec = previous


def step_mesh(devices: Sequence[Any]) -> Mesh:
  """The mesh of a step over `devices` (in order): 1-D (AXIS,), or with `model_parallel()` m > 1
  (devices / m, m) of axes (AXIS, MODEL_AXIS), a data group being m consecutive devices (the same
  host: m must divide the devices per host)."""
  devices = np.array(list(devices))
  m = _model_parallel
  if m == 1:
    return Mesh(devices, (AXIS,))
  if devices.size % m:
    raise ValueError(f"model_parallel={m} does not divide the {devices.size} devices; use a "
                     "divisor of the devices per host")
  return Mesh(devices.reshape(devices.size // m, m), (AXIS, MODEL_AXIS))


def global_mesh() -> Mesh:
  """Mesh over all devices of all processes, ordered by (process index, device id), so each
  process owns one contiguous block: row `i` of a host-local `[local rows, ...]` array is global row
  `process_index * local rows + i` when sharded `P(AXIS)`. 1-D, or (data groups, model_parallel())
  (`step_mesh`)."""
  return step_mesh(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))


def local_mesh() -> Mesh:
  """The mesh over this process's devices (the devices a pmapped step runs on), as `step_mesh`."""
  return step_mesh(jax.local_devices())


def local_rows() -> int:
  """Rows of this process in a per-device argument: its devices, or data groups under
  model_parallel() > 1."""
  return jax.local_device_count() // _model_parallel


def replicate(tree: Any) -> Any:
  """Puts every leaf on all local devices, replicated (no leading device axis)."""
  return jax.device_put(tree, NamedSharding(local_mesh(), PartitionSpec()))


def fsdp_spec(shape: Sequence[int], devices: int,
              model: Sequence[Optional[str]] = ()) -> PartitionSpec:
  """Where "fsdp" splits a leaf of `shape` over `devices` (the AXIS size): its largest axis that
  `devices` divides (the first of equal ones), or nowhere for a leaf under `FSDP_MIN_ELEMENTS`
  elements or with no such axis. `model`: the leaf's split over MODEL_AXIS (per-axis names, as
  `use_sharding`'s model_spec returns), kept; AXIS then takes another axis."""
  model = tuple(model) + (None,) * (len(shape) - len(model))
  if int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_ELEMENTS:
    return PartitionSpec(*model) if any(model) else PartitionSpec()
  axes = [i for i, n in enumerate(shape) if n % devices == 0 and model[i] is None]
  if not axes:
    return PartitionSpec(*model) if any(model) else PartitionSpec()
  axis = max(axes, key=lambda i: (shape[i], -i))
  return PartitionSpec(*[AXIS if i == axis else model[i] for i in range(len(shape))])


def _model_axes(path: Sequence[Any], shape: Sequence[int], mesh: Mesh) -> tuple:
  """The MODEL_AXIS split of the state leaf at `path` on `mesh` (() when the mesh has no model
  axis or the spec names none); a split that the model axis does not divide is a ValueError."""
  if MODEL_AXIS not in mesh.shape or _model_spec is None:
    return ()
  keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  if len(keys) < 2:
    return ()
  spec = tuple(_model_spec(str(keys[-2]), str(keys[-1]), len(shape)) or ())
  m = mesh.shape[MODEL_AXIS]
  for i, axis in enumerate(spec):
    if axis is not None and shape[i] % m:
      raise ValueError(f"{keys[-2]}/{keys[-1]}: axis {i} of shape {tuple(shape)} is split over "
                       f"model_parallel={m}, which does not divide it; use a divisor of {shape[i]}")
  return spec


def fsdp_shardings(tree: Any, mesh: Optional[Mesh] = None) -> Any:
  """`NamedSharding` of every leaf of `tree` (arrays or ShapeDtypeStructs) under "fsdp" on `mesh`
  (default `global_mesh()`), model-axis splits included."""
  mesh = global_mesh() if mesh is None else mesh
  size = mesh.shape[AXIS]
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, fsdp_spec(np.shape(x), size,
                                                    _model_axes(path, np.shape(x), mesh))), tree)


def model_shardings(tree: Any, mesh: Mesh) -> Any:
  """`NamedSharding` of every leaf of `tree` split over MODEL_AXIS only (whole over AXIS): what
  `gather_state` makes of the state inside a step."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, PartitionSpec(*_model_axes(path, np.shape(x), mesh))),
      tree)


def state_shardings(tree: Any, mesh: Optional[Mesh] = None) -> Any:
  """The shardings `put_state` gives `tree` in the current layout (None leaves: replicated state
  is placed by `replicate`)."""
  if _sharding == "fsdp":
    return fsdp_shardings(tree, mesh)
  return jax.tree.map(lambda _: None, tree)


_tracing_mesh: Optional[Mesh] = None      # the mesh of the "fsdp" step being traced, else None


@contextlib.contextmanager
def _tracing(mesh: Mesh) -> Iterator[None]:
  global _tracing_mesh
  previous, _tracing_mesh = _tracing_mesh, mesh
  try:
    yield
  finally:
    _tracing_mesh = previous


def constrain_state(tree: Any) -> Any:
  """Inside a step traced for "fsdp": `tree` (values shaped like state leaves, e.g. gradients that
  were just reduced over the devices) laid out as the state is, split by `fsdp_shardings`, so XLA
  keeps only each device's block (a reduce-scatter instead of an all-reduce). Anywhere else (the
  "replicated" layout, shape-only tracing) `tree` unchanged."""
  if _tracing_mesh is None:
    return tree
  return jax.lax.with_sharding_constraint(tree, fsdp_shardings(tree, _tracing_mesh))


def gather_state(tree: Any) -> Any:
  """Inside a step traced for "fsdp": `tree` (state-shaped values, e.g. the parameters a
  micro-batch's forward pass reads) whole on every device (split only over MODEL_AXIS where the
  model spec says), so XLA all-gathers the split weights and keeps the per-device batch on its
  device (without it the partitioner may instead gather the activations of every device's batch
  and compute with the split weights). Anywhere else `tree` unchanged."""
  if _tracing_mesh is None:
    return tree
  return jax.lax.with_sharding_constraint(tree, model_shardings(tree, _tracing_mesh))


def put_state(tree: Any) -> Any:
  """The state onto the devices in the current layout: `replicate` for "replicated"; for "fsdp"
  each leaf split by `fsdp_shardings` over the devices of all hosts (every host passes the whole
  value; each device keeps its block)."""
  if _sharding != "fsdp":
    return replicate(tree)

  def put(x, s):
    if isinstance(x, jax.Array) and x.sharding == s:
      return x                       # already split so (a restored checkpoint)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, s)    # another global layout: XLA moves the blocks
    value = np.asarray(x)
    return jax.make_array_from_callback(value.shape, s, lambda index: value[index])
  return jax.tree.map(put, tree, fsdp_shardings(tree))


def shard(tree: Any) -> Any:
  """Puts host arrays with leading axis `local_rows()` onto the local devices, one slice each (one
  per data group, on each of its chips, under model_parallel() > 1)."""
  return jax.device_put(tree, NamedSharding(local_mesh(), PartitionSpec(AXIS)))


def unreplicate(tree: Any) -> Any:
  """Host numpy copy of a replicated value: reads one device's copy (not `x[0]`, which gathers). A
  leaf split by "fsdp" is gathered (across processes too)."""
  def one(x):
    if isinstance(x, jax.Array) and len(x.addressable_shards) > 1 and x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_shards[0].data)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(one, tree)


def first_local(x: Any) -> np.ndarray:
  """Host copy of the first local device's part of `x` (a per-device output keeps its length-1
  device axis); no cross-device gather, unlike `x[0]`."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)


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


class _FsdpStep:
  """`pmap_step` under "fsdp": `jit(vmap(fn, axis_name=AXIS))` over a 1-D mesh of `devices` (default
  every device of every process), compiled once per argument signature. Arguments and results keep
  pmap's conventions: state (`replicated_in`, out_axes None) as whole-shaped arrays, split by
  `fsdp_shardings`; per-device values as this host's `[local devices, ...]` rows (or, when lowering
  for a TPU topology's `devices`, `[len(devices), ...]`)."""

  def __init__(self, fn: Callable[..., Any], in_axes: tuple, out_axes: Any,
               donate_argnums: Sequence[int], devices: Optional[Sequence[Any]],
               compiler_options: dict):
    self._vmapped = jax.vmap(fn, in_axes=in_axes, out_axes=out_axes, axis_name=AXIS)
    self._in_axes, self._out_axes = in_axes, out_axes
    self._donate = tuple(donate_argnums)
    self._mesh = global_mesh() if devices is None else step_mesh(devices)
    self.compiler_options = dict(compiler_options)
    self._compiled = {}

  def _jitted(self, args: Sequence[Any]) -> Callable[..., Any]:
    """The jitted program for global-shaped `args` (arrays or ShapeDtypeStructs)."""
    split = NamedSharding(self._mesh, PartitionSpec(AXIS))
    in_shardings = tuple(
        fsdp_shardings(a, self._mesh) if axis is None else jax.tree.map(lambda _: split, a)
        for a, axis in zip(args, self._in_axes))
    with _tracing(self._mesh):
      out = jax.eval_shape(self._vmapped, *args)
    out_shardings = jax.tree_util.tree_map(
        lambda axis, sub: (fsdp_shardings(sub, self._mesh) if axis is None
                           else jax.tree.map(lambda _: split, sub)),
        self._out_axes, out, is_leaf=lambda x: x is None)
    jitted = jax.jit(self._vmapped, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=self._donate)
    mesh = self._mesh

    class _Traced:                     # lowers (traces) with `constrain_state` pointing at the mesh
      @staticmethod
      def lower(*a):
        with _tracing(mesh):
          return jitted.lower(*a)
    return _Traced

  def _global(self, args: Sequence[Any]) -> tuple:
    """Per-device arguments from this host's rows to global arrays over the mesh (no copy)."""
    return tuple(a if axis is None else multihost_utils.host_local_array_to_global_array(
        a, self._mesh, PartitionSpec(AXIS)) for a, axis in zip(args, self._in_axes))

  def lower(self, *args) -> Any:
    """Lowers for global-shaped `args` (per-device leaves `[len(devices), ...]`), e.g. a TPU
    topology's abstract devices (experiments/tools/tpu.py)."""
    return self._jitted(args).lower(*args)

  def __call__(self, *args):
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
      return self._vmapped(*args)            # traced (jax.eval_shape, an outer jit): shapes only
    gargs = self._global(args)
    key = _signature(gargs)
    compiled = self._compiled.get(key)
    if compiled is None:
      compiled = self._jitted(gargs).lower(*gargs).compile(
          compiler_options=self.compiler_options or None)
      self._compiled[key] = compiled
    out = compiled(*gargs)
    return jax.tree_util.tree_map(
        lambda axis, sub: sub if axis is None else multihost_utils.global_array_to_host_local_array(
            sub, self._mesh, PartitionSpec(AXIS)),
        self._out_axes, out, is_leaf=lambda x: x is None)


def pmap_step(fn: Callable[..., Any], *, replicated_in: Sequence[int] = (), out_axes: Any = 0,
              donate_argnums: Sequence[int] = (),
              devices: Optional[Sequence[Any]] = None,
              compiler_options: Optional[dict] = None) -> Callable[..., Any]:
  """The per-device step `fn` over the devices, in the current state layout (`use_sharding`):
  `jax.pmap(fn)` with axis name `AXIS` ("replicated"), or `_FsdpStep` ("fsdp"); `fn` and the
  calling convention are the same in both.

  Args:
    fn: the per-device step (positional arguments only).
    replicated_in: positions of arguments that are the same on every device (`in_axes=None`); the
      others carry a leading device axis.
    out_axes: as in `jax.pmap`: None for outputs that are the same on every device (they stay
      replicated, with no device axis), 0 for per-device outputs; a tuple for a tuple of outputs.
    donate_argnums: arguments whose buffers may be reused for outputs (state updated in place).
    devices: the devices to map over, in order (default: this process's devices, as `jax.pmap`;
      under "fsdp" every process's); `experiments.tools.tpu` passes a TPU topology's devices to
      compile for a whole slice.
    compiler_options: XLA options for this step's compiles (`cpu_features.CPU_DOTS_ONLY`; callers
      pass them only for a CPU target). The step is then compiled ahead of time on its first call per
      argument signature. Single-process only under "replicated": with several processes the
      options are not applied (JAX's ahead-of-time pmap has no host-local to global conversion)
      and the step is plain.
  """
  num_args = len(inspect.signature(fn).parameters)
  in_axes = tuple(None if i in replicated_in else 0 for i in range(num_args))
  if _sharding == "fsdp":
    return _FsdpStep(fn, in_axes, out_axes, donate_argnums, devices, dict(compiler_options or {}))
  pmapped = jax.pmap(fn, axis_name=AXIS, in_axes=in_axes, out_axes=out_axes,
                     donate_argnums=tuple(donate_argnums), devices=devices)
  if compiler_options and jax.process_count() == 1:
    return _CompiledOnCall(pmapped, compiler_options)
  return pmapped


def device_indices() -> np.ndarray:
  """Global index of each local device ([local_rows()] int32: data groups under model_parallel()
  > 1), passed INTO pmapped steps.

  Follows jaxline: the host and device ids are inputs of the step (for per-device RNG), not read inside.
  """
  n = local_rows()
  return (jax.process_index() * n + np.arange(n)).astype(np.int32)


_STEP_DEVICE_INDEX: list = []


@contextlib.contextmanager
def step_device_index(index: Any) -> Iterator[None]:
  """Holds this device's global index (the pmapped step's `device_indices()` argument) while the
  trainer traces an experiment's train step (experiments/common/trainer.guarded_step)."""
  _STEP_DEVICE_INDEX.append(index)
  try:
    yield
  finally:
    _STEP_DEVICE_INDEX.pop()


def device_index() -> Any:
  """This device's global index ([] int32, process-major) inside a train step the trainer runs: the
  step's input (jaxline), for a step that needs more than its rng (TRM's sharded puzzle table)."""
  if not _STEP_DEVICE_INDEX:
    raise RuntimeError("parallel.device_index() is read inside a train step run by "
                       "trainer.parallel_train_step (the trainer passes the index in)")
  return _STEP_DEVICE_INDEX[-1]

