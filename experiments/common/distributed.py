"""Multi-host start-up and shut-down: the one place podlab initialises JAX's distributed runtime.

Every trainer calls `initialize()` first thing (before any other JAX call) and `finalize()` last:

  from experiments.common import distributed

  def main(argv):
    info = distributed.initialize()          # TPU pod: auto-detected; laptop: no-op.
    with distributed.fail_fast():             # a failing host exits at once (see fail_fast)
      ...                                     # train, save checkpoints
      checkpoint_manager.close()              # wait for this host's async writes
    distributed.finalize()                    # barrier, then shut the runtime down

How the processes find each other, first match wins per argument:

  1. explicit arguments: `initialize(coordinator_address="10.0.0.1:1234", num_processes=2,
     process_id=0)`;
  2. environment variables, for launchers that cannot pass flags:
       PODLAB_COORDINATOR     host:port of process 0's coordinator service, e.g. `10.0.0.1:1234`
       PODLAB_NUM_PROCESSES   total number of processes, e.g. `2`
       PODLAB_PROCESS_ID      this process' index in [0, PODLAB_NUM_PROCESSES)
       PODLAB_HEARTBEAT_TIMEOUT_S  optional (default 30): how long a dead process goes unnoticed
  3. nothing given: on a Cloud TPU VM `jax.distributed.initialize()` discovers the slice by itself;
     anywhere else (CPU laptop, single GPU box) the run is single-process: nothing is initialised.

Off TPU, a multi-process run needs all three values (JAX cannot discover them there).
`launch/local.sh -n 2 -d 2` sets them for N local processes; by hand, two shells:

  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \
    PODLAB_COORDINATOR=localhost:12355 PODLAB_NUM_PROCESSES=2 PODLAB_PROCESS_ID=0 \
    python -m experiments.trm.main ...
  (same with PODLAB_PROCESS_ID=1)
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.util
import os
import sys
import traceback
from typing import Iterator, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils

from experiments.common import console

ENV_COORDINATOR = "PODLAB_COORDINATOR"
ENV_NUM_PROCESSES = "PODLAB_NUM_PROCESSES"
ENV_PROCESS_ID = "PODLAB_PROCESS_ID"
ENV_HEARTBEAT_TIMEOUT = "PODLAB_HEARTBEAT_TIMEOUT_S"

DEFAULT_HEARTBEAT_TIMEOUT_S = 30
"""Seconds without a heartbeat after which the coordination service declares a process dead and
terminates every other process (JAX's own default is 100 s). A process blocked in a collective whose
peer died never returns by itself: this timeout is what bounds the hang. Heartbeats come from a
background thread, so long compilations or steps do not trip it."""

@dataclasses.dataclass(frozen=True)
class DistributedInfo:
  """What `initialize()` found: the process topology of this run."""
  process_index: int
  process_count: int
  local_device_count: int
  device_count: int
  device_kinds: tuple[str, ...]
  platform: str


def _env_int(name: str) -> Optional[int]:
  raw = os.environ.get(name)
  if raw is None or raw.strip() == "":
    return None
  try:
    return int(raw)
  except ValueError:
    raise ValueError(
        f"environment variable {name}={raw!r} is not an integer. "
        f"Fix: export {name}=<int> or unset it.") from None


def _on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM (TPU chips on the PCI bus and libtpu installed), without starting JAX.

  Uses the flag JAX itself sets on import for its own TPU cluster detection; falls back to looking
  for TPU device files when that private flag is unavailable.
  """
  platforms = os.environ.get("JAX_PLATFORMS", "").strip()
  if platforms and "tpu" not in platforms.split(","):
    return False
  try:
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
    return bool(cloud_tpu_init.running_in_cloud_tpu_vm)
  except (ImportError, AttributeError):
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _gpu_plugin_installed() -> bool:
  return any(importlib.util.find_spec(name) is not None
             for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                          "jax_rocm7_plugin"))


def choose_platforms() -> None:
  """Off a TPU VM, keep JAX from probing for a TPU: with libtpu installed (the `tpu` extra, for
  compiling TPU programs here) JAX would try to start a TPU backend, print libtpu's warnings and
  hold /tmp/libtpu_lockfile. Sets jax_platforms to "cpu" when JAX_PLATFORMS is unset, no GPU
  plugin is installed and this is no Cloud TPU VM. Must run before JAX starts a backend."""
  if os.environ.get("JAX_PLATFORMS", "").strip() or jax.config.jax_platforms:
    return
  if not _on_cloud_tpu_vm() and not _gpu_plugin_installed():
    jax.config.update("jax_platforms", "cpu")


