r"""Trains and evaluates TRM: flags, logging and distributed init around `train.train_and_evaluate`.

  python -m experiments.trm.main --config=configs/cpu_demo.py --workdir=workdirs/cpu_demo
  python -m experiments.trm.main --config=configs/sudoku_mlp.py --config.dataset.manual_dir=DIR \
      --workdir=gs://BUCKET/trm/sudoku_mlp
  python -m experiments.trm.main --config=configs/v4_64.py   # on every worker of a v4-64 slice

`--config` paths are resolved from the current directory first, then inside experiments/trm/.
Fields are overridden with `--config.FIELD=VALUE` (e.g. `--config.lr=3e-4`).
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from experiments.common import config_utils
from experiments.common import distributed

EXPERIMENT_DIR = os.path.dirname(os.path.abspath(__file__))

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
  name = os.path.splitext(os.path.basename(config_arg.split(":")[0]))[0]
  return os.path.join("workdirs", name)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _DRY_RUN.value:
    dry_run()
    return
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  # Imported after jax.distributed.initialize, which must come first.
  from experiments.common import checkpointing  # pylint: disable=g-import-not-at-top
  from experiments.trm import train  # pylint: disable=g-import-not-at-top
  workdir = _WORKDIR.value or default_workdir(config_flags.get_config_filename(flags.FLAGS["config"]))
  logging.info("workdir: %s", workdir)
  preempted = None
  with distributed.fail_fast():   # multi-process: a failing host exits now instead of hanging
    try:
      train.train_and_evaluate(_CONFIG.value, workdir)
    except (config_utils.ConfigError, config_utils.WorkdirError, FileNotFoundError,
            checkpointing.CheckpointError) as e:   # bad config/workdir/dataset/checkpoint
      logging.error("%s", e)
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except train.NonFiniteError as e:
      logging.error("%s", e)
      print(f"error: {e}", file=sys.stderr)
      sys.exit(3)
    except train.Preempted as e:   # every host stopped after the same step and saved it
      logging.warning("%s", e)
      print(str(e), file=sys.stderr, flush=True)
      preempted = e
  distributed.finalize()
  if preempted is not None:
    sys.exit(preempted.exit_code)


def dry_run():
  """Fake the pod host's devices on the CPU (before JAX starts its backends) and compile."""
  config = _CONFIG.value
  n = config.devices_per_host if config.devices_per_host > 0 else max(config.num_devices, 1)
  os.environ["XLA_FLAGS"] = " ".join(
      [f for f in os.environ.get("XLA_FLAGS", "").split()
       if not f.startswith("--xla_force_host_platform_device_count")]
      + [f"--xla_force_host_platform_device_count={n}"])
  import jax
  jax.config.update("jax_platforms", "cpu")
  from experiments.trm import dry_run as dry_run_lib
  try:
    report = dry_run_lib.run(config)
  except config_utils.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(f"Dry run of {config_flags.get_config_filename(flags.FLAGS['config'])}:\n"
        f"{dry_run_lib.format_report(report)}", flush=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, argv=config_utils.resolve_config_argv(sys.argv, EXPERIMENT_DIR))
