"""The target model in Flax NNX, numerically matching HF transformers' Qwen3, Qwen3-MoE and Llama
(the same decoder; Llama has no per-head q/k norms and may have attention biases; Qwen3-MoE's sparse
layers hold `qwen3_moe.SparseMoeBlock` in place of the MLP; `config.model_type`).

Three forwards, one per way the new tokens meet the KV cache, all built from the same layers:
- `forward_hidden`: no cache; the T tokens attend among themselves (causal, or an explicit mask).
  Training and parity checks use it.
- `extend`: the T new keys/values are written at slots `cache_len[b] + j` and each new token
  attends causally over the cache. Prefill and one-token decoding use it.
- `verify`: the cache is only read; the new tokens attend to its valid slots and to each other
  through a boolean mask (a draft tree), and their keys/values come back as a `KVCache` of T
  slots, so that the caller writes only the ones it keeps (`write_cache`).
The three DART taps (docs/spec.md §2) are the residual-stream inputs of layers 2, L//2 and L-3.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from dart_jax.convert.qwen3 import Qwen3Config
from dart_jax.errors import InputError

from .backend import defaults_for
from .layers import (Linear, RMSNorm, apply_rope, attention, fused_attention, group_mask, group_queries, param,
                     rope_cos_sin, rope_inv_freq, ungroup_queries)
from .pallas_attention import attention_rows, tree_attention
from .qwen3_moe import SparseMoeBlock

CACHE_AXES = ("layers", "batch", "seq", "kv_heads", "head_dim")
# which GEMMs XLA compiles a tree verification with on a GPU (`verify_compiler_options`)
VERIFY_GEMMS = ("auto", "xla", "cublas")
# "auto": a verification of at least this many query rows (sequences x tree nodes) with cuBLAS
CUBLAS_MIN_ROWS = 32
_NO_TRITON_GEMMS = {"xla_gpu_enable_triton_gemm": False}
# how the cached forwards (`extend`, `verify`) attend (`Qwen3.use_attention`): "xla", the einsum
# attention of `layers` compiled by XLA; "cudnn", cuDNN's fused kernel (`layers.fused_attention`);
# "pallas", our own kernel (`pallas_attention.tree_attention`)
ATTENTION_KERNELS = ("xla", "cudnn", "pallas")


MODEL_DTYPES = ("float32", "bfloat16", "float16")  # what the models compute in


def check_dtype(dtype) -> None:
    """An InputError naming MODEL_DTYPES unless `dtype` (a name or a NumPy/JAX dtype) is one of
    them, or None (`default_dtype()`)."""
    if dtype is None:
        return
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in MODEL_DTYPES:
        raise InputError(f"dtype must be one of {', '.join(MODEL_DTYPES)} (or None: float32 on a CPU, bfloat16 on "
                         f"a GPU or TPU), got {dtype!r}; weights are loaded and computed in it.")


def default_dtype():
    """float32 on CPU (XLA's bf16 matmuls are slow there), bfloat16 on GPU and TPU."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


@functools.lru_cache(maxsize=16)
def _rope_tables(config: Qwen3Config) -> tuple[np.ndarray, float]:
    return rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling_dict)


@struct.dataclass
class KVCache:
    """Keys and values of every layer, `[L, B, S, KVH, D]`; valid lengths live with the caller."""

    k: jax.Array
    v: jax.Array


def init_cache(config: Qwen3Config, batch: int, max_len: int, dtype=None) -> KVCache:
    shape = (config.num_hidden_layers, batch, max_len, config.num_key_value_heads, config.head_dim)
    dtype = dtype or default_dtype()
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def write_cache(cache: KVCache, cache_len: jax.Array, new: KVCache, first_row=None) -> KVCache:
    """Write `new` ([L,B,T,KVH,D] keys/values) at slots `cache_len[b] + j`: one in-place scatter of
    the T new slots per array. Writes past the cache are dropped rather than clamped, so an
    overflow cannot corrupt valid slots. `first_row` (may be traced): write the B rows from that
    row of the cache instead of its first B."""
    b, t = new.k.shape[1], new.k.shape[2]
    rows = jnp.arange(b)[:, None]  # [B,1] against slots [B,T]
    if first_row is not None:
        rows = rows + first_row
    slots = jnp.asarray(cache_len, jnp.int32)[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    return KVCache(k=cache.k.at[:, rows, slots].set(new.k.astype(cache.k.dtype), mode="drop"),
                   v=cache.v.at[:, rows, slots].set(new.v.astype(cache.v.dtype), mode="drop"))


class Embed(nnx.Module):
    def __init__(self, vocab: int, dim: int, *, dtype, param_dtype, rngs: nnx.Rngs | None):
        self.embedding = param((vocab, dim), ("vocab", "embed"), param_dtype, rngs)
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)  # [..., H]


