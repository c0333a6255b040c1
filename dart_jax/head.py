"""The DART draft head (SPEC §3): one Llama-style decoder layer that drafts d = m+1 rows at once.

The head reads the target's three taps and the shifted token ids of the rows committed in this
step, appends m `mask_rep` slots, and returns d logit rows over the draft vocabulary. Its
parameters are named after the reference checkpoint (`fc`, `midlayer.…`, `norm`, `lm_head`,
`d2t`, `t2d`) so that conversion is a name table (see `dart_jax.convert.dart_head`).

RoPE follows the reference head, which differs from the target's RoPE in two ways worth knowing:
only the plain and 'llama3' kinds use `rope_theta`; the 'linear', 'dynamic' and 'yarn' kinds of
the reference always use base 10000. 'dynamic' (NTK) is computed the way the reference sets it up
at construction (for a table of `max_position_embeddings + 20` positions); the reference rebuilds
it when a sequence grows past that, which static shapes cannot follow, so positions beyond that
length differ from the reference for 'dynamic' only.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .layers import Linear, RMSNorm, apply_rope, attention, param, rope_cos_sin

_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "draft_length", "draft_vocab_size")


def _freeze(value: Any) -> Any:
    """JSON value → hashable equivalent (dicts become sorted item tuples, lists tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@dataclasses.dataclass(frozen=True)
class DartHeadConfig:
    """The head's config.json (Llama-style fields plus draft_length / draft_vocab_size).

    Hashable, so it can sit in a GraphDef or be a static jit argument. `rope_scaling` is kept as
    sorted (key, value) pairs; `rope_scaling_dict` gives it back as a dict. Fields we do not use
    are kept in `extra` (key, JSON text) so that `to_hf` writes them back unchanged.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_length: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    target_hidden_size: int | None = None
    extra: tuple = ()

    @property
    def num_rows(self) -> int:
        return self.draft_length + 1

    @property
    def fc_in(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return None if self.rope_scaling is None else {k: v for k, v in self.rope_scaling}

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "DartHeadConfig":
        missing = [k for k in _REQUIRED if cfg.get(k) is None]
        if missing:
            raise ValueError(f"DART head config.json lacks {missing}; a DART head config needs {list(_REQUIRED)} "
                             "(Llama-style fields plus draft_length and draft_vocab_size).")
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}.")
        act = cfg.get("hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported; supported: {sorted(_ACTIVATIONS)}.")
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None and isinstance(cfg.get("rope_parameters"), Mapping):
            # transformers >= 5 writes rope_theta (and the scaling kind) inside rope_parameters
            params = dict(cfg["rope_parameters"])
            rope_theta = params.pop("rope_theta", None)
            if rope_scaling is None and params.get("rope_type", "default") != "default":
                rope_scaling = params
        # torch_dtype / dtype describe a saved file, not the head; save_dart_head writes its own
        known = {f.name for f in dataclasses.fields(cls)} | {"rope_parameters", "torch_dtype", "dtype"}
        config = cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            vocab_size=int(cfg["vocab_size"]),
            draft_length=int(cfg["draft_length"]),
            draft_vocab_size=int(cfg["draft_vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=None if rope_scaling is None else _freeze(rope_scaling),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            hidden_act=act,
            target_hidden_size=None if cfg.get("target_hidden_size") is None else int(cfg["target_hidden_size"]),
            extra=tuple(sorted((k, json.dumps(v)) for k, v in cfg.items() if k not in known)),
        )
        if config.draft_length < 1:
            raise ValueError(f"draft_length must be >= 1, got {config.draft_length}.")
        head_rope(config)  # reject unsupported RoPE kinds before anything is built
        return config

    def to_hf(self) -> dict:
        out = {k: json.loads(v) for k, v in self.extra}
        out.setdefault("architectures", ["LlamaForCausalLMDart"])
        out.setdefault("model_type", "llama")
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name == "rope_scaling":
                value = self.rope_scaling_dict
            if f.name == "target_hidden_size" and value is None:
                continue
            out[f.name] = value
        return out


def head_rope(config: DartHeadConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim//2] and cos/sin scale, as the reference head builds them."""
    dim = config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    scaling = config.rope_scaling_dict
    if not scaling:
        return (1.0 / config.rope_theta ** exponents).astype(np.float32), 1.0
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = scaling.get("factor")
    if kind == "default":
        return (1.0 / config.rope_theta ** exponents).astype(np.float32), 1.0
    if kind in ("linear", "dynamic", "yarn") and factor is None:
        raise ValueError(f"rope_scaling {scaling} of kind {kind!r} needs a 'factor'.")
    if kind == "linear":
        return (1.0 / 10000.0 ** exponents / float(factor)).astype(np.float32), 1.0
    if kind == "dynamic":
        table_len = config.max_position_embeddings + 20
        base = 10000.0 * (float(factor) * table_len / config.max_position_embeddings - (float(factor) - 1)) ** (dim / (dim - 2))
        return (1.0 / base ** exponents).astype(np.float32), 1.0
    if kind == "llama3":
        inv = 1.0 / config.rope_theta ** exponents
        keys = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if any(scaling.get(k) is None for k in keys):
            return inv.astype(np.float32), 1.0  # the reference falls back to plain RoPE then
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        factor = float(factor) if factor is not None else 1.0
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low) if low != high else 0.0
        mid = (1 - smooth) * inv / factor + smooth * inv
        out = np.where(wavelen < old_len / high, inv, np.where(wavelen > old_len / low, inv / factor, mid))
        return out.astype(np.float32), 1.0
    if kind == "yarn":
        factor = float(factor)
        old_len = float(scaling.get("original_max_position_embeddings") or 4096)
        beta_fast = float(scaling.get("beta_fast") or 32)
        beta_slow = float(scaling.get("beta_slow") or 1)
        mscale = float(scaling.get("mscale") if scaling.get("mscale") is not None else 1)
        mscale_all = float(scaling.get("mscale_all_dim") if scaling.get("mscale_all_dim") is not None else 0)

        def corr_dim(rotations):
            return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(10000.0))

        def get_mscale(m):
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

        lo = max(math.floor(corr_dim(beta_fast)), 0)
        hi = min(math.ceil(corr_dim(beta_slow)), dim - 1)
        if lo == hi:
            hi += 0.001
        extrapolate = 1 - np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        inv = 1.0 / 10000.0 ** exponents
        out = inv / factor * (1 - extrapolate) + inv * extrapolate
        return out.astype(np.float32), get_mscale(mscale) / get_mscale(mscale_all)
    raise ValueError(f"rope_scaling kind {kind!r} is not supported by the DART head; "
                     "supported: none, default, linear, dynamic, llama3, yarn (as in the reference head).")


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


