"""DiffuCoder's rows of `make tpu-check` (experiments/tools/tpu_check.py finds this module by name).

Dream 7B's masked-diffusion train step on a v5p-8 (configs/dream_7b_mdm.py, fsdp) and a v4-32
(`:slice=v4-32`: fsdp x model_parallel=4); and DiffuCoder / Dream 7.6B sampling (tools/tpu_plan.py:
one sampler step at canvas 512) on a v2-8, v3-8, v5e-8 and v4-8 at batch 1, 8 and 32, with greedy
decoding and with the instruct configs' sampler (temperature 0.4, top_p 0.95), each at the smallest
model-parallel degree that fits (the rows of the degrees tried before it say by how much they do
not).

  from experiments.diffucoder.tools import tpu_rows
  tpu_rows.PROGRAM_CHECKS[0].label           # 'diffucoder 7b sampling greedy v2-8'
"""

from __future__ import annotations

from experiments.diffucoder import train
from experiments.diffucoder.tools import tpu_plan
from experiments.tools import tpu_rows

CHECKS = [
    # Dream 7B's masked-diffusion train step (what its finetuning runs), state split over a v5p-8.
    tpu_rows.Check("diffucoder dream_7b mdm fsdp", train.MaskedDiffusion,
                   "experiments.diffucoder.configs.dream_7b_mdm", None),
    # The same step on a v4-32: fsdp over 8 data groups x the model axis over each group's 4 chips.
    tpu_rows.Check("diffucoder dream_7b mdm fsdp x model_parallel=4", train.MaskedDiffusion,
                   "experiments.diffucoder.configs.dream_7b_mdm", "slice=v4-32"),
]

PROGRAM_CHECKS = [
    tpu_rows.ProgramCheck(
        f"diffucoder 7b sampling {sampler} {t}",
        lambda log, t=t, sampler=sampler: tpu_plan.run([t], tpu_plan.BATCHES, log=log,
                                                       samplers=(sampler,)))
    for sampler in tpu_plan.SAMPLERS for t in tpu_plan.TARGETS]
