"""EAGLE-3 as the engine's second drafter (docs/spec.md §9).

The whole EAGLE-2/3 draft runs inside the jitted prefill and step: the committed rows go through
the head (their keys/values into the head's cache), then a fixed loop of `depth` draft steps
grows the tree on the device (top-k expansion of the k best nodes by cumulative draft
log-probability, the tree's keys/values in a buffer beside the cache), and the best
`nodes - 1` candidates become the tree. The proposal sent to the host is that tree, already in
the engine's encoding; `tree` only unpacks it. Verification, acceptance, sampling and the KV
commit are the engine's.

Sizes map onto the engine's settings: `TreeSettings.topk` is EAGLE's top_k, `keep + 1` its
total_token (nodes, root included), and the drafter's `rows` = depth + 1 (the deepest node).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.errors import InputError
from dart_jax.models.eagle3 import Eagle3Head, two_block_attention
from dart_jax.models.head import HeadCache, write_rows
from dart_jax.models.layers import attention
from dart_jax.ngram import DraftTree, TreeSettings

from .drafter import DartDrafter, Drafter
from .layout import Field

# the reference's defaults (EaModel.from_pretrained): total_token 60, depth 7, top_k 10
DEFAULT_DEPTH = 7
DEFAULT_TREE = TreeSettings(keep=59, topk=10)


def candidates(k: int, depth: int) -> int:
    """Scored nodes of a draft of `depth` steps with top-k expansion: k children of the root, then
    k·k per step."""
    return k + depth * k * k


def commit_rows(module: Eagle3Head, taps, next_ids, cache: HeadCache, start, n_real):
    """The target rows through the head: taps [B,N,3Ht], next_ids [B,N] of which n_real [B] are
    real, written from slot `start` [B] (writes past the cache dropped) → (the layer's output at
    the last real row [B,H], cache)."""
    n = next_ids.shape[1]
    slots = start[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]  # [B,N]
    last = (n_real - 1).astype(jnp.int32)
    held = {}

    def attend(q, k, v):
        held["cache"] = c = write_rows(cache, slots, k, v)
        visible = jnp.arange(c.k.shape[1])[None, None, :] <= (start + last)[:, None, None]  # [B,1,S]
        return attention(q, c.k.astype(q.dtype), c.v.astype(q.dtype), visible, module.scale)

    h = module.layer(module.embed(next_ids), module.project(taps), slots, attend, rows=last[:, None])
    return h[:, 0], held["cache"]


def grow_tree(module: Eagle3Head, root_hidden, cache: HeadCache, committed, *, k: int, depth: int):
    """The EAGLE draft loop from the root's layer output [B,H] over a cache of `committed` [B]
    rows → (scores [B,C], target ids [B,C], parent of each group of k [B,1+depth·k]) over the
    C = k + depth·k² candidates in the reference's order: the root's k children, then per step
    the k children of each of the k expanded nodes. A group's parent is 1 + the candidate index
    of the expanded node (0: the root)."""
    b, h_size = root_hidden.shape
    cfg = module.config
    width = depth * k
    logp = jax.nn.log_softmax(module.logits(root_hidden), axis=-1)  # [B,Vd]
    scores, idx = jax.lax.top_k(logp, k)  # [B,k]
    ids = module.to_target(idx).astype(jnp.int32)
    total = candidates(k, depth)
    all_scores = jnp.zeros((b, total), jnp.float32).at[:, :k].set(scores)
    all_ids = jnp.zeros((b, total), jnp.int32).at[:, :k].set(ids)
    group_parent = jnp.zeros((b, 1 + width), jnp.int32)
    kv_shape = (b, width, cfg.num_key_value_heads, cfg.head_dim)
    tree_k, tree_v = jnp.zeros(kv_shape, cache.k.dtype), jnp.zeros(kv_shape, cache.v.dtype)
    cache_visible = jnp.broadcast_to(jnp.arange(cache.k.shape[1])[None, None, :] < committed[:, None, None],
                                     (b, k, cache.k.shape[1]))
    columns = jnp.arange(width)[None, None, :]
    hidden = jnp.broadcast_to(root_hidden[:, None, :], (b, k, h_size))
    fed = jnp.broadcast_to(jnp.arange(1, k + 1, dtype=jnp.int32), (b, k))
    seen = jnp.zeros((b, k, width), bool)  # which tree columns each expanded node attends to

    def step(i, carry):
        hidden, ids, scores, fed, seen, tree_k, tree_v, all_scores, all_ids, group_parent = carry
        seen = seen | (columns == (i * k + jnp.arange(k))[None, :, None])
        positions = jnp.broadcast_to(committed[:, None] + i, (b, k))
        held = {}

        def attend(q, key, value):
            tk = jax.lax.dynamic_update_slice(tree_k, key.astype(tree_k.dtype), (0, i * k, 0, 0))
            tv = jax.lax.dynamic_update_slice(tree_v, value.astype(tree_v.dtype), (0, i * k, 0, 0))
            held["kv"] = tk, tv
            return two_block_attention(q, cache.k, cache.v, cache_visible, tk, tv, seen, module.scale)

        out = module.layer(module.embed(ids), hidden, positions, attend)  # [B,k,H]
        tree_k, tree_v = held["kv"]
        logp = jax.nn.log_softmax(module.logits(out), axis=-1)  # [B,k,Vd]
        child_p, child_idx = jax.lax.top_k(logp, k)  # [B,k,k]
        cumulative = (child_p + scores[:, :, None]).reshape(b, k * k)
        child_ids = module.to_target(child_idx).astype(jnp.int32).reshape(b, k * k)
        base = k + i * k * k
        all_scores = jax.lax.dynamic_update_slice(all_scores, cumulative, (0, base))
        all_ids = jax.lax.dynamic_update_slice(all_ids, child_ids, (0, base))
        group_parent = jax.lax.dynamic_update_slice(group_parent, fed, (0, 1 + i * k))
        scores, pick = jax.lax.top_k(cumulative, k)  # the k nodes expanded next
        parent = pick // k
        hidden = jnp.take_along_axis(out, parent[..., None], axis=1)
        ids = jnp.take_along_axis(child_ids, pick, axis=1)
        seen = jnp.take_along_axis(seen, parent[..., None], axis=1)
        fed = (base + pick + 1).astype(jnp.int32)
        return hidden, ids, scores, fed, seen, tree_k, tree_v, all_scores, all_ids, group_parent

    carry = (hidden, ids, scores, fed, seen, tree_k, tree_v, all_scores, all_ids, group_parent)
    *_, all_scores, all_ids, group_parent = jax.lax.fori_loop(0, depth, step, carry)
    return all_scores, all_ids, group_parent


def select_tree(root, all_scores, all_ids, group_parent, *, k: int, nodes: int, rows: int) -> dict:
    """The best `nodes - 1` candidates by score (ties: the lower index) as a tree in the engine's
    encoding (`DraftTree`, all `nodes` slots real): node 0 the root [B], then the kept candidates
    in candidate order; mask, depth positions, parents; retrieve rows of the leaves' paths in
    lexicographic order of node indices (the reference's order under sampling)."""
    b = root.shape[0]
    keep = nodes - 1
    _, top = jax.lax.top_k(all_scores, keep)
    chosen = jnp.sort(top, axis=-1)  # [B,keep]
    tokens = jnp.concatenate([root[:, None], jnp.take_along_axis(all_ids, chosen, axis=1)], axis=1)
    parent_flat = jnp.take_along_axis(group_parent, chosen // k, axis=1)  # [B,keep]; 0 = root
    at = jnp.argmax(chosen[:, None, :] == (parent_flat - 1)[:, :, None], axis=-1)  # [B,keep]
    parents = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32),
                               jnp.where(parent_flat == 0, 0, at + 1).astype(jnp.int32)], axis=1)  # [B,N]
    eye = jnp.eye(nodes, dtype=bool)
    mask = jnp.broadcast_to(eye, (b, nodes, nodes))
    up = jnp.maximum(parents, 0)
    batch = jnp.arange(b)[:, None]
    for _ in range(rows):  # each pass adds one more generation of ancestors
        mask = eye | (mask[batch, up] & (parents >= 0)[..., None])
    positions = (mask.sum(axis=-1) - 1).astype(jnp.int32)
    has_child = (parents[:, :, None] == jnp.arange(nodes)[None, None, :]).any(axis=1)  # [B,N]
    leaf = ~has_child
    level = jnp.arange(rows + 1)
    on_level = mask[:, :, None, :] & (positions[:, None, None, :] == level[None, None, :, None])  # [B,N,D+1,N]
    paths = jnp.where(level[None, None, :] <= positions[..., None], jnp.argmax(on_level, axis=-1), -1)
    sort_key = jnp.where(paths < 0, nodes, paths)
    order = jnp.lexsort([sort_key[..., d] for d in range(rows, -1, -1)] + [has_child], axis=-1)  # [B,N]
    rows_sorted = jnp.take_along_axis(paths, order[..., None], axis=1)[:, :keep]
    leaf_sorted = jnp.take_along_axis(leaf, order, axis=1)[:, :keep]
    retrieve = jnp.where(leaf_sorted[..., None], rows_sorted, -1).astype(jnp.int32)
    return {"tokens": tokens.astype(jnp.int32), "positions": positions, "parents": parents, "mask": mask,
            "retrieve": retrieve, "num_leaves": leaf.sum(axis=-1).astype(jnp.int32)}


