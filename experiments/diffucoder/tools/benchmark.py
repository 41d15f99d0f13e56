r"""Speed of Dream / DiffuCoder diffusion sampling, the cache / parallel-decoding options (on a random or
a trained model), and a dry run of the real 7.6B model's step for a device count.

Four modes:

  # 1. tokens/s and ms per diffusion step for batch 1..32 and canvas 256/512 on a small random Dream
  python -m experiments.diffucoder.tools.benchmark --batches=1,2,4,8,16,32 --canvases=256,512
  # 2. whole generations: plain (reference) vs block-wise decoding, prefix / dual KV cache and
  #    confidence-threshold parallel decoding, podlab's variant and Fast-dLLM's exact loop:
  #    forwards, seconds, tokens/s, speed-up, agreement
  python -m experiments.diffucoder.tools.benchmark --compare [--checkpoint=DIR]
  # 3. the 7.6B config's compiled step for a TPU slice (libtpu, as generate.py --dry_run) or, with
  #    --target=cpu, on N fake CPU devices (XLA:CPU): memory per device and FLOPs per step
  python -m experiments.diffucoder.tools.benchmark --dry_run --target=v5e-8 --global_batch=8 --canvas=512
  python -m experiments.diffucoder.tools.benchmark --dry_run --target=cpu --devices=1,4,8 --global_batch=8
  # 4. mode 2 on a TRAINED masked-diffusion model (a workdir of experiments.diffucoder.main; what
  #    `make diffucoder-bench` runs), with the completions' likelihood under the plain model
  python -m experiments.diffucoder.tools.benchmark --trained=workdirs/shakespeare_mdm

Mode 1, per (batch, canvas): the canvas is a prompt of canvas / 4 tokens plus 3 canvas / 4 masks,
decoded with steps = new tokens (the reference's setting, one token per step on average) and the
sampler of `--alg/--temperature/--top_p` (default: entropy, greedy, no top-p; DiffuCoder's recommended
`--temperature=0.2 --top_p=0.95` adds a full-vocabulary sort per masked position and step, which on a
CPU costs more than this small model's forward). compile_s is
the jit compile of the REAL step (`sampling.plain_step_fn`: forward + shift + filtering + selection);
ms_step the median of `--timed_steps` steps after it; tokens_per_s = batch x new / (steps x step time)
= batch / step time. The model (`--hidden/--layers/--heads/--kv_heads/--vocab`) is small so the table
runs in a few minutes on a CPU; a TPU / GPU run of the 7.6B model uses the same code.

`--write_docs` (mode 1) merges the table, as printed, into docs/benchmarks.md's diffucoder-benchmark
block (experiments/tools/doc_tables.py: the command, commit, machine and date), its rows keyed by
model, dtype, sampler, batch and canvas: a run with other options adds rows (and its own "run" line),
one with the same options replaces them. The doc's rows: greedy and top-p at batch 1, canvas 256:

  python -m experiments.diffucoder.tools.benchmark --batches=1 --canvases=256 --dtype=float32 --write_docs
  python -m experiments.diffucoder.tools.benchmark --batches=1 --canvases=256 --dtype=float32 \
      --temperature=0.2 --top_p=0.95 --write_docs

Mode 2 decodes `--compare_prompts` random prompts (greedy, alg entropy unless `--alg`) with each
option and reports agreement = the fraction of generated tokens identical to plain decoding, and
agreement_vs = the same against the decoding the option approximates (a cache against block-wise
decoding without cache, threshold + cache against threshold without cache). The rows: podlab's
block variant (`block_algorithm="podlab"`) and Fast-dLLM's published loop (`"fast_dllm"`; its
threshold rows with Fast-dLLM's steps = new tokens / block length, as its evaluation scripts), each
with and without caches. `--checkpoint=DIR` (a Hugging Face or converted folder, `--mask_id`) runs
them on that model instead of the small random one; `compare_decodings(config, params, ...)` takes
any Dream config and parameters (e.g. a trained one) and returns the rows with the generated tokens.
`--logit_scale` multiplies the random model's output head: a random model's distributions are nearly
flat, so confidence thresholds never fire; scaling the logits makes it confident like a trained one.

Mode 3 with a TPU --target (v2-8, v5e-8, ...) compiles the step with `--model_parallel` (default 1)
for that slice through `tpu_plan.dry_run`, the program and table of `generate.py --dry_run`
(COMPILER ESTIMATES; a step that does not fit exits 2 naming the degree that does). With
--target=cpu (or none) it sets `--xla_force_host_platform_device_count=N` for a child process per N (before JAX starts),
builds the 7.6B parameters abstractly (`jax.eval_shape`, nothing allocated), lowers the pmapped plain
step (params replicated; global_batch / N rows per device) and prints per device: arguments (weights
+ canvas), temp and output bytes of `memory_analysis()` (XLA CPU's estimate; TPU's differs), and
FLOPs per step from `cost_analysis()` next to the analytic count.

Mode 4 restores the newest checkpoint of `--trained` (its config from the workdir's mdm_run.json),
takes `--compare_prompts` (16) held-out prompts of `--prompt_len` characters (default: the run's
seq_len - `--max_new_tokens`) at evenly spaced offsets of the val split, and runs mode 2's rows
(`trained_table`) with two more columns: forwards_per_token (model calls / new tokens; a cached call
runs on a window, so it is cheaper than a plain one) and nll, the mean over the completions' tokens
of -log p(y_j | prompt, y_<j, masks after) under the plain model (`completion_nll`: the exact
negative log-likelihood, in nats per token, of the completion under the left-to-right factorisation
of the masked-diffusion model; every decoding is scored by the same model in the same order). A last
row scores the true continuations of the prompts ("held-out text"; its agreement is the share of
plain's tokens equal to the text). Then the first prompt's completions, decoded.

Shape glossary: B batch (rows), L canvas length, V vocabulary, N devices (mode 3) or new tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

from experiments.common import console

console.quiet_native_logs()     # before TensorFlow (the data pipeline of mode 4) and XLA load

from absl import flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.common import entry  # noqa: E402
from experiments.common import errors  # noqa: E402
from experiments.common import parallel  # noqa: E402
from experiments.common import trainer  # noqa: E402
from experiments.common import workdir as workdir_lib  # noqa: E402
from experiments.diffucoder import convert  # noqa: E402
from experiments.diffucoder import sampling  # noqa: E402
from experiments.diffucoder import train  # noqa: E402
from experiments.diffucoder.tools import tpu_plan  # noqa: E402
from experiments.tools import doc_tables  # noqa: E402
from experiments.tools import tpu_target  # noqa: E402
from modules import dream  # noqa: E402


def _define_flags() -> None:
  """The CLI flags, defined only when this module runs as the program (`__main__`), so that
  importing it (tests, other tools) cannot clash with other modules' flags (e.g. `--devices`)."""
  # pylint: disable=global-statement
  global _BATCHES, _CANVASES, _TIMED, _HIDDEN, _LAYERS, _HEADS, _KV_HEADS, _VOCAB, _DTYPE, _ALG
  global _TEMPERATURE, _TOP_P, _COMPARE, _COMPARE_PROMPTS, _PROMPT_LEN, _NEW, _BLOCK, _THRESHOLD
  global _REPEATS, _LOGIT_SCALE, _DEVICES, _GLOBAL_BATCH, _CANVAS, _PROMPT_FRACTION, _MODEL_PARALLEL
  global _JSON_OUT, _CHILD, _CHECKPOINT, _MASK_ID, _TRAINED, _STEPS, _WRITE_DOCS
  _BATCHES = flags.DEFINE_list("batches", ["1", "2", "4", "8", "16", "32"], "Batch sizes.")
  _CANVASES = flags.DEFINE_list("canvases", ["256", "512"], "Canvas lengths.")
  _TIMED = flags.DEFINE_integer("timed_steps", 3, "Timed steps per cell (median).")
  _HIDDEN = flags.DEFINE_integer("hidden", 128, "Small model: hidden size.")
  _LAYERS = flags.DEFINE_integer("layers", 2, "Small model: layers.")
  _HEADS = flags.DEFINE_integer("heads", 4, "Small model: query heads.")
  _KV_HEADS = flags.DEFINE_integer("kv_heads", 2, "Small model: KV heads.")
  _VOCAB = flags.DEFINE_integer("vocab", 1024, "Small model: vocabulary.")
  _DTYPE = flags.DEFINE_string("dtype", "bfloat16", "Compute and parameter dtype.")
  _ALG = flags.DEFINE_string("alg", "entropy", "Sampler algorithm.")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampler temperature (modes 1, 3).")
  _TOP_P = flags.DEFINE_float("top_p", 1.0, "Sampler top_p (modes 1, 3; 1 = off).")
  _COMPARE = flags.DEFINE_bool("compare", False, "Mode 2: cache / parallel decoding vs plain.")
  _TRAINED = flags.DEFINE_string("trained", None, "Mode 4: the workdir of a masked-diffusion run "
                                 "(experiments.diffucoder.main): the speed-up table on that model.")
  _COMPARE_PROMPTS = flags.DEFINE_integer("compare_prompts", None, "Modes 2, 4: prompts (one "
                                          "batch; default 4, mode 4: 16).")
  _PROMPT_LEN = flags.DEFINE_integer("prompt_len", None, "Modes 2, 4: prompt tokens (default 32; "
                                     "mode 4: the run's seq_len - max_new_tokens).")
  _NEW = flags.DEFINE_integer("max_new_tokens", None, "Modes 2, 4: new tokens (default 128; mode "
                              "4: 3/4 of the run's seq_len, a multiple of --block_length).")
  _STEPS = flags.DEFINE_integer("steps", None, "Modes 2, 4: diffusion steps (default: new tokens).")
  _BLOCK = flags.DEFINE_integer("block_length", 32, "Modes 2, 4: block length.")
  _THRESHOLD = flags.DEFINE_float("threshold", 0.9, "Modes 2, 4: parallel-decoding threshold.")
  _REPEATS = flags.DEFINE_integer("repeats", 3, "Modes 2, 4: timed generations per option (median).")
  _LOGIT_SCALE = flags.DEFINE_float("logit_scale", 1.0, "Mode 2: scales the random output head.")
  _CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Mode 2: a Hugging Face or converted "
                                    "Dream folder to compare on instead of a random model.")
  _MASK_ID = flags.DEFINE_integer("mask_id", None, "Mode 2 with --checkpoint: the <|mask|> id "
                                  "(default: config.json's mask_token_id).")
  _DEVICES = flags.DEFINE_list("devices", ["1", "4", "8"], "Mode 3 (--target=cpu): device counts.")
  _MODEL_PARALLEL = flags.DEFINE_integer("model_parallel", 1, "Mode 3 with --target=TPU: the "
                                         "model-parallel degree (1, 2 or 4).")
  _GLOBAL_BATCH = flags.DEFINE_integer("global_batch", 8, "Mode 3: rows over all devices.")
  _CANVAS = flags.DEFINE_integer("canvas", 512, "Mode 3: canvas length (prompt + new tokens).")
  _PROMPT_FRACTION = flags.DEFINE_float("prompt_fraction", 0.25, "Prompt share of the canvas.")
  _JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the rows as JSON.")
  _WRITE_DOCS = flags.DEFINE_bool("write_docs", False, "Mode 1: merge the table into "
                                  "docs/benchmarks.md's diffucoder-benchmark block.")
  _CHILD = flags.DEFINE_integer("dry_run_child", 0, "(internal) compile for this many devices.")

