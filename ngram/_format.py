"""dart_jax's trie file: a 64-byte header, then the three CSR arrays at 64-byte aligned offsets
(docs/spec.md §6.2). Shared by `Trie.save`/`Trie.load` and the streaming reference converter."""
from __future__ import annotations

import struct

import numpy as np

MAGIC = b"DJNGTRIE"
VERSION = 1
# magic, u32 version, u32 header size, u64 order, u64 node count, u64 offsets of token, freq and
# child_start, u64 file size
HEADER = struct.Struct("<8sIIQQQQQQ")
_ALIGN = 64


def _aligned(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def layout(num_nodes: int) -> tuple[int, int, int, int]:
    """Offsets of token, freq and child_start, and the file size, for `num_nodes` nodes."""
    tok_off = _aligned(HEADER.size)
    freq_off = _aligned(tok_off + 4 * num_nodes)
    cs_off = _aligned(freq_off + 4 * num_nodes)
    return tok_off, freq_off, cs_off, cs_off + 8 * (num_nodes + 1)


def create_file(path: str, order: int, num_nodes: int) -> tuple[np.memmap, np.memmap, np.memmap]:
    """Create a trie file of the right size with its header; return writable array views."""
    tok_off, freq_off, cs_off, size = layout(num_nodes)
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, HEADER.size, order, num_nodes, tok_off, freq_off, cs_off, size))
        f.truncate(size)
    return (
        np.memmap(path, dtype="<i4", mode="r+", offset=tok_off, shape=(num_nodes,)),
        np.memmap(path, dtype="<i4", mode="r+", offset=freq_off, shape=(num_nodes,)),
        np.memmap(path, dtype="<i8", mode="r+", offset=cs_off, shape=(num_nodes + 1,)),
    )
