r"""Masked-diffusion sampling for Dream / DiffuCoder: the reference `diffusion_generate`, in JAX.

The canvas is the (left-padded) prompt followed by `max_new_tokens` mask tokens; its length never
changes. Each of exactly `steps` iterations runs the model over the canvas, shifts the logits right by
one (position j reads the raw logit of j - 1), and unmasks some masked positions:

  timesteps  = linspace(1, eps=1e-3, steps + 1) in float32 (torch's two-sided linspace formula);
  t, s       = timesteps[i], timesteps[i + 1];  ratio_i = 1 - s / t  (float32; 1 at the last step)
  origin     : every masked position independently unmasks with probability ratio_i, with a token
               drawn from the filtered distribution;
  maskgit_plus / topk_margin / entropy: confidence = p(chosen token) / p1 - p2 / sum p log(p + 1e-10);
               k = floor(M * ratio_i), M = the batch-average number of masked positions; per row the k
               most confident masked positions unmask (or k sampled without replacement from
               softmax(confidence / alg_temp) when alg_temp > 0, by the Gumbel-top-k trick).
  token choice: logits / temperature (if > 0), top-p then top-k filtering (removed logits set to the
               dtype's minimum), probs = softmax; a draw from probs if temperature > 0 else argmax.
Unmasked tokens are never re-masked. Sampling runs in float32 on the model's (bfloat16) logits.

Beyond the reference (off by default; `sampler_options.SamplerOptions`): block-wise decoding of the
generated region in blocks of `block_length` (steps split evenly over blocks; each block has its
own schedule), with an approximate KV cache (Fast-dLLM, arXiv 2505.22618) refreshed at every block
start: `cache="prefix"` reuses the keys/values of everything before the block, `cache="dual"` also
those after it, and confidence-threshold parallel decoding (`threshold` > 0: per step, unmask the
most probable masked token of the block plus every masked token of the block whose probability is
>= threshold).
`block_algorithm` says how a block runs:
  "podlab" (default, `sampler_steps.block_fn`): the block-start forward is the block's first
    schedule step (k_0 tokens by the alg's confidence, or a threshold step), the cached forwards
    take the rest.
  "fast_dllm" (`sampler_steps.fast_dllm_block_fn`): Fast-dLLM's published Dream loop
    (NVlabs/Fast-dLLM dream/model/generation_utils_block.py), token for token on unpadded rows at
    temperature 0 (tests/test_diffucoder_fast_dllm.py): the block-start forward fixes the block's
    first position and nothing else; the schedule continues at step 1 on the cached forwards;
    without a threshold the confidence is entropy whatever `alg` is (validate() asks for
    alg="entropy"). Differences:
    the sampler runs in float32 (Fast-dLLM's in the model dtype, bf16 for the 7B); its threshold
    branch handles batch 1 (here each row independently); its cached calls give the model a padding
    mask sliced to another shape and positions 0..L-1 (it evaluates batch 1 unpadded; here padding
    is masked and positions restart per row, which is the same for unpadded rows); a threshold block
    stops after block_length cached forwards (Fast-dLLM never stops while the model predicts
    <|mask|>).

The code, by concern: this module holds the loop (`Runner`, `generate`, `Output`) and the canvas
helpers (`left_pad`, `positions_from_valid`, `cut_at_stop`); sampler_options.py the settings and
their checks; unmasking.py one step's arithmetic (the schedule, token choice, which positions
unmask); sampler_steps.py the per-device step and block programs the Runner compiles.

Shape glossary:
  B: batch (rows)     L: canvas length (prompt + max_new_tokens)    V: vocabulary size
  W: window (the positions a step reads: the canvas, a block, or a block plus its suffix)
  C: cached context length (keys/values reused from the block-start forward)

Synopsis (a toy "model" that always predicts token 7 with logit 5):

  import jax, jax.numpy as jnp
  from experiments.diffucoder import sampler_options, sampling

  def forward(params, tokens, valid, positions, context=None, return_kv=False):
    logits = jnp.zeros(tokens.shape + (16,)).at[..., 7].set(5.0)        # [B, L, V]
    return (logits, None) if return_kv else logits

  opts = sampler_options.SamplerOptions(steps=4, alg="entropy")
  prompt = jnp.array([[1, 2, 3]]); valid = jnp.ones((1, 3), bool)
  out = sampling.generate(forward, None, prompt, valid, jax.random.key(0), opts,
                          max_new_tokens=4, mask_id=15)
  assert out.tokens.tolist() == [[1, 2, 3, 7, 7, 7, 7]]               # [B, L]
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import PartitionSpec as P

from experiments.common import errors
from experiments.common import parallel
from experiments.diffucoder import model_sharding
from experiments.diffucoder import sampler_options
from experiments.diffucoder import sampler_steps
from experiments.diffucoder import unmasking


# ----------------------------------------------------------------------------------------------
# Canvas helpers.


def positions_from_valid(valid: jax.Array) -> jax.Array:
  """Per-row positions restarting at 0 at each row's first valid token; 0 on padding. [B, L]."""
  pos = jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1
  return jnp.where(valid, pos, 0)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int,
             length: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
  """Token lists -> (tokens [B, P] int32 left-padded with pad_id, valid [B, P] bool)."""
  longest = max(len(r) for r in rows)
  length = longest if length is None else length
  if length < longest:
    raise errors.BadInput(f"length={length} is shorter than the longest prompt ({longest} tokens). "
                     "Fix: pass length >= the longest prompt.")
  tokens = np.full((len(rows), length), pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    if len(r):
      tokens[i, length - len(r):] = np.asarray(r, np.int32)
      valid[i, length - len(r):] = True
  return tokens, valid


def cut_at_stop(tokens: Sequence[int], stop_ids: Sequence[int]) -> List[int]:
  """The generated ids up to (not including) the first stop id (eos / <|dlm_pad|> / ...)."""
  out = []
  stop = set(int(s) for s in stop_ids)
  for t in tokens:
    if int(t) in stop:
      break
    out.append(int(t))
  return out


# ----------------------------------------------------------------------------------------------
# The loop.


@dataclasses.dataclass
class Output:
  """What `generate` returns.

  tokens: [B, L] int32 host array, the final canvas (prompt + completion).
  forwards: model forward passes run per row (full or windowed).
  seconds: wall time of the loop, including compilation when the Runner meets a new shape.
  """
  tokens: np.ndarray
  forwards: int
  seconds: float


class Runner:
  """Compiles and caches the sampler's step functions for one (forward, options, mask id).

  `data_parallel=True` runs the step on every device (`parallel.compile_step`): params
  replicated, rows split over devices (B must be a multiple of the local device count), the batch
  average M taken over every device of every host. `mesh` (a `model_sharding.mesh_2d(data, model)`):
  model parallelism, one `model_sharding.shard_map_step` over the mesh: `forward` is the per-device
  program of a model split over `model_sharding.MODEL_AXIS` (e.g. `dream.dream_forward(config,
  model_sharding.MODEL_AXIS, model)`; its logits are the device's vocabulary block), `param_specs` the
  PartitionSpec tree of the params (already placed that way), rows split over `parallel.AXIS`
  (B a multiple of the data size), the sampler's softmax and argmax sharded over the vocabulary
  (`unmasking.vocab_sharded_sample_tokens`); the random keys are folded per data row group, so the
  model-parallel devices of a group draw the same numbers. Otherwise one `jax.jit` on the default
  device. Compiled functions are cached per (canvas shape, prompt length, block): one compile per
  shape.
  """

  def __init__(self, forward: sampler_steps.ForwardFn, opts: sampler_options.SamplerOptions, *,
               mask_id: int, data_parallel: bool = False, mesh: Optional[jax.sharding.Mesh] = None,
               param_specs: Any = None):
    if mesh is not None and (data_parallel or param_specs is None):
      raise ValueError("Runner: mesh needs param_specs and replaces data_parallel (rows are split "
                       "over the mesh's data axis)")
    self.forward = forward
    self.opts = opts
    self.mask_id = int(mask_id)
    self.data_parallel = data_parallel
    self.mesh = mesh
    self.param_specs = param_specs
    self._fns = {}

  def _compile(self, key, make):
    """make(axis_name, vocab_axis) -> the step; compiled once per key."""
    if key not in self._fns:
      if self.mesh is not None:
        self._fns[key] = self._mesh_step(make(parallel.AXIS, model_sharding.MODEL_AXIS),
                                         blocks=key[0] == "block")
      elif self.data_parallel:
        fn = make(parallel.AXIS, None)
        replicated = tuple(range(5, len(inspect.signature(fn).parameters)))
        self._fns[key] = parallel.compile_step(fn, state_in=(0,) + replicated)
      else:
        self._fns[key] = jax.jit(make(None, None))
    return self._fns[key]

  def _mesh_step(self, fn, blocks: bool):
    """shard_map of a step over the (data, model) mesh: params by `param_specs`, tokens / valid /
    positions / keys by rows over the data axis, the rest (ratios, block start) the same everywhere;
    a block step's forward count comes back per data group."""
    rest = len(inspect.signature(fn).parameters) - 5
    rows = P(parallel.AXIS)

    def per_device(params, tokens, valid, positions, keys, *args):
      out = fn(params, tokens, valid, positions, keys[0], *args)     # keys: [1] (this data group's)
      return (out[0], out[1][None]) if blocks else out

    return model_sharding.shard_map_step(
        per_device, self.mesh, in_specs=(self.param_specs, rows, rows, rows, rows) + (P(),) * rest,
        out_specs=(rows, rows) if blocks else rows)

  def _split_rows(self, x):
    """[B, ...] host array -> [devices, B / devices, ...] under data parallelism (B rows split over
    the mesh's data axis with a mesh)."""
    if self.mesh is not None:
      n = self.mesh.shape[parallel.AXIS]
      if x.shape[0] % n:
        raise errors.BadInput(f"batch of {x.shape[0]} rows is not a multiple of the mesh's {n} data "
                              f"groups. Fix: pad the batch to a multiple of {n} (generate.py does).")
      return jnp.asarray(x)
    if not self.data_parallel:
      return jnp.asarray(x)
    n = jax.local_device_count()
    if x.shape[0] % n:
      raise errors.BadInput(f"batch of {x.shape[0]} rows is not a multiple of the {n} local devices. "
                       f"Fix: pad the batch to a multiple of {n} (generate.py does).")
    return np.asarray(x).reshape((n, x.shape[0] // n) + x.shape[1:])

  def _keys(self, key):
    if self.mesh is not None:
      return jnp.stack([jax.random.fold_in(key, d) for d in range(self.mesh.shape[parallel.AXIS])])
    if not self.data_parallel:
      return key
    return jnp.stack([jax.random.fold_in(key, int(d)) for d in parallel.device_indices()])

  def generate(self, params, prompt: np.ndarray, prompt_valid: np.ndarray, key: jax.Array, *,
               max_new_tokens: int, progress: Optional[Callable[[int], None]] = None) -> Output:
    """Runs the sampler on a left-padded batch. prompt, prompt_valid: [B, P]."""
    opts = self.opts
    opts.validate(max_new_tokens)
    prompt = np.asarray(prompt, np.int32)
    prompt_valid = np.asarray(prompt_valid, bool)
    b, start = prompt.shape
    tokens = np.concatenate([prompt, np.full((b, max_new_tokens), self.mask_id, np.int32)], axis=1)
    valid = np.concatenate([prompt_valid, np.ones((b, max_new_tokens), bool)], axis=1)
    positions = np.asarray(positions_from_valid(jnp.asarray(valid)))
    shape = tokens.shape
    x, v, p = (self._split_rows(a) for a in (tokens, valid, positions))
    forwards = 0
    t0 = time.perf_counter()
    if opts.block_length == 0:
      ratios = unmasking.transfer_ratios(opts.steps, opts.eps)
      fn = self._compile(("plain", shape, start), lambda axis, vocab: sampler_steps.plain_step_fn(
          self.forward, opts, mask_id=self.mask_id, start=start, axis_name=axis, vocab_axis=vocab))
      for i in range(opts.steps):
        x = fn(params, x, v, p, self._keys(jax.random.fold_in(key, i)), jnp.float32(ratios[i]))
        forwards += 1
        if progress is not None:
          progress(1)
    else:
      num_blocks = max_new_tokens // opts.block_length
      fast = opts.block_algorithm == "fast_dllm"
      spb = max(opts.steps // num_blocks, 1) if (opts.threshold == 0 or fast) else 1
      ratios = jnp.asarray(unmasking.transfer_ratios(spb, opts.eps))
      make_block = sampler_steps.fast_dllm_block_fn if fast else sampler_steps.block_fn
      if start < 1 and opts.cache != "none":
        raise errors.BadInput("block-wise KV caching needs a prompt of at least one token. "
                         "Fix: give a non-empty prompt or use cache='none'.")
      for blk in range(num_blocks):
        # Prefix windows shrink block by block (one compile per block); the others share one shape.
        static_blk = blk if opts.cache == "prefix" else None
        fn = self._compile(("block", shape, start, static_blk),
                           lambda axis, vocab, b=static_blk: make_block(
                               self.forward, opts, mask_id=self.mask_id, start=start, block_index=b,
                               axis_name=axis, vocab_axis=vocab))
        x, n = fn(params, x, v, p, self._keys(jax.random.fold_in(key, blk)), ratios,
                  jnp.int32(start + blk * opts.block_length))
        forwards += int(np.max(np.asarray(n)))
        if progress is not None:
          progress(1)
    out = np.asarray(x).reshape(shape)
    return Output(tokens=out, forwards=forwards, seconds=time.perf_counter() - t0)


def generate(forward: sampler_steps.ForwardFn, params: Any, prompt, prompt_valid, key: jax.Array,
             opts: sampler_options.SamplerOptions, *, max_new_tokens: int, mask_id: int,
             data_parallel: bool = False, mesh: Optional[jax.sharding.Mesh] = None,
             param_specs: Any = None) -> Output:
  """One-shot convenience around `Runner` (compiles each call; keep a Runner to reuse compiles)."""
  return Runner(forward, opts, mask_id=mask_id, data_parallel=data_parallel, mesh=mesh,
                param_specs=param_specs).generate(
      params, np.asarray(prompt), np.asarray(prompt_valid), key, max_new_tokens=max_new_tokens)
