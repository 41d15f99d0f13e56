"""Tests for experiments/common/config_utils.py.

  .venv/bin/python -m pytest tests/test_config_utils.py -q
"""
import os
import pathlib

from absl import flags
import ml_collections
from ml_collections import config_flags
import pytest

from experiments.common import config_utils

_CONFIG_SOURCE = '''
import ml_collections

def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.name = "{name}"
  config.arg = arg
  config.lr = 0.1
  return config
'''


@pytest.fixture
def layout(tmp_path, monkeypatch) -> pathlib.Path:
  """A repo root (the cwd) with experiments/trm/configs/small.py."""
  configs = tmp_path / "experiments" / "trm" / "configs"
  configs.mkdir(parents=True)
  (configs / "small.py").write_text(_CONFIG_SOURCE.format(name="experiment"))
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_path_relative_to_cwd_wins(layout):
  (layout / "configs").mkdir()
  (layout / "configs" / "small.py").write_text(_CONFIG_SOURCE.format(name="cwd"))
  argv = ["main.py", "--config=configs/small.py", "--config.lr=2"]
  assert config_utils.resolve_config_argv(argv, "experiments/trm") == argv


def test_falls_back_to_experiment_dir_and_keeps_arg_suffix(layout):
  exp = os.path.join("experiments", "trm")
  got = config_utils.resolve_config_argv(
      ["main.py", "--config=configs/small.py:tiny,bf16", "--config.lr=2", "--workdir=/tmp/w"], exp)
  assert got == ["main.py", f"--config={exp}/configs/small.py:tiny,bf16", "--config.lr=2",
                 "--workdir=/tmp/w"]
  # Two-token and single-dash forms; anything after a bare `--` is positional and left alone.
  got = config_utils.resolve_config_argv(
      ["main.py", "--config", "configs/small.py", "-config", "configs/small.py:x", "--",
       "--config=configs/small.py"], exp)
  assert got == ["main.py", "--config", f"{exp}/configs/small.py", "-config",
                 f"{exp}/configs/small.py:x", "--", "--config=configs/small.py"]


def test_resolved_argv_parses_with_config_flags(layout):
  argv = config_utils.resolve_config_argv(
      ["main.py", "--config=configs/small.py:tiny", "--config.lr=0.5"],
      layout / "experiments" / "trm")
  flag_values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  assert (holder.value.name, holder.value.arg, holder.value.lr) == ("experiment", "tiny", 0.5)


def test_missing_config_names_both_places_tried(layout, capsys):
  with pytest.raises(SystemExit) as exc:
    config_utils.resolve_config_argv(["main.py", "--config=configs/nope.py:a"], "experiments/trm")
  assert exc.value.code == 2                                  # bad input
  message = capsys.readouterr().err.strip()
  assert "configs/nope.py" in message
  assert str(layout / "configs" / "nope.py") in message
  assert str(layout / "experiments" / "trm" / "configs" / "nope.py") in message
  assert "Fix:" in message and "\n" not in message


def _reference() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      "seed": 0,
      "model": {"hidden_size": 512, "num_layers": 2, "act": {"halt_max_steps": 16}},
      "optim": {"learning_rate": 1e-4, "weight_decay": 0.1},
      "extra_kwargs": {},  # Open: anything goes.
  })


def test_valid_config_passes_even_when_locked_or_frozen():
  config = _reference()
  config.model.hidden_size = 256
  config.extra_kwargs = {"anything": 1}
  config.lock()
  config_utils.validate_config(config, _reference())
  config_utils.validate_config(ml_collections.FrozenConfigDict(config), _reference())
  config_utils.validate_config({"seed": 3, "model": {"num_layers": 4}}, _reference())  # Subset.


def test_misspelled_nested_field_names_field_value_and_fix():
  config = _reference().to_dict()
  config["model"]["act"]["halt_max_step"] = 8
  with pytest.raises(config_utils.ConfigError) as exc:
    config_utils.validate_config(ml_collections.ConfigDict(config), _reference())
  assert str(exc.value) == ("config.model.act.halt_max_step=8: unknown field. "
                            "Fix: did you mean 'model.act.halt_max_steps'?")
  assert isinstance(exc.value, ValueError)
  assert (exc.value.field, exc.value.value) == ("model.act.halt_max_step", 8)


def test_several_unknown_fields_stay_on_one_line():
  config = {"sed": 1, "optim": {"learnig_rate": 0.1, "zzz": 2}}
  with pytest.raises(config_utils.ConfigError) as exc:
    config_utils.validate_config(config, _reference())
  message = str(exc.value)
  assert "\n" not in message
  assert message == ("config.sed=1: unknown field. Fix: did you mean 'seed'? "
                     "(also unknown: optim.learnig_rate, optim.zzz)")


def test_unrelated_name_lists_valid_fields():
  with pytest.raises(config_utils.ConfigError,
                     match=r"config.optim.zzz=2: .*valid fields of optim are "
                           r"\['learning_rate', 'weight_decay'\]"):
    config_utils.validate_config({"optim": {"zzz": 2}}, _reference())


def test_config_error_message():
  err = config_utils.ConfigError("batch_size", 7, "must be divisible by 4 devices", "use 8")
  assert str(err) == "config.batch_size=7: must be divisible by 4 devices. Fix: use 8"