GB = 1e9
EXPERIMENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # experiments/diffucoder


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


def _random_params(config, seed=0):
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
  step = jax.jit(sampling.plain_step_fn(sampler_forward(config), opts, mask_id=mask_id,
                                        start=prompt_len))
  ratios = sampling.transfer_ratios(new, opts.eps)
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


def _cell(v) -> str:
  """A table cell as the tool prints it (floats to 3 decimals below 10, else 1)."""
  if isinstance(v, float):
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
  return str(v)


def format_rows(rows: List[Dict[str, Any]], columns: Sequence[str]) -> str:
  table = [list(columns)] + [[_cell(r[c]) for c in columns] for r in rows]
  widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
  return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table)


TABLE_COLUMNS = ["model", "dtype", "sampler", "batch", "canvas", "new_tokens", "compile_s",
                 "ms_step", "tokens_per_s", "gflop_step", "gflop_per_s"]
"""Mode 1's table; its first five columns (TABLE_KEY) name a row's options."""
TABLE_KEY = ("model", "dtype", "sampler", "batch", "canvas")
DOC_TABLE = "diffucoder-benchmark"
DOC_WRITER = "`python -m experiments.diffucoder.tools.benchmark --write_docs`"


def setup_cells(config, opts) -> Dict[str, str]:
  """The model, dtype and sampler cells of mode 1's rows (config: the small Dream; opts: its
  SamplerOptions)."""
  sampler = f"{opts.alg}, " + ("greedy" if opts.temperature == 0 else f"T {opts.temperature:g}")
  sampler += f", top_p {opts.top_p:g}" if opts.top_p < 1 else ""
  return {"model": f"{config.hidden_size} x {config.num_layers} layers, "
                   f"{config.num_heads}/{config.num_kv_heads} heads, vocab {config.vocab_size}",
          "dtype": config.dtype.name, "sampler": sampler}


