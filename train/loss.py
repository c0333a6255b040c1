"""Annealed KL loss over the d draft rows (docs/spec.md §7) and the acceptance metrics logged with it."""
from __future__ import annotations

import functools

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
    log_p = jax.nn.log_softmax(draft_logits.astype(jnp.float32), axis=-1)
    log_q = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), axis=-1)
    kl = jnp.sum(jnp.exp(log_q) * (log_q - log_p), axis=-1)  # [B,K,d]
    return annealed_sums(kl, first_argmax(draft_logits) == first_argmax(teacher_logits), row_valid, gamma)


def annealed_kl_projected(hidden: jax.Array, kernel: jax.Array, teacher_logits: jax.Array, row_valid: jax.Array,
                          gamma: float, dtype=jnp.float32):
    """`annealed_kl` of the draft logits hidden @ kernel (hidden [B, K, d, H], the head's LM-head
    kernel [H, Vd], the matmul in `dtype` as the head's `Linear` runs it), with the LM head's
    backward written out (`projected_kl`) instead of differentiated: the same loss and gradients,
    one pass over the [rows, Vd] gradient instead of two. The teacher is a constant."""
    lead = hidden.shape[:-1]
    log_q = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32), axis=-1)
    kl, top = projected_kl(hidden.reshape(-1, hidden.shape[-1]), kernel, log_q.reshape(-1, log_q.shape[-1]), dtype)
    correct = top.reshape(lead) == first_argmax(teacher_logits)
    return annealed_sums(kl.reshape(lead), correct, row_valid, gamma)


def annealed_sums(kl: jax.Array, correct: jax.Array, row_valid: jax.Array, gamma: float):
    """The loss and metric sums of `annealed_kl` from each row's KL and top-1 agreement [B, K, d]."""
    d = kl.shape[-1]
    valid = row_valid.astype(jnp.float32)
    weights = gamma ** jnp.arange(d, dtype=jnp.float32)
    anchors = jnp.sum(valid[..., 0])
    loss = jnp.sum(kl * valid * weights) / jnp.maximum(anchors, 1.0)
    sums = {
        "kl": jnp.sum(kl * valid, axis=(0, 1)),
        "correct": jnp.sum(correct.astype(jnp.float32) * valid, axis=(0, 1)),
        "count": jnp.sum(valid, axis=(0, 1)),
    }
    return loss, sums


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def projected_kl(hidden: jax.Array, kernel: jax.Array, log_q: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """Per row n: (KL(q_n ‖ softmax(hidden_n @ kernel)), the first argmax of hidden_n @ kernel);
    hidden [N, H], kernel [H, V], log_q [N, V] the teacher's log-probabilities."""
    return _projected_kl_fwd(hidden, kernel, log_q, dtype)[0]


def _projected_kl_fwd(hidden, kernel, log_q, dtype):
    logits = jnp.einsum("ni,io->no", hidden.astype(dtype), kernel.astype(dtype)).astype(jnp.float32)
    log_p = jax.nn.log_softmax(logits, axis=-1)
    q = jnp.exp(log_q)
    kl = jnp.sum(q * (log_q - log_p), axis=-1)
    return (kl, first_argmax(logits)), (hidden, kernel, log_p, q)


def _projected_kl_bwd(dtype, residuals, cotangents):
    # d KL_n / d logits_n = softmax(logits_n) − q_n; the teacher gets no gradient (it is a constant)
    hidden, kernel, log_p, q = residuals
    grad = ((jnp.exp(log_p) - q) * cotangents[0][:, None]).astype(dtype)                # [N,V]
    d_hidden = jnp.einsum("no,io->ni", grad, kernel.astype(dtype)).astype(hidden.dtype)
    d_kernel = jnp.einsum("ni,no->io", hidden.astype(dtype), grad).astype(kernel.dtype)
    return d_hidden, d_kernel, jnp.zeros_like(q)


projected_kl.defvjp(_projected_kl_fwd, _projected_kl_bwd)


def first_argmax(x: jax.Array) -> jax.Array:
    """The index of the first maximum along the last axis, as `jnp.argmax` gives it for finite x,
    made of two plain reductions (XLA:CPU runs argmax's paired value-and-index reduction several
    times slower, and the metrics take two over every row of the vocabulary each step)."""
    top = jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x == top, jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[-1]), axis=-1)


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
