r"""Names that resolve: Hugging Face Hub ids -> local folders, downloaded once (per pod), verified.

The one place podlab turns a published name into files: nanoGPT's `init_from` and its sampler,
DiffuCoder's `checkpoint`, and the Hub-hosted sources of the TFDS builders.

**Names.** `owner/name` or `owner/name@revision` (a branch, a tag or a commit), or a caller's alias:
nanoGPT's `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl` are `openai-community/...`
(`GPT2_NAMES`). An existing path, a path starting with `/`, `.` or `~`, a URL (`gs://...`) or a
file name ending in `.pt`, `.bin`, ... is never a name: `resolve` returns it unchanged.

**Downloads** go through huggingface_hub (`snapshot_download`): its cache and conventions
(`HF_HOME` / `HF_HUB_CACHE`, `HF_ENDPOINT`, `HF_HUB_OFFLINE`, `HF_TOKEN`), its progress bars, its
retries (a dropped transfer resumes with a Range request), its temporary names (a file appears only
once complete). Only the top-level files a loader reads are fetched (`WEIGHT_FILES`: safetensors
shards, their index, config and tokenizer files), never a pickle. Each newly downloaded file is
checked against the Hub's record of it (the sha256 of an LFS file, the git blob id of a small one,
as the cache names it); a file that differs is deleted and the error says so.

**Once per pod.** In a multi-process run process 0 downloads while the others wait at a barrier
(`pod_barrier.once_per_pod`: JAX's distributed key-value store; a waiting process gives up only
when process 0 shows no progress, neither bytes arriving nor CPU time, for
`PODLAB_BARRIER_STALL_S`, 900 s) and then read the same files: from a shared cache,
`PODLAB_HUB_CACHE` (a folder every host sees, used as the Hugging Face cache; or `gs://.../hub`,
where process 0 publishes the snapshot and every host copies it to its local disk). Without
`PODLAB_HUB_CACHE` a run whose `TFDS_DATA_DIR` is `gs://B/P/tfds` (what launch/pod.sh sets) uses
`gs://B/P/hub`; otherwise each host uses its own Hugging Face cache, and the others download after
process 0 succeeded (its errors reach every host as one line).

**Errors** are one line (`errors.SourceMissing`, exit 2) naming the name, the Hub page and the
manual fallback: offline or unreachable with nothing cached, no such repo or revision, a gated
repo, no safetensors weights, a checksum mismatch.

Synopsis:

  from input_pipeline import hub
  hub.parse("gpt2-xl", hub.GPT2_NAMES)   # Ref(repo_id='openai-community/gpt2-xl', revision='main')
  folder = hub.resolve("gpt2", what="--init_from", aliases=hub.GPT2_NAMES,
                       fallback="pass the folder as --init_from=FOLDER")
  hub.resolve("/models/gpt2", what="--init_from", fallback="")   # a path: returned unchanged
  hub.cached("gpt2", hub.GPT2_NAMES)     # the folder if it is in the cache, else None (no network)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import uuid
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from input_pipeline import errors
from input_pipeline import pod_barrier

DEFAULT_ENDPOINT = "https://huggingface.co"
ENV_STORE = "PODLAB_HUB_CACHE"

GPT2_NAMES = {name: f"openai-community/{name}"
              for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
"""nanoGPT's init_from names (its `from_pretrained` sizes) -> their Hub ids."""

