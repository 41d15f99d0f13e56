r"""Benchmarks the nanoGPT CPU recipe here: training ms/iteration and KV-cache sampling speed.

Trains the real step of a recipe (default configs/shakespeare_char_cpu.py: batch 12, block 64,
4 x 4 x 128) on random windows of random tokens (the data does not change the cost), one
`block_until_ready` per iteration, for each variant (default: float32 = the reference's precision,
and the bfloat16 option), and with `--torch` nanoGPT's iteration re-enacted in PyTorch
(experiments/nanogpt/tools/torch_reference.py: SDPA causal attention, exact GELU, forward + backward,
clip, AdamW; torch's default threads). Variants run in one process, alternating in blocks of
`--block` iterations, so a shared machine's slow and fast periods fall on all of them alike: compare
medians of one run. Printed per variant: median (p10-p90) ms/iteration, process CPU ms/iteration
(all threads), tokens/s, MFU against the measured CPU matmul peak, and the ratio to the PyTorch
median and to the issue's 35-38 ms.

Then sampling `--new_tokens` tokens (default 500; batch 1, temperature 0.8, top-k 200, float32;
compile excluded, median of `--sample_repeats`) for each context policy of
experiments/nanogpt/sampling.py: "exact" (nanoGPT's crop, the default) with and without the KV
cache, and the "chunk" deviation with and without it; for each, whether its greedy tokens equal
nanoGPT's crop (its `generate` loop in PyTorch on the same weights, torch_reference.py; without
torch, podlab's exact no-cache loop) and the first position (prompt included) where they differ. The weights:
`--sample_workdir` (a trained podlab run of the recipe), `--sample_ckpt` (a nanoGPT ckpt.pt), or
else the recipe's initial weights with every matrix scaled by `--sample_scale` (default 8: a random
init predicts nearly flat distributions, greedy decoding then repeats one token whatever the
context; scaled, the argmax depends on the context, as a trained model's does).

  python -m experiments.nanogpt.tools.bench                          # float32 and bfloat16, 200 each
  python -m experiments.nanogpt.tools.bench --torch --skip_sampling  # + the PyTorch step, interleaved
  python -m experiments.nanogpt.tools.bench --variants=float32,float32:autodiff --iters=100
  python -m experiments.nanogpt.tools.bench --variants=bfloat16,bfloat16@float32 --skip_sampling
  python -m experiments.nanogpt.tools.bench --iters=40 --skip_sampling --no_keep_heap   # glibc default
  python -m experiments.nanogpt.tools.bench --sampling_only            # the sampling table alone
  python -m experiments.nanogpt.tools.bench --sampling_only --sample_workdir=workdirs/shakespeare_char_cpu
  make gpt-bench GPT_BENCH_ARGS="--torch"
  make gpt-bench GPT_BENCH_ARGS="--torch --skip_sampling --write_docs"   # into docs/benchmarks.md

`--write_docs` writes the step table, as printed, into docs/benchmarks.md's gpt-bench block
(experiments/tools/doc_tables.py: the command, commit, machine and date above it); a run replaces the
whole block, since its ratios compare variants timed in that one run.

A variant is DTYPE[@ACTIVATIONS][:autodiff]: model.dtype, `@` model.activations (default "autocast";
`bfloat16@float32`: bfloat16 matmul operands only, modules/gpt.py ACTIVATIONS), and `:autodiff` sets
config.cpu_tuning=False (GPTConfig.kernels "default": plain autodiff gradients instead of
modules/kernels/xla_cpu.py `matmul`'s).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import time

import jax
import numpy as np

from experiments.common import device_step
from experiments.common import distributed
from experiments.common import host_malloc
from experiments.common import layout as layout_lib
from experiments.common import mfu
from experiments.common import parallel
from experiments.common import trainer
from experiments.nanogpt import nanogpt_checkpoint
from experiments.nanogpt import sampling
from experiments.nanogpt import train
from experiments.tools import doc_tables
from modules import gpt

REFERENCE_MS = (35.0, 38.0)          # the uncontended nanoGPT figure on this machine


def main(argv=None) -> None:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default="shakespeare_char_cpu")
  ap.add_argument("--variants", default="float32,bfloat16")
  ap.add_argument("--iters", type=int, default=200, help="timed iterations per variant")
  ap.add_argument("--block", type=int, default=10, help="iterations per turn of a variant")
  ap.add_argument("--warmup", type=int, default=10)
  ap.add_argument("--torch", action="store_true", help="also time nanoGPT's step in PyTorch")
  ap.add_argument("--new_tokens", type=int, default=500)
  ap.add_argument("--xla_flags", default="", help="extra XLA_FLAGS (set before JAX starts)")
  ap.add_argument("--skip_sampling", action="store_true")
  ap.add_argument("--sampling_only", action="store_true",
                  help="only the sampling table (on the recipe's freshly initialised weights)")
  ap.add_argument("--sample_repeats", type=int, default=3, help="timed generations per policy")
  ap.add_argument("--sample_workdir", help="sample from this podlab run of the recipe")
  ap.add_argument("--sample_ckpt", help="sample from this nanoGPT ckpt.pt")
  ap.add_argument("--sample_scale", type=float, default=8.0,
                  help="without a workdir/ckpt: scale the initial weight matrices by this")
  ap.add_argument("--no_keep_heap", action="store_true",
                  help="do not keep XLA's scratch in the heap (glibc's default mmap behaviour)")
  ap.add_argument("--write_docs", action="store_true",
                  help="write the step table into docs/benchmarks.md's gpt-bench block")
  args = ap.parse_args(argv)
  if args.write_docs and args.sampling_only:
    ap.error("--write_docs writes the step table, which --sampling_only does not time")
  if args.write_docs:                            # the markers are there before the run, not after
    doc_tables.check_markers(doc_tables.BENCHMARKS_DOC, DOC_TABLE, DOC_WRITER)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if args.xla_flags:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()

  get_config = importlib.import_module(f"experiments.nanogpt.configs.{args.config}").get_config
  keep_heap = (get_config().cpu_tuning and not args.no_keep_heap
               and jax.devices()[0].platform == "cpu" and host_malloc.keep_heap())

  if args.sampling_only:
    _sampling(_sample_model(get_config(), args), args.new_tokens, args.sample_repeats)
    return
  runs = [_jax_run(get_config(), spec, args.warmup) for spec in args.variants.split(",")]
  if args.torch:
    runs.append(_torch_run(get_config(), args.warmup))
  for _ in range(-(-args.iters // args.block)):
    for run in runs:
      for _ in range(args.block):
        t, c0 = time.perf_counter(), time.process_time()
        run["step"]()
        run["ms"].append(1000 * (time.perf_counter() - t))
        run["cpu"].append(1000 * (time.process_time() - c0))

  c = get_config()
  n = jax.local_device_count()
  peak = mfu.peak_flops_per_device(c.peak_flops) * n
  torch_ms = float(np.median(runs[-1]["ms"])) if args.torch else None
  note = (f"recipe: {args.config}, {runs[0]['desc']}; {n} device(s); XLA_FLAGS="
          f"{os.environ.get('XLA_FLAGS', '') or '(none)'}; glibc heap kept "
          f"{'on' if keep_heap else 'off'}; {args.iters} iterations per variant in blocks of "
          f"{args.block}; CPU matmul peak {peak / 1e9:.0f} GFLOP/s (measured)")
  rows = step_rows(runs, peak, torch_ms)
  print(note)
  print(doc_tables.text_table(STEP_COLUMNS, rows))
  for run in runs:
    if run.get("scratch"):
      print(f"{run['name']}: step scratch {run['scratch'] / 2**20:.1f} MiB per execution, compile "
            f"{run['compile_s']:.2f} s")
  if args.write_docs:
    write_docs(rows, note, doc_tables.command_line("experiments.nanogpt.tools.bench",
                                                   sys.argv[1:] if argv is None else argv),
               jax.devices()[0])
    print(f"wrote the step table into {doc_tables.BENCHMARKS_DOC}'s {DOC_TABLE} table",
          flush=True)
  if not args.skip_sampling:
    _sampling(_sample_model(get_config(), args), args.new_tokens, args.sample_repeats)


STEP_COLUMNS = ["variant", "median ms", "p10-p90", "CPU ms", "tokens/s", "MFU", "/torch",
                "/35-38 ms"]
DOC_TABLE = "gpt-bench"
DOC_WRITER = "`make gpt-bench GPT_BENCH_ARGS=--write_docs`"


def step_rows(runs, peak: float, torch_ms=None) -> list:
  """The step table's rows (cells under STEP_COLUMNS) of the timed `runs` (dicts with name, ms and
  cpu lists, tokens and flops per iteration); `peak`: FLOP/s; `torch_ms`: PyTorch's median."""
  rows = []
  for run in runs:
    ms = float(np.median(run["ms"]))
    rows.append({"variant": run["name"], "median ms": f"{ms:.2f}",
                 "p10-p90": f"{np.percentile(run['ms'], 10):.1f}-{np.percentile(run['ms'], 90):.1f}",
                 "CPU ms": f"{np.median(run['cpu']):.1f}",
                 "tokens/s": f"{run['tokens'] / ms * 1000:,.0f}",
                 "MFU": f"{100 * run['flops'] / (ms / 1000) / peak:.1f}%",
                 "/torch": f"{ms / torch_ms:.2f}x" if torch_ms else "-",
                 "/35-38 ms": f"{ms / REFERENCE_MS[0]:.2f}-{ms / REFERENCE_MS[1]:.2f}x"})
  return rows


