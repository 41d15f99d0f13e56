"""Pod config: GPT-2 124M (configs/gpt2_124m.py) or any recipe on a TPU v4-32 (16 chips, 4 per host).

Argument recipe=NAME picks the recipe (gpt2_124m, shakespeare_char, shakespeare_char_cpu); the global
micro-batch is rounded up to a multiple of the 16 devices when needed (a deviation, printed by
--dry_run).

  python -m experiments.nanogpt.main --config=configs/v4_32.py --dry_run
  launch/pod.sh NAME --bucket B --module experiments.nanogpt.main --config configs/v4_32.py
"""

import importlib

from experiments.common import config_utils


def get_config(arg=None):
  args = config_utils.parse_arg(arg, recipe="gpt2_124m")
  try:
    recipe = importlib.import_module(f"experiments.nanogpt.configs.{args.recipe}")
  except ModuleNotFoundError:
    raise config_utils.ConfigError("arg:recipe", args.recipe, "no such recipe",
                                   "use gpt2_124m, shakespeare_char or shakespeare_char_cpu") from None
  c = recipe.get_config()
  c.num_devices = 16
  c.devices_per_host = 4
  c.global_batch_size = -(-c.global_batch_size // 16) * 16
  c.target = "v4-32"                             # `--dry_run` compiles for it (libtpu)
  c.dataset.prepare_if_missing = True
  return c
