"""TRM's evaluators: the ACT metrics of the test split, and ARC pass@K with submission.json.

One pass over the padded test batches (`evaluate` below: a fresh carry, exactly
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
  from experiments.common import layout
  from experiments.trm import arc_eval, evaluators
  from input_pipeline.puzzles import arc, arc_dataset
  task = arc.Task("t1", [arc.Pair(np.array([[1, 2]], np.uint8), np.array([[2, 1]], np.uint8))],
                  [arc.Pair(np.array([[3, 4]], np.uint8), np.array([[4, 3]], np.uint8))])
  meta = arc_dataset.build_metadata([("toy", task)], arc_dataset.Variant("toy", ("toy",), "toy"),
                                    num_aug=3, seed=0)
  scorer = evaluators.ArcPassAtK(meta, layout.of_devices())  # a run passes its own layout
  scores = scorer.finalize([], step=1, workdir=tempfile.mkdtemp(), final=True)
  scores["num_test_inputs"]                                  # 1.0 (no votes: nothing right)
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.common import errors
from experiments.common import experiment
from experiments.common import layout as layout_lib
from experiments.common import lazy_import
from experiments.common import metrics as metrics_lib
from experiments.common import parallel
from experiments.common import workdir as workdir_lib
from experiments.trm import arc_eval
from experiments.trm import losses
from experiments.trm import sharded_table
from modules import trm

datasets = lazy_import.module("input_pipeline.datasets")
arc_agi = lazy_import.module("input_pipeline.builders.arc_agi")

RATIO_METRICS = ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps")
LOSS_METRICS = ("lm_loss", "q_halt_loss")
EVAL_COLUMNS = ("exact_accuracy", "accuracy", "q_halt_accuracy", "steps", "lm_loss", "q_halt_loss",
                "count")

ACT_METRICS = "act_metrics"


class ArcPassAtK:
  """ARC pass@K over the augmented test rows; see the module doc."""

  name = "arc_pass_at_k"
  needs_predictions = True

  def __init__(self, meta: Any, layout: layout_lib.BatchLayout):
    self.meta = meta
    self.layout = layout      # the hosts that vote, this host's place among them

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
    hosts, index = self.layout.hosts, self.layout.process_index
    arc_eval.write_json(f"{out_dir}/votes_{index}.json", arc_eval.merge(host_parts))
    if hosts > 1:
      multihost_utils.sync_global_devices(f"podlab_arc_eval_{step}")
    if index != 0:
      return {}
    parts = [workdir_lib.read_json(f"{out_dir}/votes_{i}.json") for i in range(hosts)]
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


def make_scorers(config: Any, meta_loader, layout: layout_lib.BatchLayout) -> List[Any]:
  """The scorer objects of `config.evaluators` on the run's `layout`; `meta_loader(name)` gives a
  scorer's metadata."""
  return [SCORERS[n](meta_loader(n), layout) for n in names(config) if n in SCORERS]


def scorer_columns(results: Dict[str, float]) -> Sequence[str]:
  """Final-table columns added by the scorers (pass@K), in order."""
  return tuple(k for k in results if k.startswith("pass@"))


def merged_results(act: Dict[str, float], scored: Optional[Dict[str, float]]) -> Dict[str, float]:
  out = dict(act)
  out.update(scored or {})
  return out


# --------------------------------------------------------------------------------------------------
# The test split's evaluation (one pass, the scorers fed from it).

def local_rows(x: Any) -> np.ndarray:
  """This host's [n, ...] rows of a per-device (pmapped) array, in local device order."""
  if isinstance(x, jax.Array):
    shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.concatenate([np.asarray(s.data) for s in shards], axis=0)
  return np.asarray(x)


def make_eval_step(model: trm.TRMModel, per_device_batch: int, sharded: bool = False,
                   predictions: bool = False):
  """Per-device evaluation of one padded batch: a fresh carry, exactly halt_max_steps ACT steps, metric
  sums of the LAST step over non-padding rows (psummed over all devices).

  (params, model_state, table, batch, device_index) -> sums; `table` is the replicated puzzle table,
  or with `sharded` this device's shard [R, E] (pmap it along the device axis). With `predictions`
  -> (sums, {"predictions": [B, S] int32 argmax tokens, "q_halt": [B] float32}) of the last step
  (what the ARC evaluator votes with).
  """
  cfg = model.config

  def eval_step(params, model_state, table, batch, device_index):
    mask = batch["mask"]
    data = {k: v for k, v in batch.items() if k != "mask"}
    carry = model.initial_carry(data)
    rows = None
    if sharded and cfg.prefix_len:      # the same rows at every ACT step: look them up once
      rows = sharded_table.lookup(table, data["puzzle_identifiers"], device_index, parallel.AXIS)

    def body(_, c):
      c, _ = model.act_step(params, model_state, table, c, data, training=False, puzzle_rows=rows)
      return c
    carry = jax.lax.fori_loop(0, cfg.halt_max_steps - 1, body, carry)
    carry, out = model.act_step(params, model_state, table, carry, data, training=False,
                                puzzle_rows=rows)
    _, sums = losses.act_loss_and_metrics(
        out["logits"], carry.current_data["labels"], out["q_halt_logits"], out["q_continue_logits"],
        carry.halted & mask, carry.steps, loss_divisor=per_device_batch, row_mask=mask)
    sums = jax.lax.psum(sums, parallel.AXIS)
    if predictions:
      return sums, {"predictions": jnp.argmax(out["logits"], axis=-1).astype(jnp.int32),
                    "q_halt": out["q_halt_logits"].astype(jnp.float32)}
    return sums

  return eval_step


