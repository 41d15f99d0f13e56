"""What a run prints: podlab's own log lines, one progress line, the final table. Quiet by default.

* `quiet_libraries()`: the console shows podlab's lines for the user (`say`: the start, resume,
  evaluations, preemption), the progress line and the final table; log lines of every library
  (orbax, TFDS, JAX, CLU, absl internals) and podlab's own details show at WARNING and above, minus
  the known noise (`NOISE`). `--verbosity=1` or PODLAB_VERBOSE=1 brings every INFO line back. C++ logs (TensorFlow, XLA, libtpu) are quietened through
  their environment variables, which must be set before those libraries load: `quiet_native_logs()`
  runs at the import of experiments/common/entry.py.
* `last_line(text)`: a program's one-line error before it exits (experiments/common/entry.py), kept
  the last line: a library thread that fails after it prints nothing more (unless verbose).
* `Progress`: one line per log interval, on process 0: step/total, percent, steps/s, examples/s (or
  tokens/s), ETA and the experiment's 2-4 key metrics. On a terminal it redraws one line (a bar);
  otherwise (a log file, CI) it prints plain lines.

Synopsis:

  import io
  from experiments.common import console
  out = io.StringIO()
  p = console.Progress(total_steps=100, start_step=0, items_per_step=32, item_name="examples",
                       stream=out, tty=False)
  p.update(50, {"train/loss": 0.25}, seconds=5.0)
  print(out.getvalue())   # step 50/100 (50%) | 10.0 steps/s | 320 examples/s | ETA 5s | loss 0.2500
"""

from __future__ import annotations

import contextlib
import logging as py_logging
import os
import sys
import time
from typing import IO, Mapping, Optional, Sequence

from absl import logging

ENV_VERBOSE = "PODLAB_VERBOSE"


def verbose() -> bool:
  """True when the user asked for every library's log lines (PODLAB_VERBOSE=1 or --verbosity>=1)."""
  if os.environ.get(ENV_VERBOSE, "") not in ("", "0"):
    return True
  try:
    return logging.get_verbosity() >= 1
  except Exception:  # pylint: disable=broad-except  (flags not parsed yet)
    return False