def init_head_cache(config: DartHeadConfig, batch: int, max_len: int, dtype=jnp.float32) -> HeadCache:
    """A zero cache. A cached call of N rows writes N + draft_length slots from `cache_len`, so
    `max_len` must be at least the longest committed length + N + draft_length."""
    shape = (batch, max_len, config.num_key_value_heads, config.head_dim)
    return HeadCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


class _Attention(nnx.Module):
    def __init__(self, config: DartHeadConfig, *, dtype, param_dtype, rngs):
        h2, d = 2 * config.hidden_size, config.head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = Linear(h2, config.num_attention_heads * d, ("embed", "heads"), **kw)
        self.k_proj = Linear(h2, config.num_key_value_heads * d, ("embed", "kv_heads"), **kw)
        self.v_proj = Linear(h2, config.num_key_value_heads * d, ("embed", "kv_heads"), **kw)
        self.o_proj = Linear(config.num_attention_heads * d, config.hidden_size, ("heads", "embed"), **kw)


class _MLP(nnx.Module):
    def __init__(self, config: DartHeadConfig, *, dtype, param_dtype, rngs):
        h, i = config.hidden_size, config.intermediate_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear(h, i, ("embed", "mlp"), **kw)
        self.up_proj = Linear(h, i, ("embed", "mlp"), **kw)
        self.down_proj = Linear(i, h, ("mlp", "embed"), **kw)
        self.act = config.hidden_act

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(_ACTIVATIONS[self.act](self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nnx.Module):
    def __init__(self, config: DartHeadConfig, *, dtype, param_dtype, rngs):
        h, eps = config.hidden_size, config.rms_norm_eps
        self.mask_rep = param((2 * h,), (None,), param_dtype, rngs)
        self.hidden_norm = RMSNorm(h, eps, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(h, eps, param_dtype=param_dtype)
        self.post_attention_layernorm = RMSNorm(h, eps, param_dtype=param_dtype)
        self.self_attn = _Attention(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mlp = _MLP(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class DartHead(nnx.Module):
    """The draft head. `embed_tokens` is the target's embedding module (shared, frozen; only its
    `.embedding` [V, H] is read). See `__call__` for the two calling conventions."""

    def __init__(self, config: DartHeadConfig, embed_tokens, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs | None):
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
        self.lm_head = Linear(h, config.draft_vocab_size, ("embed", "vocab"), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.d2t = Buffer(jnp.zeros((config.draft_vocab_size,), jnp.int32), logical_axes=("vocab",))
        self.t2d = Buffer(jnp.zeros((config.vocab_size,), jnp.bool_), logical_axes=("vocab",))

    @property
    def num_rows(self) -> int:
        return self.config.num_rows

    def to_target(self, draft_ids: jax.Array) -> jax.Array:
        """Draft-vocabulary ids → target ids (SPEC §3 step 7)."""
        return draft_ids + self.d2t[...][draft_ids]

    def __call__(self, taps: jax.Array, ids: jax.Array, *, cache: HeadCache | None = None,
                 cache_len: jax.Array | None = None, n_real: jax.Array | None = None):
        """Draft logits [B, d, Vd].

        Without a cache: `taps` [B, n, 3Ht] and `ids` [B, n] are all real rows at positions 0…n−1.
        With a cache: `taps` [B, N, 3Ht], `ids` [B, N] where only rows < `n_real[b]` (>= 1) are
        real; the m mask slots follow the real rows at positions `cache_len[b] + n_real[b]` …;
        the keys/values of all N + m slots are written from `cache_len[b]` (garbage past the
        real + mask slots). Returns `(logits, cache)`; the caller then advances
        `cache_len += n_real`, which drops the mask slots (the reference's cut-back).
        """
        cfg = self.config
        b, n = ids.shape
        m, d = cfg.draft_length, cfg.num_rows
        attn, layer = self.midlayer.self_attn, self.midlayer
        if (cache is None) != (cache_len is None) or (cache is None and n_real is not None):
            raise ValueError("pass cache, cache_len and n_real together, or none of them.")
        if cache is None:
            start = jnp.zeros((b,), jnp.int32)
            n_real = jnp.full((b,), n, jnp.int32)
        else:
            start = cache_len.astype(jnp.int32)
            n_real = jnp.full((b,), n, jnp.int32) if n_real is None else n_real.astype(jnp.int32)

        with jax.named_scope("dart_inputs"):
            g = self.fc(taps)                                                          # [B,n,H]
            emb = jnp.take(self.embed_tokens.embedding[...], ids, axis=0).astype(self.dtype)
            x = jnp.concatenate([layer.input_layernorm(emb), layer.hidden_norm(g)], axis=-1)  # [B,n,2H]
            t = n + m
            slot = jnp.arange(t)[None, :]                                              # [1,T]
            real = slot < n_real[:, None]                                              # [B,T]
            src = jnp.broadcast_to(jnp.minimum(slot, n - 1), (b, t))
            mask_rep = layer.mask_rep[...].astype(self.dtype)
            x = jnp.where(real[..., None], jnp.take_along_axis(x, src[..., None], axis=1), mask_rep)  # [B,T,2H]
            g = jnp.where(real[..., None], jnp.take_along_axis(g, src[..., None], axis=1),
                          mask_rep[: cfg.hidden_size])                                 # [B,T,H]
            rows = n_real[:, None] - 1 + jnp.arange(d)[None, :]                        # [B,d] slots with queries

        with jax.named_scope("dart_attention"):
            inv_freq, rope_scale = head_rope(cfg)
            kvh, hd = cfg.num_key_value_heads, cfg.head_dim
            cos, sin = rope_cos_sin(start[:, None] + slot, inv_freq, rope_scale)        # [B,T,D]
            k = apply_rope(attn.k_proj(x).reshape(b, t, kvh, hd), cos, sin)             # [B,T,KVH,D]
            v = attn.v_proj(x).reshape(b, t, kvh, hd)
            xq = jnp.take_along_axis(x, rows[..., None], axis=1)                       # [B,d,2H]
            cos_q, sin_q = rope_cos_sin(start[:, None] + rows, inv_freq, rope_scale)
            q = apply_rope(attn.q_proj(xq).reshape(b, d, cfg.num_attention_heads, hd), cos_q, sin_q)
            if cache is None:
                keys, values, new_cache = k, v, None
            else:
                write = jax.vmap(lambda buf, new, at: jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), (at, 0, 0)))
                new_cache = HeadCache(k=write(cache.k, k, start), v=write(cache.v, v, start))
                keys, values = new_cache.k.astype(self.dtype), new_cache.v.astype(self.dtype)
            visible = jnp.arange(keys.shape[1])[None, None, :] <= (start[:, None] + rows)[..., None]  # [B,d,S]
            out = attention(q, keys, values, visible, 1.0 / math.sqrt(hd))             # [B,d,Hq,D]
            h = jnp.take_along_axis(g, rows[..., None], axis=1) + attn.o_proj(out.reshape(b, d, -1))  # [B,d,H]

        with jax.named_scope("dart_mlp"):
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            # the reference's forward() ends with norm and its compute_logits() applies it again
            logits = self.lm_head(self.norm(self.norm(h)))                             # [B,d,Vd]
        return logits if cache is None else (logits, new_cache)
