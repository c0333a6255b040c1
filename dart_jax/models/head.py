"""The DART draft head (docs/spec.md §3): one Llama-style decoder layer that drafts d = m+1 rows at once.

The head reads the target's three taps and the shifted token ids of the rows committed in this
step, appends m `mask_rep` slots, and returns d logit rows over the draft vocabulary. Its
parameters are named after the reference checkpoint (`fc`, `midlayer.…`, `norm`, `lm_head`,
`d2t`, `t2d`) so that conversion is a name table (`dart_jax.convert.dart_head.tensor_table`).

`draft_rows` is the head's one layer. Inference (`__call__`, `extend`) and training
(`dart_jax.train.forward`) differ only in how they lay out the input rows, which rows are
queried and what each query may see; both call it.

RoPE follows the reference head, whose scaled kinds read their settings differently from the
target (`DartHeadConfig.rope_arguments`). 'dynamic' (NTK) is computed the way the reference sets
it up at construction (for a table of `max_position_embeddings + 20` positions); the reference
rebuilds it when a sequence grows past that, which static shapes cannot follow, so positions
beyond that length differ from the reference for 'dynamic' only.
"""
from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.convert.dart_head import ACTIVATIONS, DartHeadConfig

from .layers import ACTIVATION_FNS, HeadLayer, Linear, RMSNorm, attention, param, rope_cos_sin, rope_inv_freq

assert set(ACTIVATION_FNS) == set(ACTIVATIONS)


