"""Character/byte-level text for language models: vocabularies, the 90/10 split, random windows.

The nanoGPT `shakespeare_char` recipe (docs/nanogpt.md): the vocabulary is the sorted
set of distinct characters of input.txt (65 for Tiny Shakespeare: id 0 = newline, 1 = space), the
first 90% of the ids are train, the last 10% val; a batch is B windows at uniform random offsets
(with replacement): x = data[i:i+T], y = data[i+1:i+1+T]. Byte level: ids are the UTF-8 bytes (256).

Random windows (`window_dataset`, tf.data): step k of a stream is a pure function of
(seed, process_index, stream, k) through stateless Philox draws, so a stream is deterministic for a
seed, every host draws its own windows (its share of the global batch), and `start_step=k` resumes
exactly where an uninterrupted run would be. D, b and this host's index come from the run's `layout`
(experiments/common/layout.BatchLayout, the one place that divides batches; this package does not
import experiments/: any object with its fields will do).

Shape glossary:  N: tokens of a split   D: local devices   A: gradient-accumulation micro-steps
  b: per-device micro-batch   T: block size (window length)

Synopsis:

  import numpy as np
  from experiments.common import layout as layout_lib
  from input_pipeline import text
  vocab = text.char_vocab("hello world\\n")                     # "\\n dehlorw"
  ids = text.encode("hello world\\n", vocab)                    # int32 [12]
  train, val = text.split_ids(ids, val_fraction=0.1)            # first 90% / last 10%
  layout = layout_lib.of(4, devices_per_host=2)                 # 1 host x 2 devices x 2
  it = text.window_iterator(np.arange(100, dtype=np.int32), block_size=8, layout=layout,
                            accum=1, seed=0)
  batch = next(it)                                             # x, y int32 [D=2, A=1, b=2, T=8]
  assert (batch["y"][..., :-1] == batch["x"][..., 1:]).all()
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

_ALG = "philox"
STREAMS = {"train": 0, "eval_train": 1, "eval_val": 2}


def char_vocab(text: str) -> str:
  """The sorted distinct characters of `text` (id i = vocab[i])."""
  return "".join(sorted(set(text)))


def encode(text: str, vocab: Optional[str]) -> np.ndarray:
  """Ids of `text` ([N] int32): character ids in `vocab`, or UTF-8 bytes when vocab is None."""
  if vocab is None:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
  table = {c: i for i, c in enumerate(vocab)}
  unknown = sorted(set(text) - set(table))
  if unknown:
    raise ValueError(f"characters {unknown[:10]!r} are not in the {len(vocab)}-character vocabulary; "
                     "use characters of the training text (or the byte-level corpus)")
  return np.fromiter((table[c] for c in text), np.int32, count=len(text))


def decode(ids: Sequence[int], vocab: Optional[str]) -> str:
  """Inverse of `encode` (bytes that are not valid UTF-8 are replaced)."""
  if vocab is None:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
  return "".join(vocab[int(i)] for i in ids)


def split_ids(ids: np.ndarray, val_fraction: float = 0.1) -> Tuple[np.ndarray, np.ndarray]:
  """(train, val): the first int(N * (1 - val_fraction)) ids, and the rest (nanoGPT's prepare.py)."""
  if not 0.0 < val_fraction < 1.0:
    raise ValueError(f"val_fraction={val_fraction}: must be in (0, 1); use 0.1 (nanoGPT)")
  n = int(len(ids) * (1.0 - val_fraction))
  return ids[:n], ids[n:]


def _key(seed: int, *data: int) -> tf.Tensor:
  key = tf.constant([0, seed], tf.int64)
  for d in data:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(d, tf.int64), alg=_ALG)
  return key


def window_dataset(tokens: np.ndarray, *, block_size: int, layout: Any, accum: int = 1,
                   seed: int = 0, stream: str = "train", start_step: int = 0) -> tf.data.Dataset:
  """tf.data of random-window batches {"x", "y"}: int32 [D, A, b, T]; see the module doc.

  The layout's global batch is one micro-step's batch over all hosts (nanoGPT's batch_size x world
  size); each of the A = `accum` micro-steps draws its own windows (evaluations pass 1).
  """
  n = int(len(tokens))
  if n <= block_size:
    raise ValueError(f"block_size={block_size}: the split has only {n} tokens; it needs more than "
                     "block_size + 1 (use a smaller block_size or a larger corpus)")
  local_device_count, accum_steps, b = layout.devices_per_host, accum, layout.per_device_batch
  rows = local_device_count * accum_steps * b
  data = tf.constant(np.asarray(tokens, np.int32))
  span = tf.range(block_size + 1, dtype=tf.int64)
  root = _key(seed, layout.process_index, STREAMS[stream])

  def make_batch(step):
    key = tf.random.experimental.stateless_fold_in(root, step, alg=_ALG)
    offsets = tf.random.stateless_uniform([rows], key, minval=0, maxval=n - block_size,
                                          dtype=tf.int64, alg=_ALG)     # [rows] in [0, N - T)
    windows = tf.gather(data, offsets[:, None] + span)                  # [rows, T + 1]
    windows = tf.reshape(windows, [local_device_count, accum_steps, b, block_size + 1])
    return {"x": windows[..., :-1], "y": windows[..., 1:]}

  ds = tf.data.Dataset.counter(start=start_step, dtype=tf.int64).map(
      tf.autograph.experimental.do_not_convert(make_batch))    # no tensor control flow in it
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = 1      # a small CPU: one thread makes the windows
  return ds.with_options(options).prefetch(2)


def window_iterator(tokens: np.ndarray, **kwargs) -> Iterator[dict]:
  """numpy batches of `window_dataset(tokens, **kwargs)`."""
  for batch in window_dataset(tokens, **kwargs).as_numpy_iterator():
    yield batch
