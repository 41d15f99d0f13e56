"""The one step engine of podlab: `compile_step(fn, rules)`, `jit` of `shard_map` over one mesh.

An experiment writes a per-device step (collectives over `AXIS`: `lax.pmean`, `psum`, ...; the
design's pmap loop). `compile_step` runs it on every device of a (data, model) mesh for every state
layout, the way JAX 0.10's `pmap` is built (`jit` of `shard_map`, the same program for
"replicated"): training, evaluation, sampling, the dry run and the TPU compile all come through it.
Where the state lies is a value, `Rules` (its rule table), never a mode of the process:

- `REPLICATED` (`Rules()`): every device holds the whole state (data parallelism).
- `Rules("fsdp")`: every state leaf of at least `FSDP_MIN_ELEMENTS` elements is split over the data
  axis along its largest axis the device count divides (`fsdp_spec`), between and during steps.
- `Rules("fsdp", model_parallel=m, model_spec=spec)`: the mesh is (devices / m, m) of axes
  (AXIS, MODEL_AXIS); the step runs once per data group of m chips, each leaf is also split over
  MODEL_AXIS where `spec(module, name, ndim)` names it (the model's rule table, e.g.
  `dream.param_partition_spec`), and XLA's partitioner splits the group's matmuls over that axis
  (the shard_map is manual over AXIS only).

Arguments in `state_in` positions are state, laid out by the rules; the others are per-device: a
leading axis of this host's rows (`Rules.local_rows`), one per device or data group. The step sees
the state in one of two views:

- whole (the default; evaluation, sampling): split leaves are gathered at the step's entry.
- blocks (`blocks=True`: the trainer's step): each device holds its blocks of the split leaves, so
  the state costs 1/n of its size. The step reads what it needs whole with `gather_state` (an
  all-gather), averages gradients onto the blocks with `mean_state` (a reduce-scatter) and their
  norm with `global_norm`, and updates the blocks elementwise (`device_step.accumulated_update` does
  all of it). A new state value it returns whole is sliced to this device's block. Under
  REPLICATED these are `lax.pmean`, `optax.tree.norm` and the identity: the same program as pmap.

Since the step runs under `shard_map` for every layout, Pallas kernels (splash attention, the
fused head+loss, the fused MLP) run in every layout without a model axis.

Synopsis:

  import jax, jax.numpy as jnp
  from experiments.common import parallel

  def step(w, x):                                  # w: state, x: this device's rows
    g = jax.lax.pmean(jnp.sum(x) * w, parallel.AXIS)
    return w - 0.1 * g, jnp.sum(x)
  p_step = parallel.compile_step(step, parallel.REPLICATED, state_in=(0,), out_axes=(None, 0))
  w = parallel.put_state(jnp.ones(3), parallel.REPLICATED)
  x = jnp.ones((jax.local_device_count(), 2))
  w, s = p_step(w, x)                              # w: replicated [3]; s: [local devices]
  parallel.unreplicate(w)                          # host numpy copy of the state
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
from jax.experimental import multihost_utils
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"
"""The data axis of every mesh: the collectives of per-device steps and the checkpoints' per-device
rows."""

MODEL_AXIS = "model"
"""The second mesh axis: a model's weights split over the chips of a data group (Megatron style),
as `Rules.model_spec` names them."""

SHARDINGS = ("replicated", "fsdp")
"""The state layouts (`Rules.sharding`; `config.sharding`)."""

FSDP_MIN_ELEMENTS = 2 ** 14
"""State leaves with fewer elements stay whole on every device under "fsdp" (norm scales, biases,
scalars): splitting them saves little memory and costs a gather each."""

ModelSpec = Callable[[str, str, int], Optional[Sequence[Optional[str]]]]
"""model_spec(module, name, ndim) -> per-axis mesh axis names of a Haiku parameter (None: not
split over the model axis); e.g. `dream.param_partition_spec`."""


def fsdp_spec(shape: Sequence[int], devices: int,
              model: Sequence[Optional[str]] = ()) -> PartitionSpec:
  """Where "fsdp" splits a leaf of `shape` over `devices` (the AXIS size): its largest axis that
  `devices` divides (the first of equal ones), or nowhere for a leaf under `FSDP_MIN_ELEMENTS`
  elements or with no such axis. `model`: the leaf's split over MODEL_AXIS, kept; AXIS then takes
  another axis."""
  model = tuple(model) + (None,) * (len(shape) - len(model))
  if int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_ELEMENTS:
    return PartitionSpec(*model) if any(model) else PartitionSpec()
  axes = [i for i, n in enumerate(shape) if n % devices == 0 and model[i] is None]
  if not axes:
    return PartitionSpec(*model) if any(model) else PartitionSpec()
  axis = max(axes, key=lambda i: (shape[i], -i))
  return PartitionSpec(*[AXIS if i == axis else model[i] for i in range(len(shape))])


@dataclasses.dataclass(frozen=True)
class Rules:
  """Where a step's state lies on the mesh: the sharding rule table of a run, passed as a value.

  sharding: "replicated" or "fsdp" (module doc). model_parallel: chips per data group (> 1 with
  "fsdp" only). model_spec: the model's rule table for MODEL_AXIS (None: nothing split over it).
  """
  sharding: str = "replicated"
  model_parallel: int = 1
  model_spec: Optional[ModelSpec] = None

  def __post_init__(self):
    if self.sharding not in SHARDINGS:
      raise ValueError(f"sharding={self.sharding!r}: must be one of {SHARDINGS}")
    m = self.model_parallel
    if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 1:
      raise ValueError(f"model_parallel={m!r}: must be a positive integer")
    if m > 1 and self.sharding != "fsdp":
      raise ValueError(f"model_parallel={m} needs sharding='fsdp' (got sharding="
                       f"{self.sharding!r})")

  @property
  def split(self) -> bool:
    """Whether state leaves are split over the data axis."""
    return self.sharding == "fsdp"

  def mesh(self, devices: Optional[Sequence[Any]] = None) -> Mesh:
    """The mesh over `devices` (default: every device of every process, ordered by (process index,
    device id), so each process owns one contiguous block of rows): 1-D (AXIS,), or (devices / m,
    m) of axes (AXIS, MODEL_AXIS), a data group being m consecutive devices of one host."""
    if devices is None:
      devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    devices = np.array(list(devices))
    m = self.model_parallel
    if m == 1:
      return Mesh(devices, (AXIS,))
    if devices.size % m:
      raise ValueError(f"model_parallel={m} does not divide the {devices.size} devices; use a "
                       "divisor of the devices per host")
    return Mesh(devices.reshape(devices.size // m, m), (AXIS, MODEL_AXIS))

  def local_mesh(self) -> Mesh:
    """The mesh over this process's devices."""
    return self.mesh(jax.local_devices())

  @property
  def local_rows(self) -> int:
    """Rows of this process in a per-device argument: its devices, or its data groups."""
    return jax.local_device_count() // self.model_parallel

  def model_axes(self, path: Sequence[Any], shape: Sequence[int], mesh: Mesh) -> tuple:
    """The MODEL_AXIS split of the state leaf at `path` (its last two dict keys name a Haiku
    parameter, or an optimizer moment of one); () without a model axis. A split that the model
    axis does not divide is a ValueError."""
    if MODEL_AXIS not in mesh.shape or self.model_spec is None:
      return ()
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    if len(keys) < 2:
      return ()
    spec = tuple(self.model_spec(str(keys[-2]), str(keys[-1]), len(shape)) or ())
    m = mesh.shape[MODEL_AXIS]
    for i, axis in enumerate(spec):
      if axis is not None and shape[i] % m:
        raise ValueError(f"{keys[-2]}/{keys[-1]}: axis {i} of shape {tuple(shape)} is split over "
                         f"model_parallel={m}, which does not divide it; use a divisor of "
                         f"{shape[i]}")
    return spec

  def spec(self, path: Sequence[Any], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of the state leaf at `path` of `shape` on `mesh`."""
    model = self.model_axes(path, shape, mesh)
    if self.split:
      return fsdp_spec(shape, mesh.shape[AXIS], model)
    return PartitionSpec(*model) if any(model) else PartitionSpec()

  def shardings(self, tree: Any, mesh: Optional[Mesh] = None) -> Any:
    """`NamedSharding` of every leaf of `tree` (arrays or ShapeDtypeStructs) on `mesh` (default
    the global one)."""
    mesh = self.mesh() if mesh is None else mesh
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, self.spec(path, np.shape(x), mesh)), tree)


REPLICATED = Rules()


# --------------------------------------------------------------------------------------------------
# Placing values.

def replicate(tree: Any) -> Any:
  """Puts every leaf on all local devices, replicated (no leading device axis)."""
  return jax.device_put(tree, NamedSharding(REPLICATED.local_mesh(), PartitionSpec()))


def put_state(tree: Any, rules: Rules) -> Any:
  """The state onto the devices as `rules` lay it out: `replicate` for a state split nowhere; else
  each leaf a global array of the blocks the rules give it (every process passes the whole value;
  each device keeps its block)."""
  if not rules.split:
    return replicate(tree)

  def put(x, s):
    if isinstance(x, jax.Array) and x.sharding == s:
      return x                       # already laid out so (a restored checkpoint)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, s)    # another global layout: XLA moves the blocks
    value = np.asarray(x)
    return jax.make_array_from_callback(value.shape, s, lambda index: value[index])
  return jax.tree.map(put, tree, rules.shardings(tree))


def shard(tree: Any, rules: Rules = REPLICATED) -> Any:
  """Puts host arrays with leading axis `rules.local_rows` onto the local devices, one row each
  (one per data group, on each of its chips)."""
  return jax.device_put(tree, NamedSharding(rules.local_mesh(), PartitionSpec(AXIS)))


def unreplicate(tree: Any) -> Any:
  """Host numpy copy of a state value: reads one device's copy of a replicated leaf (not `x[0]`,
  which gathers); a split leaf is gathered (across processes too)."""
  def one(x):
    if isinstance(x, jax.Array) and len(x.addressable_shards) > 1 and x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_shards[0].data)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(one, tree)


def first_local(x: Any) -> np.ndarray:
  """Host copy of the first local row of a per-device output (keeps its length-1 row axis); no
  cross-device gather, unlike `x[0]`."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)