def write_docs(rows, note: str, command: str, device=None,
               path: str = doc_tables.BENCHMARKS_DOC) -> str:
  """Writes the step table (this run's rows, all of them: the ratios compare within one run) into
  `path`'s gpt-bench block; returns the block."""
  return doc_tables.write_table(path, DOC_TABLE, DOC_WRITER, command=command, columns=STEP_COLUMNS,
                                rows=rows, note=note, device=device)


def _restore_workdir(config, workdir: str):
  """(GPTConfig, params, step) of the latest checkpoint of a podlab nanoGPT run in `workdir`."""
  data = train.text_data(config)
  step, params = trainer.restore_params(train.NanoGPT(), config, workdir)
  return train.model_config(config, data.vocab_size), params, int(step)


def _sample_model(c, args) -> dict:
  """The float32 GPT and weights the sampling table runs on (see the module doc)."""
  if args.sample_workdir:
    cfg, params, step = _restore_workdir(c, args.sample_workdir)
    name = f"{args.sample_workdir} at step {step}"
  elif args.sample_ckpt:
    cfg, params, meta = nanogpt_checkpoint.load(args.sample_ckpt)
    name = f"{args.sample_ckpt} (nanoGPT, iter {meta['iter_num']})"
  else:
    cfg = train.model_config(c, c.model.vocab_size if c.model.vocab_size > 0 else 65)
    params = jax.tree.map(lambda x: x * args.sample_scale if x.ndim == 2 else x,
                          gpt.GPTModel(cfg).init(jax.random.key(0)))
    name = f"{args.config} initial weights, matrices x {args.sample_scale:g}"
  cfg = dataclasses.replace(cfg, dtype="float32")
  return {"name": name, "model": gpt.GPTModel(cfg), "params": params}


