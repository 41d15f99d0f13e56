"""TRM's evaluators: the ACT metrics of the test split, and ARC pass@K with submission.json.

One pass over the padded test batches (experiments/trm/train.py `evaluate`: a fresh carry, exactly
halt_max_steps ACT steps) gives the ACT metrics; evaluators that score predictions (ARC pass@K)
receive each batch's predictions from that same pass. `config.evaluators` names them (the registry
`SCORERS`; "act_metrics" is always on):

  act_metrics     exact_accuracy, accuracy, q_halt_accuracy, steps, lm_loss, q_halt_loss, count
  arc_pass_at_k   ARC-AGI pass@1..1000: every host votes on its augmented test rows (predictions
                  mapped back through the inverse augmentation), the hosts' votes are exchanged through
                  files in `<workdir>/arc_eval/step_<N>/`, process 0 merges them once, ranks the
                  candidates and writes submission.json there (and `<workdir>/submission.json` at
                  the end). Needs the arc_agi dataset.

Synopsis (the pass@K scorer's file exchange, on the toy metadata of experiments/trm/arc_eval.py):

  import tempfile, numpy as np
  from experiments.trm import arc_eval, evaluators
  from input_pipeline.puzzles import arc
  task = arc.Task("t1", [arc.Pair(np.array([[1, 2]], np.uint8), np.array([[2, 1]], np.uint8))],
                  [arc.Pair(np.array([[3, 4]], np.uint8), np.array([[4, 3]], np.uint8))])
  meta = arc.build_metadata([("toy", task)], arc.Variant("toy", ("toy",), "toy"), num_aug=3, seed=0)
  scorer = evaluators.ArcPassAtK(meta)
  scores = scorer.finalize([], step=1, workdir=tempfile.mkdtemp(), final=True)
  scores["num_test_inputs"]                                  # 1.0 (no votes: nothing right)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np

from experiments.common import errors
from experiments.common import workdir as workdir_lib
from experiments.trm import arc_eval

ACT_METRICS = "act_metrics"


class ArcPassAtK:
  """ARC pass@K over the augmented test rows; see the module doc."""

  name = "arc_pass_at_k"
  needs_predictions = True

  def __init__(self, meta: Any):
    self.meta = meta

  def collect(self, batch: Dict[str, np.ndarray], predictions: Dict[str, np.ndarray]) -> Any:
    """This host's votes from one batch (host rows [n, B, ...], predictions of the last ACT step)."""
    return arc_eval.collect(self.meta, predictions["predictions"], predictions["q_halt"],
                            batch["puzzle_identifiers"], batch["test_index"], batch["mask"])

  def finalize(self, host_parts: List[Any], *, step: int, workdir: str, final: bool,
               full: bool = True) -> Dict[str, float]:
    """Merges the hosts' votes once (process 0), writes submission.json; process 0 returns the
    metrics (pass@1..1000, counts), the others {}. A subset evaluation scores only the tasks it
    reached."""
    out_dir = f"{workdir.rstrip('/')}/arc_eval/step_{step}"
    arc_eval.write_json(f"{out_dir}/votes_{jax.process_index()}.json", arc_eval.merge(host_parts))
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"podlab_arc_eval_{step}")
    if jax.process_index() != 0:
      return {}
    parts = [workdir_lib.read_json(f"{out_dir}/votes_{i}.json") for i in range(jax.process_count())]
    merged = arc_eval.merge(parts)
    tasks = None if full else arc_eval.voted_tasks(merged)
    metrics, submission = arc_eval.finalize(self.meta, [merged], tasks=tasks)
    arc_eval.validate_submission(submission, self.meta)
    arc_eval.write_json(f"{out_dir}/submission.json", submission)
    if final:
      arc_eval.write_json(f"{workdir.rstrip('/')}/submission.json", submission)
    return {k: float(v) for k, v in metrics.items()}


SCORERS = {ArcPassAtK.name: ArcPassAtK}
"""Evaluators that score the test pass's predictions, by the name `config.evaluators` uses."""


def names(config: Any) -> List[str]:
  """The evaluators `config.evaluators` (comma-separated) asks for; ConfigError for unknown ones."""
  wanted = [n.strip() for n in str(config.evaluators).split(",") if n.strip()]
  valid = [ACT_METRICS] + sorted(SCORERS)
  for n in wanted:
    if n not in valid:
      raise errors.ConfigError("evaluators", config.evaluators, f"unknown evaluator {n!r}",
                               f"use a comma-separated subset of {valid}")
  if "arc_pass_at_k" in wanted and config.dataset.name != "arc_agi":
    raise errors.ConfigError("evaluators", config.evaluators,
                             f"arc_pass_at_k scores ARC-AGI but the dataset is {config.dataset.name}",
                             "drop arc_pass_at_k, or train on dataset arc_agi")
  return wanted


def make_scorers(config: Any, meta_loader) -> List[Any]:
  """The scorer objects of `config.evaluators`; `meta_loader(name)` gives a scorer's metadata."""
  return [SCORERS[n](meta_loader(n)) for n in names(config) if n in SCORERS]


def scorer_columns(results: Dict[str, float]) -> Sequence[str]:
  """Final-table columns added by the scorers (pass@K), in order."""
  return tuple(k for k in results if k.startswith("pass@"))


def merged_results(act: Dict[str, float], scored: Optional[Dict[str, float]]) -> Dict[str, float]:
  out = dict(act)
  out.update(scored or {})
  return out
