"""Import (and export) of nanoGPT checkpoints: `ckpt.pt` <-> podlab GPT parameters.

A nanoGPT `ckpt.pt` is a dict with `model` (the state_dict; keys may carry torch.compile's
`_orig_mod.` prefix), `model_args` (n_layer, n_head, n_embd, block_size, bias, vocab_size, dropout),
`optimizer`, `iter_num`, `best_val_loss`, `config`. It is read with
`torch.load(..., weights_only=True)` (tensors, dicts and plain values only; nothing is unpickled
beyond that, and a file that needs more is refused with the reason). Layout: nn.Linear weights are
[out, in] (podlab's `w` is [in, out], so they are transposed); c_attn is q | k | v, head-major, as
podlab's fused qkv_proj; lm_head.weight is tied to transformer.wte.weight; the causal-mask buffers
(`attn.bias` of 4 dims, older nanoGPT) are skipped.

Synopsis:
  python -m experiments.nanogpt.nanogpt_checkpoint --ckpt=out-shakespeare-char/ckpt.pt
        # prints the model args, the parameter count, the checkpoint's iteration and best val loss,
        # and the val loss on the config's dataset (default configs/shakespeare_char_cpu.py's
        # shakespeare_char): the mean cross-entropy over every non-overlapping block_size window
  python -m experiments.nanogpt.nanogpt_checkpoint --ckpt=ckpt.pt --config=configs/shakespeare_char.py \
      --config.dataset.data_dir=/data/tfds --max_windows=200     # another recipe's dataset, 200 windows

  from experiments.nanogpt import nanogpt_checkpoint
  config, params, meta = nanogpt_checkpoint.load("out/ckpt.pt")          # GPTConfig, Haiku params
  state_dict = nanogpt_checkpoint.to_state_dict(params, config)          # numpy, nanoGPT names
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

from experiments.common import console

console.quiet_native_logs()     # CLI: before the data pipeline imports TensorFlow (its oneDNN notice)

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from experiments.common import config_utils
from experiments.common import distributed
from experiments.common import errors
from experiments.common import lazy_import
from modules import gpt

# The data libraries (TensorFlow, TFDS) load where a split is read (lazy_import).
data_source = lazy_import.module("input_pipeline.data_source")
pipeline = lazy_import.module("input_pipeline.pipeline")
text_corpus = lazy_import.module("input_pipeline.builders.text_corpus")

PREFIX = "_orig_mod."


class CheckpointFormatError(errors.FormatError):
  """The file is not a nanoGPT checkpoint this importer understands; the message says why."""


class CheckpointMissing(CheckpointFormatError, FileNotFoundError):
  """The ckpt.pt path does not exist (a FileNotFoundError too, for callers that map it)."""


def _np(x: Any) -> np.ndarray:
  if hasattr(x, "detach"):
    x = x.detach().cpu()
    if str(x.dtype) == "torch.bfloat16":
      x = x.float()
    return x.numpy()
  return np.asarray(x)


def read(path: str) -> Dict[str, Any]:
  """torch.load(path, weights_only=True); a clear error when torch is missing or the file needs
  arbitrary unpickling."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise CheckpointFormatError("reading ckpt.pt needs torch: pip install -e '.[torch]'") from e
  if not os.path.exists(path):
    raise CheckpointMissing(f"--ckpt={path}: no such file. Fix: pass the path of a nanoGPT ckpt.pt")
  try:
    return torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointFormatError(
        f"{path}: cannot be read with torch.load(weights_only=True) ({type(e).__name__}: "
        f"{str(e).splitlines()[0][:300]}). It is not loaded with full unpickling (unsafe); re-save it "
        "as {'model': state_dict, 'model_args': dict} with plain values") from None


def config_from_args(model_args: Dict[str, Any], dtype: str = "float32") -> gpt.GPTConfig:
  need = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
  missing = [k for k in need if k not in model_args]
  if missing:
    raise CheckpointFormatError(f"model_args lacks {missing}; it has {sorted(model_args)}")
  return gpt.GPTConfig(block_size=int(model_args["block_size"]),
                       vocab_size=int(model_args["vocab_size"]), n_layer=int(model_args["n_layer"]),
                       n_head=int(model_args["n_head"]), n_embd=int(model_args["n_embd"]),
                       dropout=float(model_args.get("dropout", 0.0)),
                       bias=bool(model_args.get("bias", True)), dtype=dtype)


def _layer_names(config: gpt.GPTConfig) -> list:
  """(podlab module, nanoGPT prefix, kind) of every LayerNorm ("ln") and Linear ("linear")."""
  names = []
  for i in range(config.n_layer):
    h, t = f"gpt/h_{i}", f"transformer.h.{i}"
    names += [(f"{h}/ln_1", f"{t}.ln_1", "ln"), (f"{h}/attn/qkv_proj", f"{t}.attn.c_attn", "linear"),
              (f"{h}/attn/o_proj", f"{t}.attn.c_proj", "linear"), (f"{h}/ln_2", f"{t}.ln_2", "ln"),
              (f"{h}/mlp/c_fc", f"{t}.mlp.c_fc", "linear"),
              (f"{h}/mlp/c_proj", f"{t}.mlp.c_proj", "linear")]
  return names + [("gpt/ln_f", "transformer.ln_f", "ln")]


