r"""Samples text from a GPT (nanoGPT's sample.py): a podlab workdir, a nanoGPT ckpt.pt or a GPT-2 folder.

  python -m experiments.nanogpt.sample --config=configs/shakespeare_char_cpu.py \
      --workdir=workdirs/shakespeare_char_cpu --start="ROMEO:" --num_samples=2 --max_new_tokens=500
  python -m experiments.nanogpt.sample --ckpt=out-shakespeare-char/ckpt.pt \
      --config=configs/shakespeare_char_cpu.py      # a model trained with the reference
  python -m experiments.nanogpt.sample --init_from=gpt2-xl --start="What is the answer?"
        # nanoGPT's `sample.py --init_from=gpt2-xl`: downloaded once from the Hugging Face Hub
  python -m experiments.nanogpt.sample --init_from=/models/gpt2-xl     # a GPT-2 folder, offline
  ... --kv_cache=false       # no cache: a full forward per token (the same tokens, slower)
  ... --window=chunk         # a deviation: re-encode the last block/2 tokens past the block (faster)

Defaults as nanoGPT: temperature 0.8, top-k 200, seed 1337, 10 samples of 500 tokens, start "\n",
and nanoGPT's context (the last block_size tokens; `--window=exact`, see sampling.py).
The vocabulary comes from the config's dataset (prepared on first use; BPE-level text decodes with
its tokenizer_dir's GPT-2 BPE), or with --init_from (a folder, or a name: gpt2 ... gpt2-xl,
owner/name[@revision], resolved by input_pipeline/hub.py) from the folder's vocab.json + merges.txt
(experiments/nanogpt/hf_gpt2.py, input_pipeline/gpt2_bpe.py; "<|endoftext|>" in the prompt is the
one token 50256, as nanoGPT's allowed_special; a prompt with ids outside the model's vocabulary is
refused in one line). `--start=FILE:path` reads the prompt from a file. A GPT-2 folder's GELU
follows its config.json (--gelu=exact: nanoGPT's), which the first line names.
Prints the wall time and tokens/s of each sample.
"""

from __future__ import annotations

import dataclasses
import os
import time

from absl import flags
import numpy as np

from experiments.common import entry
from experiments.common import errors
from experiments.common import trainer
from experiments.common import workdir as workdir_lib
from experiments.nanogpt import hf_gpt2
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import sampling
from experiments.nanogpt import train
from input_pipeline import gpt2_bpe
from input_pipeline import text
from modules import gpt

_CKPT = flags.DEFINE_string("ckpt", None, "A nanoGPT ckpt.pt to sample from instead of --workdir.")
_INIT_FROM = flags.DEFINE_string(
    "init_from", None, "A GPT-2 folder (config.json, model.safetensors, vocab.json, merges.txt) or "
    "its name (gpt2 ... gpt2-xl, owner/name[@revision] on the Hugging Face Hub, downloaded once) to "
    "sample from; takes no --config.")
_START = flags.DEFINE_string("start", "\n", "Prompt text, or FILE:path.")
_NUM = flags.DEFINE_integer("num_samples", 10, "Samples to draw.")
_NEW = flags.DEFINE_integer("max_new_tokens", 500, "Tokens per sample.")
_TEMP = flags.DEFINE_float("temperature", 0.8, "Softmax temperature (0 = greedy).")
_TOPK = flags.DEFINE_integer("top_k", 200, "Keep the top-k logits (0 = all).")
_SEED = flags.DEFINE_integer("seed", 1337, "Sampling seed.")
_CACHE = flags.DEFINE_bool("kv_cache", True, "Use the KV cache where the window allows it.")
_GELU = flags.DEFINE_enum("gelu", "auto", list(hf_gpt2.GELU_CHOICES),
                          "With --init_from: 'auto' = the folder's config.json activation_function "
                          "(OpenAI's gelu_new: the tanh form); 'exact' = nanoGPT's from_pretrained.")
_WINDOW = flags.DEFINE_enum("window", "exact", ["exact", "chunk"],
                            "Context past the block: 'exact' = nanoGPT's last block_size tokens; "
                            "'chunk' = a faster deviation (the last block_size/2, re-encoded).")


