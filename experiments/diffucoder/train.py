r"""Masked-diffusion training of a Dream-architecture model on the shared trainer (what differs).

The model is modules/dream.py as released (bidirectional attention, the logit at position i predicts
the token at i + 1). The objective, per window x of L tokens (docs/diffucoder.md section 12):

  t ~ U(eps, 1]                         one t per window (t = 1 - (1 - eps) u, u ~ U[0, 1))
  m_j ~ Bernoulli(t), j = 1 .. L - 1    position 0 is never masked: with the shift no logit reads it
  x_t = x with mask_id where m_j        (mask_id: an id of the model's vocabulary no datum uses)
  loss = sum_{b, j} m_bj * CE(logits(x_t)_{b, j-1}, x_bj) / t_b  /  (B (L - 1))

i.e. cross-entropy on the masked positions weighted by 1 / t, divided by the number of positions
that could be masked: LLaDA's normalisation, an unbiased estimate of the masked-diffusion bound on
the negative log-likelihood per token (nats). `noise` and `masked_diffusion_loss` are the two halves.

Evaluation (`masked_token_eval`): `eval_windows` windows of the val split at evenly spaced offsets,
t and the masks drawn once with NumPy from `eval_seed` (fixed: every run and every evaluation scores
the same positions), reporting over the masked positions: masked_ce (mean cross-entropy), masked_acc
(argmax accuracy), elbo (the training loss's formula: the bound per token) and the unigram baseline's
unigram_ce / unigram_elbo on the same positions (train-split character frequencies, add-one).

`--config.init_from` takes a podlab checkpoint, or for `--mode=eval` a Hugging Face Dream folder or a
converted orbax folder (experiments/diffucoder/convert.py `load_checkpoint`) whose architecture
equals config.model.

Synopsis (tests run it with the smoke config):

  from experiments.diffucoder import train
  from experiments.diffucoder.configs import shakespeare_mdm
  results = train.train_and_evaluate(shakespeare_mdm.get_config("smoke"), "/tmp/mdm_smoke")
  results["eval"]["masked_ce"], results["eval"]["unigram_ce"]
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

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
from experiments.diffucoder import convert
from experiments.diffucoder import hf_layout
from experiments.diffucoder import orbax_params
from experiments.diffucoder.configs import shakespeare_mdm
from modules import dream

# The data libraries (TensorFlow, TFDS) load where data is read, not with the step (lazy_import).
data_source = lazy_import.module("input_pipeline.data_source")

PROGRESS = ("train/loss", "train/masked_ce", "train/lr")
RUN_JSON = "mdm_run.json"
"""Written into the workdir at the start of training: the run's config, the model and the vocabulary
(the benchmark rebuilds the model from it)."""


TrainState = experiment.TrainState


# --------------------------------------------------------------------------------------------------
# The objective.

def noise(key: jax.Array, tokens: jax.Array, eps: float, mask_id: int
          ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """The forward process on a batch: (x_t [B, L] int32, masked [B, L] bool, t [B] float32).

  t = 1 - (1 - eps) u with u = uniform(key_t, [B]) in [0, 1), so t in (eps, 1]; masked =
  uniform(key_m, [B, L]) < t, position 0 excluded; (key_t, key_m) = jax.random.split(key).
  """
  B, L = tokens.shape
  key_t, key_m = jax.random.split(key)
  t = 1.0 - (1.0 - eps) * jax.random.uniform(key_t, (B,), jnp.float32)        # [B]
  masked = jax.random.uniform(key_m, (B, L), jnp.float32) < t[:, None]       # [B, L]
  masked = masked.at[:, 0].set(False)
  return jnp.where(masked, mask_id, tokens).astype(jnp.int32), masked, t


def shifted_nll(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """Cross-entropy of each token under the logit of the position before it (Dream's shift):
  nll[b, j] = -log softmax(logits[b, j - 1])[tokens[b, j]] for j >= 1, nll[b, 0] = 0. [B, L]
  float32 (the softmax in float32 whatever the model dtype)."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)       # [B, L-1, V]
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]      # [B, L-1]
  return jnp.pad(nll, ((0, 0), (1, 0)))


def masked_diffusion_loss(logits: jax.Array, tokens: jax.Array, masked: jax.Array,
                          t: jax.Array) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """(loss, sums) of the objective (module doc) for raw logits [B, L, V] of x_t, the clean tokens
  [B, L], masked [B, L] and t [B]. sums: masked_nll (sum of the masked positions' cross-entropy,
  unweighted) and masked (their number), for the mean masked-token loss across devices."""
  B, L = tokens.shape
  nll = shifted_nll(logits, tokens)                                          # [B, L]
  m = masked.astype(jnp.float32)
  loss = jnp.sum(nll * m / t[:, None]) / (B * (L - 1))
  return loss, {"masked_nll": jnp.sum(nll * m), "masked": jnp.sum(m)}


