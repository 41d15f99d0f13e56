"""The validated base config of the TRM experiment: every field, with the reference's defaults.

Recipes import it and override a few fields; `experiments.trm.train.validate_config` checks a config
against it (unknown or misspelled fields, inconsistent values) before anything is compiled.

  python -m experiments.trm.main --config=configs/base.py

(base alone is the reference's default hyper-parameters on Sudoku-Extreme; use a recipe instead.)
"""

import os

import ml_collections

from experiments.common import config_utils

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_DATA_DIR = os.environ.get("TFDS_DATA_DIR", os.path.join(REPO_ROOT, "data", "tfds"))


def get_config() -> ml_collections.ConfigDict:
  # The run section (seed, batch, start, logging, checkpoints, non-finite policy, hardware):
  # experiments/common/config_utils.py run_config, with TRM's defaults.
  c = config_utils.run_config(seed=0, global_batch_size=768, log_every_steps=100,
                              checkpoint_every_steps=1000, keep_checkpoints=3)

  # Data. `name` is a TFDS builder of input_pipeline.builders; builder_kwargs select its options.
  c.dataset = ml_collections.ConfigDict()
  c.dataset.name = "sudoku_extreme"
  c.dataset.data_dir = DEFAULT_DATA_DIR          # local path or gs://bucket/tfds
  c.dataset.manual_dir = ""                      # the public CSV/JSON files offline ("" = download)
  c.dataset.builder_config = ""                  # TFDS builder config name ("" = the builder's default)
  c.dataset.builder_kwargs = ml_collections.ConfigDict()
  c.dataset.prepare_if_missing = True            # on first use (downloads the public files)
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
  # Attention models' kernel (modules/kernels/dispatch.py): "auto" = splash on a TPU, cudnn on a
  # GPU (bfloat16), xla on a CPU; or name one. The same function (float32 rounding).
  c.model.attention = "auto"
  # The SwiGLU MLPs' kernel: "auto" = one fused TPU kernel on a TPU (no [N, 2F] gate|up in HBM,
  # modules/kernels/fused_mlp.py), "xla" elsewhere; or name one.
  c.model.mlp = "auto"
  # podlab option: the training step's forward and backward passes run on this many slices of each
  # device's batch in turn, gradients summed: the same step in about a slice's activation memory
  # (weight gradients summed in another order). 1 = the reference's whole batch at once; 0 =
  # automatic: on a CPU target the count experiments/trm/cpu_tuning.py `batch_slices` picks
  # (2, 4, 8, ... slices of a measured activation budget); 1 on a TPU or GPU.
  c.batch_slices = 0

  # Optimisation (docs/trm.md section 4). global_batch_size (run section) = the reference's 768.
  c.epochs = 100000
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
  # Evaluators of the test pass (experiments/trm/evaluators.py): act_metrics always; the ARC recipes
  # add arc_pass_at_k (pass@1..1000 and submission.json).
  c.evaluators = "act_metrics"

  # total_steps (run section): -1 = int(epochs * train examples / global_batch_size).
  return c