def device_indices(rules: Rules = REPLICATED) -> np.ndarray:
  """Global index of each local row ([rules.local_rows] int32: data groups under a model axis),
  passed INTO steps (jaxline: the host and device ids are inputs of the step, not read inside)."""
  n = rules.local_rows
  return (jax.process_index() * n + np.arange(n)).astype(np.int32)


# --------------------------------------------------------------------------------------------------
# Inside a step: the state's blocks.

@dataclasses.dataclass
class _Trace:
  """A step `compile_step` is tracing with state blocks: the mesh and the blocks of its state
  arguments (id -> (block, the axis AXIS splits); the block is kept so that its id stays its)."""
  mesh: Mesh
  blocks: Dict[int, Tuple[Any, int]]


_TRACES: List[_Trace] = []     # set only while compile_step traces a step with state blocks


@contextlib.contextmanager
def _tracing(trace: Optional[_Trace]) -> Iterator[None]:
  if trace is None:
    yield
    return
  _TRACES.append(trace)
  try:
    yield
  finally:
    _TRACES.pop()


def _block(x: Any) -> Optional[int]:
  """The axis AXIS splits when `x` is a state block of the step being traced, else None."""
  if not _TRACES:
    return None
  hit = _TRACES[-1].blocks.get(id(x))
  return hit[1] if hit is not None and hit[0] is x else None


