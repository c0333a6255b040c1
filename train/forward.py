"""The head's training forward: many anchors of one sequence in a single pass (docs/spec.md §7).

It lays out the packed sequence (`masks`) and calls the head's one layer,
`DartHead.draft_rows`, so that every anchor a gets the same d rows as the inference call
`head(taps[:, :a+1], ids[:, :a+1])` (tests/test_train_core.py checks this). The head has a single
decoder layer, so only the d rows read per anchor need queries and an MLP; every real position
and every slot supplies keys and values.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dart_jax.models.head import DartHead

from .masks import packed_attention_mask, packed_positions, query_index


def shifted_ids(ids: jax.Array, pad_id: int = 0) -> jax.Array:
    """ids [B, T] → the ids the head reads at each real position: the token that follows it."""
    return jnp.concatenate([ids[:, 1:], jnp.full((ids.shape[0], 1), pad_id, ids.dtype)], axis=1)


def train_draft_logits(head: DartHead, taps: jax.Array, next_ids: jax.Array, anchors: jax.Array) -> jax.Array:
    """Draft logits [B, K, d, Vd] for anchors [B, K] (real positions, each < T): `train_draft_hidden`
    through the head's LM head."""
    return head.lm_head(train_draft_hidden(head, taps, next_ids, anchors))


def train_draft_hidden(head: DartHead, taps: jax.Array, next_ids: jax.Array, anchors: jax.Array) -> jax.Array:
    """The hidden states [B, K, d, H] the LM head turns into the draft logits of anchors [B, K].

    taps [B, T, 3Ht] are the target's taps at positions 0..T−1 and next_ids [B, T] the shifted ids
    (`shifted_ids`). Block k's m slots sit at RoPE positions anchors[k] + 1 … anchors[k] + m.
    """
    cfg = head.config
    b, t = next_ids.shape
    k = anchors.shape[1]
    m, d = cfg.draft_length, cfg.num_rows
    with jax.named_scope("train_inputs"):
        x, g = head.inputs(taps, next_ids)                                           # [B,T,2H], [B,T,H]
        mask_x, mask_g = head.mask_inputs()
        x = jnp.concatenate([x, jnp.broadcast_to(mask_x, (b, k * m, mask_x.shape[0]))], axis=1)  # [B,N,2H]
        g = jnp.concatenate([g, jnp.broadcast_to(mask_g, (b, k * m, mask_g.shape[0]))], axis=1)  # [B,N,H]
        rows = query_index(t, anchors, m).reshape(b, k * d)                          # [B,K·d]
    positions = packed_positions(t, anchors, m)                                      # [B,N]
    visible = packed_attention_mask(t, anchors, m, rows)                             # [B,K·d,N]
    return head.draft_hidden(x, g, positions, rows, visible).reshape(b, k, d, -1)
