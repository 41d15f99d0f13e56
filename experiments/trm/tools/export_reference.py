r"""Exports a trained podlab TRM run as a reference PyTorch checkpoint (`.pt` state_dict).

  python -m experiments.trm.tools.export_reference --config=configs/cpu_demo.py \
      --workdir=workdirs/cpu_demo --out=/tmp/trm_cpu_demo.pt [--compiled_prefix]

The weights are those the run evaluates with: the EMA weights when config.ema (every recipe), else
the Adam parameters; with H_init/L_init and the puzzle-embedding table (gathered from its shards when
config.shard_puzzle_table), in the reference's key layout (experiments/trm/reference_checkpoint.py,
docs/trm.md "Checkpoint format"). The reference loads it with `model.load_state_dict`, and podlab
starts from it with `--config.init_from=/tmp/trm_cpu_demo.pt` (e.g. `--mode=eval`). Run it with the
saving run's device count when the table is sharded (its shards are per device).
"""

from __future__ import annotations

import os

from absl import flags
import numpy as np

from experiments.common import entry
from experiments.common import trainer
from experiments.trm import reference_checkpoint
from experiments.trm import sharded_table
from experiments.trm import train

_OUT = flags.DEFINE_string("out", None, "The .pt file to write.")
_COMPILED = flags.DEFINE_bool("compiled_prefix", False,
                              "Prefix keys with `_orig_mod.` as torch.compile'd reference runs do.")


def export(config, workdir: str, out: str, *, compiled_prefix: bool = False) -> str:
  """Writes the run's newest checkpoint to `out` as a reference state_dict; returns a summary."""
  step, state, device_state, b = trainer.restore_state(train.TRM(), config, workdir)
  weights = b.weights.get(state)
  table = weights["puzzle_table"]
  cfg = b.model_config
  if table is None and device_state is not None and device_state.puzzle_shard is not None:
    table = sharded_table.gather_table(device_state.puzzle_shard, cfg.num_puzzle_identifiers)
  sd = reference_checkpoint.export_reference(weights["params"], weights["model_state"],
                                             None if table is None else np.asarray(table), cfg,
                                             compiled_prefix=compiled_prefix)
  reference_checkpoint.save_state_dict(sd, out)
  which = "EMA" if config.ema else "Adam"
  return (f"wrote {len(sd)} tensors ({reference_checkpoint.adam_param_count(sd):,} Adam parameters, "
          f"{which} weights of step {step}) to {out}")


def main() -> None:
  print(export(entry.config(), entry.workdir(), _OUT.value, compiled_prefix=_COMPILED.value))


if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  entry.run_program(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), main)
