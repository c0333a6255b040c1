"""The EAGLE-3 draft head (docs/spec.md §9): one Llama decoder layer over (token embedding, hidden).

A row pairs the hidden state of position p with the embedding of the token at p+1. For a row of
the target, the hidden state is `fc` of the target's three taps [3Ht] → H; for a row of the
draft tree it is the layer's own output at the parent row. The layer normalises the embedding
(`input_layernorm`) and the hidden state (`hidden_norm`), attends with the 2H-wide
concatenation as the input of q/k/v, adds the attention output to the (un-normalised) hidden
state, then a SwiGLU MLP after `post_attention_layernorm`. Logits over the draft vocabulary are
`lm_head(norm(h))`; `d2t` maps a draft id to its target id. Parameter names follow the published
checkpoints (`dart_jax.convert.eagle3.tensor_table`).

`layer` is the head's one layer; the drafter (`dart_jax.decoding.eagle3`) lays out the rows, the
positions and what each query sees.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.convert.eagle3 import Eagle3Config

from .head import Buffer
from .layers import Attend, HeadLayer, Linear, RMSNorm, attention, rope_cos_sin, rope_inv_freq
from .qwen3 import Embed


@functools.lru_cache(maxsize=16)
def eagle3_rope(config: Eagle3Config) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim//2] and cos/sin scale, as the reference head builds them."""
    theta, scaling = config.rope_arguments()
    return rope_inv_freq(config.head_dim, theta, scaling)


class Eagle3Head(nnx.Module):
    """The EAGLE-3 head. `embed_tokens` is the target's embedding module (shared, only its
    `.embedding` [V, H] is read), or None for a head with an embedding of its own."""

    def __init__(self, config: Eagle3Config, embed_tokens=None, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 rngs: nnx.Rngs | None):
        h = config.hidden_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        if embed_tokens is None:
            embed_tokens = Embed(config.vocab_size, h, **kw)
        shape = tuple(embed_tokens.embedding.get_value().shape)
        if shape != (config.vocab_size, h):
            raise ValueError(f"the embedding is {shape} but the EAGLE-3 head needs [vocab_size, hidden_size] = "
                             f"{(config.vocab_size, h)}: this head was trained for another target.")
        self.config = config
        self.dtype = dtype
        self.embed_tokens = embed_tokens
        self.fc = Linear(config.fc_in, h, (None, "embed"), **kw)
        self.midlayer = HeadLayer(config, **kw)
        self.norm = RMSNorm(h, config.rms_norm_eps, param_dtype=param_dtype)
        self.lm_head = Linear(h, config.draft_vocab_size, ("embed", "vocab"), **kw)
        # identity offsets when the draft vocabulary is the target's (the reference then has no d2t)
        self.d2t = Buffer(jnp.zeros((config.draft_vocab_size,), jnp.int32), logical_axes=("vocab",))
        self.t2d = Buffer(jnp.ones((config.vocab_size,), jnp.bool_), logical_axes=("vocab",))

    def to_target(self, draft_ids: jax.Array) -> jax.Array:
        """Draft-vocabulary ids → target ids."""
        return draft_ids + self.d2t[...][draft_ids]

    def embed(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embed_tokens.embedding[...], ids, axis=0).astype(self.dtype)  # [...,H]

    def project(self, taps: jax.Array) -> jax.Array:
        """The target's taps [..., 3Ht] → the hidden input of a row [..., H]."""
        return self.fc(taps)

    def layer(self, emb: jax.Array, hidden: jax.Array, positions: jax.Array, attend: Attend,
              rows: jax.Array | None = None) -> jax.Array:
        """The head's layer over T input rows: emb [B,T,H] (the next token's embedding), hidden
        [B,T,H], RoPE positions [B,T]. Every row gives a key and a value; the rows at indices
        `rows` [B,Q] (all: None) also a query, and `attend` says what each sees. → [B,Q,H]."""
        mid = self.midlayer
        with jax.named_scope("eagle3_attention"):
            h = mid.self_attn(*self._rows(emb, hidden, positions), rows, attend)  # [B,Q,H]
        with jax.named_scope("eagle3_mlp"):
            return h + mid.mlp(mid.post_attention_layernorm(h))

    def key_values(self, taps: jax.Array, ids: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The keys and values [B,T,KVH,D] of T target rows (taps [B,T,3Ht], the following ids [B,T])
        at RoPE `positions` [B,T], without a query: what later rows attend to."""
        x, _, cos, sin = self._rows(self.embed(ids), self.project(taps), positions)
        return self.midlayer.self_attn.key_values(x, cos, sin)

    def _rows(self, emb: jax.Array, hidden: jax.Array, positions: jax.Array):
        """The attention's inputs of T rows: x [B,T,2H] (the normed embedding beside the normed
        hidden state), the residual `hidden`, RoPE cos and sin [B,T,D]."""
        mid = self.midlayer
        x = jnp.concatenate([mid.input_layernorm(emb), mid.hidden_norm(hidden)], axis=-1)
        return (x, hidden, *rope_cos_sin(positions, *eagle3_rope(self.config)))

    def logits(self, h: jax.Array) -> jax.Array:
        """The layer's output [..., H] → float32 logits over the draft vocabulary [..., Vd]."""
        return self.lm_head(self.norm(h)).astype(jnp.float32)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.config.head_dim)

    def __call__(self, taps: jax.Array, ids: jax.Array) -> jax.Array:
        """Draft logits [B,n,Vd] of n target rows (taps [B,n,3Ht], the following ids [B,n]) at
        positions 0…n−1, each row seeing the rows up to itself; no cache."""
        b, n = ids.shape
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
        positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
        h = self.layer(self.embed(ids), self.project(taps), positions,
                       lambda q, k, v: attention(q, k, v, causal, self.scale))
        return self.logits(h)


def two_block_attention(q, k1, v1, mask1, k2, v2, mask2, scale: float) -> jax.Array:
    """Attention of q [B,Q,Hq,D] over two key blocks with one softmax: k1/v1 [B,S,KVH,D] where
    mask1 [B,Q,S] and k2/v2 [B,T,KVH,D] where mask2 [B,Q,T] (a cache and a draft tree beside it,
    without concatenating the cache)."""
    b, t, hq, d = q.shape
    hkv = k1.shape[2]
    s = k1.shape[1]
    qg = q.reshape(b, t, hkv, hq // hkv, d)
    scores = jnp.concatenate([jnp.einsum("btkgd,bskd->bkgts", qg, k1.astype(q.dtype), preferred_element_type=jnp.float32),
                              jnp.einsum("btkgd,bskd->bkgts", qg, k2.astype(q.dtype), preferred_element_type=jnp.float32)],
                             axis=-1) * scale  # [B,KVH,G,Q,S+T]
    mask = jnp.concatenate([mask1, mask2], axis=-1)[:, None, None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0).astype(q.dtype)
    out = (jnp.einsum("bkgts,bskd->btkgd", probs[..., :s], v1.astype(q.dtype), preferred_element_type=jnp.float32)
           + jnp.einsum("bkgts,bskd->btkgd", probs[..., s:], v2.astype(q.dtype), preferred_element_type=jnp.float32))
    return out.astype(q.dtype).reshape(b, t, hq, d)
