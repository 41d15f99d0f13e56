"""Stand-in for rules_python's //python:defs.bzl: the built-in rules under the same names.

rules_python 0.x wraps the native rules the same way, so `load("@rules_python//python:defs.bzl",
"py_library")` keeps working if the real repository replaces this one in WORKSPACE.
"""

load("@bazel_tools//tools/python:toolchain.bzl", _py_runtime_pair = "py_runtime_pair")

def py_library(**attrs):
    native.py_library(**attrs)

def py_binary(**attrs):
    native.py_binary(**attrs)

def py_test(**attrs):
    native.py_test(**attrs)

def py_runtime(**attrs):
    native.py_runtime(**attrs)

# @bazel_tools of Bazel 4.2 loads py_runtime_pair from here.
py_runtime_pair = _py_runtime_pair
