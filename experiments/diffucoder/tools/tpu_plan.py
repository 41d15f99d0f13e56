r"""Dream 7.6B sampling compiled for TPU slices by the TPU compiler: which model-parallel degree fits.

The program is one step of the reference sampler (`sampler_steps.plain_step_fn`: a full forward over
the canvas and one unmask step) at canvas 512 = 128 prompt + 384 new tokens, built exactly as
`sampling.Runner` runs it: `parallel.compile_step` over every device when model_parallel is 1 (today's data-parallel
program), else one `shard_map` over a (data, model) mesh of the slice's devices (`model_sharding.mesh_2d`)
with the weights split Megatron style (modules/dream.py). Parameters are `jax.ShapeDtypeStruct`s: no
weight is allocated. A global batch smaller than the data groups uses `batch` of them (the other
devices idle); otherwise the rows split evenly (batch a multiple of devices / model_parallel).

Every figure is a COMPILER ESTIMATE (libtpu's memory assignment and cost model; see
experiments/tools/tpu_compile.py), not a measurement. Tokens/s: with steps = max_new_tokens (the
reference setting) each step fixes one token per row, so tokens/s = batch / step time.

  python -m experiments.diffucoder.tools.tpu_plan --target=v5e-8 --batch=8            # smallest degree
  python -m experiments.diffucoder.tools.tpu_plan --target=v2-8 --batch=1 --model_parallel=4
  # the instruct configs' sampler (temperature 0.4, top_p 0.95) instead of greedy decoding
  python -m experiments.diffucoder.tools.tpu_plan --target=v2-8 --batch=8 --sampler=top_p
  # a whole block of Fast-dLLM's loop (dual KV cache, threshold 0.9, blocks of 32): memory only
  python -m experiments.diffucoder.tools.tpu_plan --target=v5e-8 --batch=8 --model_parallel=2 --block

Synopsis (needs libtpu; one compile takes about a minute on 2 CPU cores):

  from experiments.tools import tpu_target
  from experiments.diffucoder.tools import tpu_plan
  tpu_target.load_libtpu()
  report = tpu_plan.compile_step(tpu_target.parse_target("v4-8"), batch=1, model_parallel=1)
  report.fits, report.need_bytes / tpu_target.GIB, report.items_per_s   # per-device HBM, tokens/s
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from experiments.common import config_utils
from experiments.common import console
from experiments.common import distributed
from experiments.common import errors
from experiments.common import parallel
from experiments.diffucoder import model_sharding
from experiments.diffucoder import sampler_options as options_lib
from experiments.diffucoder import sampler_steps
from experiments.diffucoder import sampling
from experiments.tools import tpu_compile
from experiments.tools import tpu_report
from experiments.tools import tpu_target
from modules import dream

PROMPT = 128
NEW = 384
CANVAS = PROMPT + NEW
MASK_ID = 151666                    # <|mask|> (the id only fixes the program's constants)
TARGETS = ("v2-8", "v3-8", "v5litepod-8", "v4-8")
BATCHES = (1, 8, 32)
SAMPLERS = {
    "greedy": options_lib.SamplerOptions(steps=NEW, alg="entropy"),
    # the instruct configs' sampler (temperature 0.4, top_p 0.95): the top-p filter sorts each row's
    # full vocabulary, which a model-parallel step gathers first (docs/diffucoder.md section 9.1)
    "top_p": options_lib.SamplerOptions(steps=NEW, alg="entropy", temperature=0.4, top_p=0.95),
}
"""The samplers a plan row compiles: greedy decoding and the instruct configs' top_p 0.95."""


def _forward(model):
  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    return model.apply(params, tokens, valid, positions, context, return_kv)
  return forward


def analytic_flops(config: dream.DreamConfig, batch: int, canvas: int) -> float:
  """Model FLOPs of one full forward over a [batch, canvas] canvas (2 per multiply-add; matmuls):
  projections + SwiGLU per layer, attention scores and values (4 L^2 H Dh per layer), the head."""
  D, F, H, K, Dh = (config.hidden_size, config.intermediate_size, config.num_heads,
                    config.num_kv_heads, config.head_dim)
  per_token = config.num_layers * (2 * D * (H + 2 * K) * Dh + 2 * H * Dh * D + 6 * D * F)
  per_token += 2 * D * config.vocab_size
  attention = config.num_layers * 4 * canvas * canvas * H * Dh
  return float(batch) * (canvas * per_token + attention)


