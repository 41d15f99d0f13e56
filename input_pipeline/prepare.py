"""Prepare a dataset into a TFDS data dir (idempotent; crash-safe); publish Hub weights for a pod.

Public data is downloaded by its builder when no manual dir is given (Sudoku-Extreme and Maze-Hard
from the Hugging Face Hub, ConceptARC from the TRM repository: input_pipeline/builders/base.py
`fetch_sources`, checked against their checksums; HF_ENDPOINT and HF_HUB_OFFLINE apply); offline,
`--manual_dir` names a folder with the files. Downloads land in `<data_dir>/downloads` (for a gs://
data dir, in ~/.cache/podlab/tfds-downloads on this machine). TFDS writes a dataset version into
`<data_dir>/<name>/<config>/.incomplete<random>_<version>/` and renames it to `<version>/` only after
every split and `dataset_info.json` are written, so a crash leaves no half-written dataset behind
(only an `.incomplete*` folder, which is never read); a second call finds the version folder and
does nothing. Two processes preparing the same config at the same time race on the final rename;
the loser finds the winner's (identical, deterministic) dataset and uses it. In a multi-host job
`data_source.DataSource.from_config` lets process 0 prepare first and the others wait at a barrier
(input_pipeline/pod_barrier.py `once_per_pod`), so a shared data dir (gs://) is written once.

`--weights=NAME` (repeatable: gpt2 ... gpt2-xl, owner/name[@revision]) downloads a model's
safetensors, config and tokenizer files (input_pipeline/hub.py) into `--cache_dir` (a folder or
gs://; default $PODLAB_HUB_CACHE, else the Hugging Face cache): with a bucket, the pod's workers
then copy them from there instead of asking the Hub (docs/pod.md).

Synopsis:
  python -m input_pipeline.prepare --dataset=sudoku_generated --data_dir=/tmp/tfds
  python -m input_pipeline.prepare --dataset=sudoku_generated --data_dir=/tmp/tfds \
      --builder_kwargs='{"givens": 26, "train_size": 20000}'
  python -m input_pipeline.prepare --dataset=sudoku_extreme --data_dir=/tmp/tfds \
      --builder_kwargs='{"subsample_size": 1000, "seed": 0}'      # offline: --manual_dir=FOLDER
  python -m input_pipeline.prepare --dataset=maze_hard --data_dir=gs://B/podlab/tfds \
      --weights=gpt2-xl --cache_dir=gs://B/podlab/hub                 # data and weights for a pod

  from input_pipeline import prepare
  builder = prepare.prepare("sudoku_generated", "/tmp/tfds", {"config": "medium"})
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from typing import Any, Mapping, Optional

from absl import app
from absl import flags
from absl import logging
from etils import epath
import tensorflow_datasets as tfds

from input_pipeline import datasets
from input_pipeline import errors
from input_pipeline import hub


def prepare(dataset_name: str, data_dir: str | os.PathLike,
            builder_kwargs: Optional[Mapping[str, Any]] = None,
            manual_dir: Optional[str | os.PathLike] = None) -> tfds.core.DatasetBuilder:
  """Prepare `dataset_name` with `builder_kwargs` in `data_dir` unless it already is.

  Returns:
    The builder (prepared), ready for `as_dataset`.
  """
  builder = datasets.get_builder(dataset_name, os.fspath(data_dir), builder_kwargs)
  if builder.is_prepared():
    logging.info("%s already prepared in %s", builder.info.full_name, builder.data_dir)
    return builder
  if manual_dir is not None and not epath.Path(manual_dir).is_dir():
    raise errors.SourceMissing(
        f"manual_dir={os.fspath(manual_dir)} ({dataset_name}): no such folder. Fix: "
        f"{getattr(builder, 'MANUAL_DOWNLOAD_INSTRUCTIONS', None) or 'drop --manual_dir'}")
  if not sys.stderr.isatty():
    tfds.disable_progress_bar()    # carriage-return progress bars garble log files and pod output
  download_config = tfds.download.DownloadConfig(
      manual_dir=None if manual_dir is None else os.fspath(manual_dir),
      try_download_gcs=False,
      download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS,
  )
  quiet = os.environ.get("PODLAB_VERBOSE", "") in ("", "0") and logging.get_verbosity() < 1
  start = time.time()
  if quiet:   # TFDS prints "Downloading and preparing dataset Unknown size ..." on stdout: not so here
    sys.stderr.write(f"preparing dataset {builder.info.full_name} in {os.fspath(data_dir)} "
                     f"({source_line(dataset_name, builder_kwargs, manual_dir)})\n")
  try:
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
      builder.download_and_prepare(download_config=download_config,
                                   download_dir=download_dir(data_dir))
  except Exception:
    # Another process preparing the same (deterministic) config may have won the final rename.
    again = datasets.get_builder(dataset_name, os.fspath(data_dir), builder_kwargs)
    if not again.is_prepared():
      raise
    logging.warning("%s was prepared concurrently by another process; using it",
                    again.info.full_name)
    return again
  logging.info("prepared %s in %s", builder.info.full_name, builder.data_dir)
  if quiet:
    splits = ", ".join(f"{name} {split.num_examples:,}" for name, split in builder.info.splits.items())
    sys.stderr.write(f"prepared {builder.info.full_name} ({splits} examples) in "
                     f"{time.time() - start:.1f} s\n")
  return builder


def download_dir(data_dir: str | os.PathLike) -> str:
  """Where the builders' downloads go: `<data_dir>/downloads`, or for a gs:// data dir a folder on
  this machine (the builders read their sources as local files)."""
  data_dir = os.fspath(data_dir)
  if "://" not in data_dir:
    return os.path.join(data_dir, "downloads")
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "podlab",
                      "tfds-downloads")


def source_line(dataset_name: str, builder_kwargs: Optional[Mapping[str, Any]] = None,
                manual_dir: Optional[str | os.PathLike] = None) -> str:
  """Where an unprepared dataset's data comes from, in a few words (no network)."""
  if manual_dir:
    return f"from {os.fspath(manual_dir)}"
  return datasets.source_line(dataset_name, builder_kwargs)


