"""Writer of the reference (C++) ``.trie`` format (docs/spec.md §6.1) from either of dart_jax's
formats, streamed: the PyTorch reference loads the result as it is.

Nodes keep dart_jax's breadth-first numbering, one record each in id order, children listed in
increasing token order, the root's parent 0 and every other node's parent its real parent (the
reference keeps the field; dart_jax's reader only range-checks it). A trie source is read through
`arrays(a, b) -> (token[a:b], freq[a:b], child_start[a:b+1])`, so the CSR file (memory-mapped
slices) and the compressed one (decoded a range at a time) share this code. Three cursors walk
the source in order: the records, the children's tokens (the edges of nodes `a..b-1` are the
contiguous ids `child_start[a] .. child_start[b]-1`), and the parents (non-decreasing with the
node id: the parent of `j` is the `p` with `child_start[p] <= j < child_start[p+1]`). Memory stays
bounded by the chunk size whatever the trie's size; the output is written under a temporary name
and renamed when complete (`_atomic`).
"""
from __future__ import annotations

import os
import struct
from typing import Callable

import numpy as np
from numba import njit
from tqdm.auto import tqdm

from dart_jax.errors import InputError

from ._atomic import atomic_path, check_output
from ._memory import check_disk
from ._reference import check_chunk_bytes

_RECORD = 24  # i32 token, u64 parent, i32 freq, u64 n_children
_EDGE = 12  # i32 child token, u64 child id
_HEADER = struct.Struct("<QQ")  # u64 order, u64 node count
CHUNK_BYTES = 1 << 26  # bytes of records packed and written at a time (at least one record)
_NODES = 1 << 20  # nodes read from the source at a time, at most
_INT32 = np.iinfo(np.int32)

Source = Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]


def reference_size(num_nodes: int) -> int:
    """Bytes of a reference `.trie` of `num_nodes` nodes (a tree: `num_nodes - 1` child links)."""
    return _HEADER.size + _RECORD * num_nodes + _EDGE * (num_nodes - 1)


@njit(cache=True)
def _pack(token, freq, child_start, parent, child_token, out):
    """Records of nodes `0..m-1` of a chunk into `out` (little-endian, packed): `child_start` holds
    their m+1 absolute child offsets, `child_token` the tokens of ids child_start[0]..child_start[m]-1."""
    p = 0
    first = child_start[0]
    for k in range(token.shape[0]):
        lo, hi = child_start[k], child_start[k + 1]
        _put(out, p, np.uint64(np.int64(token[k]) & 0xFFFFFFFF), 4)
        _put(out, p + 4, np.uint64(parent[k]), 8)
        _put(out, p + 12, np.uint64(np.int64(freq[k]) & 0xFFFFFFFF), 4)
        _put(out, p + 16, np.uint64(hi - lo), 8)
        p += _RECORD
        for c in range(lo, hi):
            _put(out, p, np.uint64(np.int64(child_token[c - first]) & 0xFFFFFFFF), 4)
            _put(out, p + 4, np.uint64(c), 8)
            p += _EDGE
    return p


@njit(cache=True, inline="always")
def _put(out, p, value, nbytes):
    for i in range(nbytes):
        out[p + i] = np.uint8((value >> np.uint64(8 * i)) & np.uint64(255))


class _Parents:
    """The parent of each node, in increasing node order, reading `child_start` a window at a time."""

    def __init__(self, arrays: Source, n: int):
        self._arrays, self._n, self._p = arrays, n, 0

    def of(self, lo: int, hi: int) -> np.ndarray:
        out = np.zeros(hi - lo, np.uint64)  # the root's parent is 0
        j = max(lo, 1)
        while j < hi:
            end = min(self._n, self._p + _NODES)
            window = self._arrays(self._p, end)[2]  # child_start[p .. end]
            last = hi if end == self._n else min(hi, int(window[-1]))
            if last > j:
                ids = np.arange(j, last, dtype=np.int64)
                out[j - lo:last - lo] = self._p + np.searchsorted(window, ids, side="right") - 1
                self._p = int(out[last - 1 - lo])
                j = last
            else:  # every child of this window's nodes lies before j: the parent is further on
                self._p = end
        return out


def write_reference(path, order: int, n: int, arrays: Source, *, progress: bool = False,
                    chunk_bytes: int = CHUNK_BYTES) -> str:
    """Write a trie of `n` nodes (read through `arrays`, module docstring) as a reference `.trie`
    at `path`, atomically; returns the absolute path. Frequencies outside int32 (the reference's
    count type) are an InputError naming the node."""
    check_chunk_bytes(chunk_bytes, "written")
    path = check_output(path, "reference .trie output")
    check_disk(reference_size(n), os.path.dirname(path), f"writing {path!r} ({n} nodes)")
    parents = _Parents(arrays, n)
    buf = np.empty(0, np.uint8)
    with atomic_path(path) as tmp, open(tmp, "wb") as f, \
            tqdm(total=n, unit="node", unit_scale=True, desc="writing .trie", disable=not progress, delay=1.0) as bar:
        f.write(_HEADER.pack(order, n))
        lo = 0
        while lo < n:
            token, freq, child_start = arrays(lo, min(n, lo + _NODES))
            sizes = _RECORD * np.arange(1, token.shape[0] + 1) + _EDGE * (child_start[1:] - child_start[0])
            m = max(1, int(np.searchsorted(sizes, chunk_bytes, side="right")))
            token, freq, child_start = token[:m], np.asarray(freq[:m], np.int64), child_start[:m + 1]
            bad = np.flatnonzero((freq < _INT32.min) | (freq > _INT32.max))
            if bad.size:
                raise InputError(f"node {lo + int(bad[0])} counts {int(freq[bad[0]])} windows, beyond the int32 counts "
                                 "of the reference .trie format; reduce the trie (`ngram reduce`) or count less text.")
            first, end = int(child_start[0]), int(child_start[m])
            child_token = arrays(first, end)[0] if end > first else np.zeros(0, np.int32)
            if buf.size < sizes[m - 1]:
                buf = np.empty(int(sizes[m - 1]), np.uint8)
            used = _pack(token, freq, child_start, parents.of(lo, lo + m), child_token, buf)
            f.write(memoryview(buf[:used]))
            lo += m
            bar.update(m)
        if f.tell() != reference_size(n):
            raise InputError(f"the trie's children table is inconsistent ({f.tell()} bytes written, "
                             f"{reference_size(n)} expected); check it with `ngram info --verify`.")
    return path
