"""Numba lookup kernels over the CSR trie (see ``trie.py`` for the layout).

Every index read from the arrays is clamped to the arrays' bounds, so a corrupted memory-mapped
file gives wrong answers at worst, never an out-of-bounds read.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def find_child(token, child_start, num_nodes, node, tok):
    """Index of the child of ``node`` whose token is ``tok``, or -1.

    Binary search written so that the compare can compile to a conditional move rather than
    a hard-to-predict branch.
    """
    lo = child_start[node]
    hi = child_start[node + 1]
    if lo < 0:
        lo = 0
    if hi > num_nodes:
        hi = num_nodes
    size = hi - lo
    if size <= 0:
        return -1
    while size > 1:
        half = size >> 1
        if token[lo + half] <= tok:
            lo += half
        size -= half
    return lo if token[lo] == tok else -1


@njit(cache=True, inline="always")
def num_valid_nodes(token, freq, child_start):
    n = min(token.shape[0], freq.shape[0])
    return min(n, child_start.shape[0] - 1)


@njit(cache=True, inline="always")
def lower_bound(token, lo, hi, tok):
    """First index in ``lo .. hi`` whose token is >= ``tok`` (branch-free binary search)."""
    size = hi - lo
    while size > 0:
        half = size >> 1
        if token[lo + half] < tok:
            lo += half + 1
            size -= half + 1
        else:
            size = half
    return lo


# error_model="numpy": a context node whose frequency was reduced to 0 yields inf/nan as the
# reference's float arithmetic does, instead of raising ZeroDivisionError.
@njit(cache=True, error_model="numpy")
def ngram_probs(token, freq, child_start, order, context, cands, out_p, out_len):
    """SPEC §5 n-gram probabilities of ``cands`` after ``context`` (reference get_probability).

    For suffix lengths ``min(order-1, len(context))`` down to 1 (the empty suffix never counts):
    if that suffix of the context is a path, each still-unmatched candidate that is a child of it
    gets ``P = float32(freq(child)) * (1 / float32(freq(ctx)))`` and matched length = the suffix
    length. Unmatched candidates keep P = 0, length 0. ``out_p``/``out_len`` are overwritten.
    """
    k = cands.shape[0]
    for i in range(k):
        out_p[i] = np.float32(0.0)
        out_len[i] = 0
    c = context.shape[0]
    n = num_valid_nodes(token, freq, child_start)
    if c == 0 or k == 0 or n == 0:
        return
    # candidates in ascending order: each search starts where the previous one ended
    perm = np.empty(k, np.int64)
    for i in range(k):
        j = i
        while j > 0 and cands[perm[j - 1]] > cands[i]:
            perm[j] = perm[j - 1]
            j -= 1
        perm[j] = i
    remaining = k
    for length in range(min(order - 1, c), 0, -1):
        node = 0
        for j in range(c - length, c):
            node = find_child(token, child_start, n, node, context[j])
            if node < 0:
                break
        if node < 0:
            continue
        inv = np.float32(1.0) / np.float32(freq[node])
        lo = max(child_start[node], 0)
        hi = min(child_start[node + 1], n)
        for r in range(k):
            i = perm[r]
            if out_len[i] > 0:
                continue
            lo = lower_bound(token, lo, hi, cands[i])
            if lo >= hi:
                break
            if token[lo] == cands[i]:
                out_p[i] = np.float32(freq[lo]) * inv
                out_len[i] = length
                remaining -= 1
        if remaining == 0:
            return


@njit(cache=True)
def ngram_probs_batch(token, freq, child_start, order, contexts, context_len, cands, out_p, out_len):
    """``ngram_probs`` for B rows: row b's context is ``contexts[b, :context_len[b]]``
    (``contexts int64[B, C]``), its candidates ``cands[b]`` (``int64[B, k]``)."""
    for b in range(contexts.shape[0]):
        c = min(max(context_len[b], 0), contexts.shape[1])
        ngram_probs(
            token, freq, child_start, order, contexts[b, :c], cands[b], out_p[b], out_len[b]
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
