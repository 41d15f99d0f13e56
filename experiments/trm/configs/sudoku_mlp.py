"""The reference Sudoku-Extreme TRM-MLP recipe (published 87.4% exact accuracy; 1 L40S, ~18-20 h).

  python -m experiments.trm.main --config=configs/sudoku_mlp.py --workdir=workdirs/sudoku_mlp
        # downloads sapientinc/sudoku-extreme on first use; offline --config.dataset.manual_dir=DIR

Training set: 1000 puzzles subsampled (seeded) from the train CSV, augmented on the fly.
"""

from experiments.trm.configs import base


def get_config():
  c = base.get_config()
  c.dataset.name = "sudoku_extreme"
  c.dataset.builder_kwargs.subsample_size = 1000
  c.dataset.builder_kwargs.min_rating = 0
  c.dataset.builder_kwargs.seed = 0
  c.model.mlp_t = True
  c.model.pos_encodings = "none"
  c.epochs = 50000
  c.eval_interval_epochs = 5000
  c.lr = 1e-4
  c.puzzle_emb_lr = 1e-4
  c.weight_decay = 1.0
  c.puzzle_emb_weight_decay = 1.0
  c.ema = True
  return c