# --------------------------------------------------------------------------------------------------
# Configuration.

def model_config(config: ml_collections.ConfigDict) -> dream.DreamConfig:
  """config.model -> DreamConfig (a bad or unknown field is a ConfigError naming it)."""
  try:
    return dream.DreamConfig.from_dict(config.model.to_dict())
  except ValueError as e:
    raise errors.ConfigError("model", "", str(e), "change the named --config.model field") from None


def validate_config(config: ml_collections.ConfigDict) -> None:
  E = errors.ConfigError
  model = model_config(config)
  if config.seq_len < 2:
    raise E("seq_len", config.seq_len, "must be >= 2 (position 0 is never masked)", "use e.g. 256")
  if not 0 <= config.mask_id < model.vocab_size:
    raise E("mask_id", config.mask_id, f"is not an id of the model's vocabulary (model.vocab_size="
            f"{model.vocab_size})", f"use model.vocab_size - 1 = {model.vocab_size - 1}, or raise "
            "model.vocab_size")
  if not 0 < config.eps < 1:
    raise E("eps", config.eps, "must be in (0, 1)", "use 1e-3")
  if config.total_steps < 0:
    raise E("total_steps", config.total_steps, "must be >= 0", "use e.g. 2000")
  if config.warmup_steps < 0 or config.warmup_steps > max(config.total_steps, 0):
    raise E("warmup_steps", config.warmup_steps, f"must be in [0, total_steps={config.total_steps}]",
            "use e.g. 100")
  if config.min_lr > config.lr:
    raise E("min_lr", config.min_lr, f"is above lr={config.lr}", "use e.g. lr / 10")
  layout_lib.check_batch_multiple(config, "eval_windows", "evaluated in batches of it")
  if config.eval_every_steps < 0:
    raise E("eval_every_steps", config.eval_every_steps, "must be >= 0", "use 0 (at the end only)")


def schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warm-up from 0 to lr over warmup_steps updates, then cosine to min_lr at total_steps."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=config.lr, warmup_steps=config.warmup_steps,
      decay_steps=max(config.total_steps, config.warmup_steps + 1), end_value=config.min_lr)


