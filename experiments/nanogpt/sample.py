r"""Samples text from a GPT (nanoGPT's sample.py): a podlab workdir, a nanoGPT ckpt.pt or a GPT-2 folder.

  python -m experiments.nanogpt.sample --config=configs/shakespeare_char_cpu.py \
      --workdir=workdirs/shakespeare_char_cpu --start="ROMEO:" --num_samples=2 --max_new_tokens=500
  python -m experiments.nanogpt.sample --ckpt=out-shakespeare-char/ckpt.pt \
      --config=configs/shakespeare_char_cpu.py      # a model trained with the reference
  ... --kv_cache=false       # nanoGPT's sliding crop, no cache (slower; see sampling.py)
  python -m experiments.nanogpt.sample --init_from=/models/gpt2-xl --start="What is the answer?"
        # nanoGPT's `sample.py --init_from=gpt2-xl`: a Hugging Face GPT-2 folder, offline

Defaults as nanoGPT: temperature 0.8, top-k 200, seed 1337, 10 samples of 500 tokens, start "\n".
The vocabulary comes from the config's dataset (prepared on first use; BPE-level text decodes with
its tokenizer_dir's GPT-2 BPE), or with --init_from from the folder's vocab.json + merges.txt
(experiments/nanogpt/hf_gpt2.py, input_pipeline/gpt2_bpe.py; "<|endoftext|>" in the prompt is the
one token 50256, as nanoGPT's allowed_special). `--start=FILE:path` reads the prompt from a file.
Prints the wall time and tokens/s of each sample.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

from experiments.common import config_utils
from experiments.common import main_lib

_CKPT = flags.DEFINE_string("ckpt", None, "A nanoGPT ckpt.pt to sample from instead of --workdir.")
_INIT_FROM = flags.DEFINE_string(
    "init_from", None, "A GPT-2 folder (config.json, model.safetensors, vocab.json, merges.txt) to "
    "sample from; takes no --config.")
_START = flags.DEFINE_string("start", "\n", "Prompt text, or FILE:path.")
_NUM = flags.DEFINE_integer("num_samples", 10, "Samples to draw.")
_NEW = flags.DEFINE_integer("max_new_tokens", 500, "Tokens per sample.")
_TEMP = flags.DEFINE_float("temperature", 0.8, "Softmax temperature (0 = greedy).")
_TOPK = flags.DEFINE_integer("top_k", 200, "Keep the top-k logits (0 = all).")
_SEED = flags.DEFINE_integer("seed", 1337, "Sampling seed.")
_CACHE = flags.DEFINE_bool("kv_cache", True, "Use the KV cache (context policy 'chunk').")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.common import checkpointing  # pylint: disable=g-import-not-at-top
  from experiments.common import safetensors_io  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import hf_gpt2  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import nanogpt_checkpoint  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import train  # pylint: disable=g-import-not-at-top
  from input_pipeline import gpt2_bpe  # pylint: disable=g-import-not-at-top
  from input_pipeline import text  # pylint: disable=g-import-not-at-top
  from modules import gpt  # pylint: disable=g-import-not-at-top

  config = main_lib._CONFIG.value  # pylint: disable=protected-access
  if _INIT_FROM.value:
    if config is not None or _CKPT.value:
      sys.exit("error: --init_from=FOLDER samples from a GPT-2 folder; pass it without --config "
               "and --ckpt (those sample from a podlab workdir or a nanoGPT ckpt.pt)")
    try:
      cfg, params = hf_gpt2.load_pretrained(_INIT_FROM.value)        # nanoGPT: dropout 0
      tok = gpt2_bpe.load(_INIT_FROM.value)
    except (hf_gpt2.GPT2FormatError, safetensors_io.SafetensorsError, gpt2_bpe.TokenizerError) as e:
      sys.exit(f"error: --init_from={_INIT_FROM.value}: {e}")
    print(f"GPT-2 folder {_INIT_FROM.value}: {cfg.model_args()}")
    _sample(gpt.GPTModel(cfg), params, lambda s: tok.encode(s, allowed_special=True), tok.decode)
    return
  if config is None:
    sys.exit("error: pass --config=RECIPE (with --workdir or --ckpt), or --init_from=GPT2_FOLDER")
  try:
    train.validate_config(config)
    train.check_tokenizer(config)
    data = train.TextData(config)
    kwargs = config.dataset.builder_kwargs
    if kwargs.get("level", "") == "bpe":                          # GPT-2 BPE text (finetuning)
      tok = gpt2_bpe.load(kwargs.tokenizer_dir)
      encode, decode = (lambda s: tok.encode(s, allowed_special=True)), tok.decode
    else:
      encode, decode = (lambda s: text.encode(s, data.vocab)), (lambda i: text.decode(i, data.vocab))
  except (config_utils.ConfigError, FileNotFoundError, gpt2_bpe.TokenizerError) as e:
    sys.exit(f"error: {e}")
  if _CKPT.value:
    cfg, params, meta = nanogpt_checkpoint.load(_CKPT.value)
    print(f"nanoGPT checkpoint {_CKPT.value}: {cfg.model_args()}, iter {meta['iter_num']}, best val "
          f"{meta['best_val_loss']}")
  else:
    workdir = main_lib._WORKDIR.value or main_lib.default_workdir(main_lib.config_filename())  # pylint: disable=protected-access
    cfg = train.model_config(config, data.vocab_size)
    if config.init_from:                          # a finetuned GPT-2: the folder's shape
      try:
        _, cfg = train.init_from_model_config(config, cfg)
      except (config_utils.ConfigError, checkpointing.CheckpointError) as e:
        sys.exit(f"error: {e}")
    model = gpt.GPTModel(cfg)
    tx = train.make_optimizer(config)
    params = model.init(jax.random.key(0))
    template = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    ckpt = checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints"))
    restored = ckpt.restore(replicated_like={"state": template, "window": {
        "sums": {k: np.float32(0) for k in train.TRAIN_METRICS}, "steps": np.int32(0)}},
                            per_device_like={})
    ckpt.close()
    if restored is None:
      sys.exit(f"error: no checkpoint in {workdir}/checkpoints; train first or pass --ckpt")
    step, saved, _ = restored
    params = saved["state"].params
    print(f"podlab checkpoint {workdir} at step {step}")
  _sample(gpt.GPTModel(cfg), params, encode, decode)


def _sample(model, params, encode, decode) -> None:
  """nanoGPT's loop: num_samples samples of max_new_tokens from --start, printed."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import sampling  # pylint: disable=g-import-not-at-top
  start = _START.value
  if start.startswith("FILE:"):
    with open(start[5:], encoding="utf-8") as f:
      start = f.read()
  prompt = np.asarray([encode(start)], np.int32)
  for i in range(_NUM.value):
    t = time.perf_counter()
    out = sampling.generate(model, params, prompt, _NEW.value, temperature=_TEMP.value,
                            top_k=_TOPK.value or None, seed=_SEED.value + i, kv_cache=_CACHE.value)
    took = time.perf_counter() - t
    print(decode(out[0]))
    print(f"---------------  ({_NEW.value} tokens in {took:.2f} s, {_NEW.value / took:,.0f} "
          "tokens/s, first sample includes compilation)", flush=True)


if __name__ == "__main__":
  app.run(main, argv=config_utils.resolve_config_argv(sys.argv, os.path.dirname(
      os.path.abspath(__file__))))
