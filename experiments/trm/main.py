r"""Trains and evaluates TRM: the shared main (`experiments.common.main_lib`) around `train.train_and_evaluate`.

  python -m experiments.trm.main --config=configs/cpu_demo.py --workdir=workdirs/cpu_demo
  python -m experiments.trm.main --config=configs/sudoku_mlp.py --config.dataset.manual_dir=DIR \
      --workdir=gs://BUCKET/trm/sudoku_mlp
  python -m experiments.trm.main --config=configs/v4_64.py   # on every worker of a v4-64 slice

`--config` paths are resolved from the current directory first, then inside experiments/trm/.
Fields are overridden with `--config.FIELD=VALUE` (e.g. `--config.lr=3e-4`). Flags, exit codes
(2 bad input, 3 non-finite, 143/130 preempted) and distributed init: see experiments/common/main_lib.py.
"""

import os
import sys

from experiments.common import config_utils
from experiments.common import main_lib

EXPERIMENT_DIR = os.path.dirname(os.path.abspath(__file__))
default_workdir = main_lib.default_workdir


def train_and_evaluate(config, workdir):
  from experiments.trm import train  # pylint: disable=g-import-not-at-top  (after distributed init)
  return train.train_and_evaluate(config, workdir)


def dry_run(config):
  """Fake the pod host's devices on the CPU (before JAX starts its backends) and compile."""
  main_lib.fake_host_devices(config)
  from experiments.trm import dry_run as dry_run_lib  # pylint: disable=g-import-not-at-top
  try:
    report = dry_run_lib.run(config)
  except config_utils.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"Dry run of {main_lib.config_filename()}:\n{dry_run_lib.format_report(report)}",
        flush=True)


if __name__ == "__main__":
  main_lib.run(EXPERIMENT_DIR, train_and_evaluate, dry_run)
