r"""Generates completions with a Dream / DiffuCoder model: prompts in, JSONL out.

  python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_instruct.py \
      --config.checkpoint=apple/DiffuCoder-7B-Instruct --prompt="Write a function that reverses a list."
        # a Hub name: its safetensors, config and tokenizer files, downloaded once (input_pipeline/hub.py)
  python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_instruct.py \
      --config.checkpoint=/ckpt/diffucoder_instruct_orbax --config.tokenizer_dir=/ckpt/DiffuCoder-7B-Instruct \
      --prompt="Write a function that reverses a linked list." --output=/tmp/out.jsonl
  python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_base.py \
      --config.checkpoint=/ckpt/DiffuCoder-7B-Base --prompts_jsonl=prompts.jsonl --output=out.jsonl \
      --config.generate.batch_size=4 --config.generate.block_length=32 --config.generate.cache=dual
  # Fast-dLLM's published Dream loop exactly (dual cache + threshold 0.9, blocks of 32):
  ... --config.generate.block_algorithm=fast_dllm --config.generate.block_length=32 \
      --config.generate.cache=dual --config.generate.threshold=0.9 --config.generate.steps=8
  # tiny random model on a CPU (writes the model and a byte-level tokenizer first):
  python -m experiments.diffucoder.convert --write_random=/tmp/tiny_hf --config=configs/tiny.py
  python -m experiments.diffucoder.generate --config=configs/tiny.py --config.checkpoint=/tmp/tiny_hf \
      --write_tiny_tokenizer --prompt="def add(a, b):"
  # compile the config's sampler for a TPU slice with libtpu on this machine (no weights needed):
  python -m experiments.diffucoder.generate --config=configs/diffucoder_7b_instruct.py --dry_run \
      --target=v5e-8 --config.generate.batch_size=1

Prompts: `--prompt` (repeatable) and/or `--prompts_jsonl` (one JSON object per line with "prompt";
an optional "id" is copied to the output). Instruct configs wrap each prompt in the ChatML template.
Output (`--output`, default stdout): one JSON line per prompt, in input order, with id, prompt,
completion (decoded up to the first <|endoftext|> / <|dlm_pad|> / <|im_end|>), completion_ids, and
the batch's seconds and tokens/s.

Model parallelism (`--config.model_parallel=m`, 1 by default): the local devices form a
(devices / m) x m (data x model) mesh (`model_sharding.mesh_2d`); each tensor of the checkpoint is streamed
into its device blocks (heads, SwiGLU columns, vocabulary rows: modules/dream.py), each data group
of m devices decodes `generate.batch_size` prompts. m must divide the KV heads (1, 2, 4 for the
7.6B) and the devices; one host only. docs/diffucoder.md lists the degree each TPU needs.

Batching: prompts are sorted by length and cut into global batches of `generate.batch_size` x
devices rows, left-padded (pad id) to the batch's longest prompt rounded up to
`generate.pad_to_multiple` (one compile per (batch, canvas) shape). The batch is data-parallel: params
replicated on this host's devices (`experiments/common/parallel.py` pmap), each host takes its slice of
every global batch (same distributed start-up as the other experiments: `--coordinator_address`,
`--num_processes`, `--process_id` or PODLAB_* variables, auto on Cloud TPU), results are gathered and
process 0 writes them. A progress bar counts diffusion steps (or blocks) over all batches.

Shape glossary:
  N: prompts    B: rows per global batch    P: padded prompt length    L = P + max_new_tokens
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import flags
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
from tqdm import tqdm

from experiments.common import config_utils
from experiments.common import entry
from experiments.common import errors
from experiments.common import lazy_import
from experiments.common import parallel
from experiments.diffucoder import convert
from experiments.diffucoder import model_sharding
from experiments.diffucoder import sampler_options as options_lib
from experiments.diffucoder import sampling
from experiments.diffucoder import tokenizer as tokenizer_lib
from experiments.diffucoder.configs import common
from modules import dream

# The TPU planning tool, loaded only by --dry_run (generating imports no tool).
tpu_plan = lazy_import.module("experiments.diffucoder.tools.tpu_plan")

EXPERIMENT_DIR = os.path.dirname(os.path.abspath(__file__))

_PROMPT = flags.DEFINE_multi_string("prompt", [], "A prompt (repeat the flag for several).")
_PROMPTS_JSONL = flags.DEFINE_string("prompts_jsonl", None,
                                     'JSONL file of {"prompt": ..., "id": ...} objects.')
_OUTPUT = flags.DEFINE_string("output", None, "Output JSONL path (default: stdout).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar (process 0).")
_WRITE_TINY_TOKENIZER = flags.DEFINE_bool(
    "write_tiny_tokenizer", False,
    "Write the tiny config's byte-level tokenizer into the tokenizer folder first (demos).")


def sampler_options(config: ml_collections.ConfigDict):
  """config.generate -> options_lib.SamplerOptions (validated; errors name the field)."""
  g = config.generate
  opts = options_lib.SamplerOptions(
      steps=int(g.steps), alg=str(g.alg), temperature=float(g.temperature),
      top_p=None if g.top_p is None else float(g.top_p),
      top_k=int(g.top_k) if g.get("top_k") else None, alg_temp=float(g.get("alg_temp", 0.0) or 0.0),
      block_length=int(g.get("block_length", 0)), cache=str(g.get("cache", "none")),
      threshold=float(g.get("threshold", 0.0)),
      block_algorithm=str(g.get("block_algorithm", "podlab")))
  opts.validate(int(g.max_new_tokens))
  return opts


def model_forward(model_config, model_parallel: int = 1):
  """The sampler's forward(params, tokens, valid, positions, context=None, return_kv=False) for a
  modules.dream.DreamConfig; with model_parallel > 1 the per-device program of the model sharded
  over `model_sharding.MODEL_AXIS` (run inside the Runner's shard_map)."""
  if model_parallel > 1:
    model = dream.dream_forward(model_config, model_sharding.MODEL_AXIS, model_parallel)
  else:
    model = dream.dream_forward(model_config)

  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    return model.apply(params, tokens, valid, positions, context, return_kv)
  return forward


def read_prompts(prompts: Sequence[str], jsonl: Optional[str]) -> List[Dict[str, Any]]:
  """[{"id", "prompt"}] from --prompt values, then the JSONL file's lines."""
  out = [{"id": i, "prompt": p} for i, p in enumerate(prompts)]
  if jsonl:
    with open(jsonl, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          raise errors.BadInput(f"{jsonl}:{n}: not JSON ({e}). Fix: one JSON object per line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
          raise errors.BadInput(f'{jsonl}:{n}: needs a string "prompt" field, got {line.strip()[:80]!r}. '
                           'Fix: write {"prompt": "..."} per line')
        out.append({"id": obj.get("id", len(out)), "prompt": obj["prompt"]})
  if not out:
    raise errors.BadInput("no prompts. Fix: pass --prompt=... (repeatable) or --prompts_jsonl=FILE")
  return out


def stop_ids(config: ml_collections.ConfigDict) -> List[int]:
  """Where a completion ends: eos, <|dlm_pad|>, and <|im_end|> for chat models."""
  t = config.tokens
  ids = [t.eos_id, t.dlm_pad_id]
  if config.chat_template and "im_end_id" in t:
    ids.append(t.im_end_id)
  return [int(i) for i in ids]


def batches(lengths: Sequence[int], global_batch: int) -> List[List[int]]:
  """Prompt indices sorted by length, cut into batches of `global_batch` (the last one is padded
  with repeats of its first prompt; they are decoded and dropped)."""
  order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
  out = []
  for s in range(0, len(order), global_batch):
    chunk = order[s:s + global_batch]
    out.append(chunk + [chunk[0]] * (global_batch - len(chunk)))
  return out


def run(config: ml_collections.ConfigDict, prompts: List[Dict[str, Any]], *, params=None,
        tok=None, progress: bool = False,
        on_batch: Optional[Callable[[List[Dict[str, Any]]], None]] = None) -> List[Dict[str, Any]]:
  """Generates a completion for every prompt; returns the output records (on every process).

  A prompt's optional "prefix" is appended after its (templated) text: the start of the answer.
  params / tok: already loaded parameters and tokenizer (tests); else from config.checkpoint and
  config.tokenizer_dir (or the checkpoint folder). on_batch(records): called on every process
  with each batch's new records as it ends (e.g. to save them).
  """

  opts = sampler_options(config)
  g = config.generate
  max_new = int(g.max_new_tokens)
  model_config = common.dream_config(config)
  if tok is None:
    tok_dir = config.tokenizer_dir or config.checkpoint
    if not tok_dir:
      raise config_utils.ConfigError("tokenizer_dir", tok_dir, "no tokenizer folder",
                                     "pass --config.tokenizer_dir=<folder with vocab.json + "
                                     "merges.txt or tokenizer.json>")
    tok = tokenizer_lib.load(convert.resolve(
        tok_dir, "--config.tokenizer_dir" if config.tokenizer_dir else "--config.checkpoint"))
  special = {"<|mask|>": config.tokens.mask_id, "<|endoftext|>": config.tokens.pad_id}
  if config.chat_template:
    special.update({"<|im_start|>": config.tokens.im_start_id,
                    "<|im_end|>": config.tokens.im_end_id})
  tok.check_ids(special)
  n_local = jax.local_device_count()
  model_parallel = common.check_model_parallel(config, n_local)
  mesh = None
  if model_parallel > 1:
    if jax.process_count() > 1:
      raise config_utils.ConfigError(
          "model_parallel", model_parallel,
          f"model parallelism runs on one host and there are {jax.process_count()} processes",
          "use one host (v2-8, v3-8, v4-8 and v5e-8 are one host each) or model_parallel=1")
    mesh = model_sharding.mesh_2d(n_local // model_parallel, model_parallel)
  if params is None:
    if not config.checkpoint:
      raise config_utils.ConfigError("checkpoint", config.checkpoint, "no checkpoint",
                                     "pass --config.checkpoint=<Hugging Face or converted folder>")
    if mesh is None:
      params = convert.load_checkpoint(config.checkpoint, model_config)
    else:                             # each tensor straight into its device blocks
      params = convert.load_checkpoint(config.checkpoint, model_config, mesh=mesh)
  elif mesh is not None:
    place = convert.model_parallel_placer(model_config, mesh)
    params = {module: {name: place(module, name, np.asarray(v)) for name, v in p.items()}
              for module, p in params.items()}

  texts = [(tokenizer_lib.chat_prompt(p["prompt"]) if config.chat_template else p["prompt"])
           + p.get("prefix", "") for p in prompts]
  ids = [tok.encode(t) for t in texts]
  for p, i in zip(prompts, ids):
    if not i:
      raise errors.BadInput(f"prompt {p['id']!r} is empty after tokenisation. Fix: give some text")
  data_parallel = jax.device_count() > 1 and mesh is None
  per_device = int(g.get("batch_size", 1))
  if per_device < 1:
    raise config_utils.ConfigError("generate.batch_size", per_device, "must be >= 1", "use 1")
  if mesh is not None:                  # batch_size prompts per data group of model_parallel devices
    host_rows = per_device * mesh.shape[parallel.AXIS]
  else:
    host_rows = per_device * n_local if data_parallel else per_device
  global_rows = host_rows * jax.process_count()
  multiple = max(int(g.get("pad_to_multiple", 1)), 1)
  if data_parallel:
    params = parallel.replicate(params)
  if mesh is not None:
    runner = sampling.Runner(model_forward(model_config, model_parallel), opts,
                             mask_id=config.tokens.mask_id, mesh=mesh,
                             param_specs=dream.param_partition_specs(model_config,
                                                                     model_sharding.MODEL_AXIS))
  else:
    runner = sampling.Runner(model_forward(model_config), opts, mask_id=config.tokens.mask_id,
                             data_parallel=data_parallel)
  plan = batches([len(i) for i in ids], global_rows)
  per_batch = opts.steps if opts.block_length == 0 else max_new // opts.block_length
  bar = None
  if progress and jax.process_index() == 0:
    unit = "step" if opts.block_length == 0 else "block"
    bar = tqdm(total=per_batch * len(plan), unit=unit, desc=f"{len(prompts)} prompts",
               file=sys.stderr)
  stops = stop_ids(config)
  key = jax.random.key(int(config.get("seed", 0)))
  records: Dict[int, Dict[str, Any]] = {}
  for b, chunk in enumerate(plan):
    longest = max(len(ids[i]) for i in chunk)
    length = -(-longest // multiple) * multiple
    prompt, valid = sampling.left_pad([ids[i] for i in chunk], config.tokens.pad_id, length)
    lo = jax.process_index() * host_rows
    out = runner.generate(params, prompt[lo:lo + host_rows], valid[lo:lo + host_rows],
                          jax.random.fold_in(key, b), max_new_tokens=max_new,
                          progress=bar.update if bar is not None else None)
    tokens = out.tokens
    if jax.process_count() > 1:
      tokens = np.asarray(multihost_utils.process_allgather(tokens)).reshape(-1, tokens.shape[1])
    new_tokens = len(chunk) * max_new
    done = []
    for row, i in enumerate(chunk):
      if i in records:
        continue
      done.append(i)
      completion = sampling.cut_at_stop(tokens[row, length:], stops)
      records[i] = dict(id=prompts[i]["id"], prompt=prompts[i]["prompt"],
                        completion=tok.decode(completion), completion_ids=completion,
                        prompt_tokens=len(ids[i]), batch=b, batch_seconds=round(out.seconds, 4),
                        batch_tokens_per_s=round(new_tokens / max(out.seconds, 1e-9), 2),
                        forwards=out.forwards)
    if on_batch is not None:
      on_batch([records[i] for i in done])
  if bar is not None:
    bar.close()
  return [records[i] for i in range(len(prompts))]


def write_tiny_tokenizer(config: ml_collections.ConfigDict) -> str:
  """--write_tiny_tokenizer: the tiny config's byte-level tokenizer, written into config.tokenizer_dir
  (or the checkpoint folder) only after the checkpoint passes the size checks against config.model
  (no weight is read) and the tokenizer's ids fit config.model.vocab_size. Returns the folder."""
  model_config = common.dream_config(config)
  if not config.checkpoint:
    raise config_utils.ConfigError("checkpoint", config.checkpoint, "no checkpoint",
                                   "pass --config.checkpoint=<Hugging Face or converted folder>")
  convert.check_checkpoint_folder(config.checkpoint, model_config)
  tokens = config.tokens.to_dict()
  first = max(tokens.values()) + 1
  last = first + len(tokenizer_lib.TINY_MERGES) - 1
  if last >= model_config.vocab_size:
    raise config_utils.ConfigError(
        "model.vocab_size", model_config.vocab_size,
        f"the tiny tokenizer's ids reach {last} (specials up to {first - 1}, "
        f"{len(tokenizer_lib.TINY_MERGES)} merges after them)",
        f"use --config.model.vocab_size={last + 1} or more (the tiny config's 272)")
  folder = config.tokenizer_dir or config.checkpoint
  tokenizer_lib.write_byte_level_tokenizer(folder, tokenizer_lib.tiny_special_tokens(tokens),
                                           tokenizer_lib.TINY_MERGES, first_merge_id=first)
  return folder


def main() -> None:
  config = entry.config()
  target = entry.dry_run_target()
  if target is not None:                    # --dry_run: compile for a TPU slice, generate nothing
    g = config.generate
    print(tpu_plan.dry_run(target, common.dream_config(config), sampler_options(config),
                           batch_size=int(g.batch_size), model_parallel=int(config.model_parallel),
                           max_new_tokens=int(g.max_new_tokens)), flush=True)
    return
  if _WRITE_TINY_TOKENIZER.value:
    write_tiny_tokenizer(config)
  prompts = read_prompts(_PROMPT.value, _PROMPTS_JSONL.value)
  t0 = time.perf_counter()
  records = run(config, prompts, progress=_PROGRESS.value)
  seconds = time.perf_counter() - t0
  if jax.process_index() == 0:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if _OUTPUT.value:
      with open(_OUTPUT.value, "w", encoding="utf-8") as f:
        f.write(lines)
      print(f"wrote {len(records)} completions to {_OUTPUT.value} in {seconds:.1f} s "
            "(including compilation)", file=sys.stderr)
    else:
      sys.stdout.write(lines)


if __name__ == "__main__":
  entry.run_program(EXPERIMENT_DIR, main)
