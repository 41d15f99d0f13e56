"""TRM losses: stablemax cross-entropy and the per-ACT-step loss and metrics of the reference.

Follows docs/trm.md, section 2. Everything is computed in float32 (JAX runs with x64 off);
the formulations below stay within 1e-6 relative of the reference's float64 computation (measured in
tests/test_trm_loss.py).

Synopsis (runs as is on a CPU):

  import jax, jax.numpy as jnp
  from experiments.trm import losses

  B, L, V = 2, 81, 11
  logits = jax.random.normal(jax.random.key(0), (B, L, V), jnp.bfloat16)  # [B, L, V]
  labels = jnp.full((B, L), 2, jnp.int32).at[:, :3].set(losses.IGNORE_LABEL_ID)  # [B, L]
  per_token = losses.stablemax_cross_entropy(logits, labels)  # [B, L] float32
  loss, metrics = losses.act_loss_and_metrics(
      logits, labels,
      q_halt=jnp.array([-5.0, 3.0]), q_continue=jnp.array([-5.0, -5.0]),
      halted=jnp.array([True, False]), steps=jnp.array([16, 3]),
      loss_divisor=B)
  # metrics are sums: divide accuracy/exact_accuracy/q_halt_accuracy/steps by metrics["count"] and
  # lm_loss/q_halt_loss by the global batch size at log time (after a psum across devices).
"""
from typing import Any

import jax
import jax.numpy as jnp

from input_pipeline import puzzles

IGNORE_LABEL_ID = puzzles.IGNORE_LABEL_ID   # positions the loss skips (the data's label padding)


def _pairwise_sum(x: jax.Array, axis: int = -1) -> jax.Array:
  """Sum over `axis` by a balanced binary tree (error O(log n) ulps instead of O(n))."""
  x = jnp.moveaxis(x, axis, -1)
  n = x.shape[-1]
  if n == 0:
    return jnp.zeros(x.shape[:-1], x.dtype)
  size = 1 << (n - 1).bit_length()
  if size != n:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - n)])
  while x.shape[-1] > 1:
    half = x.shape[-1] // 2
    x = x[..., :half] + x[..., half:]
  return x[..., 0]


def _stablemax_s(x: jax.Array) -> jax.Array:
  """s(x) = 1 / (1 - x) for x < 0, x + 1 otherwise (both branches finite, so gradients are too)."""
  return jnp.where(x < 0, 1.0 / (1.0 - jnp.minimum(x, 0.0)), x + 1.0)


def stablemax_cross_entropy(
    logits: jax.Array,  # [B, L, V]
    labels: jax.Array,  # [B, L]
    ignore_index: int = IGNORE_LABEL_ID,
) -> jax.Array:
  """Per-token stablemax cross-entropy, float32 [B, L], 0 at ignored positions.

  Reference: loss = -log(s(x_label) / sum_j s(x_j)), computed in float64. Here, in float32,

    loss = log1p(sum_{j != label} s(x_j) / s(x_label)),

  which is mathematically identical but has no cancellation: s > 0 everywhere, the sum has only positive
  terms (summed pairwise), and log1p is accurate both for tiny arguments (confident, correct tokens:
  loss ~ ratio) and huge ones (confident, wrong tokens). The naive float32 log(sum) - log(s_label)
  loses all relative accuracy when the loss is small. bfloat16 logits are cast to float32 first (exact).

  Args:
    logits: [..., V] logits, any float dtype.
    labels: [...] integer labels in [0, V), or `ignore_index`.
    ignore_index: label value of positions that carry no loss.

  Returns:
    float32 [...] per-token losses, 0 where `labels == ignore_index`.
  """
  x = logits.astype(jnp.float32)  # [B, L, V]
  valid = labels != ignore_index  # [B, L]
  safe_labels = jnp.where(valid, labels, 0)  # [B, L]
  s = _stablemax_s(x)  # [B, L, V]
  is_label = safe_labels[..., None] == jnp.arange(x.shape[-1], dtype=safe_labels.dtype)  # [B, L, V]
  s_label = jnp.sum(jnp.where(is_label, s, 0.0), axis=-1)  # [B, L] (one non-zero term: exact)
  s_other = _pairwise_sum(jnp.where(is_label, 0.0, s), axis=-1)  # [B, L]
  loss = jnp.log1p(s_other / s_label)  # [B, L]
  return jnp.where(valid, loss, 0.0)


def _bce_with_logits(x: jax.Array, z: jax.Array) -> jax.Array:
  """Stable binary cross-entropy with logits: max(x, 0) - x z + log1p(exp(-|x|)), float32."""
  return jnp.maximum(x, 0.0) - x * z + jnp.log1p(jnp.exp(-jnp.abs(x)))


