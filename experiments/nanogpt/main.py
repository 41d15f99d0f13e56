r"""Trains nanoGPT recipes: the shared main (`experiments.common.main_lib`), the same flags as TRM.

  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py
  python -m experiments.nanogpt.main --config=configs/shakespeare_char.py --workdir=gs://B/gpt/sc
  python -m experiments.nanogpt.main --config=configs/v4_32.py --dry_run
  launch/pod.sh NAME --bucket B --module experiments.nanogpt.main --config configs/v4_32.py

`--config` paths are resolved from the current directory first, then inside experiments/nanogpt/.
Exit codes and flags: experiments/common/main_lib.py.
"""

import os
import sys

from experiments.common import config_utils
from experiments.common import main_lib

EXPERIMENT_DIR = os.path.dirname(os.path.abspath(__file__))


def train_and_evaluate(config, workdir):
  from experiments.nanogpt import train  # pylint: disable=g-import-not-at-top (after distributed init)
  return train.train_and_evaluate(config, workdir)


def dry_run(config):
  """Compile one host's training step with the pod's per-host device count (fake CPU devices)."""
  main_lib.fake_host_devices(config)
  from experiments.nanogpt import dry_run as dry_run_lib  # pylint: disable=g-import-not-at-top
  try:
    print(f"Dry run of {main_lib.config_filename()}:\n{dry_run_lib.run(config)}", flush=True)
  except config_utils.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  main_lib.run(EXPERIMENT_DIR, train_and_evaluate, dry_run)
