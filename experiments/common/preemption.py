"""Preemption: turn SIGTERM/SIGINT into "stop after this step, at the same step on every host".

TPU maintenance and cloud schedulers send SIGTERM before they take a machine; Ctrl-C sends SIGINT.
A trainer checks the guard after every step and, when it says stop, saves a forced checkpoint,
flushes its metrics and exits; restarting the same command resumes from that checkpoint.

* Multi-process runs (jax.distributed initialised): JAX's own preemption service catches SIGTERM on
  any host and agrees on a step across hosts; `should_stop(step)` is
  `multihost_utils.reached_preemption_sync_point(step)` and is True on every host at the same step.
  SIGINT is forwarded to this process as SIGTERM so that it takes the same path.
* Single-process runs: SIGTERM and SIGINT set a flag; `should_stop` is True at the next step.

A second signal while the run is already stopping restores the default handler and re-sends the
signal, so a stuck run can still be interrupted.

Synopsis:

  import os, signal
  from experiments.common import preemption

  with preemption.PreemptionGuard() as guard:
    for step in range(1, 4):
      if step == 2:
        os.kill(os.getpid(), signal.SIGTERM)   # what a scheduler does
      if guard.should_stop(step):               # call at EVERY step, on every host
        print(f"stopping at step {step} on {guard.signal_name}")  # save(force=True), flush, exit
        break
"""
from __future__ import annotations

import os
import signal
from typing import Optional

from absl import logging
import jax
from jax.experimental import multihost_utils

EXIT_CODES = {"SIGTERM": 128 + signal.SIGTERM, "SIGINT": 128 + signal.SIGINT}
"""Exit code of a preempted run (128 + signal number): launchers see it did not finish."""


class PreemptionGuard:
  """Installs the signal handling described in the module doc; restores it on `close()`."""

  def __init__(self):
    self._multi = jax.process_count() > 1
    self._received: Optional[str] = None
    self._previous = {}
    signals = (signal.SIGINT,) if self._multi else (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:   # not the main thread: leave signals alone (tests, notebooks)
        logging.warning("preemption: not in the main thread; %s not handled", sig.name)

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    name = signal.Signals(signum).name
    if self._received is not None:
      logging.warning("preemption: second %s while stopping; exiting without waiting", name)
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self._received = name
    logging.warning("preemption: %s received; the run stops after the current step and saves a "
                    "checkpoint (send it again to exit at once)", name)
    if self._multi:
      # JAX's preemption service (a C++ SIGTERM handler) agrees on the step across hosts.
      os.kill(os.getpid(), signal.SIGTERM)

  @property
  def signal_name(self) -> str:
    """The signal that stopped the run ("SIGTERM" when another host was preempted)."""
    return self._received or "SIGTERM"

  def should_stop(self, step: int) -> bool:
    """True when the run must stop after `step`: the same step on every host. Call every step."""
    if self._multi:
      return bool(multihost_utils.reached_preemption_sync_point(int(step)))
    return self._received is not None

  def close(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def __enter__(self) -> "PreemptionGuard":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
