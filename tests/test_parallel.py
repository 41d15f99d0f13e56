"""parallel.compile_step: pmap's program for a replicated state, with XLA compiler options
(`cpu_features.CPU_DOTS_ONLY`: TRM's split_reduce CPU form)."""

import concurrent.futures
import re

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import cpu_features
from experiments.common import parallel


def _step(w, x):                                              # w [D, D] replicated, x [B, D]
  h = x @ w                                                   # [B, D]
  return w, jnp.sum(jnp.square(h + x), axis=-1)               # RMSNorm's sum of squares: [B]


def _ynn_fusions_with_a_reduce(text: str):
  """For each YNNPACK fusion of an optimized HLO module: whether its computation has a reduce."""
  out = []
  for name in re.findall(r"calls=(%[\w.\-]+)[^\n]*__ynn_fusion", text):
    body = re.search(re.escape(name) + r" .*?\n}", text, re.S).group(0)
    out.append(" reduce(" in body)
  return out


def _inputs(batch=256):
  n = jax.local_device_count()
  x = np.random.default_rng(0).standard_normal((n, batch, 64)).astype(np.float32)
  w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32) / 8
  return w, x


def test_cpu_dots_only_keeps_reductions_out_of_the_matmul_fusions():
  w, x = _inputs()
  p = parallel.compile_step(_step, state_in=(0,), out_axes=(None, 0))
  default = _ynn_fusions_with_a_reduce(p.lower(w, x).compile().as_text())
  dots_only = _ynn_fusions_with_a_reduce(
      p.lower(w, x).compile(compiler_options=cpu_features.CPU_DOTS_ONLY).as_text())
  # XLA 0.10.2's default fuses the dot with the reduce after it; the option leaves single dots.
  assert True in default, default
  assert dots_only and True not in dots_only, dots_only


def test_a_step_with_compiler_options_compiles_once_per_signature_and_keeps_the_values():
  w, x = _inputs()
  p = parallel.compile_step(_step, state_in=(0,), out_axes=(None, 0),
                         compiler_options=cpu_features.CPU_DOTS_ONLY)
  w_out, s = p(w, x)
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  np.testing.assert_allclose(np.asarray(s), np.sum((x64 @ w64 + x64) ** 2, axis=-1), rtol=1e-5)
  np.testing.assert_array_equal(parallel.unreplicate(w_out), w)
  p(w_out, x)
  assert len(p._compiled) == 1                                  # pylint: disable=protected-access
  _, s_small = p(w, x[:, :8])                                   # another shape: a second compile
  assert len(p._compiled) == 2 and s_small.shape == (x.shape[0], 8)  # pylint: disable=protected-access
  shapes = jax.eval_shape(p, w, x)                              # traced: the plain pmapped function
  assert shapes[1].shape == (x.shape[0], 256)
  assert len(p._compiled) == 2                                  # pylint: disable=protected-access
  plain = parallel.compile_step(_step, state_in=(0,), out_axes=(None, 0))
  assert plain.compiler_options == {}


def test_the_replicated_program_is_pmaps():
  """jit(shard_map) of the step over the 1-D mesh: pmap's own lowering in JAX 0.10, so a replicated
  run computes what a pmapped one did, bit for bit."""
  w, x = _inputs(batch=8)
  ours = parallel.compile_step(_step, state_in=(0,), out_axes=(None, 0)).lower(w, x).as_text()
  theirs = jax.pmap(_step, axis_name=parallel.AXIS, in_axes=(None, 0),
                    out_axes=(None, 0)).lower(w, x).as_text()
  strip = lambda text: re.sub(r"module @\S+|@jit_\w+|jit\(\w+\)|\"[^\"]*\.py\":\d+:\d+", "", text)  # noqa: E731
  assert strip(ours) == strip(theirs)


def test_precompile_from_shapes_serves_the_first_call():
  w, x = _inputs()
  p = parallel.compile_step(_step, state_in=(0,), out_axes=(None, 0),
                         compiler_options=cpu_features.CPU_DOTS_ONLY)
  specs = (jax.ShapeDtypeStruct(w.shape, w.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
  lowered = p.precompile(*specs)                                # compiles in a background thread
  assert lowered.out_info[1].shape == (x.shape[0], 256)
  _, s = p(w, x)                                                # waits for it: no second compile
  assert len(p._compiled) == 1                                  # pylint: disable=protected-access
  assert not isinstance(next(iter(p._compiled.values())),       # pylint: disable=protected-access
                        concurrent.futures.Future)
  x64, w64 = x.astype(np.float64), w.astype(np.float64)
  np.testing.assert_allclose(np.asarray(s), np.sum((x64 @ w64 + x64) ** 2, axis=-1), rtol=1e-5)
