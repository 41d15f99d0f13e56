"""A run's evaluations: the Build's evaluators run, their scalars written, their history kept.

  Evaluations(build, workdir, writer, progress, history).run(evaluator, state, device_state, step,
                                                             final)
  load_history(workdir, start_step)     the evaluations a resumed run had made (evals.json)
  default_table(final)                  the final table of an experiment without its own

The trainer (experiments/common/trainer.py) runs each evaluator on its schedule and at the end;
every evaluation goes to TensorBoard (eval/<metric>, or <evaluator>/<metric>), to the history in
`<workdir>/evals.json` ({step: {evaluator: {metric: value}}}, rewritten after each one) and to one
progress line (experiments/common/console.py).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Mapping

from experiments.common import console
from experiments.common import experiment as experiment_lib
from experiments.common import metrics as metrics_lib
from experiments.common import workdir as workdir_lib


def default_table(final: Mapping[str, Mapping[str, float]]) -> str:
  """The final table of an experiment without its own (`Display.final_table`): one row per
  evaluator, a column per metric any of them reports."""
  columns = []
  for metrics in final.values():
    columns += [k for k in metrics if k not in columns]
  return metrics_lib.format_table(final, columns)


class Evaluations:
  """Runs the evaluators, writes their scalars and keeps/persists the history."""

  def __init__(self, b: experiment_lib.Build, wd: workdir_lib.Workdir, writer,
               progress: console.Progress, history: Dict[int, Dict[str, Dict[str, float]]]):
    self.b, self.wd, self.writer, self.progress, self.history = b, wd, writer, progress, history

  def run(self, ev: experiment_lib.Evaluator, state, device_state, step: int, final: bool
          ) -> Dict[str, float]:
    size = ev.size_final if final and ev.size_final is not None else ev.size
    size = size() if callable(size) else size
    what = f"{size:,} examples" if size else ev.name
    t0 = time.perf_counter()
    results = ev.run(experiment_lib.EvalContext(state, device_state, step, final, self.wd))
    took = time.perf_counter() - t0
    tag = "eval" if ev.name in ("test", "eval") else ev.name
    self.writer.write_scalars(step, {f"{tag}/{k}": v for k, v in results.items()})
    self.history.setdefault(step, {})[ev.name] = {k: float(v) for k, v in results.items()}
    workdir_lib.write_json(self.wd.evals, {str(s): v for s, v in sorted(self.history.items())})
    shown = ", ".join(f"{k} {v:.4f}" for k, v in list(results.items())[:8])
    self.progress.message(f"evaluated {what} ({ev.name}) at step {step} in {took:.1f} s: {shown}")
    return results


def load_history(wd: workdir_lib.Workdir, start_step: int) -> Dict[int, Dict[str, Any]]:
  """The evaluations a run resumed at `start_step` had made (its evals.json up to that step)."""
  if start_step == 0:
    return {}
  saved = workdir_lib.read_json_if_exists(wd.evals) or {}
  return {int(s): v for s, v in saved.items() if int(s) <= start_step}