WEIGHT_FILES = ("*.safetensors", "*.json", "merges.txt")
"""What the loaders read: safetensors shards (+ model.safetensors.index.json), config.json,
tokenizer files (vocab.json + merges.txt, tokenizer.json, tokenizer_config.json,
added_tokens.json, special_tokens_map.json, generation_config.json). Top level only."""
_SUBFOLDERS = ("*/*",)
_NOT_NAMES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".json", ".safetensors", ".npz", ".txt")
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_REVISION = re.compile(r"^[\w.][\w./-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_COMPLETE = ".podlab-complete.json"


@dataclasses.dataclass(frozen=True)
class Ref:
  """A Hub repository at a revision, and the name it was given as."""
  repo_id: str
  revision: str = "main"
  repo_type: str = "model"
  name: str = ""

  def page(self) -> str:
    """The repository's page on the endpoint (what a user opens to download by hand)."""
    kind = "datasets/" if self.repo_type == "dataset" else ""
    tree = "" if self.revision == "main" else f"/tree/{self.revision}"
    return f"{endpoint()}/{kind}{self.repo_id}{tree}"

  def file_url(self, file: str, revision: Optional[str] = None) -> str:
    kind = "datasets/" if self.repo_type == "dataset" else ""
    return f"{endpoint()}/{kind}{self.repo_id}/resolve/{revision or self.revision}/{file}"

  def __str__(self) -> str:
    full = self.repo_id + ("" if self.revision == "main" else f"@{self.revision}")
    return full if self.name in ("", full) else f"{self.name} = {full}"


def parse(name: str, aliases: Optional[Mapping[str, str]] = None,
          repo_type: str = "model") -> Optional[Ref]:
  """The Hub reference `name` stands for, or None when it is a path (see the module doc)."""
  name = str(name or "")
  if (not name or "://" in name or name.startswith(("/", ".", "~")) or os.path.exists(name)):
    return None
  base, _, revision = name.partition("@")
  repo = (aliases or {}).get(base, base)
  if not _REPO.match(repo) or (revision and not _REVISION.match(revision)):
    return None
  if os.path.splitext(repo)[1].lower() in _NOT_NAMES:
    return None
  return Ref(repo, revision or "main", repo_type, name)


# --------------------------------------------------------------------------------------------------
# The environment, read at each call (tests and launchers set it after import).

def endpoint() -> str:
  return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
  return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
             for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache() -> str:
  """huggingface_hub's cache folder as the environment says now."""
  if os.environ.get("HF_HUB_CACHE"):
    return os.path.expanduser(os.environ["HF_HUB_CACHE"])
  home = os.environ.get("HF_HOME") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
  return os.path.join(os.path.expanduser(home), "hub")


def store() -> str:
  """The shared cache of this run: $PODLAB_HUB_CACHE, else `<parent>/hub` of a gs:// TFDS data
  dir ($TFDS_DATA_DIR, as launch/pod.sh sets it), else "" (the local Hugging Face cache)."""
  given = os.environ.get(ENV_STORE, "").strip()
  if given:
    return given.rstrip("/")
  data_dir = os.environ.get("TFDS_DATA_DIR", "").strip().rstrip("/")
  if data_dir.startswith("gs://") and "/" in data_dir[5:]:
    return data_dir.rsplit("/", 1)[0] + "/hub"
  return ""


def _remote(path: str) -> bool:
  return "://" in path


def _repo_folder(ref: Ref) -> str:
  return f"{ref.repo_type}s--{ref.repo_id.replace('/', '--')}"


def _local_copies() -> str:
  """Where a host keeps its copy of snapshots fetched from a gs:// store."""
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                      "podlab", "hub")


# --------------------------------------------------------------------------------------------------
# Checksums.

def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def git_blob_id(path: str) -> str:
  """The git blob id (sha1 of "blob <size>\\0" + content): the Hub's record of a non-LFS file."""
  h = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def mismatch(path: str, record: str) -> Optional[str]:
  """None when the file matches the Hub's record (64 hex digits: sha256; 40: git blob id), else
  'sha256 X, the record says Y'."""
  kind, got = ("sha256", sha256_of(path)) if len(record) == 64 else ("git blob id",
                                                                      git_blob_id(path))
  return None if got == record else f"{kind} {got[:16]}..., the Hub's record says {record[:16]}..."


def bytes_under(*folders: str) -> int:
  """Bytes of the files under local folders (a progress measure; remote ones count 0)."""
  total = 0
  for folder in folders:
    for root, _, files in os.walk(folder) if folder and not _remote(folder) else ():
      for f in files:
        try:
          total += os.path.getsize(os.path.join(root, f))
        except OSError:
          pass
  return total


# --------------------------------------------------------------------------------------------------
# Weights.

_RESOLVED: Dict[Tuple[Ref, str, str], str] = {}


