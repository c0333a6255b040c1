"""Building blocks shared by the Qwen3 target and the draft heads (DART, EAGLE-3): linear layers,
RMSNorm, RoPE, masked attention, and the draft heads' attention over the 2H-wide row
[embedding; hidden] (`HeadAttention`) and their gated MLP (`GatedMLP`).

Every parameter carries `logical_axes` metadata (batch, seq, heads, kv_heads, head_dim, embed,
mlp, vocab) so that sharding over a Mesh is a rules table (see `dart_jax.models.sharding`).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def param(shape: tuple[int, ...], axes: tuple[str | None, ...], dtype, rngs: nnx.Rngs | None, *, init: str = "normal") -> nnx.Param:
    """A parameter with logical axis names. `init` 'normal' (std 0.02) or 'ones'/'zeros'."""
    assert len(shape) == len(axes), (shape, axes)
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros" or rngs is None:
        value = jnp.zeros(shape, dtype)
    else:
        value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=axes)


class Linear(nnx.Module):
    """y = x @ kernel (+ bias) with kernel [in, out] (the transpose of a PyTorch Linear weight)."""

    def __init__(self, d_in: int, d_out: int, axes: tuple[str | None, str | None], *, dtype, param_dtype,
                 rngs: nnx.Rngs | None, bias: bool = False):
        self.kernel = param((d_in, d_out), axes, param_dtype, rngs)
        self.bias = param((d_out,), axes[1:], param_dtype, None, init="zeros") if bias else None
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        return y if self.bias is None else y + self.bias[...].astype(self.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32 and cast back to the input dtype (as HF Qwen3/Llama do)."""

    def __init__(self, dim: int, eps: float, *, param_dtype, axis_name: str | None = "embed"):
        self.weight = param((dim,), (axis_name,), param_dtype, None, init="ones")
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(dtype) * x32.astype(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None, *,
                  dynamic_length: int | None = None, max_position_embeddings: int | None = None,
                  yarn_mscale_ratio: bool = False) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim//2] and the cos/sin scale of a RoPE config — the one RoPE of
    the project, for the target and the draft head alike.

    Kinds (HF semantics): 'default', 'linear', 'llama3', 'yarn', and 'dynamic' (NTK) evaluated
    once at `dynamic_length` positions for a model of `max_position_embeddings` (shapes are
    static, so it is not rebuilt as a sequence grows). `yarn_mscale_ratio` takes the yarn
    attention scale as get_mscale(mscale or 1) / get_mscale(mscale_all_dim or 0) in every case,
    as the reference draft head does; HF does so only when both are set.
    """
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv.astype(np.float32), 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv / factor).astype(np.float32), 1.0
    if kind == "dynamic":
        if dynamic_length is None or max_position_embeddings is None:
            raise ValueError("dynamic rope_scaling depends on the sequence length; it is supported for the draft "
                             "head only, evaluated at a fixed length.")
        base = theta * (factor * dynamic_length / max_position_embeddings - (factor - 1)) ** (head_dim / (head_dim - 2))
        return (1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(np.float32), 1.0
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low) if low != high else np.zeros_like(inv)
        mid = (1 - smooth) * inv / factor + smooth * inv
        out = np.where(wavelen < old_len / high, inv, np.where(wavelen > old_len / low, inv / factor, mid))
        return out.astype(np.float32), 1.0
    if kind == "yarn":
        old_len = float(scaling["original_max_position_embeddings"])
        beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

        def corr_dim(rot):
            return (head_dim * math.log(old_len / (rot * 2 * math.pi))) / (2 * math.log(theta))

        lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, head_dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp
        inv_yarn = (inv / factor) * (1 - extrapolation) + inv * extrapolation

        def get_mscale(m=1.0):
            return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0

        ms, ms_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        mscale = scaling.get("attention_factor")
        if yarn_mscale_ratio:
            mscale = get_mscale(1.0 if ms is None else ms) / get_mscale(0.0 if ms_all is None else ms_all)
        elif mscale is None:
            mscale = get_mscale(ms) / get_mscale(ms_all) if ms and ms_all else get_mscale()
        return inv_yarn.astype(np.float32), float(mscale)
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: default, linear, llama3, yarn"
                     " (and dynamic for the draft head)")


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray, attn_scale: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, head_dim] in float32 for integer positions [B, T] (rotate-half layout)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]  # [B,T,D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * attn_scale, jnp.sin(emb) * attn_scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, heads, D] rotated in float32 (rotate-half), returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


def group_queries(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, T, Hq, D] → [B, Hkv, G·T, D], G = Hq / Hkv: each KV head's queries as the rows of one
    matrix (row g·T + t: query head g of the group at token t), so that attention is one batched
    matmul per KV head. XLA:CPU multiplies this layout faster than [B, T, Hkv, G, D] against the
    same keys (benchmarks/RESULTS.md; `Qwen3.verify`; a long prefill keeps `attention`, whose
    float32 sums it would reorder past the parity tests' 1e-4)."""
    b, t, hq, d = q.shape
    g = hq // kv_heads
    return q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, d)


