"""Shared pieces of the DiffuCoder / Dream configs: the 7B architecture, the Qwen2 special ids, and
the `get_config` skeleton every recipe fills in (see diffucoder_7b_base.py for the commands).

The model-card recipes take `:sampler=harness` (the default) or `:sampler=card`. They differ only
in top_k. The cards' snippet calls `diffusion_generate(..., temperature, top_p=0.95, alg="entropy")`
without top_k; the reference then builds its defaults with `DreamGenerationConfig.from_model_config`,
whose legacy transformers generation defaults carry top_k=50, so the snippet effectively runs top_k
50 ("card"). The evaluation harness behind the published scores passes top_k=None ("harness": no
top-k filtering, `generate.top_k=0`).

Fields of a config:
  model: modules.dream.DreamConfig fields (dtypes as strings).
  tokens: special token ids: mask_id, pad_id, eos_id, bos_id, dlm_pad_id, im_start_id, im_end_id.
  generate: the reference sampler's options (max_new_tokens, steps, temperature, top_p, top_k with
    0 = off, alg in origin | maskgit_plus | topk_margin | entropy, alg_temp), plus block_length,
    cache, threshold, block_algorithm (block-wise KV cache / parallel decoding, off by default;
    block_algorithm "podlab" or "fast_dllm", see experiments/diffucoder/sampling.py), batch_size
    (prompts per device) and pad_to_multiple (prompt-length bucket); see
    experiments/diffucoder/generate.py.
  checkpoint: a Hugging Face checkpoint folder (safetensors shards + index json) or an orbax folder
    written by `python -m experiments.diffucoder.convert`.
  code_eval: HumanEval's prompt format, post-processing, samples and sandbox limits
    (experiments/diffucoder/code_eval.py).
  tokenizer_dir: folder with vocab.json + merges.txt (+ tokenizer_config.json added tokens) or
    tokenizer.json; "" = the checkpoint folder (a Hugging Face folder holds both).
  chat_template: wrap prompts in the ChatML template (instruct models).
  seed: sampling seed.
  model_parallel: devices each copy of the weights is split over (Megatron style, modules/dream.py;
    1 = data-parallel only, every device holds the whole model). It must divide the KV heads (and
    the SwiGLU width and vocabulary): 1, 2 or 4 for the 7.6B. The devices form a (devices / m) x m
    (data x model) mesh; generate.batch_size is then prompts per data group of m devices.
"""

import ml_collections

from experiments.common import config_utils
from modules import dream

SAMPLER_TOP_K = {"harness": 0, "card": 50}
"""`:sampler=` presets of the model-card recipes -> generate.top_k (0 = off); see the module doc."""

# The Qwen2 tokenizer's special ids used by Dream and DiffuCoder (docs/diffucoder.md).
QWEN2_TOKENS = dict(
    mask_id=151666,        # <|mask|>
    pad_id=151643,         # <|endoftext|> (bos = eos = pad)
    eos_id=151643,
    bos_id=151643,
    dlm_pad_id=151667,     # <|dlm_pad|>: the instruct model pads its answer with it
    im_start_id=151644,    # <|im_start|>
    im_end_id=151645,      # <|im_end|>
)


def base_config(*, model: dream.DreamConfig, tokens: dict, max_new_tokens: int, steps: int,
                temperature: float, top_p: float, alg: str, chat_template: bool,
                checkpoint: str = "", top_k: int = 0,
                alg_temp: float = 0.0) -> ml_collections.ConfigDict:
  """Builds a full config; recipes pass their model, ids and the reference's recommended sampler."""
  c = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict(model.to_dict())
  c.tokens = ml_collections.ConfigDict(dict(tokens))
  c.generate = ml_collections.ConfigDict(dict(
      max_new_tokens=max_new_tokens, steps=steps, temperature=temperature, top_p=top_p,
      top_k=top_k, alg=alg, alg_temp=alg_temp,
      # Beyond the reference (engineer B's sampler options, off by default;
      # sampler_options.SamplerOptions):
      # block-wise decoding with an approximate KV cache ("none" | "prefix" | "dual") and
      # confidence-threshold parallel decoding (0 = off, e.g. 0.9; needs block_length > 0).
      block_length=0, cache="none", threshold=0.0,
      # "podlab" (block_fn) or "fast_dllm" (Fast-dLLM's published loop, exactly; sampling.py).
      block_algorithm="podlab",
      batch_size=1,          # prompts per device per batch (global batch = batch_size x devices)
      pad_to_multiple=32))   # prompt lengths round up to this: fewer distinct shapes to compile
  # HumanEval through experiments/diffucoder/code_eval.py (its docstring; sandbox.py: the limits).
  # Defaults: Dream's evaluation (prompt, post-processing) and OpenAI's harness (timeout 3 s).
  c.code_eval = ml_collections.ConfigDict(dict(
      prompt="instruct" if chat_template else "completion",   # or the other one
      postprocess="sanitize",   # Dream's; "raw": prompt + completion (OpenAI's harness)
      samples=1,                # completions per problem: pass@1, and pass@10/100 when n allows
      timeout_s=3.0, memory_mb=2048, file_mb=64, processes=32, open_files=256, grace_s=10.0,
      namespaces=True,          # network + PID namespaces where the kernel allows them
      site_packages=True,       # programs may import installed packages (False: stdlib only)
      workers=0))               # programs at a time (0: one per CPU)
  c.checkpoint = checkpoint
  c.tokenizer_dir = ""
  c.chat_template = chat_template
  c.seed = 0
  c.model_parallel = 1
  return c


def check_model_parallel(config: ml_collections.ConfigDict, num_devices: int) -> int:
  """config.model_parallel, checked against the model and the devices (ConfigError naming the value,
  what it does not divide, and the valid degrees). Returns it."""
  m = config.get("model_parallel", 1)
  model = dream_config(config)
  valid = dream.valid_model_degrees(model)
  if m not in valid:
    try:
      dream.check_model_degree(model, m)
    except ValueError as e:
      problem = str(e).split(";")[0]
    raise config_utils.ConfigError("model_parallel", m, problem,
                                   f"use one of the valid degrees for this model: {valid}")
  if num_devices % m:
    raise config_utils.ConfigError(
        "model_parallel", m, f"does not divide the {num_devices} devices",
        f"use a degree that divides {num_devices}: "
        f"{[d for d in valid if num_devices % d == 0]}")
  return int(m)


def model_card_top_k(arg) -> int:
  """generate.top_k of a model-card recipe's `sampler=harness|card` argument (default harness)."""
  a = config_utils.parse_arg(arg, sampler="harness")
  if a.sampler not in SAMPLER_TOP_K:
    raise config_utils.ConfigError(
        "arg:sampler", a.sampler, "unknown sampler preset",
        "use sampler=harness (top_k off, the evaluation harness) or sampler=card (top_k 50, the "
        "model card's snippet)")
  return SAMPLER_TOP_K[a.sampler]


def dream_config(config: ml_collections.ConfigDict) -> dream.DreamConfig:
  """config.model -> DreamConfig (raises ValueError naming a bad or unknown field)."""
  return dream.DreamConfig.from_dict(config.model.to_dict())
