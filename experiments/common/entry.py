r"""The `main` of every podlab program: flags, config loading, distributed init, one-line errors.

Every experiment's main.py is a few lines around `run` (training programs) and other programs
(sampling, generation) use `run_program`; all share these flags:

  --config=PATH[:ARG]      the config file (resolved from the working directory, then the
                           experiment's folder) and its typed argument, e.g. configs/v4_64.py:batch=6144
  --config.FIELD=VALUE     overrides, e.g. --config.lr=3e-4
  --workdir=DIR            checkpoints, TensorBoard, results (default workdirs/<config name>)
  --mode=train|eval        eval: evaluate the workdir's checkpoint or --config.init_from, no training
  --dry_run [--target=T]   compile the run's programs for T (a gcloud accelerator type such as
                           v4-64, or cpu: this machine with the pod host's device count) and print
                           memory, FLOPs and predicted speed; trains nothing
  --check_only             load the config with its overrides and run the experiment's checks, then
                           print `config ok: FILE` and exit 0 (2 with one line when it fails);
                           starts nothing (no devices, data or workdir): launch/pod.sh's pre-ship check
  --coordinator_address, --num_processes, --process_id   multi-process runs off TPU (or PODLAB_*)
  --cache_dir=DIR|gs://...   where weights named on the Hub go, shared by the pod's hosts
                           (PODLAB_HUB_CACHE; default: gs://B/.../hub beside a gs:// TFDS_DATA_DIR,
                           else the Hugging Face cache: input_pipeline/hub.py)
  --verbosity=1 (or PODLAB_VERBOSE=1)   every library's log lines (default: podlab's own only)

Exit codes (experiments/common/errors.py): 0 done; 2 bad input (config, workdir, data, checkpoint:
one line on stderr naming the field or file, the value and the fix); 3 a non-finite step
(config.nonfinite = "stop"); 143 / 130 preempted by SIGTERM / SIGINT after saving (rerun the same
command to resume). Only podlab's own error types are turned into one line; anything else is a bug
and keeps its traceback.

Synopsis (experiments/<name>/main.py):

  import os
  from experiments.common import entry
  from experiments.trm import train

  if __name__ == "__main__":
    entry.run(os.path.dirname(os.path.abspath(__file__)), train.TRM)
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any, Callable, Optional

from experiments.common import console

console.quiet_native_logs()     # before TensorFlow, XLA or libtpu load (they read it once)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments.common import config_utils  # noqa: E402
from experiments.common import distributed  # noqa: E402
from experiments.common import errors  # noqa: E402
from experiments.common import host_malloc  # noqa: E402
from experiments.common import lazy_import  # noqa: E402
from experiments.common import trainer  # noqa: E402
from input_pipeline import hub  # noqa: E402

# The TPU planning tools (experiments/tools/), loaded only by --dry_run: a run does not import them.
dry_run = lazy_import.module("experiments.tools.dry_run")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Where checkpoints, TensorBoard metrics and results go (local path or "
                               "gs://). Default: workdirs/<config name>.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train: train and evaluate; eval: evaluate the workdir's newest checkpoint "
                          "(or --config.init_from) without training.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "Compile the run's programs for --target and print memory, FLOPs and the "
                             "predicted speed; trains nothing.")
_TARGET = flags.DEFINE_string("target", None,
                              "With --dry_run: a gcloud accelerator type (v4-8 ... v4-4096, v5litepod-N "
                              "or v5e-N, v5p-N, v6e-N, v2-8, v3-8) or 'cpu' (this machine, the pod "
                              "host's device count as fake CPU devices). Default: the config's target.")
_SEARCH_BATCH = flags.DEFINE_bool("search_batch", False,
                                  "With --dry_run: find the largest per-device batch that fits the "
                                  "target and its predicted speed.")
_CHECK_ONLY = flags.DEFINE_bool("check_only", False,
                                "Load the config with its overrides, run the experiment's checks and "
                                "exit (0: `config ok: PATH`); starts no devices, data or workdir.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 for multi-process runs off TPU.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (off TPU).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (off TPU).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None,
                                 "Where weights named on the Hub (gpt2-xl, owner/name) are fetched "
                                 "to: a folder or gs:// every host reads (sets PODLAB_HUB_CACHE).")


def config() -> Any:
  """The parsed --config (with its overrides)."""
  return _CONFIG.value


def dry_run_target() -> Optional[str]:
  """With --dry_run: the --target value ("" when not given); None without --dry_run. For programs
  of `run_program` that compile instead of running (generate.py)."""
  return (_TARGET.value or "") if _DRY_RUN.value else None


def config_filename() -> str:
  return config_flags.get_config_filename(flags.FLAGS["config"])


def default_workdir(config_arg: str) -> str:
  """workdirs/<config file name without .py>."""
  name = os.path.splitext(os.path.basename(config_arg.split(":")[0]))[0]
  return os.path.join("workdirs", name)


def workdir() -> str:
  """--workdir, or workdirs/<config name>."""
  return _WORKDIR.value or default_workdir(config_filename())


def fail(message: str, code: int = errors.EXIT_BAD_INPUT) -> None:
  """Prints `error: message` as one line on stderr and exits with `code`."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