@functools.lru_cache(maxsize=16)
def head_rope(config: DartHeadConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim//2] and cos/sin scale, as the reference head builds them."""
    theta, scaling, options = config.rope_arguments()
    return rope_inv_freq(config.head_dim, theta, scaling, **options)


class Buffer(nnx.Variable):
    """A non-trainable array saved with the head (d2t, t2d); trainers filter on nnx.Param."""


# The embedding belongs to the target and stays frozen: optimise `nnx.state(head, TRAINABLE)`.
TRAINABLE = nnx.All(nnx.Param, nnx.Not(nnx.PathContains("embed_tokens")))


@flax.struct.dataclass
class HeadCache:
    """The head's KV cache; k, v [B, S_max, KVH, D]. Valid lengths are the caller's `cache_len`."""

    k: jax.Array
    v: jax.Array
    axes = ("batch", "seq", "kv_heads", "head_dim")


def write_rows(cache: HeadCache, slots: jax.Array, k: jax.Array, v: jax.Array) -> HeadCache:
    """`cache` with the keys/values k, v [B,N,KVH,D] at `slots` [B,N]. Slots past the cache are
    dropped, not clamped: a write aimed beyond it (a slot that is not being prefilled, see
    decoding.batcher) leaves the cache as it is."""
    batch = jnp.arange(slots.shape[0])[:, None]
    return HeadCache(k=cache.k.at[batch, slots].set(k.astype(cache.k.dtype), mode="drop"),
                     v=cache.v.at[batch, slots].set(v.astype(cache.v.dtype), mode="drop"))


def init_head_cache(config: DartHeadConfig, batch: int, max_len: int, dtype=jnp.float32) -> HeadCache:
    """A zero cache. A cached call of N rows writes N + draft_length slots from `cache_len`, so
    `max_len` must be at least the longest committed length + N + draft_length."""
    shape = (batch, max_len, config.num_key_value_heads, config.head_dim)
    return HeadCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


class _MidLayer(HeadLayer):
    """The shared draft-head layer plus DART's `mask_rep`, the input of the mask slots [2H]."""

    def __init__(self, config: DartHeadConfig, *, dtype, param_dtype, rngs):
        # drawn first, as before the layer was shared, so that a seed gives the same initial head
        self.mask_rep = param((2 * config.hidden_size,), (None,), param_dtype, rngs)
        super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class DartHead(nnx.Module):
    """The draft head. `embed_tokens` is the target's embedding module (shared, frozen; only its
    `.embedding` [V, H] is read)."""

    def __init__(self, config: DartHeadConfig, embed_tokens, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 rngs: nnx.Rngs | None):
        emb_shape = tuple(embed_tokens.embedding.get_value().shape)
        if emb_shape != (config.vocab_size, config.hidden_size):
            raise ValueError(f"the target embedding is {emb_shape} but the head needs [vocab_size, hidden_size] = "
                             f"{(config.vocab_size, config.hidden_size)}: this head was trained for another target.")
        h = config.hidden_size
        self.config = config
        self.dtype = dtype
        self.embed_tokens = embed_tokens
        self.fc = Linear(config.fc_in, h, (None, "embed"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.midlayer = _MidLayer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = RMSNorm(h, config.rms_norm_eps, param_dtype=param_dtype)
        self.lm_head = Linear(h, config.draft_vocab_size, ("embed", "vocab"), dtype=dtype, param_dtype=param_dtype,
                              rngs=rngs)
        self.d2t = Buffer(jnp.zeros((config.draft_vocab_size,), jnp.int32), logical_axes=("vocab",))
        self.t2d = Buffer(jnp.zeros((config.vocab_size,), jnp.bool_), logical_axes=("vocab",))

    @property
    def num_rows(self) -> int:
        return self.config.num_rows

    def to_target(self, draft_ids: jax.Array) -> jax.Array:
        """Draft-vocabulary ids → target ids (docs/spec.md §3 step 7)."""
        return draft_ids + self.d2t[...][draft_ids]

    def inputs(self, taps: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Layer inputs of real rows: taps [B,n,3Ht] and the ids that follow them [B,n] →
        x [B,n,2H] (normed embedding beside the normed fc output) and the residual g = fc(taps) [B,n,H]."""
        layer = self.midlayer
        g = self.fc(taps)                                                                  # [B,n,H]
        emb = jnp.take(self.embed_tokens.embedding[...], ids, axis=0).astype(self.dtype)  # [B,n,H]
        return jnp.concatenate([layer.input_layernorm(emb), layer.hidden_norm(g)], axis=-1), g

    def mask_inputs(self) -> tuple[jax.Array, jax.Array]:
        """(x, g) of a mask slot: `mask_rep` [2H] and its first half [H]."""
        mask_rep = self.midlayer.mask_rep[...].astype(self.dtype)
        return mask_rep, mask_rep[: self.config.hidden_size]

    def key_values(self, taps: jax.Array, ids: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The keys and values [B,n,KVH,D] of n real rows (taps [B,n,3Ht], the ids that follow them
        [B,n]) at RoPE `positions` [B,n], without a query: what later rows attend to."""
        x, _ = self.inputs(taps, ids)
        return self.midlayer.self_attn.key_values(x, *rope_cos_sin(positions, *head_rope(self.config)))

    def draft_rows(self, x: jax.Array, g: jax.Array, positions: jax.Array, rows: jax.Array, visible: jax.Array,
                   store=None) -> jax.Array:
        """The head's layer: logits [B,Q,Vd] of the query rows (`draft_hidden`'s rows through the LM head)."""
        return self.lm_head(self.draft_hidden(x, g, positions, rows, visible, store))

    def draft_hidden(self, x: jax.Array, g: jax.Array, positions: jax.Array, rows: jax.Array, visible: jax.Array,
                     store=None) -> jax.Array:
        """The head's layer up to its LM head: the normed hidden states [B,Q,H] of the query rows.

        x [B,N,2H] and g [B,N,H] are the N input rows at RoPE `positions` [B,N]; every row gives a
        key and a value, the rows at indices `rows` [B,Q] also a query, which sees the keys where
        `visible` [B,Q,S] (S = N, or the cache length with `store`). `store(k, v)` [B,N,KVH,D]
        may put the new keys/values into a cache and return the keys/values to attend over.
        """
        cfg, layer = self.config, self.midlayer
        scale = 1.0 / math.sqrt(cfg.head_dim)
        with jax.named_scope("draft_attention"):
            cos, sin = rope_cos_sin(positions, *head_rope(cfg))                          # [B,N,D]
            h = layer.self_attn(x, g, cos, sin, rows, lambda q, k, v: attention(q, k, v, visible, scale), store)
        with jax.named_scope("draft_mlp"):
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            # the reference's forward() ends with norm and its compute_logits() applies it again
            return self.norm(self.norm(h))                                               # [B,Q,H]

    def __call__(self, taps: jax.Array, ids: jax.Array) -> jax.Array:
        """Draft logits [B, d, Vd] of n real rows (taps [B,n,3Ht], shifted ids [B,n]) at positions
        0…n−1, without a cache."""
        b, n = ids.shape
        zero = jnp.zeros((b,), jnp.int32)
        return self._draft(taps, ids, zero, jnp.full((b,), n, jnp.int32), None)

    def extend(self, taps: jax.Array, ids: jax.Array, cache: HeadCache, cache_len: jax.Array, n_real: jax.Array):
        """Draft with the head's cache → (logits [B,d,Vd], cache).

        `taps` [B,N,3Ht], `ids` [B,N] where only rows < `n_real[b]` (>= 1) are real; the m mask
        slots follow the real rows at positions `cache_len[b] + n_real[b]` …; the keys/values of
        all N + m slots are written from `cache_len[b]` (garbage past the real + mask slots). The
        caller then advances `cache_len += n_real`, which drops the mask slots (the reference's
        cut-back, docs/spec.md §3).
        """
        return self._draft(taps, ids, cache_len.astype(jnp.int32), n_real.astype(jnp.int32), cache)

    def _draft(self, taps, ids, start, n_real, cache):
        cfg = self.config
        b, n = ids.shape
        m, d = cfg.draft_length, cfg.num_rows
        t = n + m
        with jax.named_scope("draft_inputs"):
            x, g = self.inputs(taps, ids)                                              # [B,n,2H], [B,n,H]
            slot = jnp.arange(t)[None, :]                                              # [1,T]
            real = (slot < n_real[:, None])[..., None]                                 # [B,T,1]
            src = jnp.broadcast_to(jnp.minimum(slot, n - 1), (b, t))[..., None]
            mask_x, mask_g = self.mask_inputs()
            x = jnp.where(real, jnp.take_along_axis(x, src, axis=1), mask_x)           # [B,T,2H]
            g = jnp.where(real, jnp.take_along_axis(g, src, axis=1), mask_g)           # [B,T,H]
            rows = n_real[:, None] - 1 + jnp.arange(d)[None, :]                        # [B,d] slots with queries
        positions = start[:, None] + slot                                              # [B,T]
        if cache is None:
            visible = slot[:, None, :] <= rows[..., None]                              # [B,d,T]
            return self.draft_rows(x, g, positions, rows, visible)
        held = {}

        def store(k, v):
            held["cache"] = write_rows(cache, positions, k, v)
            return held["cache"].k.astype(self.dtype), held["cache"].v.astype(self.dtype)

        visible = jnp.arange(cache.k.shape[1])[None, None, :] <= (start[:, None] + rows)[..., None]  # [B,d,S]
        logits = self.draft_rows(x, g, positions, rows, visible, store)
        return logits, held["cache"]
