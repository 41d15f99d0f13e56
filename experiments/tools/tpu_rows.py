"""The row types of `make tpu-check` (experiments/tools/tpu_check.py): what an experiment declares.

Each experiment lists its rows in its own `tools/tpu_rows.py` (`CHECKS`: configs compiled as the
pod runs them; `PROGRAM_CHECKS`: programs its own function compiles), and tpu_check finds those
modules by name (`tpu_check.ROW_MODULES`): experiments/tools/ imports no experiment.

  from experiments.tools import tpu_rows
  check = tpu_rows.Check("trm v4_64 sudoku_mlp", lambda: None, "experiments.trm.configs.v4_64",
                         "recipe=sudoku_mlp")
  assert check.target is None and check.skip() is None     # the config's own target, no reason
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

from experiments.tools import tpu_report


@dataclasses.dataclass
class Check:
  """One row group: an experiment's config compiled for a target.

  Fields:
    label: the rows' name in docs/tpu.md's table (what `--only` matches).
    experiment: makes the `Experiment` (e.g. the experiment's class).
    config_module: the config file's module, e.g. "experiments.trm.configs.v4_64".
    arg: the config's argument (`get_config(arg)`), or None.
    target: a gcloud accelerator type; None: the config's own `target`.
    overrides: applied to the config before it is built, in place.
    skip: a reason not to compile it (missing data), or None.
  """
  label: str
  experiment: Callable[[], Any]
  config_module: str
  arg: Optional[str]
  target: Optional[str] = None
  overrides: Callable[[Any], None] = lambda c: None
  skip: Callable[[], Optional[str]] = lambda: None


@dataclasses.dataclass
class ProgramCheck:
  """A row group compiled by an experiment's own function (no trainer config): its reports.
  `compile(log)` returns one `tpu_report.Report` per program; `log` takes progress lines."""
  label: str
  compile: Callable[[Callable[[str], None]], List[tpu_report.Report]]
