r"""Time and memory of one host's training stream (and eval batches) of a prepared dataset.

Answers "does host h of an n-host job fit this dataset, and how fast does it feed?" before pod time:
it builds the same iterators the trainers build (`DataSource`, sized by the trainers' BatchLayout of
experiments/common/layout.py: hence a tool of experiments/, not of input_pipeline/), for any
(process_index, process_count) on this machine, and prints a table: seconds to the first batch (the
load), ms per batch after it (median), and the process's resident memory after the load and at its
peak.

  python -m experiments.tools.stream_bench --dataset=arc_agi --data_dir=/tmp/arcfull \
      --builder_kwargs='{"variant": "arc1", "num_aug": 1000, "seed": 0}' --global_batch=768 \
      --process_count=8 --process_index=0 --local_device_count=4
  python -m experiments.tools.stream_bench --dataset=sudoku_generated --data_dir=/tmp/tfds \
      --builder_kwargs='{"config": "easy"}' --global_batch=32 --batches=20
"""

import json
import resource
import statistics
import sys
import time

from absl import app
from absl import flags

_DATASET = flags.DEFINE_string("dataset", None, "Registered dataset name (input_pipeline.datasets).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir the dataset was prepared into.")
_KWARGS = flags.DEFINE_string("builder_kwargs", "{}", "Builder kwargs as JSON.")
_BATCH = flags.DEFINE_integer("global_batch", 768, "Examples per step over all hosts.")
_PROCESS_COUNT = flags.DEFINE_integer("process_count", 1, "Hosts of the job being simulated.")
_PROCESS_INDEX = flags.DEFINE_integer("process_index", 0, "The host to load.")
_DEVICES = flags.DEFINE_integer("local_device_count", 1, "Devices per host.")
_BATCHES = flags.DEFINE_integer("batches", 50, "Batches timed after the first.")
_GROUP = flags.DEFINE_bool("group_sampling", True, "Reference group sampling for datasets with "
                           "materialised augmentations (ARC); ignored for others.")
_EVAL = flags.DEFINE_bool("eval", True, "Also load this host's eval batches of the test split.")


def _rss_gb() -> float:
  with open("/proc/self/statm") as f:
    pages = int(f.read().split()[1])
  return pages * resource.getpagesize() / 2**30


def _peak_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # KiB on Linux


def measure() -> list[tuple[str, str]]:
  """Rows (name, value) of the report."""
  # Imported here so that "RSS before loading" is measured before TensorFlow and the dataset load.
  from experiments.common import layout as layout_lib  # pylint: disable=g-import-not-at-top
  from input_pipeline import data_source  # pylint: disable=g-import-not-at-top
  kwargs = json.loads(_KWARGS.value)
  rows = [("dataset", f"{_DATASET.value} {kwargs}"),
          ("host", f"{_PROCESS_INDEX.value} of {_PROCESS_COUNT.value}, "
                   f"{_DEVICES.value} devices, global batch {_BATCH.value}"),
          ("RSS before loading", f"{_rss_gb():.2f} GB")]
  layout = layout_lib.of(_BATCH.value, devices_per_host=_DEVICES.value, hosts=_PROCESS_COUNT.value,
                         process_index=_PROCESS_INDEX.value)     # the trainers' batch figures
  source = data_source.DataSource(name=_DATASET.value, data_dir=_DATA_DIR.value,
                                  builder_kwargs=kwargs, seed=0, group_sampling=_GROUP.value)
  group = _GROUP.value and "train_groups" in source.metadata()
  t0 = time.perf_counter()
  it = source.train_iterator(layout=layout)
  first = next(it)
  rows.append(("train stream", "group sampling" if group else "shuffled shard"))
  rows.append(("first batch (load)", f"{time.perf_counter() - t0:.1f} s"))
  rows.append(("RSS after loading", f"{_rss_gb():.2f} GB"))
  times = []
  for _ in range(_BATCHES.value):
    t = time.perf_counter()
    next(it)
    times.append(time.perf_counter() - t)
  if times:
    rows.append((f"ms/batch (median of {len(times)})", f"{1e3 * statistics.median(times):.2f}"))
  rows.append(("batch", ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in first.items())))
  if _EVAL.value:
    t = time.perf_counter()
    ev = source.eval_batches(layout=layout)
    rows.append(("eval load", f"{time.perf_counter() - t:.1f} s, {ev.num_local_examples} examples, "
                              f"{ev.num_batches} batches"))
    rows.append(("RSS after eval load", f"{_rss_gb():.2f} GB"))
  rows.append(("peak RSS", f"{_peak_gb():.2f} GB"))
  return rows


def main(argv):
  del argv
  try:
    report = measure()
  except (FileNotFoundError, ValueError) as e:   # not prepared, unknown dataset or knob
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  width = max(len(k) for k, _ in report)
  print("\n".join(f"{k:<{width}}  {v}" for k, v in report), flush=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["dataset", "data_dir"])
  app.run(main)
