r"""The `main` of every podlab experiment: flags, config resolution, distributed init, exit codes.

An experiment's `main.py` is three lines around `main_lib.run`; the flags are the same for all:
`--config` (path[:arg], resolved from the working directory, then the experiment's folder),
`--config.FIELD=VALUE` overrides, `--workdir` (default workdirs/<config name>),
`--coordinator_address/--num_processes/--process_id` (multi-process runs off TPU) and `--dry_run`.

Exit codes: 0 done; 2 bad config / workdir / dataset / checkpoint (the message names the fix);
3 a non-finite training step (config.nonfinite = "stop"); 143 / 130 preempted by SIGTERM / SIGINT
after saving a checkpoint (rerun the same command to resume).

Synopsis (experiments/<name>/main.py):

  import os, sys
  from experiments.common import main_lib

  def train_and_evaluate(config, workdir):           # imported lazily, after distributed init
    from experiments.nanogpt import train
    return train.train_and_evaluate(config, workdir)

  if __name__ == "__main__":
    main_lib.run(os.path.dirname(os.path.abspath(__file__)), train_and_evaluate)

  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py --workdir=/tmp/w
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments.common import config_utils
from experiments.common import distributed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Where checkpoints, TensorBoard metrics and the final table go "
                               "(local path or gs://). Default: workdirs/<config name>.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 for multi-process runs off TPU.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (off TPU).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (off TPU).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "Compile one host's training step of the config on this machine with "
                             "the pod's per-host device count (fake CPU devices), print memory, "
                             "FLOPs, batches and steps, and exit. Trains nothing.")


def default_workdir(config_arg: str) -> str:
  """workdirs/<config file name without .py>."""
  name = os.path.splitext(os.path.basename(config_arg.split(":")[0]))[0]
  return os.path.join("workdirs", name)


def config_filename() -> str:
  return config_flags.get_config_filename(flags.FLAGS["config"])


def train_main(train_and_evaluate: Callable[[Any, str], Any]) -> None:
  """Initialises jax.distributed, runs `train_and_evaluate(config, workdir)`, maps exceptions to
  exit codes (see the module doc) and finalises. `train_and_evaluate` imports its trainer lazily."""
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  # Imported after jax.distributed.initialize, which must come first.
  from experiments.common import checkpointing  # pylint: disable=g-import-not-at-top
  from experiments.common import loop  # pylint: disable=g-import-not-at-top
  workdir = _WORKDIR.value or default_workdir(config_filename())
  logging.info("workdir: %s", workdir)
  preempted = None
  with distributed.fail_fast():   # multi-process: a failing host exits now instead of hanging
    try:
      train_and_evaluate(_CONFIG.value, workdir)
    except (config_utils.ConfigError, config_utils.WorkdirError, FileNotFoundError,
            checkpointing.CheckpointError) as e:   # bad config/workdir/dataset/checkpoint
      logging.error("%s", e)
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except loop.NonFiniteError as e:
      logging.error("%s", e)
      print(f"error: {e}", file=sys.stderr)
      sys.exit(3)
    except loop.Preempted as e:   # every host stopped after the same step and saved it
      logging.warning("%s", e)
      print(str(e), file=sys.stderr, flush=True)
      preempted = e
  distributed.finalize()
  if preempted is not None:
    sys.exit(preempted.exit_code)


def fake_host_devices(config: Any) -> None:
  """For --dry_run: give this process the pod host's device count as fake CPU devices (before JAX
  starts its backends)."""
  n = config.devices_per_host if config.devices_per_host > 0 else max(config.num_devices, 1)
  os.environ["XLA_FLAGS"] = " ".join(
      [f for f in os.environ.get("XLA_FLAGS", "").split()
       if not f.startswith("--xla_force_host_platform_device_count")]
      + [f"--xla_force_host_platform_device_count={n}"])
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")


def run(experiment_dir: str, train_and_evaluate: Callable[[Any, str], Any],
        dry_run: Optional[Callable[[Any], None]] = None) -> None:
  """The program: parses the flags (config paths resolved against `experiment_dir`) and runs
  `dry_run(config)` for --dry_run, else `train_main(train_and_evaluate)`."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _DRY_RUN.value:
      if dry_run is None:
        raise app.UsageError("--dry_run is not implemented for this experiment")
      dry_run(_CONFIG.value)
      return
    train_main(train_and_evaluate)

  flags.mark_flags_as_required(["config"])
  app.run(main, argv=config_utils.resolve_config_argv(sys.argv, experiment_dir))