def _jax_run(c, spec: str, warmup: int) -> dict:
  """One variant's compiled step and state; `step()` runs one iteration to completion."""

  dtype, _, mode = spec.partition(":")
  if mode not in ("", "autodiff"):
    raise SystemExit(f"--variants: {spec!r}: the suffix must be ':autodiff' (e.g. float32:autodiff)")
  dtype, _, activations = dtype.partition("@")
  if activations and activations not in gpt.ACTIVATIONS:
    raise SystemExit(f"--variants: {spec!r}: '@' names model.activations, one of "
                     f"{', '.join(gpt.ACTIVATIONS)} (e.g. bfloat16@float32)")
  c.model.dtype = dtype
  c.model.activations = activations or "autocast"
  c.cpu_tuning = mode != "autodiff"          # kernels "xla_cpu" (the CPU matmul forms) or "default"
  vocab = c.model.vocab_size if c.model.vocab_size > 0 else 65
  layout, built = trainer.build(train.NanoGPT(), c)   # the trainer's own step
  cfg = built.model_config
  model = gpt.GPTModel(cfg)
  state, _ = trainer.init_state(built, c)
  n_params = gpt.num_params(state.params)
  n = layout.devices_per_host
  step = device_step.parallel_train_step(built.train_step, c.nonfinite, seed=c.seed)
  box = {"state": parallel.replicate(state)}
  rng = np.random.default_rng(0)
  T, b = cfg.block_size, layout.per_device_batch
  idx = parallel.shard(parallel.device_indices())

  def batch():
    w = rng.integers(0, vocab, (n, layout.accum, b, T + 1)).astype(np.int32)
    return parallel.shard({"x": w[..., :-1], "y": w[..., 1:]})

  memory = step.lower(box["state"], None, batch(), idx).compile().memory_analysis()

  def one():
    bt = batch()
    box["state"], _, sums = step(box["state"], None, bt, idx)
    jax.block_until_ready(sums)

  t0 = time.perf_counter()
  one()
  compile_s = time.perf_counter() - t0
  for _ in range(warmup):
    one()
  act = f" ({c.model.activations} activations)" if dtype == "bfloat16" else ""
  return {"name": f"podlab {dtype}{act}" + (" (autodiff grads)" if mode else ""), "step": one,
          "ms": [], "cpu": [], "tokens": layout.examples_per_update * T, "compile_s": compile_s,
          "flops": gpt.flops_per_token(cfg, n_params) * layout.examples_per_update * T,
          "scratch": memory.temp_size_in_bytes if memory is not None else None,
          "desc": f"{cfg.n_layer}x{cfg.n_head}x{cfg.n_embd}, block {T}, batch "
                  f"{layout.global_batch}x{layout.accum}", "model": model, "box": box}