def main() -> None:
  config = entry.config()
  if _INIT_FROM.value:
    if config is not None or _CKPT.value:
      raise errors.ConfigError("init_from", _INIT_FROM.value, "samples from a GPT-2 folder alone",
                               "drop --config and --ckpt (those sample from a podlab workdir or a "
                               "nanoGPT ckpt.pt)")
    folder = hf_gpt2.resolve(_INIT_FROM.value, "--init_from")
    try:
      cfg, params = hf_gpt2.load_pretrained(folder, gelu=_GELU.value)  # dropout 0
    except hf_gpt2.GPT2FormatError as e:
      raise errors.FormatError(f"--init_from={_INIT_FROM.value}: {e}") from None
    tok = gpt2_bpe.load(folder)
    gelu = hf_gpt2.describe_gelu(hf_gpt2.read_hf_config(folder), cfg)
    where = _INIT_FROM.value + ("" if folder == _INIT_FROM.value else f" ({folder})")
    print(f"GPT-2 folder {where}: {cfg.model_args()}, {gelu}")
    _sample(gpt.GPTModel(cfg), params, lambda s: tok.encode(s, allowed_special=True), tok.decode)
    return
  if config is None:
    raise errors.ConfigError("", None, "nothing to sample from",
                             "pass --config=RECIPE (with --workdir or --ckpt), or --init_from=FOLDER")
  trainer.check_config(train.NanoGPT(), config)
  train.resolve_names(config)
  data = train.text_data(config)
  kwargs = train.data_config(config).builder_kwargs
  if kwargs.get("level", "") == "bpe":                             # GPT-2 BPE text (finetuning)
    tok = gpt2_bpe.load(kwargs.tokenizer_dir)
    encode, decode = (lambda s: tok.encode(s, allowed_special=True)), tok.decode
  else:
    encode, decode = (lambda s: text.encode(s, data.vocab)), (lambda i: text.decode(i, data.vocab))
  if _CKPT.value:
    cfg, params, meta = nanogpt_checkpoint.load(_CKPT.value)
    print(f"nanoGPT checkpoint {_CKPT.value}: {cfg.model_args()}, iter {meta['iter_num']}, best val "
          f"{meta['best_val_loss']}, GELU {cfg.gelu} (nanoGPT's)")
  else:
    workdir = entry.workdir()
    _, built = trainer.build(train.NanoGPT(), config)
    step, params = trainer.restore_params(train.NanoGPT(), config, workdir)
    cfg = built.model_config
    args_path = workdir_lib.Workdir(workdir).path("model_args.json")
    if os.path.isfile(args_path):      # the GELU the run trained with (its init_from may be gone)
      cfg = dataclasses.replace(cfg, gelu=workdir_lib.read_json(args_path).get("gelu", cfg.gelu))
    print(f"podlab checkpoint {workdir} at step {step}, GELU {cfg.gelu}")
  _sample(gpt.GPTModel(cfg), params, encode, decode)


def _sample(model, params, encode, decode) -> None:
  """nanoGPT's loop: num_samples samples of max_new_tokens from --start, printed."""
  start = _START.value
  if start.startswith("FILE:"):
    with open(start[5:], encoding="utf-8") as f:
      start = f.read()
  prompt = np.asarray([encode(start)], np.int32)                   # [1, T]
  vocab_size = model.config.vocab_size
  bad = gpt.outside_vocabulary(prompt, vocab_size)                 # torch's embedding: IndexError
  if bad:
    raise errors.BadInput(
        f"--start={_START.value[:40]!r}: token ids {bad[:5]} of the prompt are outside the model's "
        f"vocabulary of {vocab_size} ids (its tokenizer has more). Fix: use a prompt the model's "
        "vocabulary covers, or a folder whose vocab.json and config.json vocab_size agree")
  for i in range(_NUM.value):
    t = time.perf_counter()
    out = sampling.generate(model, params, prompt, _NEW.value, temperature=_TEMP.value,
                            top_k=_TOPK.value or None, seed=_SEED.value + i, kv_cache=_CACHE.value,
                            window=_WINDOW.value)
    took = time.perf_counter() - t
    print(decode(out[0]))
    print(f"---------------  ({_NEW.value} tokens in {took:.2f} s, {_NEW.value / took:,.0f} "
          "tokens/s, first sample includes compilation)", flush=True)


if __name__ == "__main__":
  entry.run_program(os.path.dirname(os.path.abspath(__file__)), main, required=())
