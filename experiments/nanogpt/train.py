"""nanoGPT training on the shared machinery: `train_and_evaluate(config, workdir)`.

The recipe of ../shared/docs/gpt-reference.md: AdamW (decay 0.1 on tensors with >= 2 dims only),
global-norm clipping, linear warm-up + cosine to min_lr (`lr_at`, 0-based iteration), gradient
accumulation over `grad_accum` micro-batches (a scan inside the step; loss / grad_accum), random
windows of the token stream, evaluation of the mean train/val loss over `eval_iters` random batches
every `eval_interval` iterations (iteration 0 included; dropout off), MFU against the device's peak.
`max_iters = N` performs N + 1 updates. `config.rng = "torch"` (default) starts from nanoGPT's
initial weights and trains/evaluates on nanoGPT's batches in its order (experiments/nanogpt/
torch_rng.py); "stateless" uses Haiku's init and tf.data Philox windows per host.
`config.init_from` = a GPT-2 folder starts from its weights instead (`initial_params`,
experiments/nanogpt/hf_gpt2.py; configs/finetune_shakespeare.py). The loop,
checkpoints (resume from the workdir), metrics, preemption and the non-finite guard are TRM's
(`experiments.common.loop`, `checkpointing`, ...).

Step numbering: our step k = k updates done = nanoGPT's iteration k - 1 finished; the evaluation
nanoGPT makes at iteration i (before its update) is ours after step i.

Synopsis (tests run it with the smoke config):

  from experiments.nanogpt import train
  from experiments.nanogpt.configs import shakespeare_char_cpu
  results = train.train_and_evaluate(shakespeare_char_cpu.get_config("smoke"), "/tmp/gpt_smoke")
  results["val_curve"]                                      # {step: val loss}
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import time
from typing import Any, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tensorflow as tf
from absl import logging
from clu import periodic_actions

from experiments.common import checkpointing
from experiments.common import config_utils
from experiments.common import loop
from experiments.common import metrics as metrics_lib
from experiments.common import parallel
from experiments.common import preemption
from experiments.common import host_malloc
from experiments.common import safetensors_io
from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import mfu as mfu_lib
from experiments.nanogpt import torch_rng
from experiments.nanogpt.configs import base as base_config
from input_pipeline import datasets
from input_pipeline import text
from input_pipeline.datasets import text_corpus
from modules import gpt

TRAIN_METRICS = ("loss", "grad_norm", "nonfinite_steps", "steps")


class TrainState(NamedTuple):
  """Replicated on the devices, saved in checkpoints."""
  step: jax.Array          # [] int32 updates done
  params: Any
  opt_state: Any


# --------------------------------------------------------------------------------------------------
# Configuration.

def validate_config(config: ml_collections.ConfigDict) -> None:
  """Checks field names against configs/base.py and values against each other (ConfigError)."""
  reference = base_config.get_config()
  reference.dataset.builder_kwargs = ml_collections.ConfigDict()
  config_utils.validate_config(config, reference)
  E = config_utils.ConfigError
  for field in ("batch_size", "grad_accum", "eval_iters", "log_every_steps",
                "checkpoint_every_steps", "eval_interval"):
    if config[field] <= 0:
      raise E(field, config[field], "must be positive", f"use e.g. {reference[field]}")
  if config.max_iters < 0:
    raise E("max_iters", config.max_iters, "must be >= 0", "use e.g. 2000")
  if config.decay_lr and config.lr_decay_iters < config.warmup_iters:
    raise E("lr_decay_iters", config.lr_decay_iters, f"is below warmup_iters={config.warmup_iters}",
            "use lr_decay_iters >= warmup_iters (nanoGPT: ~= max_iters)")
  if config.min_lr > config.lr:
    raise E("min_lr", config.min_lr, f"is above lr={config.lr}", "use e.g. lr / 10")
  if config.nonfinite not in ("stop", "skip", "continue"):
    raise E("nonfinite", config.nonfinite, "must be 'stop', 'skip' or 'continue'", "use 'stop'")
  if config.rng not in ("torch", "stateless"):
    raise E("rng", config.rng, "must be 'torch' (nanoGPT's draws) or 'stateless'", "use 'torch'")
  if config.init_from and not os.path.isfile(os.path.join(config.init_from, "config.json")):
    raise E("init_from", config.init_from, "is not a GPT-2 folder (no config.json there)",
            "pass the folder holding config.json and model.safetensors (docs/gpt2.md)")


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> gpt.GPTConfig:
  m = config.model
  try:
    return gpt.GPTConfig(block_size=m.block_size,
                         vocab_size=m.vocab_size if m.vocab_size > 0 else vocab_size,
                         n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout,
                         bias=m.bias, dtype=m.dtype, fast_grad=m.fast_grad)
  except ValueError as e:
    raise config_utils.ConfigError("model", "", str(e), "change the named model field") from None


def check_tokenizer(config: ml_collections.ConfigDict) -> None:
  """BPE-level text needs its tokenizer folder (before the data is read; --dry_run reads none)."""
  kwargs = config.dataset.builder_kwargs
  if kwargs.get("level", "") == "bpe" and not kwargs.get("tokenizer_dir", ""):
    raise config_utils.ConfigError(
        "dataset.builder_kwargs.tokenizer_dir", "", "BPE-level text needs the folder of "
        "vocab.json + merges.txt", "set --config.init_from=FOLDER (the finetune recipes read the "
        "tokenizer there) or --config.dataset.builder_kwargs.tokenizer_dir=FOLDER")


# --------------------------------------------------------------------------------------------------
# Initial parameters (config.init_from: a GPT-2 folder). Kept apart so that the shared trainer can
# take it over as is.

def init_from_model_config(config: ml_collections.ConfigDict, model: gpt.GPTConfig
                           ) -> Tuple[gpt.GPTConfig, gpt.GPTConfig]:
  """(the GPT-2 folder's GPTConfig, the model to run) for config.init_from, from config.json only.

  nanoGPT's from_pretrained + crop: the folder's n_layer, n_head, n_embd, vocab_size, bias;
  config.model's dropout, dtype, fast_grad; block_size = config.model.block_size (<= the folder's
  n_positions). `model` is `model_config(config, dataset vocab)`: its vocab must fit the folder's.
  """
  path = config.init_from
  try:
    folder = hf_gpt2.config_from_hf(hf_gpt2.read_hf_config(path), dropout=config.model.dropout,
                                    where=os.path.join(path, "config.json"))
  except hf_gpt2.GPT2FormatError as e:
    raise checkpointing.CheckpointError(f"--config.init_from={path!r}: {e}") from None
  if config.model.block_size > folder.block_size:
    raise config_utils.ConfigError(
        "model.block_size", config.model.block_size,
        f"exceeds the GPT-2 folder's n_positions={folder.block_size}",
        f"use model.block_size <= {folder.block_size} (smaller crops the positions, as nanoGPT)")
  if model.vocab_size > folder.vocab_size:
    raise config_utils.ConfigError(
        "init_from", path, f"the model needs {model.vocab_size} token ids (the dataset's or "
        f"model.vocab_size) but the folder's vocab_size is {folder.vocab_size}",
        "prepare the text with this folder's tokenizer (dataset.builder_kwargs.tokenizer_dir) and "
        "leave model.vocab_size at -1")
  run = dataclasses.replace(folder, block_size=config.model.block_size, dtype=model.dtype,
                            fast_grad=model.fast_grad)
  shape = ("n_layer", "n_head", "n_embd")
  if any(getattr(model, k) != getattr(run, k) for k in shape):
    logging.info("init_from %s: the folder's model args %s replace config.model's %s", path,
                 {k: getattr(run, k) for k in shape}, {k: getattr(model, k) for k in shape})
  return folder, run


def initial_params(config: ml_collections.ConfigDict, model: gpt.GPTConfig
                   ) -> Tuple[gpt.GPTConfig, Any, int]:
  """(model config, initial params, torch-generator draws the init used) of a run.

  config.init_from set: the GPT-2 folder's weights (experiments/nanogpt/hf_gpt2.py) in the model of
  `init_from_model_config`, positions cropped to block_size; with rng="torch" the batch stream
  starts after the draws nanoGPT's from_pretrained spends on GPT(config)'s init
  (`hf_gpt2.nanogpt_init_draws` of the folder's shape; transformers' own loader is taken to draw
  nothing, as recent versions that build the model without initialising it). Otherwise nanoGPT's
  initial weights for the seed (rng="torch", torch_rng) or Haiku's (rng="stateless").
  """
  if config.init_from:
    folder, run = init_from_model_config(config, model)
    try:
      loaded, params = hf_gpt2.load_pretrained(config.init_from, dropout=config.model.dropout)
      _, params = hf_gpt2.crop_block_size(loaded, params, run.block_size)
    except (hf_gpt2.GPT2FormatError, safetensors_io.SafetensorsError) as e:
      raise checkpointing.CheckpointError(f"--config.init_from={config.init_from!r}: {e}") from None
    draws = hf_gpt2.nanogpt_init_draws(folder) if config.rng == "torch" else 0
    return run, jax.tree.map(jnp.asarray, params), draws
  if config.rng == "torch":      # nanoGPT's initial weights for this seed (torch_rng)
    params, draws = torch_rng.init_params(model, config.seed)
    return model, jax.tree.map(jnp.asarray, params), draws
  return model, gpt.GPTModel(model).init(jax.random.key(config.seed)), 0


def lr_at(it: Any, config: ml_collections.ConfigDict) -> Any:
  """nanoGPT's get_lr of the 0-based iteration `it` (Python float, or jnp for an array)."""
  lr, min_lr = config.lr, config.min_lr
  warm, decay = config.warmup_iters, config.lr_decay_iters
  if not config.decay_lr:
    return lr if not isinstance(it, jax.Array) else jnp.full((), lr, jnp.float32)
  if not isinstance(it, jax.Array):
    if it < warm:
      return lr * (it + 1) / (warm + 1)
    if it > decay:
      return min_lr
    ratio = (it - warm) / max(decay - warm, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
  it = it.astype(jnp.float32)
  ratio = jnp.clip((it - warm) / max(decay - warm, 1), 0.0, 1.0)
  cosine = min_lr + 0.5 * (1.0 + jnp.cos(math.pi * ratio)) * (lr - min_lr)
  return jnp.where(it < warm, lr * (it + 1) / (warm + 1),
                   jnp.where(it > decay, min_lr, cosine)).astype(jnp.float32)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Clip (global norm) -> AdamW with the decay mask; optax's update count = nanoGPT's iteration."""
  schedule = lambda count: lr_at(jnp.asarray(count), config)   # noqa: E731
  adamw = optax.adamw(schedule, b1=config.beta1, b2=config.beta2, eps=1e-8,
                      weight_decay=config.weight_decay, mask=gpt.decay_mask)
  if config.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw)
  return adamw


# --------------------------------------------------------------------------------------------------
# Data.

class TextData:
  """This host's train/val token arrays and its random-window streams."""

  def __init__(self, config: ml_collections.ConfigDict):
    from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
    ds = config.dataset
    self.source = pipeline.DataSource.from_config(ds, seed=config.seed)
    builder = datasets.get_builder(self.source.name, self.source.data_dir,
                                   self.source.builder_kwargs)
    if not builder.is_prepared():
      raise FileNotFoundError(
          f"{builder.info.full_name} is not prepared in {self.source.data_dir}; run `python -m "
          f"input_pipeline.prepare --dataset={self.source.name} --data_dir={self.source.data_dir} "
          f"--manual_dir=<folder with the text file>` or set --config.dataset.prepare_if_missing=True "
          f"with --config.dataset.manual_dir")
    self.vocab = text_corpus.vocab_of(builder)
    self.vocab_size = int(builder.info.metadata["vocab_size"])
    self.tokens = {ds.train_split: text_corpus.load_tokens(builder, ds.train_split),
                   ds.val_split: text_corpus.load_tokens(builder, ds.val_split)}
    self.train_split, self.val_split = ds.train_split, ds.val_split

  def torch_stream(self, config, *, n_local: int, init_draws: int) -> torch_rng.BatchStream:
    """nanoGPT's own batch order (config.rng = "torch"): see experiments/nanogpt/torch_rng.py."""
    return torch_rng.BatchStream(
        self.tokens[self.train_split], self.tokens[self.val_split],
        block_size=config.model.block_size, batch_size=config.batch_size,
        grad_accum=config.grad_accum, eval_interval=config.eval_interval,
        eval_iters=config.eval_iters, init_draws=init_draws, seed=config.seed,
        local_device_count=n_local, process_index=jax.process_index(),
        process_count=jax.process_count())

  def stream(self, split: str, stream: str, *, config, n_local: int, accum: int,
             start_step: int):
    return text.window_iterator(
        self.tokens[split], block_size=config.model.block_size, global_batch_size=config.batch_size,
        local_device_count=n_local, accum_steps=accum, seed=config.seed,
        process_index=jax.process_index(), process_count=jax.process_count(), stream=stream,
        start_step=start_step)


# --------------------------------------------------------------------------------------------------
# Steps.

def make_train_step(model: gpt.GPTModel, tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict):
  """(state, batch [A, b, T] x/y, device_index) -> (state, sums); pmapped by the caller."""
  accum = config.grad_accum
  dropout = model.config.dropout > 0
  nonfinite = config.nonfinite

  def loss_fn(params, x, y, rng):
    logits = model.apply(params, x, rng if dropout else None, is_training=dropout)
    return gpt.cross_entropy(logits, y)

  def train_step(state: TrainState, batch, device_index):
    base = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), state.step),
                              device_index)

    def micro(carry, inputs):
      grads, loss = carry
      x, y, i = inputs
      l, g = jax.value_and_grad(loss_fn)(state.params, x, y, jax.random.fold_in(base, i))
      return (jax.tree.map(lambda a, b: a + b / accum, grads, g), loss + l / accum), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    if accum == 1:
      (grads, loss), _ = micro((zeros, jnp.zeros((), jnp.float32)),
                               (batch["x"][0], batch["y"][0], 0))
    else:
      (grads, loss), _ = jax.lax.scan(micro, (zeros, jnp.zeros((), jnp.float32)),
                                      (batch["x"], batch["y"], jnp.arange(accum)))
    grads = jax.lax.pmean(grads, parallel.AXIS)
    loss = jax.lax.pmean(loss, parallel.AXIS)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if nonfinite == "skip":
      params = jax.tree.map(lambda new, old: jnp.where(finite, new, old), params, state.params)
      opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), opt_state,
                               state.opt_state)
    new = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    sums = {"loss": loss, "grad_norm": grad_norm,
            "nonfinite_steps": 1.0 - finite.astype(jnp.float32), "steps": jnp.ones(())}
    return new, sums

  return train_step


