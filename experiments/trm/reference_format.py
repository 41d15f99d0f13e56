"""The reference TRM's checkpoint file format: its keys, reading and writing `.pt` files safely.

The reference implementation saves `model.state_dict()` with `torch.save` (docs/trm.md, section 8):
keys `model.inner.*`, prefixed `_orig_mod.` when the run used torch.compile. This module holds what
any reader of that format needs and nothing about podlab's trees: the key names, the dtypes
H_init/L_init may have, the file I/O (`torch.load(weights_only=True)`: tensors only, never
arbitrary unpickling; torch is optional and imported lazily), the conversion of tensors to numpy
(bfloat16 bitwise, through ml_dtypes), the normalization of a state_dict (prefix stripped, values as
numpy) and the parameter count the reference prints. experiments/trm/reference_checkpoint.py (the
public API) maps it to podlab's trees.

Synopsis:

  import numpy as np
  from experiments.trm import reference_format as rf

  sd = rf.normalize({"_orig_mod." + rf.K_H_INIT: np.zeros((512,), np.float32)})
  assert list(sd) == [rf.K_H_INIT]                  # the compiled-run prefix is stripped
  assert rf.adam_param_count(sd) == 0               # H_init/L_init are no Adam parameters
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Mapping

import ml_dtypes
import numpy as np

from experiments.common import errors

StateDict = Dict[str, np.ndarray]

COMPILED_PREFIX = "_orig_mod."
INNER = "model.inner."
K_EMBED = INNER + "embed_tokens.embedding_weight"
K_POS = INNER + "embed_pos.embedding_weight"
K_TABLE = INNER + "puzzle_emb.weights"
K_H_INIT = INNER + "H_init"
K_L_INIT = INNER + "L_init"
INIT_DTYPES = ("bfloat16", "float32")
"""The dtypes the reference stores H_init/L_init in: its forward dtype."""

TORCH_INSTALL_HINT = ("PyTorch is needed to read/write reference checkpoints. Fix: "
                      "pip install 'podlab[torch]' (or .venv/bin/pip install torch==2.13.0)")

# Adam-parameter counts of the published models (docs/trm.md, section 5).
PUBLISHED_PARAM_COUNTS = {
    5_028_866: "TRM-MLP Sudoku", 6_828_034: "TRM-Att Sudoku", 6_822_914: "TRM-Att Maze",
    6_829_058: "TRM-Att ARC", 18_795_522: "TRM-MLP Maze", 18_801_666: "TRM-MLP ARC",
}


class ReferenceCheckpointError(errors.FormatError):
  """A state_dict does not match a TRMConfig (or podlab trees do not); the message lists every
  missing/unexpected/mis-shaped key and the likely config fix."""


class TorchMissing(errors.BadInput, ImportError):
  """PyTorch is not installed (an ImportError too); the message is the install hint."""


class InputMissing(ReferenceCheckpointError, FileNotFoundError):
  """The .pt file or podlab directory to read does not exist (a FileNotFoundError too)."""


# --------------------------------------------------------------------------------------------------
# torch <-> numpy (torch imported lazily: it is an optional dependency).
# --------------------------------------------------------------------------------------------------


def _import_torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise TorchMissing(TORCH_INSTALL_HINT) from e
  return torch


def tensor_to_numpy(t: Any) -> np.ndarray:
  """A torch tensor -> numpy, bitwise (bfloat16 -> ml_dtypes.bfloat16 through an int16 view)."""
  t = t.detach().cpu().contiguous()
  if str(t.dtype) == "torch.bfloat16":
    import torch  # pylint: disable=g-import-not-at-top  (torch is present: t is a tensor)
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
  return t.numpy().copy()


def _to_numpy(value: Any) -> np.ndarray:
  if type(value).__module__.startswith("torch"):
    return tensor_to_numpy(value)
  return np.asarray(value)


def _numpy_to_tensor(torch, key: str, x: Any):
  x = np.array(x, copy=True)
  if x.dtype == ml_dtypes.bfloat16:
    return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
  if x.dtype not in (np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_):
    raise ReferenceCheckpointError(f"save_state_dict: {key} has dtype {x.dtype}, which torch cannot "
                                   "hold: use float32 (or bfloat16 for H_init/L_init)")
  return torch.from_numpy(x)


def normalize(state_dict: Mapping[str, Any]) -> StateDict:
  """Strips `_orig_mod.` and converts values to numpy; rejects a key present with and without it."""
  if not isinstance(state_dict, Mapping):
    raise ReferenceCheckpointError(
        f"expected a state_dict (a mapping of key -> tensor), got {type(state_dict).__name__}")
  out: StateDict = {}
  for key, value in state_dict.items():
    if not isinstance(key, str):
      raise ReferenceCheckpointError(f"state_dict key {key!r} is not a string")
    name = key[len(COMPILED_PREFIX):] if key.startswith(COMPILED_PREFIX) else key
    if name in out:
      raise ReferenceCheckpointError(
          f"key {name!r} appears both with and without the {COMPILED_PREFIX!r} prefix: keep one")
    if isinstance(value, Mapping):
      raise ReferenceCheckpointError(
          f"state_dict[{key!r}] is a nested mapping, not a tensor: pass the model's flat state_dict "
          f"(e.g. ckpt[{key!r}] if the file wraps it)")
    out[name] = _to_numpy(value)
  return out


def load_state_dict(path: str | os.PathLike) -> StateDict:
  """Reads a reference checkpoint: {key: np.ndarray}, keys without the `_orig_mod.` prefix.

  Uses `torch.load(path, map_location="cpu", weights_only=True)` (never unpickles arbitrary objects).
  bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays, bitwise. Raises ImportError with the
  install hint when torch is missing (TorchMissing), FileNotFoundError (InputMissing) for a
  missing file.
  """
  torch = _import_torch()
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise InputMissing(f"reference checkpoint {path!r} does not exist. Fix: pass the path of a "
                       "reference .pt (torch.save of the reference's state_dict)")
  raw = torch.load(path, map_location="cpu", weights_only=True)
  if not isinstance(raw, Mapping):
    raise ReferenceCheckpointError(
        f"{path}: expected a state_dict (mapping of key -> tensor), got {type(raw).__name__}. "
        "Fix: save the model's flat state_dict (torch.save(model.state_dict(), path))")
  for key, value in raw.items():
    if not isinstance(value, torch.Tensor):
      raise ReferenceCheckpointError(
          f"{path}: state_dict[{key!r}] is a {type(value).__name__}, not a tensor. Fix: save the "
          "model's flat state_dict (torch.save(model.state_dict(), path))")
  return normalize(raw)


def save_state_dict(state_dict: Mapping[str, Any], path: str | os.PathLike) -> None:
  """torch.save of {key: tensor} (tensors only, loadable with weights_only=True); keys as given."""
  torch = _import_torch()
  tensors = {k: _numpy_to_tensor(torch, k, v) for k, v in state_dict.items()}
  torch.save(tensors, os.fspath(path))



def adam_param_count(state_dict: Mapping[str, Any]) -> int:
  """Scalars of the Adam-trained weights: every key but H_init, L_init and the puzzle table (the
  count the reference prints; 5,028,866 for Sudoku TRM-MLP). `_orig_mod.` prefixes are ignored."""
  skip = {K_H_INIT, K_L_INIT, K_TABLE}
  return int(sum(math.prod(np.shape(v)) for k, v in state_dict.items()
                 if k.removeprefix(COMPILED_PREFIX) not in skip))
