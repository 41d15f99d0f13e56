"""Sudoku TRM-MLP on a TPU v4-64 slice: 32 chips = 32 JAX devices, 8 hosts x 4.

  launch/pod.sh stable-1                                        # every worker runs the line below
  python -m experiments.trm.main --config=configs/v4_64.py --workdir=gs://BUCKET/trm/v4_64
  python -m experiments.trm.main --config=configs/v4_64.py:batch=6144 ...   # a larger global batch
  python -m experiments.trm.main --config=configs/v4_64.py --dry_run        # compile it on a laptop

Arguments (typed, comma-separated): batch (global batch, default 768 = the published recipe, 24 per
chip); devices (default 32). The TFDS data dir comes from $TFDS_DATA_DIR (the pod launcher sets it to
a gs:// path) or --config.dataset.data_dir. A batch other than 768 is a DEVIATION from the published recipe: the
learning-rate schedule and step count follow the reference formulas for that batch
(total_steps = epochs * train puzzles / batch), but the published accuracy was measured at 768.
"""

from experiments.common import config_utils
from experiments.trm.configs import sudoku_mlp


def get_config(arg=None):
  a = config_utils.parse_arg(arg, batch=768, devices=32)
  c = sudoku_mlp.get_config()
  c.global_batch_size = a.batch
  c.num_devices = a.devices
  c.devices_per_host = 4                         # v4: 4 chips (JAX devices) per host
  c.eval_subset = 10000                          # fixed subsample during training, full set at the end
  c.checkpoint_every_steps = 500
  return c
