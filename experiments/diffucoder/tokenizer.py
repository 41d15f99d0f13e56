r"""The Dream / DiffuCoder tokenizer (Qwen2 byte-level BPE), loaded offline with `tokenizers`.

A checkpoint folder holds either `tokenizer.json` (used as is) or `vocab.json` + `merges.txt` with the
added tokens in `tokenizer_config.json` ("added_tokens_decoder") and/or `added_tokens.json`. From the
latter the Qwen2 fast tokenizer is rebuilt: NFC normalisation, the Qwen2 split regex, byte-level
pre-tokenisation and decoding, BPE without unknown token; every added token (<|endoftext|>, <|mask|>,
<|dlm_pad|>, ...) is matched whole and gets exactly its listed id (a gap in the ids is filled with
unused placeholders so that later ids stay right). Nothing is downloaded; no pickle is read.

Shape glossary: none (token ids are Python lists of int).

Synopsis:

  from experiments.diffucoder import tokenizer
  tok = tokenizer.load("/ckpt/DiffuCoder-7B-Instruct")        # or a folder with tokenizer.json
  ids = tok.encode(tokenizer.chat_prompt("Write a quicksort in Python."))
  text = tok.decode(ids)
  tokenizer.write_byte_level_tokenizer("/tmp/tiny_tok", {256: "<|endoftext|>"})  # tests, demos
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from experiments.common import errors
from input_pipeline import gpt2_bpe

QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                     r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""The pre-tokenisation pattern of Qwen2's tokenizer (words, single digits, punctuation, spaces)."""

SYSTEM_PROMPT = "You are a helpful assistant."
CHATML_TEMPLATE = ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{query}\n<|im_end|>\n"
                   "<|im_start|>assistant\n")
"""The instruct models' prompt (docs/diffucoder.md), with a newline after the query."""

PLACEHOLDER = "<|podlab_unused_{}|>"


class TokenizerError(errors.FormatError):
  """A tokenizer folder is missing files or has inconsistent added tokens (message says the fix)."""


def chat_prompt(query: str, system: str = SYSTEM_PROMPT) -> str:
  """The ChatML text of one user turn, ending where the assistant's answer starts."""
  return CHATML_TEMPLATE.format(system=system, query=query)


bytes_to_unicode = gpt2_bpe.bytes_to_unicode   # GPT-2's byte -> printable character table


def _added_tokens(path: str) -> List[Tuple[int, str, bool]]:
  """(id, content, special) from tokenizer_config.json and added_tokens.json, sorted by id."""
  found: Dict[int, Tuple[str, bool]] = {}
  cfg = os.path.join(path, "tokenizer_config.json")
  if os.path.isfile(cfg):
    with open(cfg, encoding="utf-8") as f:
      decoder = json.load(f).get("added_tokens_decoder", {}) or {}
    for i, entry in decoder.items():
      found[int(i)] = (entry["content"], bool(entry.get("special", True)))
  added = os.path.join(path, "added_tokens.json")
  if os.path.isfile(added):
    with open(added, encoding="utf-8") as f:
      for content, i in json.load(f).items():
        if int(i) in found and found[int(i)][0] != content:
          raise TokenizerError(
              f"{path}: added token id {i} is {found[int(i)][0]!r} in tokenizer_config.json but "
              f"{content!r} in added_tokens.json. Fix: make the two files agree")
        found.setdefault(int(i), (content, True))
  return sorted((i, c, s) for i, (c, s) in found.items())


def _from_vocab_merges(path: str) -> tokenizers.Tokenizer:
  vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
  for p in (vocab, merges):
    if not os.path.isfile(p):
      raise TokenizerError(f"{path}: no tokenizer.json and no {os.path.basename(p)}. Fix: point "
                           "config.tokenizer_dir at the checkpoint folder (it has vocab.json + "
                           "merges.txt or tokenizer.json)")
  tok = tokenizers.Tokenizer(models.BPE.from_file(vocab, merges, fuse_unk=False, byte_fallback=False))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  for i, content, special in _added_tokens(path):
    current = tok.token_to_id(content)
    if current is not None and current != i:
      raise TokenizerError(f"{path}: added token {content!r} should have id {i} but the vocabulary "
                           f"gives it {current}. Fix: use the checkpoint's own tokenizer files")
    if current is None:
      nxt = tok.get_vocab_size(with_added_tokens=True)
      if i < nxt:
        raise TokenizerError(
            f"{path}: added token {content!r} has id {i}, inside the {nxt} ids already used "
            "(vocab.json + earlier added tokens). Fix: list it in vocab.json with that id, or "
            "use the checkpoint's tokenizer.json")
      while nxt < i:                          # a gap: keep later ids right
        tok.add_special_tokens([tokenizers.AddedToken(PLACEHOLDER.format(nxt), special=True,
                                                      normalized=False)])
        nxt += 1
    token = tokenizers.AddedToken(content, special=special, normalized=False)
    if special:
      tok.add_special_tokens([token])
    else:
      tok.add_tokens([token])
    if tok.token_to_id(content) != i:
      raise TokenizerError(f"{path}: added token {content!r} got id {tok.token_to_id(content)}, "
                           f"expected {i}. Fix: use the checkpoint's tokenizer.json")
  return tok


