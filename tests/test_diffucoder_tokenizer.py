"""The Qwen2-style tokenizer loader (experiments/diffucoder/tokenizer.py) on small test vocabularies."""

import json

import pytest
import tokenizers

from experiments.diffucoder import tokenizer as tokenizer_lib
from experiments.diffucoder.configs import tiny

SPECIALS = tokenizer_lib.tiny_special_tokens(tiny.TINY_TOKENS)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok")
  tokenizer_lib.write_byte_level_tokenizer(str(path), SPECIALS, tokenizer_lib.TINY_MERGES,
                                           first_merge_id=261)
  return str(path)


def test_byte_table_is_a_bijection():
  table = tokenizer_lib.bytes_to_unicode()
  assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
  assert table[ord("a")] == "a" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_round_trip_and_known_ids(tiny_dir):
  tok = tokenizer_lib.load(tiny_dir)
  assert tok.vocab_size == 272
  texts = ["def add(a, b):\n    return a + b\n", "héllo wörld ✓ 日本", "  x\t\ty\r\n",
           "in the return", "<|im_start|>user\nhi<|im_end|>", ""]
  for text in texts:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < 272 for i in ids)
  # bytes map to their own ids; merges apply; specials are whole tokens with their ids
  assert tok.encode("a") == [97]
  assert tok.encode("é") == [0xC3, 0xA9]
  assert tok.encode(" in") == [269]                 # "Ġ" + "in" (merge 9 -> id 269)
  # the regex leaves the last space to the word: "   " -> ĠĠ Ġ, then " x" -> Ġ x
  assert tok.encode("    x") == [261, 32, 32, 120]
  assert tok.encode("\n    ") == [10, 262]        # newlines split from the indentation "ĠĠĠĠ"
  assert tok.encode("de") == [268]
  assert tok.encode("<|mask|><|dlm_pad|>") == [259, 260]
  assert tok.encode("a<|endoftext|>b") == [97, 256, 98]
  tok.check_ids({"<|mask|>": 259, "<|endoftext|>": 256, "<|im_end|>": 258})
  with pytest.raises(tokenizer_lib.TokenizerError, match="<|mask|> config 151666 vs tokenizer 259"):
    tok.check_ids({"<|mask|>": 151666})
  assert tok.decode([97, 256, 98], skip_special_tokens=True) == "ab"


def test_qwen2_pretokenizer_splits():
  """The Qwen2 regex: contractions, words with one leading non-letter, single digits, spaces."""
  pre = tokenizers.pre_tokenizers.Split(tokenizers.Regex(tokenizer_lib.QWEN2_SPLIT_REGEX),
                                        behavior="isolated")
  pieces = [p for p, _ in pre.pre_tokenize_str("I'll add 123 items!\n\n  ok")]
  assert pieces == ["I", "'ll", " add", " ", "1", "2", "3", " items", "!\n\n", " ", " ok"]


def test_chat_template_text():
  assert tokenizer_lib.chat_prompt("Sort a list.") == (
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nSort a list."
      "\n<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_layout_added_tokens_after_the_vocab_with_a_gap(tmp_path):
  """Real layout: vocab.json holds the BPE tokens, added tokens follow it (ids may skip one)."""
  tokenizer_lib.write_byte_level_tokenizer(str(tmp_path), {}, [("Ġ", "t")])   # ids 0..256
  added = {"257": {"content": "<|endoftext|>", "special": True},
           "258": {"content": "<|im_start|>", "special": True},
           "260": {"content": "<|mask|>", "special": True}}               # 259 missing
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
  (tmp_path / "added_tokens.json").write_text(json.dumps({"<|dlm_pad|>": 261}))
  tok = tokenizer_lib.load(str(tmp_path))
  assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|mask|>", "<|dlm_pad|>")] \
      == [257, 258, 260, 261]
  assert tok.encode("a t<|mask|>") == [97, 256, 260]
  assert tok.decode(tok.encode("a t<|mask|>")) == "a t<|mask|>"


def test_tokenizer_json_is_used_when_present(tmp_path, tiny_dir):
  tok = tokenizer_lib.load(tiny_dir)
  tok.tok.save(str(tmp_path / "tokenizer.json"))
  again = tokenizer_lib.load(str(tmp_path))
  text = "def in the <|mask|> return"
  assert again.encode(text) == tok.encode(text)


def test_missing_or_inconsistent_files_give_clear_errors(tmp_path):
  with pytest.raises(tokenizer_lib.TokenizerError, match="does not exist"):
    tokenizer_lib.load(str(tmp_path / "nope"))
  with pytest.raises(tokenizer_lib.TokenizerError, match="no tokenizer.json and no vocab.json"):
    tokenizer_lib.load(str(tmp_path))
  tokenizer_lib.write_byte_level_tokenizer(str(tmp_path), {})
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(
      {"added_tokens_decoder": {"100": {"content": "<|x|>", "special": True}}}))
  with pytest.raises(tokenizer_lib.TokenizerError, match="inside the 256 ids already used"):
    tokenizer_lib.load(str(tmp_path))
