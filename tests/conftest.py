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