@contextlib.contextmanager
def _stderr_silenced():
  """Points file descriptor 2 at /dev/null (C++ code writes there directly); restores it after."""
  sys.stderr.flush()
  saved = os.dup(2)
  null = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(null, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(null)


def quiet_native_logs() -> None:
  """Quietens the C++ loggers before TensorFlow/XLA/libtpu load (environment variables, kept if
  already set), and imports TensorFlow with stderr silenced: TF 2.21 prints its oneDNN and CPU
  feature notices through absl's C++ logging before any threshold applies. Where TensorFlow is not
  installed (an accelerator image: the step needs none) there is nothing to quieten; any other import
  error still raises (with its traceback, once stderr is back)."""
  if os.environ.get(ENV_VERBOSE, "") not in ("", "0"):
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")       # TensorFlow and XLA: warnings and up
  os.environ.setdefault("TPU_STDERR_LOG_LEVEL", "2")       # libtpu
  os.environ.setdefault("TPU_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
  if "tensorflow" not in sys.modules:
    with _stderr_silenced():
      try:
        import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
      except ModuleNotFoundError as e:
        if e.name != "tensorflow":
          raise


# Warnings that libraries print on every run and that say nothing a podlab user can act on.
NOISE = (
    "Using custom data configuration",           # TFDS, for every builder config podlab makes
    "Unable to initialize backend",              # JAX probing for a TPU / GPU on a CPU machine
    "is not prepared; you might want to",
    "has no dataset_info.json",                  # TFDS, reading metadata of an unprepared dataset
    "Metadata file does not exist",              # orbax, reading an item folder written without it
    # orbax's own error lines (and their tracebacks) for a save or restore that failed; podlab's
    # checkpointing turns the failure into one line naming the checkpoint and the fix.
    "_SignalingThread.run() raised an exception",
    "Handler Commit operations or the Commit callback",
    "Save Finalize thread (save_finalize) failed",
)


def _is_loop_noise(exc_type, exc) -> bool:
  """The tracebacks tensorstore prints (through sys.excepthook) when orbax closed its event loop
  after a failed save or restore: `RuntimeError: Event loop is closed`."""
  return exc_type is RuntimeError and str(exc) == "Event loop is closed"


_previous_excepthook = sys.excepthook


_previous_unraisablehook = sys.unraisablehook


def _unraisablehook(unraisable):
  if _is_loop_noise(unraisable.exc_type, unraisable.exc_value):
    return
  _previous_unraisablehook(unraisable)


def _excepthook(exc_type, exc, tb):
  if _is_loop_noise(exc_type, exc):
    return
  _previous_excepthook(exc_type, exc, tb)


class _QuietFilter(py_logging.Filter):
  """Drops the library noise above (kept with --verbosity=1 / PODLAB_VERBOSE=1)."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    message = record.getMessage() if record.args else str(record.msg)
    return not any(n in message for n in NOISE)


_FILTER = _QuietFilter()


def quiet_libraries() -> None:
  """Quiet console: absl/Python log lines at WARNING and above, minus `NOISE`; podlab talks to the
  user through `say`, `Progress` and the final table. No-op when verbose (every INFO line)."""
  handler = logging.get_absl_handler()
  if verbose():
    handler.removeFilter(_FILTER)
    return
  logging.set_verbosity(logging.WARNING)
  py_logging.getLogger("tensorflow").setLevel(py_logging.ERROR)   # TF's deprecation notices
  if _FILTER not in handler.filters:
    handler.addFilter(_FILTER)
  sys.excepthook = _excepthook
  sys.unraisablehook = _unraisablehook


def last_line(text: str) -> None:
  """Prints `text` (a one-line error before exiting) as the last thing on stderr: unless verbose,
  file descriptor 2 then points at /dev/null, so a library's background thread that fails later
  (orbax's async save hitting the same full disk again, a second traceback) cannot print below it."""
  print(text, file=sys.stderr, flush=True)
  if verbose():
    return
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 2)
  os.close(null)


def say(text: str) -> None:
  """A line for the user (every process prints its own; in verbose mode it is an INFO log line)."""
  if verbose():
    logging.info("%s", text)
    return
  sys.stderr.write(text + "\n")
  sys.stderr.flush()


def _duration(seconds: float) -> str:
  seconds = int(round(max(seconds, 0.0)))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  if h:
    return f"{h}h{m:02d}m"
  if m:
    return f"{m}m{s:02d}s"
  return f"{s}s"


def _number(x: float) -> str:
  if x == 0 or 1e-3 <= abs(x) < 1e5:
    return f"{x:.4f}" if abs(x) < 10 else f"{x:,.1f}"
  return f"{x:.3e}"


class Progress:
  """The progress line; see the module doc. `update` is called at each log interval."""

  def __init__(self, *, total_steps: int, start_step: int, items_per_step: float = 0.0,
               item_name: str = "examples", keys: Sequence[str] = (),
               stream: Optional[IO[str]] = None, tty: Optional[bool] = None, enabled: bool = True):
    self.total, self.start = int(total_steps), int(start_step)
    self.items_per_step, self.item_name, self.keys = float(items_per_step), item_name, tuple(keys)
    self.stream = stream if stream is not None else sys.stderr
    self.tty = self.stream.isatty() if tty is None else tty
    self.enabled = enabled
    self._last_step, self._last_time = self.start, time.perf_counter()
    self._open_line = False

  def line(self, step: int, scalars: Mapping[str, float], seconds: float) -> str:
    """The text of the line for `step`, with `seconds` of training since the previous update."""
    done = step - self._last_step
    rate = done / seconds if seconds > 0 and done > 0 else 0.0
    pct = 100.0 * step / max(self.total, 1)
    parts = [f"step {step}/{self.total} ({pct:.0f}%)", f"{rate:.1f} steps/s"]
    if self.items_per_step and rate:
      parts.append(f"{rate * self.items_per_step:,.0f} {self.item_name}/s")
    if rate and step < self.total:
      parts.append(f"ETA {_duration((self.total - step) / rate)}")
    metrics = []
    for key in self.keys:
      if key in scalars:
        metrics.append(f"{key.split('/')[-1]} {_number(float(scalars[key]))}")
    if metrics:
      parts.append(" ".join(metrics))
    return " | ".join(parts)

  def update(self, step: int, scalars: Mapping[str, float], seconds: Optional[float] = None) -> str:
    """Prints the line (redrawn on a terminal) and returns it."""
    now = time.perf_counter()
    if seconds is None:
      seconds = now - self._last_time
    text = self.line(step, scalars, seconds)
    self._last_step, self._last_time = step, now
    if self.enabled:
      if self.tty:
        width = max(len(text), getattr(self, "_width", 0))
        self._width = len(text)
        self.stream.write("\r" + text.ljust(width))
        self._open_line = step < self.total
        if not self._open_line:
          self.stream.write("\n")
      else:
        self.stream.write(text + "\n")
      self.stream.flush()
    return text

  def message(self, text: str) -> None:
    """`say(text)` without breaking the bar (every process)."""
    if self.enabled and self._open_line:
      self.stream.write("\n")
      self.stream.flush()
      self._open_line = False
    say(text)

  def close(self) -> None:
    if self.enabled and self._open_line:
      self.stream.write("\n")
      self.stream.flush()
      self._open_line = False
