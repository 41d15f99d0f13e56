"""A reference recipe on a TPU v4-64 slice: 32 chips = 32 JAX devices, 8 hosts x 4 (Sudoku TRM-MLP).

  launch/pod.sh stable-1                                        # every worker runs the line below
  python -m experiments.trm.main --config=configs/v4_64.py --workdir=gs://BUCKET/trm/v4_64
  python -m experiments.trm.main --config=configs/v4_64.py:batch=6144 ...   # a larger global batch
  python -m experiments.trm.main --config=configs/v4_64.py:recipe=arc1_att ...   # another recipe
  python -m experiments.trm.main --config=configs/v4_64.py --dry_run        # compile it on a laptop

Arguments (typed, comma-separated): recipe (sudoku_mlp (default), sudoku_att, maze_att, arc1_att,
arc2_att: the single-machine config this pod file overrides); batch (global batch, default 768 =
the published recipes, 24 per chip); devices (default 32). The TFDS data dir comes from $TFDS_DATA_DIR (the pod launcher sets it to
a gs:// path) or --config.dataset.data_dir. A batch other than 768 is a DEVIATION from the published recipe: the
learning-rate schedule and step count follow the reference formulas for that batch
(total_steps = epochs * train puzzles / batch), but the published accuracy was measured at 768.
"""

import importlib

from experiments.common import config_utils

RECIPES = ("sudoku_mlp", "sudoku_att", "maze_att", "arc1_att", "arc2_att")


def get_config(arg=None):
  a = config_utils.parse_arg(arg, recipe="sudoku_mlp", batch=768, devices=32)
  if a.recipe not in RECIPES:
    raise config_utils.ConfigError("arg:recipe", a.recipe, "unknown recipe", f"use one of {RECIPES}")
  c = importlib.import_module(f"experiments.trm.configs.{a.recipe}").get_config()
  c.global_batch_size = a.batch
  c.num_devices = a.devices
  c.devices_per_host = 4                         # v4: 4 chips (JAX devices) per host
  c.eval_subset = 10000                          # fixed subsample during training, full set at the end
  c.checkpoint_every_steps = 500
  # Each block recomputed in the backward pass (model.remat: the same numbers, more FLOPs): by the
  # TPU compiler (docs/tpu.md) Sudoku-MLP's step reads 17.6 -> 15.0 GB, peak 0.75 -> 0.21 GiB;
  # Sudoku-Att 23.0 -> 22.5 GB. Maze's reads more with it (169 -> 200 GB; peak 4.98 -> 0.92 GiB).
  c.model.remat = True
  c.target = "v4-64"                             # `--dry_run` compiles for it (libtpu)
  return c