def _torch_run(c, warmup: int) -> dict:
  """nanoGPT's training iteration in PyTorch (float32 on CPU, as its train.py there)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise SystemExit("--torch needs PyTorch: pip install '.[torch]'") from None
  from experiments.nanogpt.tools import torch_reference  # pylint: disable=g-import-not-at-top  (torch is optional)

  m = c.model
  vocab = m.vocab_size if m.vocab_size > 0 else 65
  args = dict(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, block_size=m.block_size,
              vocab_size=vocab, bias=m.bias)
  torch.manual_seed(c.seed)
  model = torch_reference.init_like_nanogpt(torch_reference.GPT(args), m.n_layer)
  named = dict(model.named_parameters())
  opt = torch.optim.AdamW(
      [{"params": [p for p in named.values() if p.dim() >= 2], "weight_decay": c.weight_decay},
       {"params": [p for p in named.values() if p.dim() < 2], "weight_decay": 0.0}],
      lr=c.lr, betas=(c.beta1, c.beta2), eps=1e-8)
  rng = np.random.default_rng(0)
  one_process = layout_lib.batch_layout(c, devices=1, devices_per_host=1, platform="cpu",
                                        check_num_devices=False)    # the whole batch in one process
  T, B, A = m.block_size, one_process.global_batch, one_process.accum

  def one():
    for _ in range(A):
      w = torch.as_tensor(rng.integers(0, vocab, (B, T + 1)))
      logits = model(w[:, :-1])
      loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1))
      (loss / A).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()                                   # nanoGPT logs loss.item(): a sync per iteration

  for _ in range(warmup):
    one()
  n_params = sum(p.numel() for p in named.values()) - named["transformer.wpe.weight"].numel()
  cfg = train.model_config(c, vocab)
  return {"name": f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)", "step": one,
          "ms": [], "cpu": [], "tokens": B * A * T,
          "flops": gpt.flops_per_token(cfg, n_params) * B * A * T}


def _torch_crop(model, params, prompt, new_tokens: int):
  """nanoGPT's greedy `generate` (idx[:, -block_size:], last logits, argmax) in PyTorch on the same
  weights; None without torch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  from experiments.nanogpt.tools import torch_reference  # pylint: disable=g-import-not-at-top  (torch is optional)
  cfg = model.config
  ref = torch_reference.GPT(cfg.model_args())
  sd = nanogpt_checkpoint.to_state_dict(params, cfg)
  ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
  idx = torch.as_tensor(np.asarray(prompt, np.int64))
  with torch.no_grad():
    for _ in range(new_tokens):
      logits = ref(idx[:, -cfg.block_size:])[:, -1, :]
      idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
  return idx.numpy()