def holds_blocks() -> bool:
  """Whether the step being traced holds blocks of its state (`compile_step(blocks=True)` under
  rules that split): its gradients are then averaged onto the blocks (`mean_state`) per
  micro-batch, not once (device_step.accumulated_update)."""
  return bool(_TRACES)


def whole_shapes(tree: Any) -> Any:
  """ShapeDtypeStructs of the whole values of `tree` (blocks of the state are n times as large
  along their split axis): a shape-only trace of code that reads the state whole."""
  def one(x):
    shape, axis = list(np.shape(x)), _block(x)
    if axis is not None:
      shape[axis] *= _TRACES[-1].mesh.shape[AXIS]
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)
  return jax.tree.map(one, tree)


def gather_state(tree: Any) -> Any:
  """Inside a step with state blocks (`compile_step(blocks=True)`): `tree` with each block of the
  step's state arguments whole on every device (an all-gather over AXIS; a model axis keeps its
  split); anything else unchanged. Elsewhere `tree` itself."""
  def one(x):
    axis = _block(x)
    return x if axis is None else jax.lax.all_gather(x, AXIS, axis=axis, tiled=True)
  return jax.tree.map(one, tree)


def mean_state(tree: Any, like: Any) -> Any:
  """The mean over every device of `tree` (e.g. gradients), laid out like `like` (the state values
  of the same structure, e.g. the parameters): where `like` holds a block of a split leaf, this
  device's block of the mean (a reduce-scatter); elsewhere the whole mean (`lax.pmean`; outside a
  step with state blocks `lax.pmean(tree, AXIS)` itself)."""
  if not _TRACES:
    return jax.lax.pmean(tree, AXIS)
  n = _TRACES[-1].mesh.shape[AXIS]

  def one(x, s):
    axis = _block(s)
    if axis is None:
      return jax.lax.pmean(x, AXIS)
    return jax.lax.psum_scatter(x, AXIS, scatter_dimension=axis, tiled=True) / n
  return jax.tree.map(one, tree, like)