def write_docs(rows: Sequence[Dict[str, Any]], command: str, device=None,
               path: str = doc_tables.BENCHMARKS_DOC) -> str:
  """Merges mode 1's rows (cells as printed) into `path`'s diffucoder-benchmark block, keyed by
  TABLE_KEY: a run with other options (e.g. a top-p sampler) adds its rows beside the others."""
  cells = [{c: _cell(r[c]) for c in TABLE_COLUMNS} for r in rows]
  return doc_tables.write_table(path, DOC_TABLE, DOC_WRITER, command=command, columns=TABLE_COLUMNS,
                                rows=cells, key=TABLE_KEY, device=device)


def run_table() -> List[Dict[str, Any]]:
  config = small_config(_HIDDEN.value, _LAYERS.value, _HEADS.value, _KV_HEADS.value, _VOCAB.value,
                        _DTYPE.value)
  params = _random_params(config)
  rows = []
  for canvas in map(int, _CANVASES.value):
    new = canvas - max(int(canvas * _PROMPT_FRACTION.value), 1)
    opts = sampling.SamplerOptions(steps=new, alg=_ALG.value, temperature=_TEMPERATURE.value,
                                   top_p=_TOP_P.value)
    for batch in map(int, _BATCHES.value):
      row = {**setup_cells(config, opts),
             **bench_cell(config, params, batch, canvas, opts, _TIMED.value, _PROMPT_FRACTION.value)}
      rows.append(row)
      print(format_rows([row], list(row)).splitlines()[-1], file=sys.stderr, flush=True)
  print(f"small random Dream: {dream.count_params(config):,} parameters ({config.hidden_size} "
        f"hidden, {config.num_layers} layers, {config.num_heads}/{config.num_kv_heads} heads, "
        f"vocab {config.vocab_size}, {config.dtype.name}); sampler {_ALG.value}, temperature "
        f"{_TEMPERATURE.value}, top_p {_TOP_P.value}; steps = new tokens = 3/4 of the canvas")
  print(format_rows(rows, TABLE_COLUMNS))
  return rows


