r"""The experiment protocol: the few methods an experiment supplies to the one trainer.

The trainer (experiments/common/trainer.py) owns the run: flags and distributed init (entry.py),
the workdir, checkpoints and their layout, resume (own checkpoint, then `init_from`, then random
init), the step rng, preemption, the non-finite guard, the metric writer, progress, profiling, the
evaluation schedule, `--mode=eval`, the dry run and the TPU compile, and the final table. An
experiment says only what differs (jaxline's shape):

  class Experiment:
    name                                   # "trm", "nanogpt", ...
    base_config() -> ConfigDict            # every field, with defaults: configs are checked against it
    validate(config)                       # value checks: raise errors.ConfigError
    prepare(config)                        # make the data ready before a real run (optional)
    build(config, layout) -> Build         # init, train step, batches, evaluators: nothing read yet
    load_init(path, build, config) -> params   # weights from a file of another format (optional)

`Build.init(rng) -> (state, device_state)` makes the replicated train state (a NamedTuple with a
`step` field: updates done) and the per-device state (or None) from `jax.random.key(config.seed)`;
the trainer calls it for a fresh run and takes the abstract state (restore templates, dry runs,
TPU compiles) from `jax.eval_shape` of it. `batches` and the evaluators open their data on first
use, so a build reads no data and compiles no step. The train step runs on each device
(`parallel.compile_step`, axis `parallel.AXIS`):

  train_step(state, device_state, batch, rng) -> (state, device_state, metrics, finite)

`rng` is the update's per-device key, derived by the trainer (device_step.step_rng: seed, step,
device index; jaxline passes it in too). `metrics` is a dict of scalars already reduced over all
devices (psum/pmean), added up over the log window and saved with checkpoints; `finite` is a []
bool, the same on every device, False when the step's loss or gradients are not finite. The
trainer adds the state check and the skip policy (config.nonfinite), so the step does not. Where
the run's rules split the state (config.sharding=fsdp) the step holds this device's blocks of it:
`device_step.accumulated_update` reads and updates them as it should; a step that reads a state value
itself takes it whole with `parallel.gather_state` (a new value returned whole is cut to the block).

A complete example (an MLP classifier in ~60 lines, run as written by tests/test_trainer.py):
docs/adding-an-experiment.md.
"""

from __future__ import annotations

