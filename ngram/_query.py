"""Numba lookup kernels over the CSR trie (see ``trie.py`` for the layout).

Every index read from the arrays is clamped to the arrays' bounds, so a corrupted memory-mapped
file gives wrong answers at worst, never an out-of-bounds read.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _child_range(child_start, num_nodes, node):
    """(first child, number of children) of ``node``, clamped to the node arrays."""
    lo = max(child_start[node], 0)
    return lo, min(child_start[node + 1], num_nodes) - lo


@njit(cache=True, inline="always")
def find_child(token, child_start, num_nodes, node, tok):
    """Index of the child of ``node`` whose token is ``tok``, or -1.

    Binary search written so that the compare can compile to a conditional move rather than
    a hard-to-predict branch.
    """
    lo, size = _child_range(child_start, num_nodes, node)
    if size <= 0:
        return -1
    while size > 1:
        half = size >> 1
        if token[lo + half] <= tok:
            lo += half
        size -= half
    return lo if token[lo] == tok else -1


# Largest token id for which a root table is built (4 bytes per id up to it).
ROOT_TABLE_MAX_TOKEN = 1 << 24


@njit(cache=True)
def build_root_table(token, child_start):
    """Direct table token -> child of the root (-1 where none), for O(1) depth-1 lookups.

    Empty (callers fall back to binary search) when the ids are too large for a table or the
    node ids do not fit in int32.
    """
    n = min(token.shape[0], child_start.shape[0] - 1)
    if n < 1 or n > np.iinfo(np.int32).max:
        return np.zeros(0, np.int32)
    hi = min(max(child_start[1], 1), n)
    top = -1
    for i in range(1, hi):
        top = max(top, token[i])
    if top >= ROOT_TABLE_MAX_TOKEN:
        return np.zeros(0, np.int32)
    table = np.full(top + 1, -1, np.int32)
    for i in range(hi - 1, 0, -1):  # a repeated token (corrupted file) keeps its first node
        if token[i] >= 0:
            table[token[i]] = i
    return table


@njit(cache=True, inline="always")
def root_child(token, child_start, num_nodes, root, tok):
    """Child of the root whose token is ``tok``, or -1: ``root`` is ``build_root_table``'s
    table (an empty one means a binary search)."""
    if root.shape[0] == 0:
        return find_child(token, child_start, num_nodes, 0, tok) if num_nodes > 0 else -1
    if tok < 0 or tok >= root.shape[0]:
        return -1
    node = root[tok]
    return node if node < num_nodes else -1


@njit(cache=True, inline="always")
def num_valid_nodes(token, freq, child_start):
    n = min(token.shape[0], freq.shape[0])
    return min(n, child_start.shape[0] - 1)


@njit(cache=True, inline="always")
def find_children(token, child_start, num_nodes, node, cands, out, k):
    """``out[i]`` = child of ``node`` whose token is ``cands[i]``, or -1, for ``i < k``.

    The searches share one range, so they step in lockstep: every step's compares are
    independent (no mispredicted branches, cache misses overlap), and the first steps read the
    same few cache lines. Much faster than one binary search after another.
    """
    lo, size = _child_range(child_start, num_nodes, node)
    if size <= 0:
        for i in range(k):
            out[i] = -1
        return
    for i in range(k):
        out[i] = lo
    while size > 1:
        half = size >> 1
        for i in range(k):
            b = out[i]
            out[i] = b + half * (token[b + half] <= cands[i])
        size -= half
    for i in range(k):
        if token[out[i]] != cands[i]:
            out[i] = -1


# error_model="numpy": float division as NumPy does it (a damaged frequency never raises).
@njit(cache=True, error_model="numpy")
def ngram_probs(token, freq, child_start, order, context, cands, out_p, out_len, root=None):
    """docs/spec.md §5 n-gram probabilities of ``cands`` after ``context`` (reference get_probability).

    For suffix lengths ``min(order-1, len(context))`` down to 1 (the empty suffix never counts):
    if that suffix of the context is a path, each still-unmatched candidate that is a child of it
    gets ``P = float32(freq(child)) * (1 / float32(freq(ctx)))`` and matched length = the suffix
    length; a suffix whose frequency is 0 (a `reduce` can leave one) is no evidence and is skipped,
    as if it were not a path (0/0 is a miss, not a NaN). Unmatched candidates keep P = 0, length 0.
    ``out_p``/``out_len`` are overwritten.
    ``root``: optionally ``build_root_table`` of the trie (``Trie.root_table()``), which makes
    the first step of each suffix a table read instead of a binary search; same results.
    """
    k = cands.shape[0]
    for i in range(k):
        out_p[i] = np.float32(0.0)
        out_len[i] = 0
    c = context.shape[0]
    n = num_valid_nodes(token, freq, child_start)
    if c == 0 or k == 0 or n == 0:
        return
    child = np.empty(k, np.int64)
    remaining = k
    for length in range(min(order - 1, c), 0, -1):
        if root is None:
            node = find_child(token, child_start, n, 0, context[c - length])
        else:
            node = root_child(token, child_start, n, root, context[c - length])
        for j in range(c - length + 1, c):
            if node < 0:
                break
            node = find_child(token, child_start, n, node, context[j])
        if node < 0 or freq[node] == 0:
            continue
        inv = np.float32(1.0) / np.float32(freq[node])
        find_children(token, child_start, n, node, cands, child, k)
        for i in range(k):
            ch = child[i]
            if ch >= 0 and out_len[i] == 0:
                out_p[i] = np.float32(freq[ch]) * inv
                out_len[i] = length
                remaining -= 1
        if remaining == 0:
            return


@njit(cache=True)
def ngram_probs_batch(token, freq, child_start, order, contexts, context_len, cands, out_p, out_len, root=None):
    """``ngram_probs`` for B rows: row b's context is ``contexts[b, :context_len[b]]``
    (``contexts int64[B, C]``), its candidates ``cands[b]`` (``int64[B, k]``)."""
    for b in range(contexts.shape[0]):
        c = min(max(context_len[b], 0), contexts.shape[1])
        ngram_probs(
            token, freq, child_start, order, contexts[b, :c], cands[b], out_p[b], out_len[b], root
        )


@njit(cache=True)
def find_path(token, freq, child_start, path):
    """Node reached from the root along ``path``, or -1."""
    n = num_valid_nodes(token, freq, child_start)
    node = 0 if n > 0 else -1
    for j in range(path.shape[0]):
        if node < 0:
            break
        node = find_child(token, child_start, n, node, path[j])
    return node