def compare_variants(new: int, block_length: int, threshold: float) -> List[Tuple[str, dict, int]]:
  """The decodings mode 2 compares: (name, SamplerOptions fields, index of the row whose decoding it
  approximates). `steps` defaults to `new` (one token per step on average); Fast-dLLM's threshold
  rows use its published steps = new / block_length. The "fast_dllm ..., no cache" rows run
  Fast-dLLM's loop with full forwards (not in its code): the decodings its caches approximate."""
  bl, t = block_length, threshold
  parallel_steps = new // bl
  return [
      ("plain (reference)", dict(), 0),
      (f"blocks of {bl}, no cache", dict(block_length=bl), 0),
      ("prefix cache", dict(block_length=bl, cache="prefix"), 1),
      ("dual cache", dict(block_length=bl, cache="dual"), 1),
      (f"threshold {t}, no cache", dict(block_length=bl, threshold=t), 1),
      (f"dual cache + threshold {t}", dict(block_length=bl, cache="dual", threshold=t), 4),
      ("fast_dllm, no cache", dict(block_length=bl, block_algorithm="fast_dllm"), 0),
      ("fast_dllm prefix cache", dict(block_length=bl, cache="prefix", block_algorithm="fast_dllm"),
       6),
      ("fast_dllm dual cache", dict(block_length=bl, cache="dual", block_algorithm="fast_dllm"), 6),
      (f"fast_dllm threshold {t}, no cache", dict(block_length=bl, threshold=t,
                                                  steps=parallel_steps, block_algorithm="fast_dllm"),
       6),
      (f"fast_dllm prefix + threshold {t}", dict(block_length=bl, cache="prefix", threshold=t,
                                                 steps=parallel_steps, block_algorithm="fast_dllm"),
       9),
      (f"fast_dllm dual + threshold {t}", dict(block_length=bl, cache="dual", threshold=t,
                                               steps=parallel_steps, block_algorithm="fast_dllm"), 9),
  ]


