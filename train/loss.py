"""Annealed KL loss over the d draft rows (docs/spec.md §7) and the acceptance metrics logged with it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def annealed_kl(draft_logits: jax.Array, teacher_logits: jax.Array, row_valid: jax.Array, gamma: float):
    """Loss and metric sums for one batch.

    draft_logits, teacher_logits [B, K, d, Vd] (the teacher already restricted to the draft
    vocabulary; its softmax is the renormalised restriction); row_valid [B, K, d] bool.
    For every anchor, L = Σ_r γ^r · KL(q_r ‖ p_r) over its valid rows r = 0..d−1; the loss is the
    mean of L over the anchors whose row 0 is valid.
    Returns (loss, sums) where sums holds per-row arrays [d]: `kl` (KL summed over valid rows),
    `correct` (draft argmax == teacher argmax), `count` (valid rows); sums add up across
    micro-batches and devices, see `row_accuracy` and `expected_length`.
    """
    d = draft_logits.shape[-2]
    log_p = jax.nn.log_softmax(draft_logits.astype(jnp.float32), axis=-1)
    log_q = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), axis=-1)
    q = jnp.exp(log_q)
    kl = jnp.sum(q * (log_q - log_p), axis=-1)  # [B,K,d]
    valid = row_valid.astype(jnp.float32)
    weights = gamma ** jnp.arange(d, dtype=jnp.float32)
    anchors = jnp.sum(valid[..., 0])
    loss = jnp.sum(kl * valid * weights) / jnp.maximum(anchors, 1.0)
    correct = (jnp.argmax(draft_logits, axis=-1) == jnp.argmax(teacher_logits, axis=-1)).astype(jnp.float32) * valid
    sums = {
        "kl": jnp.sum(kl * valid, axis=(0, 1)),
        "correct": jnp.sum(correct, axis=(0, 1)),
        "count": jnp.sum(valid, axis=(0, 1)),
    }
    return loss, sums


def row_accuracy(correct, count) -> np.ndarray:
    """α_r = correct_r / count_r per row (0 where a row had no valid target)."""
    correct, count = np.asarray(correct, np.float64), np.asarray(count, np.float64)
    return np.where(count > 0, correct / np.maximum(count, 1.0), 0.0)


def expected_length(alpha) -> float:
    """Chain estimate of the mean accepted length per step: τ = 1 + Σ_k Π_{j≤k} α_j.

    The 1 is the token the target always contributes (the bonus); draft row k is accepted only if
    rows 0..k−1 were, and α_j (measured on the data prefix) stands in for the conditional
    acceptance of row j. Tree search accepts more than a single chain, so this is a lower-bound
    style indicator for comparing runs, not a prediction of the engine's τ.
    """
    return float(1.0 + np.sum(np.cumprod(np.asarray(alpha, np.float64))))