def evaluate(p_eval_step, state: Any, eval_batches, use_ema: bool, *,
             table: Any = None, device_index: Any = None,
             on_predictions: Optional[Any] = None) -> Dict[str, float]:
  """Runs the padded evaluation batches; returns ratios (losses per evaluated example).

  `table`: the puzzle shards of a sharded table (DeviceState.puzzle_shard), else state.puzzle_table
  is used; `device_index`: parallel.shard(parallel.device_indices()) (default: computed here);
  `on_predictions(batch, predictions)`: called per batch with the host batch and this host's
  predictions ([n, B, ...] numpy) of a step made with `make_eval_step(..., predictions=True)`.
  """
  acc = metrics_lib.SumAccumulator()
  params = state.ema if use_ema else state.params
  table = state.puzzle_table if table is None else table
  rules = p_eval_step.rules
  if device_index is None:
    device_index = parallel.shard(parallel.device_indices(rules), rules)
  for batch in eval_batches:
    out = p_eval_step(params, state.model_state, table, parallel.shard(
        {k: v for k, v in batch.items() if k in ("inputs", "labels", "puzzle_identifiers", "mask")},
        rules), device_index)
    if on_predictions is not None:
      out, preds = out
      on_predictions(batch, jax.tree.map(local_rows, preds))
    acc.add(out)
  sums = acc.pop()
  count = sums.get("count", 0.0)
  return metrics_lib.ratios(sums, count_key="count", ratio_keys=RATIO_METRICS,
                            divisors={k: count for k in LOSS_METRICS})


def final_table(final: Dict[str, Dict[str, float]], history: Any) -> str:
  del history
  columns = EVAL_COLUMNS + scorer_columns(next(iter(final.values()), {}))
  return metrics_lib.format_table(final, columns)


def test_evaluator(config: ml_collections.ConfigDict, layout: layout_lib.BatchLayout,
                   model: trm.TRMModel, data: Any, every: int, options: Any, state: Any,
                   example_batch: Any, forward_flops: float) -> experiment.Evaluator:
  """The test split's ACT metrics (and the configured scorers), its data opened on first use."""
  n_local, b, shard = layout.devices_per_host, layout.per_device_batch, config.shard_puzzle_table
  shard = bool(shard) and model.config.prefix_len > 0
  ds = config.dataset
  scoring = any(n in SCORERS for n in names(config))
  # The scorers' metadata (ARC's puzzle records) is read at the first evaluation, from the prepared
  # data: a dry run builds this evaluator before any data exists.
  scorers = functools.cache(lambda: make_scorers(
      config, lambda name: arc_agi.load_metadata(datasets.get_builder(
          data().name, data().data_dir, data().builder_kwargs)), layout))
  p_eval_step = functools.cache(lambda: parallel.compile_step(
      make_eval_step(model, b, sharded=bool(config.shard_puzzle_table),
                     predictions=scoring), layout.rules,
      state_in=(0, 1) if config.shard_puzzle_table else (0, 1, 2), out_axes=0,
      compiler_options=options))
  num_test = functools.cache(lambda: data().num_examples(ds.test_split))

  def run_test(ctx: experiment.EvalContext) -> Dict[str, float]:
    full = ctx.final or config.eval_subset == 0
    batches = data().eval_batches(ds.test_split, layout=layout,
                                  subset_size=0 if full else config.eval_subset)
    parts = []
    collect = None
    if scoring:
      collect = lambda batch, p: parts.append([s.collect(batch, p) for s in scorers()])  # noqa: E731
    results = evaluate(p_eval_step(), ctx.state, batches, use_ema=config.ema,
                       table=ctx.device_state.puzzle_shard if config.shard_puzzle_table else None,
                       on_predictions=collect)
    for i, scorer in enumerate(scorers()):
      results.update(scorer.finalize([p[i] for p in parts], step=ctx.step,
                                     workdir=ctx.workdir.root, final=ctx.final, full=full))
    return results

  table = (jax.ShapeDtypeStruct((n_local, sharded_table.rows_per_device(
      model.config.num_puzzle_identifiers, layout.devices), model.config.emb_ndim), jnp.float32)
           if shard else state.puzzle_table)
  program = experiment.Program(
      make_eval_step(model, b, sharded=bool(config.shard_puzzle_table)),
      (state.params, state.model_state, table,
       dict(example_batch, mask=jax.ShapeDtypeStruct((n_local, b), jnp.bool_)),
       jax.ShapeDtypeStruct((n_local,), jnp.int32)),
      state_in=(0, 1) if config.shard_puzzle_table else (0, 1, 2),
      items=layout.global_batch,
      flops=forward_flops * model.config.halt_max_steps * layout.global_batch)
  return experiment.Evaluator(
      "test", run_test, every=every, at_end=True, program=program,
      size=lambda: num_test() if config.eval_subset == 0 else min(config.eval_subset, num_test()),
      size_final=num_test)
