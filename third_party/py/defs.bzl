"""podlab's Python build macros: the one place that says which rules build Python here.

    load("//third_party/py:defs.bzl", "podlab_py_library", "podlab_py_test")

    podlab_py_library(
        name = "layers",
        srcs = ["layers.py"],
        deps = [
            ":modules",
            # pip: jax
        ],
    )

    podlab_py_test(
        name = "test_layers",            # = the file's stem; the drift test checks it
        srcs = ["test_layers.py"],
        deps = ["//modules:layers"],
    )

Third-party packages are not Bazel targets: they come from the toolchain's interpreter (the
checkout's .venv, see python_configure.bzl); each target notes them as `# pip: NAME` comments in
deps, as Haiku and paxml do (a test also depends on the venv's package list, so it re-runs when
the venv changes). Every test file runs under pytest (pytest_main.py), so fixtures,
markers and tests/conftest.py work as with `make test`; pyproject.toml's pytest settings apply.

A test file with `@pytest.mark.slow` tests sets `slow = True`: the target NAME then runs the other
tests (`-m 'not slow'`, what `make test` runs) and NAME_slow runs the slow ones
(`-m slow`, what `make test-slow` runs); NAME_slow is tagged "slow", which .bazelrc excludes from
`bazel test //...` (`bazel test --config=slow //...` runs only them).
"""

load("@rules_python//python:defs.bzl", "py_binary", "py_library", "py_test")

_RUNNER = "//third_party/py:pytest_main.py"

def podlab_py_library(name, srcs, deps = [], data = [], visibility = ["//visibility:public"], **kwargs):
    """A Python library; `deps` are project targets, `data` files it reads at run time."""
    py_library(
        name = name,
        srcs = srcs,
        deps = deps,
        data = data,
        srcs_version = "PY3",
        visibility = visibility,
        **kwargs
    )

def podlab_py_binary(name, srcs, deps = [], data = [], main = None, **kwargs):
    """A Python program, `bazel run //pkg:name -- ARGS`."""
    py_binary(
        name = name,
        srcs = srcs,
        main = main,
        deps = deps,
        data = data,
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = False,  # the packages have their own __init__.py (tests/ has none)
        **kwargs
    )

def podlab_py_test(name, srcs, deps = [], data = [], size = "medium", slow = False, tags = [], **kwargs):
    """One pytest file as a Bazel test (and NAME_slow for its slow tests when `slow`).

    Args:
      name: the test file's stem.
      srcs: [the test file].
      deps: project targets it imports or runs (worker scripts, tests/torch_trm_reference, ...).
      data: other files it reads or runs (launch scripts, the fake gcloud).
      size: Bazel's test size (timeouts, .bazelrc's hang guards: medium 1800 s, enormous 7200 s).
      slow: the file has `@pytest.mark.slow` tests; adds NAME_slow (size "enormous").
      tags: Bazel tags ("exclusive" for tests that start several JAX processes).
      **kwargs: passed to py_test.
    """
    if len(srcs) != 1:
        fail("podlab_py_test %s: srcs must be exactly one test file, got %s" % (name, srcs))
    path = srcs[0] if not native.package_name() else native.package_name() + "/" + srcs[0]
    common = dict(
        srcs = srcs + [_RUNNER],
        main = _RUNNER,
        deps = deps + ["//tests:conftest"],
        data = data + ["//:pyproject.toml", "@podlab_python//:venv_packages.txt"],
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = False,
        **kwargs
    )
    py_test(name = name, size = size, tags = tags, args = [path, "'not slow'"], **common)
    if slow:
        py_test(
            name = name + "_slow",
            size = "enormous",
            tags = tags + ["slow"],
            args = [path, "slow"],
            **common
        )