# --------------------------------------------------------------------------------------------------
# Config loading that reports the user's mistakes in one line (ml_collections would re-raise them as
# `type(e)(traceback)`, which loses the message of podlab's errors).

def _config_arg(argv) -> Optional[str]:
  for i, token in enumerate(argv[1:], 1):
    if token == "--":
      break
    name, eq, value = token.partition("=")
    if name in ("--config", "-config"):
      return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
  return None


_LOADED: dict = {}       # the config as _check_config_file loaded it (for "did you mean" hints)


def _check_config_file(argv) -> None:
  """Loads the --config file and calls its get_config(arg) once; one line for a syntax error, a bad
  argument or a ConfigError (ml_collections loads it again afterwards, as usual)."""
  value = _config_arg(argv)
  if not value:
    return
  path, _, arg = value.partition(":")
  if not os.path.isfile(path):
    return            # resolve_config_argv already reported a missing file
  with open(path, encoding="utf-8") as f:
    source = f.read()
  try:
    code = compile(source, path, "exec")
  except SyntaxError as e:
    line = (e.text or "").strip()
    fail(f"--config={value}: {path}:{e.lineno}: {e.msg}: {line!r}. Fix: correct that line")
  scope = {"__name__": "podlab_config_check", "__file__": path}
  try:
    exec(code, scope)  # pylint: disable=exec-used
    get_config = scope.get("get_config")
    if get_config is None:
      fail(f"--config={value}: {path} defines no get_config(). Fix: add `def get_config(arg=None)`")
    _LOADED["config"] = get_config(arg) if arg else get_config()
  except errors.USER_ERRORS as e:
    fail(f"--config={value}: {e}", errors.exit_code(e))
  except TypeError as e:
    if "get_config()" in str(e):
      fail(f"--config={value}: {path}'s get_config takes no argument ({e}). Fix: drop ':{arg}'")
    raise


def _unknown_override(argv, fields: list, error: BaseException) -> str:
  """The `--config.KEY` of argv that names no field of the loaded config (`fields`, flat "a.b"
  keys); without the loaded config, the one whose last key part ml_collections' error names."""
  overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
  if fields:
    nodes = {f.rsplit(".", i)[0] for f in fields for i in range(f.count(".") + 1)}
    unknown = [o for o in overrides if o[len("--config."):] not in nodes]
  else:
    unknown = [o for o in overrides if repr(o.rsplit(".", 1)[-1]) in str(error)]
  return (unknown or overrides or ["--config.?"])[0]