import dataclasses
from typing import (Any, Callable, Dict, Iterator, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import ml_collections

from experiments.common import errors
from experiments.common import layout as layout_lib
from experiments.common import workdir as workdir_lib

Params = Any
Scalars = Dict[str, float]


@dataclasses.dataclass
class EvalContext:
  """What an evaluator sees: the replicated state, the per-device state (on the devices), the step,
  whether this is the final (full) evaluation, and the workdir."""
  state: Any
  device_state: Any
  step: int
  final: bool
  workdir: workdir_lib.Workdir


@dataclasses.dataclass
class Evaluator:
  """One evaluation of a run.

  Attributes:
    name: the row of the final table and the TensorBoard prefix ("eval" -> "eval/<metric>").
    run: `run(EvalContext) -> {metric: value}` (the same on every process; process 0's is written).
    every: evaluate every this many updates during training (not at the last update); 0 = never.
    at_start: also evaluate before the first update (nanoGPT evaluates iteration 0).
    at_end: evaluate once more after the last update, with `final=True` (the final table).
    size: examples evaluated, for the console ("evaluating N examples"); `size_final` for the final;
      either may be a function (`() -> int`) when the count needs the data (read on first use).
    program: its per-device step for the dry run to compile (optional).
  """
  name: str
  run: Callable[[EvalContext], Scalars]
  every: int = 0
  at_start: bool = False
  at_end: bool = True
  size: Union[None, int, Callable[[], int]] = None
  size_final: Union[None, int, Callable[[], int]] = None
  program: Optional["Program"] = None


@dataclasses.dataclass
class Program:
  """A per-device function compiled by the dry run: `parallel.compile_step(fn, layout.rules)` with
  these argument roles.

  args: abstract arguments (jax.ShapeDtypeStruct trees); `state_in` are state (laid out by the
  run's rules), the others have a leading axis of this host's rows, which the dry run widens to
  the compile target's. `blocks`: the step gets the state's blocks (the trainer's step only)."""
  fn: Callable[..., Any]
  args: Tuple[Any, ...]
  state_in: Tuple[int, ...] = ()
  out_axes: Any = 0
  donate_argnums: Tuple[int, ...] = ()
  items: float = 0.0           # examples (or tokens) one call processes over all devices
  flops: Optional[float] = None  # analytic FLOPs of one call over all devices
  blocks: bool = False


class TrainState(NamedTuple):
  """The train state of an experiment with one optimizer (nanoGPT, masked diffusion): replicated
  on the devices, saved in checkpoints."""
  step: Any                # [] int32 updates done
  params: Any
  opt_state: Any


class Weights(NamedTuple):
  """The model weights of a state, and a state (and per-device state) with other weights (init_from:
  fine-tuning, evaluation of imported weights)."""
  get: Callable[[Any], Params]
  set: Callable[[Any, Any, Params], Tuple[Any, Any]]


PARAMS = Weights(get=lambda state: state.params,
                 set=lambda state, device_state, params: (state._replace(params=params),
                                                          device_state))


@dataclasses.dataclass
class Display:
  """How a run shows itself on the console, in TensorBoard and in its results (all optional).

  Attributes:
    parameters: the parameter table, or a function of the run's start state that makes it (logged
      once, written to TensorBoard).
    summary: a line or two about the model (parameter count, tables) for the dry run.
    progress: keys of `train_scalars` shown on the console's progress line (2-4).
    train_scalars: `(window sums, updates in the window, step) -> {"train/...": value}`.
    items_per_step: examples (or tokens) per update, all devices; `item_name` says which.
    nonfinite_order: metrics named, in this order, when a step is not finite; `nonfinite_other`
      describes a non-finite step whose named metrics are all finite.
    final_table: `(final evaluation {evaluator: metrics}, history {step: {...}}) -> str`.
    results: `(final, history) -> dict` returned by train_and_evaluate (default: `final`).
  """
  parameters: Union[str, Callable[[Any], str]] = ""
  summary: str = ""
  progress: Sequence[str] = ()
  train_scalars: Callable[[Scalars, int, int], Scalars] = lambda sums, n, step: {}
  items_per_step: float = 0.0
  item_name: str = "examples"
  nonfinite_order: Sequence[str] = ()
  nonfinite_other: str = "the update (loss and gradients were finite)"
  final_table: Optional[Callable[[Mapping[str, Scalars], Mapping[int, Any]], str]] = None
  results: Optional[Callable[[Mapping[str, Scalars], Mapping[int, Any]], Dict[str, Any]]] = None


@dataclasses.dataclass
class Build:
  """What `Experiment.build` returns; see the module doc. Nothing in it has read data yet.

  Attributes:
    init: `init(rng) -> (state, device_state)`: the replicated train state (NamedTuple with
      `step`) and the per-device state [local_devices, ...] (host numpy) or None, real values.
    train_step: the per-device step (see the module doc).
    batches: `batches(start_step)` -> iterator of this host's batches for updates start_step + 1, ...
      (leading axis: local devices; with accumulation the next axis is the micro-step).
    example_batch: one batch as ShapeDtypeStructs (dry runs compile with it).
    total_steps: updates of the run.
    evaluators: the run's evaluations.
    flops_per_step: analytic FLOPs per update, all devices (MFU, the TPU compile's roofline).
    model_config: the model's own config (readers of other checkpoint formats, samplers, exports).
    weights: how to read and replace the model weights of a state (default: `state.params`).
    compiler_options: XLA options for the training and evaluation steps' compiles
      (`parallel.compile_step`); experiments set them for a CPU target only (`layout.cpu_tuning`), so
      a TPU program never carries them.
    on_start: called once with the workdir and the start step before training (extra files).
    display: the console, TensorBoard and results side (`Display`).
  """
  init: Callable[[Any], Tuple[Any, Any]]
  train_step: Callable[..., Any]
  batches: Callable[[int], Iterator[Any]]
  example_batch: Any
  total_steps: int
  evaluators: Sequence[Evaluator] = ()
  flops_per_step: Optional[float] = None
  model_config: Any = None
  weights: Weights = PARAMS
  compiler_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
  on_start: Optional[Callable[[workdir_lib.Workdir, int], None]] = None
  display: Display = dataclasses.field(default_factory=Display)


class Experiment:
  """Base class of an experiment; see the module doc. Override `base_config` and `build`."""

  name = "experiment"
  # The step number the trainer folds into the first update's rng (device_step.step_rng): 0 counts
  # updates from 0 (nanoGPT's iteration), 1 from 1 (TRM's reference).
  rng_step_offset = 0

  def base_config(self) -> ml_collections.ConfigDict:
    raise NotImplementedError(f"{type(self).__name__} must define base_config()")

  def validate(self, config: ml_collections.ConfigDict) -> None:
    """Value checks beyond the field names (raise errors.ConfigError)."""

  def prepare(self, config: ml_collections.ConfigDict) -> None:
    """Makes the data ready (prepares a missing dataset when the config asks) before a real run's
    build; dry runs and compile-only tools skip it."""
    del config

  def build(self, config: ml_collections.ConfigDict, layout: layout_lib.BatchLayout) -> Build:
    raise NotImplementedError(f"{type(self).__name__} must define build()")

  def describe_inputs(self, config: ml_collections.ConfigDict) -> Sequence[Tuple[str, str]]:
    """(what, where from) of the run's published inputs (data, weights) for `--dry_run`, e.g.
    ("data", "sudoku_extreme/...: prepared on first use, downloads ..."); reads and downloads
    nothing. Default: none."""
    del config
    return ()

  def model_axis_spec(self, config: ml_collections.ConfigDict
                      ) -> Optional[Callable[[str, str, int], Sequence[Optional[str]]]]:
    """How the model's weights split over the `model` mesh axis under config.model_parallel > 1:
    spec(module, name, ndim) -> per-axis mesh axis names of a Haiku parameter
    (`parallel.Rules.model_spec`), or None (the default): the experiment has no model axis, and
    model_parallel > 1 is a ConfigError (`trainer.run_layout`)."""
    del config
    return None

  def fit_variants(self, config: ml_collections.ConfigDict
                   ) -> Sequence[Tuple[str, str, Callable[[ml_collections.ConfigDict], None]]]:
    """Ways to make the training step fit a TPU's HBM, tried by `--dry_run` in order when the
    config does not fit: (label, the flags a user copies, a function applying them to a config),
    those that keep the numbers first. The dry run tries these alone, then fsdp alone and with each
    of them (a replicated state), then half the per-device batch (experiments/tools/dry_run.py
    `fit_variants`)."""
    del config
    return ()

  def load_init(self, path: str, build: Build, config: ml_collections.ConfigDict) -> Params:
    """The model weights in `path` when it is a checkpoint of another program's format.

    Called by the trainer for `config.init_from` when `path` is not a podlab checkpoint; the result
    goes through `build.set_params`. Raise errors.FormatError when the file does not match.
    """
    raise errors.ConfigError(
        "init_from", path, f"not a podlab checkpoint, and the {self.name} experiment reads no other "
        "format", "pass a podlab workdir or its checkpoints/ folder")