def _fused_linear(parts: list[Linear]) -> Linear:
    """One Linear whose kernel [in, sum of outs] (and bias) is `parts`' side by side: x @ it holds
    each part's x @ kernel in its columns, the same products."""
    first = parts[0]
    kernel = jnp.concatenate([p.kernel.get_value() for p in parts], axis=1)
    fused = nnx.eval_shape(lambda: Linear(kernel.shape[0], kernel.shape[1], (first.kernel.logical_axes[0], None),
                                          dtype=first.dtype, param_dtype=kernel.dtype, rngs=None,
                                          bias=first.bias is not None))  # no zero kernel made first
    fused.kernel.set_value(kernel)
    if first.bias is not None:
        fused.bias.set_value(jnp.concatenate([p.bias.get_value() for p in parts]))
    return fused


class Attention(nnx.Module):
    def __init__(self, c: Qwen3Config, *, dtype, param_dtype, rngs):
        h, nq, nkv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, bias=c.attention_bias)
        self.q_proj = Linear(h, nq * d, ("embed", "heads"), **kw)
        self.k_proj = Linear(h, nkv * d, ("embed", "kv_heads"), **kw)
        self.v_proj = Linear(h, nkv * d, ("embed", "kv_heads"), **kw)
        self.qkv_proj = None  # `fuse_projections`: q, k and v in one kernel instead
        self.o_proj = Linear(nq * d, h, ("heads", "embed"), **kw)
        if c.qk_norm:
            self.q_norm = RMSNorm(d, c.rms_norm_eps, param_dtype=param_dtype, axis_name="head_dim")
            self.k_norm = RMSNorm(d, c.rms_norm_eps, param_dtype=param_dtype, axis_name="head_dim")
        else:
            self.q_norm = self.k_norm = None
        self.num_heads, self.num_kv_heads, self.head_dim = nq, nkv, d

    def fuse_projections(self) -> None:
        """q, k and v projections as one [H, (Hq + 2·Hkv)·D] kernel (`Qwen3.fuse_projections`)."""
        if self.qkv_proj is not None:
            return
        self.qkv_proj = nnx.data(_fused_linear([self.q_proj, self.k_proj, self.v_proj]))
        del self.q_proj, self.k_proj, self.v_proj

    def project(self, x: jax.Array, cos: jax.Array, sin: jax.Array):
        """x [B,T,H] → q [B,T,Hq,D], k and v [B,T,Hkv,D] (Qwen3's per-head norm on q and k, then RoPE)."""
        b, t, _ = x.shape
        nq, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)
            q, k, v = qkv[..., :nq * d], qkv[..., nq * d:(nq + nkv) * d], qkv[..., (nq + nkv) * d:]
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.reshape(b, t, nq, d), k.reshape(b, t, nkv, d), v.reshape(b, t, nkv, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class MLP(nnx.Module):
    def __init__(self, c: Qwen3Config, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, ("embed", "mlp"), **kw)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, ("embed", "mlp"), **kw)
        self.gate_up_proj = None  # `fuse_projections`: gate and up in one kernel instead
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, ("mlp", "embed"), **kw)
        self.intermediate_size = c.intermediate_size

    def fuse_projections(self) -> None:
        """gate and up projections as one [H, 2·I] kernel (`Qwen3.fuse_projections`)."""
        if self.gate_up_proj is not None:
            return
        self.gate_up_proj = nnx.data(_fused_linear([self.gate_proj, self.up_proj]))
        del self.gate_proj, self.up_proj

    def __call__(self, x):
        if self.gate_up_proj is not None:
            y = self.gate_up_proj(x)
            gate, up = y[..., :self.intermediate_size], y[..., self.intermediate_size:]
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(jax.nn.silu(gate) * up)  # [B,T,I] -> [B,T,H]


# attend(layer index, q, k, v) → (attention output [B,T,Hq,D], what the forward keeps of the layer)
Attend = Callable[[int, jax.Array, jax.Array, jax.Array], tuple[jax.Array, object]]