def _define_flags() -> None:
  """Command-line flags, defined only when run as a program (importing has no side effects)."""
  flags.DEFINE_enum("dataset", None, datasets.names(), "Dataset to prepare.")
  flags.DEFINE_string("data_dir", None, "TFDS data dir to write into (with --dataset).")
  flags.DEFINE_string("manual_dir", None, "Folder with the public files, for offline use "
                      "(sudoku_extreme, maze_hard, ConceptARC for arc_agi; shakespeare_char / "
                      "text_corpus: another input.txt). Without it they are downloaded.")
  flags.DEFINE_string("builder_kwargs", "{}",
                      'JSON: {"config": "<preset>"} or the config knobs, e.g. {"givens": 26}.')
  flags.DEFINE_multi_string("weights", [], "A model's Hub name (gpt2 ... gpt2-xl, owner/name"
                            "[@revision]): download its safetensors, config and tokenizer files.")
  flags.DEFINE_string("cache_dir", None, f"With --weights: where they go (a folder or gs://); "
                      f"default ${hub.ENV_STORE}, else the Hugging Face cache.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  if not (f.dataset or f.weights) or (f.dataset and not f.data_dir):
    raise app.UsageError("pass --dataset=NAME --data_dir=DIR, and/or --weights=NAME")
  if f.cache_dir:
    os.environ[hub.ENV_STORE] = f.cache_dir
  try:
    for name in f.weights:
      folder = hub.resolve(name, what="--weights", aliases=hub.GPT2_NAMES,
                           fallback="download the folder by hand and use its path")
      print(f"{name}: {folder}")
    if f.dataset:
      builder = prepare(f.dataset, f.data_dir, json.loads(f.builder_kwargs), f.manual_dir)
      splits = {name: split.num_examples for name, split in builder.info.splits.items()}
      print(f"{builder.info.full_name} in {builder.data_dir}: {splits}")
  except errors.DataError as e:   # bad input: one line, exit 2 (no traceback)
    sys.stderr.write(f"error: {e}\n")
    sys.exit(2)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
