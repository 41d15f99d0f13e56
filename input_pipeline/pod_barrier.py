"""Once per pod: process 0 does a step (a download, a dataset's preparation) while the other
processes of a multi-process run wait at a barrier on JAX's distributed key-value store, then
follow with its result; its errors reach every process as one line. A waiting process gives up
only when process 0 shows no progress, neither bytes arriving nor CPU time, for
$PODLAB_BARRIER_STALL_S (900 s): a stalled transfer, not a long one.

Synopsis:
  from input_pipeline import pod_barrier
  folder = pod_barrier.once_per_pod("fetch gpt2", lead=lambda: "/cache/gpt2",
                                    follow=lambda folder: folder, what="--init_from=gpt2")
  # single-process: lead(); process 0 of a pod: lead() and publish; the others: follow(result)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from input_pipeline import errors

ENV_STALL = "PODLAB_BARRIER_STALL_S"
STALL_S = 900.0
"""Seconds a waiting process accepts without progress from process 0 before it fails."""


def _client():
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  return jax_distributed.global_state.client


def _process() -> Tuple[int, int]:
  if "jax" not in sys.modules:
    return 0, 1
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index(), jax.process_count()


_CALLS: Dict[str, int] = {}


def once_per_pod(key: str, lead: Callable[[], str], follow: Callable[[str], str], *,
                 progress: Callable[[], int] = lambda: 0, what: str = "",
                 client: Any = None, process: Optional[Tuple[int, int]] = None,
                 poll_s: float = 2.0) -> str:
  """Process 0 runs `lead()` while the other processes wait; they then run `follow(result)`.

  Single-process: `lead()`. A `errors.DataError` of `lead` reaches every process as the same
  one-line error; process 0 publishes `progress()` (bytes so far) and its CPU time (in 10 s steps)
  every `poll_s`, and a waiting process fails once both stay unchanged for $PODLAB_BARRIER_STALL_S
  seconds (`STALL_S`): a stalled transfer, not a long one. Every process must make the same calls
  in the same order (the keys count them).
  """
  index, count = process or _process()
  if count <= 1:
    return lead()
  client = client or _client()
  n = _CALLS[key] = _CALLS.get(key, 0) + 1
  base = f"{key}#{n}"
  if index == 0:
    return _lead(client, base, lead, progress, poll_s)
  stall = float(os.environ.get(ENV_STALL, "") or STALL_S)
  result = follow_barrier(client, base, what or key, stall_s=stall, poll_s=poll_s)
  return follow(result)


def _lead(client, base: str, lead: Callable[[], str], progress: Callable[[], int],
          poll_s: float) -> str:
  stop = threading.Event()

  def beat():
    while not stop.wait(poll_s):
      try:               # bytes arrived, and this process's CPU time in 10 s steps (work, not waits)
        report = f"{progress()} {int(time.process_time() // 10) * 10}"
        client.key_value_set(f"{base}/progress", report, allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except  (a heartbeat never fails the work)
        pass
  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  try:
    result = lead()
  except errors.DataError as e:
    client.key_value_set(f"{base}/done", json.dumps({"error": str(e)}), allow_overwrite=True)
    raise
  except BaseException as e:
    client.key_value_set(f"{base}/done", json.dumps(
        {"error": f"process 0 failed ({type(e).__name__}: {e}); see its log"}),
        allow_overwrite=True)
    raise
  finally:
    stop.set()
  client.key_value_set(f"{base}/done", json.dumps({"ok": result}), allow_overwrite=True)
  return result


def follow_barrier(client, base: str, what: str, *, stall_s: float, poll_s: float,
                   clock: Callable[[], float] = time.monotonic) -> str:
  """Waits for process 0's result under `base` (see once_per_pod); raises its error, or
  `errors.SourceMissing` when its progress stays unchanged for `stall_s` seconds of `clock`."""
  last, changed, said = None, clock(), clock()
  while True:
    try:
      done = client.blocking_key_value_get(f"{base}/done", max(1, int(poll_s * 1000)))
      break
    except Exception as e:  # pylint: disable=broad-except
      if "deadline" not in str(e).lower():
        raise
    try:
      now_progress = client.key_value_try_get(f"{base}/progress")
    except Exception:  # pylint: disable=broad-except  (not published yet)
      now_progress = None
    now = clock()
    if now_progress != last:
      last, changed = now_progress, now
    elif now - changed > stall_s:
      raise errors.SourceMissing(
          f"{what}: process 0 showed no progress for {stall_s:.0f} s ({_report(last)}). Fix: see "
          f"process 0's log; raise {ENV_STALL} for a slow link")
    if now - said > 60:
      said = now
      print(f"waiting for process 0: {what} ({_report(last)})", file=sys.stderr, flush=True)
  record = json.loads(done)
  if "error" in record:
    raise errors.SourceMissing(record["error"])
  return record["ok"]


def _report(progress: Optional[str]) -> str:
  got, cpu = (progress or "0 0").split()
  return f"{int(got):,} bytes so far, {cpu} CPU-s"
