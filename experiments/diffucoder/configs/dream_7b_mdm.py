"""Dream 7B (7.6B parameters) trained with configs/shakespeare_mdm.py's masked-diffusion objective
on a TPU v5p-8: the train step of finetuning Dream-v0-Base-7B, its state split over the chips.

  python -m experiments.diffucoder.main --config=configs/dream_7b_mdm.py --dry_run
  python -m experiments.diffucoder.main --config=configs/dream_7b_mdm.py \
      --config.init_from=/ckpt/Dream-v0-Base-7B --workdir=workdirs/dream_7b_mdm
  python -m experiments.diffucoder.main --config=configs/dream_7b_mdm.py:slice=v4-32 --dry_run

What changes from the base recipe: the model is modules/dream.py's DREAM_7B (28 layers x 3584,
28/4 heads, SwiGLU 18944, vocab 152064) with float32 parameters and AdamW moments and bfloat16
matmuls; mask_id is Dream's <|mask|> (151666, what its config.json says); windows of 512 tokens,
8 per micro-step x 4 accumulation steps (32 windows, 16,384 tokens per update); AdamW at lr 1e-5
(warm-up 20, cosine to 1e-6 over 1000 updates); `sharding = "fsdp"`: parameters, gradients and
AdamW moments (7.6B x 16 bytes = 122 GB in all) split over the 4 chips (docs/sharding.md).
`--config.init_from` takes the Hugging Face folder (or a converted one, or a podlab workdir).

Argument `slice`: "v5p-8" (the default, above) or "v4-32": 16 chips on 4 hosts as 4 data groups of
4 (`model_parallel = 4`: each weight also split over a group's chips, Megatron style; fsdp over the
groups), two windows per group x 4 accumulation steps (the same 32 windows per update).

The data is the base recipe's shakespeare_char (character ids 0..64 fed as token ids): enough to
size and run the step, not text in Dream's own Qwen2 BPE, which this repository does not prepare.
"""

from experiments.common import config_utils
from experiments.diffucoder.configs import shakespeare_mdm
from modules import dream


def get_config(arg=None):
  args = config_utils.parse_arg(arg, slice="v5p-8")
  if args.slice not in ("v5p-8", "v4-32"):
    raise config_utils.ConfigError("arg:slice", args.slice, "not a slice of this recipe",
                                   "use slice=v5p-8 or slice=v4-32")
  c = shakespeare_mdm.get_config()
  model = dream.DREAM_7B.to_dict()
  model["param_dtype"] = "float32"               # float32 master weights; bfloat16 matmuls (dtype)
  c.model.update(model)
  c.mask_id = 151666                             # <|mask|> of Dream's vocabulary
  c.seq_len = 512
  c.global_batch_size = 8
  c.grad_accum = 4
  c.lr, c.min_lr, c.warmup_steps = 1e-5, 1e-6, 20
  c.total_steps = 1000
  c.log_every_steps = 10
  c.checkpoint_every_steps = 100
  c.eval_every_steps = 250
  c.eval_windows = 64
  c.num_devices = 4
  c.devices_per_host = 4
  c.target = "v5p-8"                             # `--dry_run` compiles for it (libtpu)
  c.sharding = "fsdp"
  if args.slice == "v4-32":
    c.num_devices, c.target, c.model_parallel = 16, "v4-32", 4
  return c
