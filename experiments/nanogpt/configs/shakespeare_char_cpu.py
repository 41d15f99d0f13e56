"""The README's CPU recipe of nanoGPT: shakespeare_char at 4 x 4 x 128, block 64, batch 12, 2000 iters.

795,904 parameters; the reference reaches val 1.8857 at iteration 2000 here (torch, 2 cores), and so
does this recipe: rng="torch" (base) replays nanoGPT's initial weights and batches, the curve equal
to the reference's to 4 decimals (docs/nanogpt.md section 6).
Arguments: "smoke": 20 iterations with 2 eval batches (tests); "bf16": model.dtype=bfloat16, what
nanoGPT's GPU runs compute under torch.autocast (nanoGPT's CPU run is float32; docs/nanogpt.md
section 2): val 1.8862 at iteration 2000, 0.69x the float32 step time on the Intel CPU of
docs/nanogpt.md section 9.

  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py
  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py:bf16
  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py:smoke --workdir=/tmp/g
"""

from experiments.common import config_utils
from experiments.nanogpt.configs import shakespeare_char


def get_config(arg=None):
  args = config_utils.parse_arg(arg, smoke=False, bf16=False)
  c = shakespeare_char.get_config()
  c.model.n_layer, c.model.n_head, c.model.n_embd = 4, 4, 128
  c.model.block_size = 64
  c.model.dropout = 0.0
  c.global_batch_size = 12
  c.max_iters = 2000
  c.lr_decay_iters = 2000
  c.eval_iters = 20
  c.checkpoint_every_steps = 1000
  if args.bf16:
    c.model.dtype = "bfloat16"
  if args.smoke:
    c.max_iters = 20
    c.lr_decay_iters = 20
    c.warmup_iters = 5
    c.eval_interval = 10
    c.eval_iters = 2
    c.log_every_steps = 5
    c.checkpoint_every_steps = 10
  return c
