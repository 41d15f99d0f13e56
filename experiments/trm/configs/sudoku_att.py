"""The reference Sudoku-Extreme TRM-Att recipe (published 74.7% exact accuracy; 1 L40S, <20 h).

  python -m experiments.trm.main --config=configs/sudoku_att.py --workdir=workdirs/sudoku_att
"""

from experiments.trm.configs import sudoku_mlp


def get_config():
  c = sudoku_mlp.get_config()
  c.model.mlp_t = False
  c.model.pos_encodings = "rope"
  return c