def ungroup_queries(out: jax.Array, t: int) -> jax.Array:
    """`group_queries`' inverse: [B, Hkv, G·T, D] → [B, T, Hq, D]."""
    b, hkv, m, d = out.shape
    return out.reshape(b, hkv, m // t, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, hkv * (m // t), d)


def group_mask(mask: jax.Array, groups: int) -> jax.Array:
    """mask [B, T, S] → [B, 1, G·T, S], the rows of `group_queries`' layout."""
    return jnp.tile(mask, (1, groups, 1))[:, None]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Masked GQA attention with the softmax in float32.

    q [B, T, Hq, D], k/v [B, S, Hkv, D], mask [B, T, S] bool (True = may attend) → [B, T, Hq, D].
    Rows with no allowed key give zeros instead of NaN.
    """
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qg = q.reshape(b, t, hkv, g, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale  # [B,Hkv,G,T,S]
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(mask[:, None, None, :, :], probs, 0.0).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)  # [B,T,Hkv,G,D]
    return out.reshape(b, t, hq, d)


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                    implementation: str = "cudnn") -> jax.Array:
    """`attention` by `jax.nn.dot_product_attention`: with implementation "cudnn", cuDNN's fused
    (flash) attention kernel, on an NVIDIA GPU in bfloat16 or float16 only; "xla" runs the same
    function in XLA (what the tests compare on a CPU). q [B, T, Hq, D], k/v [B, S, Hkv, D] (Hq a
    multiple of Hkv), mask [B, T, S] bool → [B, T, Hq, D]; every row must see at least one key
    (the target's always sees itself)."""
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale, implementation=implementation)


# the draft heads' `hidden_act` values (dart_jax.convert.dart_head.ACTIVATIONS) → functions
ACTIVATION_FNS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}

# attend(q [B,Q,Hq,D], k, v [B,S,KVH,D]) → attention output [B,Q,Hq,D]
Attend = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


class HeadAttention(nnx.Module):
    """A draft head's attention (DART and EAGLE-3 alike, the reference's LlamaAttention with a
    2H-wide input): q/k/v projections of the row [embedding; hidden] [.., 2H], o back to H.
    `config` has hidden_size, head_dim, num_attention_heads and num_key_value_heads."""

    def __init__(self, config, *, dtype, param_dtype, rngs):
        h2, d = 2 * config.hidden_size, config.head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = Linear(h2, config.num_attention_heads * d, ("embed", "heads"), **kw)
        self.k_proj = Linear(h2, config.num_key_value_heads * d, ("embed", "kv_heads"), **kw)
        self.v_proj = Linear(h2, config.num_key_value_heads * d, ("embed", "kv_heads"), **kw)
        self.o_proj = Linear(config.num_attention_heads * d, config.hidden_size, ("heads", "embed"), **kw)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d

    def key_values(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Every input row's key (RoPE applied) and value [B,N,KVH,D], of x [B,N,2H] and its RoPE cos/sin [B,N,D]."""
        b, n, _ = x.shape
        keys = apply_rope(self.k_proj(x).reshape(b, n, self.num_kv_heads, self.head_dim), cos, sin)
        return keys, self.v_proj(x).reshape(b, n, self.num_kv_heads, self.head_dim)

    def __call__(self, x: jax.Array, residual: jax.Array, cos: jax.Array, sin: jax.Array, rows: jax.Array | None,
                 attend: Attend, store: Callable | None = None) -> jax.Array:
        """x [B,N,2H] and residual [B,N,H] are the N input rows, cos/sin [B,N,D] their RoPE. Every
        row gives a key and a value (`store(k, v)` [B,N,KVH,D] may put them into a cache and return
        the keys/values to attend over); the rows at indices `rows` [B,Q] (None: all) also a query,
        and `attend` says what each sees. → residual + attention output, [B,Q,H]."""
        b = x.shape[0]
        keys, values = self.key_values(x, cos, sin)
        if store is not None:
            keys, values = store(keys, values)
        if rows is not None:
            at = rows[..., None]
            x, residual = jnp.take_along_axis(x, at, axis=1), jnp.take_along_axis(residual, at, axis=1)  # [B,Q,..]
            cos, sin = jnp.take_along_axis(cos, at, axis=1), jnp.take_along_axis(sin, at, axis=1)
        q_count = x.shape[1]
        q = apply_rope(self.q_proj(x).reshape(b, q_count, self.num_heads, self.head_dim), cos, sin)
        out = attend(q, keys, values)                                                              # [B,Q,Hq,D]
        return residual + self.o_proj(out.reshape(b, q_count, -1))                                 # [B,Q,H]


class GatedMLP(nnx.Module):
    """down(act(gate(x)) * up(x)), H → I → H: the draft heads' MLP (`config.hidden_act`)."""

    def __init__(self, config, *, dtype, param_dtype, rngs):
        h, i = config.hidden_size, config.intermediate_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear(h, i, ("embed", "mlp"), **kw)
        self.up_proj = Linear(h, i, ("embed", "mlp"), **kw)
        self.down_proj = Linear(i, h, ("mlp", "embed"), **kw)
        self.act = config.hidden_act

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(ACTIVATION_FNS[self.act](self.gate_proj(x)) * self.up_proj(x))  # [..,I] -> [..,H]


class HeadLayer(nnx.Module):
    """A draft head's decoder layer (DART and EAGLE-3 alike): norms of the embedding
    (`input_layernorm`) and of the hidden state (`hidden_norm`), `HeadAttention` over their
    concatenation, and `GatedMLP` after `post_attention_layernorm`; the names are the checkpoints'."""

    def __init__(self, config, *, dtype, param_dtype, rngs):
        h, eps = config.hidden_size, config.rms_norm_eps
        self.hidden_norm = RMSNorm(h, eps, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(h, eps, param_dtype=param_dtype)
        self.post_attention_layernorm = RMSNorm(h, eps, param_dtype=param_dtype)
        self.self_attn = HeadAttention(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mlp = GatedMLP(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
