"""input_pipeline/hub.py, the one resolver of published names, against a loopback Hub
(tests/hub_server.py; HF_ENDPOINT points at 127.0.0.1, HF_HOME at a temporary folder): a name and
an alias, a revision, a cache hit (no second download; none at all for a commit or offline), an
interrupted download resumed, a checksum mismatch refused, offline with and without a cache, the
one-line errors, a gs://-like shared store (file://), the barrier's progress rule, and two real
processes of which only process 0 downloads."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from experiments.nanogpt import hf_gpt2
from input_pipeline import errors
from input_pipeline import hub
from input_pipeline import pod_barrier
import hub_server

REPO = pathlib.Path(__file__).resolve().parents[1]
GPT2 = "openai-community/gpt2"


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
  folder = tmp_path_factory.mktemp("gpt2") / "tiny"
  hf_gpt2.make_random(str(folder), "tiny", seed=3)
  return hub_server.folder_files(str(folder))


@pytest.fixture
def server(gpt2_files, monkeypatch, tmp_path):
  with hub_server.HubServer() as s:
    # a pickle and a subfolder beside the loader's files: never fetched
    s.add(GPT2, dict(gpt2_files, **{"pytorch_model.bin": b"\x80pickle", "onnx/config.json": b"{}"}))
    hub_server.use(monkeypatch, s, str(tmp_path))
    yield s


def _resolve(name, **kw):
  return hub.resolve(name, what="--init_from", fallback="pass the folder as --init_from=FOLDER",
                     aliases=hub.GPT2_NAMES, **kw)


def test_names_and_paths(tmp_path, monkeypatch):
  assert hub.parse("gpt2-xl", hub.GPT2_NAMES) == hub.Ref(f"{GPT2}-xl", "main", "model", "gpt2-xl")
  assert hub.parse("apple/DiffuCoder-7B-Instruct@v1.0").revision == "v1.0"
  assert str(hub.parse("gpt2@v1", hub.GPT2_NAMES)) == f"gpt2@v1 = {GPT2}@v1"
  for path in ("/models/gpt2", "./gpt2", "~/gpt2", "gs://b/gpt2", "out/ckpt.pt", "", "gpt2",
               "a/b/c", str(tmp_path)):
    assert hub.parse(path) is None, path                 # "gpt2" is a name only as an alias
  (tmp_path / "owner").mkdir()
  (tmp_path / "owner" / "name").mkdir()
  monkeypatch.chdir(tmp_path)
  assert hub.parse("owner/name") is None                 # an existing folder wins
  assert hub.resolve("owner/name", what="x", fallback="y") == "owner/name"


def test_a_name_fetches_the_loaders_files_once(server, gpt2_files, monkeypatch):
  folder = _resolve("gpt2")
  assert sorted(os.listdir(folder)) == sorted(gpt2_files)   # no pickle, no subfolder
  for name, data in gpt2_files.items():
    assert pathlib.Path(folder, name).read_bytes() == data
  assert server.gets("pytorch_model.bin") == 0 and server.gets("model.safetensors") == 1
  config, _ = hf_gpt2.load_pretrained(folder)
  assert (config.n_layer, config.n_embd, config.vocab_size) == (2, 64, 257)
  # A new process (no memo): the revision is looked up once, nothing is downloaded again.
  hub._RESOLVED.clear()
  before = len(server.requests)
  assert _resolve("gpt2") == folder == hub.cached("gpt2", hub.GPT2_NAMES)
  assert [p for _, p, _ in server.requests[before:]] == [f"/api/models/{GPT2}/revision/main"]
  # Offline (HF_HUB_OFFLINE=1): the cache alone, no request at all.
  hub._RESOLVED.clear()
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  before = len(server.requests)
  assert _resolve(GPT2) == folder and len(server.requests) == before


def test_a_revision_and_a_commit(server, gpt2_files):
  config = json.loads(gpt2_files["config.json"])
  v1 = server.add(GPT2, dict(gpt2_files, **{"config.json": json.dumps(
      dict(config, n_positions=64, n_ctx=64)).encode()}), revision="v1")
  folder = _resolve("gpt2@v1")
  assert os.path.basename(folder) == v1 != os.path.basename(_resolve("gpt2"))
  assert hf_gpt2.read_hf_config(folder)["n_positions"] == 64
  hub._RESOLVED.clear()
  before = len(server.requests)
  assert _resolve(f"gpt2@{v1}") == folder                # a commit in the cache: no request
  assert len(server.requests) == before


def test_an_interrupted_download_resumes_with_a_range_request(server, gpt2_files):
  big = np.random.default_rng(0).bytes(12 << 20)          # over one 10 MiB read of the client
  server.add("someone/big", dict(gpt2_files, **{"model-00002-of-00002.safetensors": big}))
  server.drop_after[("someone/big", "model-00002-of-00002.safetensors")] = 11 << 20
  folder = _resolve("someone/big")
  assert pathlib.Path(folder, "model-00002-of-00002.safetensors").read_bytes() == big
  assert server.ranges("model-00002-of-00002.safetensors") == [None, f"bytes={10 << 20}-"]


def test_a_checksum_mismatch_is_refused_and_nothing_is_kept(server, tmp_path):
  server.corrupt.add((GPT2, "model.safetensors"))
  with pytest.raises(errors.SourceMissing, match=(
      r"^--init_from=gpt2: gpt2 = openai-community/gpt2 \(http://127.0.0.1:\d+/openai-community/"
      r"gpt2\): model.safetensors: sha256 [0-9a-f]{16}\.\.\., the Hub's record says [0-9a-f]{16}"
      r"\.\.\. \(a corrupted transfer\); deleted it. Fix: run again$")):
    _resolve("gpt2")
  blobs = tmp_path / "hf" / "hub" / "models--openai-community--gpt2" / "blobs"
  assert len(os.listdir(blobs)) == 3                      # config, vocab, merges: verified, kept
  assert not any(p.name == "model.safetensors" for p in blobs.parent.rglob("*"))
  server.corrupt.clear()
  assert "model.safetensors" in os.listdir(_resolve("gpt2"))   # the next run downloads it again


def test_offline_and_unreachable_without_a_cache_are_one_line(server, monkeypatch, tmp_path):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(errors.SourceMissing) as e:
    _resolve("gpt2-xl")
  assert str(e.value) == (
      f"--init_from=gpt2-xl: gpt2-xl = {GPT2}-xl ({server.url}/{GPT2}-xl): not in the Hugging Face "
      f"cache ({tmp_path}/hf/hub) and HF_HUB_OFFLINE=1 forbids downloading it. Fix: run once with "
      "a network, or download its safetensors, config.json and tokenizer files from that page and "
      "pass the folder as --init_from=FOLDER")
  monkeypatch.delenv("HF_HUB_OFFLINE")
  with socket.socket() as s:                             # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{s.getsockname()[1]}"
  monkeypatch.setenv("HF_ENDPOINT", closed)
  with pytest.raises(errors.SourceMissing, match=r"and the Hub cannot be reached \(ConnectError"):
    _resolve("gpt2")
  assert not (tmp_path / "hf" / "hub" / "models--openai-community--gpt2" / "snapshots").exists()
  assert server.gets("config.json") == 0


@pytest.mark.parametrize("name, message", [
    ("nobody/missing", "no such repository on the Hub (or a private one). Fix: check the name"),
    ("gpt2@nope", "the repository has no revision 'nope'. Fix: use a branch, tag or commit"),
    ("someone/pickles", "has no *.safetensors weights (podlab never reads pickles such as "
     "pytorch_model.bin)"),
])
def test_bad_names_are_one_line(server, name, message):
  server.add("someone/pickles", {"config.json": b"{}", "pytorch_model.bin": b"\x80"})
  with pytest.raises(errors.SourceMissing, match=r"^--init_from=" + name.replace("*", r"\*")) as e:
    _resolve(name)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_a_shared_store_is_published_once_and_copied_by_each_host(server, gpt2_files, monkeypatch,
                                                                  tmp_path):
  store = f"file://{tmp_path}/bucket/podlab/hub"        # gs:// in a pod; gfile either way
  monkeypatch.setenv("PODLAB_HUB_CACHE", store)
  folder = _resolve("gpt2")                              # process 0: download, then publish
  published = tmp_path / "bucket/podlab/hub/models--openai-community--gpt2"
  commit = (published / "refs" / "main").read_text()
  assert sorted(os.listdir(published / "snapshots" / commit)) == sorted(
      list(gpt2_files) + [".podlab-complete.json"])
  # Another host: its own disk (HF home, ~/.cache), nothing downloaded, the store's files.
  hub_server.use(monkeypatch, server, str(tmp_path / "host1"), PODLAB_HUB_CACHE=store)
  before = len(server.requests)
  copy = _resolve("gpt2")
  assert copy.startswith(str(tmp_path / "host1" / "xdg")) and copy != folder
  assert server.requests[before:] == []                  # no request to the Hub at all
  for name, data in gpt2_files.items():
    assert pathlib.Path(copy, name).read_bytes() == data
  hub._RESOLVED.clear()
  assert hub.cached("gpt2", hub.GPT2_NAMES) == copy       # planning sees the local copy
  # pod.sh's runs: TFDS_DATA_DIR=gs://B/podlab/tfds puts the store beside it.
  monkeypatch.delenv("PODLAB_HUB_CACHE")
  monkeypatch.setenv("TFDS_DATA_DIR", "gs://b/podlab/tfds")
  assert hub.store() == "gs://b/podlab/hub"


class FakeClient:
  """JAX's distributed key-value store as the waiting process sees it, with a simulated clock:
  a blocking read that times out advances the clock by its timeout."""

  def __init__(self, progress_at):
    self.now, self.values, self.progress_at = 0.0, {}, progress_at

  def blocking_key_value_get(self, key, timeout_ms):
    if key in self.values:
      return self.values[key]
    self.now += timeout_ms / 1000
    value = self.progress_at(self.now)
    if value is None:
      raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out")
    if isinstance(value, dict):
      self.values["k/done"] = json.dumps(value)
    else:
      self.values["k/progress"] = value
    raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out")

  def key_value_try_get(self, key):
    if key not in self.values:
      raise RuntimeError("NOT_FOUND")
    return self.values[key]


def test_a_waiting_process_fails_only_when_process_0_stops_progressing():
  def follow(progress_at):
    client = FakeClient(progress_at)
    return pod_barrier.follow_barrier(client, "k", "--init_from=gpt2", stall_s=30, poll_s=2,
                                      clock=lambda: client.now), client.now

  # Bytes keep arriving for 100 simulated seconds (more than 3 stall periods), then the result.
  result, _ = follow(lambda t: {"ok": "/f"} if t >= 100 else f"{int(t) * 1000} 0")
  assert result == "/f"
  # Process 0's error reaches the waiting process as the same line.
  with pytest.raises(errors.SourceMissing, match=r"^--init_from=x: offline$"):
    follow(lambda t: {"error": "--init_from=x: offline"} if t >= 10 else None)
  # Nothing after 40 s: the wait ends 30 s of unchanged progress later.
  with pytest.raises(errors.SourceMissing, match=(
      r"^--init_from=gpt2: process 0 showed no progress for 30 s \(40,000 bytes so far, 10 CPU-s\)\."
      r" Fix: see process 0's log; raise PODLAB_BARRIER_STALL_S for a slow link$")):
    follow(lambda t: f"{int(min(t, 40)) * 1000} 10")
  # CPU time counts as progress too (preparing a dataset writes in bursts).
  result, _ = follow(lambda t: {"ok": "/g"} if t >= 100 else f"0 {int(t) // 10 * 10}")
  assert result == "/g"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_only_process_0_downloads(server, gpt2_files, tmp_path):
  """Two JAX processes on this machine, a shared PODLAB_HUB_CACHE folder: process 0 downloads each
  file once, process 1 waits and reads the same files; a missing name is the same one-line error
  in both."""
  port = _free_port()
  env = hub_server.subprocess_env(server, str(tmp_path), PODLAB_HUB_CACHE=str(tmp_path / "shared"),
                                  PODLAB_COORDINATOR=f"localhost:{port}", PODLAB_NUM_PROCESSES="2",
                                  XLA_FLAGS="--xla_force_host_platform_device_count=1",
                                  PYTHONPATH=str(REPO))
  procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "_mp_hub_worker.py")],
                            env=dict(env, PODLAB_PROCESS_ID=str(i)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=240))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  results = []
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
    results.append(json.loads(next(l for l in out.splitlines() if l.startswith("HUB "))[4:]))
  assert [r["process"] for r in results] == [0, 1]
  assert results[0]["folder"] == results[1]["folder"]
  assert results[0]["folder"].startswith(str(tmp_path / "shared"))
  assert results[0]["files"] == results[1]["files"] and sorted(results[0]["files"]) == sorted(
      gpt2_files)
  assert all(server.gets(name, GPT2) == 1 for name in gpt2_files)
  assert results[0]["missing"] == results[1]["missing"]
  assert results[0]["missing"].startswith("--config.init_from=nobody/missing: nobody/missing (")
  assert "waiting for process 0" not in outputs[0][1]
