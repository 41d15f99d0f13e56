"""`main.py --dry_run` for nanoGPT: compile one host's training step of a (pod) config on this CPU.

Prints the layout (devices, batch per device, tokens per update), the parameter count, the compile
time and XLA's memory estimate; trains nothing and reads no data (vocab_size from the config, or the
dataset's metadata).

Synopsis:
  python -m experiments.nanogpt.main --config=configs/v4_32.py:recipe=shakespeare_char_cpu --dry_run
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import config_utils
from experiments.common import parallel
from experiments.nanogpt import train
from input_pipeline import datasets
from modules import gpt


def run(config) -> str:
  train.validate_config(config)
  n_local = jax.local_device_count()
  hosts = max(1, config.num_devices // n_local) if config.num_devices > 0 else 1
  n_global = n_local * hosts
  if config.batch_size % n_global:
    raise config_utils.ConfigError("batch_size", config.batch_size,
                                   f"not divisible by the {n_global} devices",
                                   f"use a multiple of {n_global}")
  b = config.batch_size // n_global
  vocab = config.model.vocab_size
  if vocab <= 0:
    vocab = datasets.get_metadata(config.dataset.name)["vocab_size"]
  model = train.model_config(config, vocab)
  gm = gpt.GPTModel(model)
  tx = train.make_optimizer(config)
  params = jax.eval_shape(gm.init, jax.random.key(0))
  state = train.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                           opt_state=jax.eval_shape(tx.init, params))
  step = parallel.pmap_step(train.make_train_step(gm, tx, config), replicated_in=(0,),
                            out_axes=(None, 0))
  T = model.block_size
  batch = {k: jax.ShapeDtypeStruct((n_local, config.grad_accum, b, T), jnp.int32) for k in "xy"}
  t = time.perf_counter()
  compiled = step.lower(state, batch, jax.ShapeDtypeStruct((n_local,), jnp.int32)).compile()
  took = time.perf_counter() - t
  n_params = gpt.num_params(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), params))
  mem = compiled.memory_analysis()
  mem_text = "n/a"
  if mem is not None:
    mem_text = (f"temp {mem.temp_size_in_bytes / 2**30:.2f} GB + arguments "
                f"{mem.argument_size_in_bytes / 2**30:.2f} GB (XLA CPU estimate, one host)")
  lines = [
      ("devices", f"{n_global} = {hosts} hosts x {n_local} (compiled for one host on {n_local} "
                  "fake CPU devices)"),
      ("batch", f"micro-batch {config.batch_size} global, {b} per device, grad_accum "
                f"{config.grad_accum}: {config.batch_size * config.grad_accum * T:,} tokens/update"),
      ("model", f"{model.n_layer} x {model.n_head} x {model.n_embd}, block {T}, vocab "
                f"{model.vocab_size}, {model.dtype}, dropout {model.dropout}, bias {model.bias}"),
      ("parameters", f"{n_params:,} (non-embedding)"),
      ("updates", f"{config.max_iters + 1:,}"),
      ("compile", f"{took:.1f} s"),
      ("memory", mem_text),
  ]
  return "\n".join(f"{k:<12} {v}" for k, v in lines)
