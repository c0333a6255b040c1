"""Streaming reader of the reference (C++) ``.trie`` format (docs/spec.md §6) into the CSR layout.

Two passes over flat arrays, never per-node Python objects:
1. parse the file chunk by chunk (Numba), storing each node's token and freq and its child
   edges (token, old child id) in file order, with every count and id bounds-checked;
2. walk breadth-first from the root, sorting each node's edges by token; the queue of old ids
   IS the new order, so a node's new id is simply its queue position (no id remap table).
With an output path the scratch arrays are memory-mapped files in a scratch folder next to it
(removed at the end, or by the next run when this one was killed) and the output is written under
a temporary name, renamed when complete (``_atomic``). Every count, id, token and frequency read
from the file is checked before it is used as an index or stored; the result gets the checks of
every ``Trie.load`` (docs/spec.md §6.2) before it is written.
"""
from __future__ import annotations

import os
import struct

import numpy as np
from numba import njit
from tqdm.auto import tqdm

from dart_jax.errors import FileFormatError, InputError, MissingFileError

from . import _build
from ._atomic import atomic_path, check_output, scratch_dir
from ._format import MAGIC, MAX_ORDER, create_file
from ._memory import check_disk, check_memory

_RECORD = 24  # i32 token, u64 parent, i32 freq, u64 n_children
_EDGE = 12  # i32 child token, u64 child id
_SMALL_SORT = 32
MAX_CHUNK_BYTES = 1 << 34  # 16 GiB read at a time at most
# bytes per node: parsed arrays (token, freq, edge start, edge token, edge child), BFS queue and
# seen flags, then the output (token, freq, child_start)
_SCRATCH_PER_NODE = 4 + 4 + 8 + 4 + 8 + 8 + 1
_OUTPUT_PER_NODE = 16
# What to do about a damaged reference file
_FETCH_AGAIN = "download or copy the reference .trie again"

# parse / walk status codes
OK = 0
NEED_MORE = 1
TOO_MANY_CHILDREN = 2
BAD_PARENT = 3
BAD_CHILD = 4
UNREACHABLE = 5
TWO_PARENTS = 6
TOKEN_MISMATCH = 7
REPEATED_TOKEN = 8
NEGATIVE_TOKEN = 9
NEGATIVE_FREQ = 10


@njit(cache=True, inline="always")
def _u32(buf, p):
    return (
        np.uint32(buf[p])
        | (np.uint32(buf[p + 1]) << np.uint32(8))
        | (np.uint32(buf[p + 2]) << np.uint32(16))
        | (np.uint32(buf[p + 3]) << np.uint32(24))
    )


@njit(cache=True, inline="always")
def _i32(buf, p):
    return np.int32(np.int64(_u32(buf, p)) - (np.int64(1) << 32) * (np.int64(buf[p + 3]) >> 7))


@njit(cache=True, inline="always")
def _u64(buf, p):
    return np.uint64(_u32(buf, p)) | (np.uint64(_u32(buf, p + 4)) << np.uint64(32))


@njit(cache=True)
def parse_records(buf, nbytes, node, node_count, edge, node_token, node_freq, edge_start, edge_token, edge_child):
    """Parse whole node records from ``buf[:nbytes]`` starting with node ``node``.

    Returns ``(status, bytes used, next node, next edge, detail)``; on NEED_MORE ``detail`` is
    the byte count the next record needs, otherwise the offending value.
    """
    ucount = np.uint64(node_count)
    p = 0
    while node < node_count:
        if p + _RECORD > nbytes:
            return NEED_MORE, p, node, edge, np.int64(_RECORD)
        nc = _u64(buf, p + 16)
        if nc > np.uint64(node_count - 1 - edge):
            return TOO_MANY_CHILDREN, p, node, edge, np.int64(min(nc, np.uint64(1) << np.uint64(62)))
        parent = _u64(buf, p + 4)
        if parent >= ucount:
            return BAD_PARENT, p, node, edge, np.int64(min(parent, np.uint64(1) << np.uint64(62)))
        need = _RECORD + _EDGE * np.int64(nc)
        if p + need > nbytes:
            return NEED_MORE, p, node, edge, need
        tok = _i32(buf, p)
        fr = _i32(buf, p + 12)
        if node > 0 and tok < 0:  # the root's token and freq are unused
            return NEGATIVE_TOKEN, p, node, edge, np.int64(tok)
        if node > 0 and fr < 0:
            return NEGATIVE_FREQ, p, node, edge, np.int64(fr)
        node_token[node] = tok
        node_freq[node] = fr
        edge_start[node] = edge
        q = p + _RECORD
        for _ in range(np.int64(nc)):
            child = _u64(buf, q + 4)
            if child == np.uint64(0) or child >= ucount:
                return BAD_CHILD, p, node, edge, np.int64(min(child, np.uint64(1) << np.uint64(62)))
            edge_token[edge] = _i32(buf, q)
            edge_child[edge] = np.int64(child)
            edge += 1
            q += _EDGE
        p += need
        node += 1
    return OK, p, node, edge, np.int64(0)


