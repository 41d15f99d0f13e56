"""Kernel families of podlab's layers, chosen by one field (`kernels`) of each model and layer.

  "default"  plain JAX (jnp.einsum / lax.dot_general with float32 accumulation, jax.nn): the
             published models, the form a TPU or GPU compiles well; modules/layers.py.
  "xla_cpu"  the same functions in the forms XLA:CPU runs faster (custom VJPs, head-major attention,
             lean SwiGLU gradients, ...): modules/kernels/xla_cpu.py, which also decides which of
             them a model gets. Trainers choose it from `layout.cpu_tuning` (the TARGET platform).
"""

KERNELS = ("default", "xla_cpu")


def check(kernels: str, field: str = "kernels") -> str:
  """`kernels` itself when it names a family; else a ValueError naming `field`, value and fix."""
  if kernels not in KERNELS:
    raise ValueError(f"{field}={kernels!r}: use one of {KERNELS} ('xla_cpu' only for a program "
                     "compiled for the CPU)")
  return kernels
