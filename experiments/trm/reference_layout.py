"""The reference TRM checkpoint's key layout for a TRMConfig; a config from a checkpoint's shapes.

`entries(config)` derives every reference key of a config (its torch shape and dtype, where the
value goes in podlab's (params, state, puzzle_table), whether it is transposed) from podlab's own
parameter tree, so the layout cannot drift from modules/trm.py; `infer_config` reads a TRMConfig
back from a state_dict's shapes; `check` lists every missing, unexpected, mis-shaped or mis-typed
key with the likely config fix. The key mapping is in experiments/trm/reference_checkpoint.py's
docstring (the public API, which re-exports `infer_config` and `reference_key_shapes`).

Synopsis:

  from experiments.trm import reference_layout
  from modules import trm

  config = trm.TRMConfig(seq_len=81, vocab_size=11, hidden_size=64, L_layers=2, mlp_t=True,
                         num_puzzle_identifiers=1)
  shapes = reference_layout.reference_key_shapes(config)
  assert shapes["model.inner.embed_tokens.embedding_weight"] == ((11, 64), "float32")
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Dict, List, Mapping, NamedTuple, Sequence, Tuple

import jax
import numpy as np

from experiments.trm.reference_format import (INIT_DTYPES, INNER, K_EMBED, K_H_INIT, K_L_INIT,
                                              K_POS, K_TABLE, ReferenceCheckpointError, normalize)
from modules import layers
from modules import trm
from modules.trm import TRMConfig

_LAYER_RE = re.compile(r"^model\.inner\.L_level\.layers\.(\d+)\.")

# Fields no weight shape reveals; the help text and `inspect` say so.
NOT_INFERABLE = ("H_cycles", "L_cycles", "halt_max_steps", "num_heads", "halt_exploration_prob",
                 "forward_dtype", "rms_norm_eps", "rope_theta", "remat",
                 "kernels", "attention", "mlp")


# --------------------------------------------------------------------------------------------------
# The key layout of a config (derived from podlab's own parameter tree, so it cannot drift).
# --------------------------------------------------------------------------------------------------


class Entry(NamedTuple):
  """One reference key of a config: where its value goes in podlab's trees, its torch shape."""
  key: str                     # reference key (no `_orig_mod.`)
  group: str                   # "params" | "state" | "table"
  module: str                  # Haiku module name ("" for the table)
  name: str                    # Haiku leaf name
  shape: Tuple[int, ...]       # reference (torch) shape
  dtype: np.dtype
  transpose: bool


_LEAF_NAMES = {"w": "weight", "b": "bias", "embedding": "embedding_weight"}


def reference_key(module: str, name: str) -> Tuple[str, bool]:
  """Haiku (module, leaf) -> (reference key, transpose?)."""
  parts = [p for p in module.split("/") if p != "~"]
  if not parts or parts[0] != "trm" or name not in _LEAF_NAMES:
    raise ReferenceCheckpointError(
        f"podlab parameter {module}/{name} has no reference counterpart: expected modules under "
        f"'trm/~/' with leaves {sorted(_LEAF_NAMES)}")
  parts = [re.sub(r"^layers_(\d+)$", r"layers.\1", p) for p in parts[1:]]
  return INNER + ".".join(parts + [_LEAF_NAMES[name]]), name == "w"


@functools.lru_cache(maxsize=64)
def entries(config: TRMConfig) -> Tuple[Entry, ...]:
  """Every reference key of `config`, from `modules.trm.TRMModel(config)`'s parameter shapes."""
  model = trm.TRMModel(config)
  params, state = jax.eval_shape(model.init, jax.random.key(0))
  out = []
  for module, leaves in params.items():
    for name, leaf in leaves.items():
      key, transpose = reference_key(module, name)
      shape = tuple(leaf.shape[::-1]) if transpose else tuple(leaf.shape)
      out.append(Entry(key, "params", module, name, shape, np.dtype(leaf.dtype), transpose))
  for module, leaves in state.items():
    for name, leaf in leaves.items():
      if module != "trm" or name not in ("H_init", "L_init"):
        raise ReferenceCheckpointError(f"unexpected podlab state {module}/{name}")
      out.append(Entry(INNER + name, "state", module, name, tuple(leaf.shape),
                        np.dtype(leaf.dtype), False))
  if config.prefix_len:
    out.append(Entry(K_TABLE, "table", "", "", (config.num_puzzle_identifiers, config.emb_ndim),
                      np.dtype(np.float32), False))
  return tuple(out)


def reference_key_shapes(config: TRMConfig) -> Dict[str, Tuple[Tuple[int, ...], str]]:
  """{reference key: (torch shape, dtype name)} exactly as `config` expects (no `_orig_mod.`)."""
  return {e.key: (e.shape, e.dtype.name) for e in entries(config)}