def trained_variants(new: int, block_length: int, threshold: float) -> List[Tuple[str, dict, int]]:
  """Mode 4's rows: `compare_variants`, then the plain sampler with new / 2 and new / 4 steps (2 and
  4 tokens per step on average): the speed any diffusion sampler buys by taking fewer steps, the
  yardstick for what the caches and thresholds buy at their agreement."""
  fewer = [(f"plain, {new // k} steps", dict(steps=new // k), 0) for k in (2, 4) if new // k >= 1]
  return compare_variants(new, block_length, threshold) + fewer


def compare_decodings(config, params, prompt, valid, *, mask_id: int, new_tokens: int,
                      block_length: int, threshold: float, alg: str = "entropy", repeats: int = 3,
                      variants=None, steps: Any = None) -> List[Dict[str, Any]]:
  """Mode 2 on any Dream: `config` a modules.dream.DreamConfig, `params` its Haiku parameters
  (random, converted or trained), prompt / valid [B, P] (left-padded). Each variant (default
  `compare_variants`) decodes greedily: each is compiled (its tokens kept: greedy decoding is
  deterministic), then `repeats` rounds time one generation of every variant in turn (so a change
  of the machine's load over the minutes affects all variants alike); seconds is the median.
  Returns one row per variant: decoding, forwards, seconds, tokens_per_s, speedup (vs the first
  row), agreement (identical generated tokens vs the first row), vs / agreement_vs (vs the row the
  variant approximates) and tokens (the generated [B, new_tokens] ids, for further scoring).
  `steps` (default new_tokens) is the diffusion steps of the variants that do not set their own."""
  forward = sampler_forward(config)
  variants = variants or compare_variants(new_tokens, block_length, threshold)
  start = prompt.shape[1]
  key = jax.random.key(0)
  runners, firsts = [], []
  for name, kw, _ in variants:                        # compile each (and keep its greedy tokens)
    opts = sampling.SamplerOptions(**{"steps": steps or new_tokens, "alg": alg, **kw})
    runner = sampling.Runner(forward, opts, mask_id=mask_id)
    firsts.append(runner.generate(params, prompt, valid, key, max_new_tokens=new_tokens))
    runners.append(runner)
    print(f"compiled {name}: {firsts[-1].forwards} forwards", file=sys.stderr, flush=True)
  times = [[] for _ in variants]
  for _ in range(repeats):                  # rounds over all variants: load drift hits them alike
    for i, runner in enumerate(runners):
      times[i].append(runner.generate(params, prompt, valid, key,
                                      max_new_tokens=new_tokens).seconds)
  gens = [f.tokens[:, start:] for f in firsts]
  seconds = [statistics.median(t) for t in times]
  rows = []
  for i, (name, _, base) in enumerate(variants):
    rows.append(dict(decoding=name, forwards=firsts[i].forwards, seconds=seconds[i],
                     tokens_per_s=gens[i].size / seconds[i], speedup=seconds[0] / seconds[i],
                     agreement=float(np.mean(gens[i] == gens[0])), vs=variants[base][0],
                     agreement_vs=float(np.mean(gens[i] == gens[base])), tokens=gens[i]))
  return rows


def _compare_model():
  """(config, params, mask_id, description) of mode 2: --checkpoint, or a small random Dream."""
  if _CHECKPOINT.value:
    path = _CHECKPOINT.value
    if convert.is_hf_dir(path):
      config = convert.config_from_hf_json(os.path.join(path, convert.CONFIG_JSON))
      mask = json.load(open(os.path.join(path, convert.CONFIG_JSON))).get("mask_token_id")
    else:
      config, mask = convert.saved_config(path), None
    mask = _MASK_ID.value if _MASK_ID.value is not None else mask
    if mask is None:
      raise errors.BadInput(f"--checkpoint={path}: its config has no mask_token_id. Fix: pass "
                            "--mask_id=ID (the <|mask|> token's id)")
    params = convert.load_checkpoint(path, config)
    return config, params, int(mask), f"checkpoint {path}"
  config = small_config(_HIDDEN.value, _LAYERS.value, _HEADS.value, _KV_HEADS.value, _VOCAB.value,
                        _DTYPE.value)
  params = _random_params(config)
  if _LOGIT_SCALE.value != 1.0:
    head = params["dream/lm_head"]["w"]
    params["dream/lm_head"]["w"] = (head.astype("float32") * _LOGIT_SCALE.value).astype(head.dtype)
  return (config, params, config.vocab_size - 1,
          f"small random Dream, output head x {_LOGIT_SCALE.value}")


def run_compare() -> List[Dict[str, Any]]:
  """Mode 2; see the module doc."""
  config, params, mask_id, what = _compare_model()
  rng = np.random.default_rng(0)
  n, prompt_len = _COMPARE_PROMPTS.value or 4, _PROMPT_LEN.value or 32
  prompt = rng.integers(0, min(mask_id, config.vocab_size), (n, prompt_len)).astype(np.int32)
  valid = np.ones_like(prompt, bool)
  new = _NEW.value or 128
  steps = _STEPS.value or new
  rows = compare_decodings(config, params, prompt, valid, mask_id=mask_id, new_tokens=new,
                           block_length=_BLOCK.value, threshold=_THRESHOLD.value, alg=_ALG.value,
                           repeats=_REPEATS.value, steps=steps)
  print(f"{n} prompts of {prompt_len} random tokens, {new} new "
        f"tokens, {steps} steps (Fast-dLLM's threshold rows: {new // _BLOCK.value}), greedy "
        f"{_ALG.value}; {what} (hidden {config.hidden_size}, {config.num_layers} layers, vocab "
        f"{config.vocab_size}, {config.dtype.name}); agreement = identical tokens vs plain; "
        "agreement_vs = vs the decoding the option approximates (`vs`); speedup vs plain; "
        f"seconds: median of {_REPEATS.value} generations after compilation; forwards: model "
        "calls (per block the most any device's loop ran)")
  print(format_rows(rows, ["decoding", "forwards", "seconds", "tokens_per_s", "speedup",
                           "agreement", "vs", "agreement_vs"]))
  for r in rows:
    r.pop("tokens")
  return rows


# --------------------------------------------------------------------------------------------------
# Mode 4: the speed-up table on a trained masked-diffusion model.


@functools.lru_cache(maxsize=8)
def _nll_scorer(config):
  """jit(params, tokens [r, L], pos [r], target [r]) -> -log softmax(raw logits[pos])[target] [r]."""
  apply = dream.dream_forward(config).apply

  @jax.jit
  def score(params, tokens, pos, tgt):
    logits = apply(params, tokens, jnp.ones(tokens.shape, bool))             # [r, L, V]
    row = jnp.take_along_axis(logits, pos[:, None, None], axis=1)[:, 0]      # [r, V]
    logp = jax.nn.log_softmax(row.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, tgt[:, None], axis=-1)[:, 0]          # [r]
  return score


def completion_nll(config, params, prompt: np.ndarray, completion: np.ndarray, *, mask_id: int,
                   rows_per_call: int = 64) -> np.ndarray:
  """nll [B, N] (float64, nats): -log p(y_j | prompt, y_<j, N - j masks) for each token y_j of the
  completions [B, N] after the unpadded prompts [B, P], under the model `config`/`params`.

  The left-to-right chain rule with the masked-diffusion model as the conditional: canvas j is the
  prompt, y_0 .. y_{j-1}, then <|mask|> x (N - j) (the canvas length of the sampler), and y_j is read
  from the raw logit of position P + j - 1 (Dream's shift). Summed over j it is the exact negative
  log-likelihood of the completion under the left-to-right autoregressive model the plain
  masked-diffusion model defines (one of its any-order factorisations), so completions of all
  decodings are scored by one fixed model and one fixed order. B x N canvases, `rows_per_call` per
  forward (the last call padded with repeats)."""
  prompt = np.asarray(prompt, np.int32)
  completion = np.asarray(completion, np.int32)
  B, P = prompt.shape
  N = completion.shape[1]
  if P < 1:
    raise ValueError("completion_nll needs a prompt of at least one token (the shift reads P - 1)")
  canvases = np.full((B, N, P + N), mask_id, np.int32)                      # [B, N, L]
  canvases[:, :, :P] = prompt[:, None]
  for j in range(N):
    canvases[:, j, P:P + j] = completion[:, :j]
  canvases = canvases.reshape(B * N, P + N)
  read = np.tile(P - 1 + np.arange(N), B).astype(np.int32)                  # [B N] logit position
  target = completion.reshape(-1)
  score = _nll_scorer(config)
  total = B * N
  out = np.zeros(total, np.float64)
  for lo in range(0, total, rows_per_call):
    idx = np.arange(lo, lo + rows_per_call) % total
    got = np.asarray(score(params, canvases[idx], read[idx], target[idx]), np.float64)
    n = min(rows_per_call, total - lo)
    out[lo:lo + n] = got[:n]
  return out.reshape(B, N)


def trained_table(config, params, prompt: np.ndarray, continuation: np.ndarray, *, mask_id: int,
                  new_tokens: int, block_length: int, threshold: float, steps: Any = None,
                  repeats: int = 3, variants=None) -> List[Dict[str, Any]]:
  """The rows of mode 4: `compare_decodings` of `variants` (default `trained_variants`) on
  unpadded prompts [B, P] (greedy, entropy) plus, per row, forwards_per_token (forwards / new
  tokens) and nll (mean `completion_nll` of its completions under the plain model, nats per token),
  then a last row "held-out text" scoring the true continuations [B, new_tokens] (its agreement: the
  share of plain's tokens equal to the text)."""
  prompt = np.asarray(prompt, np.int32)
  valid = np.ones(prompt.shape, bool)
  variants = variants or trained_variants(new_tokens, block_length, threshold)
  rows = compare_decodings(config, params, prompt, valid, mask_id=mask_id, new_tokens=new_tokens,
                           block_length=block_length, threshold=threshold, repeats=repeats,
                           variants=variants, steps=steps)
  for r in rows:
    r["forwards_per_token"] = r["forwards"] / new_tokens
    r["nll"] = float(np.mean(completion_nll(config, params, prompt, r["tokens"], mask_id=mask_id)))
  truth = np.asarray(continuation, np.int32)
  rows.append(dict(decoding="held-out text", forwards="-", forwards_per_token="-", seconds="-",
                   tokens_per_s="-", speedup="-", agreement=float(np.mean(truth == rows[0]["tokens"])),
                   vs="-", agreement_vs="-", tokens=truth,
                   nll=float(np.mean(completion_nll(config, params, prompt, truth,
                                                    mask_id=mask_id)))))
  return rows


TRAINED_COLUMNS = ["decoding", "forwards", "forwards_per_token", "seconds", "tokens_per_s",
                   "speedup", "agreement", "nll", "vs", "agreement_vs"]


def _show(ids: np.ndarray, vocab: str) -> str:
  """Characters of ids (ids outside the vocabulary, e.g. the mask, as '_'), newlines as '|'."""
  return "".join(vocab[i] if 0 <= i < len(vocab) else "_" for i in np.asarray(ids)).replace(
      "\n", "|")


def run_trained(workdir: str) -> List[Dict[str, Any]]:
  """Mode 4: the speed-up table on the newest checkpoint of a masked-diffusion workdir."""
  config, saved = train.read_run(workdir)
  step, params = trainer.restore_params(train.MaskedDiffusion(), config, workdir)
  model = train.model_config(config)
  data = train.text_data(config)
  val = data.tokens[data.val_split]
  new = _NEW.value or max(3 * int(config.seq_len) // 4 // _BLOCK.value, 1) * _BLOCK.value
  P = _PROMPT_LEN.value or int(config.seq_len) - new
  n = _COMPARE_PROMPTS.value or 16
  if P < 1 or P + new > len(val):
    raise errors.BadInput(f"--prompt_len={P} --max_new_tokens={new}: a prompt needs >= 1 token and "
                          f"prompt + new tokens must fit the val split's {len(val)} tokens. Fix: "
                          "pass a smaller --prompt_len or --max_new_tokens")
  offsets = np.round(np.linspace(0, len(val) - P - new, n)).astype(np.int64)
  prompt = np.stack([val[o:o + P] for o in offsets]).astype(np.int32)
  truth = np.stack([val[o + P:o + P + new] for o in offsets]).astype(np.int32)
  steps = _STEPS.value or new
  rows = trained_table(model, params, prompt, truth, mask_id=int(config.mask_id), new_tokens=new,
                       block_length=_BLOCK.value, threshold=_THRESHOLD.value, steps=steps,
                       repeats=_REPEATS.value)
  final = (workdir_lib.read_json_if_exists(workdir_lib.Workdir(workdir).final_eval)
           or {}).get("eval", {})
  held = (f"; held-out masked_ce {final['masked_ce']:.4f} vs unigram {final['unigram_ce']:.4f}"
          if final else "")
  print(f"trained masked-diffusion Dream {workdir} at step {step} ({dream.count_params(model):,} "
        f"parameters, {model.num_layers} layers x {model.hidden_size}, {model.dtype.name}{held}); "
        f"{n} held-out val prompts of {P} characters, {new} new tokens, {steps} steps, block "
        f"{_BLOCK.value}, greedy entropy (Fast-dLLM's threshold rows: {new // _BLOCK.value} steps); "
        f"seconds: median of {_REPEATS.value} generations after compilation; forwards_per_token: "
        "model calls / new tokens (cached calls see a window); agreement: tokens equal to plain's; "
        "nll: nats per token of the completions under the plain model, left to right "
        "(completion_nll); held-out text: the true continuations")
  print(format_rows(rows, TRAINED_COLUMNS))
  vocab = saved.get("vocab", "")
  if vocab:
    print(f"\nprompt 0: ...{_show(prompt[0][-60:], vocab)}")
    for r in rows:
      print(f"  {r['decoding']:<34} {_show(r['tokens'][0][:80], vocab)}")
  for r in rows:
    r.pop("tokens")
  return rows


def dry_run_child(n: int) -> Dict[str, Any]:
  """Compile the 7.6B pmapped plain step on this process's n fake devices (mode 3)."""
  if jax.local_device_count() != n:
    raise RuntimeError(f"expected {n} devices, got {jax.local_device_count()}")
  if _GLOBAL_BATCH.value % n:
    raise errors.BadInput(f"--global_batch={_GLOBAL_BATCH.value} is not divisible by {n} devices. "
                     f"Fix: use a multiple of {n}")
  config = dream.DIFFUCODER_7B
  b = _GLOBAL_BATCH.value // n
  canvas = _CANVAS.value
  start = max(int(canvas * _PROMPT_FRACTION.value), 1)
  params = dream.param_shapes(config)
  opts = sampling.SamplerOptions(steps=canvas - start, alg=_ALG.value,
                                 temperature=_TEMPERATURE.value, top_p=_TOP_P.value)
  step = parallel.compile_step(sampling.plain_step_fn(sampler_forward(config), opts,
                                                   mask_id=151666, start=start,
                                                   axis_name=parallel.AXIS),
                            state_in=(0, 5))
  sd = jax.ShapeDtypeStruct
  key = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), n))
  t0 = time.perf_counter()
  lowered = step.lower(params, sd((n, b, canvas), jnp.int32), sd((n, b, canvas), jnp.bool_),
                       sd((n, b, canvas), jnp.int32), key, sd((), jnp.float32))
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  xla_flops = float((cost or {}).get("flops", float("nan")))
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  return dict(devices=n, rows_per_device=b, canvas=canvas, new_tokens=canvas - start,
              params=dream.count_params(config), weights_gb=param_bytes / GB,
              argument_gb=mem.argument_size_in_bytes / GB, temp_gb=mem.temp_size_in_bytes / GB,
              output_gb=mem.output_size_in_bytes / GB,
              total_gb=(mem.argument_size_in_bytes + mem.temp_size_in_bytes
                        + mem.output_size_in_bytes) / GB,
              tflop_step_device_xla=xla_flops / 1e12,
              tflop_step_device_analytic=analytic_flops(config, b, canvas) / 1e12,
              compile_s=compile_s)


def run_dry(counts: Sequence[int]) -> List[Dict[str, Any]]:
  rows = []
  for n in counts:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join(
        [f for f in env.get("XLA_FLAGS", "").split()
         if not f.startswith("--xla_force_host_platform_device_count")]
        + [f"--xla_force_host_platform_device_count={n}"])
    args = [sys.executable, "-m", "experiments.diffucoder.tools.benchmark", f"--dry_run_child={n}",
            f"--global_batch={_GLOBAL_BATCH.value}", f"--canvas={_CANVAS.value}",
            f"--alg={_ALG.value}", f"--temperature={_TEMPERATURE.value}", f"--top_p={_TOP_P.value}",
            f"--prompt_fraction={_PROMPT_FRACTION.value}"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(EXPERIMENT_DIR)))   # the repo
    if proc.returncode == errors.EXIT_BAD_INPUT:       # the child's one-line error, as ours
      raise errors.BadInput(proc.stderr.strip().splitlines()[-1].removeprefix("error: "))
    if proc.returncode:
      print(proc.stderr[-3000:], file=sys.stderr)
      raise RuntimeError(f"dry run for {n} devices failed (exit {proc.returncode})")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    rows.append(row)
    print(format_rows([row], list(row)).splitlines()[-1], file=sys.stderr, flush=True)
  print(f"DiffuCoder/Dream 7.6B ({rows[0]['params']:,} parameters, bfloat16 weights "
        f"{rows[0]['weights_gb']:.2f} GB, replicated on every device by the data-parallel pmap), "
        f"one plain diffusion step (forward + sampler, {_ALG.value}, top_p {_TOP_P.value}) for a "
        f"global batch of {_GLOBAL_BATCH.value} canvases of {_CANVAS.value}; per device; memory: "
        "XLA CPU memory_analysis (a TPU's differs)")
  print(format_rows(rows, ["devices", "rows_per_device", "canvas", "argument_gb", "temp_gb",
                           "output_gb", "total_gb", "tflop_step_device_xla",
                           "tflop_step_device_analytic", "compile_s"]))
  return rows