POLICIES = (("exact (default)", "exact", True), ("exact", "exact", False),
            ("chunk (deviation)", "chunk", True), ("chunk (deviation)", "chunk", False))
"""(table name, sampling window, KV cache) of each context policy the sampling table runs."""


def crop_reference(model, params, prompt, new_tokens: int):
  """(tokens [1, prompt + new_tokens], where they come from): nanoGPT's greedy crop loop in PyTorch,
  or podlab's exact loop without cache when torch is not installed."""
  crop = _torch_crop(model, params, prompt, new_tokens)
  if crop is not None:
    return crop, "nanoGPT's generate loop in PyTorch"
  return (sampling.generate(model, params, prompt, new_tokens, temperature=0.0, kv_cache=False),
          "podlab's exact loop without cache (torch not installed)")


def greedy_agreement(model, params, prompt, new_tokens: int, crop) -> list:
  """For each of POLICIES: (name, window, cache, tokens equal `crop`, first differing position
  (prompt included) or None), from the policy's greedy (temperature 0) tokens."""
  out = []
  for name, window, cache in POLICIES:
    greedy = np.asarray(sampling.generate(model, params, prompt, new_tokens, temperature=0.0,
                                          kv_cache=cache, window=window))
    crop = np.asarray(crop)
    if greedy.shape != crop.shape:
      raise ValueError(f"{name}: {greedy.shape} tokens against the crop's {crop.shape}")
    differ = np.flatnonzero(greedy[0] != crop[0])
    out.append((name, window, cache, bool(differ.size == 0),
                int(differ[0]) if differ.size else None))
  return out


def _sampling(run: dict, new_tokens: int, repeats: int) -> None:
  model, params = run["model"], run["params"]
  T = model.config.block_size
  prompt = np.zeros((1, 1), np.int32)
  crop, crop_src = crop_reference(model, params, prompt, new_tokens)
  agreement = greedy_agreement(model, params, prompt, new_tokens, crop)
  rows = []
  for (name, window, cache), (_, _, _, same, first) in zip(POLICIES, agreement):
    kw = dict(temperature=0.8, top_k=200, seed=1337, kv_cache=cache, window=window)
    sampling.generate(model, params, prompt, new_tokens, **kw)        # compile
    times = []
    for _ in range(repeats):
      t = time.perf_counter()
      sampling.generate(model, params, prompt, new_tokens, **kw)
      times.append(time.perf_counter() - t)
    rows.append((name, cache, float(np.median(times)), same, first))
  base = rows[0][2]
  print(f"sampling ({run['name']}): {new_tokens} tokens after a 1-token prompt, batch 1, "
        f"temperature 0.8, top-k 200, block_size {T}; median of {repeats} after compilation; "
        f"greedy tokens compared with {crop_src}")
  head = (f"{'window':<18} {'KV cache':>8} {'ms':>8} {'tokens/s':>9} {'vs default':>10} "
          f"{'= nanoGPT crop':>14} {'first differing position':>24}")
  print(head + "\n" + "-" * len(head))
  for name, cache, sec, same, first in rows:
    print(f"{name:<18} {'yes' if cache else 'no':>8} {1000 * sec:8.0f} {new_tokens / sec:9,.0f} "
          f"{sec / base:9.2f}x {str(same):>14} {'-' if first is None else first:>24}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
