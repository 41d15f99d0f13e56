"""Mode 1 of the DiffuCoder benchmark: a small random Dream, the timing of one plain diffusion step.

`small_config` is a small random Dream (`random_params` its weights); `bench_cell` compiles the REAL
plain step (`sampler_steps.plain_step_fn`: forward + shift + filtering + selection) for one (batch,
canvas) and times `timed_steps` steps of it: compile_s, ms_step, tokens_per_s and the analytic
GFLOP of a step. `sampler_forward` is the sampler's forward of any DreamConfig (also used by the
decoding comparisons and the 7.6B dry run of experiments/diffucoder/tools/benchmark.py).

Synopsis:

  from experiments.diffucoder import sampler_options
  from experiments.diffucoder.tools import step_speed

  config = step_speed.small_config(hidden=32, layers=1, heads=2, kv_heads=1, vocab=64,
                                   dtype="float32")
  params = step_speed.random_params(config)
  opts = sampler_options.SamplerOptions(steps=12)
  cell = step_speed.bench_cell(config, params, 1, 16, opts, timed_steps=1)
  assert cell["new_tokens"] == 12 and cell["ms_step"] > 0
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampler_steps
from experiments.diffucoder import sampling
from experiments.diffucoder import unmasking
from experiments.diffucoder.tools import tpu_plan
from modules import dream


def small_config(hidden=128, layers=2, heads=4, kv_heads=2, vocab=1024, dtype="bfloat16"):
  """A small random Dream (SwiGLU width 2.75 x hidden, as the 7B's 18944 / 3584 ~ 5.3 halved)."""
  return dream.DreamConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                           num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, dtype=dtype,
                           param_dtype=dtype)


def sampler_forward(config):
  """The sampler's forward(params, tokens, valid, positions, context=None, return_kv=False) of a
  DreamConfig (generate.model_forward; generate is not imported: its entry-point flags would clash
  with this program's --dry_run)."""
  apply = dream.dream_forward(config).apply

  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    return apply(params, tokens, valid, positions, context, return_kv)
  return forward


analytic_flops = tpu_plan.analytic_flops      # one forward's model FLOPs (tests and mode 1 use it)


def random_params(config, seed=0):
  """Random Haiku parameters of a DreamConfig (`dream.dream_forward(config).init`, from `seed`)."""
  return dream.dream_forward(config).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32),
                                          jnp.ones((1, 4), bool))


def bench_cell(config, params, batch: int, canvas: int, opts, timed_steps: int,
               prompt_fraction: float = 0.25, seed: int = 0) -> Dict[str, Any]:
  """Compile and time the plain step for one (batch, canvas); see the module doc."""
  prompt_len = max(int(canvas * prompt_fraction), 1)
  new = canvas - prompt_len
  mask_id = config.vocab_size - 1
  rng = np.random.default_rng(seed)
  tokens = np.concatenate([rng.integers(0, mask_id, (batch, prompt_len)),
                           np.full((batch, new), mask_id)], axis=1).astype(np.int32)
  valid = np.ones_like(tokens, bool)
  positions = np.asarray(sampling.positions_from_valid(jnp.asarray(valid)))
  step = jax.jit(sampler_steps.plain_step_fn(sampler_forward(config), opts, mask_id=mask_id,
                                             start=prompt_len))
  ratios = unmasking.transfer_ratios(new, opts.eps)
  t0 = time.perf_counter()
  compiled = step.lower(params, tokens, valid, positions, jax.random.key(0),
                        jnp.float32(ratios[0])).compile()
  compile_s = time.perf_counter() - t0
  x = jnp.asarray(tokens)
  times = []
  for i in range(timed_steps):
    t0 = time.perf_counter()
    x = compiled(params, x, valid, positions, jax.random.key(i), jnp.float32(ratios[i]))
    x.block_until_ready()
    times.append(time.perf_counter() - t0)
  step_s = statistics.median(times)
  return dict(batch=batch, canvas=canvas, new_tokens=new, compile_s=compile_s,
              ms_step=step_s * 1e3, tokens_per_s=batch * new / (new * step_s),
              gflop_step=analytic_flops(config, batch, canvas) / 1e9,
              gflop_per_s=analytic_flops(config, batch, canvas) / step_s / 1e9)