def make_eval_step(model: gpt.GPTModel):
  def eval_step(params, batch):
    loss = gpt.cross_entropy(model.apply(params, batch["x"][0]), batch["y"][0])
    return jax.lax.pmean(loss, parallel.AXIS)
  return eval_step


# --------------------------------------------------------------------------------------------------
# The run.

def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """Trains as configured; returns {"val_curve": {step: loss}, "train_curve": ..., "final": ...}.

  Raises the same exceptions as TRM's trainer (loop.Preempted, loop.NonFiniteError, ConfigError,
  WorkdirError, FileNotFoundError, CheckpointError).
  """
  with preemption.PreemptionGuard() as guard:
    return _train_and_evaluate(config, workdir, guard)


def _train_and_evaluate(config, workdir, guard) -> Dict[str, Any]:
  validate_config(config)
  check_tokenizer(config)
  config_utils.check_workdir(workdir)
  if config.cpu_keep_heap:
    host_malloc.keep_heap_for_cpu_backend()   # no page faults on the step's scratch (host_malloc)
  n_local, per_device = loop.check_devices(config, "batch_size")
  data = TextData(config)
  model, params, init_draws = initial_params(config, model_config(config, data.vocab_size))
  if data.vocab_size > model.vocab_size:
    raise config_utils.ConfigError("model.vocab_size", model.vocab_size, f"is below the dataset's "
                                   f"{data.vocab_size} token ids", "use -1 (the dataset's)")
  gpt_model = gpt.GPTModel(model)
  tx = make_optimizer(config)
  total_steps = config.max_iters + 1
  n_params = gpt.num_params(params)
  logging.info("nanoGPT: %s, %s parameters (non-embedding), %d updates, micro-batch %d = %d "
               "processes x %d devices x %d, grad_accum %d", model, f"{n_params:,}", total_steps,
               config.batch_size, jax.process_count(), n_local, per_device, config.grad_accum)
  if jax.process_index() == 0:
    print(f"number of parameters: {n_params / 1e6:.2f}M ({n_params:,})", flush=True)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  acc = metrics_lib.SumAccumulator()
  ckpt = checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                         max_to_keep=config.keep_checkpoints,
                                         save_interval_steps=config.checkpoint_every_steps,
                                         enable_async=config.async_checkpoints)
  curves: Dict[str, Dict[int, float]] = {"train": {}, "val": {}}
  restored = ckpt.restore_latest(
      replicated_like={"state": state, "window": acc.state(TRAIN_METRICS)},
      per_device_like={}, fallback=config.restore_fallback)
  start_step = 0
  if restored is not None:
    start_step, saved, _ = restored
    state = jax.tree.map(jnp.asarray, saved["state"])
    acc.restore(saved["window"], n_local)
    logging.info("Resumed from %s at step %d", ckpt.directory, start_step)
  curves_path = os.path.join(workdir, "curves.json")
  if start_step > 0 and tf.io.gfile.exists(curves_path):       # local path or gs://
    with tf.io.gfile.GFile(curves_path) as f:
      loaded = json.load(f)
    curves = {k: {int(s): float(v) for s, v in loaded.get(k, {}).items() if int(s) <= start_step}
              for k in ("train", "val")}
  if jax.process_index() == 0:
    metrics_lib.write_json(os.path.join(workdir, "model_args.json"),
                           dict(model.model_args(), dtype=model.dtype,
                                vocab=data.vocab or "", dataset=config.dataset.name))

  state = parallel.replicate(state)
  device_index = parallel.shard(parallel.device_indices())
  p_train_step = parallel.pmap_step(make_train_step(gpt_model, tx, config),
                                    replicated_in=(0,), out_axes=(None, 0), donate_argnums=(0,))
  p_eval_step = parallel.pmap_step(make_eval_step(gpt_model), replicated_in=(0,), out_axes=None)

  writer = metrics_lib.create_writer(workdir)
  if start_step == 0:
    writer.write_hparams(loop.flat_hparams(config))
  hooks = [periodic_actions.ReportProgress(num_train_steps=total_steps, writer=writer,
                                           every_steps=config.log_every_steps)]
  if config.rng == "torch":
    batches = data.torch_stream(config, n_local=n_local, init_draws=init_draws)
    train_iter = (batches.train(k) for k in itertools.count(start_step))
  else:
    batches = None
    train_iter = data.stream(data.train_split, "train", config=config, n_local=n_local,
                             accum=config.grad_accum, start_step=start_step)
  peak = mfu_lib.peak_flops_per_device(config.peak_flops) * jax.device_count()
  flops_per_iter = (gpt.flops_per_token(model, n_params) * model.block_size
                    * config.batch_size * config.grad_accum)
  timing = {"t": time.perf_counter(), "ms": []}

  def estimate_loss(step: int) -> Dict[str, float]:
    out = {}
    for split, stream, which in ((data.train_split, "eval_train", "train"),
                                 (data.val_split, "eval_val", "val")):
      if batches is not None:
        eval_iter = iter(batches.eval(step, which))
      else:
        eval_iter = data.stream(split, stream, config=config, n_local=n_local, accum=1,
                                start_step=step * config.eval_iters)
      losses = [p_eval_step(state.params, parallel.shard(next(eval_iter)))
                for _ in range(config.eval_iters)]
      out[split] = float(np.mean([float(parallel.unreplicate(l)) for l in losses]))
    curves["train"][step], curves["val"][step] = out[data.train_split], out[data.val_split]
    writer.write_scalars(step, {"eval/train_loss": out[data.train_split],
                                "eval/val_loss": out[data.val_split]})
    if jax.process_index() == 0:
      print(f"step {step}: train loss {out[data.train_split]:.4f}, val loss "
            f"{out[data.val_split]:.4f}", flush=True)
      metrics_lib.write_json(curves_path, {k: {str(s): v for s, v in c.items()}
                                           for k, c in curves.items()})
    timing["t"] = time.perf_counter()      # evaluation time is not training time
    return out

  def write_train_metrics(step: int) -> None:
    n = acc.num_steps
    sums = acc.pop()
    now = time.perf_counter()
    ms = 1000.0 * (now - timing["t"]) / max(n, 1)
    timing["t"] = now
    timing["ms"].append(ms)
    scalars = {"train/loss": sums.get("loss", 0.0) / max(n, 1),
               "train/grad_norm": sums.get("grad_norm", 0.0) / max(n, 1),
               "train/nonfinite_steps": sums.get("nonfinite_steps", 0.0),
               "train/lr": float(lr_at(step - 1, config)), "train/ms_per_iter": ms,
               "train/mfu": flops_per_iter / (ms / 1000.0) / peak}
    writer.write_scalars(step, scalars)
    if jax.process_index() == 0:
      print(f"iter {step - 1}: loss {scalars['train/loss']:.4f}, time {ms:.2f}ms, "
            f"mfu {100 * scalars['train/mfu']:.2f}%", flush=True)

  def train_step(step: int) -> Dict[str, Any]:
    nonlocal state
    batch = parallel.shard(next(train_iter))
    state, sums = p_train_step(state, batch, device_index)
    return sums

  def save(step: int, force: bool) -> bool:
    return ckpt.save(step, replicated={"state": state, "window": acc.state(TRAIN_METRICS)},
                     per_device={}, force=force)

  def on_preempt(step: int) -> None:
    writer.flush()
    ckpt.wait_until_finished()
    ckpt.close()

  check = functools.partial(loop.check_finite, nonfinite=config.nonfinite, ckpt=ckpt,
                            order=("loss", "grad_norm"))
  if start_step == 0:
    estimate_loss(0)
  logging.info("Training from step %d to %d", start_step, total_steps)
  loop.run_steps(
      start_step=start_step, total_steps=total_steps, train_step=train_step, acc=acc, guard=guard,
      log_every=config.log_every_steps, write_metrics=write_train_metrics,
      eval_every=config.eval_interval, evaluate=estimate_loss,
      checkpoint_every=config.checkpoint_every_steps, save=save, check=check,
      on_preempt=on_preempt, checkpoint_dir=ckpt.directory, hooks=hooks)

  results = {"train_curve": curves["train"], "val_curve": curves["val"],
             "num_params": n_params, "median_ms_per_iter": (float(np.median(timing["ms"]))
                                                            if timing["ms"] else None)}
  if curves["val"] and jax.process_index() == 0:
    rows = {f"step {s}": {"train_loss": curves["train"][s], "val_loss": v}
            for s, v in sorted(curves["val"].items())}
    table = metrics_lib.format_table(rows, ("train_loss", "val_loss"))
    print(f"\nEvaluations (mean over {config.eval_iters} batches per split):\n{table}\n", flush=True)
  metrics_lib.write_json(os.path.join(workdir, "final_eval.json"),
                         {"val_curve": {str(k): v for k, v in curves["val"].items()},
                          "train_curve": {str(k): v for k, v in curves["train"].items()},
                          "num_params": n_params,
                          "median_ms_per_iter": results["median_ms_per_iter"]})
  writer.flush()
  ckpt.wait_until_finished()
  ckpt.close()
  return results