@njit(cache=True)
def bfs_walk(p0, p1, tail, queue, node_token, node_freq, edge_start, edge_token, edge_child, seen,
             out_token, out_freq, out_cs, scratch_tok, scratch_id):
    """Assign new ids ``p0 .. p1-1`` (queue positions); returns ``(status, tail, detail)``."""
    for p in range(p0, p1):
        if p >= tail:
            return UNREACHABLE, tail, p
        old = queue[p]
        out_token[p] = node_token[old]
        out_freq[p] = node_freq[old]
        out_cs[p] = tail
        lo = edge_start[old]
        nc = edge_start[old + 1] - lo
        if nc <= _SMALL_SORT:
            for j in range(nc):
                t = edge_token[lo + j]
                c = edge_child[lo + j]
                k = j
                while k > 0 and scratch_tok[k - 1] > t:
                    scratch_tok[k] = scratch_tok[k - 1]
                    scratch_id[k] = scratch_id[k - 1]
                    k -= 1
                scratch_tok[k] = t
                scratch_id[k] = c
            toks = scratch_tok[:nc]
            kids = scratch_id[:nc]
        else:
            perm = np.argsort(edge_token[lo : lo + nc], kind="mergesort")
            toks = edge_token[lo : lo + nc][perm]
            kids = edge_child[lo : lo + nc][perm]
        for j in range(nc):
            c = kids[j]
            if j > 0 and toks[j] == toks[j - 1]:
                return REPEATED_TOKEN, tail, old
            if seen[c]:
                return TWO_PARENTS, tail, c
            if node_token[c] != toks[j]:
                return TOKEN_MISMATCH, tail, c
            seen[c] = True
            queue[tail] = c
            tail += 1
    return OK, tail, 0