def data_groups(target: tpu_target.Target, batch: int, model_parallel: int) -> int:
  """Data groups used at `batch`: min(batch, devices / model_parallel); the batch must split evenly."""
  groups = target.num_devices // model_parallel
  if batch < groups:
    return batch
  if batch % groups:
    raise config_utils.ConfigError("batch", batch, f"does not split over the {groups} data groups "
                                   f"of {target.name} at model_parallel={model_parallel}",
                                   f"use a batch below {groups} or a multiple of it")
  return groups


def lower_step(target: tpu_target.Target, batch: int, model_parallel: int,
               config: dream.DreamConfig = dream.DREAM_7B,
               opts: Optional[options_lib.SamplerOptions] = None, *, prompt: int = PROMPT,
               new: int = NEW) -> jax.stages.Lowered:
  """The sampler's step for `target` with abstract parameters (model_parallel 1: the pmap program
  of `Runner(data_parallel=True)`; > 1: its shard_map program on a (data, model) mesh), on a canvas
  of `prompt` + `new` tokens."""
  opts = opts or options_lib.SamplerOptions(steps=new, alg="entropy")
  PROMPT, CANVAS = prompt, prompt + new  # pylint: disable=invalid-name,redefined-outer-name
  dream.check_model_degree(config, model_parallel)
  devices = tpu_target.target_devices(target)
  groups = data_groups(target, batch, model_parallel)
  rows = batch // groups
  shapes = dream.param_shapes(config)
  i32, b = jnp.int32, jnp.bool_
  if model_parallel == 1 and groups == target.num_devices:
    step = sampler_steps.plain_step_fn(_forward(dream.dream_forward(config)), opts, mask_id=MASK_ID,
                                       start=PROMPT, axis_name=parallel.AXIS)
    key = jax.eval_shape(lambda: jax.random.key(0))
    args = (shapes, jax.ShapeDtypeStruct((rows, CANVAS), i32), jax.ShapeDtypeStruct((rows, CANVAS), b),
            jax.ShapeDtypeStruct((rows, CANVAS), i32), key, jax.ShapeDtypeStruct((), jnp.float32))
    return tpu_target.lower_step(step, target, args, state_in=(0, 5))
  mesh = model_sharding.mesh_2d(groups, model_parallel, devices=devices)
  specs = dream.param_partition_specs(config, model_sharding.MODEL_AXIS)
  model = (dream.dream_forward(config, model_sharding.MODEL_AXIS, model_parallel) if model_parallel > 1
           else dream.dream_forward(config))
  runner = sampling.Runner(_forward(model), opts, mask_id=MASK_ID, mesh=mesh, param_specs=specs)
  vocab_axis = model_sharding.MODEL_AXIS if model_parallel > 1 else None
  step = runner._mesh_step(sampler_steps.plain_step_fn(  # pylint: disable=protected-access
      runner.forward, opts, mask_id=MASK_ID, start=PROMPT, axis_name=parallel.AXIS,
      vocab_axis=vocab_axis), blocks=False)
  put = lambda s, spec: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))
  params = jax.tree.map(put, shapes, specs)
  row = lambda dt: jax.ShapeDtypeStruct((batch, CANVAS), dt,
                                        sharding=NamedSharding(mesh, P(parallel.AXIS)))
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), groups))
  keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=NamedSharding(mesh, P(parallel.AXIS)))
  ratio = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, P()))
  return step.lower(params, row(i32), row(b), row(i32), keys, ratio)


FAST_DLLM = options_lib.SamplerOptions(steps=NEW // 32, alg="entropy", block_length=32,
                                       cache="dual", threshold=0.9, block_algorithm="fast_dllm")
"""The block program `lower_block` compiles: Fast-dLLM's published loop (dual cache, blocks of 32,
confidence threshold 0.9)."""


