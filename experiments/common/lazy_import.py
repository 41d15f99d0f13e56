"""A module imported on its first use: the data and metric libraries (TensorFlow, TFDS, CLU) for code
that also runs where they are absent.

A training step, the benchmarks and the profiler need JAX, Haiku and optax only; TensorFlow, TFDS and
CLU serve reading data, writing metrics and files (tf.io.gfile), and accelerator images often lack
them. Modules that need them only in such functions name them at the top, as usual, through
`module`: the import runs when an attribute is first read (and raises its ImportError there, where
the data is read or the metrics written), never when the importing module loads.

Synopsis:

  from experiments.common import lazy_import
  tf = lazy_import.module("tensorflow")          # nothing imported yet
  tf.io.gfile.exists("/tmp")                     # imports tensorflow, then reads tf.io
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class LazyModule(types.ModuleType):
  """Stands for the module `name` and imports it when one of its attributes is first read."""

  def __init__(self, name: str):
    super().__init__(name)
    self.__dict__["_lazy_target"] = None

  def _load(self) -> types.ModuleType:
    target = self.__dict__["_lazy_target"]
    if target is None:
      target = importlib.import_module(self.__name__)
      self.__dict__["_lazy_target"] = target
    return target

  def __getattr__(self, attr: str) -> Any:
    # Only attributes this placeholder lacks reach here (its own __name__, __dict__ do not).
    return getattr(self._load(), attr)

  def __dir__(self):
    return dir(self._load())

  def __repr__(self) -> str:
    state = "imported" if self.__dict__["_lazy_target"] is not None else "not imported yet"
    return f"<lazy module {self.__name__!r} ({state})>"


def module(name: str) -> types.ModuleType:
  """The module `name` if it is imported already, else a placeholder that imports it on first use."""
  return sys.modules.get(name) or LazyModule(name)