def resolve(name: str, *, what: str, fallback: str,
            aliases: Optional[Mapping[str, str]] = None, repo_type: str = "model") -> str:
  """`name` when it is a path, else the local folder of its Hub files (downloaded when missing,
  once per pod; see the module doc). `what` names the flag ("--config.init_from"), `fallback` says
  what to pass instead when the Hub cannot be used ("pass the folder as --init_from=FOLDER")."""
  ref = parse(name, aliases, repo_type)
  if ref is None:
    return name
  key = (ref, hf_cache(), store())
  if key not in _RESOLVED:
    shared = store()
    cache = shared if shared and not _remote(shared) else hf_cache()
    _RESOLVED[key] = pod_barrier.once_per_pod(
        f"podlab/hub/{ref.repo_type}/{ref.repo_id}@{ref.revision}",
        lambda: _fetch(ref, what, fallback, cache, shared, lead=True),
        lambda _: _fetch(ref, what, fallback, cache, shared, lead=False),
        progress=lambda: bytes_under(os.path.join(cache, _repo_folder(ref), "blobs")),
        what=f"{what}={name}")
  return _RESOLVED[key]


def cached(name: str, aliases: Optional[Mapping[str, str]] = None,
           repo_type: str = "model") -> Optional[str]:
  """The local folder of a name already downloaded (this process's resolutions, the cache, a local
  copy of the shared store), or None; no network. A path is returned unchanged."""
  ref = parse(name, aliases, repo_type)
  if ref is None:
    return name
  key = (ref, hf_cache(), store())
  if key in _RESOLVED:
    return _RESOLVED[key]
  shared = store()
  try:
    return _snapshot(ref, shared if shared and not _remote(shared) else hf_cache(), local=True)
  except Exception:  # pylint: disable=broad-except  (not in the cache, in whatever way)
    return _local_copy(ref) if _remote(shared) else None


def describe(name: str, aliases: Optional[Mapping[str, str]] = None) -> str:
  """One line for a dry run: where `name`'s files come from, without network."""
  ref = parse(name, aliases)
  if ref is None:
    return name
  folder = cached(name, aliases)
  if folder:
    return f"{ref}: in the cache ({folder})"
  where = store() or hf_cache()
  return (f"{ref} ({ref.page()}): not in the cache; downloaded into {where} on first use "
          "(safetensors, config and tokenizer files)")


def _fetch(ref: Ref, what: str, fallback: str, cache: str, shared: str, *, lead: bool) -> str:
  if _remote(shared):
    copy = _fetch_published(ref, shared)
    if copy:
      return copy
  folder = None
  if not lead:                       # process 0 has it: in a shared cache, or here after all
    try:
      folder = _snapshot(ref, cache, local=True)
    except Exception:  # pylint: disable=broad-except
      folder = None
  if folder is None:
    folder = _download(ref, what, fallback, cache)
  if lead and _remote(shared):
    _publish(folder, ref, shared)
  return folder


def _snapshot(ref: Ref, cache: str, *, local: bool) -> str:
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  return huggingface_hub.snapshot_download(
      ref.repo_id, repo_type=ref.repo_type, revision=ref.revision, cache_dir=cache,
      endpoint=endpoint(), allow_patterns=list(WEIGHT_FILES), ignore_patterns=list(_SUBFOLDERS),
      local_files_only=local)


def _blobs(ref: Ref, cache: str) -> set:
  folder = os.path.join(cache, _repo_folder(ref), "blobs")
  return {n for n in os.listdir(folder) if not n.endswith(".incomplete")} if os.path.isdir(
      folder) else set()


