"""One query interface over both trie formats, for Numba code (the tree search).

A trie reaches the kernels as a tuple of its arrays: the CSR format's
``(token, freq, child_start, root_table)`` (``Trie.search_arrays()``) or the compressed
format's tuple (``CompressedTrie.search_arrays()``, see ``_compressed.py``). Each function
below is a Numba overload that picks the implementation by the tuple's type, so one search
kernel compiles once per format and the CSR path keeps its own code.

Nodes are numbered breadth-first with children sorted by token in both formats, so node ids,
frequencies and therefore every answer are the same whichever format is read.

The implementations are compiled without reference counting (``_nrt=False``: they allocate
nothing) and called, not inlined. Inlined into the reference-counted search kernel, or compiled
with reference counting, each call would take a new reference to every array of the trie's tuple
and drop it again: two atomic operations per array, 44 per call for the compressed format's 22
arrays, which cost more than the lookup itself (about 300 ns a call on a 2-core CPU).
"""
from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload

from ._compressed import (
    ct_children, ct_children_keyed, ct_find_child, ct_freq, ct_freq_at, ct_keys, ct_root_child, ct_size,
)
from ._query import find_child, find_children, num_valid_nodes, root_child

__all__ = ["trie_size", "trie_freq", "trie_freq_at", "trie_root_child", "trie_find_child", "trie_children", "trie_keys",
           "trie_children_keyed"]


def _is_csr(tr) -> bool:
    return isinstance(tr, types.BaseTuple) and len(tr) == 4


def _is_compressed(tr) -> bool:
    return isinstance(tr, types.BaseTuple) and len(tr) != 4


def trie_size(tr):
    """Number of nodes the lookups may return (0 for an empty or unusable trie)."""
    raise NotImplementedError("only callable from Numba code")


def trie_freq(tr, node):
    """freq of ``node`` (an int64)."""
    raise NotImplementedError("only callable from Numba code")


def trie_freq_at(tr, level, node):
    """``trie_freq`` of a node known to be at depth ``level`` (the compressed format skips finding it)."""
    raise NotImplementedError("only callable from Numba code")


def trie_root_child(tr, n, tok):
    """Child of the root with token ``tok``, or -1 (``n`` = ``trie_size(tr)``)."""
    raise NotImplementedError("only callable from Numba code")


def trie_find_child(tr, n, node, tok):
    """Child of ``node`` with token ``tok``, or -1."""
    raise NotImplementedError("only callable from Numba code")


def trie_children(tr, n, node, cands, row, out_child, out_freq, slot, scratch):
    """For every candidate ``cands[row, i]``: ``out_child[slot, i]`` = its child under ``node``
    or -1, and ``out_freq[slot, i]`` = float32 of that child's freq (unset where -1).
    ``scratch``: int64[>= k] the caller allocates once (the compressed format's working space)."""
    raise NotImplementedError("only callable from Numba code")


def trie_keys(tr, level, cands, row, out):
    """``out[i]`` = what ``trie_children_keyed`` searches for to find ``cands[row, i]`` among the
    children of a node whose children are at depth ``level``: computed once, used under many nodes
    (the token itself in the CSR format, its rank at that level in the compressed one)."""
    raise NotImplementedError("only callable from Numba code")


def trie_children_keyed(tr, n, node, level, keys, out_child, out_freq, slot):
    """``trie_children`` for a node whose children are at depth ``level``, with the candidates' keys
    from ``trie_keys`` for that level."""
    raise NotImplementedError("only callable from Numba code")


@overload(trie_size, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_size(tr):
    if _is_csr(tr):
        def impl(tr):
            return num_valid_nodes(tr[0], tr[1], tr[2])
        return impl
    if _is_compressed(tr):
        def impl(tr):
            return ct_size(tr)
        return impl


@overload(trie_freq, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_freq(tr, node):
    if _is_csr(tr):
        def impl(tr, node):
            return np.int64(tr[1][node])
        return impl
    if _is_compressed(tr):
        def impl(tr, node):
            return ct_freq(tr, node)
        return impl


@overload(trie_freq_at, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_freq_at(tr, level, node):
    if _is_csr(tr):
        def impl(tr, level, node):
            return np.int64(tr[1][node])
        return impl
    if _is_compressed(tr):
        def impl(tr, level, node):
            return ct_freq_at(tr, level, node)
        return impl


@overload(trie_root_child, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_root_child(tr, n, tok):
    if _is_csr(tr):
        def impl(tr, n, tok):
            return root_child(tr[0], tr[2], n, tr[3], tok)
        return impl
    if _is_compressed(tr):
        def impl(tr, n, tok):
            return ct_root_child(tr, n, tok)
        return impl


@overload(trie_find_child, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_find_child(tr, n, node, tok):
    if _is_csr(tr):
        def impl(tr, n, node, tok):
            return find_child(tr[0], tr[2], n, node, tok)
        return impl
    if _is_compressed(tr):
        def impl(tr, n, node, tok):
            return ct_find_child(tr, n, node, tok)
        return impl


@overload(trie_children, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_children(tr, n, node, cands, row, out_child, out_freq, slot, scratch):
    if _is_csr(tr):
        def impl(tr, n, node, cands, row, out_child, out_freq, slot, scratch):
            token, freq, child_start = tr[0], tr[1], tr[2]
            k = cands.shape[1]
            find_children(token, child_start, n, node, cands[row], out_child[slot], k)
            for i in range(k):
                ch = out_child[slot, i]
                if ch >= 0:
                    out_freq[slot, i] = np.float32(freq[ch])
        return impl
    if _is_compressed(tr):
        def impl(tr, n, node, cands, row, out_child, out_freq, slot, scratch):
            ct_children(tr, n, node, cands, row, out_child, out_freq, slot, scratch)
        return impl


@overload(trie_keys, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_keys(tr, level, cands, row, out):
    if _is_csr(tr):
        def impl(tr, level, cands, row, out):
            for i in range(cands.shape[1]):
                out[i] = cands[row, i]
        return impl
    if _is_compressed(tr):
        def impl(tr, level, cands, row, out):
            ct_keys(tr, level, cands, row, out)
        return impl


@overload(trie_children_keyed, jit_options={"_nrt": False})  # no reference counting: see the module docstring
def _trie_children_keyed(tr, n, node, level, keys, out_child, out_freq, slot):
    if _is_csr(tr):
        def impl(tr, n, node, level, keys, out_child, out_freq, slot):
            k = keys.shape[0]
            find_children(tr[0], tr[2], n, node, keys, out_child[slot], k)
            for i in range(k):
                ch = out_child[slot, i]
                if ch >= 0:
                    out_freq[slot, i] = np.float32(tr[1][ch])
        return impl
    if _is_compressed(tr):
        def impl(tr, n, node, level, keys, out_child, out_freq, slot):
            ct_children_keyed(tr, n, node, level, keys, out_child, out_freq, slot)
        return impl