def act_loss_and_metrics(
    logits: jax.Array,  # [B, L, V]
    labels: jax.Array,  # [B, L]
    q_halt: jax.Array,  # [B]
    q_continue: jax.Array,  # [B]
    halted: jax.Array,  # [B] bool
    steps: jax.Array,  # [B] int
    loss_divisor: Any,
    ignore_index: int = IGNORE_LABEL_ID,
    row_mask: jax.Array | None = None,  # [B] bool
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Loss and metrics of one ACT step (docs/trm.md section 2), for one device's batch.

  Per row b with n_b valid tokens (label != ignore_index):
    lm_loss     = sum_b (sum of the valid tokens' stablemax losses) / max(1, n_b)
    exact_b     = (number of valid tokens whose argmax equals the label) == n_b
                  (as in the reference, this is True for a row with no valid token; such rows only
                  matter for q_halt_loss, since every metric skips them)
    q_halt_loss = sum_b BCE-with-logits(q_halt_b, exact_b)
    total       = lm_loss + 0.5 * q_halt_loss
    loss        = total / loss_divisor

  Every row counts in the loss, halted or not. The reference divides the total by the GLOBAL batch size
  and sums the gradients over devices; the trainer here passes the PER-DEVICE batch size as
  `loss_divisor` and averages (pmean) the gradients over devices, which is the same quantity:
  mean_d(grad total_d / b) = sum_d grad total_d / (devices * b).

  The reference's Q-continue (bootstrapped target) loss is off in every recipe and crashes in the
  released code; it is not implemented: `q_continue` is accepted for API symmetry with the model's
  outputs and ignored.

  Metrics are SUMS over this batch, as float32 scalars without gradient, so that the trainer can psum
  them across devices and divide once at log time. Only rows that halted at this step and have at least
  one valid token are counted:
    count           = number of counted rows
    accuracy        = sum over counted rows of (correct valid tokens / n_b)
    exact_accuracy  = sum over counted rows of exact_b
    q_halt_accuracy = sum over counted rows of ((q_halt_b >= 0) == exact_b)
    steps           = sum over counted rows of steps_b
    lm_loss, q_halt_loss = the summed values above, NOT divided by `loss_divisor`.
  Report accuracy, exact_accuracy, q_halt_accuracy and steps divided by count, and the losses divided by
  the global batch size. Batch-level sums use pairwise (tree) summation for float32 accuracy.

  Args:
    logits: [B, L, V] token logits (bfloat16 or float32).
    labels: [B, L] integer labels; `ignore_index` marks positions without loss.
    q_halt: [B] halt logits.
    q_continue: [B] continue logits (unused, see above).
    halted: [B] bool, rows that halted at this ACT step.
    steps: [B] int, ACT steps taken by each row (after this step).
    loss_divisor: divisor of the returned loss (the per-device batch size).
    ignore_index: label value of ignored positions.
    row_mask: optional [B] bool; rows where it is False (evaluation padding) contribute nothing to the
      losses or the metrics.

  Returns:
    (loss, metrics): the float32 scalar loss to differentiate and a dict of float32 scalar sums.
  """
  del q_continue  # Continue-loss mode is not supported (see the docstring).
  valid = labels != ignore_index  # [B, L]
  if row_mask is not None:
    valid = valid & row_mask[:, None]
    labels = jnp.where(valid, labels, ignore_index)
  n_valid = jnp.sum(valid, axis=-1, dtype=jnp.int32)  # [B]
  divisor = jnp.maximum(n_valid, 1).astype(jnp.float32)  # [B]

  token_loss = stablemax_cross_entropy(logits, labels, ignore_index)  # [B, L]
  row_lm_loss = _pairwise_sum(token_loss, axis=-1) / divisor  # [B]
  lm_loss = _pairwise_sum(row_lm_loss)  # []

  preds = jnp.argmax(logits, axis=-1)  # [B, L]
  correct = valid & (preds == labels)  # [B, L]
  n_correct = jnp.sum(correct, axis=-1, dtype=jnp.int32)  # [B]
  exact = n_correct == n_valid  # [B]

  q_halt = q_halt.astype(jnp.float32)  # [B]
  row_q_loss = _bce_with_logits(q_halt, exact.astype(jnp.float32))  # [B]
  if row_mask is not None:
    row_q_loss = jnp.where(row_mask, row_q_loss, 0.0)
  q_halt_loss = _pairwise_sum(row_q_loss)  # []
  total = lm_loss + 0.5 * q_halt_loss
  loss = total / jnp.asarray(loss_divisor, jnp.float32)

  counted = halted & (n_valid > 0)  # [B]
  count_sum = lambda m: jnp.sum(m, dtype=jnp.int32).astype(jnp.float32)
  metrics = {
      "count": count_sum(counted),
      "accuracy": _pairwise_sum(
          jnp.where(counted, n_correct.astype(jnp.float32) / divisor, 0.0)),
      "exact_accuracy": count_sum(counted & exact),
      "q_halt_accuracy": count_sum(counted & ((q_halt >= 0) == exact)),
      "steps": count_sum(jnp.where(counted, steps, 0)),
      "lm_loss": lm_loss,
      "q_halt_loss": q_halt_loss,
  }
  metrics = jax.tree.map(jax.lax.stop_gradient, metrics)
  return loss, metrics
