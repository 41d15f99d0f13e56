"""Pod config: GPT-2 124M (configs/gpt2_124m.py) or any recipe on a TPU v4-32 (16 chips, 4 per host).

Argument recipe=NAME picks the recipe (gpt2_124m, shakespeare_char, shakespeare_char_cpu); the global
micro-batch is rounded up to a multiple of the 16 devices when needed (a deviation, printed by
--dry_run). Each block is recomputed in the backward pass (model.remat) and the state is split over
the chips (sharding=fsdp; docs/sharding.md): the same numbers, fewer bytes moved per step.
size=gpt2-medium | gpt2-large | gpt2-xl trains that GPT-2 size on the recipe at its tokens per update
(GPT-2 XL pretraining at GPT-2 124M's 480 sequences, 491,520 tokens), one sequence per chip per
micro-step (16 x 30 accumulation steps): GPT-2 XL's state is 25 GB in float32 with AdamW, and at the recipe's 6 sequences per chip
the step needs 65.85 GiB per chip even so (docs/sharding.md).

  python -m experiments.nanogpt.main --config=configs/v4_32.py --dry_run
  python -m experiments.nanogpt.main --config=configs/v4_32.py:size=gpt2-xl --dry_run
  launch/pod.sh NAME --bucket B --module experiments.nanogpt.main --config configs/v4_32.py
"""

import importlib

from experiments.common import config_utils
from experiments.nanogpt.configs import finetune_shakespeare


def get_config(arg=None):
  args = config_utils.parse_arg(arg, recipe="gpt2_124m", size="")
  try:
    recipe = importlib.import_module(f"experiments.nanogpt.configs.{args.recipe}")
  except ModuleNotFoundError:
    raise config_utils.ConfigError("arg:recipe", args.recipe, "no such recipe",
                                   "use gpt2_124m, shakespeare_char or shakespeare_char_cpu") from None
  c = recipe.get_config()
  c.num_devices = 16
  c.devices_per_host = 4
  c.global_batch_size = -(-c.global_batch_size // 16) * 16
  if args.size:
    sizes = [n for n in finetune_shakespeare.SIZES if n.startswith("gpt2-")]
    if args.size not in sizes:
      raise config_utils.ConfigError("arg:size", args.size, "not a larger GPT-2 size",
                                     f"use one of {', '.join(sizes)} (or no size: the recipe's own)")
    c.model.n_layer, c.model.n_head, c.model.n_embd, _ = finetune_shakespeare.SIZES[args.size]
    c.sharding = "fsdp"
    c.model.remat = True
    per_update = c.global_batch_size * c.grad_accum           # a multiple of 16 (above)
    c.global_batch_size, c.grad_accum = 16, per_update // 16
  # Each block recomputed in the backward pass (model.remat: the same numbers, about a third more
  # FLOPs): on the TPU a recomputation reads less than storing and reading the activations. GPT-2
  # 124M's step by the TPU compiler: 63.1 -> 45.7 GB accessed, peak 4.54 -> 2.14 GiB (docs/tpu.md).
  c.model.remat = True
  # The state split over the 16 chips (sharding=fsdp: the same numbers, within float32 rounding of
  # the replicated step, tests/test_fsdp.py): per-device optimizer work and state are 1/16, the
  # parameters gathered in bfloat16 for each micro-batch (docs/sharding.md).
  c.sharding = "fsdp"
  c.target = "v4-32"                             # `--dry_run` compiles for it (libtpu)
  c.dataset.prepare_if_missing = True
  return c
