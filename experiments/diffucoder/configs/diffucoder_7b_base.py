"""DiffuCoder-7B-Base (apple/DiffuCoder-7B-Base): the 7.6B Dream architecture, code completion.

  python -m experiments.diffucoder.convert --hf_dir=/ckpt/DiffuCoder-7B-Base \
      --out=/ckpt/diffucoder_base_orbax
  python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_base.py \
      --config.checkpoint=/ckpt/diffucoder_base_orbax --config.tokenizer_dir=/ckpt/DiffuCoder-7B-Base

Sampler: the model card's recommended settings: 256 new tokens in 256 steps, temperature 0.2,
top_p 0.95, alg "entropy", alg_temp 0; no chat template (raw code prompts); decoding stops at the
first <|endoftext|> (151643).

top_k: off by default (`:sampler=harness`, what the evaluation harness behind the published
scores passes: top_k=None); `--config=configs/diffucoder_7b_base.py:sampler=card` gives top_k 50, what
the model card's snippet effectively runs (common.py says why).
"""

from experiments.diffucoder.configs import common
from modules import dream


def get_config(arg=None):
  return common.base_config(model=dream.DIFFUCODER_7B, tokens=common.QWEN2_TOKENS,
                            max_new_tokens=256, steps=256, temperature=0.2, top_p=0.95,
                            alg="entropy", chat_template=False,
                            top_k=common.model_card_top_k(arg))
