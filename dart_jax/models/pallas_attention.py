"""Masked grouped-query attention over a KV cache's window and a draft tree's own keys/values, as
one Pallas kernel (`Qwen3.use_attention("pallas")`): the tree verify's attention, and the cached
prefill's and plain decoding's, which are the same problem without tree nodes.

Each query row sees the cache slots below its own length (`lens`: the sequence's committed length
in a verify, `cache_len + j + 1` for new token j in `extend`) and, in a verify, the tree's nodes
its row of the tree mask allows. One program takes `block_m` query rows of one KV head (the rows of
its G query heads, `layers.group_queries`' layout, so that every key block is read once for the
whole group) and walks the cache's window in blocks of `block_s` slots with an online softmax in
float32 (running max, running sum, rescaled accumulator), then the tree's nodes as one last block.

The source is written for both of Pallas' compiled backends: Triton on a GPU (every loaded tensor
a power of two in size and every side of a matmul at least 16, hence the padding in
`tree_attention` and `attention_rows`) and Mosaic on a TPU (blocks whose last two sides are the
array's or multiples of (8, 128): the cache is read as [L, B, S, Hkv·D] in blocks of one head's D
columns, which asks D = 128 there). On a CPU it runs in Pallas' interpret mode: correct, slow,
for tests. The whole window of one KV head is one block (the loop reads it in slices): on a TPU it
must fit in VMEM twice over (double buffering), a few thousand slots at D = 128 in bfloat16.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from .layers import group_queries, ungroup_queries

BLOCK_M = 64  # query rows a program: its float32 accumulator [BLOCK_M, D] stays in registers on a GPU
BLOCK_S = 64  # cache slots a step of a program's loop
MIN_SIDE = 16  # Triton's matmul needs every side of at least 16
_MASKED = float(jnp.finfo(jnp.float32).min)  # the score of a key a row may not see (finite: no inf - inf)


def _padded_side(n: int) -> int:
    """The power of two >= n, at least MIN_SIDE."""
    return max(MIN_SIDE, 1 << max(n - 1, 0).bit_length())


class AttentionRows(NamedTuple):
    """What a forward's layers share: which keys each query row sees, in the kernel's row layout
    (row g·Tp + t: query head g of a KV head's group at token t, Tp = T padded; `attention_rows`)."""

    lens: jax.Array  # [B, G·Tp, 1] int32: cache slots [0, lens) visible to the row; 0 for padding
    mask: jax.Array | None  # [B, G·Tp, Tp] int32, 1 where the row sees that tree node; None: no tree
    tokens: int  # T, the real tokens (rows and nodes past it are padding)


def attention_rows(cache_lens: jax.Array, mask: jax.Array | None, groups: int) -> AttentionRows:
    """cache_lens [B, T] (cache slots each new token sees), mask [B, T, T] bool (token j sees new
    token i where mask[b, j, i]; None: the new tokens see no new keys, as in `extend`, whose cache
    already holds them) and G = Hq / Hkv → the kernel's AttentionRows. Built once per forward, so
    that its layers do not each pad and tile the same masks."""
    b, t = cache_lens.shape
    tp = _padded_side(t)
    lens = jnp.pad(jnp.asarray(cache_lens, jnp.int32), ((0, 0), (0, tp - t)))  # padding rows see nothing
    grouped_mask = None
    if mask is not None:
        grouped_mask = jnp.tile(jnp.pad(mask.astype(jnp.int32), ((0, 0), (0, tp - t), (0, tp - t))), (1, groups, 1))
    return AttentionRows(lens=jnp.tile(lens, (1, groups))[..., None], mask=grouped_mask, tokens=t)


def _kernel(lens_ref, q_ref, k_cache_ref, v_cache_ref, *refs, scale: float, block_s: int, tree: bool):
    """One program: q [bm, D] (one KV head's rows) against its cache window [S, D] and, with
    `tree`, the tree's keys/values [Tp, D] under mask [bm, Tp] → o [bm, D]."""
    if tree:
        mask_ref, k_new_ref, v_new_ref, o_ref = refs
    else:
        (o_ref,) = refs
    q = q_ref[...]
    rows, d = q.shape
    lens = lens_ref[...]  # [bm, 1]

    def attend(carry, k, v, visible):
        """The online softmax's update by one key block k, v [n, D] under visible [bm, n]."""
        top, total, acc = carry  # [bm,1] running max, [bm,1] running sum, [bm,D] float32
        scores = jax.lax.dot_general(q, k.astype(q.dtype), (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32) * scale  # [bm,n]
        scores = jnp.where(visible, scores, _MASKED)
        new_top = jnp.maximum(top, jnp.max(scores, axis=-1, keepdims=True))
        probs = jnp.where(visible, jnp.exp(scores - new_top), 0.0)  # 0, not exp(0), where nothing was seen yet
        rescale = jnp.exp(top - new_top)
        acc = acc * rescale + jax.lax.dot_general(probs.astype(q.dtype), v.astype(q.dtype), (((1,), (0,)), ((), ())),
                                                  preferred_element_type=jnp.float32)
        return new_top, total * rescale + jnp.sum(probs, axis=-1, keepdims=True), acc

    def cache_block(j, carry):
        start = pl.multiple_of(j * block_s, block_s)
        slots = start + jax.lax.broadcasted_iota(jnp.int32, (rows, block_s), 1)
        return attend(carry, k_cache_ref[pl.ds(start, block_s), :], v_cache_ref[pl.ds(start, block_s), :],
                      slots < lens)

    carry = (jnp.full((rows, 1), _MASKED, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
             jnp.zeros((rows, d), jnp.float32))
    carry = jax.lax.fori_loop(0, k_cache_ref.shape[0] // block_s, cache_block, carry)
    if tree:
        carry = attend(carry, k_new_ref[...], v_new_ref[...], mask_ref[...] != 0)
    _, total, acc = carry
    o_ref[...] = (acc / jnp.where(total == 0.0, 1.0, total)).astype(o_ref.dtype)  # padding rows: 0, not NaN


def _compiler_params(backend: str):
    """Triton's on a GPU: JAX's default there is Mosaic GPU, whose `pallas_call` is deprecated and
    wants other layouts (16-byte strides); Mosaic's own defaults on a TPU. One warp group of four
    warps holds a program's [BLOCK_M, D] float32 accumulator in registers."""
    return pl_triton.CompilerParams(num_warps=4, num_stages=2) if backend == "gpu" else None


def tree_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, rows: AttentionRows,
                   k_new: jax.Array | None = None, v_new: jax.Array | None = None, *, scale: float, layer: int = 0,
                   backend: str | None = None) -> jax.Array:
    """Masked GQA attention of q [B, T, Hq, D] over layer `layer` of k_cache/v_cache
    [L, B, S, Hkv, D] (the slots each row may see: `rows.lens`) and, when `rows.mask` is set, over
    k_new/v_new [B, T, Hkv, D] (the tree's own nodes) under that mask; one softmax over both, in
    float32 → [B, T, Hq, D] in q's dtype. A row that sees no key gives zeros. The caches are read
    where they lie (the layer picked by the kernel's block index, not sliced out) unless S or D
    need padding to the kernel's sides (S not a multiple of the slot block, D not a power of two
    >= 16): then this layer's window is copied padded. `backend` (None: JAX's default) is the
    one the kernel is compiled for: "gpu" Triton, "tpu" Mosaic, "cpu" Pallas' interpret mode."""
    b, t, hq, d = q.shape
    _, cache_b, s, hkv, _ = k_cache.shape
    tree = rows.mask is not None
    if t != rows.tokens or cache_b != b or hq % hkv or tree != (k_new is not None):
        raise ValueError(f"tree_attention: q {q.shape}, cache {k_cache.shape}, rows for {rows.tokens} tokens, "
                         f"tree {tree}, new keys {None if k_new is None else k_new.shape}: they do not fit.")
    groups = hq // hkv
    backend = backend or jax.default_backend()
    tp = _padded_side(t)
    block_s = min(BLOCK_S, _padded_side(s))
    d_pad, s_pad = _padded_side(d) - d, -s % block_s
    if d_pad or s_pad:
        k_cache, v_cache = (jnp.pad(c[layer][None], ((0, 0), (0, 0), (0, s_pad), (0, 0), (0, d_pad)))
                            for c in (k_cache, v_cache))
        layer = 0
    d += d_pad
    m = groups * tp
    block_m = min(BLOCK_M, tp * (groups & -groups))  # a power of two dividing G·Tp
    qg = group_queries(jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, d_pad))), hkv)  # [B,Hkv,G·Tp,D]
    # [L,B,S,Hkv·D]: a reshape, not a copy; a block of D columns is one KV head
    caches = [c.reshape(*c.shape[:3], hkv * d) for c in (k_cache, v_cache)]
    row_block = pl.BlockSpec((None, block_m, 1), lambda i, h, r: (i, r, 0))
    in_specs = [row_block,
                pl.BlockSpec((None, None, block_m, d), lambda i, h, r: (i, h, r, 0)),
                *[pl.BlockSpec((None, None, caches[0].shape[2], d), lambda i, h, r: (layer, i, 0, h))] * 2]
    operands = [rows.lens, qg, *caches]
    if tree:
        in_specs += [pl.BlockSpec((None, block_m, tp), lambda i, h, r: (i, r, 0)),
                     *[pl.BlockSpec((None, tp, d), lambda i, h, r: (i, 0, h))] * 2]
        operands += [rows.mask, *(jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, d_pad))).reshape(b, tp, hkv * d)
                                  for x in (k_new, v_new))]
    out = pl.pallas_call(
        functools.partial(_kernel, scale=scale, block_s=block_s, tree=tree),
        grid=(b, hkv, m // block_m),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, None, block_m, d), lambda i, h, r: (i, h, r, 0)),
        out_shape=jax.ShapeDtypeStruct((b, hkv, m, d), q.dtype),
        interpret=backend == "cpu",
        compiler_params=_compiler_params(backend),
        name="tree_attention",
    )(*operands)
    return ungroup_queries(out, tp)[:, :t, :, :d - d_pad]
