"""Every error a podlab run reports to its user, and the exit code each one ends the program with.

The entry point (experiments/common/entry.py) catches exactly these types: it prints the message as
ONE line on stderr (the message names the field or file, the value and the fix) and exits with the
type's code. Any other exception is a bug and keeps its traceback.

  exit 0    done
  exit 2    bad input: `BadInput` and its subclasses (config, workdir, data, checkpoint, format)
  exit 3    a non-finite training step with config.nonfinite = "stop" (`NonFiniteError`)
  exit 143  preempted by SIGTERM after saving a checkpoint (`Preempted`; 130 for SIGINT): rerun
            the same command to resume

Data-layer errors live in input_pipeline/errors.py (input_pipeline never imports experiments);
they count as bad input here.

Synopsis:

  from experiments.common import errors
  try:
    raise errors.ConfigError("batch_size", 7, "not divisible by the 4 devices", "use 8")
  except errors.BadInput as e:
    print(e, e.exit_code)        # config.batch_size=7: not divisible by the 4 devices. Fix: use 8  2
"""

from __future__ import annotations

import signal
from typing import Any

from input_pipeline import errors as data_errors

EXIT_BAD_INPUT = 2
EXIT_NONFINITE = 3
EXIT_PREEMPTED = {"SIGTERM": 128 + signal.SIGTERM, "SIGINT": 128 + signal.SIGINT}


class PodlabError(Exception):
  """Base of the errors a run reports without a traceback."""
  exit_code = EXIT_BAD_INPUT


class BadInput(PodlabError, ValueError):
  """The user's input (config, files, flags) is wrong; the message says what to change."""


class ConfigError(BadInput):
  """A config problem: `config.FIELD=VALUE: PROBLEM. Fix: FIX`, on one line.

  Example: `raise ConfigError("batch_size", 7, "must be divisible by 4 devices", "use 8")`.
  """

  def __init__(self, field: str, value: Any, problem: str, fix: str):
    self.field, self.value, self.problem, self.fix = field, value, problem, fix
    super().__init__(f"config.{field}={value!r}: {problem}. Fix: {fix}")

  def __reduce__(self):       # keeps the four fields through copy/pickle (ml_collections re-raises)
    return (type(self), (self.field, self.value, self.problem, self.fix))


class WorkdirError(BadInput):
  """The --workdir cannot be used (not writable, held by another run, full disk)."""


class CheckpointError(BadInput, RuntimeError):
  """A checkpoint cannot be saved or restored; the message names the path and a fix."""


class FormatError(BadInput):
  """A file of another program's format (reference .pt, ckpt.pt, safetensors, Hugging Face
  folder) does not match what was asked for; the message names the file, the tensor and the fix."""


class NonFiniteError(PodlabError, RuntimeError):
  """A training step produced a NaN/Inf loss, gradient or update (config.nonfinite = "stop")."""
  exit_code = EXIT_NONFINITE


class Preempted(PodlabError):
  """The run stopped on a signal after saving a checkpoint; rerunning the command resumes."""

  def __init__(self, step: int, signal_name: str, checkpoint_dir: str):
    self.step, self.signal_name, self.checkpoint_dir = step, signal_name, checkpoint_dir
    self.exit_code = EXIT_PREEMPTED.get(signal_name, EXIT_PREEMPTED["SIGTERM"])
    super().__init__(f"preempted by {signal_name} after step {step}: checkpoint {step} saved in "
                     f"{checkpoint_dir}. Rerun the same command to resume from it.")


USER_ERRORS = (PodlabError, data_errors.DataError)
"""What the entry point reports as one line (anything else keeps its traceback)."""


def exit_code(error: BaseException) -> int:
  """The exit code of a `USER_ERRORS` instance."""
  return getattr(error, "exit_code", EXIT_BAD_INPUT)
