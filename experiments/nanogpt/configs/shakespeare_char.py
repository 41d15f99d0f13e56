"""nanoGPT's config/train_shakespeare_char.py (the GPU recipe): 6 x 6 x 384, block 256, batch 64.

10,646,784 parameters; published best val 1.4697 (~3 min on one A100).

  python -m experiments.nanogpt.main --config=configs/shakespeare_char.py
"""

from experiments.nanogpt.configs import base


def get_config(arg=None):
  del arg
  c = base.get_config()
  c.model.n_layer, c.model.n_head, c.model.n_embd = 6, 6, 384
  c.model.block_size = 256
  c.model.dropout = 0.2
  c.global_batch_size = 64
  c.grad_accum = 1
  c.lr = 1e-3
  c.max_iters = 5000
  c.lr_decay_iters = 5000
  c.min_lr = 1e-4
  c.beta2 = 0.99
  c.warmup_iters = 100
  c.eval_interval = 250
  c.eval_iters = 200
  c.checkpoint_every_steps = 250
  return c
