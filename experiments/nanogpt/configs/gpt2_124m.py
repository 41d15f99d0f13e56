"""nanoGPT's config/train_gpt2.py: GPT-2 124M from scratch (12 x 12 x 768, block 1024, vocab 50304).

123,587,328 parameters. 480 sequences per update (nanoGPT: 12 x 5 micro-steps x 8 GPUs); here 96
per micro-step x 5 (the same sequences, divisible by 8 devices), lr 6e-4 -> 6e-5, 2000 warm-up,
600k iterations. OpenWebText is not here: `--config.dataset.name=text_corpus` with
`--config.dataset.builder_kwargs.file=...` trains it byte-level on your own corpus (vocab 256 is
padded to 50304 only when model.vocab_size says so).

  python -m experiments.nanogpt.main --config=configs/gpt2_124m.py --config.num_devices=8
"""

from experiments.nanogpt.configs import base


def get_config(arg=None):
  del arg
  c = base.get_config()
  c.model.vocab_size = 50304
  c.global_batch_size = 96
  c.grad_accum = 5
  c.eval_interval = 1000
  c.eval_iters = 200
  c.checkpoint_every_steps = 1000
  c.model.dtype = "bfloat16"       # as nanoGPT's autocast on GPUs (parameters and Adam stay float32)
  return c
