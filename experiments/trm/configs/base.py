"""The validated base config of the TRM experiment: every field, with the reference's defaults.

Recipes import it and override a few fields; `experiments.trm.train.validate_config` checks a config
against it (unknown or misspelled fields, inconsistent values) before anything is compiled.

  python -m experiments.trm.main --config=configs/base.py --config.dataset.manual_dir=PATH

(base alone is the reference's default hyper-parameters on Sudoku-Extreme; use a recipe instead.)
"""

import os

import ml_collections

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_DATA_DIR = os.environ.get("TFDS_DATA_DIR", os.path.join(REPO_ROOT, "data", "tfds"))


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # Data. `name` is a TFDS builder of input_pipeline.datasets; builder_kwargs select its options.
  c.dataset = ml_collections.ConfigDict()
  c.dataset.name = "sudoku_extreme"
  c.dataset.data_dir = DEFAULT_DATA_DIR          # local path or gs://bucket/tfds
  c.dataset.manual_dir = ""                      # where the public CSV/JSON files are (real datasets)
  c.dataset.builder_config = ""                  # TFDS builder config name ("" = the builder's default)
  c.dataset.builder_kwargs = ml_collections.ConfigDict()
  c.dataset.prepare_if_missing = False           # prepare offline on first use (generated data only)
  c.dataset.group_sampling = True                # materialised augmentations (ARC): one per task and
                                                 # epoch, as the reference; False = uniform over rows
  c.dataset.train_split = "train"
  c.dataset.test_split = "test"

  # Model (modules.trm.TRMConfig; seq_len, vocab_size and num_puzzle_identifiers come from the dataset).
  c.model = ml_collections.ConfigDict()
  c.model.puzzle_emb_ndim = 512                  # E; 0 disables the puzzle-embedding prefix
  c.model.puzzle_emb_len = 16
  c.model.hidden_size = 512
  c.model.num_heads = 8
  c.model.expansion = 4.0
  c.model.H_cycles = 3
  c.model.L_cycles = 6
  c.model.L_layers = 2
  c.model.pos_encodings = "rope"
  c.model.mlp_t = False
  c.model.rms_norm_eps = 1e-5
  c.model.rope_theta = 10000.0
  c.model.forward_dtype = "bfloat16"
  c.model.halt_max_steps = 16
  c.model.halt_exploration_prob = 0.1
  c.shard_puzzle_table = True                   # podlab: rows split over all devices, not replicated
  c.model.remat = False                          # podlab option: recompute activations (same numbers)

  # Optimisation (reference section 4).
  c.global_batch_size = 768
  c.epochs = 100000
  c.total_steps = -1                             # -1: int(epochs * train examples / global batch)
  c.lr = 1e-4
  c.lr_min_ratio = 1.0
  c.lr_warmup_steps = 2000
  c.beta1 = 0.9
  c.beta2 = 0.95
  c.weight_decay = 0.1
  c.puzzle_emb_lr = 1e-2
  c.puzzle_emb_weight_decay = 0.1
  c.ema = False                                  # every recipe sets True
  c.ema_rate = 0.999

  # Evaluation. The reference evaluates the full test set every eval interval (epochs); eval_subset > 0
  # evaluates a fixed seeded subsample during training instead, and the full test set at the end.
  c.eval_interval_epochs = 10000
  c.eval_every_steps = -1                        # > 0 overrides eval_interval_epochs
  c.eval_subset = 0
  c.final_eval = True

  # Logging and checkpoints.
  c.log_every_steps = 100
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.async_checkpoints = True
  c.restore_fallback = False      # podlab: newest checkpoint unreadable -> set aside, restore the previous
  c.nonfinite = "stop"            # podlab: NaN/Inf loss or gradient: "stop" | "skip" the step | "continue"

  # Hardware. num_devices > 0 states the JAX device count the recipe was written for; a different
  # machine fails with a message saying how to override. devices_per_host > 0 lets
  # `main.py --dry_run` compile one host's step here with that many fake CPU devices.
  c.num_devices = -1
  c.devices_per_host = -1                        # the pod's chips per host (used by --dry_run)
  return c
