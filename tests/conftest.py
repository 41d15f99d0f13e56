"""Shared pytest setup.

Tests run on the CPU with 4 fake XLA devices so that pmap/psum code paths (one host with 4 chips) are
exercised on a laptop. The flag must be set before JAX is imported anywhere.
"""
import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_data_dir() -> pathlib.Path:
  """`../shared/data` beside the checkout; tests that need it skip when it is absent."""
  path = SHARED_DIR / "data"
  if not path.is_dir():
    pytest.skip(f"needs the shared data folder {path} (absent in a plain clone)")
  return path


# The files holding the suite's longest tests (15-100 s each on 2 busy cores: `pytest --durations`),
# collected first. `make test` runs pytest-xdist with --dist worksteal: worker 0 starts on the first
# half of the tests (these long ones first, so the module-scoped fixtures of test_launch.py run once),
# worker 1 on the second half, and whichever runs out takes tests from the end of the other's queue
# (where the short ones are), so the two finish close together. A test is never moved once it runs,
# so the order is what keeps a long test from starting last. The order of the tests within a file
# and of the other files is unchanged.
LONG_FIRST = ("test_launch.py", "test_arc_train.py", "test_multiprocess_train.py",
              "test_init_from.py", "test_entry.py", "test_faults.py", "test_trm_model.py",
              "test_trm_train.py", "test_diffucoder_generate.py", "test_dry_run.py")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(LONG_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))   # stable: order kept
