"""A tiny random Dream (V 272, D 64, 2 layers, 4 heads, 2 KV heads) for tests and CPU demos.

  python -m experiments.diffucoder.convert --write_random=/tmp/tiny_hf --config=configs/tiny.py
  python -m experiments.diffucoder.generate --config=configs/tiny.py --config.checkpoint=/tmp/tiny_hf

Token ids: 0..255 are byte tokens, the specials sit just above them inside the vocabulary:
<|endoftext|> (pad = eos = bos) 256, <|im_start|> 257, <|im_end|> 258, <|mask|> 259, <|dlm_pad|> 260
(261..271 unused). Sampler: 16 new tokens in 16 steps, temperature 0.2, top_p 0.95, entropy.

Arguments: `dtype=float32` (default bfloat16) sets the compute and parameter dtypes.
"""

from experiments.common import config_utils
from experiments.diffucoder.configs import common
from modules import dream

TINY_TOKENS = dict(pad_id=256, eos_id=256, bos_id=256, im_start_id=257, im_end_id=258, mask_id=259,
                   dlm_pad_id=260)


def get_config(arg=None):
  a = config_utils.parse_arg(arg, dtype="bfloat16")
  model = dream.tiny_config(dtype=a.dtype, param_dtype=a.dtype)
  return common.base_config(model=model, tokens=TINY_TOKENS, max_new_tokens=16, steps=16,
                            temperature=0.2, top_p=0.95, alg="entropy", chat_template=False)