# --------------------------------------------------------------------------------------------------
# Config inference and mismatch diagnosis.
# --------------------------------------------------------------------------------------------------


def _layer_indices(keys) -> List[int]:
  return sorted({int(m.group(1)) for k in keys if (m := _LAYER_RE.match(k))})


def infer_fields(sd: Mapping[str, np.ndarray],
                  puzzle_emb_len: int = 16) -> Dict[str, Tuple[Any, str]]:
  """What the shapes reveal: {field: (value, reason)}. `puzzle_emb_len` sets the prefix for seq_len."""
  out: Dict[str, Tuple[Any, str]] = {}
  emb = sd.get(K_EMBED)
  if emb is None or emb.ndim != 2:
    return out
  V, D = emb.shape
  out["vocab_size"] = (V, f"{K_EMBED} has shape {tuple(emb.shape)}")
  out["hidden_size"] = (D, f"{K_EMBED} has shape {tuple(emb.shape)}")
  idx = _layer_indices(sd)
  if idx:
    out["L_layers"] = (idx[-1] + 1, f"blocks L_level.layers.0..{idx[-1]} found")
  if any(".mlp_t." in k for k in sd):
    out["mlp_t"] = (True, "mlp_t keys found")
  elif any(".self_attn." in k for k in sd):
    out["mlp_t"] = (False, "self_attn keys found (no mlp_t keys)")
  table = sd.get(K_TABLE)
  if table is not None and table.ndim == 2:
    N, E = table.shape
    out["num_puzzle_identifiers"] = (N, f"{K_TABLE} has shape {tuple(table.shape)}")
    out["puzzle_emb_ndim"] = (None if E == D else E, f"{K_TABLE} has shape {tuple(table.shape)}")
    prefix = puzzle_emb_len or -(-E // D)
  else:
    out["puzzle_emb_ndim"] = (0, f"no {K_TABLE}")
    prefix = 0
  if K_POS in sd:
    out["pos_encodings"] = ("learned", f"{K_POS} found")
  total, why = None, ""
  gate_t = sd.get(INNER + "L_level.layers.0.mlp_t.gate_up_proj.weight")
  if gate_t is not None and gate_t.ndim == 2:
    total, why = gate_t.shape[1], "layers.0.mlp_t.gate_up_proj.weight"
  elif K_POS in sd and sd[K_POS].ndim == 2:
    total, why = sd[K_POS].shape[0], "embed_pos.embedding_weight"
  if total is not None:
    out["seq_len"] = (total - prefix,
                      f"{why} has S={total} positions, minus {prefix} puzzle prefix slots")
  inits = [sd.get(K_H_INIT), sd.get(K_L_INIT)]
  if all(x is not None and x.dtype == np.float32 for x in inits):
    out["forward_dtype"] = ("float32", "H_init/L_init are stored float32 (the reference creates "
                            "them in its forward dtype)")
  gate = sd.get(INNER + "L_level.layers.0.mlp.gate_up_proj.weight")
  if gate is not None and gate.ndim == 2 and gate.shape[0] % 2 == 0:
    inner = gate.shape[0] // 2
    expansion = 4.0 if layers.swiglu_width(D, 4.0) == inner else inner * 1.5 / D
    out["expansion"] = (expansion, f"layers.0.mlp.gate_up_proj.weight has 2*{inner} rows")
  return out


def infer_config(state_dict: Mapping[str, Any], **overrides: Any) -> TRMConfig:
  """A TRMConfig from a reference state_dict's shapes, updated by `overrides` (TRMConfig fields).

  Inferred: vocab_size, hidden_size, L_layers, mlp_t, num_puzzle_identifiers, puzzle_emb_ndim,
  pos_encodings="learned" (when embed_pos is stored), expansion, seq_len where a shape holds S
  (mlp_t or learned positions; S minus puzzle_emb_len, default 16), and forward_dtype="float32" when
  H_init/L_init are stored float32. Not inferable, so defaults unless overridden: H_cycles (3),
  L_cycles (6; Maze/ARC recipes use 4), halt_max_steps (16), num_heads (8), pos_encodings rope vs
  none (default "none" for mlp_t, "rope" for attention), seq_len for attention without learned
  positions (required then), forward_dtype of a bfloat16 pair (default bfloat16),
  halt_exploration_prob.
  """
  names = {f.name for f in dataclasses.fields(TRMConfig)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ReferenceCheckpointError(f"unknown TRMConfig field(s) {unknown}: valid fields are "
                                   f"{sorted(names)}")
  sd = normalize(state_dict)
  fields = infer_fields(sd, overrides.get("puzzle_emb_len", 16))
  if "hidden_size" not in fields:
    raise ReferenceCheckpointError(
        f"cannot infer a config: {K_EMBED} (shape (vocab, hidden)) is missing or not 2-D; is this a "
        "TRM reference checkpoint? keys: " + ", ".join(sorted(sd)[:8]))
  values = {k: v for k, (v, _) in fields.items()}
  values.update(overrides)
  mlp_t = values.get("mlp_t", False)
  values.setdefault("pos_encodings", "none" if mlp_t else "rope")
  D = values["hidden_size"]
  if "num_heads" not in values:
    if D % 8 == 0:
      values["num_heads"] = 8
    elif mlp_t:
      values["num_heads"] = 1                    # unused by token-MLP blocks
    else:
      raise ReferenceCheckpointError(
          f"num_heads cannot be inferred (hidden_size={D} is not a multiple of the default 8): pass "
          "num_heads=... (head dim = hidden_size / num_heads)")
  if "seq_len" not in values:
    raise ReferenceCheckpointError(
        "seq_len cannot be inferred from an attention checkpoint without learned positions: pass "
        "seq_len=... (Sudoku 81, Maze/ARC 900)")
  try:
    return TRMConfig(**values)
  except (TypeError, ValueError) as e:
    raise ReferenceCheckpointError(f"inferred config fields {values} are invalid: {e}") from e


def config_summary(config: TRMConfig) -> str:
  """The fields of `config` that decide the key layout, for error messages."""
  return (f"TRMConfig(seq_len={config.seq_len}, vocab_size={config.vocab_size}, "
          f"hidden_size={config.hidden_size}, L_layers={config.L_layers}, mlp_t={config.mlp_t}, "
          f"pos_encodings={config.pos_encodings!r}, puzzle_emb_ndim={config.puzzle_emb_ndim}, "
          f"puzzle_emb_len={config.puzzle_emb_len}, "
          f"num_puzzle_identifiers={config.num_puzzle_identifiers}, expansion={config.expansion})")


def _hints(sd: Mapping[str, np.ndarray], config: TRMConfig, missing: Sequence[str],
           unexpected: Sequence[str]) -> List[str]:
  hints: List[str] = []
  fields = infer_fields(sd, config.puzzle_emb_len)
  for field, (value, reason) in fields.items():
    current = getattr(config, field)
    if field == "puzzle_emb_ndim":                    # None means hidden_size: compare the widths
      differs = (config.hidden_size if value is None else value) != config.emb_ndim
    else:
      differs = value != current
    if differs:
      hints.append(f"{reason}: set {field}={value!r} (config has {current!r})")
  if K_POS in missing and "pos_encodings" not in fields:
    hints.append(f"no {K_POS} in the checkpoint: set pos_encodings='rope' or 'none' "
                 f"(config has {config.pos_encodings!r})")
  if not hints and (missing or unexpected):
    hints.append("the checkpoint's keys do not follow docs/trm.md section 8")
  return hints


def check(sd: Mapping[str, np.ndarray], config: TRMConfig) -> List[str]:
  """Problems of a normalized state_dict against `config` (empty list when it matches)."""
  expected = {e.key: e for e in entries(config)}
  missing = [k for k in expected if k not in sd]
  unexpected = sorted(k for k in sd if k not in expected)
  problems = []
  for k in missing:
    e = expected[k]
    problems.append(f"  missing: {k} (expected shape {e.shape} {e.dtype.name})")
  for k in unexpected:
    problems.append(f"  unexpected: {k} (shape {tuple(sd[k].shape)} {sd[k].dtype})")
  for k, e in expected.items():
    if k not in sd:
      continue
    got = sd[k]
    if tuple(got.shape) != e.shape:
      problems.append(f"  wrong shape: {k} expected {e.shape}, got {tuple(got.shape)}")
    if e.group == "state":
      if got.dtype.name not in INIT_DTYPES:
        problems.append(f"  wrong dtype: {k} expected bfloat16 or float32, got {got.dtype} (the "
                        "reference stores H_init/L_init in its forward dtype)")
    elif got.dtype != e.dtype:
      problems.append(f"  wrong dtype: {k} expected {e.dtype.name}, got {got.dtype}")
  pair = [sd[k].dtype.name for k in (K_H_INIT, K_L_INIT) if k in sd]
  if len(pair) == 2 and pair[0] != pair[1]:
    problems.append(f"  mixed dtypes: {K_H_INIT} is {pair[0]}, {K_L_INIT} is {pair[1]} (the "
                    "reference creates both in its forward dtype)")
  if problems:
    hints = _hints(sd, config, missing, unexpected)
    problems.append("likely fix: " + ("; ".join(hints) if hints else "none found"))
  return problems

