"""The settings of Dream / DiffuCoder's masked-diffusion sampler (`SamplerOptions`), checked.

Every field is static (a change recompiles); `validate` raises a ConfigError naming the field, its
value and the fix. What each setting does: experiments/diffucoder/sampling.py (the algorithm) and
the field list below.

Synopsis:

  from experiments.diffucoder import sampler_options
  opts = sampler_options.SamplerOptions(steps=64, alg="entropy", block_length=32, cache="dual")
  opts.validate(max_new_tokens=256)      # a ConfigError naming generate.<field> when unusable
  assert opts.filtering == (0.0, None, None)
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from experiments.common import config_utils

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
CACHES = ("none", "prefix", "dual")
BLOCK_ALGORITHMS = ("podlab", "fast_dllm")


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
  """Sampler settings (all static: a change recompiles).

  Fields:
    steps: diffusion steps (forward passes of the plain sampler).
    alg: one of ALGS.
    temperature: 0 = greedy (argmax); > 0 divides the logits and samples.
    top_p: nucleus filtering; None or >= 1 disables.
    top_k: top-k filtering; None or 0 disables.
    alg_temp: 0 = take the k most confident positions; > 0 samples them from softmax(conf / alg_temp).
    eps: the last timestep of linspace(1, eps, steps + 1).
    block_length: 0 = the reference (whole generated region at once); > 0 = block-wise decoding.
    cache: "none", "prefix" or "dual" (approximate KV cache refreshed at each block start; needs
      block_length > 0).
    threshold: 0 = off; > 0 = confidence-threshold parallel decoding within blocks (needs
      block_length > 0; a block then takes as many steps as it needs, at most block_length).
    block_algorithm: how a block is decoded (block_length > 0): "podlab" (`sampler_steps.block_fn`:
      the block's schedule starts on the block-start forward) or "fast_dllm"
      (`sampler_steps.fast_dllm_block_fn`: Fast-dLLM's published Dream loop, exactly: the
      block-start forward fixes the block's first position, the schedule continues on the cached
      forwards, entropy confidence without a threshold).
  """
  steps: int = 256
  alg: str = "entropy"
  temperature: float = 0.0
  top_p: Optional[float] = None
  top_k: Optional[int] = None
  alg_temp: float = 0.0
  eps: float = 1e-3
  block_length: int = 0
  cache: str = "none"
  threshold: float = 0.0
  block_algorithm: str = "podlab"

  def validate(self, max_new_tokens: int, prefix: str = "generate") -> None:
    """Raises ConfigError (naming `prefix.field`, the value and the fix) for unusable settings."""
    E = config_utils.ConfigError
    if max_new_tokens < 1:
      raise E(f"{prefix}.max_new_tokens", max_new_tokens, "must be >= 1", "ask for some tokens")
    if self.steps < 1:
      raise E(f"{prefix}.steps", self.steps, "must be >= 1",
              f"use e.g. steps = max_new_tokens = {max_new_tokens}")
    if self.alg not in ALGS:
      raise E(f"{prefix}.alg", self.alg, "unknown algorithm", f"use one of {', '.join(ALGS)}")
    if self.temperature < 0:
      raise E(f"{prefix}.temperature", self.temperature, "must be >= 0", "use 0 for greedy")
    if self.top_p is not None and not 0 < self.top_p:
      raise E(f"{prefix}.top_p", self.top_p, "must be in (0, 1]", "use e.g. 0.95, or 1 to disable")
    if self.top_k is not None and self.top_k < 0:
      raise E(f"{prefix}.top_k", self.top_k, "must be >= 0", "use 0 to disable")
    if self.alg_temp < 0:
      raise E(f"{prefix}.alg_temp", self.alg_temp, "must be >= 0", "use 0 for top-k selection")
    if not 0 < self.eps < 1:
      raise E(f"{prefix}.eps", self.eps, "must be in (0, 1)", "use the reference's 1e-3")
    if self.cache not in CACHES:
      raise E(f"{prefix}.cache", self.cache, "unknown cache", f"use one of {', '.join(CACHES)}")
    if not 0 <= self.threshold <= 1:
      raise E(f"{prefix}.threshold", self.threshold, "must be in [0, 1]", "use 0 (off) or e.g. 0.9")
    if self.block_length < 0:
      raise E(f"{prefix}.block_length", self.block_length, "must be >= 0", "use 0 (off) or e.g. 32")
    if self.block_algorithm not in BLOCK_ALGORITHMS:
      raise E(f"{prefix}.block_algorithm", self.block_algorithm, "unknown block algorithm",
              f"use one of {', '.join(BLOCK_ALGORITHMS)}")
    if self.block_length == 0:
      if self.block_algorithm != "podlab":
        raise E(f"{prefix}.block_algorithm", self.block_algorithm,
                "Fast-dLLM's loop decodes blocks and block_length is 0",
                "set --config.generate.block_length=32 (Fast-dLLM's) and cache=prefix or dual")
      if self.cache != "none":
        raise E(f"{prefix}.cache", self.cache, "the KV cache is block-wise and block_length is 0",
                "set --config.generate.block_length=32 (a divisor of max_new_tokens)")
      if self.threshold > 0:
        raise E(f"{prefix}.threshold", self.threshold,
                "parallel decoding works per block and block_length is 0",
                "set --config.generate.block_length=32 (a divisor of max_new_tokens)")
      return
    if max_new_tokens % self.block_length:
      raise E(f"{prefix}.block_length", self.block_length,
              f"does not divide max_new_tokens={max_new_tokens}",
              "use a divisor of max_new_tokens (e.g. 32 for 256)")
    num_blocks = max_new_tokens // self.block_length
    if (self.threshold == 0 or self.block_algorithm == "fast_dllm") and self.steps % num_blocks:
      raise E(f"{prefix}.steps", self.steps,
              f"not divisible by the {num_blocks} blocks of {self.block_length} tokens",
              f"use a multiple of {num_blocks}")
    if self.block_algorithm == "fast_dllm" and self.threshold == 0:
      if self.steps // num_blocks < 2:
        raise E(f"{prefix}.steps", self.steps,
                f"gives {self.steps // num_blocks} step per block: Fast-dLLM's loop then leaves all "
                "but the block's first position masked",
                f"use steps >= {2 * num_blocks} (2 per block), or a threshold")
      if self.alg != "entropy":
        raise E(f"{prefix}.alg", self.alg,
                "Fast-dLLM's block loop ranks by entropy whatever alg says (without a threshold)",
                "set alg=entropy, or block_algorithm=podlab for another confidence")
    if self.alg == "origin" and self.threshold > 0:
      raise E(f"{prefix}.alg", self.alg, "threshold decoding ranks tokens by confidence",
              "use maskgit_plus/topk_margin/entropy, or threshold=0")

  @property
  def filtering(self) -> Tuple[float, Optional[float], Optional[int]]:
    return self.temperature, self.top_p, self.top_k
