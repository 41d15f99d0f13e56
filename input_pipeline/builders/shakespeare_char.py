"""TFDS builder `shakespeare_char`: nanoGPT's character-level Tiny Shakespeare (registry module).

The builder is `text_corpus.ShakespeareChar` (input.txt from the manual dir, without one the
repository's input_pipeline/data/tinyshakespeare/input.txt; the 65 sorted
characters, first 90% train = 1,003,854 ids, last 10% val = 111,540); it has no knobs.

Synopsis:
  python -m input_pipeline.prepare --dataset=shakespeare_char --data_dir=data/tfds
"""

from __future__ import annotations

from input_pipeline.builders import text_corpus

METADATA: dict = dict(text_corpus.METADATA, vocab_size=65)
ShakespeareChar = text_corpus.ShakespeareChar
prepared_metadata = text_corpus.prepared_metadata


def make_config(**knobs) -> text_corpus.TextCorpusConfig:
  """The one config; `shakespeare_char` takes no knobs (use `text_corpus` for other files)."""
  if knobs:
    raise ValueError(f"shakespeare_char has no knobs (got {sorted(knobs)}); use the text_corpus "
                     "dataset for another file, level or split")
  return ShakespeareChar.BUILDER_CONFIGS[0]
