"""Runs one pytest file as a Bazel test: the main of every podlab_py_test (third_party/py/defs.bzl).

Bazel starts it in the workspace's runfiles folder (a mirror of the repo holding the target's
declared files) as `pytest_main.py TEST_FILE MARKER_EXPRESSION`; it runs
`pytest TEST_FILE -m MARKER_EXPRESSION` with pyproject.toml's settings, writes the per-test JUnit
XML that Bazel shows ($XML_OUTPUT_FILE) and keeps pytest's temporary folders in $TEST_TMPDIR.

Imports of project modules must come from the runfiles (so a missing BUILD dep fails here as it
would anywhere): the `pip install -e .` finder, which maps `modules`, `input_pipeline` and
`experiments` to the checkout, is removed first. Subprocesses that tests start themselves (with
PYTHONPATH set to the checkout) still see the checkout, as under `make test`.

Synopsis (the same run as `bazel test //tests:test_layers`, from the repo root without Bazel):

  .venv/bin/python third_party/py/pytest_main.py tests/test_layers.py "not slow"
"""
import os
import sys

# pytest exits 5 when the marker expression selects no test.
_NO_TESTS_COLLECTED = 5


def drop_editable_finders() -> None:
  """Removes setuptools' editable-install finders (`__editable___podlab_*_finder`)."""
  sys.meta_path[:] = [f for f in sys.meta_path
                      if not getattr(f, "__module__", "").startswith("__editable__")]
  sys.path_hooks[:] = [h for h in sys.path_hooks
                       if not getattr(h, "__module__", "").startswith("__editable__")]
  sys.path_importer_cache.clear()


def main(argv) -> int:
  if len(argv) != 3:
    print(f"usage: {argv[0]} TEST_FILE MARKER_EXPRESSION (got {argv[1:]}); podlab_py_test passes "
          "both", file=sys.stderr)
    return 2
  test_file, markers = argv[1], argv[2]
  if not os.path.isfile(test_file):
    print(f"pytest_main: {test_file} is not in the runfiles of this test (cwd {os.getcwd()}); "
          "is it the podlab_py_test's srcs?", file=sys.stderr)
    return 2
  drop_editable_finders()
  import pytest  # pylint: disable=g-import-not-at-top
  args = [test_file, "-c", "pyproject.toml", "--rootdir", ".", "-m", markers,
          "-p", "no:cacheprovider", "-v", "-rs"]
  if os.environ.get("TEST_TMPDIR"):
    args += ["--basetemp", os.path.join(os.environ["TEST_TMPDIR"], "pytest")]
  if os.environ.get("XML_OUTPUT_FILE"):
    args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
  counts = _Counts()
  code = pytest.main(args, plugins=[counts])
  if code == _NO_TESTS_COLLECTED:
    if markers.strip("'\"") == "not slow" and counts.deselected and not counts.selected:
      # Every test of the file is slow: NAME_slow runs them (`slow = True` in its BUILD stanza;
      # tests/test_build_files.py checks that flag against the markers).
      print(f"pytest_main: all {counts.deselected} tests of {test_file} are @pytest.mark.slow; "
            "its NAME_slow target runs them", file=sys.stderr)
      return 0
    print(f"pytest_main: -m {markers!r} selects no test of {test_file}; set `slow` of its "
          "podlab_py_test to match its @pytest.mark.slow tests", file=sys.stderr)
  return int(code)


class _Counts:
  """A pytest plugin counting the tests the marker expression selects and deselects."""

  def __init__(self):
    self.selected = 0
    self.deselected = 0

  def pytest_deselected(self, items):
    self.deselected += len(items)

  def pytest_collection_finish(self, session):
    self.selected = len(session.items)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