def global_norm(tree: Any, like: Any) -> jax.Array:
  """The L2 norm of the whole of `tree`, laid out like `like` (as `mean_state` returns it), the same
  on every device: the squares of blocks are summed over AXIS. Outside a step with state blocks
  `optax.tree.norm(tree)`."""
  if not _TRACES:
    return optax.tree.norm(tree)
  total = 0
  for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(like)):
    square = jax.numpy.sum(jax.numpy.square(x))
    total = total + (square if _block(s) is None else jax.lax.psum(square, AXIS))
  return jax.numpy.sqrt(jax.numpy.asarray(total))


def all_devices(pred: Any) -> Any:
  """A [] bool computed from this device's part of the state, true on every device: inside a step
  with state blocks the AND over AXIS; elsewhere `pred` (the whole state decides alike on every
  device)."""
  if not _TRACES:
    return pred
  return jax.lax.pmin(jax.numpy.asarray(pred).astype(jax.numpy.int32), AXIS) > 0


_STEP_DEVICE_INDEX: list = []


@contextlib.contextmanager
def step_device_index(index: Any) -> Iterator[None]:
  """Holds this device's global index (the step's `device_indices()` argument) while the trainer
  traces an experiment's train step (experiments/common/device_step.guarded_step)."""
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
                       "device_step.parallel_train_step (the trainer passes the index in)")
  return _STEP_DEVICE_INDEX[-1]


# --------------------------------------------------------------------------------------------------
# The engine.

def _signature(args: Any) -> Any:
  """(tree structure, ((shape, dtype) per leaf)) of arrays or ShapeDtypeStructs."""
  leaves, tree = jax.tree.flatten(args)
  return tree, tuple((tuple(x.shape), str(x.dtype)) if hasattr(x, "dtype")   # key<fry> too
                     else (np.shape(x), str(np.result_type(x))) for x in leaves)


