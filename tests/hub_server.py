"""A loopback stand-in for the Hugging Face Hub (and a raw file host) for the tests: 127.0.0.1 only.

It speaks the parts of the Hub's HTTP API that huggingface_hub 2.4.0's `snapshot_download`,
`hf_hub_download`, `HfApi.model_info/dataset_info` and `list_repo_tree` call (read in the installed
client):

  GET  /api/{models|datasets}/{owner}/{name}/revision/{rev}   {"id", "sha", "siblings"}
  GET  /api/{models|datasets}/{owner}/{name}/tree/{rev}       [{"type", "path", "size", "oid",
                                                                "lfs": {"oid", "size", "pointerSize"}}]
  HEAD|GET /{owner}/{name}/resolve/{rev}/{file}                X-Repo-Commit, ETag (the git blob id,
  HEAD|GET /datasets/{owner}/{name}/resolve/{rev}/{file}       or for LFS files X-Linked-Etag: the
                                                                sha256, X-Linked-Size), Content-Length,
                                                                Range -> 206 + Content-Range
  GET  /raw/{path}                                             plain files (a GitHub-raw stand-in)

Unknown repositories, revisions and files answer 404 with the Hub's X-Error-Code (RepoNotFound,
RevisionNotFound, EntryNotFound). Safetensors and CSV files are served as LFS files, others as git
files. Faults for the tests: `drop_after[(repo_id, file)] = n` sends only n bytes of the first GET
of that file and closes the connection (the client resumes with a Range request); `corrupt` serves
a file with one byte changed (the same size, so only its checksum tells).

  with HubServer() as hub:
    hub.add("openai-community/gpt2", {"config.json": b"{}", ...})     # branch main
    hub.add("openai-community/gpt2", {...}, revision="v1")             # another commit, tag v1
    os.environ["HF_ENDPOINT"] = hub.url
    ...
    hub.gets("model.safetensors")            # GET requests of that file so far

The server runs on daemon threads and stops when the `with` block ends.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import urllib.parse
from typing import Dict, List, Optional, Tuple

LFS_SUFFIXES = (".safetensors", ".csv")


def commit_of(repo_id: str, revision: str) -> str:
  return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


def git_blob_id(data: bytes) -> str:
  return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def folder_files(path: str) -> Dict[str, bytes]:
  """{name: content} of the files at the top of a folder."""
  out = {}
  for name in sorted(os.listdir(path)):
    full = os.path.join(path, name)
    if os.path.isfile(full):
      with open(full, "rb") as f:
        out[name] = f.read()
  return out


class HubServer:
  """See the module doc."""

  def __init__(self):
    self.repos: Dict[Tuple[str, str], Dict[str, object]] = {}
    self.raw: Dict[str, bytes] = {}
    self.requests: List[Tuple[str, str, Optional[str]]] = []
    self.drop_after: Dict[Tuple[str, str], int] = {}
    self.corrupt: set = set()
    self._lock = threading.Lock()
    self._server = None
    self._thread = None

  # -- content ------------------------------------------------------------------------------------
  def add(self, repo_id: str, files: Dict[str, bytes], *, revision: str = "main",
          repo_type: str = "model") -> str:
    """Adds a commit with `files` to the repository; `revision` (a branch or tag) points at it.
    Returns the commit id."""
    repo = self.repos.setdefault((repo_type, repo_id), {"commits": {}, "refs": {}})
    commit = commit_of(repo_id, revision)
    repo["commits"][commit] = dict(files)
    repo["refs"][revision] = commit
    return commit

  # -- life ---------------------------------------------------------------------------------------
  def __enter__(self) -> "HubServer":
    hub = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):  # quiet
        pass

      def do_HEAD(self):
        hub._handle(self, head=True)

      def do_GET(self):
        hub._handle(self, head=False)

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._server.daemon_threads = True
    self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._server.shutdown()
    self._server.server_close()
    self._thread.join(timeout=10)

  @property
  def url(self) -> str:
    host, port = self._server.server_address[:2]
    return f"http://{host}:{port}"

  def gets(self, file: str, repo_id: str = "") -> int:
    """GET requests of `file` (of `repo_id`, any when ""), not counting HEAD."""
    with self._lock:
      return sum(1 for method, path, _ in self.requests if method == "GET" and "/resolve/" in path
                 and path.endswith("/" + file) and repo_id in path)

  def ranges(self, file: str) -> List[Optional[str]]:
    with self._lock:
      return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + file)]

  def api_calls(self) -> int:
    with self._lock:
      return sum(1 for _, path, _ in self.requests if path.startswith("/api/"))

  # -- protocol -----------------------------------------------------------------------------------
  def _send(self, h, status: int, body: bytes = b"", headers: Optional[Dict[str, str]] = None,
            head: bool = False, limit: Optional[int] = None) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
      h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if head:
      return
    if limit is not None:
      h.wfile.write(body[:limit])
      h.wfile.flush()
      h.close_connection = True
      return
    h.wfile.write(body)

  def _error(self, h, code: str, commit: Optional[str] = None, head: bool = False) -> None:
    headers = {"X-Error-Code": code, "X-Error-Message": code, "Content-Type": "application/json"}
    if commit:
      headers["X-Repo-Commit"] = commit
    self._send(h, 404, b'{"error": "%s"}' % code.encode(), headers, head=head)

  def _repo(self, kind: str, owner: str, name: str):
    return self.repos.get(("dataset" if kind == "datasets" else "model", f"{owner}/{name}"))

  @staticmethod
  def _commit(repo, revision: str) -> Optional[str]:
    revision = urllib.parse.unquote(revision)
    if revision in repo["commits"]:
      return revision
    return repo["refs"].get(revision)

  def _handle(self, h, head: bool) -> None:
    parsed = urllib.parse.urlsplit(h.path)
    path = parsed.path
    with self._lock:
      self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts[:1] == ["raw"]:
      data = self.raw.get("/".join(parts[1:]))
      if data is None:
        return self._send(h, 404, b"not found", head=head)
      return self._send(h, 200, data, {"Content-Type": "application/octet-stream"}, head=head)
    if parts[:1] == ["api"] and len(parts) >= 6 and parts[1] in ("models", "datasets"):
      repo = self._repo(parts[1], parts[2], parts[3])
      if repo is None:
        return self._error(h, "RepoNotFound", head=head)
      commit = self._commit(repo, "/".join(parts[5:]) if parts[4] == "revision" else parts[5])
      if commit is None:
        return self._error(h, "RevisionNotFound", head=head)
      files = repo["commits"][commit]
      if parts[4] == "revision":
        body = {"id": f"{parts[2]}/{parts[3]}", "sha": commit, "private": False,
                "siblings": [{"rfilename": f} for f in sorted(files)]}
      elif parts[4] == "tree":
        body = [self._entry(f, data) for f, data in sorted(files.items())]
      else:
        return self._send(h, 404, b"unknown api", head=head)
      return self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"},
                        head=head)
    kind = "models"
    if parts[:1] == ["datasets"]:
      kind, parts = "datasets", parts[1:]
    if len(parts) >= 5 and parts[2] == "resolve":
      return self._resolve(h, kind, parts, head)
    return self._send(h, 404, b"unknown route", head=head)

  @staticmethod
  def _entry(file: str, data: bytes) -> dict:
    entry = {"type": "file", "path": file, "size": len(data), "oid": git_blob_id(data)}
    if file.endswith(LFS_SUFFIXES):
      entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                      "pointerSize": 134}
    return entry

  def _resolve(self, h, kind: str, parts: List[str], head: bool) -> None:
    repo = self._repo(kind, parts[0], parts[1])
    if repo is None:
      return self._error(h, "RepoNotFound", head=head)
    commit = self._commit(repo, parts[3])
    if commit is None:
      return self._error(h, "RevisionNotFound", head=head)
    file = "/".join(parts[4:])
    repo_id = f"{parts[0]}/{parts[1]}"
    data = repo["commits"][commit].get(file)
    if data is None:
      return self._error(h, "EntryNotFound", commit, head=head)
    headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes",
               "Content-Type": "application/octet-stream"}
    if file.endswith(LFS_SUFFIXES):
      sha = hashlib.sha256(data).hexdigest()
      headers.update({"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"',
                      "X-Linked-Size": str(len(data))})
    else:
      headers["ETag"] = f'"{git_blob_id(data)}"'
    if (repo_id, file) in self.corrupt:
      data = data[:-1] + bytes([data[-1] ^ 0xFF])
    start, status = 0, 200
    rng = h.headers.get("Range")
    if rng and rng.startswith("bytes=") and not head:
      start = int(rng[6:].split("-")[0])
      status = 206
      headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
    limit = None
    if not head and (repo_id, file) in self.drop_after:
      limit = self.drop_after.pop((repo_id, file))
    self._send(h, status, data[start:], headers, head=head, limit=limit)


HUB_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN", "HF_ENDPOINT",
           "HF_HOME", "PODLAB_HUB_CACHE", "TFDS_DATA_DIR", "XDG_CACHE_HOME")


def environment(server: "HubServer", home: str, **extra: str) -> Dict[str, str]:
  """The environment variables that point a process at `server`, with its own Hugging Face home
  (and ~/.cache stand-in) under `home`; `extra` are added."""
  env = {"HF_ENDPOINT": server.url, "HF_HOME": os.path.join(home, "hf"),
         "XDG_CACHE_HOME": os.path.join(home, "xdg"), "HF_HUB_DISABLE_TELEMETRY": "1"}
  env.update(extra)
  return env


def subprocess_env(server: "HubServer", home: str, **extra: str) -> Dict[str, str]:
  """os.environ without any Hub setting of the caller's, plus `environment(...)`."""
  env = {k: v for k, v in os.environ.items() if k not in HUB_ENV}
  env.update(environment(server, home, **extra))
  env.setdefault("JAX_PLATFORMS", "cpu")
  return env


def use(monkeypatch, server: "HubServer", home: str, **extra: str) -> None:
  """Points this process's resolver (input_pipeline/hub.py) at `server` with a fresh home, and
  huggingface_hub's import-time endpoint and URL template too: no request leaves the machine."""
  import huggingface_hub.constants  # pylint: disable=g-import-not-at-top
  from input_pipeline import hub  # pylint: disable=g-import-not-at-top
  for name in HUB_ENV:
    monkeypatch.delenv(name, raising=False)
  for name, value in environment(server, home, **extra).items():
    monkeypatch.setenv(name, value)
  constants = huggingface_hub.constants                  # read at import: follow the server too
  monkeypatch.setattr(constants, "ENDPOINT", server.url)
  monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                      server.url + "/{repo_id}/resolve/{revision}/{filename}")
  monkeypatch.setattr(hub, "_RESOLVED", {})
