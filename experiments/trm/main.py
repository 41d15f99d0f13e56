r"""Trains and evaluates TRM: the shared entry point (experiments/common/entry.py) around `train.TRM`.

  python -m experiments.trm.main --config=configs/cpu_demo.py --workdir=workdirs/cpu_demo
  python -m experiments.trm.main --config=configs/sudoku_mlp.py --workdir=gs://BUCKET/trm/sudoku_mlp
      # (its data is downloaded on first use; offline: --config.dataset.manual_dir=DIR)
  python -m experiments.trm.main --config=configs/v4_64.py   # on every worker of a v4-64 slice
  python -m experiments.trm.main --config=configs/v4_64.py --dry_run        # compile it for the TPU
  python -m experiments.trm.main --config=configs/sudoku_mlp.py --mode=eval \
      --config.init_from=step_65104.pt --config.dataset.manual_dir=DIR     # a reference checkpoint

`--config` paths are resolved from the current directory first, then inside experiments/trm/.
Flags, exit codes and distributed init: experiments/common/entry.py.
"""

import os

from experiments.common import entry
from experiments.trm import train

if __name__ == "__main__":
  entry.run(os.path.dirname(os.path.abspath(__file__)), train.TRM)