class Tokenizer:
  """encode/decode around a `tokenizers.Tokenizer` (no BOS/EOS added: Dream's prompts have none)."""

  def __init__(self, tok: tokenizers.Tokenizer):
    self.tok = tok

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> List[int]:
    return list(self.tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> Optional[int]:
    return self.tok.token_to_id(token)

  def check_ids(self, expected: Mapping[str, int]) -> None:
    """Raises TokenizerError unless each token string has the given id (e.g. config.tokens)."""
    bad = {t: (i, self.token_to_id(t)) for t, i in expected.items() if self.token_to_id(t) != i}
    if bad:
      raise TokenizerError(
          "tokenizer ids differ from the config: " + ", ".join(
              f"{t} config {i} vs tokenizer {j}" for t, (i, j) in bad.items())
          + ". Fix: use the tokenizer of the checkpoint this config describes")


def load(path: str) -> Tokenizer:
  """From `path`/tokenizer.json if present, else vocab.json + merges.txt + added tokens."""
  if not os.path.isdir(path):
    raise TokenizerError(f"tokenizer folder {path!r} does not exist. Fix: set "
                         "--config.tokenizer_dir to the checkpoint folder")
  tj = os.path.join(path, "tokenizer.json")
  if os.path.isfile(tj):
    return Tokenizer(tokenizers.Tokenizer.from_file(tj))
  return Tokenizer(_from_vocab_merges(path))


def write_byte_level_tokenizer(path: str, special_tokens: Mapping[int, str],
                               merges: Iterable[Tuple[str, str]] = (),
                               first_merge_id: Optional[int] = None) -> Dict[str, int]:
  """Writes a small Qwen2-style tokenizer folder (vocab.json, merges.txt, tokenizer_config.json).

  Ids 0..255 are the 256 bytes (byte b -> id b), the special tokens keep their ids (listed in
  vocab.json too, so they may sit below the merged tokens, as in the tiny config), and each merge
  (a pair of byte-level strings, e.g. ("Ġ", "t")) adds its concatenation at the next free id from
  `first_merge_id` (default: after the largest id). Returns the vocabulary.
  """
  os.makedirs(path, exist_ok=True)
  vocab = {ch: b for b, ch in bytes_to_unicode().items()}
  for i, content in special_tokens.items():
    vocab[content] = int(i)
  nxt = first_merge_id if first_merge_id is not None else max(vocab.values()) + 1
  merges = list(merges)
  for a, b in merges:
    for part in (a, b):
      if part not in vocab:
        raise TokenizerError(f"merge ({a!r}, {b!r}): {part!r} is not in the vocabulary yet. "
                             "Fix: list merges after the merges that make their parts")
    if a + b not in vocab:
      while nxt in vocab.values():
        nxt += 1
      vocab[a + b] = nxt
      nxt += 1
  with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
  with open(os.path.join(path, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
  with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"added_tokens_decoder": {str(i): {"content": c, "special": True}
                                        for i, c in special_tokens.items()}}, f, indent=1)
  return vocab


TINY_MERGES = (("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("Ġ", "="), ("i", "n"), ("Ġ", "t"), ("e", "r"),
               ("r", "e"), ("d", "e"), ("Ġ", "in"), ("o", "n"), ("Ġ", "re"))
"""11 merges that fill the tiny config's free ids 261..271."""


def tiny_special_tokens(tokens: Mapping[str, int]) -> Dict[int, str]:
  """The special tokens of a tiny config (`config.tokens`) as {id: content}."""
  names = {"pad_id": "<|endoftext|>", "im_start_id": "<|im_start|>", "im_end_id": "<|im_end|>",
           "mask_id": "<|mask|>", "dlm_pad_id": "<|dlm_pad|>"}
  return {int(tokens[k]): v for k, v in names.items() if k in tokens}
