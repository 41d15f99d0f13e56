"""The Hugging Face Dream / DiffuCoder checkpoint layout: its tensors, its config.json, the errors.

`hf_tensor_specs(config)` lists every tensor a Hugging Face Dream checkpoint of that architecture
holds (name, torch shape, checkpoint order); `param_sources(config)` says which of them build each
Haiku parameter of modules/dream.py (q/k/v concatenated into the fused `qkv_proj`, gate/up into
`gate_up_proj`, torch [out, in] weights transposed). `config_from_hf_json` reads a DreamConfig
from config.json (`hf_config_json` writes one); `check_against_hf_json` and `shape_fields` name the
fields a mismatching checkpoint would need. The key table is in experiments/diffucoder/convert.py's
docstring (the loading API, which reads checkpoints through this module).

Synopsis:

  from experiments.diffucoder import hf_layout
  from modules import dream

  cfg = dream.tiny_config()
  specs = dict(hf_layout.hf_tensor_specs(cfg))
  assert specs["model.embed_tokens.weight"] == (cfg.vocab_size, cfg.hidden_size)
  module, name, sources, transpose = hf_layout.param_sources(cfg)[2]   # layer 0's fused qkv
  assert (module, name, transpose) == ("dream/layer_0/self_attn/qkv_proj", "w", True)
  assert hf_layout.model_overrides({"num_layers": 2}) == "--config.model.num_layers=2"
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

from experiments.common import errors
from experiments.common import safetensors_io as st
from modules import dream

CONFIG_JSON = "config.json"

# Hugging Face config.json field -> DreamConfig field.
HF_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
             "intermediate_size": "intermediate_size", "num_hidden_layers": "num_layers",
             "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
             "rope_theta": "rope_theta", "rms_norm_eps": "rms_norm_eps"}


class ConversionError(errors.FormatError):
  """The checkpoint does not match the config (names, shapes, dtypes) or cannot be read."""


# --------------------------------------------------------------------------------------------------
# The key layout.
# --------------------------------------------------------------------------------------------------


def hf_tensor_specs(config: dream.DreamConfig) -> List[Tuple[str, Tuple[int, ...]]]:
  """Every tensor of a Hugging Face Dream checkpoint, (name, torch shape), in checkpoint order."""
  D, F, V = config.hidden_size, config.intermediate_size, config.vocab_size
  Dq, Dkv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
  specs = [("model.embed_tokens.weight", (V, D))]
  for n in range(config.num_layers):
    p = f"model.layers.{n}."
    specs += [(p + "input_layernorm.weight", (D,)),
              (p + "self_attn.q_proj.weight", (Dq, D)), (p + "self_attn.q_proj.bias", (Dq,)),
              (p + "self_attn.k_proj.weight", (Dkv, D)), (p + "self_attn.k_proj.bias", (Dkv,)),
              (p + "self_attn.v_proj.weight", (Dkv, D)), (p + "self_attn.v_proj.bias", (Dkv,)),
              (p + "self_attn.o_proj.weight", (D, Dq)),
              (p + "post_attention_layernorm.weight", (D,)),
              (p + "mlp.gate_proj.weight", (F, D)), (p + "mlp.up_proj.weight", (F, D)),
              (p + "mlp.down_proj.weight", (D, F))]
  specs += [("model.norm.weight", (D,)), ("lm_head.weight", (V, D))]
  return specs


def param_sources(config: dream.DreamConfig) -> List[Tuple[str, str, Tuple[str, ...], bool]]:
  """(Haiku module, parameter, source HF tensors concatenated on axis 0, transpose?) per parameter."""
  out = [("dream/embed_tokens", "embedding", ("model.embed_tokens.weight",), False)]
  for n in range(config.num_layers):
    p, m = f"model.layers.{n}.", f"dream/layer_{n}/"
    out += [(m + "input_layernorm", "weight", (p + "input_layernorm.weight",), False),
            (m + "self_attn/qkv_proj", "w", tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv"),
             True),
            (m + "self_attn/qkv_proj", "b", tuple(p + f"self_attn.{x}_proj.bias" for x in "qkv"),
             False),
            (m + "self_attn/o_proj", "w", (p + "self_attn.o_proj.weight",), True),
            (m + "post_attention_layernorm", "weight", (p + "post_attention_layernorm.weight",),
             False),
            (m + "mlp/gate_up_proj", "w", (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
             True),
            (m + "mlp/down_proj", "w", (p + "mlp.down_proj.weight",), True)]
  out += [("dream/norm", "weight", ("model.norm.weight",), False),
          ("dream/lm_head", "w", ("lm_head.weight",), True)]
  return out


# --------------------------------------------------------------------------------------------------
# Configs.
# --------------------------------------------------------------------------------------------------


DTYPES = ("bfloat16", "float32", "float16")


def config_from_hf_json(path: str, **overrides) -> dream.DreamConfig:
  """A DreamConfig from a Hugging Face config.json. dtype and param_dtype: its `torch_dtype`
  (bfloat16 when absent, as the released models), unless overridden."""
  try:
    with open(path) as f:
      hf = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConversionError(f"{path}: cannot read the model config ({type(e).__name__}: {e}). Fix: "
                          "pass --config=configs/<model>.py") from None
  missing = [k for k in HF_FIELDS if k not in hf]
  if missing:
    raise ConversionError(f"{path}: lacks {missing}; not a Dream/Qwen2 config. Fix: pass "
                          "--config=configs/<model>.py")
  if hf.get("tie_word_embeddings", False):
    raise ConversionError(f"{path}: tie_word_embeddings=true, but Dream's output head is untied "
                          "(lm_head.weight). Fix: use a Dream / DiffuCoder checkpoint")
  fields = {ours: hf[theirs] for theirs, ours in HF_FIELDS.items()}
  torch_dtype = hf.get("torch_dtype") or "bfloat16"
  if "dtype" not in overrides or "param_dtype" not in overrides:
    if torch_dtype not in DTYPES:
      raise ConversionError(f"{path}: torch_dtype={torch_dtype!r} is not one of {DTYPES}. Fix: pass "
                            "--dtype=bfloat16 (or float32) to cast the weights")
    fields.update(dtype=torch_dtype, param_dtype=torch_dtype)
  fields.update(overrides)
  return dream_config_from(fields, path)


def model_overrides(fields: Dict[str, object]) -> str:
  """`--config.model.F=V ...` for {field: value} (what a fix text tells the user to pass)."""
  return " ".join(f"--config.model.{k}={v}" for k, v in fields.items())


def shape_fields(infos: Dict[str, st.TensorInfo]) -> Dict[str, int]:
  """The DreamConfig fields a checkpoint's tensor shapes reveal: vocab_size and hidden_size
  (embed_tokens), intermediate_size (layer 0's gate_proj) and num_layers (the layers present).
  num_heads / num_kv_heads are not separable from the head dim: config.json holds them."""
  out = {}
  emb = infos.get("model.embed_tokens.weight")
  if emb is not None and len(emb.shape) == 2:
    out["vocab_size"], out["hidden_size"] = int(emb.shape[0]), int(emb.shape[1])
  gate = infos.get("model.layers.0.mlp.gate_proj.weight")
  if gate is not None and len(gate.shape) == 2:
    out["intermediate_size"] = int(gate.shape[0])
  layers = {int(n.split(".")[2]) for n in infos if n.startswith("model.layers.")
            and n.split(".")[2].isdigit()}
  if layers:
    out["num_layers"] = max(layers) + 1
  return out


def check_against_hf_json(hf_dir: str, config: dream.DreamConfig) -> None:
  """If hf_dir has a config.json, every architecture field must equal `config`'s."""
  path = os.path.join(hf_dir, CONFIG_JSON)
  if not os.path.isfile(path):
    return
  theirs = config_from_hf_json(path, dtype=config.dtype, param_dtype=config.param_dtype)
  differ = [f for f in HF_FIELDS.values() if getattr(theirs, f) != getattr(config, f)]
  diffs = [f"{f}: config.json {getattr(theirs, f)!r} vs config.model {getattr(config, f)!r}"
           for f in differ]
  if diffs:
    raise ConversionError(
        f"{hf_dir}: the checkpoint's config.json disagrees with the config: {'; '.join(diffs)}. "
        "Fix: pass the config of this model, or override the fields: "
        + model_overrides({f: getattr(theirs, f) for f in differ}))


def dream_config_from(fields: Dict[str, object], source: str) -> dream.DreamConfig:
  """DreamConfig.from_dict(fields); a bad field (DreamConfig's ValueError, which names the field,
  the value and what it must be) becomes a ConversionError naming `source` (one line, exit 2)."""
  try:
    return dream.DreamConfig.from_dict(fields)
  except ValueError as e:
    raise ConversionError(f"{source}: {e}. Fix: correct that field (or its "
                          "--config.model. override)") from None


def hf_config_json(config: dream.DreamConfig, tokens: Optional[dict] = None) -> dict:
  """The Hugging Face config.json of a Dream model with this architecture."""
  tokens = tokens or {}
  return {"architectures": ["DreamModel"], "model_type": "Dream",
          "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
          "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
          "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
          "rope_theta": config.rope_theta, "rms_norm_eps": config.rms_norm_eps,
          "hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0,
          "torch_dtype": config.param_dtype.name,
          **{k.replace("_id", "_token_id"): v for k, v in tokens.items()}}