def _is_spec(x: Any) -> bool:
  return isinstance(x, PartitionSpec)


def _manual(spec: PartitionSpec) -> PartitionSpec:
  """`spec` over the manual axis only (MODEL_AXIS stays automatic inside the step)."""
  return PartitionSpec(*[a if a == AXIS else None for a in tuple(spec)])


def _traced(args: Any) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))


class Step:
  """A per-device step compiled by `compile_step`. Call it as the step, with state arguments laid
  out by its rules (`put_state`) and per-device ones as this host's rows (`shard`); `lower(*args)`
  with global shapes (a compile-only target's devices); `precompile(*args)` compiles in a
  background thread. Compiled once per argument signature (tree structure, shapes, dtypes)."""

  def __init__(self, fn: Callable[..., Any], rules: Rules, *, state_in: Sequence[int],
               out_axes: Any, donate_argnums: Sequence[int], devices: Optional[Sequence[Any]],
               compiler_options: Optional[Dict[str, str]], blocks: bool):
    self._fn, self.rules = fn, rules
    self._num_args = len(inspect.signature(fn).parameters)
    self._state_in = frozenset(state_in)
    self._out_axes = out_axes
    self._donate = tuple(donate_argnums)
    self.mesh = rules.mesh(devices)
    self.compiler_options = dict(compiler_options or {})
    self._blocks = bool(blocks) and rules.split
    self._programs: Dict[Any, Any] = {}
    self._compiled: Dict[Any, Any] = {}   # signature -> Compiled, or a Future of one (precompile)

  def _state_specs(self, arg: Any) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, x: self.rules.spec(path, np.shape(x), self.mesh), arg)

  def _outputs(self, args: Sequence[Any]) -> Tuple[Any, Any]:
    """(the outputs' PartitionSpecs, their global shapes or None): per-device outputs P(AXIS);
    state outputs as the rules lay out their whole shapes, found by a shape-only trace of the step
    mapped over the rows (not needed when the rules split nothing)."""
    rows = PartitionSpec(AXIS)
    if not self.rules.split:
      return jax.tree.map(lambda a: PartitionSpec() if a is None else rows, self._out_axes,
                          is_leaf=lambda x: x is None), None
    in_axes = tuple(None if i in self._state_in else 0 for i in range(self._num_args))
    shapes = jax.eval_shape(jax.vmap(self._fn, in_axes=in_axes, out_axes=self._out_axes,
                                     axis_name=AXIS), *args)
    specs = jax.tree_util.tree_map(
        lambda a, sub: self._state_specs(sub) if a is None else jax.tree.map(lambda _: rows, sub),
        self._out_axes, shapes, is_leaf=lambda x: x is None)
    return specs, shapes

  def _program(self, args: Sequence[Any]) -> Any:
    """The jitted program for global-shaped `args` (arrays or ShapeDtypeStructs)."""
    key = _signature(args)
    if key in self._programs:
      return self._programs[key]
    if len(args) != self._num_args:
      raise TypeError(f"the step takes {self._num_args} arguments, got {len(args)}")
    mesh, state_in, blocks, n = self.mesh, self._state_in, self._blocks, len(args)
    rows = PartitionSpec(AXIS)
    full_in = tuple(self._state_specs(a) if i in state_in else jax.tree.map(lambda _: rows, a)
                    for i, a in enumerate(args))
    full_out, out_shapes = self._outputs(args)
    # Inside: rows and state blocks over the manual axis; a whole state gathered on entry.
    manual_in = tuple(
        jax.tree.map(lambda s: _manual(s) if i not in state_in or blocks else PartitionSpec(),
                     spec, is_leaf=_is_spec) for i, spec in enumerate(full_in))
    manual_out = jax.tree.map(_manual, full_out, is_leaf=_is_spec)
    fn, out_axes, data = self._fn, self._out_axes, mesh.shape[AXIS]
    for i, a in enumerate(args):
      for x in ([] if i in state_in else jax.tree.leaves(a)):
        if not np.shape(x) or np.shape(x)[0] != data:
          raise ValueError(f"argument {i} of the step has {np.shape(x)[:1]} rows, the mesh "
                           f"{data} ({'data groups' if MODEL_AXIS in mesh.shape else 'devices'}): "
                           "pass one row per device (parallel.shard of the layout's host rows)")

    # One data group on a model axis: a manual axis of size 1 trips XLA's partitioner (its
    # collectives are no-ops), so the step is mapped over it (vmap) and the model axis left to XLA.
    mapped_over_one = MODEL_AXIS in mesh.shape and data == 1
    expand = lambda tree: jax.tree.map(lambda x: jax.lax.expand_dims(x, [0]), tree)  # noqa: E731

    def body(*xs):
      xs, found = list(xs), {}
      for i in range(n):
        if i not in state_in and not mapped_over_one:
          xs[i] = jax.tree.map(lambda x: jax.lax.squeeze(x, [0]), xs[i])
        elif i in state_in and blocks and not mapped_over_one:
          for x, s in zip(jax.tree.leaves(xs[i]), jax.tree.leaves(manual_in[i], is_leaf=_is_spec)):
            if AXIS in tuple(s):
              found[id(x)] = (x, tuple(s).index(AXIS))
      with _tracing(_Trace(mesh, found) if blocks and not mapped_over_one else None):
        out = fn(*xs)
      if mapped_over_one:
        return out
      if out_shapes is None:       # nothing split: pmap's program
        return jax.tree_util.tree_map(lambda a, sub: sub if a is None else expand(sub),
                                      out_axes, out, is_leaf=lambda x: x is None)

      def place(a, sub, specs, shapes):
        if a is not None:
          return expand(sub)

        def one(x, s, whole):      # a state value returned whole: this device's block of it
          if AXIS not in tuple(s) or tuple(x.shape) != tuple(whole.shape):
            return x
          axis = tuple(s).index(AXIS)
          size = whole.shape[axis] // data
          return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(AXIS) * size, size, axis=axis)
        return jax.tree.map(one, sub, specs, shapes)
      return jax.tree_util.tree_map(place, out_axes, out, full_out, out_shapes,
                                    is_leaf=lambda x: x is None)

    if mapped_over_one:
      mapped = jax.vmap(body, in_axes=tuple(None if i in state_in else 0 for i in range(n)),
                        out_axes=out_axes, axis_name=AXIS, axis_size=1)
    else:
      axis_names = {AXIS} if MODEL_AXIS in mesh.shape else set(mesh.axis_names)
      mapped = jax.shard_map(body, mesh=mesh, in_specs=manual_in, out_specs=manual_out,
                             check_vma=False, axis_names=axis_names)
    named = lambda tree: jax.tree.map(lambda s: NamedSharding(mesh, s), tree,  # noqa: E731
                                      is_leaf=_is_spec)
    program = jax.jit(mapped, in_shardings=named(full_in), out_shardings=named(full_out),
                      donate_argnums=self._donate)
    self._programs[key] = (program, full_in, full_out)
    return self._programs[key]

  # Calling conventions: this host's rows and state <-> the program's global arrays.
  def _multiprocess(self) -> bool:
    return len({d.process_index for d in self.mesh.devices.flat}) > 1

  def _to_global(self, args: Sequence[Any], full_in: Any) -> tuple:
    """With several processes: host-local rows and a replicated state to global arrays (no copy);
    a state already global (laid out by `put_state`) as it is."""
    if not self._multiprocess():
      return tuple(args)

    def one(x, s):
      if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x
      return multihost_utils.host_local_array_to_global_array(x, self.mesh, s)
    return tuple(jax.tree.map(one, a, spec) for a, spec in zip(args, full_in))

  def _to_local(self, out: Any, full_out: Any) -> Any:
    """With several processes: per-device outputs (and a replicated state, as pmap returns it) back
    to this host's rows; a split state stays global."""
    if not self._multiprocess():
      return out
    return jax.tree_util.tree_map(
        lambda a, sub, specs: sub if a is None and self.rules.split else
        multihost_utils.global_array_to_host_local_array(sub, self.mesh, specs),
        self._out_axes, out, full_out, is_leaf=lambda x: x is None)

  def lower(self, *args) -> jax.stages.Lowered:
    """Lowers for global-shaped `args` (per-device leaves `[rows of the mesh, ...]`), e.g. a TPU
    topology's abstract devices (experiments/tools/tpu_target.py)."""
    return self._program(args)[0].lower(*args)

  def precompile(self, *args) -> jax.stages.Lowered:
    """Lowers for `args` (arrays or ShapeDtypeStructs, this host's rows) on this thread and
    compiles in a background thread, so the host can do other start-up work meanwhile (XLA
    compiles without the GIL); the first call with that signature waits for it. Returns the
    Lowered (`out_info`: the outputs' shapes)."""
    shapes = self._global_shapes(args)
    lowered = self._program(shapes)[0].lower(*shapes)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="podlab-compile")
    self._compiled[_signature(shapes)] = pool.submit(
        lowered.compile, compiler_options=self.compiler_options or None)
    pool.shutdown(wait=False)
    return lowered

  def _global_shapes(self, args: Sequence[Any]) -> tuple:
    """This host's argument shapes as the program's global ones (rows of every process)."""
    procs = len({d.process_index for d in self.mesh.devices.flat})
    if procs == 1:
      return tuple(args)
    return tuple(a if i in self._state_in else jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((x.shape[0] * procs,) + tuple(x.shape[1:]), x.dtype), a)
                 for i, a in enumerate(args))

  def __call__(self, *args):
    if _traced(args):            # traced (jax.eval_shape, an outer jit): the program itself
      return self._program(self._global_shapes(args))[0](*args)
    program, full_in, full_out = self._program(self._global_shapes(args))
    gargs = self._to_global(args, full_in)
    key = _signature(gargs)
    compiled = self._compiled.get(key)
    if isinstance(compiled, concurrent.futures.Future):
      compiled = self._compiled[key] = compiled.result()
    if compiled is None:
      compiled = program.lower(*gargs).compile(compiler_options=self.compiler_options or None)
      self._compiled[key] = compiled
    return self._to_local(compiled(*gargs), full_out)


