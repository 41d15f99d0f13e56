"""Config helpers shared by podlab experiments: `--config` path resolution and field validation.

Synopsis, in an experiment's `main.py` (run from the repo root as
`python -m experiments.trm.main --config=configs/v4_64.py:small --config.lr=1e-3`):

  import os, sys
  from absl import app
  from ml_collections import config_flags
  from experiments.common import config_utils

  _CONFIG = config_flags.DEFINE_config_file("config")

  def main(argv):
    config_utils.validate_config(_CONFIG.value, reference=default_config())  # or raise ConfigError
    ...

  if __name__ == "__main__":
    app.run(main, argv=config_utils.resolve_config_argv(sys.argv, os.path.dirname(__file__)))

`resolve_config_argv` lets `configs/v4_64.py` mean `experiments/trm/configs/v4_64.py` when no such
file exists relative to the working directory. `validate_config` turns a misspelled field into a
one-line error with the closest valid name, e.g.
`config.optim.learnig_rate=0.001: unknown field. Fix: did you mean 'optim.learning_rate'?`.
"""
from __future__ import annotations

import difflib
import os
import sys
from typing import Any, Iterator, Mapping, Optional, Sequence

import ml_collections

from experiments.common import errors
from experiments.common import layout
from experiments.common import parallel

ConfigError = errors.ConfigError     # the errors' home is experiments/common/errors.py
WorkdirError = errors.WorkdirError


def _split_config_value(value: str) -> tuple[str, str]:
  """`'path.py:arg'` -> `('path.py', ':arg')`, splitting at the first ':' as config_flags does."""
  path, sep, arg = value.partition(":")
  return path, sep + arg


def _resolve_path(value: str, experiment_dir: str, flag: str) -> str:
  path, suffix = _split_config_value(value)
  if not path or os.path.exists(path):
    return value
  candidate = os.path.join(experiment_dir, path)
  if os.path.exists(candidate):
    return candidate + suffix
  print(f"error: --{flag}={value}: config file {path!r} not found; tried {os.path.abspath(path)} "
        f"(from the working directory) and {os.path.abspath(candidate)} (in the experiment "
        f"directory). Fix: pass a path that exists relative to the working directory or to "
        f"{experiment_dir}.", file=sys.stderr)
  raise SystemExit(errors.EXIT_BAD_INPUT)


def resolve_config_argv(
    argv: Sequence[str], experiment_dir: str | os.PathLike[str], flag: str = "config",
) -> list[str]:
  """Returns `argv` with the `--config` file path resolved; see the module doc.

  A path (the part before an optional `:arg`) that exists from the working directory is kept as
  given; otherwise `experiment_dir/path` is used if it exists; otherwise the program exits
  (`SystemExit`) with a message naming both places tried. Handles `--config=path`,
  `--config path` and the single-dash forms; `--config.field=value` overrides and everything after
  a bare `--` are left alone.

  Args:
    argv: the full command line, `sys.argv` (program name first).
    experiment_dir: the experiment's directory, e.g. `os.path.dirname(__file__)`.
    flag: the name given to `config_flags.DEFINE_config_file`.
  """
  experiment_dir = os.fspath(experiment_dir)
  out = list(argv)
  names = (f"--{flag}", f"-{flag}")
  i = 1
  while i < len(out):
    token = out[i]
    if token == "--":
      break
    name, eq, value = token.partition("=")
    if name in names:
      if eq:
        out[i] = f"{name}={_resolve_path(value, experiment_dir, flag)}"
      elif i + 1 < len(out):
        out[i + 1] = _resolve_path(out[i + 1], experiment_dir, flag)
        i += 1
    i += 1
  return out


def _items(node: Any) -> Optional[Iterator[tuple[str, Any]]]:
  """Key/value pairs of a config node (ConfigDict, FrozenConfigDict or dict), else None."""
  if isinstance(node, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict, Mapping)):
    return iter(node.items())
  return None


def _unknown_fields(config: Any, reference: Any, prefix: str) -> Iterator[tuple[str, Any, str]]:
  """Yields `(dotted field, value, fix)` for every field of `config` absent from `reference`."""
  ref_items = _items(reference)
  cfg_items = _items(config)
  if ref_items is None or cfg_items is None:
    return
  ref = dict(ref_items)
  if not ref:  # An empty reference dict is open: any keys allowed (e.g. free-form kwargs).
    return
  for key, value in cfg_items:
    field = f"{prefix}{key}"
    if key in ref:
      yield from _unknown_fields(value, ref[key], field + ".")
      continue
    close = difflib.get_close_matches(str(key), [str(k) for k in ref], n=1, cutoff=0.6)
    if close:
      fix = f"did you mean '{prefix}{close[0]}'?"
    else:
      fix = f"valid fields{' of ' + prefix[:-1] if prefix else ''} are {sorted(map(str, ref))}"
    yield field, value, fix


def validate_config(config: Any, reference: ml_collections.ConfigDict) -> None:
  """Raises `ConfigError` if `config` has a field (at any depth) that `reference` lacks.

  `reference` is the experiment's full default config. Nested dicts are compared recursively; an
  empty dict in `reference` accepts any keys. Neither argument is modified, so locked and frozen
  configs are fine. The error is one line: field, value and the closest valid name as the fix;
  further unknown fields are listed after it.
  """
  problems = list(_unknown_fields(config, reference, ""))
  if not problems:
    return
  field, value, fix = problems[0]
  if len(problems) > 1:
    fix += f" (also unknown: {', '.join(p[0] for p in problems[1:])})"
  raise ConfigError(field, value, "unknown field", fix)


