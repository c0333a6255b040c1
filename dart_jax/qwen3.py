"""The Qwen3 target model in Flax NNX, numerically matching HF transformers' Qwen3.

One forward serves prefill, single-token decode and tree verification: the new tokens come with
explicit positions and a boolean mask among themselves, and attend to the valid prefix of a
preallocated KV cache (`cache_len[b]` slots per batch row). The three DART taps (SPEC §2) are the
residual-stream inputs of layers 2, L//2 and L-3.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from .layers import Linear, RMSNorm, apply_rope, attention, param, rope_cos_sin, rope_inv_freq

CACHE_AXES = ("layers", "batch", "seq", "kv_heads", "head_dim")


def default_dtype():
    """float32 on CPU (XLA's bf16 matmuls are slow there), bfloat16 on GPU and TPU."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


_SCALED_ROPE_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                     "mscale", "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # (key, value) pairs so that the config stays hashable (it is static under jit); None = plain RoPE
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"Qwen3 config: {name} must be a positive integer, got {getattr(self, name)!r}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"Qwen3 config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention.")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3 config: head_dim must be even for RoPE, got {self.head_dim}.")
        if self.num_hidden_layers < 3:
            raise ValueError(f"Qwen3 config: DART taps layers 2, L//2 and L-3, so num_hidden_layers must be >= 3, "
                             f"got {self.num_hidden_layers}.")
        rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling_dict)  # fail early on a bad rope_scaling

    @property
    def tap_layers(self) -> tuple[int, int, int]:
        n = self.num_hidden_layers
        return (2, n // 2, n - 3)

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "Qwen3Config":
        """Build from a HF Qwen3 `config.json` dict (transformers 4 or 5 layout)."""
        model_type = cfg.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise ValueError(f"expected a Qwen3 config (model_type 'qwen3'), got model_type {model_type!r}.")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ValueError(f"Qwen3 config.json lacks required field(s) {missing}.")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3 config: only hidden_act 'silu' is supported, got {cfg['hidden_act']!r}.")
        if cfg.get("attention_bias", False):
            raise ValueError("Qwen3 config: attention_bias=true is not supported (standard Qwen3 has no q/k/v biases).")
        if cfg.get("use_sliding_window", False) or any(t != "full_attention" for t in cfg.get("layer_types") or ()):
            raise ValueError("Qwen3 config: sliding-window attention layers are not supported; "
                             "set use_sliding_window=false (standard Qwen3 uses full attention).")
        heads = int(cfg["num_attention_heads"])
        max_pos = int(cfg.get("max_position_embeddings", 40960))

        # transformers 5 keeps rope_theta and the scaling inside rope_parameters; older configs keep
        # rope_theta at the top level and the scaling in rope_scaling
        rope_params = dict(cfg.get("rope_parameters") or {})
        theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = dict(cfg.get("rope_scaling") or {}) or rope_params
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            rope_scaling = None
        else:
            scaling = {k: v for k, v in scaling.items() if k in _SCALED_ROPE_KEYS}
            scaling["rope_type"] = kind
            if kind in ("yarn", "llama3"):
                scaling.setdefault("original_max_position_embeddings",
                                   cfg.get("original_max_position_embeddings", max_pos))
            if kind == "yarn" and scaling.get("factor") is None:
                scaling["factor"] = max_pos / scaling["original_max_position_embeddings"]
            rope_scaling = _freeze(scaling)

        eos = cfg.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=max_pos,
            eos_token_ids=eos_ids,
        )


@functools.lru_cache(maxsize=16)
def _rope_tables(config: Qwen3Config) -> tuple[np.ndarray, float]:
    return rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling_dict)


@struct.dataclass
class KVCache:
    """Keys and values of every layer, `[L, B, S_max, KVH, D]`; valid lengths live with the caller."""

    k: jax.Array
    v: jax.Array


