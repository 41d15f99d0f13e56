"""One pod program group of `make tpu-check` compiled for its TPU slice, in a process of its own
(tests/test_tpu_memory.py runs one per group, so that each compile's memory, up to 5.7 GB, goes back
when it exits).

Two kinds of group, named as docs/tpu.md's table names their rows:

* `check LABEL [PROGRAM...]`: the tpu_check.CHECKS entry with that label (a trainer config), its
  programs named (e.g. train_step; default: its train and eval steps), `tpu_check.run_checks`
  without the loop-aware counts, which the memory does not need;
* `sampling SAMPLER TARGET BATCH MODEL_PARALLEL`: one Dream 7.6B sampler step of the
  tpu_check.PROGRAM_CHECKS group `diffucoder 7b sampling SAMPLER TARGET` at that batch and
  model-parallel degree (`tpu_plan.compile_step`), where `make tpu-check` compiles the group's every
  batch.

Prints one JSON line per compiled program: {"program", "slice", "compiled", "temp_bytes",
"message", "compile_s"}, then `WORKER_OK`; without libtpu only `LIBTPU_MISSING <why>`. Run with
JAX_PLATFORMS=cpu:

  JAX_PLATFORMS=cpu python tests/_tpu_memory_worker.py check "trm v4_64 sudoku_mlp" train_step
  JAX_PLATFORMS=cpu python tests/_tpu_memory_worker.py sampling greedy v3-8 1 1
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.common import console  # noqa: E402

console.quiet_native_logs()     # before TensorFlow (imported by the trainers' modules) loads

from experiments.diffucoder.tools import tpu_plan  # noqa: E402
from experiments.tools import tpu_target  # noqa: E402
from experiments.tools import tpu_check  # noqa: E402


def sampling_label(sampler: str, target: str) -> str:
  """The PROGRAM_CHECKS label of a Dream sampling group (the prefix of its rows' program names)."""
  label = f"diffucoder 7b sampling {sampler} {target}"
  if label not in {c.label for c in tpu_check.PROGRAM_CHECKS}:
    raise ValueError(f"{label!r} is not a group of tpu_check.PROGRAM_CHECKS")
  return label


def compile_group(args) -> list:
  """The reports of the group that `args` (the command line after the program) names."""
  kind, rest = args[0], args[1:]
  if kind == "check":
    label, programs = rest[0], rest[1:]
    checks = [c for c in tpu_check.CHECKS if c.label == label]
    if not checks:
      raise ValueError(f"{label!r} is not a label of tpu_check.CHECKS")
    return tpu_check.run_checks(checks, log=lambda line: None, loop_aware=False,
                                programs=programs or None)
  if kind == "sampling":
    sampler, target, batch, model_parallel = rest
    label = sampling_label(sampler, target)
    t0 = time.perf_counter()
    report = tpu_plan.compile_step(tpu_target.parse_target(target), int(batch),
                                   int(model_parallel), sampler=sampler)
    report.name = f"{label}: {report.name}"
    report.compile_s = time.perf_counter() - t0
    return [report]
  raise ValueError(f"unknown kind {kind!r}: check or sampling")


def main() -> None:
  console.quiet_libraries()
  try:
    tpu_target.load_libtpu()
  except tpu_target.LibtpuMissingError as e:      # the test skips
    print(f"LIBTPU_MISSING {e}", flush=True)
    return
  for r in compile_group(sys.argv[1:]):
    print(json.dumps({"program": r.name, "slice": r.target.name, "compiled": bool(r.compiled),
                      "temp_bytes": r.temp_bytes, "message": r.compiler_message,
                      "compile_s": r.compile_s}), flush=True)
  print("WORKER_OK", flush=True)


if __name__ == "__main__":
  main()
