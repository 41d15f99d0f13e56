"""What every podlab TFDS builder shares (input_pipeline/builders/*.py derive from it).

Published sources. A builder of public data lists its files in `SOURCES`: `Url` (a fixed URL with
its size and sha256, as TFDS datasets carry their checksums: ConceptARC, pinned to a commit of the
TRM repository) or `HubFiles` (files of a Hugging Face dataset repository: the Hub's listing at
download time gives the commit the URLs are pinned to and each file's checksum, the sha256 of an
LFS file or the git blob id of a small one; HF_ENDPOINT and HF_HUB_OFFLINE apply).
`fetch_sources` returns the files of the manual dir when one is given (the offline fallback, used
as they are), else downloads them with TFDS's download manager (its progress bars; a file appears
under its name only once complete), checks each against its checksum (a file that differs is
deleted: one-line error) and returns their paths.

Synopsis:

  import tensorflow_datasets as tfds
  from input_pipeline.builders import base

  class MyData(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
    SOURCES = (base.HubFiles("owner/data", ("train.csv", "test.csv")),)
    ...
    def _split_generators(self, dl_manager):
      paths = base.fetch_sources(dl_manager, "my_data", self.SOURCES)   # {"train.csv": path, ...}
      folder = base.manual_dir(dl_manager)     # "" when none was given: the builder's own source
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from typing import Dict, Sequence, Tuple, Union

from etils import epath
import tensorflow_datasets as tfds

from input_pipeline import errors
from input_pipeline import hub


class LocalCodePath:
  """Builder mixin: `code_path` from the class's source file; `SOURCES` and `LOCAL_SOURCE`.

  TFDS 4.9.10's `DatasetBuilder.code_path` touches `importlib_resources` (a backport it only
  declares for Python < 3.9, absent from the pinned stack) and fails when preparing; the builders
  here need the path only to look for an (absent) checksums file beside the module.
  """

  SOURCES: Tuple["Source", ...] = ()
  """The published files the builder downloads without a manual dir (see the module doc)."""
  LOCAL_SOURCE = "generated here, no download"
  """Where the rest of its data comes from, for the dry runs' data line."""

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


# --------------------------------------------------------------------------------------------------
# Published sources.

@dataclasses.dataclass(frozen=True)
class Url:
  """One published file at a fixed URL, with its size and sha256 (checked after the download)."""
  file: str
  url: str
  sha256: str
  size: int

  @property
  def files(self) -> Tuple[str, ...]:
    return (self.file,)

  def where(self) -> str:
    return self.url.rsplit("/", 1)[0]


@dataclasses.dataclass(frozen=True)
class HubFiles:
  """Files of a Hugging Face dataset repository at a revision (checksums from the Hub's listing)."""
  repo_id: str
  files: Tuple[str, ...]
  revision: str = "main"

  def where(self) -> str:
    return hub.Ref(self.repo_id, self.revision, "dataset").page()


Source = Union[Url, HubFiles]


def source_files(sources: Sequence[Source]) -> Tuple[str, ...]:
  return tuple(f for s in sources for f in s.files)


def describe_sources(sources: Sequence[Source]) -> str:
  """'train.csv, test.csv of https://huggingface.co/datasets/...' for each source."""
  by_place: Dict[str, list] = {}
  for s in sources:
    by_place.setdefault(s.where(), []).extend(s.files)
  return "; ".join(f"{', '.join(files)} of {place}" for place, files in by_place.items())


def fetch_sources(dl_manager: tfds.download.DownloadManager, dataset: str,
                  sources: Sequence[Source]) -> Dict[str, str]:
  """{file: local path} of the sources: the manual dir's files when one is given, else downloaded
  and checked (see the module doc). Errors are one line (errors.SourceMissing)."""
  files = source_files(sources)
  howto = (f"download {describe_sources(sources)} by hand into a folder and pass it with "
           "--manual_dir (--config.dataset.manual_dir)")
  folder = manual_dir(dl_manager)
  if folder:
    missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
    if missing:
      raise errors.SourceMissing(f"{dataset}: {missing[0]}: not in {folder}. Fix: download "
                                 f"{describe_sources(sources)} into it, or drop --manual_dir (the "
                                 "builder then downloads them)")
    return {f: os.path.join(folder, f) for f in files}
  if hub.offline():                                    # the Hub's convention, for every source
    raise errors.SourceMissing(f"{dataset}: {describe_sources(sources)}: HF_HUB_OFFLINE=1 forbids "
                               f"downloading them. Fix: {howto}")
  expected: Dict[str, Tuple[str, str]] = {}            # file -> (url, sha256 or git blob id)
  for s in sources:
    if isinstance(s, Url):
      _reachable(s.url, dataset, howto)
      expected[s.file] = (s.url, s.sha256)
    else:
      _, records = hub.dataset_files(s.repo_id, s.files, revision=s.revision, what=dataset,
                                     fallback=howto)
      expected.update({f: (r.url, r.record) for f, r in records.items()})
  print(f"{dataset}: downloading {describe_sources(sources)} (checked against their checksums)",
        file=sys.stderr, flush=True)
  try:
    paths = dl_manager.download({f: url for f, (url, _) in expected.items()})
  except Exception as e:  # pylint: disable=broad-except  (requests', TFDS's and OS errors alike)
    text = " ".join(str(e).split())[:200]
    raise errors.SourceMissing(f"{dataset}: the download failed ({type(e).__name__}: {text}). "
                               f"Fix: run again with a network, or {howto}") from None
  out = {}
  for f, path in paths.items():
    path = os.fspath(path)
    bad = hub.mismatch(path, expected[f][1])
    if bad:
      for stale in (path, path + ".INFO"):
        if os.path.exists(stale):
          os.remove(stale)
      raise errors.SourceMissing(f"{dataset}: {f} from {expected[f][0]}: {bad}; deleted it. Fix: "
                                 f"run again (a corrupted transfer), or {howto}")
    out[f] = path
  return out


def _reachable(url: str, dataset: str, howto: str) -> None:
  """One quick HEAD request, so that no network is one line at once (TFDS's downloader retries a
  failed connection for minutes)."""
  import requests  # pylint: disable=g-import-not-at-top
  try:
    requests.head(url, timeout=30, allow_redirects=True).raise_for_status()
  except requests.RequestException as e:
    raise errors.SourceMissing(f"{dataset}: {url} cannot be reached ({type(e).__name__}). Fix: run "
                               f"again with a network, or {howto}") from None
