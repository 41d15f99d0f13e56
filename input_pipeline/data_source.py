"""A job's dataset: a config's dataset section turned into its builder's kwargs, metadata and
description, and `DataSource` / `TextSplits`, which build this host's iterators (input_pipeline's
`pipeline`, `evaluation` and `text`) with the job's constant arguments filled in, preparing the data
first when the config asks (process 0 first, the others after it).

Synopsis:
  from experiments.common import layout as layout_lib
  from input_pipeline import data_source
  layout = layout_lib.batch_layout(config)
  source = data_source.DataSource.from_config(config.dataset, seed=config.seed)
  it = source.train_iterator(layout=layout, start_step=step)
  ev = source.eval_batches("test", layout=layout)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Optional

from input_pipeline import datasets
from input_pipeline import evaluation
from input_pipeline import hub
from input_pipeline import pipeline
from input_pipeline import pod_barrier
from input_pipeline import prepare
from input_pipeline import text
from input_pipeline.builders import text_corpus

Batch = pipeline.Batch


def builder_kwargs(dataset_config: Any) -> dict[str, Any]:
  """The builder kwargs of a config's dataset section: `builder_kwargs` (knobs) plus
  `builder_config` (a preset name, "" = none) as "config"."""
  kwargs = dataset_config.get("builder_kwargs") or {}
  kwargs = dict(kwargs.to_dict() if hasattr(kwargs, "to_dict") else kwargs)
  if dataset_config.get("builder_config", ""):
    kwargs["config"] = dataset_config.get("builder_config")
  return kwargs


def dataset_metadata(dataset_config: Any) -> dict:
  """`datasets.get_metadata` of a config's dataset: its static facts, plus the split sizes and the
  data's own facts (a text vocabulary, ARC's ids) once it is prepared. Reads no examples and
  prepares nothing: what a build sizes the run with (a dry run of unprepared data included)."""
  return datasets.get_metadata(dataset_config.get("name"), builder_kwargs(dataset_config),
                               dataset_config.get("data_dir"))


def describe_data(dataset_config: Any) -> str:
  """Where a config's dataset comes from, in one line: prepared, or what preparing it on first use
  reads or downloads (a dry run's data line; no network, nothing prepared)."""
  return datasets.describe(dataset_config.get("name"), dataset_config.get("data_dir"),
                           builder_kwargs(dataset_config), dataset_config.get("manual_dir", ""))


@dataclasses.dataclass
class DataSource:
  """One dataset of one job: where it lives and its config.

  Builds the iterators above with the job's constant arguments filled in and keeps eval sets in
  memory between evaluations; the batch figures and this host's place come from the layout.
  """
  name: str
  data_dir: str
  builder_kwargs: dict[str, Any]
  seed: int
  group_sampling: bool = True     # pipeline.create_group_train_iterator (the reference's ARC one)
  _eval_cache: dict = dataclasses.field(default_factory=dict, repr=False)

  @classmethod
  def from_config(cls, dataset_config: Any, seed: int) -> "DataSource":
    """From a config section with `name`, `data_dir`, `builder_kwargs` (knobs) and optionally
    `builder_config` (a preset name, "" = none), `manual_dir` and `prepare_if_missing`."""
    kwargs = builder_kwargs(dataset_config)
    source = cls(name=dataset_config.get("name"), data_dir=dataset_config.get("data_dir"),
                 builder_kwargs=kwargs, seed=seed,
                 group_sampling=bool(dataset_config.get("group_sampling", True)))
    datasets.make_config(source.name, kwargs)  # validate the knobs before anything is read
    if dataset_config.get("prepare_if_missing", False):
      manual_dir = dataset_config.get("manual_dir", "") or None

      def prepare_here(_: str = "") -> str:
        prepare.prepare(source.name, source.data_dir, kwargs, manual_dir)
        return ""
      # Process 0 prepares first (downloads included) and the others wait at a barrier that
      # follows its progress (pod_barrier.once_per_pod; its errors reach every host as one line):
      # with a shared data_dir (gs://) they then find it prepared; with per-host local dirs each
      # prepares its own copy after it.
      pod_barrier.once_per_pod(f"podlab_prepare_{source.name}", prepare_here, prepare_here,
                               progress=lambda: hub.bytes_under(
                                   source.data_dir, prepare.download_dir(source.data_dir)),
                               what=f"preparing dataset {source.name}")
    return source

  def metadata(self) -> dict:
    """`datasets.get_metadata` of this dataset (with split sizes once it is prepared)."""
    return datasets.get_metadata(self.name, self.builder_kwargs, self.data_dir)

  def num_examples(self, split: str) -> int:
    """Examples in `split` over all hosts."""
    builder = pipeline.prepared_builder(self.data_dir, self.name, self.builder_kwargs)
    return builder.info.splits[split].num_examples

  def train_iterator(self, *, layout: Any, start_step: int = 0, split: str = "train",
                     augment: bool = True) -> Iterator[Batch]:
    """`pipeline.create_train_iterator` for this host, from `start_step` on; for datasets of
    materialised augmentations (metadata with `train_groups`, e.g. ARC)
    `pipeline.create_group_train_iterator` unless `group_sampling` is off."""
    if self.group_sampling and "train_groups" in self.metadata():
      return pipeline.create_group_train_iterator(
          self.data_dir, self.name, self.builder_kwargs, layout=layout, seed=self.seed,
          start_step=start_step, split=split)
    return pipeline.create_train_iterator(
        self.data_dir, self.name, self.builder_kwargs, layout=layout, seed=self.seed,
        start_step=start_step, split=split, augment=augment)

  def eval_batches(self, split: str = "test", *, layout: Any, subset_size: Optional[int] = None,
                   subset_seed: int = 0) -> evaluation.EvalIterator:
    """`evaluation.create_eval_iterator` for this host (cached); `subset_size` None or 0 = the full
    split."""
    subset = subset_size or None
    key = (split, layout, subset, subset_seed)
    if key not in self._eval_cache:
      self._eval_cache[key] = evaluation.create_eval_iterator(
          self.data_dir, self.name, self.builder_kwargs, layout=layout, split=split,
          subset_size=subset, subset_seed=subset_seed)
    return self._eval_cache[key]


class TextSplits:
  """A prepared text dataset's train and val token arrays on this host, and their random-window
  streams (input_pipeline/text.py): the language models' data (nanoGPT, masked diffusion)."""

  def __init__(self, dataset_config: Any, seed: int):
    self.seed = seed
    source = DataSource.from_config(dataset_config, seed=seed)
    builder = pipeline.prepared_builder(source.data_dir, source.name, source.builder_kwargs)
    self.vocab = text_corpus.vocab_of(builder)
    self.vocab_size = int(builder.info.metadata["vocab_size"])
    self.train_split, self.val_split = dataset_config.train_split, dataset_config.val_split
    self.tokens = {s: text_corpus.load_tokens(builder, s) for s in (self.train_split,
                                                                    self.val_split)}

  def windows(self, split: str, stream: str, *, block_size: int, layout: Any, accum: int,
              start_step: int) -> Iterator[Batch]:
    """Random windows {"x", "y"} [D, accum, b, block_size] of `split` for this host, from
    `start_step` on (text.window_iterator; the figures come from the layout)."""
    return text.window_iterator(self.tokens[split], block_size=block_size, layout=layout,
                                accum=accum, seed=self.seed, stream=stream, start_step=start_step)