def _parse_flags(argv):
  """absl's flag parsing (app.run's `flags_parser`) with a one-line error for bad flags."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e).strip().splitlines()
    text = " ".join(line.strip() for line in message if line.strip())
    if "Error whilst parsing config file" in text:       # ml_collections' wrapper: keep the cause
      text = message[-1].strip()
    fail(f"{text}. Fix: see `--helpfull` for the flags, configs/base.py for the config fields")
  except AttributeError as e:        # ml_collections: an override of a field the config lacks
    fields = []
    if _LOADED.get("config") is not None and hasattr(_LOADED["config"], "to_dict"):
      fields = list(config_utils.flat_hparams(_LOADED["config"]))
    field = _unknown_override(argv, fields, e)
    close = difflib.get_close_matches(field[len("--config."):], fields, n=1, cutoff=0.6)
    fix = (f"did you mean --config.{close[0]}?" if close else
           "use a field of the config (its configs/base.py lists them all)")
    fail(f"{field}: the config has no such field. Fix: {fix}")


# --------------------------------------------------------------------------------------------------
# Programs.

def _check_only(experiment: Any = None) -> None:
  """--check_only: the config loaded (flag parsing did it) and, for a training program, checked as
  the trainer checks it; one line and the exit code on failure, else `config ok: PATH`, exit 0."""
  try:
    if experiment is not None:
      trainer.check_config(experiment, config())
  except errors.USER_ERRORS as e:
    fail(str(e), errors.exit_code(e))
  print(f"config ok: {config_filename().partition(':')[0]}", flush=True)   # the file, no :arg
  sys.exit(0)

def _report(e: BaseException) -> None:
  """One line for podlab's errors, the traceback for anything else (a bug)."""
  if isinstance(e, errors.Preempted):
    print(str(e), file=sys.stderr, flush=True)       # the run finalizes and exits after it
  else:
    console.last_line(f"error: {e}")


def _keep_heap_early(cfg: Any) -> None:
  """The glibc heap setting (experiments/common/host_malloc.py) before JAX starts its CPU threads,
  so that it also covers per-step scratch buffers over 64 MiB; only when the run's program is
  compiled for the CPU (config.cpu_tuning and JAX's platform is cpu). The trainer applies it (again,
  idempotently) once the layout is known."""
  platforms = (jax.config.jax_platforms or "").split(",")
  if cfg is not None and bool(getattr(cfg, "get", lambda *_: False)("cpu_tuning", False)) and (
      platforms[0].strip() == "cpu"):
    host_malloc.keep_heap()


def _run_guarded(fn: Callable[[], Any], cfg: Any = None) -> None:
  """Distributed init, `fn()` with podlab's errors as exit codes, then finalize."""
  if _CACHE_DIR.value:
    os.environ[hub.ENV_STORE] = _CACHE_DIR.value
  console.quiet_libraries()
  distributed.choose_platforms()
  _keep_heap_early(cfg)
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  code = 0
  with distributed.fail_fast():   # multi-process: a failing host exits now instead of hanging
    try:
      fn()
    except errors.USER_ERRORS as e:
      _report(e)
      code = errors.exit_code(e)
      if not isinstance(e, errors.Preempted):
        sys.exit(code)
  distributed.finalize()
  if code:
    sys.exit(code)


def run_program(experiment_dir: str, fn: Callable[[], Any], *,
                required: tuple = ("config",)) -> None:
  """A podlab program other than training (a sampler, a generator): the shared flags, config
  checks, distributed init and exit codes around `fn()`, which reads `entry.config()`."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CHECK_ONLY.value:
      _check_only()
    _run_guarded(fn)

  argv = config_utils.resolve_config_argv(sys.argv, experiment_dir)
  _check_config_file(argv)
  for name in required:
    flags.mark_flag_as_required(name)
  app.run(main, argv=argv, flags_parser=_parse_flags)


def run(experiment_dir: str, make_experiment: Callable[[], Any]) -> None:
  """A training program: --mode=train (default), --mode=eval, or --dry_run (see the module doc)."""

  def program():
    experiment = make_experiment()
    if _DRY_RUN.value:
      print(dry_run.run(experiment, config(), target=_TARGET.value,
                        search_batch=_SEARCH_BATCH.value, name=config_filename()), flush=True)
      return
    wd = workdir()
    logging.info("workdir: %s", wd)
    if _MODE.value == "eval":
      trainer.evaluate(experiment, config(), wd)
    else:
      trainer.train_and_evaluate(experiment, config(), wd)

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CHECK_ONLY.value:
      _check_only(make_experiment())
    if _DRY_RUN.value:
      dry_run.prepare(config(), _TARGET.value)     # fake CPU devices before JAX starts a backend
      _run_guarded(program)
    else:
      _run_guarded(program, config())

  argv = config_utils.resolve_config_argv(sys.argv, experiment_dir)
  _check_config_file(argv)
  flags.mark_flag_as_required("config")
  app.run(main, argv=argv, flags_parser=_parse_flags)
