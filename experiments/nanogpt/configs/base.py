"""The validated base config of the nanoGPT experiment: every field, nanoGPT's train.py defaults.

Recipes import it and override a few fields; `experiments.nanogpt.train.validate_config` checks a
config against it (unknown or misspelled fields, inconsistent values) before anything is compiled.

  python -m experiments.nanogpt.main --config=configs/shakespeare_char_cpu.py

(base alone is GPT-2 124M on shakespeare_char; use a recipe.)
"""

import os

import ml_collections

from experiments.common import config_utils

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_DATA_DIR = os.environ.get("TFDS_DATA_DIR", os.path.join(REPO_ROOT, "data", "tfds"))


def get_config() -> ml_collections.ConfigDict:
  # The run section (seed, batch, start, logging, checkpoints, non-finite policy, hardware, CPU tuning):
  # experiments/common/config_utils.py run_config, with nanoGPT's defaults. global_batch_size is the
  # micro-batch over all devices of all hosts (nanoGPT's batch_size x its DDP world size);
  # grad_accum micro-steps per update (nanoGPT's gradient_accumulation_steps / world size).
  c = config_utils.run_config(seed=1337, global_batch_size=12, grad_accum=40, log_every_steps=10,
                              checkpoint_every_steps=2000, keep_checkpoints=2)
  # Random draws. "torch": nanoGPT's own, torch.manual_seed(seed) replayed in numpy
  # (experiments/nanogpt/torch_rng.py): the same initial weights and the same batch windows in the
  # same order as nanoGPT's train.py (one global stream; each host takes its rows). "stateless"
  # (podlab's): Haiku init from jax.random.key(seed), windows drawn in tf.data from Philox keys
  # (seed, host, stream, step), independent per host, no replay on resume.
  c.rng = "torch"
  # init_from (run section) may also name a GPT-2 folder (config.json + model.safetensors; read by
  # experiments/nanogpt/hf_gpt2.py) or its Hub name: nanoGPT's init_from='gpt2*' (openai-community/
  # ...) or owner/name[@revision], downloaded once by the run's first step (input_pipeline/hub.py).
  # The folder gives n_layer, n_head, n_embd, vocab_size and bias;
  # model.block_size crops its positions (nanoGPT's crop_block_size); model.dropout and dtype apply.
  # A nanoGPT ckpt.pt or a podlab workdir works too (its model must be this config's).

  # Data: a TFDS text builder of input_pipeline.datasets (shakespeare_char or text_corpus).
  c.dataset = ml_collections.ConfigDict()
  c.dataset.name = "shakespeare_char"
  c.dataset.data_dir = DEFAULT_DATA_DIR
  # Folder of the text file; "" = the repository's Tiny Shakespeare (input_pipeline/data/
  # tinyshakespeare/input.txt, the file nanoGPT's prepare.py downloads). Prepared on first use.
  c.dataset.manual_dir = ""
  c.dataset.builder_config = ""
  c.dataset.builder_kwargs = ml_collections.ConfigDict()
  c.dataset.prepare_if_missing = True
  c.dataset.train_split = "train"
  c.dataset.val_split = "val"

  # Model (modules.gpt.GPTConfig; vocab_size -1 = the dataset's).
  c.model = ml_collections.ConfigDict()
  c.model.n_layer = 12
  c.model.n_head = 12
  c.model.n_embd = 768
  c.model.block_size = 1024
  c.model.bias = False
  c.model.dropout = 0.0
  c.model.vocab_size = -1
  c.model.dtype = "float32"                       # the reference's CPU run; "bfloat16": its GPU runs
  c.model.activations = "autocast"                # with bfloat16: torch.autocast's activation dtypes
  # GELU: "auto" = a GPT-2 folder's config.json (OpenAI's say "gelu_new": the tanh form), exact
  # (erf, nanoGPT's) for nanoGPT checkpoints and new models; "exact" = nanoGPT's choice for GPT-2
  # folders too (its from_pretrained); "tanh". The run's model line says which.
  c.model.gelu = "auto"
  # (modules.gpt.ACTIVATIONS; "float32": only the matmul operands in bfloat16, a podlab option)
  # remat: recompute each block's activations in the backward pass instead of storing them (the
  # same numbers, about a third more compute, one block's activations in memory instead of
  # n_layer's). A podlab option, not nanoGPT's (which stores them); off by default. GPT-2 XL
  # finetuning needs it to fit a v5e-8 (docs/sharding.md).
  c.model.remat = False
  # The training forward's attention kernel (modules/kernels/dispatch.py): "auto" = splash on a
  # TPU, cudnn on a GPU (bfloat16), xla on a CPU (the reference's formulation); or name one.
  c.model.attention = "auto"
  # The head and loss: "auto" = one fused TPU kernel on a TPU (no [B, T, V] logits in HBM,
  # modules/kernels/fused_ce.py), "xla" elsewhere (the logits, then the cross-entropy); or name one.
  c.model.loss = "auto"
  # (config.cpu_tuning, run section: on a CPU target the weight gradients run as row-major matmuls,
  # XLA CPU's fast path; float32 results are the same sums in another order. modules/layers.py.)

  # Optimisation (nanoGPT train.py); the batch: global_batch_size and grad_accum (run section).
  c.max_iters = 600000                            # performs max_iters + 1 updates (iters 0..max_iters)
  c.lr = 6e-4
  c.min_lr = 6e-5
  c.warmup_iters = 2000
  c.lr_decay_iters = 600000
  c.decay_lr = True
  c.beta1 = 0.9
  c.beta2 = 0.95
  c.weight_decay = 0.1
  c.grad_clip = 1.0                               # global-norm clipping; 0 disables

  # Evaluation: mean loss over eval_iters random batches per split every eval_interval iterations
  # (before that iteration's update, iteration 0 included).
  c.eval_interval = 2000
  c.eval_iters = 200
  return c
