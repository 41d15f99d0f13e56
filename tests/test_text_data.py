"""Tests of the text data: vocabularies, the 90/10 split, the TFDS builders, random-window batches.

The shakespeare_char facts (65 characters, 1,003,854 / 111,540 ids, first ids 18 47 56 57 58 1 15 ...)
are from docs/nanogpt.md, on the repository's copy of Tiny Shakespeare (input_pipeline/data/).
"""
import hashlib
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.common import errors as config_errors
from experiments.common import layout as layout_lib

from input_pipeline import datasets
from input_pipeline import errors
from input_pipeline import prepare
from input_pipeline import sources
from input_pipeline import text
from input_pipeline.builders import text_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_char_vocab_encode_decode_round_trip():
  s = "First Citizen:\nBefore we proceed"
  vocab = text.char_vocab(s)
  assert vocab == "".join(sorted(set(s))) and vocab[0] == "\n" and vocab[1] == " "
  ids = text.encode(s, vocab)
  assert ids.dtype == np.int32 and text.decode(ids, vocab) == s
  assert list(text.encode("é!", None)) == [0xC3, 0xA9, 0x21]
  assert text.decode([0xC3, 0xA9, 0x21], None) == "é!"
  with pytest.raises(ValueError, match="not in the"):
    text.encode("xyz", "abc")


def test_split_is_first_90_and_last_10_percent():
  ids = np.arange(1000, dtype=np.int32)
  train, val = text.split_ids(ids, 0.1)
  assert len(train) == 900 and len(val) == 100 and train[-1] + 1 == val[0]
  with pytest.raises(ValueError, match="val_fraction"):
    text.split_ids(ids, 0.0)


def _windows(tokens, batch=4, devices_per_host=2, hosts=1, process_index=0, **kw):
  layout = layout_lib.of(batch, devices_per_host=devices_per_host, hosts=hosts,
                         process_index=process_index)
  args = dict(block_size=8, accum=3, seed=0, layout=layout)
  args.update(kw)
  return text.window_iterator(tokens, **args)


def test_windows_are_shifted_slices_deterministic_and_resumable():
  tokens = np.arange(500, dtype=np.int32) * 7 % 101
  it = _windows(tokens)
  batches = [next(it) for _ in range(4)]
  for b in batches:
    assert b["x"].shape == b["y"].shape == (2, 3, 2, 8) and b["x"].dtype == np.int32
    rows_x, rows_y = b["x"].reshape(-1, 8), b["y"].reshape(-1, 8)
    for x, y in zip(rows_x, rows_y):
      starts = [i for i in range(500 - 8) if (tokens[i:i + 8] == x).all()]
      assert starts and any((tokens[i + 1:i + 9] == y).all() for i in starts)
  again = _windows(tokens)
  for b in batches:
    np.testing.assert_array_equal(next(again)["x"], b["x"])
  resumed = next(_windows(tokens, start_step=2))
  np.testing.assert_array_equal(resumed["x"], batches[2]["x"])
  other_seed = next(_windows(tokens, seed=1))
  other_host = next(_windows(tokens, process_index=1, hosts=2, batch=8))
  other_stream = next(_windows(tokens, stream="eval_val"))
  for b in (other_seed, other_host, other_stream):
    assert not np.array_equal(b["x"], batches[0]["x"])


def test_window_offsets_are_uniform_over_the_split():
  tokens = np.arange(40, dtype=np.int32)
  it = _windows(tokens, block_size=4, batch=64, devices_per_host=1, accum=1)
  starts = np.concatenate([next(it)["x"][..., 0].ravel() for _ in range(50)])
  counts = np.bincount(starts, minlength=36)
  assert len(counts) == 36 and counts.min() > 0           # every offset 0..N-T-1 is drawn
  assert abs(counts.mean() - 3200 / 36) < 1e-9 and counts.std() / counts.mean() < 0.25


def test_window_errors_name_the_problem():
  with pytest.raises(ValueError, match="block_size=64"):
    next(_windows(np.arange(10, dtype=np.int32), block_size=64))
  with pytest.raises(config_errors.ConfigError, match="global_batch_size"):
    next(_windows(np.arange(100, dtype=np.int32), batch=5))


