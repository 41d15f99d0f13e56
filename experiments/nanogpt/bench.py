r"""Benchmarks the nanoGPT CPU recipe here: training ms/iteration and KV-cache sampling speed.

Trains the real step of a recipe (default configs/shakespeare_char_cpu.py: batch 12, block 64,
4 x 4 x 128, float32) on random windows of random tokens (the data does not change the cost) with
a block_until_ready per iteration, and prints compile time, the median (and p10/p90) ms/iteration,
tokens/s and MFU against the measured CPU matmul peak; then times sampling 500 tokens (batch 1,
temperature 0.8, top-k 200) with and without the KV cache (compile excluded; the same tokens are
checked greedy). The machine may be shared: medians, not means; the CPU time of the process per
iteration (all threads, `time.process_time`) is printed next to the wall time, as it is what a busy
shared machine does not inflate. The recipe's `cpu_keep_heap` (experiments/common/host_malloc.py)
is applied as in training; `--no_keep_heap` measures without it.

  python -m experiments.nanogpt.bench                          # the CPU recipe, 200 iterations
  python -m experiments.nanogpt.bench --iters=50 --dtype=bfloat16 --xla_flags=--xla_cpu_use_onednn=true
  python -m experiments.nanogpt.bench --iters=40 --skip_sampling --no_keep_heap   # glibc default
  make gpt-bench
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default="shakespeare_char_cpu")
  ap.add_argument("--iters", type=int, default=200)
  ap.add_argument("--warmup", type=int, default=10)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--new_tokens", type=int, default=500)
  ap.add_argument("--xla_flags", default="", help="extra XLA_FLAGS (set before JAX starts)")
  ap.add_argument("--skip_sampling", action="store_true")
  ap.add_argument("--no_keep_heap", action="store_true",
                  help="do not apply the config's cpu_keep_heap (glibc's default mmap behaviour)")
  args = ap.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if args.xla_flags:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()

  import importlib  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(f"experiments.nanogpt.configs.{args.config}").get_config()
  from experiments.common import host_malloc  # pylint: disable=g-import-not-at-top
  keep_heap = c.cpu_keep_heap and not args.no_keep_heap and host_malloc.keep_heap_for_cpu_backend()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.common import parallel  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import mfu  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import sampling  # pylint: disable=g-import-not-at-top
  from experiments.nanogpt import train  # pylint: disable=g-import-not-at-top
  from modules import gpt  # pylint: disable=g-import-not-at-top

  c.model.dtype = args.dtype
  vocab = c.model.vocab_size if c.model.vocab_size > 0 else 65
  cfg = train.model_config(c, vocab)
  model = gpt.GPTModel(cfg)
  tx = train.make_optimizer(c)
  params = model.init(jax.random.key(0))
  n_params = gpt.num_params(params)
  n = jax.local_device_count()
  step = parallel.pmap_step(train.make_train_step(model, tx, c), replicated_in=(0,),
                            out_axes=(None, 0), donate_argnums=(0,))
  state = parallel.replicate(train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params)))
  rng = np.random.default_rng(0)
  T, b = cfg.block_size, c.batch_size // n

  def batch():
    w = rng.integers(0, vocab, (n, c.grad_accum, b, T + 1)).astype(np.int32)
    return parallel.shard({"x": w[..., :-1], "y": w[..., 1:]})

  idx = parallel.shard(parallel.device_indices())
  scratch = step.lower(state, batch(), idx).compile().memory_analysis()
  t0 = time.perf_counter()
  state, sums = step(state, batch(), idx)
  jax.block_until_ready(sums)
  compile_s = time.perf_counter() - t0
  for _ in range(args.warmup):
    state, sums = step(state, batch(), idx)
  jax.block_until_ready(sums)
  times, cpu_times = [], []
  for _ in range(args.iters):
    bt = batch()
    t, c0 = time.perf_counter(), time.process_time()
    state, sums = step(state, bt, idx)
    jax.block_until_ready(sums)
    times.append(1000 * (time.perf_counter() - t))
    cpu_times.append(1000 * (time.process_time() - c0))
  ms = float(np.median(times))
  tokens = c.batch_size * c.grad_accum * T
  peak = mfu.peak_flops_per_device(c.peak_flops) * n
  flops = gpt.flops_per_token(cfg, n_params) * tokens
  rows = [("recipe", f"{args.config}: {cfg.n_layer}x{cfg.n_head}x{cfg.n_embd}, block {T}, batch "
                     f"{c.batch_size}x{c.grad_accum}, {cfg.dtype}, {n} device(s)"),
          ("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") or "(none)"),
          ("parameters", f"{n_params:,}"),
          ("compile", f"{compile_s:.2f} s"),
          ("step scratch", f"{scratch.temp_size_in_bytes / 2**20:.1f} MiB per execution; "
                           f"cpu_keep_heap {'on' if keep_heap else 'off'}"
                           if scratch is not None else "(no memory analysis)"),
          ("ms/iteration", f"median {ms:.2f}  (p10 {np.percentile(times, 10):.2f}, p90 "
                           f"{np.percentile(times, 90):.2f}, {args.iters} iterations)"),
          ("CPU ms/iteration", f"median {np.median(cpu_times):.2f}  (process CPU time, all threads)"),
          ("tokens/s", f"{tokens / ms * 1000:,.0f}"),
          ("MFU", f"{100 * flops / (ms / 1000) / peak:.1f}% of {peak / 1e9:.0f} GFLOP/s "
                  "(measured matmul peak)" if jax.devices()[0].platform == "cpu" else
                  f"{100 * flops / (ms / 1000) / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s")]
  if not args.skip_sampling:
    params = parallel.unreplicate(state.params)
    prompt = np.zeros((1, 1), np.int32)
    speeds = {}
    for cache in (True, False):
      kw = dict(temperature=0.8, top_k=200, seed=1337, kv_cache=cache)
      sampling.generate(model, params, prompt, args.new_tokens, **kw)        # compile
      runs = []
      for _ in range(3):
        t = time.perf_counter()
        sampling.generate(model, params, prompt, args.new_tokens, **kw)
        runs.append(time.perf_counter() - t)
      speeds[cache] = float(np.median(runs))
    greedy = [sampling.generate(model, params, prompt, args.new_tokens, temperature=0.0,
                                kv_cache=cache, context="chunk") for cache in (True, False)]
    same = bool((greedy[0] == greedy[1]).all())
    rows += [("sample, KV cache", f"{args.new_tokens} tokens in {1000 * speeds[True]:.0f} ms "
                                  f"({args.new_tokens / speeds[True]:,.0f} tokens/s)"),
             ("sample, no cache", f"{args.new_tokens} tokens in {1000 * speeds[False]:.0f} ms "
                                  f"({args.new_tokens / speeds[False]:,.0f} tokens/s)"),
             ("cache speed-up", f"{speeds[False] / speeds[True]:.1f}x; greedy tokens identical: "
                                f"{same}")]
  print("\n".join(f"{k:<18} {v}" for k, v in rows), flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