def from_state_dict(state_dict: Dict[str, Any], config: gpt.GPTConfig) -> Dict[str, Dict[str, np.ndarray]]:
  """Haiku params (float32 numpy) from a nanoGPT state_dict; checks names and shapes."""
  sd = {}
  for k, v in state_dict.items():
    k = k[len(PREFIX):] if k.startswith(PREFIX) else k
    sd[k] = _np(v).astype(np.float32)
  sd = {k: v for k, v in sd.items() if not (re.fullmatch(r"transformer\.h\.\d+\.attn\.bias", k)
                                             and v.ndim == 4)}
  used = set()

  def take(name, transpose=False):
    if name not in sd:
      raise CheckpointFormatError(f"state_dict has no {name!r} (bias={config.bias}); keys start "
                                  f"with {sorted(sd)[:5]}")
    used.add(name)
    return sd[name].T.copy() if transpose else sd[name]

  p: Dict[str, Dict[str, np.ndarray]] = {
      "gpt/wte": {"embedding": take("transformer.wte.weight")},
      "gpt/wpe": {"embedding": take("transformer.wpe.weight")},
  }

  for dst, src, kind in _layer_names(config):
    w, b = ("weight", "bias") if kind == "ln" else ("w", "b")
    p[dst] = {w: take(f"{src}.weight", transpose=kind == "linear")}
    if config.bias:
      p[dst][b] = take(f"{src}.bias")
  if "lm_head.weight" in sd:
    used.add("lm_head.weight")
    if not np.array_equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
      raise CheckpointFormatError("lm_head.weight differs from transformer.wte.weight; podlab's "
                                  "GPT ties them (as nanoGPT)")
  extra = sorted(set(sd) - used)
  if extra:
    raise CheckpointFormatError(f"unexpected state_dict keys {extra[:5]} (n_layer={config.n_layer}, "
                                f"bias={config.bias}); do model_args match the weights?")
  expected = gpt.GPTModel(config)
  shapes = jax.eval_shape(expected.init, jax.random.key(0))
  for mod, leaves in shapes.items():
    for name, s in leaves.items():
      got = p.get(mod, {}).get(name)
      if got is None or tuple(got.shape) != tuple(s.shape):
        raise CheckpointFormatError(f"{mod}/{name}: shape {None if got is None else got.shape}, the "
                                    f"model_args need {tuple(s.shape)}")
  return p


def to_state_dict(params: Dict[str, Dict[str, Any]], config: gpt.GPTConfig) -> Dict[str, np.ndarray]:
  """The inverse of `from_state_dict` (numpy; lm_head.weight = wte)."""
  p = {m: {n: np.asarray(v, np.float32) for n, v in d.items()} for m, d in params.items()}
  sd = {"transformer.wte.weight": p["gpt/wte"]["embedding"],
        "transformer.wpe.weight": p["gpt/wpe"]["embedding"]}

  for src, dst, kind in _layer_names(config):
    if kind == "ln":
      sd[f"{dst}.weight"] = p[src]["weight"]
    else:
      sd[f"{dst}.weight"] = p[src]["w"].T.copy()
    if config.bias:
      sd[f"{dst}.bias"] = p[src]["bias" if kind == "ln" else "b"]
  sd["lm_head.weight"] = sd["transformer.wte.weight"]
  return sd


def load(path: str, dtype: str = "float32") -> Tuple[gpt.GPTConfig, Dict[str, Any], Dict[str, Any]]:
  """(GPTConfig, params, {"iter_num", "best_val_loss", "config"}) of a nanoGPT ckpt.pt."""
  ckpt = read(path)
  if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
    keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
    raise CheckpointFormatError(f"{path}: expected a dict with 'model' and 'model_args', got {keys}. "
                                "Fix: pass a ckpt.pt saved by nanoGPT's train.py")
  config = config_from_args(dict(ckpt["model_args"]), dtype)
  params = from_state_dict(ckpt["model"], config)
  best = ckpt.get("best_val_loss")
  meta = {"iter_num": ckpt.get("iter_num"),
          "best_val_loss": None if best is None else float(_np(best)),
          "config": ckpt.get("config", {})}
  return config, params, meta


