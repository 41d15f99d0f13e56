"""The dataset registry: TFDS builders by name, their metadata, and builder construction.

Importing this module registers the TFDS builders of `input_pipeline/builders/` (`sudoku_extreme`,
`sudoku_generated`, `maze_hard`, `maze_generated`, `arc_agi`, `shakespeare_char`, `text_corpus`).
The builders live in their own package, which imports none of this module, so the import graph
(and Bazel's) has no cycle.
`builder_kwargs` (what configs carry) is either `{"config": "<preset name>"}` or the builder
config's knobs, e.g. `{"givens": 28, "train_size": 5000}`; `num_workers` is passed through.

Synopsis:
  from input_pipeline import datasets
  meta = datasets.get_metadata("sudoku_generated")   # vocab_size=11, seq_len=81, ...
  builder = datasets.get_builder("sudoku_generated", "/tmp/tfds", {"config": "hard"})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import tensorflow_datasets as tfds

from input_pipeline.builders import arc_agi
from input_pipeline.builders import base
from input_pipeline.builders import maze_generated
from input_pipeline.builders import maze_hard
from input_pipeline.builders import shakespeare_char
from input_pipeline.builders import sudoku_extreme
from input_pipeline.builders import sudoku_generated
from input_pipeline.builders import text_corpus

_MODULES = {
    "sudoku_extreme": sudoku_extreme,
    "sudoku_generated": sudoku_generated,
    "maze_hard": maze_hard,
    "maze_generated": maze_generated,
    "arc_agi": arc_agi,
    "shakespeare_char": shakespeare_char,     # character/byte-level text (nanoGPT)
    "text_corpus": text_corpus,
}
_BUILDERS = {
    "sudoku_extreme": sudoku_extreme.SudokuExtreme,
    "sudoku_generated": sudoku_generated.SudokuGenerated,
    "maze_hard": maze_hard.MazeHard,
    "maze_generated": maze_generated.MazeGenerated,
    "arc_agi": arc_agi.ArcAgi,
    "shakespeare_char": shakespeare_char.ShakespeareChar,
    "text_corpus": text_corpus.TextCorpus,
}
_CONSTRUCTOR_KWARGS = {"sudoku_generated": ("num_workers",), "sudoku_extreme": (),
                       "maze_hard": (), "maze_generated": (), "arc_agi": (),
                       "shakespeare_char": (), "text_corpus": ()}


def names() -> list[str]:
  """The dataset names this package provides."""
  return sorted(_BUILDERS)


def _check_name(name: str) -> None:
  if name not in _BUILDERS:
    raise ValueError(f"unknown dataset {name!r}; known: {', '.join(names())}")


def get_metadata(name: str, builder_kwargs: Optional[Mapping[str, Any]] = None,
                 data_dir: Optional[str] = None) -> dict:
  """Metadata of a dataset: vocab_size, seq_len, num_puzzle_identifiers, pad/blank/ignore ids, ...

  With `builder_kwargs` they are validated (an unknown knob or preset raises ValueError) and the
  config name is added as `config`; with `data_dir` too, and the dataset prepared there, the split
  sizes are added as `splits` ({"train": N, "test": M}).
  """
  _check_name(name)
  meta = dict(_MODULES[name].METADATA)
  if builder_kwargs is not None or data_dir is not None:
    meta["config"] = make_config(name, builder_kwargs).name
  if data_dir is not None:
    builder = get_builder(name, data_dir, builder_kwargs)
    if builder.is_prepared():
      meta["splits"] = {k: v.num_examples for k, v in builder.info.splits.items()}
      if hasattr(_MODULES[name], "prepared_metadata"):   # facts only the data knows (ARC ids)
        meta.update(_MODULES[name].prepared_metadata(builder))
  return meta


def make_config(name: str, builder_kwargs: Optional[Mapping[str, Any]] = None
                ) -> tfds.core.BuilderConfig:
  """Resolve `builder_kwargs` (a preset name under "config", or knobs) to a builder config."""
  _check_name(name)
  kwargs = dict(builder_kwargs or {})
  for key in _CONSTRUCTOR_KWARGS[name]:
    kwargs.pop(key, None)
  module = _MODULES[name]
  config = kwargs.pop("config", None)
  if config is not None:
    if kwargs:
      raise ValueError(f"{name}: pass either config={config!r} or knobs {sorted(kwargs)}, not both")
    if isinstance(config, tfds.core.BuilderConfig):
      return config
    presets = {c.name: c for c in _BUILDERS[name].BUILDER_CONFIGS}
    if config not in presets:
      raise ValueError(f"{name}: unknown config {config!r}; presets: {', '.join(presets)} "
                       "(or pass knobs instead)")
    return presets[config]
  config_cls = type(_BUILDERS[name].BUILDER_CONFIGS[0])
  base = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)}
  knobs = [f.name for f in dataclasses.fields(config_cls) if f.name not in base]
  unknown = sorted(set(kwargs) - set(knobs))
  if unknown:
    raise ValueError(
        f"{name}: unknown builder kwargs {unknown}; knobs: {knobs}, or config=<preset>")
  return module.make_config(**kwargs)


def source_line(name: str, builder_kwargs: Optional[Mapping[str, Any]] = None) -> str:
  """Where `name`'s data comes from when it is prepared without a manual dir (no network)."""
  make_config(name, builder_kwargs)                  # the knobs are valid
  builder = _BUILDERS[name]
  sources = builder.SOURCES
  if not sources:
    return builder.LOCAL_SOURCE
  local = "" if builder.LOCAL_SOURCE.startswith("generated") else f"{builder.LOCAL_SOURCE}; "
  return (f"{local}downloads {base.describe_sources(sources)}, checked against their checksums "
          f"(offline: --manual_dir with {', '.join(base.source_files(sources))})")


def describe(name: str, data_dir: str, builder_kwargs: Optional[Mapping[str, Any]] = None,
             manual_dir: str = "") -> str:
  """One line for a dry run: the dataset, whether it is prepared, where its data comes from."""
  builder = get_builder(name, data_dir, builder_kwargs)
  if builder.is_prepared():
    return f"{builder.info.full_name} prepared in {data_dir}"
  where = f"from {manual_dir}" if manual_dir else source_line(name, builder_kwargs)
  return f"{builder.info.full_name}: prepared in {data_dir} on first use, {where}"


def get_builder(name: str, data_dir: str,
                builder_kwargs: Optional[Mapping[str, Any]] = None) -> tfds.core.DatasetBuilder:
  """A builder instance for `name` in `data_dir` with the config described by `builder_kwargs`."""
  config = make_config(name, builder_kwargs)
  extra = {k: v for k, v in (builder_kwargs or {}).items() if k in _CONSTRUCTOR_KWARGS[name]}
  return _BUILDERS[name](data_dir=data_dir, config=config, **extra)
