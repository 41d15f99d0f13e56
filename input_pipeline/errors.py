"""The data layer's errors: a dataset that is not prepared, or a source file in the wrong format.

Each message is one line naming the file or dataset, what is wrong and the fix. The experiments'
entry point (experiments/common/errors.py) reports them as bad input (exit 2) without a traceback.

Synopsis:

  from input_pipeline import errors
  try:
    raise errors.NotPrepared("sudoku_generated", "/tmp/tfds", "run `python -m input_pipeline.prepare ...`")
  except errors.DataError as e:
    print(e)
"""

from __future__ import annotations


class DataError(ValueError):
  """A dataset cannot be read as asked; the message says why and how to fix it."""


class NotPrepared(DataError, FileNotFoundError):
  """A TFDS dataset is not prepared in its data_dir."""

  def __init__(self, name: str, data_dir: str, fix: str):
    self.name, self.data_dir = name, data_dir
    super().__init__(f"dataset {name} is not prepared in {data_dir}. Fix: {fix}")


class SourceMissing(DataError, FileNotFoundError):
  """A public source file (CSV, JSON, text) is not where the config says."""