def init_cache(config: Qwen3Config, batch: int, max_len: int, dtype=None) -> KVCache:
    shape = (config.num_hidden_layers, batch, max_len, config.num_key_value_heads, config.head_dim)
    dtype = dtype or default_dtype()
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


class Embed(nnx.Module):
    def __init__(self, vocab: int, dim: int, *, dtype, param_dtype, rngs: nnx.Rngs | None):
        self.embedding = param((vocab, dim), ("vocab", "embed"), param_dtype, rngs)
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)  # [..., H]


class Attention(nnx.Module):
    def __init__(self, c: Qwen3Config, *, dtype, param_dtype, rngs):
        h, nq, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = Linear(h, nq * d, ("embed", "heads"), **kw)
        self.k_proj = Linear(h, nkv * d, ("embed", "kv_heads"), **kw)
        self.v_proj = Linear(h, nkv * d, ("embed", "kv_heads"), **kw)
        self.o_proj = Linear(nq * d, h, ("heads", "embed"), **kw)
        self.q_norm = RMSNorm(d, c.rms_norm_eps, param_dtype=param_dtype, axis_name="head_dim")
        self.k_norm = RMSNorm(d, c.rms_norm_eps, param_dtype=param_dtype, axis_name="head_dim")
        self.num_heads, self.num_kv_heads, self.head_dim = nq, nkv, d

    def __call__(self, x, cos, sin, mask, cache: KVCache | None, layer: int, slots: jax.Array | None,
                 visible: jax.Array | None):
        """x [B,T,H]. Three modes: no cache (mask [B,T,T]); `slots` [B,T]: write the new keys/values
        there, then attend over the cache (mask [B,T,S]); `visible` [B,S]: leave the cache as it is
        and attend over its visible slots plus the new tokens (mask [B,T,T]). Returns the output,
        the cache and this layer's new keys/values [B,T,Hkv,D]."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim))  # [B,T,Hq,D]
        k = self.k_norm(self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim))  # [B,T,Hkv,D]
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)  # [B,T,Hkv,D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scale = self.head_dim ** -0.5
        if cache is None:
            out = attention(q, k, v, mask, scale)  # [B,T,Hq,D]
        elif visible is None:
            rows = jnp.arange(b)[:, None]  # [B,1] against slots [B,T]
            # writes past S_max are dropped rather than clamped, so an overflow cannot corrupt valid slots
            cache = KVCache(k=cache.k.at[layer, rows, slots].set(k.astype(cache.k.dtype), mode="drop"),
                            v=cache.v.at[layer, rows, slots].set(v.astype(cache.v.dtype), mode="drop"))
            out = attention(q, cache.k[layer].astype(x.dtype), cache.v[layer].astype(x.dtype), mask, scale)
        else:
            # the new keys are read back as the cache would hold them, as in the writing mode
            k = k.astype(cache.k.dtype).astype(x.dtype)
            v = v.astype(cache.v.dtype).astype(x.dtype)
            out = _attention_with_cache(q, k, v, cache.k[layer].astype(x.dtype), cache.v[layer].astype(x.dtype),
                                        visible, mask, scale)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)), cache, (k, v)


def _attention_with_cache(q, k_new, v_new, k_old, v_old, visible, new_mask, scale):
    """Attention of T new tokens over two key blocks, the cache (slots where `visible` [B,S]) and
    the new tokens themselves (`new_mask` [B,T,T]), with one softmax over both. Keeping the new
    keys out of the cache here means a forward never writes the cache per layer and never builds
    a [B,T,S] mask by gathering."""
    b, t, hq, d = q.shape
    hkv = k_new.shape[2]
    s = k_old.shape[1]
    qg = q.reshape(b, t, hkv, hq // hkv, d)
    scores = jnp.concatenate([jnp.einsum("btkgd,bskd->bkgts", qg, k_old, preferred_element_type=jnp.float32),
                              jnp.einsum("btkgd,bskd->bkgts", qg, k_new, preferred_element_type=jnp.float32)],
                             axis=-1) * scale  # [B,Hkv,G,T,S+T]
    mask = jnp.concatenate([jnp.broadcast_to(visible[:, None, :], (b, t, s)), new_mask], axis=-1)[:, None, None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(mask, probs, 0.0).astype(v_new.dtype)
    out = (jnp.einsum("bkgts,bskd->btkgd", probs[..., :s], v_old, preferred_element_type=jnp.float32)
           + jnp.einsum("bkgts,bskd->btkgd", probs[..., s:], v_new, preferred_element_type=jnp.float32))
    return out.astype(v_new.dtype).reshape(b, t, hq, d)


def write_cache(cache: KVCache, cache_len: jax.Array, new: KVCache) -> KVCache:
    """Write `new` ([L,B,T,KVH,D] keys/values) at slots `cache_len[b] + j`: one in-place scatter of
    the T new slots per array. Writes past S_max are dropped rather than clamped, so an overflow
    cannot corrupt valid slots."""
    b, t = new.k.shape[1], new.k.shape[2]
    rows = jnp.arange(b)[:, None]  # [B,1] against slots [B,T]
    slots = jnp.asarray(cache_len, jnp.int32)[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    return KVCache(k=cache.k.at[:, rows, slots].set(new.k.astype(cache.k.dtype), mode="drop"),
                   v=cache.v.at[:, rows, slots].set(new.v.astype(cache.v.dtype), mode="drop"))


class MLP(nnx.Module):
    def __init__(self, c: Qwen3Config, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, ("embed", "mlp"), **kw)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, ("embed", "mlp"), **kw)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, ("mlp", "embed"), **kw)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))  # [B,T,I] -> [B,T,H]


class DecoderLayer(nnx.Module):
    def __init__(self, c: Qwen3Config, *, dtype, param_dtype, rngs):
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=param_dtype)
        self.self_attn = Attention(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=param_dtype)
        self.mlp = MLP(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x, cos, sin, mask, cache, layer, slots, visible):
        with jax.named_scope("attention"):
            attn, cache, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer, slots, visible)
            x = x + attn
        with jax.named_scope("mlp"):
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x, cache, kv


class Qwen3(nnx.Module):
    """Qwen3 causal LM. Call `forward_hidden` + `lm_logits`, or the model itself (see DESIGN.md)."""

    def __init__(self, config: Qwen3Config, *, dtype=None, param_dtype=None, rngs: nnx.Rngs):
        dtype = jnp.dtype(dtype or default_dtype())
        param_dtype = jnp.dtype(param_dtype or dtype)
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.config = config
        self.dtype = dtype
        self.embed_tokens = Embed(config.vocab_size, config.hidden_size, **kw)
        self.layers = nnx.List([DecoderLayer(config, **kw) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, ("embed", "vocab"), **kw)

    def forward_hidden(self, ids: jax.Array, *, positions: jax.Array | None = None, cache: KVCache | None = None,
                       cache_len: jax.Array | None = None, mask: jax.Array | None = None, return_taps: bool = False):
        """ids [B,T] → (hidden [B,T,H] after the final norm, taps [B,T,3H] | None, cache | None).

        With a cache the new keys/values go to slots `cache_len[b] + j`; token j sees the cache slots
        `< cache_len[b]` and new token i where `mask[b, j, i]` (default causal). The caller must keep
        `cache_len + T <= S_max`: writes beyond the cache are dropped.
        """
        # Each layer writes its T new slots and then reads its cache layer: that data dependency
        # lets XLA update the donated cache in place.
        hidden, taps, cache, _ = self._forward(ids, positions, cache, cache_len, mask, return_taps, write=True)
        return hidden, taps, cache

    def forward_hidden_kv(self, ids: jax.Array, *, positions: jax.Array | None = None, cache: KVCache,
                          cache_len: jax.Array, mask: jax.Array | None = None, return_taps: bool = False):
        """`forward_hidden` with a cache that leaves the cache untouched and returns the new
        tokens' keys/values instead: (hidden, taps | None, KVCache [L,B,T,KVH,D]). A caller that
        keeps only some of the new tokens (tree verification) writes just those with `write_cache`,
        after something that depends on this forward's output, so that the write stays in place."""
        hidden, taps, _, new = self._forward(ids, positions, cache, cache_len, mask, return_taps, write=False)
        return hidden, taps, new

    def _forward(self, ids, positions, cache, cache_len, mask, return_taps, *, write: bool):
        b, t = ids.shape
        causal = jnp.tril(jnp.ones((t, t), bool))
        new_mask = jnp.broadcast_to(causal if mask is None else mask.astype(bool), (b, t, t))  # [B,T,T]
        slots = visible = None
        if cache is None:
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
            layer_mask = new_mask
        else:
            if cache_len is None:
                raise ValueError("forward_hidden with a cache needs cache_len int32[B] (valid slots per row).")
            cache_len = jnp.broadcast_to(jnp.asarray(cache_len, jnp.int32), (b,))
            slots = cache_len[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B,T]
            if positions is None:
                positions = slots
            rel = jnp.arange(cache.k.shape[2], dtype=jnp.int32)[None, :] - cache_len[:, None]  # [B,S] slot - first new
            if not write:
                visible, slots, layer_mask = rel < 0, None, new_mask
            elif mask is None:
                # causal: new token j sees every slot up to its own, an iota compare (no gather)
                layer_mask = rel[:, None, :] <= jnp.arange(t, dtype=jnp.int32)[None, :, None]  # [B,T,S]
            else:
                is_new = (rel >= 0) & (rel < t)
                among_new = jnp.take_along_axis(new_mask, jnp.clip(rel, 0, t - 1)[:, None, :], axis=2)  # [B,T,S]
                layer_mask = (rel < 0)[:, None, :] | (is_new[:, None, :] & among_new)  # [B,T,S]
        positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, t))
        inv_freq, attn_scale = _rope_tables(self.config)
        cos, sin = rope_cos_sin(positions, inv_freq, attn_scale)  # [B,T,D]

        with jax.named_scope("embed"):
            x = self.embed_tokens(ids)  # [B,T,H]
        layer_inputs, keys, values = {}, [], []
        for i, layer in enumerate(self.layers):
            if return_taps and i in self.config.tap_layers:
                layer_inputs[i] = x
            with jax.named_scope(f"layer_{i}"):
                x, cache, (k, v) = layer(x, cos, sin, layer_mask, cache, i, slots, visible)
            keys.append(k)
            values.append(v)
        taps = None
        if return_taps:
            taps = jnp.concatenate([layer_inputs[i] for i in self.config.tap_layers], axis=-1)  # [B,T,3H]
        with jax.named_scope("final_norm"):
            x = self.norm(x)
        new = None if write or cache is None else KVCache(k=jnp.stack(keys), v=jnp.stack(values))
        return x, taps, cache, new

    def lm_logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., H] → float32 logits [..., V]."""
        with jax.named_scope("lm_head"):
            h = hidden.astype(self.dtype)
            if self.lm_head is None:
                w = self.embed_tokens.embedding[...].astype(self.dtype)
                return jnp.einsum("...h,vh->...v", h, w, preferred_element_type=jnp.float32)  # [...,V]
            w = self.lm_head.kernel[...].astype(self.dtype)
            return jnp.einsum("...h,hv->...v", h, w, preferred_element_type=jnp.float32)  # [...,V]

    def __call__(self, ids: jax.Array, *, positions=None, cache: KVCache | None = None, cache_len=None, mask=None,
                 return_taps: bool = False):
        hidden, taps, cache = self.forward_hidden(ids, positions=positions, cache=cache, cache_len=cache_len,
                                                  mask=mask, return_taps=return_taps)
        logits = self.lm_logits(hidden)
        if cache is not None:
            return logits, taps, cache
        return (logits, taps) if return_taps else logits