def split_tokens(config, split: str = "") -> Tuple[np.ndarray, int, str]:
  """(token ids of a split, vocab_size, split name) of a nanoGPT config's dataset (prepared on first
  use when config.dataset.prepare_if_missing). `split` "" = config.dataset.val_split."""
  ds = config.dataset
  split = split or ds.val_split
  source = data_source.DataSource.from_config(ds, seed=config.seed)
  builder = pipeline.prepared_builder(source.data_dir, source.name, source.builder_kwargs)
  return (text_corpus.load_tokens(builder, split), int(builder.info.metadata["vocab_size"]),
          split)


def split_loss(model: gpt.GPTModel, params, tokens: np.ndarray, *, batch_size: int = 64,
               max_windows: int = 0) -> Tuple[float, int]:
  """(mean next-token cross-entropy, tokens scored) over every non-overlapping block_size window
  of `tokens` (x = tokens[i:i+T], y = tokens[i+1:i+T+1], i = 0, T, 2T, ...); `max_windows` > 0
  keeps the first that many. Deterministic: the whole split, not nanoGPT's random batches."""
  T = model.config.block_size
  tokens = np.asarray(tokens)
  n = (len(tokens) - 1) // T
  if max_windows > 0:
    n = min(n, max_windows)
  if n < 1:
    raise errors.BadInput(f"the split has {len(tokens)} tokens, fewer than block_size + 1 = {T + 1}. "
                          "Fix: score a longer split or a checkpoint with a smaller block_size")
  starts = np.arange(n) * T
  idx = starts[:, None] + np.arange(T)[None]                     # [n, T]

  @jax.jit
  def summed(params, x, y, valid):
    logp = jax.nn.log_softmax(model.apply(params, x).astype(jnp.float32), axis=-1)   # [b, T, V]
    nll = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]                  # [b, T]
    return jnp.sum(jnp.where(valid[:, None], nll, 0.0))

  total = 0.0
  for lo in range(0, n, batch_size):
    rows = idx[lo:lo + batch_size]
    valid = np.ones(batch_size, bool)
    valid[len(rows):] = False
    rows = np.concatenate([rows, np.repeat(rows[:1], batch_size - len(rows), 0)])   # one shape
    total += float(summed(params, tokens[rows].astype(np.int32),
                          tokens[rows + 1].astype(np.int32), valid))
  return total / (n * T), n * T


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The CLI (see the module synopsis). Returns the exit status: 0, or errors.exit_code (2 for bad
  input) with one error line; any other exception is a bug and keeps its traceback."""
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  here = os.path.dirname(os.path.abspath(__file__))
  argv = list(sys.argv if argv is None else argv)
  if not any(a.split("=")[0] in ("--config", "-config") for a in argv[1:]):
    argv.insert(1, "--config=configs/shakespeare_char_cpu.py")   # before any --config.* override
  argv = config_utils.resolve_config_argv(argv, here)
  fv = flags.FlagValues()                   # private flags: sample.py imports this module
  flags.DEFINE_string("ckpt", None, "A nanoGPT ckpt.pt.", flag_values=fv)
  config_flags.DEFINE_config_file("config", None, "The dataset's config (path[:arg]).",
                                  flag_values=fv, lock_config=False, sys_argv=argv)
  flags.DEFINE_integer("batch_size", 64, "Windows per forward for the val loss.", flag_values=fv)
  flags.DEFINE_integer("max_windows", 0, "Score only the first N windows (0 = the whole split).",
                       flag_values=fv)
  try:
    fv(argv)
  except flags.Error as e:
    text = " ".join(l.strip() for l in str(e).splitlines() if l.strip())
    print(f"error: {text}. Fix: see --helpfull", file=sys.stderr)
    return errors.EXIT_BAD_INPUT
  if not fv.ckpt:
    print("error: --ckpt is missing. Fix: pass --ckpt=path/to/ckpt.pt", file=sys.stderr)
    return errors.EXIT_BAD_INPUT
  config = fv.config
  try:
    cfg, params, meta = load(fv.ckpt)
    tokens, vocab_size, split = split_tokens(config)
    if cfg.vocab_size < vocab_size:
      raise CheckpointFormatError(
          f"vocab_size {cfg.vocab_size} < the dataset's {vocab_size} ({config.dataset.name}): "
          "pass the --config of the dataset the model was trained on")
    loss, scored = split_loss(gpt.GPTModel(cfg), params, tokens, batch_size=fv.batch_size,
                              max_windows=fv.max_windows)
  except errors.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return errors.exit_code(e)
  n = gpt.num_params(params, cfg)
  best = meta["best_val_loss"]
  print(f"nanoGPT checkpoint {fv.ckpt}: iter_num {meta['iter_num']}, best_val_loss "
        f"{'-' if best is None else f'{best:.4f}'}")
  print(f"model_args: {cfg.model_args()}")
  print(f"number of parameters: {n / 1e6:.2f}M ({n:,}; nanoGPT's count, position embeddings "
        "excluded)")
  print(f"val loss: {loss:.4f} ({config.dataset.name} {split} split, {scored:,} tokens in "
        f"{scored // cfg.block_size:,} windows of {cfg.block_size})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
