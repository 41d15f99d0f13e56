"""The training step, the benchmarks and the profiler import and run without TensorFlow, TFDS and
CLU (issue 48 item 4: accelerator images often lack them; experiments/common/lazy_import.py).

A fresh interpreter whose import system refuses those three packages (as an image without them
would: ModuleNotFoundError) imports experiments.trm.train, builds TRM's real training step at a tiny
size (step_setup.compile_step: the trainer's step, no data), runs one step, imports the GPU bench,
the reference bench, the profiler and nanoGPT's and Dream's train modules, and reports which of the
packages got loaded: none.
"""

import json
import math
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
BLOCKED = ("tensorflow", "tensorflow_datasets", "clu")

_CHILD = r"""
import json, sys
BLOCKED = %r
class Refuse:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in BLOCKED:
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return None
sys.meta_path.insert(0, Refuse())

import jax
import numpy as np
from experiments.trm import train                     # noqa: F401
from experiments.trm.tools import step_setup
setup = step_setup.compile_step("mlp", "bfloat16", 2, hidden=32)
state, carry, batch, index = setup.args
state, carry, sums = setup.compiled(state, carry, batch, index)
loss = float(np.ravel(np.asarray(jax.device_get(sums["lm_loss"])))[0])
from experiments.tools import bench_gpu                # noqa: F401
from experiments.trm.tools import bench_reference      # noqa: F401
from experiments.trm.tools import profile_step         # noqa: F401
from experiments.nanogpt import train as gpt_train     # noqa: F401
from experiments.diffucoder import train as dream_train  # noqa: F401
print(json.dumps({"loss": loss, "batch": setup.global_batch, "loaded": sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))}))
""" % (BLOCKED,)


def test_the_step_benchmarks_and_profiler_need_no_tensorflow_tfds_or_clu():
  proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True,
                        timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["loaded"] == []
  # lm_loss sums the per-example mean token loss over the global batch (2 per device): about
  # ln(V) per example at init (V = 11).
  per_example = out["loss"] / out["batch"]
  assert math.isfinite(per_example) and 0.5 * math.log(11) < per_example < 2 * math.log(11)