def draft(module: Eagle3Head, taps, next_ids, cache: HeadCache, start, n_real, *, rows: int, k: int, nodes: int):
    """The committed rows, the draft loop and the tree selection in one traced function."""
    depth = rows - 1
    if depth < 1 or k > module.config.draft_vocab_size or nodes - 1 > candidates(k, depth):
        raise ValueError(f"EAGLE-3 tree of {nodes} nodes, top_k {k}, depth {depth}: needs depth >= 1, top_k <= the "
                         f"draft vocabulary ({module.config.draft_vocab_size}) and total_token - 1 <= top_k + depth·top_k² "
                         f"({candidates(k, max(depth, 0))}).")
    start, n_real = start.astype(jnp.int32), n_real.astype(jnp.int32)
    with jax.named_scope("eagle3_rows"):
        root_hidden, cache = commit_rows(module, taps, next_ids, cache, start, n_real)
    with jax.named_scope("eagle3_tree"):
        scores, ids, group_parent = grow_tree(module, root_hidden, cache, start + n_real, k=k, depth=depth)
    with jax.named_scope("eagle3_select"):
        root = jnp.take_along_axis(next_ids, (n_real - 1)[:, None], axis=1)[:, 0].astype(jnp.int32)
        tree = select_tree(root, scores, ids, group_parent, k=k, nodes=nodes, rows=rows)
    return tree, cache