class DecoderLayer(nnx.Module):
    def __init__(self, c: Qwen3Config, index: int, *, dtype, param_dtype, rngs):
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=param_dtype)
        self.self_attn = Attention(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=param_dtype)
        block = SparseMoeBlock if c.sparse_layer(index) else MLP
        self.mlp = block(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x, cos, sin, attend: Callable):
        b, t, _ = x.shape
        with jax.named_scope("attention"):
            q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
            out, kept = attend(q, k, v)  # [B,T,Hq,D]
            x = x + self.self_attn.o_proj(out.reshape(b, t, -1))
        with jax.named_scope("mlp"):
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kept


class Qwen3(nnx.Module):
    """Qwen3 causal LM (also Qwen3-MoE and Llama, by `config`): `forward_hidden`, `extend` or
    `verify`, then `lm_logits` (see the module doc)."""

    def __init__(self, config: Qwen3Config, *, dtype=None, param_dtype=None, rngs: nnx.Rngs | None):
        dtype = jnp.dtype(dtype or default_dtype())
        param_dtype = jnp.dtype(param_dtype or dtype)
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.config = config
        self.dtype = dtype
        self.embed_tokens = Embed(config.vocab_size, config.hidden_size, **kw)
        self.layers = nnx.List([DecoderLayer(config, i, **kw) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype=param_dtype)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, ("embed", "vocab"), **kw)
        self.attention_kernel = "xla"  # ATTENTION_KERNELS; `use_attention` changes it

    def _run(self, ids: jax.Array, positions: jax.Array, attend: Attend, return_taps: bool):
        """The layers over ids [B,T] at positions [B,T] → (hidden after the final norm, taps | None,
        what `attend` kept of each layer)."""
        b, t = ids.shape
        positions = jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (b, t))
        cos, sin = rope_cos_sin(positions, *_rope_tables(self.config))  # [B,T,D]
        with jax.named_scope("embed"):
            x = self.embed_tokens(ids)  # [B,T,H]
        layer_inputs, kept = {}, []
        for i, layer in enumerate(self.layers):
            if return_taps and i in self.config.tap_layers:
                layer_inputs[i] = x
            with jax.named_scope(f"layer_{i}"):
                x, k = layer(x, cos, sin, functools.partial(attend, i))
            kept.append(k)
        taps = None
        if return_taps:
            taps = jnp.concatenate([layer_inputs[i] for i in self.config.tap_layers], axis=-1)  # [B,T,3H]
        with jax.named_scope("final_norm"):
            x = self.norm(x)
        return x, taps, kept

    def forward_hidden(self, ids: jax.Array, *, positions: jax.Array | None = None, mask: jax.Array | None = None,
                       return_taps: bool = False):
        """ids [B,T] without a cache → (hidden [B,T,H] after the final norm, taps [B,T,3H] | None).
        Token j attends to token i where `mask[b, j, i]` (default causal); positions default 0..T-1."""
        b, t = ids.shape
        if positions is None:
            positions = jnp.arange(t, dtype=jnp.int32)[None, :]
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)) if mask is None else mask.astype(bool), (b, t, t))
        scale = self.config.head_dim ** -0.5

        def attend(i, q, k, v):
            return attention(q, k, v, mask, scale), None

        hidden, taps, _ = self._run(ids, positions, attend, return_taps)
        return hidden, taps

    def extend(self, ids: jax.Array, cache: KVCache, cache_len: jax.Array, *, return_taps: bool = False):
        """Append ids [B,T] to the cache → (hidden [B,T,H], taps | None, cache).

        New token j sits at position and slot `cache_len[b] + j` and attends causally over the
        cache. Each layer writes its T slots and then reads its cache layer: that data dependency
        lets XLA update a donated cache in place. The caller keeps `cache_len + T` within the
        cache: writes beyond it are dropped."""
        b, t = ids.shape
        cache_len = jnp.broadcast_to(jnp.asarray(cache_len, jnp.int32), (b,))
        slots = cache_len[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B,T]
        rel = jnp.arange(cache.k.shape[2], dtype=jnp.int32)[None, :] - cache_len[:, None]  # [B,S] slot - first new
        # causal: new token j sees every slot up to its own, an iota compare (no gather)
        mask = rel[:, None, :] <= jnp.arange(t, dtype=jnp.int32)[None, :, None]  # [B,T,S]
        rows = jnp.arange(b)[:, None]
        scale = self.config.head_dim ** -0.5
        held = {"cache": cache}
        kernel = self.attention_kernel
        if kernel == "pallas":  # the same causal rule as `mask`: token j sees the slots below its own + 1
            pallas_rows = attention_rows(slots + 1, None, self.config.num_attention_heads // self.config.num_key_value_heads)

        def attend(i, q, k, v):
            c = held["cache"]
            c = KVCache(k=c.k.at[i, rows, slots].set(k.astype(c.k.dtype), mode="drop"),
                        v=c.v.at[i, rows, slots].set(v.astype(c.v.dtype), mode="drop"))
            held["cache"] = c
            if kernel == "pallas":  # the whole cache passed, the kernel reads layer i: no slice of it
                return tree_attention(q, c.k, c.v, pallas_rows, scale=scale, layer=i), None
            attend_with = fused_attention if kernel == "cudnn" else attention
            return attend_with(q, c.k[i].astype(q.dtype), c.v[i].astype(q.dtype), mask, scale), None

        hidden, taps, _ = self._run(ids, slots, attend, return_taps)
        return hidden, taps, held["cache"]

    def verify(self, ids: jax.Array, positions: jax.Array, mask: jax.Array, cache: KVCache, cache_len: jax.Array,
               *, return_taps: bool = False):
        """ids [B,T] against a cache it leaves untouched → (hidden, taps | None, new KVCache [L,B,T,KVH,D]).

        Token j (at `positions[b, j]`) attends to the cache slots `< cache_len[b]` and to new token
        i where `mask[b, j, i]`. Its keys/values are read back as the cache would hold them. The
        caller writes the ones it keeps with `write_cache`, after something that depends on this
        forward's output, so that the write stays in place."""
        b, t = ids.shape
        cache_len = jnp.broadcast_to(jnp.asarray(cache_len, jnp.int32), (b,))
        s = cache.k.shape[2]
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        kernel = self.attention_kernel
        # which cache slots and tree nodes each token sees; built once for every layer
        if kernel == "pallas":
            rows = attention_rows(jnp.broadcast_to(cache_len[:, None], (b, t)),
                                  jnp.broadcast_to(mask.astype(bool), (b, t, t)), groups)
        else:
            visible = jnp.arange(s, dtype=jnp.int32)[None, :] < cache_len[:, None]  # [B,S]
            # the cache's slots, then the tree's nodes
            full_mask = jnp.concatenate([jnp.broadcast_to(visible[:, None, :], (b, t, s)),
                                         jnp.broadcast_to(mask.astype(bool), (b, t, t))], axis=-1)  # [B,T,S+T]
            if kernel == "xla":  # in the grouped rows
                full_mask = group_mask(full_mask, groups)
        scale = self.config.head_dim ** -0.5

        def attend(i, q, k, v):
            k = k.astype(cache.k.dtype).astype(q.dtype)
            v = v.astype(cache.v.dtype).astype(q.dtype)
            if kernel == "pallas":  # the cache's window and the tree's nodes in one kernel, read where they lie
                out = tree_attention(q, cache.k, cache.v, rows, k, v, scale=scale, layer=i)
            elif kernel == "cudnn":  # one kernel over the cache's slots and the tree's nodes side by side
                out = fused_attention(q, jnp.concatenate([cache.k[i].astype(q.dtype), k], axis=1),
                                      jnp.concatenate([cache.v[i].astype(q.dtype), v], axis=1), full_mask, scale)
            else:
                out = _attention_with_cache(q, k, v, cache.k[i].astype(q.dtype), cache.v[i].astype(q.dtype),
                                            full_mask, scale)
            return out, (k, v)

        hidden, taps, kept = self._run(ids, positions, attend, return_taps)
        new = KVCache(k=jnp.stack([k for k, _ in kept]), v=jnp.stack([v for _, v in kept]))
        return hidden, taps, new

    def untie_lm_head(self) -> None:
        """Give a model with tied embeddings an LM head of its own: a copy of the embedding
        transposed to [H, V], the layout XLA:CPU multiplies fastest when several rows meet the
        LM head at once (a draft tree; one row costs the same either way; benchmarks/RESULTS.md).
        The logits are the same products; the copy costs the embedding's memory once more. On a
        CPU the loaders do this (`use_backend_layout`)."""
        if self.lm_head is not None:
            return
        c = self.config
        head = Linear(c.hidden_size, c.vocab_size, ("embed", "vocab"), dtype=self.dtype,
                      param_dtype=self.embed_tokens.embedding.get_value().dtype, rngs=None)
        head.kernel.set_value(jnp.asarray(self.embed_tokens.embedding.get_value()).T)
        self.lm_head = nnx.data(head)  # None at construction made the attribute static

    def use_attention(self, kernel: str) -> None:
        """How `extend` and `verify` attend from now on (ATTENTION_KERNELS): "xla" (the default),
        "cudnn", cuDNN's fused attention kernel (`layers.fused_attention`: one kernel for the
        scores, the mask, the softmax and the weighted sum, which XLA runs as several), for a
        bfloat16 or float16 model on an NVIDIA GPU, or "pallas", our Pallas kernel
        (`pallas_attention.tree_attention`: the same in one kernel that reads the cache's window
        where it lies and the tree's nodes beside it; Triton on a GPU, Mosaic on a TPU, Pallas'
        interpret mode on a CPU, any dtype). `forward_hidden` (no cache) keeps XLA's attention.
        A jitted function over this module made before the change keeps the old way; make engines
        after it (`DartModel(..., attention=)` does)."""
        check_attention(kernel, self.dtype)
        self.attention_kernel = kernel

    def fuse_projections(self) -> None:
        """Each layer's q, k and v projections as one matmul, and its gate and up projections as
        another (the same products, in fewer and wider matmuls): in a 61-row verify at Qwen3-8B's
        widths on a GPU the attention's separate projections read their weights at well under the
        MLP's rate (benchmarks/RESULTS.md, the profiles). The separate weights are replaced, not
        kept. For one device: a model sharded over a mesh keeps them separate."""
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    @property
    def fused_projections(self) -> bool:
        return bool(self.layers) and self.layers[0].mlp.gate_up_proj is not None

    def lm_logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., H] → float32 logits [..., V]."""
        with jax.named_scope("lm_head"):
            h = hidden.astype(self.dtype)
            if self.lm_head is None:
                w = self.embed_tokens.embedding[...].astype(self.dtype)
                return jnp.einsum("...h,vh->...v", h, w, preferred_element_type=jnp.float32)  # [...,V]
            w = self.lm_head.kernel[...].astype(self.dtype)
            return jnp.einsum("...h,hv->...v", h, w, preferred_element_type=jnp.float32)  # [...,V]

    def __call__(self, ids: jax.Array, *, positions=None, mask=None, return_taps: bool = False):
        """Logits [B,T,V] of a forward without a cache, or (logits, taps) with `return_taps`."""
        hidden, taps = self.forward_hidden(ids, positions=positions, mask=mask, return_taps=return_taps)
        logits = self.lm_logits(hidden)
        return (logits, taps) if return_taps else logits


def check_attention(kernel: str, dtype=None, mesh=None) -> str:
    """`kernel` if it is one of ATTENTION_KERNELS (see `Qwen3.use_attention`) and this process can
    run it ("cudnn" and "pallas": one device, no `mesh`, whose sharding a custom kernel does not
    follow; "cudnn" also an NVIDIA GPU of compute capability 8.0 or more, cuDNN's flash attention's
    least, and a bfloat16 or float16 model: `dtype`, None for `default_dtype()`), else an InputError."""
    if kernel not in ATTENTION_KERNELS:
        raise InputError(f"attention (--attention) must be one of {', '.join(ATTENTION_KERNELS)}, got {kernel!r}.")
    if kernel != "xla" and mesh is not None:
        raise InputError(f"attention \"{kernel}\" (--attention) runs on one device, not over a mesh: drop the mesh "
                         "(--mesh) or use attention \"xla\".")
    if kernel == "cudnn":
        backend = jax.default_backend()
        problem = cudnn_device_problem(jax.devices()[0]) if backend == "gpu" else f"this process runs on {backend}"
        if problem:
            raise InputError(f"attention \"cudnn\" (--attention) needs an NVIDIA GPU of compute capability 8.0 or "
                             f"more; {problem}: use attention \"xla\".")
        dtype = jnp.dtype(dtype or default_dtype())
        if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise InputError(f"attention \"cudnn\" (--attention) takes a bfloat16 or float16 model, this one computes "
                             f"in {dtype.name}: load it in bfloat16 (--dtype bfloat16) or use attention \"xla\".")
    return kernel


def cudnn_device_problem(device) -> str | None:
    """Why cuDNN's fused attention cannot run on `device` (a JAX device), or None: it needs a CUDA
    device (not ROCm) of compute capability 8.0 (Ampere) or more."""
    capability = getattr(device, "compute_capability", None)
    try:
        major = float(capability)
    except (TypeError, ValueError):
        return f"the device ({getattr(device, 'device_kind', device)}) is not a CUDA device"
    if major < 8.0:
        return f"the device ({getattr(device, 'device_kind', device)}) has compute capability {capability}"
    return None


def check_verify_gemms(choice: str) -> str:
    """`choice` if it is one of VERIFY_GEMMS (see `verify_compiler_options`), else an InputError."""
    if choice not in VERIFY_GEMMS:
        raise InputError(f"verify_gemms (--verify-gemms) must be one of {', '.join(VERIFY_GEMMS)}, got {choice!r}.")
    return choice


def verify_compiler_options(rows: int, backend: str | None = None, choice: str = "auto") -> dict[str, bool] | None:
    """XLA options to compile a tree verification of `rows` query rows with (sequences × tree
    nodes), None for XLA's defaults. On a GPU, XLA's Triton GEMMs serve one-row decoding best, but
    at a tree's few dozen rows they split the attention projections' reduction into f32 partial sums
    that read the weights much slower than cuBLAS does (benchmarks/RESULTS.md has the verify's
    times by GEMM kind). So steps whose verification has at least `CUBLAS_MIN_ROWS` rows compile with
    Triton's GEMMs off (the whole step: the draft head's matmuls in it too), and plain decoding keeps
    XLA's choice. `choice` (VERIFY_GEMMS; an engine's `verify_gemms`, `--verify-gemms`): "auto" that
    rule, "xla" never, "cublas" for every tree. Other backends: None."""
    check_verify_gemms(choice)
    if (backend or jax.default_backend()) != "gpu" or choice == "xla":
        return None
    return dict(_NO_TRITON_GEMMS) if choice == "cublas" or rows >= CUBLAS_MIN_ROWS else None


def use_backend_layout(model: Qwen3, fused_projections: bool | None = None,
                       untied_lm_head: bool | None = None) -> Qwen3:
    """The target as the engine runs it on this backend (`backend.defaults_for`; an option given
    overrides it): on a CPU, with its own [H, V] LM head (`Qwen3.untie_lm_head`); on a GPU or TPU,
    with fused projections (`Qwen3.fuse_projections`). For a model whose weights are placed on one
    device (the loaders, the benchmarks' random models), not over a mesh."""
    layout = defaults_for().override(fused_projections=fused_projections, untied_lm_head=untied_lm_head)
    if layout.untied_lm_head:
        model.untie_lm_head()
    if layout.fused_projections:
        model.fuse_projections()
    return model


def _attention_with_cache(q, k_new, v_new, k_old, v_old, mask, scale):
    """Attention of T new tokens over two key blocks, the cache's S slots and the new tokens
    themselves, with one softmax over both; `mask` [B, 1, G·T, S+T] (`layers.group_mask` of
    [B, T, S+T]) says which slots and nodes each query row may see. Keeping the new keys out of the
    cache means a verification never writes the cache per layer and never builds a [B,T,S] mask by
    gathering. Queries are grouped per KV head (`layers.group_queries`)."""
    t = q.shape[1]
    hkv = k_new.shape[2]
    s = k_old.shape[1]
    qg = group_queries(q, hkv)  # [B,Hkv,G·T,D]
    scores = jnp.concatenate([jnp.einsum("bkmd,bskd->bkms", qg, k_old, preferred_element_type=jnp.float32),
                              jnp.einsum("bkmd,bskd->bkms", qg, k_new, preferred_element_type=jnp.float32)],
                             axis=-1) * scale  # [B,Hkv,G·T,S+T]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(mask, probs, 0.0).astype(v_new.dtype)
    out = (jnp.einsum("bkms,bskd->bkmd", probs[..., :s], v_old, preferred_element_type=jnp.float32)
           + jnp.einsum("bkms,bskd->bkmd", probs[..., s:], v_new, preferred_element_type=jnp.float32))
    return ungroup_queries(out.astype(v_new.dtype), t)
