"""What every podlab TFDS builder shares (input_pipeline/builders/*.py derive from it).

Synopsis:

  import tensorflow_datasets as tfds
  from input_pipeline.builders import base

  class MyData(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
    ...
    def _split_generators(self, dl_manager):
      folder = base.manual_dir(dl_manager)     # "" when none was given: the builder's own source
"""

from __future__ import annotations

import inspect
import os

from etils import epath
import tensorflow_datasets as tfds


class LocalCodePath:
  """Builder mixin: `code_path` from the class's source file.

  TFDS 4.9.10's `DatasetBuilder.code_path` touches `importlib_resources` (a backport it only
  declares for Python < 3.9, absent from the pinned stack) and fails when preparing; the builders
  here need the path only to look for an (absent) checksums file beside the module.
  """

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))


def manual_dir(dl_manager: tfds.download.DownloadManager) -> str:
  """The manual dir of this preparation, or "" when there is none (TFDS's default
  `<data_dir>/downloads/manual` absent or empty), where `dl_manager.manual_dir` raises an
  AssertionError. `input_pipeline.prepare` has already refused a --manual_dir that does not exist."""
  try:
    return os.fspath(dl_manager.manual_dir)
  except AssertionError:
    return ""