class Eagle3Drafter(Drafter):
    """An EAGLE-3 head drafting `depth` steps; its proposal is the tree itself."""

    adaptive_tree = False  # the tree's size is fixed when it is drafted, a step before it is verified

    def __init__(self, head: Eagle3Head, depth: int = DEFAULT_DEPTH):
        if not isinstance(depth, int) or depth < 1:
            raise InputError(f"EAGLE-3 depth must be an integer >= 1, got {depth!r}.")
        self.module = head
        self.depth = depth

    @property
    def max_depth(self) -> int:  # its first proposal row, then `depth` draft steps
        return self.depth + 1

    @property
    def vocab_size(self) -> int:
        return self.module.config.draft_vocab_size

    def reach(self, real_rows: int) -> int:
        return real_rows  # the tree's keys/values stay beside the cache

    @staticmethod
    def check_sizes(tree: TreeSettings, depth: int, draft_vocab: int) -> None:
        """An InputError unless a tree of total_token = keep + 1 nodes fits `depth` steps of top-k."""
        if not isinstance(depth, int) or depth < 1:
            raise InputError(f"EAGLE-3 depth must be an integer >= 1, got {depth!r}.")
        if not 1 <= tree.topk <= draft_vocab:
            raise InputError(f"EAGLE-3 top_k must lie in [1, {draft_vocab}] (the draft vocabulary), got {tree.topk}.")
        if tree.keep > candidates(tree.topk, depth):
            raise InputError(f"an EAGLE-3 tree of total_token {tree.keep + 1} needs at most 1 + top_k + depth·top_k² = "
                             f"{1 + candidates(tree.topk, depth)} nodes (top_k {tree.topk}, depth {depth}); lower "
                             "total_token or raise top_k / depth.")

    def check_tree(self, tree: TreeSettings) -> TreeSettings:
        self.check_sizes(tree, tree.rows_used(self.max_depth) - 1, self.vocab_size)
        return tree.check_fits(self.max_depth, self.vocab_size)

    def init_cache(self, batch: int, length: int, dtype) -> HeadCache:
        cfg = self.module.config
        shape = (batch, length, cfg.num_key_value_heads, cfg.head_dim)
        return HeadCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))

    cache_window = staticmethod(DartDrafter.cache_window)
    cache_put = staticmethod(DartDrafter.cache_put)

    @staticmethod
    def proposal_fields(rows: int, k: int, nodes: int = 0) -> tuple[Field, ...]:
        return (Field("tokens", (nodes,)), Field("positions", (nodes,)), Field("parents", (nodes,)),
                Field("mask", (nodes, nodes), "bool"), Field("retrieve", (nodes - 1, rows + 1)),
                Field("num_leaves", ()))

    @staticmethod
    def prefill(module, taps, next_ids, cache, start, n_real, *, rows: int, k: int, nodes: int = 0):
        return draft(module, taps, next_ids, cache, start, n_real, rows=rows, k=k, nodes=nodes)

    @staticmethod
    def extend(module, taps, next_ids, cache, cache_len, n_real, *, rows: int, k: int, nodes: int = 0):
        return draft(module, taps, next_ids, cache, cache_len, n_real, rows=rows, k=k, nodes=nodes)

    def tree(self, proposal, preceding, preceding_len, trie, settings: TreeSettings, eos_id) -> DraftTree:
        tokens = np.asarray(proposal["tokens"], np.int32)
        b, n = tokens.shape
        return DraftTree(tokens, np.asarray(proposal["positions"], np.int32), np.asarray(proposal["parents"], np.int32),
                         np.asarray(proposal["mask"], bool), np.asarray(proposal["retrieve"], np.int32),
                         np.full(b, n, np.int32), np.asarray(proposal["num_leaves"], np.int32))
