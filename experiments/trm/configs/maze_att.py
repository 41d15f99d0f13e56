"""The reference Maze-Hard TRM-Att recipe (published 85.3% exact accuracy; 4 L40S, <24 h).

  python -m experiments.trm.main --config=configs/maze_att.py --workdir=workdirs/maze_att
        # downloads sapientinc/maze-30x30-hard-1k on first use; offline --config.dataset.manual_dir
  python -m experiments.trm.main --config=configs/maze_att.py:dihedral=False ...   # reference builder

Data: the public Maze-Hard CSVs (1000 train / 1000 test 30x30 mazes, shortest path > 110). The paper
trains with the 8 dihedral transforms; the reference builder's default is none. Here the choice is
the typed argument `dihedral` (default True = the paper): each training maze is seen under a random
one of the 8 transforms per visit, so the step count stays epochs * 1000 / batch as in the
reference. Arguments: dihedral (bool), generated (bool: the offline `maze_generated` dataset of the
same shape instead of the public files, for trying the recipe without them).
"""

import ml_collections

from experiments.common import config_utils
from experiments.trm.configs import sudoku_att


def get_config(arg=None):
  a = config_utils.parse_arg(arg, dihedral=True, generated=False)
  c = sudoku_att.get_config()       # the same optimisation (epochs, eval interval, lr, wd, EMA)
  c.dataset.name = "maze_generated" if a.generated else "maze_hard"
  c.dataset.builder_kwargs = ml_collections.ConfigDict({"dihedral": a.dihedral})
  c.model.L_cycles = 4
  return c
