"""experiments/tools/hlo_bytes.py: bytes per operation of an optimized HLO module, loop trips counted,
on a hand-written module and on programs the TPU compiler compiled."""

import jax
import jax.numpy as jnp
import pytest

from experiments.tools import hlo_bytes

MODULE = """HloModule m, entry_computation_layout={(f32[1024,256]{1,0}, f32[256]{0})->f32[1024,256]{1,0}}

%fused_add (p0: f32[1024,256], p1: f32[256]) -> f32[1024,256] {
  %p0 = f32[1024,256]{1,0} parameter(0)
  %p1 = f32[256]{0} parameter(1)
  %b = f32[1024,256]{1,0} broadcast(%p1), dimensions={1}
  ROOT %add = f32[1024,256]{1,0} add(%p0, %b), metadata={op_name="jit(f)/jvp(net)/h_3/mlp/add"}
}

%fused_rows (q0: f32[1024,256], q1: s32[]) -> f32[8,256] {
  %q0 = f32[1024,256]{1,0} parameter(0)
  %q1 = s32[]{:T(128)} parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[8,256]{1,0} dynamic-slice(%q0, %q1, %z), dynamic_slice_sizes={8,256}, metadata={op_name="jit(f)/transpose(jvp(net))/h_0/take"}
}

%body (t: (s32[], f32[1024,256])) -> (s32[], f32[1024,256]) {
  %t = (s32[], f32[1024,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[1024,256]{1,0} get-tuple-element(%t), index=1
  %m = f32[1024,256]{1,0} multiply(%x, %x), metadata={op_name="jit(f)/while/body/h_1/mul"}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[1024,256]{1,0}) tuple(%j, %m)
}

%cond (c: (s32[], f32[1024,256])) -> pred[] {
  %c = (s32[], f32[1024,256]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

ENTRY %main (a: f32[1024,256], b: f32[256]) -> f32[1024,256] {
  %a = f32[1024,256]{1,0} parameter(0)
  %b = f32[256]{0} parameter(1)
  %f = f32[1024,256]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_add, metadata={op_name="jit(f)/jvp(net)/h_3/mlp/add"}
  %k = s32[] constant(3)
  %g = f32[8,256]{1,0} fusion(%f, %k), kind=kLoop, calls=%fused_rows, metadata={op_name="jit(f)/transpose(jvp(net))/h_0/take"}
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024,256]{1,0}) tuple(%zero, %f)
  %w = (s32[], f32[1024,256]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[1024,256]{1,0} get-tuple-element(%w), index=1
}
"""

MB = 1024 * 256 * 4          # one f32[1024,256]


def test_bytes_per_operation_of_a_module():
  b = hlo_bytes.breakdown(MODULE)
  by = {op.name: op for op in b.ops}
  assert set(by) == {"f", "g", "m", "j"}                  # parameters, tuples, the while: no bytes
  assert by["f"].bytes == 2 * MB + 256 * 4                 # reads a and b, writes its result
  assert by["g"].bytes == 2 * 8 * 256 * 4 + 4              # a dynamic slice reads the rows it takes
  # The loop body on every trip; an operand used twice is read twice (XLA's cost analysis counts so).
  assert by["m"].trips == 5 and by["m"].bytes == 5 * 3 * MB
  assert b.total == pytest.approx(sum(op.bytes for op in b.ops))
  assert by["f"].source == "net/h_*/mlp/add" and by["g"].source == "net/h_*/take (bwd)"
  assert hlo_bytes.category_of(by["f"]) == "mlp"
  text = hlo_bytes.format_breakdown(b, top=2, compiler_bytes=b.total)
  assert "(100% of it)" in text and text.count("\n") == 5


def test_shape_bytes():
  assert hlo_bytes.shape_bytes("bf16[6,1024]{1,0:T(8,128)(2,1)}") == 6 * 1024 * 2
  assert hlo_bytes.shape_bytes("(f32[4]{0}, s32[], pred[8]{0})") == 16 + 4 + 8
  assert hlo_bytes.shape_bytes("f32[]") == 4


def test_against_the_tpu_compiler(libtpu):
  """An elementwise program: the split adds up to the compiler's figure exactly; a 5-trip loop of
  one: five times its body (the compiler's own count has the body once)."""
  from experiments.tools import tpu_target  # pylint: disable=g-import-not-at-top
  target = tpu_target.parse_target("v4-8")
  arg = jax.ShapeDtypeStruct((2048, 1024), jnp.float32)
  add = tpu_target.lower_step(lambda x, y: x + y, target, (arg, arg)).compile()
  cost = add.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  assert hlo_bytes.breakdown(add.as_text()).total == cost["bytes accessed"] == 3 * 2048 * 1024 * 4

  def loop(x):
    return jax.lax.fori_loop(0, 5, lambda i, v: jnp.sin(v) * 1.5, x)
  looped = tpu_target.lower_step(loop, target, (arg,)).compile()
  b = hlo_bytes.breakdown(looped.as_text())
  body = [op for op in b.ops if op.trips == 5]
  assert body and sum(op.bytes for op in body) >= 5 * 2 * 2048 * 1024 * 4
