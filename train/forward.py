"""The head's training forward: many anchors of one sequence in a single pass (SPEC §7).

It reuses the parameters of `dart_jax.head.DartHead` (fc, midlayer, norm, lm_head) and computes,
for every anchor a, the same d rows as the inference call `head(taps[:, :a+1], ids[:, :a+1])`
(tests/test_train_forward.py checks this). The head has a single decoder layer, so only the d
rows read per anchor need queries and an MLP; every real position and every slot supplies keys
and values.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dart_jax.head import DartHead, head_rope
from dart_jax.layers import apply_rope, attention, rope_cos_sin

from .masks import packed_attention_mask, packed_positions, query_index


def shifted_ids(ids: jax.Array, pad_id: int = 0) -> jax.Array:
    """ids [B, T] → the ids the head reads at each real position: the token that follows it."""
    return jnp.concatenate([ids[:, 1:], jnp.full((ids.shape[0], 1), pad_id, ids.dtype)], axis=1)


def train_draft_logits(head: DartHead, taps: jax.Array, next_ids: jax.Array, anchors: jax.Array) -> jax.Array:
    """Draft logits [B, K, d, Vd] for anchors [B, K] (real positions, each < T).

    taps [B, T, 3Ht] are the target's taps at positions 0..T−1 and next_ids [B, T] the shifted ids
    (`shifted_ids`). Block k's m slots sit at RoPE positions anchors[k] + 1 … anchors[k] + m.
    """
    cfg = head.config
    layer, attn = head.midlayer, head.midlayer.self_attn
    b, t = next_ids.shape
    k = anchors.shape[1]
    m, d, hsz = cfg.draft_length, cfg.num_rows, cfg.hidden_size
    n = t + k * m

    with jax.named_scope("train_inputs"):
        g = head.fc(taps)                                                            # [B,T,H]
        emb = jnp.take(head.embed_tokens.embedding.value, next_ids, axis=0).astype(head.dtype)
        x = jnp.concatenate([layer.input_layernorm(emb), layer.hidden_norm(g)], axis=-1)  # [B,T,2H]
        mask_rep = layer.mask_rep.value.astype(head.dtype)
        x = jnp.concatenate([x, jnp.broadcast_to(mask_rep, (b, k * m, 2 * hsz))], axis=1)  # [B,N,2H]
        g = jnp.concatenate([g, jnp.broadcast_to(mask_rep[:hsz], (b, k * m, hsz))], axis=1)  # [B,N,H]
        rows = query_index(t, anchors, m).reshape(b, k * d)                          # [B,K·d]

    with jax.named_scope("train_attention"):
        inv_freq, rope_scale = head_rope(cfg)
        kvh, hd = cfg.num_key_value_heads, cfg.head_dim
        positions = packed_positions(t, anchors, m)                                  # [B,N]
        cos, sin = rope_cos_sin(positions, inv_freq, rope_scale)                     # [B,N,D]
        keys = apply_rope(attn.k_proj(x).reshape(b, n, kvh, hd), cos, sin)           # [B,N,KVH,D]
        values = attn.v_proj(x).reshape(b, n, kvh, hd)
        xq = jnp.take_along_axis(x, rows[..., None], axis=1)                         # [B,K·d,2H]
        cos_q = jnp.take_along_axis(cos, rows[..., None], axis=1)
        sin_q = jnp.take_along_axis(sin, rows[..., None], axis=1)
        q = apply_rope(attn.q_proj(xq).reshape(b, k * d, cfg.num_attention_heads, hd), cos_q, sin_q)
        visible = packed_attention_mask(t, anchors, m, rows)                         # [B,K·d,N]
        out = attention(q, keys, values, visible, 1.0 / math.sqrt(hd))               # [B,K·d,Hq,D]
        h = jnp.take_along_axis(g, rows[..., None], axis=1) + attn.o_proj(out.reshape(b, k * d, -1))  # [B,K·d,H]

    with jax.named_scope("train_mlp"):
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = head.lm_head(head.norm(head.norm(h)))                               # [B,K·d,Vd]
    return logits.reshape(b, k, d, -1)