_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def parse_arg(arg: Optional[str], **defaults: Any) -> ml_collections.ConfigDict:
  """Typed `get_config(arg)` arguments, big_vision style: "batch=6144,local" -> ConfigDict.

  Each key must be one of `defaults`; its value is converted to the default's type ("true"/"false" or
  a bare key for booleans). An unknown key or a value of the wrong type raises ConfigError.
  """
  out = ml_collections.ConfigDict(dict(defaults))
  for item in filter(None, (arg or "").split(",")):
    key, has_value, raw = item.partition("=")
    key = key.strip()
    if key not in defaults:
      close = difflib.get_close_matches(key, list(defaults), n=1)
      raise ConfigError(f"arg:{key}", raw, "unknown config argument",
                        f"use one of {sorted(defaults)}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    default = defaults[key]
    try:
      if isinstance(default, bool):
        value = True if not has_value else {"true": True, "false": False, "1": True, "0": False}[raw.lower()]
      elif default is None:
        value = raw
      else:
        value = type(default)(raw)
    except (KeyError, ValueError):
      raise ConfigError(f"arg:{key}", raw, f"expected {_KIND.get(type(default), 'a value')}",
                        f"write e.g. {key}={default}") from None
    out[key] = value
  return out


# --------------------------------------------------------------------------------------------------
# The run section every experiment's base config starts from.

NONFINITE_POLICIES = ("stop", "skip", "continue")


def run_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The fields the trainer (experiments/common/trainer.py) reads, with their defaults.

  An experiment's base config starts from it and adds its own sections (data, model, optimiser);
  `overrides` set the experiment's defaults (e.g. the batch, `epochs`).
  """
  c = ml_collections.ConfigDict()
  c.seed = 0
  layout.add_fields(c)                # the batch (experiments/common/layout.py)
  c.total_steps = -1                  # updates; -1: the experiment derives it (epochs, max_iters)
  # Start: the workdir's own newest checkpoint, else `init_from`, else random init. init_from: a
  # podlab workdir / checkpoint (weights only: fine-tuning), or a file of the experiment's reference
  # format (TRM .pt, nanoGPT ckpt.pt, GPT-2 / Dream Hugging Face folders).
  c.init_from = ""
  # Logging, evaluation and checkpoints.
  c.log_every_steps = 100
  c.final_eval = True
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.async_checkpoints = True
  c.restore_fallback = False          # newest checkpoint unreadable -> set aside, restore the previous
  c.nonfinite = "stop"                # NaN/Inf loss, gradient or update: "stop" | "skip" | "continue"
  c.allow_config_change = False       # resume with a config that differs from the workdir's first run
  c.profile_steps = 0                 # > 0: a profiler trace of that many steps into <workdir>/profile
  c.peak_flops = -1.0                 # per device, for MFU; -1 = the device table / measured on a CPU
  # Hardware. num_devices > 0: the JAX device count the config is written for (another machine
  # stops with the fix); devices_per_host: the pod's chips per host (the dry run's layout); target:
  # the gcloud accelerator type of a pod config (`--dry_run` compiles for it), "" = this machine.
  c.num_devices = -1
  c.devices_per_host = -1
  c.target = ""
  # CPU-only speed-ups (the glibc heap setting, the experiments' CPU matmul forms): on when the
  # program is compiled for a CPU; never part of a TPU program whatever this says.
  c.cpu_tuning = True
  # Where the state lives (experiments/common/parallel.py): "replicated" (every device holds all
  # of it: data parallelism) or "fsdp" (parameters, gradients and optimizer state split over the
  # devices of all hosts; docs/architecture.md). The numbers are the same to float32 rounding.
  c.sharding = "replicated"
  # With "fsdp": JAX devices per data group (> 1: the weights are also split over the group's
  # devices, the `model` mesh axis, where the experiment names a split: Dream; docs/sharding.md).
  c.model_parallel = 1
  for key, value in overrides.items():
    c[key] = value
  return c


def validate_run_config(config: Any) -> None:
  """Value checks of the run section (raises ConfigError naming the field, the value and the fix)."""
  for field in ("log_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    if int(config[field]) <= 0:
      raise ConfigError(field, config[field], "must be positive", "use e.g. 100")
  if config.nonfinite not in NONFINITE_POLICIES:
    raise ConfigError("nonfinite", config.nonfinite, f"must be one of {NONFINITE_POLICIES}",
                      "use 'stop' (end the run at the first NaN/Inf step, keeping the last "
                      "checkpoint)")
  if config.sharding not in parallel.SHARDINGS:
    raise ConfigError("sharding", config.sharding, f"must be one of {parallel.SHARDINGS}",
                      "use 'replicated' (data parallelism) or 'fsdp' (state split over the devices, "
                      "for models whose state does not fit one device)")
  m = config.get("model_parallel", 1)
  if not isinstance(m, int) or m < 1:
    raise ConfigError("model_parallel", m, "must be a positive integer", "use 1 (no model axis)")
  if m > 1 and config.sharding != "fsdp":
    raise ConfigError("model_parallel", m, f"splits the weights over a model axis of the 'fsdp' "
                      f"layout, and sharding is {config.sharding!r}",
                      "add --config.sharding=fsdp, or use model_parallel=1")
  if int(config.profile_steps) < 0:
    raise ConfigError("profile_steps", config.profile_steps, "must be >= 0", "use 0 (off) or 5")


def flat_hparams(config: Any) -> dict:
  """The config as a flat {"a.b": scalar} dict (the hparams writer, the config fingerprint)."""
  out = {}

  def walk(prefix, node):
    for k, v in node.items():
      if isinstance(v, (dict, ml_collections.ConfigDict)):
        walk(f"{prefix}{k}.", v)
      else:
        out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
  walk("", config.to_dict() if hasattr(config, "to_dict") else config)
  return out
