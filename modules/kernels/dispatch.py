"""The one seam between podlab's layers and their kernels: `ops(kernels, dtype, attention)`.

A layer asks for its operations here and calls them; it never imports a backend. Two choices make
an `Ops`, each one field of a model's config (big_vision/maxtext style: a name picks an
implementation at one place):

  kernels    "default": plain XLA (modules/kernels/xla.py), what a TPU or GPU compiles well.
             "xla_cpu": the same functions in XLA:CPU's faster forms (modules/kernels/xla_cpu.py,
             whose `forms(kernels, dtype)` decides which; the trainers choose it for a CPU target,
             `layout.cpu_tuning`).
  attention  "xla": softmax(q k^T) v written in XLA (the [B, H, Sq, Sk] scores in memory; on CPU
             xla_cpu's head-major form when `kernels` says so).
             "splash": the Pallas splash kernel (modules/kernels/splash.py): the TPU's flash
             attention, no scores in HBM.
             "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")`: a GPU's fused
             attention (bfloat16/float16 only).
             "auto" (configs only): `attention_for(platform, dtype, seq_len=S)` picks by the
             TARGET platform: splash on a TPU for long sequences, cudnn on a GPU for a
             low-precision model, xla otherwise.
  A kernel that cannot compute a call (a padding mask, dropout on the probabilities, a KV cache)
  leaves it to "xla": `Ops.attention` says which ran through `Ops.attention_used`.

What `Ops` offers (all float32 accumulation; shapes as in modules/kernels/xla.py):
  projection(x, w)           Linear's x [..., I] @ w [I, O] -> float32 [..., O]
  matmul(x, w, w_transposed) x [..., I] @ w (or w^T) -> float32 (the tied head, Embed.attend)
  wt_matmul(w, x)            w^T @ x for feature-major x [I, N] -> float32 [O, N]
  swiglu(gate_up, axis)      silu(gate) * up
  gate_up_swiglu             None, or xla_cpu's fused gate|up projection + activation
  split_qkv(qkv, H, K)       the q, k, v parts of a fused projection
  attention(q, k, v, ...)    the chosen attention (above)
  fused_mlp                  None, or the one-kernel SwiGLU MLP (mlp "pallas": fused_mlp.py)
  embed_lookup               Embed's automatic lookup ("auto" or xla_cpu's "gather")
  forms                      xla_cpu's forms (all off for "default"): what a CPU strategy reads

Synopsis:

  import jax.numpy as jnp
  from modules.kernels import dispatch
  ops = dispatch.ops("default", jnp.bfloat16, attention="xla")
  y = ops.projection(jnp.ones((4, 8)), jnp.ones((8, 3)))          # [4, 3] float32
  dispatch.attention_for("tpu", "bfloat16")                       # 'splash'
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional, Tuple

import jax
import jax.numpy as jnp

from modules import kernels as kernels_lib
from modules.kernels import fused_ce
from modules.kernels import fused_mlp
from modules.kernels import splash
from modules.kernels import xla
from modules.kernels import xla_cpu

ATTENTIONS = ("xla", "splash", "cudnn")
"""The attention implementations a model config names (configs also take "auto")."""

MLPS = ("xla", "pallas")
"""A SwiGLU MLP: "xla" (gate|up written, then down) or "pallas" (modules/kernels/fused_mlp.py: one
TPU kernel per block of rows, no [N, 2F] gate|up in HBM); configs also take "auto": pallas on a
TPU, xla elsewhere."""

LOSSES = ("xla", "pallas")
"""A language model's head and loss: "xla" (the logits written, then the cross-entropy) or
"pallas" (modules/kernels/fused_ce.py: one TPU kernel, no logits in HBM); configs also take
"auto": pallas on a TPU, xla elsewhere."""


def check_attention(name: str, field: str = "attention") -> str:
  """`name` itself when it names an implementation; else a ValueError naming field, value, fix."""
  if name not in ATTENTIONS:
    raise ValueError(f"{field}={name!r}: use one of {ATTENTIONS} (or 'auto' in a config: splash on "
                     "a TPU, cudnn on a GPU, xla on a CPU)")
  return name


def _check_kernel(name: str, field: str, names: Tuple[str, ...]) -> str:
  """`name` itself when it is one of `names` (xla | pallas); else a ValueError naming the fix."""
  if name not in names:
    raise ValueError(f"{field}={name!r}: use one of {names} (or 'auto' in a config: pallas on a "
                     "TPU, xla elsewhere)")
  return name


def _kernel_for(platform: str, choice: str, check: Callable[[str], str]) -> str:
  """`choice` checked, or for "auto" pallas on a TPU target and xla elsewhere."""
  if choice != "auto":
    return check(choice)
  return "pallas" if platform == "tpu" else "xla"


def check_loss(name: str, field: str = "loss") -> str:
  """`name` itself when it names a head-and-loss implementation; else a ValueError."""
  return _check_kernel(name, field, LOSSES)


def loss_for(platform: str, choice: str = "auto") -> str:
  """The head-and-loss implementation of a program compiled for `platform`: `choice`, or for
  "auto" pallas on a TPU and xla elsewhere."""
  return _kernel_for(platform, choice, check_loss)


def head_loss_rows(name: str, x: jax.Array, w: jax.Array, targets: jax.Array, *, dtype,
                   logits_dtype) -> jax.Array:
  """Per-row cross-entropy [N] of the head x [N, C] @ w [V, C]^T by the fused kernel `name`
  ("pallas"; the Pallas interpreter inside `splash.interpreted()`, as the attention)."""
  check_loss(name)
  if name != "pallas":
    raise ValueError(f"head_loss_rows: {name!r} writes the logits; compute them and "
                     "cross_entropy instead")
  return fused_ce.loss_rows(x, w, targets, dtype=dtype, logits_dtype=logits_dtype,
                            interpret=splash.interpreting())


def check_mlp(name: str, field: str = "mlp") -> str:
  """`name` itself when it names a SwiGLU MLP implementation; else a ValueError."""
  return _check_kernel(name, field, MLPS)


def mlp_for(platform: str, choice: str = "auto") -> str:
  """The SwiGLU MLP of a program compiled for `platform`: `choice`, or for "auto" pallas on a TPU,
  xla elsewhere."""
  return _kernel_for(platform, choice, check_mlp)


def attention_for(platform: str, dtype, choice: str = "auto", seq_len: int = 0) -> str:
  """The attention a program compiled for `platform` ("cpu", "tpu", "gpu") runs: `choice` itself,
  or for "auto" splash on a TPU for sequences of at least `splash.MIN_AUTO_LENGTH` (`seq_len`; 0 =
  unknown, long), cudnn on a GPU for a bfloat16/float16 model, else xla."""
  if choice != "auto":
    return check_attention(choice)
  if platform == "tpu":
    return "splash" if not seq_len or seq_len >= splash.MIN_AUTO_LENGTH else "xla"
  if platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return "cudnn"
  return "xla"


@dataclasses.dataclass(frozen=True)
class Ops:
  """The operations of one (kernels, dtype, attention) choice (module doc)."""
  kernels: str
  dtype: jnp.dtype
  attention_name: str
  forms: xla_cpu.Forms
  mlp_name: str = "xla"

  # ---- projections -------------------------------------------------------------------------
  def projection(self, x: jax.Array, w: jax.Array) -> jax.Array:       # [..., I] -> [..., O]
    if self.forms.fast_grad:                                         # on [N, I] rows
      rows = xla_cpu.matmul(x.reshape(-1, x.shape[-1]), w, self.dtype)
      return rows.reshape(x.shape[:-1] + (w.shape[1],))
    return xla.projection(x, w, self.dtype)

  def matmul(self, x: jax.Array, w: jax.Array, w_transposed: bool = False) -> jax.Array:
    if x.ndim == 2 and self.forms.fast_grad:
      return xla_cpu.matmul(x, w, self.dtype.name, w_transposed)
    return xla.matmul(x, w, self.dtype, w_transposed)

  def heads_projection(self, x: jax.Array, w: jax.Array, parts: int, heads: int) -> jax.Array:
    """x [B, S, D] @ w [D, parts * heads * Dh] -> float32 [parts, B, heads, S, Dh] (head-major
    q|k|v for an attention kernel)."""
    return xla.heads_projection(x, w, parts, heads, self.dtype)

  def heads_out_projection(self, o: jax.Array, w: jax.Array) -> jax.Array:
    """o [B, H, S, Dh] @ w [H * Dh, D] -> float32 [B, S, D]."""
    return xla.heads_out_projection(o, w, self.dtype)

  def wt_matmul(self, w: jax.Array, x: jax.Array) -> jax.Array:       # [I, N] -> [O, N]
    if x.ndim == 2 and self.forms.fast_grad:
      return xla_cpu.wt_matmul(w, x, self.dtype.name, self.forms.pad_contraction)
    return xla.wt_matmul(w, x, self.dtype)

  # ---- activations -------------------------------------------------------------------------
  def swiglu(self, gate_up: jax.Array, axis: int = -1) -> jax.Array:
    if self.forms.lean_swiglu:
      return xla_cpu.swiglu_activation(gate_up, axis=axis)
    return xla.swiglu_activation(gate_up, axis=axis)

  @property
  def gate_up_swiglu(self):
    """xla_cpu's fused gate|up projection and activation `(x, w, feature_major)` (x [N, I] or, feature
    major, [I, N]), or None: project with `projection`/`wt_matmul`, then `swiglu`."""
    if not self.forms.split_gate_up:
      return None
    return functools.partial(xla_cpu.gate_up_swiglu, dtype=self.dtype,
                             pad_contraction=self.forms.pad_contraction)

  @property
  def fused_mlp(self):
    """The fused SwiGLU MLP `(x [N, I], w_gate_up [I, 2F], w_down [F, O]) -> [N, O]` of
    mlp "pallas" (the interpreter inside `splash.interpreted()`), or None: the layer's XLA form."""
    if self.mlp_name != "pallas" or self.forms.fast_grad:
      return None
    return functools.partial(fused_mlp.swiglu_mlp, dtype=self.dtype,
                             interpret=splash.interpreting())

  @property
  def embed_lookup(self) -> str:
    return "gather" if self.forms.fast_grad else "auto"

  # ---- attention ---------------------------------------------------------------------------
  def split_qkv(self, qkv: jax.Array, H: int, K: int) -> Tuple[jax.Array, jax.Array, jax.Array]:
    if self.forms.head_major:
      return xla_cpu.split_qkv(qkv, H, K)
    return xla.qkv_parts(qkv, H, K)

  def attention_used(self, mask: Optional[jax.Array] = None, dropout: float = 0.0) -> str:
    """The implementation `attention` runs for such a call: the chosen kernel when it can take
    the mask and dropout, else "xla"."""
    if self.attention_name == "splash" and splash.supports(mask, dropout):
      return "splash"
    if self.attention_name == "cudnn" and mask is None and not dropout and \
        self.dtype in (jnp.bfloat16, jnp.float16):
      return "cudnn"
    return "xla"

  def attention_heads(self, qh: jax.Array, kh: jax.Array, vh: jax.Array, *,
                      causal: bool = False) -> jax.Array:
    """The kernel's attention on head-major qh [B, H, S, Dh], kh, vh [B, K, S, Dh] -> [B, H, S,
    Dh] (splash; another choice transposes to `attention`'s layout and back)."""
    if self.attention_used() == "splash" and qh.shape[2] % splash.BLOCK == 0:
      return splash.attention_heads(qh, kh, vh, causal=causal, interpret=splash.interpreting())
    t = lambda a: jnp.swapaxes(a, 1, 2)                         # noqa: E731
    return t(self.attention(t(qh), t(kh), t(vh), causal=causal))

  def attention(self, q: jax.Array, k: jax.Array, v: jax.Array, *,
                mask: Optional[jax.Array] = None, causal: bool = False) -> jax.Array:
    """softmax(q k^T / sqrt(Dh)) v: q [B, Sq, H, Dh], k, v [B, Sk, K, Dh], mask broadcastable to
    [B, H, Sq, Sk] (True = attend) -> [B, Sq, H, Dh] in q's dtype."""
    used = self.attention_used(mask)
    if used == "splash":
      return splash.attention(q, k, v, causal=causal, interpret=splash.interpreting())
    if used == "cudnn":
      return jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                          implementation="cudnn").astype(q.dtype)
    if self.forms.head_major:
      B, Sq, H, Dh = q.shape
      K = k.shape[2]
      full = xla.full_mask(Sq, k.shape[1], B, H, mask, causal)
      qg = q.reshape(B, Sq, K, H // K, Dh)
      return xla_cpu.head_major_attention(
          qg, k, v, None if full is None else full.reshape(B, K, H // K, Sq, k.shape[1]))
    return xla.attention(q, k, v, mask=mask, causal=causal)


def ops(kernels: str = "default", dtype=jnp.float32, attention: str = "xla",
        mlp: str = "xla") -> Ops:
  """The operations for a layer computing in `dtype` (module doc). Read at trace time (xla_cpu's
  forms follow its `override`/`exactly` blocks)."""
  kernels_lib.check(kernels)
  check_attention(attention)
  check_mlp(mlp)
  dtype = jnp.dtype(dtype)
  return Ops(kernels, dtype, attention, xla_cpu.forms(kernels, dtype), mlp)