def check_chunk_bytes(chunk_bytes, verb: str) -> None:
    """An InputError unless `chunk_bytes` (bytes `verb` at a time) is an integer in [1, MAX_CHUNK_BYTES]."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)) \
            or not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise InputError(f"chunk_bytes (--chunk-mb) must be an integer in [1, {MAX_CHUNK_BYTES}] bytes "
                         f"({verb} at a time); got {chunk_bytes!r}.")


def convert_reference(cls, path, out, *, chunk_bytes: int, progress: bool):
    path = os.fspath(path)
    check_chunk_bytes(chunk_bytes, "read")
    if not os.path.exists(path):
        raise MissingFileError(f"No reference .trie file at {path!r}.")
    if not os.path.isfile(path):
        raise FileFormatError(path, "is a folder or a special file, not a reference .trie; pass the file itself.")
    if out is not None:
        out = check_output(out, "converted trie output")
        if os.path.exists(out) and os.path.samefile(path, out):
            raise InputError(f"the output {out!r} is the reference file itself; write the converted trie to "
                             "another name.")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        order, n = _read_header(f, path, size)
        if out is None:
            check_memory((_SCRATCH_PER_NODE + _OUTPUT_PER_NODE) * n, f"converting {path!r} ({n} nodes) in memory",
                         "pass an output file (Trie.from_reference(path, out) or `python -m dart_jax.ngram "
                         "convert`): its scratch arrays are on disk")
            arrays = (np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n + 1, np.int64))
            _convert(f, path, size, order, n, chunk_bytes, progress, lambda name, dtype, shape: np.empty(shape, dtype),
                     arrays)
            return cls(*arrays, order=order)
        folder = os.path.dirname(out)
        check_disk((_SCRATCH_PER_NODE + _OUTPUT_PER_NODE) * n, folder, f"converting {path!r} ({n} nodes)")
        with scratch_dir(folder) as scratch, atomic_path(out) as tmp:
            def alloc(name, dtype, shape):
                return np.memmap(os.path.join(scratch, name), dtype=dtype, mode="w+", shape=shape)

            arrays = create_file(tmp, order, n)
            _convert(f, path, size, order, n, chunk_bytes, progress, alloc, arrays)
            for a in arrays:
                a.flush()
            del arrays, a
    return cls.load(out)


def _convert(f, path, size, order, n, chunk_bytes, progress, alloc, arrays):
    """Parse the records after the header into `alloc`'ed scratch arrays, renumber breadth-first
    into `arrays` (token, freq, child_start) and check the result; FileFormatError on any problem."""
    node_token = alloc("node_token", np.int32, n)
    node_freq = alloc("node_freq", np.int32, n)
    edge_start = alloc("edge_start", np.int64, n + 1)
    edge_token = alloc("edge_token", np.int32, max(n - 1, 1))
    edge_child = alloc("edge_child", np.int64, max(n - 1, 1))
    _parse(f, path, size, n, chunk_bytes, progress, node_token, node_freq, edge_start, edge_token, edge_child)
    queue = alloc("queue", np.int64, n)
    seen = alloc("seen", np.bool_, n)
    _walk(path, n, progress, queue, seen, node_token, node_freq, edge_start, edge_token, edge_child, *arrays)
    status, node = _build.check_offsets(arrays[1], arrays[2], order)
    if status != _build.OK:
        problem = _build.CHECK_MESSAGES[status].format(node=f"{node} (breadth-first)", order=order)
        raise FileFormatError(path, f"corrupted reference trie: {problem}; {_FETCH_AGAIN}.")


def _read_header(f, path, size):
    head = f.read(16)
    if len(head) < 16:
        raise FileFormatError(path, f"{size} bytes: too short for a reference .trie header (16 bytes); "
                                    f"{_FETCH_AGAIN}.")
    if head[:8] == MAGIC:
        raise FileFormatError(path, "already a dart_jax trie; open it with Trie.load() (no conversion needed).")
    order, n = struct.unpack("<QQ", head)
    if not 1 <= order <= MAX_ORDER:
        raise FileFormatError(path, f"does not look like a reference .trie: its header says order {order} "
                                    f"(expected 1..{MAX_ORDER}); pass a .trie written by the reference.")
    if n < 1 or n > (size - 16) // _RECORD:
        raise FileFormatError(path, f"the header says {n} nodes but {size} bytes hold at most "
                                    f"{(size - 16) // _RECORD}; the file is truncated or not a reference .trie "
                                    f"({_FETCH_AGAIN}).")
    return int(order), int(n)


_PARSE_ERRORS = {
    TOO_MANY_CHILDREN: "node {node} claims {detail} children, more than the nodes left",
    BAD_PARENT: "node {node} has parent id {detail}, not below the node count",
    BAD_CHILD: "node {node} lists child id {detail}, which is the root or not below the node count",
    NEGATIVE_TOKEN: "node {node} has the negative token id {detail}",
    NEGATIVE_FREQ: "node {node} has the negative frequency {detail}",
}


def _parse(f, path, size, n, chunk_bytes, progress, node_token, node_freq, edge_start, edge_token, edge_child):
    node = edge = 0
    pos = 16  # file offset of buf[0]
    buf = np.zeros(0, np.uint8)
    want = chunk_bytes
    with tqdm(total=size, initial=16, unit="B", unit_scale=True, desc="reading .trie", disable=not progress,
              delay=1.0) as bar:
        while node < n:
            data = f.read(want)
            if not data:
                raise FileFormatError(path, f"truncated: it ends inside node {node} of {n}; {_FETCH_AGAIN}.")
            buf = np.concatenate((buf, np.frombuffer(data, np.uint8)))
            status, used, node, edge, detail = parse_records(
                buf, buf.size, node, n, edge, node_token, node_freq, edge_start, edge_token, edge_child
            )
            if status == NEED_MORE:
                if pos + used + detail > size:
                    raise FileFormatError(path, f"truncated: node {node} of {n} needs {detail} bytes at offset "
                                                f"{pos + used} but the file has {size} bytes; {_FETCH_AGAIN}.")
                want = max(chunk_bytes, int(detail) - (buf.size - used))
            elif status != OK:
                msg = _PARSE_ERRORS[status].format(node=node, detail=detail)
                raise FileFormatError(path, f"corrupted: {msg} (byte offset {pos + used}); {_FETCH_AGAIN}.")
            pos += used
            buf = buf[used:].copy()
            bar.update(used)
    edge_start[n] = edge
    if edge != n - 1:
        raise FileFormatError(path, f"corrupted: {n} nodes but {edge} child links (a tree has {n - 1}); "
                                    f"{_FETCH_AGAIN}.")
    if pos != size:
        raise FileFormatError(path, f"{size - pos} bytes after its last node: not a single reference .trie "
                                    f"(concatenated or corrupted file); {_FETCH_AGAIN}.")


_WALK_ERRORS = {
    UNREACHABLE: "nodes from new id {detail} on cannot be reached from the root (a cycle)",
    TWO_PARENTS: "node {detail} is listed as a child twice",
    TOKEN_MISMATCH: "node {detail} has a token different from the one its parent lists",
    REPEATED_TOKEN: "node {detail} lists the same child token twice",
}


def _walk(path, n, progress, queue, seen, node_token, node_freq, edge_start, edge_token, edge_child,
          out_token, out_freq, out_cs):
    queue[0] = 0
    seen[:] = False
    seen[0] = True
    tail = 1
    scratch_tok = np.empty(_SMALL_SORT, np.int32)
    scratch_id = np.empty(_SMALL_SORT, np.int64)
    step = 1 << 22
    with tqdm(total=n, unit="node", unit_scale=True, desc="reordering", disable=not progress,
              delay=1.0) as bar:
        for p0 in range(0, n, step):
            p1 = min(n, p0 + step)
            status, tail, detail = bfs_walk(
                p0, p1, tail, queue, node_token, node_freq, edge_start, edge_token, edge_child, seen,
                out_token, out_freq, out_cs, scratch_tok, scratch_id,
            )
            if status != OK:
                raise FileFormatError(path, f"corrupted: {_WALK_ERRORS[status].format(detail=detail)}; "
                                            f"{_FETCH_AGAIN}.")
            bar.update(p1 - p0)
    out_cs[n] = n
