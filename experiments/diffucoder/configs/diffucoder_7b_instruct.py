"""DiffuCoder-7B-Instruct (apple/DiffuCoder-7B-Instruct; also DiffuCoder-7B-cpGRPO): ChatML prompts.

  python -m experiments.diffucoder.convert --hf_dir=/ckpt/DiffuCoder-7B-Instruct \
      --out=/ckpt/diffucoder_instruct_orbax
  python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_instruct.py \
      --config.checkpoint=/ckpt/diffucoder_instruct_orbax \
      --config.tokenizer_dir=/ckpt/DiffuCoder-7B-Instruct

Sampler: the model card's recommended settings: 256 new tokens in 256 steps, temperature 0.4
(the reference recommends 0.3-0.4 for instruct), top_p 0.95, alg "entropy", alg_temp 0. Prompts are
wrapped in the ChatML template ("<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n
<|im_start|>user\\n{query}\\n<|im_end|>\\n<|im_start|>assistant\\n"); the answer is padded with
<|dlm_pad|> (151667), where decoding stops.

top_k: off by default (`:sampler=harness`, what the evaluation harness behind the published
scores passes: top_k=None); `--config=configs/diffucoder_7b_instruct.py:sampler=card` gives
top_k 50, what the model card's snippet effectively runs (common.py says why).
"""

from experiments.diffucoder.configs import common
from modules import dream


def get_config(arg=None):
  return common.base_config(model=dream.DIFFUCODER_7B, tokens=common.QWEN2_TOKENS,
                            max_new_tokens=256, steps=256, temperature=0.4, top_p=0.95,
                            alg="entropy", chat_template=True,
                            top_k=common.model_card_top_k(arg))
