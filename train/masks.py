"""Layout of one prefix-shared training sequence (docs/spec.md §7).

A packed sequence holds the T real positions of a sample followed by K blocks of m mask slots,
one block per anchor. Real position i carries the target's taps at i and the token that follows
i; anchor a's block stands for the m tokens drafted after the prefix 0..a, exactly as the m mask
slots appended by one inference call on that prefix (docs/spec.md §3).

Row r (0..m) of anchor a predicts the token at position a + 2 + r; its teacher is the target's
next-token distribution at position a + 1 + r. Row 0 is read at the anchor's real position, rows
1..m at the block's slots.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def packed_positions(seq_len: int, anchors: jnp.ndarray, m: int) -> jnp.ndarray:
    """RoPE positions [B, T + K·m]: real i → i; slot s (1..m) of anchor a → a + s."""
    b, k = anchors.shape
    real = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (b, seq_len))
    slots = anchors[:, :, None].astype(jnp.int32) + jnp.arange(1, m + 1, dtype=jnp.int32)  # [B,K,m]
    return jnp.concatenate([real, slots.reshape(b, k * m)], axis=1)


def query_index(seq_len: int, anchors: jnp.ndarray, m: int) -> jnp.ndarray:
    """Packed indices [B, K, m+1] of the rows read for each anchor: its real position, then its slots."""
    b, k = anchors.shape
    slots = seq_len + jnp.arange(k)[:, None] * m + jnp.arange(m)[None, :]  # [K,m]
    return jnp.concatenate([anchors[:, :, None].astype(jnp.int32),
                            jnp.broadcast_to(slots, (b, k, m)).astype(jnp.int32)], axis=2)


def packed_attention_mask(seq_len: int, anchors: jnp.ndarray, m: int, queries: jnp.ndarray | None = None) -> jnp.ndarray:
    """Boolean attention mask [B, Q, T + K·m] (True = may attend) for packed query indices
    `queries` [B, Q] (default: every packed position, Q = T + K·m).

    Real positions attend causally among real positions. Slot s of block k attends to real
    positions <= anchors[k] and to slots 1..s of its own block, never to another block, and no
    real position attends to a slot.
    """
    b, k = anchors.shape
    if k < 1 or m < 1:
        raise ValueError(f"need at least one anchor and one mask slot, got K={k}, m={m}")
    n = seq_len + k * m
    keys = jnp.arange(n)
    if queries is None:
        queries = jnp.broadcast_to(keys, (b, n))
    key_real = keys < seq_len
    key_block = jnp.where(key_real, -1, (keys - seq_len) // m)  # [N]; -1 for real positions
    q_real = queries < seq_len  # [B,Q]
    q_block = jnp.where(q_real, -1, (queries - seq_len) // m)
    # the last real position a query may read: itself when real, its block's anchor when a slot
    q_limit = jnp.where(q_real, queries, jnp.take_along_axis(anchors, jnp.clip(q_block, 0, k - 1), axis=1))  # [B,Q]
    real_key = key_real[None, None, :] & (keys[None, None, :] <= q_limit[:, :, None])
    own_block = (~q_real[:, :, None]) & (key_block[None, None, :] == q_block[:, :, None]) & (keys[None, None, :] <= queries[:, :, None])
    return real_key | own_block


def sample_anchors(loss_mask: np.ndarray, length: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Up to k anchors among the positions whose first row has a training target.

    Anchor a is eligible when a + 2 < length and the token at a + 2 is on the loss mask.
    Returns (anchors int32[k], valid bool[k]), sorted; unused entries point at position 0 and are
    marked invalid.
    """
    cand = np.flatnonzero(np.asarray(loss_mask[2:length], dtype=bool))  # a with loss_mask[a+2]
    if len(cand) > k:
        cand = np.sort(rng.choice(cand, size=k, replace=False))
    anchors = np.zeros(k, np.int32)
    valid = np.zeros(k, bool)
    anchors[: len(cand)] = cand
    valid[: len(cand)] = True
    return anchors, valid
