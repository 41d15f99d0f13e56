"""The numerics podlab's layers and their kernel families (modules/kernels) share: `dot` with
float32 accumulation, and activations rounded as PyTorch rounds them: `silu` (torch's F.silu on
bfloat16, bit for bit), `to_precision` (a rounding XLA keeps), `swiglu_activation`, and
`float32_inside` (any elementwise function computed in float32 and rounded once, whose backward
pass keeps only its low-precision input). `modules.layers` exports the activations.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp


def dot(a: jax.Array, b: jax.Array, contract_b: int) -> jax.Array:
  """a [N, K] times b ([K, M] for contract_b=0, [M, K] for 1) -> float32 [N, M]."""
  return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                             preferred_element_type=jnp.float32)


def silu(x: jax.Array) -> jax.Array:
  """x * sigmoid(x) computed in float32 and rounded once to x's dtype: PyTorch's `F.silu` on a
  bfloat16 tensor, bit for bit (torch computes reduced-precision activations in float32).

  `jax.nn.silu` on bfloat16 rounds twice: XLA rounds the sigmoid to bfloat16, then the product;
  that equals torch's value for only ~61% of standard-normal inputs. Rounding once is also faster
  on XLA:CPU: one float32 pass instead of two bfloat16 ones (docs/benchmarks.md, "silu").
  Identical to `jax.nn.silu` in float32. The gradient of a bfloat16 silu is torch's SiLU backward,
  g * s * (1 + x * (1 - s)) in float32 with s = sigmoid(x), from g rounded to bfloat16 by
  reduce_precision, which XLA keeps in a jitted program (docs/trm.md section 1).
  """
  x32 = x.astype(jnp.float32)
  if x.dtype == jnp.float32:
    return x32 * jax.nn.sigmoid(x32)
  return _silu_rounded(x)


def to_precision(x32: jax.Array, dtype) -> jax.Array:
  """float32 x32 rounded to `dtype`'s precision (e.g. bfloat16), still float32. reduce_precision,
  which XLA keeps: a float32 -> bfloat16 -> float32 round trip it may drop under
  `xla_allow_excess_precision` (on by default), leaving the value unrounded in a jitted program."""
  fi = jnp.finfo(dtype)
  return jax.lax.reduce_precision(x32, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)


@jax.custom_vjp
def _silu_rounded(x: jax.Array) -> jax.Array:                   # x: bfloat16 (or float16)
  x32 = x.astype(jnp.float32)
  return (x32 * jax.nn.sigmoid(x32)).astype(x.dtype)


def _silu_rounded_fwd(x):
  return _silu_rounded(x), x


def _silu_rounded_bwd(x, g):
  # torch's SiLU backward in float32 from the incoming gradient as a `x.dtype` value: upstream,
  # autodiff's gradient of silu(gate) * up is g * up in bfloat16, whose rounding XLA would drop on
  # its way into this float32 formula (jitted: 25% of d gate one ulp off torch's).
  x32 = x.astype(jnp.float32)
  s = jax.nn.sigmoid(x32)
  g32 = to_precision(g.astype(jnp.float32), x.dtype)
  return ((g32 * s * (1.0 + x32 * (1.0 - s))).astype(x.dtype),)


_silu_rounded.defvjp(_silu_rounded_fwd, _silu_rounded_bwd)


def swiglu_activation(gate_up: jax.Array, *, axis: int = -1) -> jax.Array:
  """silu(gate) * up for gate|up halves of `gate_up` along `axis` ([..., 2F] -> [..., F])."""
  gate, up = jnp.split(gate_up, 2, axis=axis)
  return silu(gate) * up


def float32_inside(fn: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
  """`fn` (elementwise, float32 -> float32) applied to x's values in float32 and rounded once to
  x's dtype, as torch computes a reduced-precision activation (opmath float32).

  For a low-precision x (bfloat16) the backward pass keeps x alone and recomputes fn's derivative
  in float32 from it, with the incoming gradient as an x.dtype value (rounded by `to_precision`,
  which XLA keeps), the result rounded once to x.dtype: torch's backward formula for such an
  activation. Autodiff would keep float32 intermediates of fn (on a TPU the compiler wrote a float32
  copy of GPT-2's [B T, 4C] MLP activation per layer, twice the bytes of the bfloat16 input). A
  float32 x is plain autodiff of fn.
  """
  @jax.custom_vjp
  def rounded(x):
    return fn(x.astype(jnp.float32)).astype(x.dtype)

  def rounded_fwd(x):
    return rounded(x), x

  def rounded_bwd(x, g):
    _, vjp = jax.vjp(fn, x.astype(jnp.float32))
    g32 = to_precision(g.astype(jnp.float32), x.dtype)
    return (vjp(g32)[0].astype(x.dtype),)

  rounded.defvjp(rounded_fwd, rounded_bwd)

  @functools.wraps(fn)
  def apply(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.float32:
      return fn(x)
    return rounded(x)

  return apply
