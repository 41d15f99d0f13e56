"""Random Dream models written as Hugging Face checkpoint folders, in the real key layout.

`write_random_checkpoint` writes safetensors shards, their index json and config.json for any
DreamConfig, generating one tensor at a time (`random_tensor`: deterministic per seed and tensor,
so any size can be written with little memory): the fixture of the conversion, generation and
benchmark tests and demos (`python -m experiments.diffucoder.convert --write_random=DIR`).

Synopsis:

  import os, tempfile
  from experiments.diffucoder import random_checkpoint
  from modules import dream

  d = tempfile.mkdtemp()
  names = random_checkpoint.write_random_checkpoint(d, dream.tiny_config(), seed=0, num_shards=2)
  assert len(names) == 2 and os.path.isfile(os.path.join(d, "config.json"))
"""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import numpy as np

from experiments.common import safetensors_io as st
from experiments.diffucoder import hf_layout
from modules import dream


def random_tensor(name: str, shape: Sequence[int], index: int, seed: int,
                  dtype=np.float32) -> np.ndarray:
  """The deterministic random value of one tensor of a random checkpoint (see write_random_checkpoint).

  Linear weights ~ N(0, 1/in), biases ~ N(0, 0.1^2), norm weights ~ 1 + N(0, 0.1^2), embedding
  rows ~ N(0, 1): a well-conditioned random model whose biases and norm weights all matter.
  """
  rng = np.random.default_rng([seed, index])
  x = rng.standard_normal(tuple(shape), dtype=np.float32)
  if name.endswith("layernorm.weight") or name == "model.norm.weight":
    x = 1.0 + 0.1 * x
  elif name.endswith(".bias"):
    x *= 0.1
  elif name != "model.embed_tokens.weight":
    x *= 1.0 / np.sqrt(shape[1])
  return x.astype(dtype)



def write_random_checkpoint(out_dir: str, config: dream.DreamConfig, *, seed: int = 0,
                            num_shards: Optional[int] = None,
                            max_shard_bytes: Optional[int] = None,
                            tokens: Optional[dict] = None) -> List[str]:
  """Writes a random Dream model as a Hugging Face folder: shards + index json + config.json.

  Tensors are in the real key layout and torch [out, in] shapes, in config.param_dtype, generated
  one at a time (`random_tensor`, so any size can be written with little memory). Give either the
  number of shards (contiguous, about equal bytes) or the shard size limit. Returns the shard names.
  """
  specs = hf_layout.hf_tensor_specs(config)
  dtype = np.dtype(config.param_dtype)
  index = {name: i for i, (name, _) in enumerate(specs)}
  shapes = dict(specs)
  if max_shard_bytes is None and num_shards is None:
    num_shards = 1
  make = lambda name: random_tensor(name, shapes[name], index[name], seed, dtype)
  names = st.write_sharded(out_dir, [(n, s, dtype) for n, s in specs], make,
                           max_shard_bytes=max_shard_bytes, num_shards=num_shards)
  with open(os.path.join(out_dir, hf_layout.CONFIG_JSON), "w") as f:
    json.dump(hf_layout.hf_config_json(config, tokens), f, indent=2)
  return names