def run_dry_tpu(target_name: str, config: dream.DreamConfig = dream.DIFFUCODER_7B, *,
                global_batch: int, canvas: int, prompt_fraction: float = 0.25,
                opts: sampling.SamplerOptions = sampling.SamplerOptions(), model_parallel: int = 1
                ) -> str:
  """Mode 3 with --target=TPU: the plain step of `config` (global_batch rows of `canvas` tokens,
  the first prompt_fraction of them the prompt, `opts`' sampler with steps = new tokens) compiled
  for the slice by libtpu, through `tpu_plan.dry_run` (generate.py --dry_run's program and table)."""
  target = tpu_target.parse_target(target_name)
  m = int(model_parallel)
  groups = target.num_devices // m if m >= 1 and target.num_devices % m == 0 else 0
  if groups and global_batch % groups:
    raise errors.BadInput(f"--global_batch={global_batch} does not split over the {groups} data "
                          f"groups of {target.name} at --model_parallel={m}. Fix: use a multiple "
                          f"of {groups}")
  start = max(int(canvas * prompt_fraction), 1)
  opts = dataclasses.replace(opts, steps=canvas - start)
  return tpu_plan.dry_run(target_name, config, opts, batch_size=global_batch // max(groups, 1),
                          model_parallel=m, max_new_tokens=canvas - start, prompt=start,
                          flag="--model_parallel", global_batch=global_batch)