def initialize(
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    heartbeat_timeout_s: Optional[int] = None,
) -> DistributedInfo:
  """Starts JAX's distributed runtime when the run spans several processes; see the module doc.

  Must run before any other JAX call that touches devices. Calling it again after a successful
  initialisation (or after someone else initialised the runtime) only logs the topology again.

  Args:
    coordinator_address: `host:port` of process 0's coordinator; falls back to $PODLAB_COORDINATOR.
    num_processes: number of processes; falls back to $PODLAB_NUM_PROCESSES.
    process_id: this process' index; falls back to $PODLAB_PROCESS_ID.
    heartbeat_timeout_s: when one process dies (crash, kill, lost VM), every other process is
      terminated with an error naming the unhealthy task after at most this many seconds, instead
      of hanging in its next collective; falls back to $PODLAB_HEARTBEAT_TIMEOUT_S, then
      DEFAULT_HEARTBEAT_TIMEOUT_S.

  Returns:
    The topology (process index/count, local/global device counts and kinds). The same facts are
    logged with absl logging.

  Raises:
    ValueError: some but not all of the three values given off TPU, or inconsistent values.
  """
  if coordinator_address is None:
    coordinator_address = os.environ.get(ENV_COORDINATOR) or None
  if num_processes is None:
    num_processes = _env_int(ENV_NUM_PROCESSES)
  if process_id is None:
    process_id = _env_int(ENV_PROCESS_ID)
  if heartbeat_timeout_s is None:
    heartbeat_timeout_s = _env_int(ENV_HEARTBEAT_TIMEOUT)
  if heartbeat_timeout_s is None:
    heartbeat_timeout_s = DEFAULT_HEARTBEAT_TIMEOUT_S
  if heartbeat_timeout_s < 1:
    raise ValueError(f"heartbeat_timeout_s={heartbeat_timeout_s}: must be >= 1 second. Fix: pass "
                     f"a positive value or unset {ENV_HEARTBEAT_TIMEOUT}.")
  given = {
      "coordinator_address": coordinator_address,
      "num_processes": num_processes,
      "process_id": process_id,
  }
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes={num_processes}: must be >= 1. Fix: pass the process count.")
  if (num_processes is not None and process_id is not None
      and not 0 <= process_id < num_processes):
    raise ValueError(
        f"process_id={process_id}: must be in [0, num_processes={num_processes}). "
        "Fix: number the processes 0..num_processes-1.")

  choose_platforms()
  if jax.distributed.is_initialized():
    logging.info("distributed: JAX runtime already initialised; not initialising again.")
  elif any(v is not None for v in given.values()):
    missing = [k for k, v in given.items() if v is None]
    if missing and not _on_cloud_tpu_vm():
      env = {"coordinator_address": ENV_COORDINATOR, "num_processes": ENV_NUM_PROCESSES,
             "process_id": ENV_PROCESS_ID}
      raise ValueError(
          f"distributed.initialize: got {given} but {', '.join(missing)} is missing; off TPU all "
          "three are needed. Fix: pass them or set "
          + ", ".join(env[k] for k in missing) + ".")
    logging.info("distributed: jax.distributed.initialize(%s, heartbeat_timeout_seconds=%d)", given,
                 heartbeat_timeout_s)
    jax.distributed.initialize(**given, heartbeat_timeout_seconds=heartbeat_timeout_s)
  elif _on_cloud_tpu_vm():
    logging.info("distributed: Cloud TPU VM detected; jax.distributed.initialize() auto-detects "
                 "(heartbeat timeout %d s).", heartbeat_timeout_s)
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
  else:
    logging.info("distributed: no coordinator given and not on TPU; running single-process.")

  devices = jax.devices()
  info = DistributedInfo(
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      local_device_count=jax.local_device_count(),
      device_count=jax.device_count(),
      device_kinds=tuple(sorted({d.device_kind for d in devices})),
      platform=devices[0].platform,
  )
  line = (f"distributed: process {info.process_index}/{info.process_count}, "
          f"{info.local_device_count} local / {info.device_count} global devices, kinds "
          f"{', '.join(info.device_kinds)} (platform {info.platform})")
  if info.process_count > 1:
    console.say(line)          # every worker's log says which host it is
  else:
    logging.info("%s", line)
  return info


def finalize(barrier_name: str = "podlab_finalize") -> None:
  """Waits for every process, then shuts the distributed runtime down (no-op single-process).

  Close checkpoint managers *before* calling this: the barrier then guarantees no host exits while
  another still writes its part of a checkpoint.
  """
  if jax.process_count() > 1:
    logging.info("distributed: process %d waiting at barrier %r", jax.process_index(), barrier_name)
    multihost_utils.sync_global_devices(barrier_name)
  if jax.distributed.is_initialized():
    logging.info("distributed: shutting down the JAX distributed runtime")
    jax.distributed.shutdown()


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
  """Makes a process that fails in a multi-process run exit at once, so that the run ends quickly.

  Without it, a Python exception on one host ends in JAX's exit-time shutdown barrier, which waits
  (up to 5 minutes) for hosts that are themselves blocked in a collective waiting for the failed
  one: the whole run hangs. Inside this context, an exception (or a non-zero `sys.exit`) in a run
  of more than one process prints the traceback, flushes the logs and calls `os._exit` (exit code:
  the `sys.exit` code, 130 for Ctrl-C, else 1). The launcher's fail-fast (launch/local.sh,
  launch/pod.sh) then stops the other processes, and without a launcher the coordination service
  terminates them within the heartbeat timeout. Single-process runs re-raise unchanged.
  """
  try:
    yield
  except BaseException as e:  # pylint: disable=broad-except
    if jax.process_count() <= 1 or (isinstance(e, SystemExit) and not e.code):
      raise
    if isinstance(e, SystemExit):
      code = e.code if isinstance(e.code, int) else 1
    elif isinstance(e, KeyboardInterrupt):
      code = 130
    else:
      code = 1
      traceback.print_exc()
    logging.error("process %d of %d failed (%s: %s); exiting now with code %d. The other processes "
                  "are stopped by the launcher, or by the runtime within the heartbeat timeout.",
                  jax.process_index(), jax.process_count(), type(e).__name__, e, code)
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