def _download(ref: Ref, what: str, fallback: str, cache: str) -> str:
  from huggingface_hub import errors as hf_errors  # pylint: disable=g-import-not-at-top
  head = f"{what}={ref.name}: {ref} ({ref.page()})"
  manual = f"download its safetensors, config.json and tokenizer files from that page and {fallback}"
  before = _blobs(ref, cache)
  if not offline():
    print(f"{ref}: fetching the safetensors, config and tokenizer files from {endpoint()} into "
          f"{cache} (only what is missing)", file=sys.stderr, flush=True)
  try:
    folder = _snapshot(ref, cache, local=offline())
  except hf_errors.RevisionNotFoundError:
    raise errors.SourceMissing(f"{head}: the repository has no revision {ref.revision!r}. Fix: use "
                               "a branch, tag or commit of it, or drop @revision") from None
  except hf_errors.GatedRepoError:
    raise errors.SourceMissing(f"{head}: the repository is gated. Fix: accept its terms on that "
                               f"page and set HF_TOKEN, or {manual}") from None
  except hf_errors.RepositoryNotFoundError:
    raise errors.SourceMissing(f"{head}: no such repository on the Hub (or a private one). Fix: "
                               f"check the name (owner/name[@revision]), or {fallback}") from None
  except hf_errors.LocalEntryNotFoundError as e:
    why = ("HF_HUB_OFFLINE=1 forbids downloading it" if offline() else
           f"the Hub cannot be reached ({_first_line(e.__cause__ or e)})")
    raise errors.SourceMissing(f"{head}: not in the Hugging Face cache ({cache}) and {why}. Fix: "
                               f"run once with a network, or {manual}") from None
  except OSError as e:
    raise errors.SourceMissing(f"{head}: the download failed ({_first_line(e)}); nothing "
                               f"incomplete was kept. Fix: run again, or {manual}") from None
  except hf_errors.HfHubHTTPError as e:
    raise errors.SourceMissing(f"{head}: the Hub answered {_first_line(e)}. Fix: retry later, or "
                               f"{manual}") from None
  _verify(folder, _blobs(ref, cache) - before, head)
  if ref.repo_type == "model" and not any(n.endswith(".safetensors") for n in os.listdir(folder)):
    raise errors.SourceMissing(
        f"{head}: the repository has no *.safetensors weights (podlab never reads pickles such as "
        f"pytorch_model.bin). Fix: use a repository (or revision) with safetensors, or {fallback}")
  return folder


def _first_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  return f"{type(e).__name__}: {text[:160]}"


def _verify(folder: str, new: Iterable[str], head: str) -> None:
  """Each file of `folder` whose blob is `new` matches the blob's name (the Hub's record)."""
  new = set(new)
  for name in sorted(os.listdir(folder)):
    link = os.path.join(folder, name)
    blob = os.path.realpath(link)
    record = os.path.basename(blob)
    if record not in new or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", record):
      continue
    bad = mismatch(blob, record)
    if bad:
      for path in (blob, link):
        if os.path.lexists(path):
          os.remove(path)
      raise errors.SourceMissing(f"{head}: {name}: {bad} (a corrupted transfer); deleted it. Fix: "
                                 "run again")


# --------------------------------------------------------------------------------------------------
# A gs:// store: process 0 publishes a snapshot, every host copies it to its local disk.

def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def _publish(folder: str, ref: Ref, shared: str) -> None:
  """Copies the snapshot `folder` (named by its commit) to `<shared>/<repo>/snapshots/<commit>/`,
  each file under a temporary name first, the completion record last, then the ref."""
  gfile = _gfile()
  commit = os.path.basename(os.path.normpath(folder))
  root = f"{shared}/{_repo_folder(ref)}"
  dst = f"{root}/snapshots/{commit}"
  gfile.makedirs(dst)
  files = {}
  for name in sorted(os.listdir(folder)):
    tmp = f"{dst}/{name}.tmp-{uuid.uuid4().hex[:8]}"
    gfile.copy(os.path.join(folder, name), tmp, overwrite=True)
    gfile.rename(tmp, f"{dst}/{name}", overwrite=True)
    files[name] = os.path.getsize(os.path.join(folder, name))
  _write_text(f"{dst}/{_COMPLETE}", json.dumps({"files": files, "repo": ref.repo_id}))
  if ref.revision != commit:
    gfile.makedirs(f"{root}/refs")
    _write_text(f"{root}/refs/{ref.revision.replace('/', '--')}", commit)
  print(f"{ref}: published {len(files)} files to {dst}", file=sys.stderr, flush=True)


def _write_text(path: str, text: str) -> None:
  gfile = _gfile()
  tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
  with gfile.GFile(tmp, "w") as f:
    f.write(text)
  gfile.rename(tmp, path, overwrite=True)


def _read_text(path: str) -> Optional[str]:
  gfile = _gfile()
  if not gfile.exists(path):
    return None
  with gfile.GFile(path, "r") as f:
    return f.read()


def _published_commit(ref: Ref, shared: str) -> Optional[str]:
  if _COMMIT.match(ref.revision):
    return ref.revision
  text = _read_text(f"{shared}/{_repo_folder(ref)}/refs/{ref.revision.replace('/', '--')}")
  return text.strip() if text else None


