"""`make tpu-check` (experiments/tools/tpu_check.py) without compiling: which rows it has (each
experiment's own tools/tpu_rows.py, found through the registry), that a missing ARC folder skips the
ARC rows with one line instead of losing the table, and the GPU measurements shown beside rows."""

import importlib
import os
import re

import jax
import pytest

from experiments.common import trainer
from experiments.diffucoder.tools import tpu_plan
from experiments.tools import dry_run
from experiments.tools import gpu_measured
from experiments.tools import tpu_check
from experiments.tools import tpu_rows
from experiments.tools import tpu_target
from experiments.trm.tools import tpu_rows as trm_rows


def test_missing_arc_folder_skips_those_rows_with_one_line(tmp_path):
  def must_not_build():
    raise AssertionError("a skipped check was built")
  missing = str(tmp_path / "no_arc")
  check = tpu_rows.Check("trm v4_64 arc1_att", must_not_build, "experiments.trm.configs.v4_64",
                         "recipe=arc1_att", skip=lambda: trm_rows.missing_arc_reason(missing))
  lines = []
  assert tpu_check.run_checks([check], log=lines.append) == []
  assert lines == [f"trm v4_64 arc1_att: skipped: {missing} does not exist (the ARC-AGI JSON "
                   "files); pass --arc_dir=DIR to compile these rows"]
  os.makedirs(missing)
  assert trm_rows.missing_arc_reason(missing) is None


def test_the_registry_gives_each_experiments_rows_in_the_tables_order():
  """The rows come from the modules ROW_MODULES names (TRM's, nanoGPT's, then DiffuCoder's), whose
  labels docs/tpu.md's table and `--only` use."""
  assert tpu_check.ROW_MODULES == tuple(f"experiments.{e}.tools.tpu_rows"
                                        for e in ("trm", "nanogpt", "diffucoder"))
  labels = [c.label for c in tpu_check.CHECKS]
  assert labels == (
      [f"trm v4_64 {r}" for r in ("sudoku_mlp", "sudoku_att", "maze_att", "arc1_att", "arc2_att")]
      + ["nanogpt v4_32 gpt2_124m", "nanogpt v4_32 gpt2_124m grad_accum=1"]
      + ["nanogpt finetune gpt2-xl"] * 2 + ["nanogpt finetune gpt2-xl fsdp remat"] * 2
      + ["nanogpt gpt2-xl pretraining fsdp remat", "diffucoder dream_7b mdm fsdp",
         "diffucoder dream_7b mdm fsdp x model_parallel=4"]), labels
  checks, programs = tpu_check.load_rows(tpu_check.ROW_MODULES[:1])
  assert [c.label for c in checks] == labels[:5] and programs == []


def test_arc_rows_are_the_ones_that_can_skip():
  arc = [c for c in tpu_check.CHECKS if "arc" in c.label]
  assert [c.label for c in arc] == ["trm v4_64 arc1_att", "trm v4_64 arc2_att"]
  others = [c for c in tpu_check.CHECKS if "arc" not in c.label]
  assert all(c.skip() is None for c in others)


def test_diffucoder_rows_cover_greedy_and_top_p_on_every_target():
  labels = [c.label for c in tpu_check.PROGRAM_CHECKS]
  assert labels == [f"diffucoder 7b sampling {s} {t}" for s in ("greedy", "top_p")
                    for t in tpu_plan.TARGETS]
  assert tpu_plan.SAMPLERS["top_p"].top_p == 0.95 and tpu_plan.SAMPLERS["greedy"].temperature == 0


def test_gpu_measurements_name_rows_of_the_check():
  """Each measurement names a tpu-check row of the same program (TRM's v4-64 recipes run the
  published global batch, 768, which issue 48 measured on one H200)."""
  labels = [c.label for c in tpu_check.CHECKS]
  for m in gpu_measured.MEASURED:
    label, program = m.row.split(": ")
    assert label in labels and program in ("train_step", "eval_step"), m
    assert m.items_per_step == 768 and re.fullmatch(r"[0-9a-f]{7}", m.commit)
  m = gpu_measured.for_row("trm v4_64 sudoku_mlp: train_step")
  assert gpu_measured.cell(m) == "H200 380.2 ms = 2,020 examples/s (02b0496)"
  assert gpu_measured.cell(None) == "-"


@pytest.mark.parametrize("check", [c for c in tpu_check.CHECKS if "arc" not in c.label],
                         ids=lambda c: f"{c.label} {c.target or ''}".strip())
def test_every_row_builds_in_a_plain_clone(check):
  """Each row's config is checked and built for its slice as `make tpu-check` builds it, with no
  data prepared and no weights or tokenizer folder beside the clone (the finetune rows use GPT-2's
  packaged vocabulary): the layout spans the slice and keeps the config's examples per update."""
  config = importlib.import_module(check.config_module).get_config(check.arg)
  check.overrides(config)
  target = tpu_target.parse_target(check.target or config.target)
  trainer.check_config(check.experiment(), config)
  layout = dry_run.tpu_layout(check.experiment(), config, target)
  build = check.experiment().build(config, layout)
  assert layout.chips == target.num_devices
  assert layout.examples_per_update == config.global_batch_size * config.grad_accum
  for x in jax.tree.leaves(build.example_batch):       # [host devices, (accum,) per device, ...]
    assert x.shape[0] == layout.devices_per_host
    if layout.accum > 1:
      assert x.shape[1:3] == (layout.accum, layout.per_device_batch), x.shape
    else:
      assert layout.per_device_batch in x.shape[1:3], x.shape