def main() -> None:
  """The program (entry.run_program: the shared flags, one-line errors and exit codes)."""
  if _CHILD.value:
    print(json.dumps(dry_run_child(_CHILD.value)), flush=True)
    return
  target = entry.dry_run_target()
  modes = [name for name, on in (("--dry_run", target is not None), ("--compare", _COMPARE.value),
                                  ("--trained", bool(_TRAINED.value))) if on]
  if len(modes) > 1:
    raise errors.BadInput(f"{' and '.join(modes)}: two modes at once. Fix: pick one")
  if _WRITE_DOCS.value and modes:
    raise errors.BadInput(f"--write_docs with {modes[0]}: only mode 1's table (the random model's "
                          "sampling speed) is written into the docs. Fix: drop --write_docs")
  if _WRITE_DOCS.value:                  # the markers are there before the run, not after
    doc_tables.check_markers(doc_tables.BENCHMARKS_DOC, DOC_TABLE, DOC_WRITER)
  if target and target != "cpu":
    opts = sampling.SamplerOptions(alg=_ALG.value, temperature=_TEMPERATURE.value,
                                   top_p=_TOP_P.value)
    print(run_dry_tpu(target, global_batch=_GLOBAL_BATCH.value, canvas=_CANVAS.value,
                      prompt_fraction=_PROMPT_FRACTION.value, opts=opts,
                      model_parallel=_MODEL_PARALLEL.value), flush=True)
    return
  if target is not None:                  # --dry_run [--target=cpu]: XLA:CPU on fake devices
    rows = run_dry([int(n) for n in _DEVICES.value])
  elif _TRAINED.value:
    rows = run_trained(_TRAINED.value)
  elif _COMPARE.value:
    rows = run_compare()
  else:
    rows = run_table()
    if _WRITE_DOCS.value:
      write_docs(rows, doc_tables.command_line("experiments.diffucoder.tools.benchmark",
                                               sys.argv[1:]), jax.devices()[0])
      print(f"merged the table into {doc_tables.BENCHMARKS_DOC}'s {DOC_TABLE} table", flush=True)
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  _define_flags()
  entry.run_program(EXPERIMENT_DIR, main, required=())
