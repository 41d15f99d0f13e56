r"""Host memory of loading a Dream checkpoint into model-parallel shards: peak RSS vs model size.

Writes a random Dream (bfloat16, the real Hugging Face layout, `--shards` safetensors files) once,
then for each mesh runs a fresh child process (`--xla_force_host_platform_device_count` = the mesh's
devices, set before JAX starts) that loads it with `convert.load_params(..., mesh=)`: each tensor is
read from its memory-mapped shard and put straight into its device blocks. The child reports its
resident memory before the load and its peak during it (VmHWM, reset before the load through
/proc/self/clear_refs). On the CPU backend the devices' buffers ARE host memory, so the ideal peak
delta is the model held by the devices (model size x data groups: the weights are replicated over
the data axis) plus about one tensor; reading the whole checkpoint into host memory first would add
the model once more.

  python -m experiments.diffucoder.tools.load_memory --dir=/tmp/dream_1g --meshes=1x4,1x8
  # the same from an orbax folder (convert --out; written once from --dir, into <dir>_orbax): the
  # sharded restore of `convert.load_checkpoint(..., mesh=)`
  python -m experiments.diffucoder.tools.load_memory --dir=/tmp/dream_1g --meshes=1x4 --format=orbax

The table: mesh, model GB (the weights' bytes), device GB (what the devices hold), peak delta GB,
extra = peak delta - device GB (the loader's own host memory), largest tensor GB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

from absl import app
from absl import flags
import jax
import numpy as np

from experiments.common import checkpointing  # noqa: F401  (orbax and TF loaded before the baseline)
from experiments.common import console
from experiments.common import distributed
from experiments.diffucoder import convert
from experiments.diffucoder import model_sharding
from experiments.diffucoder import orbax_params
from experiments.diffucoder import random_checkpoint
from modules import dream

_DIR = flags.DEFINE_string("dir", "/tmp/dream_load_memory", "Where the random checkpoint is written.")
_MESHES = flags.DEFINE_list("meshes", ["1x4", "1x8"], "data x model meshes.")
_SHARDS = flags.DEFINE_integer("shards", 4, "Safetensors files of the checkpoint.")
_CHILD = flags.DEFINE_string("child", "", "(internal) load on this mesh and print JSON.")
_FORMAT = flags.DEFINE_enum("format", "safetensors", ["safetensors", "orbax"],
                            "Load the safetensors folder --dir, or its orbax copy <dir>_orbax.")

# About 1.02 GB in bfloat16: 24 layers of a D 1024 / F 4096 Dream with a 64K vocabulary.
CONFIG = dict(vocab_size=65536, hidden_size=1024, intermediate_size=4096, num_layers=24,
              num_heads=16, num_kv_heads=8)


def _status(field: str) -> int:
  """A /proc/self/status field (VmRSS, VmHWM) in bytes."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f"no {field} in /proc/self/status")


def child(mesh_text: str) -> Dict[str, Any]:
  """Loads --dir onto a data x model mesh; returns the memory figures (bytes)."""
  data, model = (int(x) for x in mesh_text.split("x"))
  config = dream.DreamConfig(**CONFIG)
  mesh = model_sharding.mesh_2d(data, model)
  jax.block_until_ready(jax.device_put(np.zeros(4), jax.devices()[0]))   # runtime up before we measure
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                                                     # reset VmHWM to VmRSS
  before = _status("VmRSS")
  if _FORMAT.value == "orbax":
    params = convert.load_checkpoint(orbax_dir(), config, mesh=mesh)
  else:
    params = convert.load_params(_DIR.value, config, mesh=mesh)
  jax.block_until_ready(params)
  peak = _status("VmHWM")
  leaves = jax.tree.leaves(dream.param_shapes(config))
  device_bytes = sum(s.data.nbytes for a in jax.tree.leaves(params) for s in a.addressable_shards)
  return dict(mesh=mesh_text, model_gb=sum(a.size * a.dtype.itemsize for a in leaves) / 1e9,
              device_gb=device_bytes / 1e9, peak_delta_gb=(peak - before) / 1e9,
              largest_tensor_gb=max(a.size * a.dtype.itemsize for a in leaves) / 1e9)


def orbax_dir() -> str:
  return _DIR.value.rstrip("/") + "_orbax"


def main(argv) -> None:
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  del argv
  if _CHILD.value:
    print(json.dumps(child(_CHILD.value)), flush=True)
    return
  config = dream.DreamConfig(**CONFIG)
  if not os.path.isfile(os.path.join(_DIR.value, "config.json")):
    console.say(f"writing a random {dream.count_params(config) * 2 / 1e9:.2f} GB Dream to {_DIR.value}")
    random_checkpoint.write_random_checkpoint(_DIR.value, config, num_shards=_SHARDS.value)
  if _FORMAT.value == "orbax" and not os.path.isdir(orbax_dir()):
    console.say(f"writing its orbax copy to {orbax_dir()}")
    orbax_params.save_params(convert.load_params(_DIR.value, config, place=np.asarray),
                             orbax_dir(), config)
  rows: List[Dict[str, Any]] = []
  for mesh in _MESHES.value:
    data, model = (int(x) for x in mesh.split("x"))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={data * model}")
    proc = subprocess.run([sys.executable, "-m", "experiments.diffucoder.tools.load_memory",
                           f"--dir={_DIR.value}", f"--child={mesh}", f"--format={_FORMAT.value}"],
                          env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"mesh {mesh}: the child failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r["extra_gb"] = r["peak_delta_gb"] - r["device_gb"]
    rows.append(r)
  cols = ["mesh", "model_gb", "device_gb", "peak_delta_gb", "extra_gb", "largest_tensor_gb"]
  print("  ".join(f"{c:>17}" for c in cols))
  for r in rows:
    print("  ".join(f"{r[c]:>17.3f}" if isinstance(r[c], float) else f"{r[c]:>17}" for c in cols))


if __name__ == "__main__":
  app.run(main)