def test_text_corpus_byte_level_builder(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "corpus.txt").write_text("héllo\n" * 50, encoding="utf-8")
  kwargs = {"file": "corpus.txt", "level": "byte"}
  builder = prepare.prepare("text_corpus", tmp_path / "tfds", kwargs, manual)
  raw = ("héllo\n" * 50).encode("utf-8")
  train = text_corpus.load_tokens(builder, "train")
  val = text_corpus.load_tokens(builder, "val")
  assert len(train) == int(len(raw) * 0.9) and len(train) + len(val) == len(raw)
  np.testing.assert_array_equal(np.concatenate([train, val]), np.frombuffer(raw, np.uint8))
  meta = datasets.get_metadata("text_corpus", kwargs, str(tmp_path / "tfds"))
  assert meta["vocab_size"] == 256 and meta["level"] == "byte" and text_corpus.vocab_of(builder) is None
  with pytest.raises(ValueError, match="level"):
    datasets.make_config("text_corpus", {"level": "word"})


@pytest.mark.parametrize("name, kwargs, manual, message", [
    ("text_corpus", {"file": "corpus.txt"}, None,
     "text_corpus: corpus.txt not found in {repo}. Fix: pass --manual_dir=<folder with corpus.txt>"),
    ("text_corpus", {}, "empty", "text_corpus: input.txt not found in {tmp}/empty. Fix: pass "),
    ("shakespeare_char", {}, "nowhere", "manual_dir={tmp}/nowhere (shakespeare_char): no such "
     "folder. Fix: Tiny Shakespeare comes with the repository"),
    ("sudoku_extreme", {}, None, "sudoku_extreme: train.csv, test.csv of https://huggingface.co/"
     "datasets/sapientinc/sudoku-extreme: HF_HUB_OFFLINE=1 forbids downloading them. Fix: download "
     "train.csv, test.csv of https://huggingface.co/datasets/sapientinc/sudoku-extreme by hand into "
     "a folder and pass it with --manual_dir"),
    ("maze_hard", {}, "empty", "maze_hard: train.csv: not in {tmp}/empty. Fix: download"),
])
def test_a_missing_source_is_one_line_naming_it_where_and_how(tmp_path, monkeypatch, name, kwargs,
                                                              manual, message):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")                  # without a manual dir: no download
  monkeypatch.delenv("HF_ENDPOINT", raising=False)
  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "other.txt").write_text("x")          # TFDS treats an empty folder as none
  manual_dir = None if manual is None else tmp_path / manual
  with pytest.raises(errors.SourceMissing) as e:
    prepare.prepare(name, tmp_path / "tfds", kwargs, manual_dir)
  want = message.format(repo=sources.TINY_SHAKESPEARE_DIR, tmp=tmp_path)
  assert str(e.value).startswith(want), str(e.value)
  assert "\n" not in str(e.value)


def test_prepare_cli_reports_a_missing_source_in_one_line(tmp_path):
  """Offline (HF_HUB_OFFLINE=1) without a manual dir: one line naming the files, the URL and the
  manual fallback, exit 2, nothing prepared."""
  env = {k: v for k, v in os.environ.items() if k != "HF_ENDPOINT"}
  proc = subprocess.run([sys.executable, "-m", "input_pipeline.prepare", "--dataset=maze_hard",
                         f"--data_dir={tmp_path}"], capture_output=True, text=True, timeout=300,
                        cwd=REPO, env=dict(env, HF_HUB_OFFLINE="1"))
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr   # (TFDS may log)
  page = "https://huggingface.co/datasets/sapientinc/maze-30x30-hard-1k"
  assert proc.stderr.splitlines()[-1] == (
      f"error: maze_hard: train.csv, test.csv of {page}: HF_HUB_OFFLINE=1 forbids downloading "
      f"them. Fix: download train.csv, test.csv of {page} by hand into a folder and pass it with "
      "--manual_dir (--config.dataset.manual_dir)"), proc.stderr
  assert not list(tmp_path.rglob("1.0.0"))


def test_shakespeare_char_split_sizes_and_first_ids(tmp_path):
  with open(sources.TINY_SHAKESPEARE, "rb") as f:
    assert hashlib.sha256(f.read()).hexdigest() == (
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")   # nanoGPT's input.txt
  builder = prepare.prepare("shakespeare_char", tmp_path, {})      # no manual dir: the repository's
  train = text_corpus.load_tokens(builder, "train")
  val = text_corpus.load_tokens(builder, "val")
  assert (len(train), len(val)) == (1_003_854, 111_540)
  assert list(train[:13]) == [18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52]
  vocab = text_corpus.vocab_of(builder)
  assert len(vocab) == 65 and vocab[0] == "\n" and vocab[1] == " "
  assert vocab[13:39] == "ABCDEFGHIJKLMNOPQRSTUVWXYZ" and vocab[39:] == "abcdefghijklmnopqrstuvwxyz"
  assert text.decode(train[:13], vocab) == "First Citizen"
  assert datasets.get_metadata("shakespeare_char", {}, str(tmp_path))["vocab_size"] == 65