def _local_copy(ref: Ref, commit: Optional[str] = None) -> Optional[str]:
  """This host's complete copy of a published snapshot (the ref's newest when `commit` is None)."""
  root = os.path.join(_local_copies(), _repo_folder(ref))
  if commit is None:
    if _COMMIT.match(ref.revision):
      commit = ref.revision
    else:
      ref_file = os.path.join(root, "refs", ref.revision.replace("/", "--"))
      if not os.path.isfile(ref_file):
        return None
      with open(ref_file) as f:
        commit = f.read().strip()
  folder = os.path.join(root, commit)
  return folder if os.path.isfile(os.path.join(folder, _COMPLETE)) else None


def _fetch_published(ref: Ref, shared: str) -> Optional[str]:
  """This host's copy of the snapshot published in `shared` (copied when missing), or None when
  nothing is published for the ref."""
  commit = _published_commit(ref, shared)
  if commit is None:
    return None
  src = f"{shared}/{_repo_folder(ref)}/snapshots/{commit}"
  record = _read_text(f"{src}/{_COMPLETE}")
  if record is None:
    return None
  root = os.path.join(_local_copies(), _repo_folder(ref))
  folder = _local_copy(ref, commit)
  if folder is None:
    gfile = _gfile()
    folder = os.path.join(root, commit)
    os.makedirs(folder, exist_ok=True)
    files = json.loads(record)["files"]
    print(f"{ref}: copying {len(files)} files from {src}", file=sys.stderr, flush=True)
    for name, size in sorted(files.items()):
      dst = os.path.join(folder, name)
      if os.path.isfile(dst) and os.path.getsize(dst) == size:
        continue
      tmp = f"{dst}.tmp-{uuid.uuid4().hex[:8]}"
      gfile.copy(f"{src}/{name}", tmp, overwrite=True)
      os.replace(tmp, dst)
    with open(os.path.join(folder, _COMPLETE), "w") as f:
      f.write(record)
  os.makedirs(os.path.join(root, "refs"), exist_ok=True)
  if ref.revision != commit:
    tmp = os.path.join(root, "refs", f".{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
      f.write(commit)
    os.replace(tmp, os.path.join(root, "refs", ref.revision.replace("/", "--")))
  return folder


# --------------------------------------------------------------------------------------------------
# Dataset files (the TFDS builders download them themselves; see input_pipeline/builders/base.py).

@dataclasses.dataclass(frozen=True)
class FileRecord:
  """A file of a Hub repository at a commit: its URL there and the Hub's record of its content."""
  url: str
  size: int
  record: str          # sha256 (LFS) or git blob id


def dataset_files(repo_id: str, files: Sequence[str], *, what: str, fallback: str,
                  revision: str = "main") -> Tuple[str, Dict[str, FileRecord]]:
  """(commit, {file: FileRecord}) of files of a Hub dataset: the revision's commit and the Hub's
  listing of it (two requests; the URLs are pinned to the commit)."""
  from huggingface_hub import HfApi  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors as hf_errors  # pylint: disable=g-import-not-at-top
  ref = Ref(repo_id, revision, "dataset", repo_id)
  head = f"{what}: {', '.join(files)} of {ref.page()}"
  api = HfApi(endpoint=endpoint())
  try:
    commit = api.dataset_info(repo_id, revision=revision).sha
    listing = {f.path: f for f in api.list_repo_tree(repo_id, repo_type="dataset", revision=commit)
               if hasattr(f, "blob_id")}
  except (hf_errors.HfHubHTTPError, OSError) as e:
    raise errors.SourceMissing(f"{head}: the Hub cannot be reached ({_first_line(e)}). Fix: run "
                               f"again with a network, or {fallback}") from None
  out = {}
  for name in files:
    if name not in listing:
      raise errors.SourceMissing(f"{head}: the dataset has no {name} at {commit[:12]}. Fix: "
                                 f"{fallback}")
    f = listing[name]
    out[name] = FileRecord(ref.file_url(name, commit), int(f.size),
                           f.lfs.sha256 if f.lfs is not None else f.blob_id)
  return commit, out
