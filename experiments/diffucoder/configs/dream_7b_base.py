"""Dream-v0-Base-7B (Dream-org/Dream-v0-Base-7B): the same 7.6B architecture as DiffuCoder.

  python -m experiments.diffucoder.convert --hf_dir=/ckpt/Dream-v0-Base-7B \
      --out=/ckpt/dream_base_orbax
  python -m experiments.diffucoder.generate --config=configs/dream_7b_base.py \
      --config.checkpoint=/ckpt/dream_base_orbax --config.tokenizer_dir=/ckpt/Dream-v0-Base-7B

Sampler: the model card's settings: 512 new tokens in 512 steps, temperature 0.2, top_p 0.95,
alg "entropy", alg_temp 0; no chat template; decoding stops at the first <|endoftext|> (151643).
"""

from experiments.diffucoder.configs import common
from modules import dream


def get_config(arg=None):
  del arg
  return common.base_config(model=dream.DREAM_7B, tokens=common.QWEN2_TOKENS,
                            max_new_tokens=512, steps=512, temperature=0.2, top_p=0.95,
                            alg="entropy", chat_template=False)
