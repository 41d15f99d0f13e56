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
CPU costs more than this small model's forward). compile_s is the jit compile of the REAL step
(`sampler_steps.plain_step_fn`: forward + shift + filtering + selection);
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

This module is the program and runs each mode; mode 1's model and timed step are
experiments/diffucoder/tools/step_speed.py (`small_config`, `bench_cell`), modes 2 and 4's
decodings decodings.py (`compare_decodings`, `completion_nll`, `trained_table`), and the tables
and the docs block bench_table.py (`format_rows`, `write_docs`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence

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
from experiments.diffucoder import hf_layout  # noqa: E402
from experiments.diffucoder import orbax_params  # noqa: E402
from experiments.diffucoder import sampler_options  # noqa: E402
from experiments.diffucoder import sampler_steps  # noqa: E402
from experiments.diffucoder import train  # noqa: E402
from experiments.diffucoder.tools import bench_table  # noqa: E402
from experiments.diffucoder.tools import decodings  # noqa: E402
from experiments.diffucoder.tools import step_speed  # noqa: E402
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


def run_table() -> List[Dict[str, Any]]:
  config = step_speed.small_config(_HIDDEN.value, _LAYERS.value, _HEADS.value, _KV_HEADS.value,
                                   _VOCAB.value, _DTYPE.value)
  params = step_speed.random_params(config)
  rows = []
  for canvas in map(int, _CANVASES.value):
    new = canvas - max(int(canvas * _PROMPT_FRACTION.value), 1)
    opts = sampler_options.SamplerOptions(steps=new, alg=_ALG.value, temperature=_TEMPERATURE.value,
                                          top_p=_TOP_P.value)
    for batch in map(int, _BATCHES.value):
      row = {**bench_table.setup_cells(config, opts),
             **step_speed.bench_cell(config, params, batch, canvas, opts, _TIMED.value,
                                     _PROMPT_FRACTION.value)}
      rows.append(row)
      print(bench_table.format_rows([row], list(row)).splitlines()[-1], file=sys.stderr, flush=True)
  print(f"small random Dream: {dream.count_params(config):,} parameters ({config.hidden_size} "
        f"hidden, {config.num_layers} layers, {config.num_heads}/{config.num_kv_heads} heads, "
        f"vocab {config.vocab_size}, {config.dtype.name}); sampler {_ALG.value}, temperature "
        f"{_TEMPERATURE.value}, top_p {_TOP_P.value}; steps = new tokens = 3/4 of the canvas")
  print(bench_table.format_rows(rows, bench_table.TABLE_COLUMNS))
  return rows



def _compare_model():
  """(config, params, mask_id, description) of mode 2: --checkpoint, or a small random Dream."""
  if _CHECKPOINT.value:
    path = _CHECKPOINT.value
    if convert.is_hf_dir(path):
      config = hf_layout.config_from_hf_json(os.path.join(path, hf_layout.CONFIG_JSON))
      mask = json.load(open(os.path.join(path, hf_layout.CONFIG_JSON))).get("mask_token_id")
    else:
      config, mask = orbax_params.saved_config(path), None
    mask = _MASK_ID.value if _MASK_ID.value is not None else mask
    if mask is None:
      raise errors.BadInput(f"--checkpoint={path}: its config has no mask_token_id. Fix: pass "
                            "--mask_id=ID (the <|mask|> token's id)")
    params = convert.load_checkpoint(path, config)
    return config, params, int(mask), f"checkpoint {path}"
  config = step_speed.small_config(_HIDDEN.value, _LAYERS.value, _HEADS.value, _KV_HEADS.value,
                                   _VOCAB.value, _DTYPE.value)
  params = step_speed.random_params(config)
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
  rows = decodings.compare_decodings(config, params, prompt, valid, mask_id=mask_id,
                                     new_tokens=new, block_length=_BLOCK.value,
                                     threshold=_THRESHOLD.value, alg=_ALG.value,
                                     repeats=_REPEATS.value, steps=steps)
  print(f"{n} prompts of {prompt_len} random tokens, {new} new "
        f"tokens, {steps} steps (Fast-dLLM's threshold rows: {new // _BLOCK.value}), greedy "
        f"{_ALG.value}; {what} (hidden {config.hidden_size}, {config.num_layers} layers, vocab "
        f"{config.vocab_size}, {config.dtype.name}); agreement = identical tokens vs plain; "
        "agreement_vs = vs the decoding the option approximates (`vs`); speedup vs plain; "
        f"seconds: median of {_REPEATS.value} generations after compilation; forwards: model "
        "calls (per block the most any device's loop ran)")
  print(bench_table.format_rows(rows, ["decoding", "forwards", "seconds", "tokens_per_s",
                                       "speedup", "agreement", "vs", "agreement_vs"]))
  for r in rows:
    r.pop("tokens")
  return rows


# --------------------------------------------------------------------------------------------------
# Mode 4: the speed-up table on a trained masked-diffusion model.

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
  rows = decodings.trained_table(model, params, prompt, truth, mask_id=int(config.mask_id),
                                 new_tokens=new, block_length=_BLOCK.value,
                                 threshold=_THRESHOLD.value, steps=steps, repeats=_REPEATS.value)
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
  print(bench_table.format_rows(rows, decodings.TRAINED_COLUMNS))
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
  opts = sampler_options.SamplerOptions(steps=canvas - start, alg=_ALG.value,
                                        temperature=_TEMPERATURE.value, top_p=_TOP_P.value)
  step = parallel.compile_step(sampler_steps.plain_step_fn(step_speed.sampler_forward(config), opts,
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
              tflop_step_device_analytic=step_speed.analytic_flops(config, b, canvas) / 1e12,
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
    print(bench_table.format_rows([row], list(row)).splitlines()[-1], file=sys.stderr, flush=True)
  print(f"DiffuCoder/Dream 7.6B ({rows[0]['params']:,} parameters, bfloat16 weights "
        f"{rows[0]['weights_gb']:.2f} GB, replicated on every device by the data-parallel pmap), "
        f"one plain diffusion step (forward + sampler, {_ALG.value}, top_p {_TOP_P.value}) for a "
        f"global batch of {_GLOBAL_BATCH.value} canvases of {_CANVAS.value}; per device; memory: "
        "XLA CPU memory_analysis (a TPU's differs)")
  print(bench_table.format_rows(rows, ["devices", "rows_per_device", "canvas", "argument_gb",
                                       "temp_gb", "output_gb", "total_gb", "tflop_step_device_xla",
                                       "tflop_step_device_analytic", "compile_s"]))
  return rows


def run_dry_tpu(target_name: str, config: dream.DreamConfig = dream.DIFFUCODER_7B, *,
                global_batch: int, canvas: int, prompt_fraction: float = 0.25,
                opts: sampler_options.SamplerOptions = sampler_options.SamplerOptions(),
                model_parallel: int = 1
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
    doc_tables.check_markers(doc_tables.BENCHMARKS_DOC, bench_table.DOC_TABLE,
                             bench_table.DOC_WRITER)
  if target and target != "cpu":
    opts = sampler_options.SamplerOptions(alg=_ALG.value, temperature=_TEMPERATURE.value,
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
      bench_table.write_docs(rows, doc_tables.command_line("experiments.diffucoder.tools.benchmark",
                                                           sys.argv[1:]), jax.devices()[0])
      print(f"merged the table into {doc_tables.BENCHMARKS_DOC}'s {bench_table.DOC_TABLE} table",
            flush=True)
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  _define_flags()
  entry.run_program(EXPERIMENT_DIR, main, required=())
