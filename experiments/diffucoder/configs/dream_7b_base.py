"""Dream-v0-Base-7B (Dream-org/Dream-v0-Base-7B): the same 7.6B architecture as DiffuCoder.

  python -m experiments.diffucoder.convert --hf_dir=/ckpt/Dream-v0-Base-7B \
      --out=/ckpt/dream_base_orbax
  python -m experiments.diffucoder.generate --config=configs/dream_7b_base.py \
      --config.checkpoint=/ckpt/dream_base_orbax --config.tokenizer_dir=/ckpt/Dream-v0-Base-7B

Sampler: the model card's settings: 512 new tokens in 512 steps, temperature 0.2, top_p 0.95,
alg "entropy", alg_temp 0; no chat template; decoding stops at the first <|endoftext|> (151643).

top_k: off by default (`:sampler=harness`, what the evaluation harness behind the published
scores passes: top_k=None); `--config=configs/dream_7b_base.py:sampler=card` gives top_k 50, what
the model card's snippet effectively runs (common.py says why).
"""

from experiments.diffucoder.configs import common
from modules import dream


def get_config(arg=None):
  return common.base_config(model=dream.DREAM_7B, tokens=common.QWEN2_TOKENS,
                            max_new_tokens=512, steps=512, temperature=0.2, top_p=0.95,
                            alg="entropy", chat_template=False,
                            top_k=common.model_card_top_k(arg))