def lower_block(target: tpu_target.Target, batch: int, model_parallel: int,
                config: dream.DreamConfig = dream.DREAM_7B,
                opts: options_lib.SamplerOptions = FAST_DLLM, *, prompt: int = PROMPT,
                new: int = NEW) -> jax.stages.Lowered:
  """One whole block of block-wise decoding as `Runner(mesh=...)` runs it (`fast_dllm_block_fn` or
  `block_fn`: the refresh forward over the canvas keeping every layer's keys and values, then a
  while loop of cached forwards on the block), on a (data, model) mesh of the target's devices,
  with abstract parameters. At model_parallel 1 this is the mesh program with one model device per
  group (the same memory per device as the pmap program; generate.py runs the pmap one)."""
  PROMPT, NEW, CANVAS = prompt, new, prompt + new  # pylint: disable=invalid-name,redefined-outer-name
  opts.validate(NEW)
  dream.check_model_degree(config, model_parallel)
  groups = data_groups(target, batch, model_parallel)
  mesh = model_sharding.mesh_2d(groups, model_parallel, devices=tpu_target.target_devices(target))
  specs = dream.param_partition_specs(config, model_sharding.MODEL_AXIS)
  model = (dream.dream_forward(config, model_sharding.MODEL_AXIS, model_parallel) if model_parallel > 1
           else dream.dream_forward(config))
  runner = sampling.Runner(_forward(model), opts, mask_id=MASK_ID, mesh=mesh, param_specs=specs)
  make = (sampler_steps.fast_dllm_block_fn if opts.block_algorithm == "fast_dllm"
          else sampler_steps.block_fn)
  block = runner._mesh_step(make(  # pylint: disable=protected-access
      runner.forward, opts, mask_id=MASK_ID, start=PROMPT, axis_name=parallel.AXIS,
      vocab_axis=model_sharding.MODEL_AXIS if model_parallel > 1 else None), blocks=True)
  put = lambda shape, dt, spec: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, spec))
  params = jax.tree.map(lambda s, spec: put(s.shape, s.dtype, spec), dream.param_shapes(config),
                        specs)
  rows = P(parallel.AXIS)
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), groups))
  spb = opts.steps // (NEW // opts.block_length)
  return block.lower(params, put((batch, CANVAS), jnp.int32, rows),
                     put((batch, CANVAS), jnp.bool_, rows), put((batch, CANVAS), jnp.int32, rows),
                     put(keys.shape, keys.dtype, rows), put((max(spb, 1),), jnp.float32, P()),
                     put((), jnp.int32, P()))


def sampler_options(sampler: str) -> options_lib.SamplerOptions:
  """SAMPLERS[sampler]; a ConfigError naming the choices for an unknown name."""
  if sampler not in SAMPLERS:
    raise config_utils.ConfigError("sampler", sampler, "is not a plan sampler",
                                   f"use one of {', '.join(SAMPLERS)}")
  return SAMPLERS[sampler]


def compile_block(target: tpu_target.Target, batch: int, model_parallel: int,
                  config: dream.DreamConfig = dream.DREAM_7B) -> tpu_report.Report:
  """`lower_block`'s Report: per-device HBM (the FLOPs and step time are not estimated: the number
  of cached forwards depends on the threshold)."""
  t0 = time.perf_counter()
  report = tpu_compile.compile_report(
      lower_block(target, batch, model_parallel, config), target=target,
      name=f"dream 7b fast-dllm block b{batch} mp{model_parallel}")
  report.compile_s = time.perf_counter() - t0
  return report


def compile_step(target: tpu_target.Target, batch: int, model_parallel: int,
                 config: dream.DreamConfig = dream.DREAM_7B,
                 sampler: str = "greedy") -> tpu_report.Report:
  """The step's Report: per-device HBM need vs capacity, and tokens/s at the bound (an upper bound)
  (analytic FLOPs of the forward per device; one token per row per step). `sampler`: a SAMPLERS
  key."""
  opts = sampler_options(sampler)
  groups = data_groups(target, batch, model_parallel)
  used = groups * model_parallel
  t0 = time.perf_counter()
  lowered = lower_step(target, batch, model_parallel, config, opts)
  tag = "" if sampler == "greedy" else f" {sampler} {opts.top_p}"
  report = tpu_compile.compile_report(
      lowered, target=target, name=f"dream 7b sampling step{tag} b{batch} mp{model_parallel}",
      analytic_flops_per_device=analytic_flops(config, batch, CANVAS) / used,
      items_per_step=batch, item_name="tokens")
  report.compile_s = time.perf_counter() - t0
  return report


