"""The `make run` default: a small TRM-MLP that learns generated Sudoku on a 2-core CPU in minutes.

  make run
  python -m experiments.trm.main --config=configs/cpu_demo.py --workdir=workdirs/cpu_demo
  python -m experiments.trm.main --config=configs/cpu_demo.py:smoke --workdir=/tmp/smoke  # seconds

Data: `sudoku_generated` with 45 givens (36 blanks; uniquely solvable, seeded), 10,000 training and
1,000 held-out test puzzles, augmented on the fly with the reference's Sudoku transforms.
Model: the reference TRM-MLP architecture scaled down (D 64, one head, H_cycles 2, L_cycles 2,
L_layers 2, halt_max_steps 4, no puzzle embedding, float32 compute on the CPU).
Optimisation: the reference optimizers (AdamATan2, warm-up, EMA) with a larger learning rate and an
EMA rate of 0.99 for a run of a few hundred steps (0.999 would still weigh the initial weights by ~50%).

Arguments: `smoke` = a few steps on a tiny dataset (tests); `steps=N`, `givens=N`, `batch=N`.
"""

from experiments.common import config_utils
from experiments.trm.configs import base


def get_config(arg=None):
  a = config_utils.parse_arg(arg, smoke=False, steps=500, givens=45, batch=128)
  c = base.get_config()
  c.dataset.name = "sudoku_generated"
  c.dataset.builder_kwargs.givens = a.givens
  c.dataset.builder_kwargs.train_size = 10_000
  c.dataset.builder_kwargs.test_size = 1_000
  c.dataset.builder_kwargs.seed = 0
  c.dataset.prepare_if_missing = True

  c.model.puzzle_emb_ndim = 0
  c.model.hidden_size = 64
  c.model.num_heads = 1
  c.model.H_cycles = 2
  c.model.L_cycles = 2
  c.model.L_layers = 2
  c.model.mlp_t = True
  c.model.pos_encodings = "none"
  c.model.halt_max_steps = 4
  c.model.forward_dtype = "float32"

  c.global_batch_size = a.batch
  c.total_steps = a.steps
  c.lr = 2e-3
  c.lr_warmup_steps = 50
  c.weight_decay = 0.1
  c.ema = True
  c.ema_rate = 0.99
  c.eval_every_steps = 100
  c.eval_subset = 250
  c.log_every_steps = 25
  c.checkpoint_every_steps = 100
  c.keep_checkpoints = 2

  if a.smoke:
    c.dataset.builder_kwargs.train_size = 256
    c.dataset.builder_kwargs.test_size = 40
    c.global_batch_size = 16
    c.total_steps = 6
    c.eval_every_steps = 3
    c.eval_subset = 0
    c.log_every_steps = 2
    c.checkpoint_every_steps = 3
    c.model.hidden_size = 32
  return c
