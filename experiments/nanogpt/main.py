r"""Trains nanoGPT recipes: the shared entry point (experiments/common/entry.py) around `train.NanoGPT`.

  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py
  python -m experiments.nanogpt.main --config=configs/shakespeare_char.py --workdir=gs://B/gpt/sc
  python -m experiments.nanogpt.main --config=configs/v4_32.py --dry_run     # compile for the TPU
  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py --mode=eval \
      --config.init_from=out-shakespeare-char/ckpt.pt                      # nanoGPT's checkpoint
  launch/pod.sh NAME --bucket B --module experiments.nanogpt.main --config configs/v4_32.py

`--config` paths are resolved from the current directory first, then inside experiments/nanogpt/.
Flags, exit codes and distributed init: experiments/common/entry.py.
"""

import os

from experiments.common import entry
from experiments.nanogpt import train

if __name__ == "__main__":
  entry.run(os.path.dirname(os.path.abspath(__file__)), train.NanoGPT)
