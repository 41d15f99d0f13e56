"""A small masked-diffusion Dream trained on shakespeare_char: the model the speed-ups are measured on.

The validated base of the masked-diffusion experiment (experiments/diffucoder/train.py): every
field with its default, and the CPU recipe itself. A Dream-architecture model (modules/dream.py:
bidirectional attention, RoPE, GQA, SwiGLU, untied head, logits shifted by one) of 4 layers x 128
hidden, trained with the masked-diffusion objective on 256-character windows. docs/diffucoder.md
section 12 gives the objective, the evaluation and the measured run.

  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py \
      --workdir=workdirs/shakespeare_mdm
  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py:smoke --workdir=/tmp/m
  python -m experiments.diffucoder.main --config=configs/shakespeare_mdm.py --mode=eval \
      --workdir=/tmp/e --config.init_from=/ckpt/dream_folder      # a Hugging Face / converted folder

Arguments: "smoke": a 2-layer x 32 model, 64-character windows, 30 updates, 2 small evaluations
(tests; seconds).
"""

import os

import ml_collections

from experiments.common import config_utils
from modules import dream

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
DEFAULT_DATA_DIR = os.environ.get("TFDS_DATA_DIR", os.path.join(REPO_ROOT, "data", "tfds"))


def get_config(arg=None) -> ml_collections.ConfigDict:
  args = config_utils.parse_arg(arg, smoke=False)
  # The run section (experiments/common/config_utils.py): global_batch_size windows per micro-step
  # over all devices, total_steps updates.
  c = config_utils.run_config(seed=0, global_batch_size=32, total_steps=2500, log_every_steps=50,
                              checkpoint_every_steps=500, keep_checkpoints=2)
  # init_from (run section): a podlab workdir (fine-tuning), or for --mode=eval a Hugging Face Dream
  # folder (config.json + safetensors) or a folder written by `python -m experiments.diffucoder.
  # convert --out`; its architecture must equal config.model (the error names the overrides).

  # Data: a TFDS text builder (shakespeare_char, prepared on first use from the repository's
  # input_pipeline/data/tinyshakespeare/input.txt; manual_dir "" = that file).
  c.dataset = ml_collections.ConfigDict()
  c.dataset.name = "shakespeare_char"
  c.dataset.data_dir = DEFAULT_DATA_DIR
  c.dataset.manual_dir = ""
  c.dataset.builder_config = ""
  c.dataset.builder_kwargs = ml_collections.ConfigDict()
  c.dataset.prepare_if_missing = True
  c.dataset.train_split = "train"
  c.dataset.val_split = "val"
  c.seq_len = 128                 # L: characters per training window (and the largest canvas)

  # The model: modules.dream.DreamConfig fields. The vocabulary is the dataset's 65 characters plus
  # the mask token (mask_id, an id no character uses).
  c.model = ml_collections.ConfigDict(dream.DreamConfig(
      vocab_size=66, hidden_size=128, intermediate_size=352, num_layers=4, num_heads=4,
      num_kv_heads=2, dtype="float32", param_dtype="float32").to_dict())
  c.mask_id = 65

  # The masked-diffusion objective: t ~ U(eps, 1] per window, each position but the first masked
  # with probability t, cross-entropy on the masked positions weighted by 1 / t, divided by the
  # positions that can be masked (B (L - 1)): LLaDA's normalisation (docs/diffucoder.md section 12).
  c.eps = 1e-3

  # Optimisation: AdamW (decay on matrices only), global-norm clipping, linear warm-up then cosine
  # to min_lr at total_steps.
  c.lr = 2e-3
  c.min_lr = 2e-4
  c.warmup_steps = 100
  c.beta1 = 0.9
  c.beta2 = 0.99
  c.weight_decay = 0.1
  c.grad_clip = 1.0

  # Evaluation: the held-out masked-token loss on eval_windows windows of the val split at fixed
  # offsets, with t and the masks drawn once from eval_seed (the same positions in every run and
  # evaluation), next to the unigram baseline's loss on the same positions.
  c.eval_every_steps = 500
  c.eval_windows = 256
  c.eval_seed = 1234

  if args.smoke:
    c.model.hidden_size, c.model.intermediate_size, c.model.num_layers = 32, 64, 2
    c.seq_len = 64
    c.global_batch_size = 8
    c.total_steps = 30
    c.warmup_steps = 5
    c.log_every_steps = 10
    c.checkpoint_every_steps = 15
    c.eval_every_steps = 15
    c.eval_windows = 16
  return c
