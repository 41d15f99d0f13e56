r"""Trains the masked-diffusion Dream: the shared entry point (experiments/common/entry.py) around
`train.MaskedDiffusion`.

  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py \
      --workdir=workdirs/shakespeare_mdm
  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py --mode=eval \
      --workdir=workdirs/shakespeare_mdm                     # re-evaluate the newest checkpoint
  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py --mode=eval \
      --workdir=/tmp/eval --config.init_from=/ckpt/dream_hf_folder   # a Hugging Face / converted folder
  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py --dry_run --target=v4-8

`--config` paths are resolved from the current directory first, then inside experiments/diffucoder/.
Flags, exit codes and distributed init: experiments/common/entry.py.
"""

import os

from experiments.common import entry
from experiments.diffucoder import train

if __name__ == "__main__":
  entry.run(os.path.dirname(os.path.abspath(__file__)), train.MaskedDiffusion)
