"""nanoGPT's rows of `make tpu-check` (experiments/tools/tpu_check.py finds this module by name).

The v4_32 pod config (GPT-2 124M on a v4-32, 5 accumulation steps as the recipe, and 1: the same
micro-step without the accumulation loop, whose bound per token checks the loop count), GPT-2 XL
finetuning (configs/finetune_shakespeare.py:gpt2-xl) on a v4-8 and a v5e-8 (the recipe's replicated
state, and `fsdp` with `model.remat`: docs/sharding.md), and GPT-2 XL pretraining at GPT-2 124M's
tokens per update on a v4-32 (v4_32.py:size=gpt2-xl).

  from experiments.nanogpt.tools import tpu_rows
  tpu_rows.CHECKS[0].label                   # 'nanogpt v4_32 gpt2_124m'
"""

from __future__ import annotations

from experiments.common import layout as layout_lib
from experiments.nanogpt import train
from experiments.nanogpt.configs import finetune_shakespeare
from experiments.tools import tpu_rows

Check = tpu_rows.Check


def _fsdp_remat(c) -> None:
  finetune_shakespeare.for_compile(c)          # GPT-2's packaged vocabulary for the data's metadata
  c.sharding = "fsdp"
  c.model.remat = True


CHECKS = [
    Check("nanogpt v4_32 gpt2_124m", train.NanoGPT, "experiments.nanogpt.configs.v4_32", None),
    # The same micro-step without accumulation: its bound per token is the check on the loop count
    # of the accumulation scan (docs/tpu.md).
    Check(f"nanogpt v4_32 gpt2_124m {layout_lib.ACCUM_FIELD}=1", train.NanoGPT,
          "experiments.nanogpt.configs.v4_32", None,
          overrides=lambda c: layout_lib.set_batch(c, accum=1)),
    Check("nanogpt finetune gpt2-xl", train.NanoGPT,
          "experiments.nanogpt.configs.finetune_shakespeare", "gpt2-xl,devices=4", "v4-8",
          overrides=finetune_shakespeare.for_compile),
    Check("nanogpt finetune gpt2-xl", train.NanoGPT,
          "experiments.nanogpt.configs.finetune_shakespeare", "gpt2-xl,devices=8", "v5litepod-8",
          overrides=finetune_shakespeare.for_compile),
    # The same recipe with the state split over the chips and each block recomputed in the
    # backward pass (docs/sharding.md): what makes it fit both slices.
    *[Check("nanogpt finetune gpt2-xl fsdp remat", train.NanoGPT,
            "experiments.nanogpt.configs.finetune_shakespeare", arg, target,
            overrides=_fsdp_remat)
      for arg, target in (("gpt2-xl,devices=4", "v4-8"), ("gpt2-xl,devices=8", "v5litepod-8"))],
    # GPT-2 XL pretraining at GPT-2 124M's tokens per update (v4_32.py:size=gpt2-xl: fsdp, remat).
    Check("nanogpt gpt2-xl pretraining fsdp remat", train.NanoGPT,
          "experiments.nanogpt.configs.v4_32", "size=gpt2-xl"),
]