def smallest_fitting(target: tpu_target.Target, batch: int,
                     config: dream.DreamConfig = dream.DREAM_7B,
                     log: Callable[[str], None] = lambda line: None,
                     sampler: str = "greedy") -> List[tpu_report.Report]:
  """Compiles the step at model_parallel 1, 2, 4... (valid degrees that leave the batch splittable)
  until one fits; returns every report made (the last fits, unless none does)."""
  reports = []
  for m in dream.valid_model_degrees(config):
    if target.num_devices % m:
      continue
    groups = target.num_devices // m
    if batch >= groups and batch % groups:
      continue
    r = compile_step(target, batch, m, config, sampler)
    reports.append(r)
    log(f"{target.name} {sampler} batch {batch} model_parallel {m}: "
        f"{'fits' if r.fits else 'does not fit'} ({tpu_report.margin_text(r)}), compile "
        f"{r.compile_s:.0f} s")
    if r.fits:
      break
  return reports


def dry_run(target_name: Optional[str], config: dream.DreamConfig,
            opts: options_lib.SamplerOptions, *,
            batch_size: int, model_parallel: int, max_new_tokens: int,
            prompt: int = PROMPT, flag: str = "--config.model_parallel",
            global_batch: Optional[int] = None) -> str:
  """`generate.py --dry_run --target=T`: the config's sampler programs (its model, options, batch and
  model_parallel) compiled for the slice T, on a canvas of `prompt` + max_new_tokens tokens; returns
  the table. The generation loop is host-side: it runs the step program `steps` times (block-wise
  decoding: the block program once per block), so these programs are all it compiles. Raises
  DoesNotFitError (after printing the table) naming the smallest model-parallel degree that fits, as
  the caller's `flag` (benchmark.py: --model_parallel), with its batch and margin. `global_batch`:
  the rows over all devices at every degree (benchmark.py's --global_batch); default batch_size rows
  per data group (generate.py's batch_size)."""
  if not target_name or target_name == "cpu":
    raise errors.BadInput(f"--target={target_name or ''}: the generator's dry run compiles for a TPU "
                          "slice. Fix: pass --target=v5e-8 (or v2-8, v3-8, v4-8, v5p-8, ...)")
  tpu_target.load_libtpu()
  target = tpu_target.parse_target(target_name)
  m = int(model_parallel)
  try:
    dream.check_model_degree(config, m)
  except ValueError as e:
    raise config_utils.ConfigError("model_parallel", m, str(e), "pass a valid degree") from None
  if target.num_devices % m:
    raise config_utils.ConfigError("model_parallel", m,
                                   f"does not divide the {target.num_devices} devices of {target.name}",
                                   "pick a degree that divides them")
  groups = target.num_devices // m
  rows_at = lambda d: (int(global_batch) if global_batch is not None    # noqa: E731
                       else int(batch_size) * (target.num_devices // d))
  batch = rows_at(m)                                # generate.py: batch_size rows per data group
  canvas = prompt + int(max_new_tokens)
  t0 = time.perf_counter()
  step = lower_step(target, batch, m, config, opts if opts.block_length == 0 else
                    options_lib.SamplerOptions(steps=max_new_tokens, alg=opts.alg),
                    prompt=prompt, new=max_new_tokens)
  report = tpu_compile.compile_report(
      step, target=target, name=f"dream sampling step b{batch} mp{m}",
      analytic_flops_per_device=analytic_flops(config, batch, canvas) / target.num_devices,
      items_per_step=batch, item_name="tokens")
  report.compile_s = time.perf_counter() - t0
  reports = [report]
  if opts.block_length > 0:
    t0 = time.perf_counter()
    block = tpu_compile.compile_report(
        lower_block(target, batch, m, config, opts, prompt=prompt, new=max_new_tokens),
        target=target, name=f"dream {opts.block_algorithm} block b{batch} mp{m}")
    block.compile_s = time.perf_counter() - t0
    reports.append(block)
  table = tpu_report.format_report(reports)
  loop = (f"The generation loop runs the step {opts.steps} times per batch (host-side); its "
          "programs are the ones above." if opts.block_length == 0 else
          f"The generation loop runs the block program once per block ({max_new_tokens // opts.block_length} "
          "blocks, host-side); the step row is the reference sampler's step on the same canvas.")
  bad = [r for r in reports if not r.fits]
  if bad:
    print(table + "\n" + loop, flush=True)
    error = tpu_report.DoesNotFitError(bad[0])
    if not opts.block_length:              # the smallest larger degree whose step fits, if any
      for d in dream.valid_model_degrees(config):
        rows = rows_at(d)
        groups_d = target.num_devices // d if target.num_devices % d == 0 else 0
        if d <= m or not groups_d or (rows >= groups_d and rows % groups_d):
          continue
        r = tpu_compile.compile_report(lower_step(target, rows, d, config, opts, prompt=prompt,
                                                  new=max_new_tokens),
                                       target=target, name=f"mp{d}")
        if r.fits:
          error.args = (f"{error.args[0]}. Fix: {flag}={d} fits at batch {rows} "
                        f"({tpu_report.margin_text(r)})",)
          break
    raise error
  return table + "\n" + loop


def _define_flags() -> None:
  """The CLI flags, defined only when this module is the program, so that importing it (make
  tpu-check, tests) cannot clash with other modules' flags (e.g. dry_run's --target)."""
  global _TARGET, _BATCH, _MODEL_PARALLEL, _BLOCK, _SAMPLER  # pylint: disable=global-statement
  _TARGET = flags.DEFINE_multi_string("target", list(TARGETS), "TPU slices (e.g. v5e-8).")
  _BATCH = flags.DEFINE_multi_integer("batch", [1, 8], "Global batches (rows).")
  _MODEL_PARALLEL = flags.DEFINE_integer("model_parallel", 0,
                                         "Compile only this degree (0: the smallest that fits).")
  _BLOCK = flags.DEFINE_bool("block", False, "With --model_parallel: compile a whole Fast-dLLM "
                             "block (dual cache, threshold 0.9) instead of the plain step.")
  _SAMPLER = flags.DEFINE_multi_enum("sampler", ["greedy"], list(SAMPLERS),
                                     "The step's sampler: greedy (entropy, argmax) and/or top_p "
                                     "(the instruct configs': temperature 0.4, top_p 0.95).")


def run(targets: Sequence[str], batches: Sequence[int], model_parallel: int = 0,
        log: Callable[[str], None] = print, block: bool = False,
        samplers: Sequence[str] = ("greedy",)) -> List[tpu_report.Report]:
  """Reports of every (target, sampler, batch): the smallest fitting degree, or `model_parallel`
  only (the plain step, or with `block` a whole Fast-dLLM block, whose sampler is FAST_DLLM's)."""
  for sampler in samplers:
    sampler_options(sampler)
  if block and not model_parallel:
    raise config_utils.ConfigError("model_parallel", model_parallel, "--block compiles one degree",
                                   "pass --model_parallel=1, 2 or 4 with --block")
  reports = []
  for name in targets:
    target = tpu_target.parse_target(name)
    for sampler in (("greedy",) if block else samplers):
      for batch in batches:
        if block:
          reports.append(compile_block(target, batch, model_parallel))
        elif model_parallel:
          reports.append(compile_step(target, batch, model_parallel, sampler=sampler))
        else:
          reports.extend(smallest_fitting(target, batch, log=log, sampler=sampler))
  return reports


def main(argv: Sequence[str]) -> None:
  del argv
  console.quiet_libraries()
  distributed.choose_platforms()          # the host backend is the CPU; libtpu only compiles
  tpu_target.load_libtpu()
  reports = run(_TARGET.value, _BATCH.value, _MODEL_PARALLEL.value,
                log=lambda line: console.say(line), block=_BLOCK.value, samplers=_SAMPLER.value)
  print(tpu_report.format_report(reports), flush=True)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
