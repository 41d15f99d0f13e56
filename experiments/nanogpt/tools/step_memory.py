r"""The TPU compiler's per-chip memory of one finetuning train step, compiled alone: a quicker
probe than `--dry_run` (which also compiles the evaluation step and every loop body again for the
loop-aware costs) for finding what fills a step's memory on a smaller proxy of the model.

  python -m experiments.nanogpt.tools.step_memory size=gpt2-xl devices=4 target=v4-8 \
      sharding=fsdp model.remat=true model.n_layer=4 [dump=/tmp/step.hlo]

Arguments (key=value): size and devices (configs/finetune_shakespeare.py's arguments; defaults
gpt2-xl and 4), target (a gcloud accelerator type; default v4-8), sharding (default fsdp), dump (a
file for the compiled HLO text), and any config field as dotted.name=value (model.n_layer=4).
Prints one line: the train step's argument, temporary and output GiB per chip and the compiler's
peak (`memory_analysis()`; `--dry_run` prints the same figures) and the compile time. Needs
libtpu; nothing runs on a TPU.
"""

from __future__ import annotations

import sys
import time

from experiments.common import console

console.quiet_native_logs()

from experiments.nanogpt import train  # noqa: E402
from experiments.nanogpt.configs import finetune_shakespeare  # noqa: E402
from experiments.tools import dry_run  # noqa: E402
from experiments.tools import tpu_target  # noqa: E402

GIB = 2 ** 30


def main(argv) -> None:
  args = {}
  for a in argv:
    if "=" not in a:
      raise SystemExit(f"step_memory: argument {a!r}: use key=value (e.g. model.n_layer=4)")
    key, value = a.split("=", 1)
    args[key] = value
  size, devices = args.pop("size", "gpt2-xl"), args.pop("devices", "4")
  target = tpu_target.parse_target(args.pop("target", "v4-8"))
  dump = args.pop("dump", "")
  c = finetune_shakespeare.for_compile(finetune_shakespeare.get_config(f"{size},devices={devices}"))
  c.sharding = args.pop("sharding", "fsdp")
  for key, value in args.items():
    node, *path = [c] + key.split(".")[:-1]
    for p in path:
      node = node[p]
    last = key.split(".")[-1]
    old = node[last]
    node[last] = (value.lower() in ("1", "true") if isinstance(old, bool) else type(old)(value))
  tpu_target.load_libtpu()
  t0 = time.time()
  layout = dry_run.tpu_layout(train.NanoGPT(), c, target)
  build = train.NanoGPT().build(c, layout)
  p = dry_run.programs(train.NanoGPT(), build, c, layout)["train_step"]
  compiled = dry_run.lower_for_tpu(p, target, layout).compile()
  m = compiled.memory_analysis()
  peak = getattr(m, "peak_memory_in_bytes", 0)
  print(f"train_step {' '.join(argv)} on {target.name}: args {m.argument_size_in_bytes / GIB:.2f} "
        f"GiB, temp {m.temp_size_in_bytes / GIB:.2f} GiB, output {m.output_size_in_bytes / GIB:.2f} "
        f"GiB (aliased {m.alias_size_in_bytes / GIB:.2f}), compiler peak "
        f"{peak / GIB:.2f} GiB; usable "
        f"{target.usable_hbm_bytes_per_device / GIB:.2f} GiB; compiled in {time.time() - t0:.0f} s",
        flush=True)
  if dump:
    with open(dump, "w") as f:
      f.write(compiled.as_text())


if __name__ == "__main__":
  main(sys.argv[1:])
