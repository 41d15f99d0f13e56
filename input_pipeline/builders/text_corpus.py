"""TFDS builders `shakespeare_char` and `text_corpus`: a text file from a manual dir as token ids.

Without a manual dir both read the repository's Tiny Shakespeare (input_pipeline/sources.py:
input_pipeline/data/tinyshakespeare/input.txt, public domain, the file nanoGPT's prepare.py
downloads). `shakespeare_char` is nanoGPT's data/shakespeare_char/prepare.py: input.txt, the 65 sorted distinct characters as the vocabulary, the first 90% train
(1,003,854 ids), the last 10% validation (111,540). `text_corpus` does the same for a user's own
UTF-8 file, at character level (the vocabulary from the file) or byte level (256 ids), or at GPT-2
BPE level: nanoGPT's data/shakespeare/prepare.py, the first 90% of the characters and the last 10%
encoded separately with the byte-level BPE of `tokenizer_dir` (a GPT-2 folder's vocab.json +
merges.txt, input_pipeline/gpt2_bpe.py; "<|endoftext|>" in the text is ordinary text, as tiktoken's
encode_ordinary), stored as uint16 ids (GPT-2's vocabulary: 301,966 train and 36,059 val ids of
Tiny Shakespeare, nanoGPT's numbers).

Each split is stored as ordered chunks of at most 2^20 ids (`tokens` int32 [n], `index` = chunk
number); `load_tokens` concatenates them. The vocabulary (char level) is in the dataset's metadata
(`vocab`, a string: id i = vocab[i]), so sampling decodes without the text file.

Knobs (`text_corpus`): file (name inside the manual dir, default input.txt), level ("char" | "byte" |
"bpe"), val_fraction (0.1), tokenizer_dir (level "bpe" only). Config names:
`<level>_<file stem>_v<val %>`, plus `_<8 hex digits of the tokenizer files' sha256>` for "bpe".

Synopsis:
  python -m input_pipeline.prepare --dataset=shakespeare_char --data_dir=data/tfds
  python -m input_pipeline.prepare --dataset=text_corpus --data_dir=data/tfds \
      --manual_dir=/my/texts --builder_kwargs='{"file": "corpus.txt", "level": "byte"}'
  python -m input_pipeline.prepare --dataset=text_corpus --data_dir=data/tfds \
      --builder_kwargs='{"level": "bpe", "tokenizer_dir": "/models/gpt2"}'

  from input_pipeline.builders import text_corpus
  builder = text_corpus.ShakespeareChar(data_dir="data/tfds")
  train = text_corpus.load_tokens(builder, "train")           # int32 [1003854]
  vocab = text_corpus.vocab_of(builder)                       # "\\n !$&',-.3:;?ABC..."
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline import errors
from input_pipeline import gpt2_bpe
from input_pipeline import sources
from input_pipeline import text
from input_pipeline.builders import base

CHUNK = 1 << 20
_VERSION = tfds.core.Version("1.0.0")

METADATA: dict = {"kind": "text", "seq_len": 0, "vocab_size": 0, "num_puzzle_identifiers": 0}
"""Static metadata; the prepared dataset adds vocab_size and vocab (`prepared_metadata`)."""


@dataclasses.dataclass(eq=False)
class TextCorpusConfig(tfds.core.BuilderConfig):
  """Which file of the manual dir, character, byte or GPT-2 BPE level, the validation fraction and
  (BPE) the folder with vocab.json + merges.txt."""
  file: str = "input.txt"
  level: str = "char"
  val_fraction: float = 0.1
  tokenizer_dir: str = ""


LEVELS = ("char", "byte", "bpe")
UINT16_IDS = 1 << 16


def make_config(file: str = "input.txt", level: str = "char", val_fraction: float = 0.1,
                tokenizer_dir: str = "") -> TextCorpusConfig:
  if level not in LEVELS:
    raise ValueError(f"level={level!r}: must be 'char', 'byte' or 'bpe'")
  if level == "bpe" and not tokenizer_dir:
    raise ValueError("level='bpe' needs tokenizer_dir: the GPT-2 folder with vocab.json and "
                     "merges.txt (the finetune recipes take it from --config.init_from)")
  if level != "bpe" and tokenizer_dir:
    raise ValueError(f"tokenizer_dir={tokenizer_dir!r} is only for level='bpe' (level={level!r}); "
                     "drop it or use level='bpe'")
  if not 0.0 < float(val_fraction) < 1.0:
    raise ValueError(f"val_fraction={val_fraction}: must be in (0, 1); use 0.1")
  if os.path.basename(file) != file or not file:
    raise ValueError(f"file={file!r}: must be a file name inside the manual dir (no folders)")
  for c in _PRESETS:
    if (c.file, c.level, c.val_fraction) == (file, level, float(val_fraction)):
      return c
  stem = "".join(ch if ch.isalnum() else "_" for ch in os.path.splitext(file)[0])
  name = f"{level}_{stem}_v{round(100 * float(val_fraction), 3):g}"
  if level == "bpe":
    try:
      name += "_" + gpt2_bpe.file_digest(tokenizer_dir)[:8]
    except gpt2_bpe.TokenizerError as e:
      raise errors.SourceMissing(f"tokenizer_dir: {e}") from None
  return TextCorpusConfig(name=name, version=_VERSION, file=file, level=level,
                          val_fraction=float(val_fraction), tokenizer_dir=str(tokenizer_dir),
                          description=f"{file}, {level} level, last {val_fraction:.0%} validation")


_PRESETS = [TextCorpusConfig(name="char_input_v10", version=_VERSION, file="input.txt", level="char",
                             val_fraction=0.1, description="input.txt, char level, last 10% val")]


def _features(level: str = "char") -> tfds.features.FeaturesDict:
  """int32 ids; uint16 at BPE level (nanoGPT's train.bin / val.bin dtype)."""
  return tfds.features.FeaturesDict({
      "tokens": tfds.features.Tensor(shape=(None,),
                                     dtype=np.uint16 if level == "bpe" else np.int32),
      "index": np.int64,
  })


class TextCorpus(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
  """A UTF-8 text file of the manual dir as char- or byte-level ids, 90/10 split."""

  VERSION = _VERSION
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = _PRESETS
  LOCAL_SOURCE = ("the repository's Tiny Shakespeare (input_pipeline/data/tinyshakespeare/"
                  "input.txt), no download")
  MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put the text file (default input.txt) in a folder and pass it "
                                  "with --manual_dir (without one: the repository's Tiny Shakespeare).")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__.split("\n\n")[0], features=_features(self.builder_config.level),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    c = self.builder_config
    folder = base.manual_dir(dl_manager) or sources.TINY_SHAKESPEARE_DIR
    path = os.path.join(folder, c.file)
    if not os.path.exists(path):
      raise errors.SourceMissing(f"{self.name}: {c.file} not found in {folder}. Fix: pass "
                                 f"--manual_dir=<folder with {c.file}> (--config.dataset.manual_dir)")
    with open(path, "r", encoding="utf-8") as f:
      data = f.read()
    if c.level == "bpe":
      train, val, vocab_size = _bpe_split(data, c)
      vocab = None
    else:
      vocab = text.char_vocab(data) if c.level == "char" else None
      ids = text.encode(data, vocab)
      train, val = text.split_ids(ids, c.val_fraction)
      vocab_size = len(vocab) if vocab is not None else 256
    self.info.metadata["vocab"] = vocab if vocab is not None else ""
    self.info.metadata["vocab_size"] = vocab_size
    self.info.metadata["level"] = c.level
    self.info.metadata["num_tokens"] = {"train": int(len(train)), "val": int(len(val))}
    return {"train": self._generate_examples(train), "val": self._generate_examples(val)}

  def _generate_examples(self, ids: np.ndarray):
    dtype = np.uint16 if self.builder_config.level == "bpe" else np.int32
    for i, start in enumerate(range(0, max(len(ids), 1), CHUNK)):
      yield i, {"tokens": ids[start:start + CHUNK].astype(dtype), "index": i}


def _bpe_split(data: str, c: TextCorpusConfig):
  """nanoGPT's data/shakespeare/prepare.py: characters [0, int(n * 0.9)) train, the rest val, each
  encoded on its own (encode_ordinary), uint16. Returns (train, val, vocab_size)."""
  try:
    tok = gpt2_bpe.load(c.tokenizer_dir)
  except gpt2_bpe.TokenizerError as e:
    raise errors.SourceMissing(f"tokenizer_dir: {e}") from None
  if tok.vocab_size > UINT16_IDS:
    raise ValueError(f"tokenizer_dir={c.tokenizer_dir!r}: {tok.vocab_size} ids do not fit uint16 "
                     "(nanoGPT's BPE data format); use a vocabulary of at most 65,536 ids")
  cut = int(len(data) * (1.0 - c.val_fraction))
  train = np.asarray(tok.encode(data[:cut]), np.uint16)
  val = np.asarray(tok.encode(data[cut:]), np.uint16)
  return train, val, tok.vocab_size


class ShakespeareChar(TextCorpus):
  """nanoGPT's shakespeare_char: input.txt (Tiny Shakespeare), 65 characters, 90/10."""

  BUILDER_CONFIGS = [TextCorpusConfig(name="default", version=_VERSION, file="input.txt",
                                      level="char", val_fraction=0.1,
                                      description="nanoGPT shakespeare_char")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = ("Tiny Shakespeare comes with the repository "
                                  "(input_pipeline/data/tinyshakespeare/input.txt); --manual_dir "
                                  "may name another folder with an input.txt.")


SHAKESPEARE_METADATA: dict = dict(METADATA, vocab_size=65)


def make_shakespeare_config() -> TextCorpusConfig:
  """The one config of `shakespeare_char` (it has no knobs)."""
  return ShakespeareChar.BUILDER_CONFIGS[0]


def load_tokens(builder: tfds.core.DatasetBuilder, split: str) -> np.ndarray:
  """All ids of `split` in order ([N] int32)."""
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(try_autocache=False))
  chunks = sorted(((int(ex["index"]), ex["tokens"]) for ex in tfds.as_numpy(ds)),
                  key=lambda t: t[0])
  if not chunks:
    return np.zeros((0,), np.int32)
  return np.concatenate([c for _, c in chunks]).astype(np.int32)


def vocab_of(builder: tfds.core.DatasetBuilder) -> Optional[str]:
  """The character vocabulary of a prepared builder, or None for byte level."""
  vocab = builder.info.metadata.get("vocab", "")
  return vocab or None


def prepared_metadata(builder: tfds.core.DatasetBuilder) -> dict:
  """vocab_size, vocab, level and token counts of a prepared builder."""
  m = builder.info.metadata
  return {"vocab_size": int(m["vocab_size"]), "vocab": m.get("vocab", ""), "level": m["level"],
          "num_tokens": dict(m["num_tokens"])}