def compile_step(fn: Callable[..., Any], rules: Rules = REPLICATED, *,
                 state_in: Sequence[int] = (), out_axes: Any = 0,
                 donate_argnums: Sequence[int] = (), devices: Optional[Sequence[Any]] = None,
                 compiler_options: Optional[Dict[str, str]] = None,
                 blocks: bool = False) -> Step:
  """The per-device step `fn` on every device of `rules`' mesh: `jit(shard_map(fn))` (module doc).

  Args:
    fn: the per-device step (positional arguments only).
    rules: where the state lies (`Rules`; REPLICATED: the program of `jax.pmap`).
    state_in: positions of the state arguments (the same on every device, laid out by `rules`);
      the others carry a leading axis of rows (devices, or data groups).
    out_axes: None for outputs that are state (laid out by `rules`, no row axis), 0 for per-device
      outputs; a tuple for a tuple of outputs.
    donate_argnums: arguments whose buffers may be reused for outputs (state updated in place).
    devices: the devices, in order (default: every device of every process);
      experiments/tools/tpu_target.py passes a TPU topology's to compile for a whole slice.
    compiler_options: XLA options of this step's compiles (`cpu_features.CPU_DOTS_ONLY`; callers
      pass them only for a CPU target).
    blocks: the step gets this device's blocks of split state leaves (and reads them whole through
      `gather_state`); default: the state whole.
  """
  return Step(fn, rules, state_in=state_in, out_axes=out_axes, donate_argnums=donate_argnums,
              devices=devices, compiler_options=compiler_options, blocks=blocks)
