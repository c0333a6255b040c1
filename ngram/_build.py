"""Numba kernels that build, merge, reduce and check CSR tries (layout in ``trie.py``).

Windows are stored with every token shifted by +1 so that 0 can pad a window that a sequence
end cut short; padding sorts before every token, which keeps lexicographic order = trie order.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# check_offsets / check_csr status codes and their messages
OK = 0
BAD_LENGTHS = 1
BAD_ROOT_RANGE = 2
BAD_RANGE = 3
UNSORTED = 4
TOO_DEEP = 5
DECREASING = 6
NEGATIVE_FREQ = 7
FREQ_SUM = 8
NEGATIVE_TOKEN = 9
PAST_END = 10
ORDER_COUNTS = 11

CHECK_MESSAGES = {  # str.format'ed with node= and order=
    BAD_LENGTHS: "array lengths disagree (token and freq need N entries, child_start N+1)",
    BAD_ROOT_RANGE: "child_start must start at 1 and end at the node count",
    DECREASING: "child_start decreases after node {node} (it must never decrease)",
    BAD_RANGE: "node {node}'s children do not come after it in child_start (breadth-first layout)",
    PAST_END: "node {node}'s children run past the last node in child_start",
    NEGATIVE_FREQ: "node {node} has a negative frequency",
    FREQ_SUM: "the children of node {node} count more windows than the node itself",
    TOO_DEEP: "node {node} ends a path longer than its order {order}",
    UNSORTED: "the children of node {node} are not sorted by token (or repeat a token)",
    NEGATIVE_TOKEN: "node {node} has a negative token id",
    ORDER_COUNTS: ("its counts are those of an order-{node} trie, not of the order {order} its header says (more "
                   "windows end at depth {node} than sequence ends allow below the order): the header was changed"),
}


@njit(cache=True)
def pack_windows(flat, offsets, order, bits, out):
    """``out[p]`` = the window starting at ``p`` (cut at its sequence end), ``bits`` per token."""
    shift = np.uint64(bits)
    for s in range(offsets.shape[0] - 1):
        a = offsets[s]
        b = offsets[s + 1]
        for p in range(a, b):
            key = np.uint64(0)
            for j in range(order):
                key = key << shift
                if p + j < b:
                    key = key | np.uint64(flat[p + j] + 1)
            out[p] = key


@njit(cache=True)
def unpack_windows(keys, order, bits):
    mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    w = np.empty((keys.shape[0], order), np.int64)
    for r in range(keys.shape[0]):
        key = keys[r]
        for j in range(order - 1, -1, -1):
            w[r, j] = np.int64(key & mask)
            key = key >> np.uint64(bits)
    return w


@njit(cache=True)
def window_matrix(flat, offsets, order):
    """Unpacked windows ``[n, order]`` for token ranges too wide to pack into 64 bits."""
    w = np.zeros((flat.shape[0], order), np.int64)
    for s in range(offsets.shape[0] - 1):
        a = offsets[s]
        b = offsets[s + 1]
        for p in range(a, b):
            for j in range(min(order, b - p)):
                w[p, j] = flat[p + j] + 1
    return w


@njit(cache=True)
def csr_from_windows(w, cnt):
    """CSR trie from distinct windows ``w [m, order]`` (sorted lexicographically) and counts.

    The node of path ``x[:k]`` counts every window that starts with it. Nodes are created level
    by level in row order, so ids are breadth-first and siblings come out sorted by token.
    Returns ``(token int32, freq int64, child_start int64)``.
    """
    m, order = w.shape
    first_diff = np.zeros(m, np.int64)
    for r in range(1, m):
        j = 0
        while j < order and w[r, j] == w[r - 1, j]:
            j += 1
        first_diff[r] = j
    total = 1
    for k in range(1, order + 1):
        for r in range(m):
            if w[r, k - 1] != 0 and (r == 0 or first_diff[r] < k):
                total += 1
    token = np.zeros(total, np.int32)
    freq = np.zeros(total, np.int64)
    nchild = np.zeros(total, np.int64)
    node_of_row = np.zeros(m, np.int64)
    freq[0] = cnt.sum()
    nid = 1
    for k in range(1, order + 1):
        cur = -1
        for r in range(m):
            t = w[r, k - 1]
            # a padded position stays padded for the rest of the row: node_of_row[r] is not
            # read again
            if t == 0:
                continue
            if r == 0 or first_diff[r] < k:
                cur = nid
                nid += 1
                token[cur] = t - 1
                nchild[node_of_row[r]] += 1
            freq[cur] += cnt[r]
            node_of_row[r] = cur
    child_start = np.empty(total + 1, np.int64)
    child_start[0] = 1
    for i in range(total):
        child_start[i + 1] = child_start[i] + nchild[i]
    return token, freq, child_start


@njit(cache=True, inline="always")
def _range(child_start, node, n):
    if node < 0:
        return 0, 0
    lo = max(child_start[node], 0)
    hi = min(child_start[node + 1], n)
    return lo, max(lo, hi)


@njit(cache=True)
def merge_csr(ta, fa, ca, tb, fb, cb):
    """Union of two tries with frequencies added node by node (reference ``add_all``).

    Breadth-first walk over pairs (node of a | -1, node of b | -1) with the same path; the
    children of a pair are the two sorted child lists merged. Returns int64 frequencies.
    """
    na = ta.shape[0]
    nb = tb.shape[0]
    cap = na + nb
    token = np.empty(cap, np.int32)
    freq = np.empty(cap, np.int64)
    child_start = np.empty(cap + 1, np.int64)
    qa = np.empty(cap, np.int64)
    qb = np.empty(cap, np.int64)
    token[0] = ta[0]
    freq[0] = np.int64(fa[0]) + np.int64(fb[0])
    qa[0] = 0
    qb[0] = 0
    tail = 1
    i = 0
    while i < tail:
        child_start[i] = tail
        ia, ea = _range(ca, qa[i], na)
        ib, eb = _range(cb, qb[i], nb)
        while ia < ea or ib < eb:
            if tail >= cap:
                # only reachable when an input is not a tree (checked tries never are)
                return token[:0], freq[:0], child_start[:0]
            if ib >= eb or (ia < ea and ta[ia] < tb[ib]):
                token[tail] = ta[ia]
                freq[tail] = fa[ia]
                qa[tail] = ia
                qb[tail] = -1
                ia += 1
            elif ia >= ea or tb[ib] < ta[ia]:
                token[tail] = tb[ib]
                freq[tail] = fb[ib]
                qa[tail] = -1
                qb[tail] = ib
                ib += 1
            else:
                token[tail] = ta[ia]
                freq[tail] = np.int64(fa[ia]) + np.int64(fb[ib])
                qa[tail] = ia
                qb[tail] = ib
                ia += 1
                ib += 1
            tail += 1
        i += 1
    child_start[tail] = tail
    return token[:tail].copy(), freq[:tail].copy(), child_start[: tail + 1].copy()


@njit(cache=True)
def reduce_csr(token, freq, child_start, threshold):
    """Reference ``reduce``: keep a child iff its frequency >= threshold (its parent kept).

    A kept node's new frequency is its old one minus the mass dropped anywhere below it: the
    frequency of each dropped child plus, recursively, what its kept children dropped.
    Returns ``(token, freq int64, child_start)`` of the kept nodes in the same (BFS) order.
    """
    n = token.shape[0]
    dropped = np.zeros(n, np.int64)
    for i in range(n - 1, -1, -1):
        lo, hi = _range(child_start, i, n)
        s = np.int64(0)
        for c in range(max(lo, i + 1), hi):
            if freq[c] < threshold:
                s += freq[c]
            else:
                s += dropped[c]
        dropped[i] = s
    keep = np.zeros(n, np.bool_)
    keep[0] = True
    for i in range(n):
        if keep[i]:
            lo, hi = _range(child_start, i, n)
            for c in range(max(lo, i + 1), hi):
                keep[c] = freq[c] >= threshold
    m = 0
    for i in range(n):
        if keep[i]:
            m += 1
    new_token = np.empty(m, np.int32)
    new_freq = np.empty(m, np.int64)
    new_cs = np.empty(m + 1, np.int64)
    new_cs[0] = 1
    j = 0
    for i in range(n):
        if keep[i]:
            new_token[j] = token[i]
            new_freq[j] = np.int64(freq[i]) - dropped[i]
            lo, hi = _range(child_start, i, n)
            kept_children = 0
            for c in range(max(lo, i + 1), hi):
                if keep[c]:
                    kept_children += 1
            new_cs[j + 1] = new_cs[j] + kept_children
            j += 1
    return new_token, new_freq, new_cs


@njit(cache=True)
def check_offsets(freq, child_start, order):
    """The checks of every load (docs/spec.md §6.2), one pass over ``child_start`` and ``freq``:
    returns ``(status, node)`` with status OK or the first problem.

    ``child_start`` starts at 1, ends at ``n``, never decreases and puts each node's children
    after it (so the ranges tile ``1..n-1`` in order: each node but the root has one parent,
    which precedes it, and the levels are ranges); no path is longer than ``order`` (a walk of
    at most ``order + 1`` steps over the levels); frequencies are >= 0 and a node's children
    count no more windows than it does (the root's freq, which never enters a probability and is
    negative in reduced reference tries, is not checked).
    """
    n = freq.shape[0]
    if n < 1 or child_start.shape[0] != n + 1:
        return BAD_LENGTHS, 0
    if child_start[0] != 1 or child_start[n] != n:
        return BAD_ROOT_RANGE, 0
    for i in range(n):  # one fused loop: about 3 GB/s from the page cache
        lo = child_start[i]
        hi = child_start[i + 1]
        if hi < lo:
            return DECREASING, i
        if lo <= i:
            return BAD_RANGE, i
        if hi > n:
            return PAST_END, i
        if i > 0:
            f = freq[i]
            if f < 0:
                return NEGATIVE_FREQ, i
            total = np.int64(0)
            for c in range(lo, hi):
                total += freq[c]
            if total > f:
                return FREQ_SUM, i
    lo = 0
    hi = 1
    depth = 0
    while hi > lo:  # nodes lo..hi-1 are the level at `depth`
        if depth > order:
            return TOO_DEEP, lo
        lo, hi = child_start[lo], child_start[hi]
        depth += 1
    return OK, 0


@njit(cache=True)
def check_levels(freq, child_start, order):
    """The counts against the order (docs/spec.md §6.2, `verify`): below the order a window ends
    early only at its sequence's end, so the windows ending at depth d+1 (level d+1's freq minus
    level d+2's) are at most those ending at depth d, in any built, merged or reduced trie; a
    header whose order was raised breaks this at the true order. Returns ``(status, depth)``;
    the levels must have passed ``check_offsets``."""
    sums = np.zeros(order + 2, np.int64)  # sums[d]: total freq of the nodes at depth d
    lo, hi, depth = 1, child_start[1], 1
    while hi > lo and depth <= order:
        total = np.int64(0)
        for i in range(lo, hi):
            total += freq[i]
        sums[depth] = total
        lo, hi = child_start[lo], child_start[hi]
        depth += 1
    for d in range(1, order - 1):
        if sums[d + 1] - sums[d + 2] > sums[d] - sums[d + 1]:
            return ORDER_COUNTS, d + 1
    return OK, 0


@njit(cache=True)
def check_csr(token, freq, child_start, order):
    """Full structural check (``verify``): ``check_offsets``, then the children of each node
    strictly increase in token and every token but the root's is >= 0. Returns ``(status, node)``."""
    if token.shape[0] != freq.shape[0]:
        return BAD_LENGTHS, 0
    status, node = check_offsets(freq, child_start, order)
    if status != OK:
        return status, node
    n = token.shape[0]
    for i in range(n):
        for c in range(child_start[i] + 1, child_start[i + 1]):
            if token[c] <= token[c - 1]:
                return UNSORTED, i
    for c in range(1, n):
        if token[c] < 0:
            return NEGATIVE_TOKEN, c
    return OK, 0
