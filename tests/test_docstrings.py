"""The module synopses that are self-contained run as written (CLU style: a docstring synopsis that runs)."""

import importlib
import textwrap

import pytest

RUNNABLE = ["modules.layers", "modules.trm", "experiments.common.parallel",
            "experiments.common.metrics", "experiments.trm.optim", "experiments.common.preemption",
            "input_pipeline.puzzles.arc", "input_pipeline.puzzles.arc_files",
            "input_pipeline.puzzles.arc_dataset", "input_pipeline.puzzles.sudoku",
            "input_pipeline.puzzles.sudoku_generator", "input_pipeline.puzzles.sudoku_csv",
            "input_pipeline.puzzles.maze", "input_pipeline.puzzles.maze_generator",
            "input_pipeline.puzzles.maze_csv", "input_pipeline.puzzles.puzzle_csv",
            "experiments.trm.sharded_table",
            "experiments.trm.losses", "modules.gpt", "modules.dream",
            "experiments.trm.reference_format", "experiments.trm.reference_layout",
            "experiments.trm.tools.trace_ops", "experiments.trm.tools.trace_kernels",
            "experiments.trm.tools.hlo_instructions", "experiments.trm.tools.bench_cli",
            "experiments.trm.tools.measure",
            "input_pipeline.text", "experiments.nanogpt.sampling", "experiments.nanogpt.torch_rng",
            "experiments.diffucoder.sampling", "experiments.diffucoder.sampler_options",
            "experiments.diffucoder.unmasking", "experiments.diffucoder.model_sharding",
            "experiments.common.safetensors_io", "experiments.diffucoder.convert",
            "experiments.diffucoder.hf_layout", "experiments.diffucoder.random_checkpoint",
            "experiments.diffucoder.orbax_params", "experiments.diffucoder.tools.bench_table",
            "experiments.common.lazy_import", "experiments.common.chips",
            "experiments.tools.gpu_measured", "experiments.tools.doc_tables",
            "experiments.tools.step_timing",
            "experiments.diffucoder.sandbox", "experiments.diffucoder.code_eval"]


def synopsis(module_name: str) -> str:
  doc = importlib.import_module(module_name).__doc__
  head, sep, body = doc.partition("Synopsis")
  assert sep, f"{module_name} has no synopsis"
  body = body.split(":", 1)[1]
  lines = []
  for line in body.splitlines()[1:]:
    if line and not line.startswith("  "):
      break                                  # the synopsis ends at the next unindented paragraph
    lines.append(line)
  return textwrap.dedent("\n".join(lines))


@pytest.mark.parametrize("module_name", RUNNABLE)
def test_synopsis_runs(module_name):
  code = synopsis(module_name)
  assert code.strip()
  exec(compile(code, f"<{module_name} synopsis>", "exec"), {})