def decay_mask(params: Any) -> Any:
  """Weight decay on matrices (embedding, projections, head), not on norms and biases."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  return optim.adamw(schedule(config), config, mask=decay_mask)


# --------------------------------------------------------------------------------------------------
# Data.

def text_data(config: ml_collections.ConfigDict) -> data_source.TextSplits:
  """This host's tokens of the dataset's train and val splits (the val split must hold a window)."""
  data = data_source.TextSplits(config.dataset, seed=config.seed)
  n = len(data.tokens[data.val_split])
  if n <= config.seq_len:
    raise errors.ConfigError("seq_len", config.seq_len, f"the {data.val_split} split has only "
                             f"{n} tokens", f"use seq_len < {n}")
  return data


def train_batches(data: data_source.TextSplits, config: ml_collections.ConfigDict,
                  layout: layout_lib.BatchLayout, start_step: int):
  """{"tokens": [local devices, accum, per-device batch, L] int32} per update (random windows,
  a pure function of (seed, host, step): resuming at start_step continues the same stream)."""
  for batch in data.windows(data.train_split, "train", block_size=config.seq_len, layout=layout,
                            accum=layout.accum, start_step=start_step):
    yield {"tokens": batch["x"]}


def unigram_log_probs(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """log p(c) of each of the `vocab_size` data ids from their counts in `tokens`, add-one smoothed
  ([vocab_size] float64): the baseline that knows the character frequencies and nothing else."""
  counts = np.bincount(np.asarray(tokens, np.int64), minlength=vocab_size)[:vocab_size] + 1.0
  return np.log(counts / counts.sum())


def eval_set(val: np.ndarray, *, windows: int, seq_len: int, eps: float, seed: int
             ) -> Dict[str, np.ndarray]:
  """The fixed evaluation set: tokens [E, L] at offsets round(linspace(0, N - L, E)) of `val`,
  t [E] = 1 - (1 - eps) u and masked [E, L] = v < t (position 0 never), with u [E] then v [E, L]
  drawn by np.random.default_rng(seed). The same for every run of a config."""
  offsets = np.round(np.linspace(0, len(val) - seq_len, windows)).astype(np.int64)
  tokens = np.stack([val[o:o + seq_len] for o in offsets]).astype(np.int32)
  rng = np.random.default_rng(seed)
  t = (1.0 - (1.0 - eps) * rng.random(windows)).astype(np.float32)
  masked = rng.random((windows, seq_len)) < t[:, None]
  masked[:, 0] = False
  return {"tokens": tokens, "masked": masked, "t": t}


# --------------------------------------------------------------------------------------------------
# Steps.

def model_forward(model: dream.DreamConfig) -> Callable[[Any, jax.Array], jax.Array]:
  """logits(params, tokens [B, L]) -> raw logits [B, L, V]: every position valid, positions 0..L-1."""
  net = dream.dream_forward(model)

  def logits(params, tokens):
    return net.apply(params, tokens, jnp.ones(tokens.shape, bool))
  return logits


def make_train_step(model: dream.DreamConfig, tx: optax.GradientTransformation,
                    config: ml_collections.ConfigDict, accum: int):
  """(state, None, {"tokens": [A, b, L]}, rng) -> (state, None, sums, finite): the per-device step
  of experiments/common/experiment.py. The masks of micro-step i come from fold_in(rng, i) (the
  trainer's rng of update k on device d: fold_in(fold_in(key(seed), k), d))."""
  eps, mask_id = float(config.eps), int(config.mask_id)
  logits_fn = model_forward(model)

  def loss_fn(params, tokens, key):
    noisy, masked, t = noise(key, tokens, eps, mask_id)
    return masked_diffusion_loss(logits_fn(params, noisy), tokens, masked, t)

  def train_step(state: TrainState, device_state, batch, rng):
    u = device_step.accumulated_update(loss_fn, tx, state.params, state.opt_state,
                                       batch["tokens"], accum, rng)
    metrics = {"loss": u.loss, "grad_norm": u.grad_norm,
               "masked_ce": u.sums["masked_nll"] / jnp.maximum(u.sums["masked"], 1.0)}
    return TrainState(state.step + 1, u.params, u.opt_state), device_state, metrics, u.finite

  return train_step


def make_eval_step(model: dream.DreamConfig, mask_id: int):
  """(params, {"tokens", "masked", "t"} [b, L] / [b]) -> sums over all devices: nll and weighted
  (the masked positions' cross-entropy, and divided by t), correct (argmax hits), count."""
  logits_fn = model_forward(model)

  def eval_step(params, batch):
    tokens, masked, t = batch["tokens"], batch["masked"], batch["t"]
    logits = logits_fn(params, jnp.where(masked, mask_id, tokens))                # [b, L, V]
    nll = shifted_nll(logits, tokens)                                              # [b, L]
    hit = jnp.argmax(logits[:, :-1], axis=-1) == tokens[:, 1:]                     # [b, L-1]
    hit = jnp.pad(hit, ((0, 0), (1, 0)))
    m = masked.astype(jnp.float32)
    sums = {"nll": jnp.sum(nll * m), "weighted": jnp.sum(nll * m / t[:, None]),
            "correct": jnp.sum(hit * m), "count": jnp.sum(m)}
    return jax.lax.psum(sums, parallel.AXIS)
  return eval_step


def masked_token_eval(model: dream.DreamConfig, config: ml_collections.ConfigDict,
                      layout: layout_lib.BatchLayout, evalset: Dict[str, np.ndarray],
                      unigram: np.ndarray) -> Callable[[Any], Dict[str, float]]:
  """`run(replicated params) -> metrics` on the fixed evaluation set (module doc); every host
  evaluates its devices' rows of each global batch, the sums are taken over all devices."""
  step = parallel.compile_step(make_eval_step(model, int(config.mask_id)), layout.rules,
                               state_in=(0,), out_axes=None)
  E, L = evalset["tokens"].shape
  g, per_host = layout.global_batch, layout.per_host_batch
  lo = layout.host_rows[0]
  masked = evalset["masked"]
  uni_nll = -unigram[evalset["tokens"]]                                       # [E, L] float64
  uni_sum = float(np.sum(uni_nll * masked))
  uni_weighted = float(np.sum(uni_nll * masked / evalset["t"][:, None].astype(np.float64)))
  positions = E * (L - 1)

  def run(params) -> Dict[str, float]:
    totals = {"nll": 0.0, "weighted": 0.0, "correct": 0.0, "count": 0.0}
    for start in range(0, E, g):
      rows = slice(start + lo, start + lo + per_host)
      batch = {k: v[rows].reshape((layout.devices_per_host, layout.per_device_batch)
                                  + v.shape[1:]) for k, v in evalset.items()}
      sums = parallel.unreplicate(step(params, parallel.shard(batch, layout.rules)))
      for k in totals:
        totals[k] += float(sums[k])
    count = max(totals["count"], 1.0)
    return {"masked_ce": totals["nll"] / count, "unigram_ce": uni_sum / count,
            "masked_acc": totals["correct"] / count, "elbo": totals["weighted"] / positions,
            "unigram_elbo": uni_weighted / positions, "masked_tokens": totals["count"]}
  return run


# --------------------------------------------------------------------------------------------------
# The experiment.

def train_scalars(config: ml_collections.ConfigDict, sums: Dict[str, float], n: int,
                  step: int) -> Dict[str, float]:
  n = max(n, 1)
  return {"train/loss": sums.get("loss", 0.0) / n, "train/masked_ce": sums.get("masked_ce", 0.0) / n,
          "train/grad_norm": sums.get("grad_norm", 0.0) / n,
          "train/lr": float(schedule(config)(max(step - 1, 0)))}


def final_table(final: Any, history: Any) -> str:
  """The model's and the unigram baseline's loss on the same masked positions, and the curve."""
  del final
  rows = {}
  for step, evals in sorted(history.items()):
    if "eval" in evals:
      e = evals["eval"]
      rows[f"step {step}"] = {"masked_ce": e["masked_ce"], "unigram_ce": e["unigram_ce"],
                              "masked_acc": e["masked_acc"], "elbo": e["elbo"],
                              "unigram_elbo": e["unigram_elbo"]}
  return ("(held-out masked-token loss in nats on the fixed val masks; elbo: the training loss's "
          "bound per token)\n" + metrics_lib.format_table(
              rows, ("masked_ce", "unigram_ce", "masked_acc", "elbo", "unigram_elbo")))


def is_dream_folder(path: str) -> bool:
  """A Hugging Face Dream folder (safetensors) or a converted orbax folder (dream_config.json)."""
  return bool(path) and os.path.isdir(path) and (
      convert.is_hf_dir(path)
      or os.path.isfile(os.path.join(path, orbax_params.PODLAB_CONFIG_JSON)))


class MaskedDiffusion(experiment.Experiment):
  """Masked-diffusion Dream (module doc) on the shared trainer."""

  name = "masked_diffusion"

  def base_config(self) -> ml_collections.ConfigDict:
    return shakespeare_mdm.get_config()

  def validate(self, config: ml_collections.ConfigDict) -> None:
    validate_config(config)

  def prepare(self, config: ml_collections.ConfigDict) -> None:
    data_source.DataSource.from_config(config.dataset, seed=config.seed)   # prepares when asked

  def model_axis_spec(self, config: ml_collections.ConfigDict):
    """Dream's Megatron split (`dream.param_partition_spec`) over `parallel.MODEL_AXIS` for
    config.model_parallel > 1 (with sharding="fsdp"): embedding and lm_head by vocabulary, the
    fused qkv and gate_up columns, o_proj and down_proj rows. XLA's partitioner places the
    collectives; the fused columns are split contiguously (generation reorders them per device
    instead, modules/dream.py `model_parallel_layout`), so the partitioner regroups them at the
    head split."""
    m = int(config.model_parallel)
    try:
      dream.check_model_degree(model_config(config), m)
    except ValueError as e:
      raise errors.ConfigError("model_parallel", m, str(e).split(";")[0],
                               f"use one of {dream.valid_model_degrees(model_config(config))}"
                               ) from None
    return lambda module, name, ndim: tuple(
        dream.param_partition_spec(module, name, parallel.MODEL_AXIS))

  def build(self, config: ml_collections.ConfigDict,
            layout: layout_lib.BatchLayout) -> experiment.Build:
    model, L = model_config(config), int(config.seq_len)
    vocab = int(data_source.dataset_metadata(config.dataset).get("vocab_size") or 0)
    if vocab and config.mask_id < vocab:
      raise errors.ConfigError(
          "mask_id", config.mask_id, f"is an id of the data ({config.dataset.name} uses ids "
          f"0..{vocab - 1})", f"use mask_id >= {vocab} (and model.vocab_size above it)")
    net, tx = dream.dream_forward(model), make_optimizer(config)
    data = functools.cache(lambda: text_data(config))

    def init(rng):
      params = net.init(rng, jnp.zeros((1, L), jnp.int32), jnp.ones((1, L), bool))
      return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params)), None

    @functools.cache
    def score() -> Callable[[Any], Dict[str, float]]:
      d = data()
      evalset = eval_set(d.tokens[d.val_split], windows=int(config.eval_windows), seq_len=L,
                         eps=float(config.eps), seed=int(config.eval_seed))
      return masked_token_eval(model, config, layout, evalset,
                               unigram_log_probs(d.tokens[d.train_split], d.vocab_size))

    def on_start(wd: workdir_lib.Workdir, start_step: int) -> None:
      workdir_lib.write_json(wd.path(RUN_JSON), {
          "config": json.loads(config.to_json()), "model": model.to_dict(),
          "mask_id": int(config.mask_id), "vocab": data().vocab or "",
          "dataset": config.dataset.name})

    evaluation = experiment.Evaluator(
        "eval", lambda ctx: score()(ctx.state.params), every=int(config.eval_every_steps),
        at_end=True, size=int(config.eval_windows))
    n_params, tokens = dream.count_params(model), layout.examples_per_update * L
    return experiment.Build(
        init=init, train_step=make_train_step(model, tx, config, layout.accum),
        batches=lambda start: train_batches(data(), config, layout, start),
        example_batch={"tokens": jax.ShapeDtypeStruct(
            (layout.devices_per_host, layout.accum, layout.per_device_batch, L), jnp.int32)},
        total_steps=int(config.total_steps), evaluators=[evaluation], model_config=model,
        on_start=on_start, display=experiment.Display(
            parameters=f"number of parameters: {n_params:,}; {model}", progress=PROGRESS,
            summary=(f"{n_params:,} parameters (Dream: {model.num_layers} layers x "
                     f"{model.hidden_size}, {model.num_heads}/{model.num_kv_heads} heads, SwiGLU "
                     f"{model.intermediate_size}, vocab {model.vocab_size}, mask id "
                     f"{config.mask_id}, {model.dtype.name}); windows of {L}; "
                     f"{config.total_steps:,} updates of {tokens:,} tokens"),
            train_scalars=functools.partial(train_scalars, config), items_per_step=tokens,
            item_name="tokens", nonfinite_order=("loss", "grad_norm"), final_table=final_table))

  def load_init(self, path: str, build: experiment.Build,
                config: ml_collections.ConfigDict) -> Any:
    """A Hugging Face Dream folder or a converted orbax folder (convert.load_checkpoint): its
    architecture and dtype must equal config.model; a config.json `mask_token_id` must equal
    config.mask_id."""
    if not is_dream_folder(path):
      raise errors.ConfigError(
          "init_from", path, "is neither a podlab checkpoint nor a Dream folder (no checkpoints/, "
          "model.safetensors[.index.json] or dream_config.json there)",
          "pass a podlab workdir, a Hugging Face Dream folder or the --out folder of `python -m "
          "experiments.diffucoder.convert`")
    hf_json = os.path.join(path, hf_layout.CONFIG_JSON)
    if convert.is_hf_dir(path) and os.path.isfile(hf_json):
      with open(hf_json, encoding="utf-8") as f:
        theirs = json.load(f).get("mask_token_id")
      if theirs is not None and int(theirs) != int(config.mask_id):
        raise errors.FormatError(
            f"--config.init_from={path}: its config.json has mask_token_id={theirs}, the config "
            f"mask_id={config.mask_id}. Fix: --config.mask_id={theirs}")
    try:
      return convert.load_checkpoint(path, build.model_config)
    except convert.ConversionError as e:
      raise errors.FormatError(f"--config.init_from={path}: {e}") from None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, Any]:
  """Trains the masked-diffusion model as configured on the shared trainer; returns the final
  evaluation ({"eval": {metric: value}}). See experiments/common/trainer.py for what it raises."""
  return trainer.train_and_evaluate(MaskedDiffusion(), config, workdir)


def read_run(workdir: str) -> Tuple[ml_collections.ConfigDict, Dict[str, Any]]:
  """(the run's config, the rest of RUN_JSON) of a workdir trained by this experiment."""
  path = os.path.join(workdir, RUN_JSON)
  saved = workdir_lib.read_json_if_exists(path)
  if saved is None:
    raise errors.CheckpointError(
        f"{path} is missing: {workdir} was not trained by experiments.diffucoder.main. Fix: train "
        "it (`make diffucoder-train`) or pass the workdir of such a run")
  return ml_collections.ConfigDict(saved.pop("config")), saved
