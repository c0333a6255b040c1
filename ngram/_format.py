"""dart_jax's trie file: a 64-byte header, then the three CSR arrays at 64-byte aligned offsets
(docs/spec.md §6.2). Shared by `Trie.save`/`Trie.load` and the streaming reference converter."""
from __future__ import annotations

import os
import struct

import numpy as np

from dart_jax.errors import FileFormatError, MissingFileError

MAGIC = b"DJNGTRIE"
VERSION = 1
# magic, u32 version, u32 header size, u64 order, u64 node count, u64 offsets of token, freq and
# child_start, u64 file size
HEADER = struct.Struct("<8sIIQQQQQQ")
_ALIGN = 64
# Largest n-gram order a trie may have, in both formats (docs/spec.md §6): far above any useful
# order (the reference uses 3), small enough that the searches' per-order buffers stay tiny.
MAX_ORDER = 64
# What to do about a damaged file; every FileFormatError about a trie's contents ends with it.
REBUILD = ("rebuild it (`python -m dart_jax.ngram build`) or convert the reference .trie again "
           "(`python -m dart_jax.ngram convert`)")


def _aligned(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def layout(num_nodes: int) -> tuple[int, int, int, int]:
    """Offsets of token, freq and child_start, and the file size, for `num_nodes` nodes."""
    tok_off = _aligned(HEADER.size)
    freq_off = _aligned(tok_off + 4 * num_nodes)
    cs_off = _aligned(freq_off + 4 * num_nodes)
    return tok_off, freq_off, cs_off, cs_off + 8 * (num_nodes + 1)


def looks_like_reference(head: bytes) -> bool:
    """Whether the first 16 bytes could be a reference `.trie` header (u64 order, u64 node count)."""
    if len(head) < 16:
        return False
    order, count = struct.unpack_from("<QQ", head)
    return 1 <= order <= MAX_ORDER and count >= 1


def read_header(path: str) -> tuple[int, int, tuple[int, int, int]]:
    """``(order, node count, (token, freq, child_start offsets))`` of a dart_jax trie file, after
    every check on the header and the file size (docs/spec.md §6.2); FileFormatError otherwise."""
    if not os.path.exists(path):
        raise MissingFileError(f"No trie file at {path!r}; pass the path of a trie file (written by `python -m "
                               "dart_jax.ngram build`, `convert` or `compress`, or a reference .trie), or build one "
                               "with `python -m dart_jax.ngram build CORPUS -o OUT`.")
    if not os.path.isfile(path):
        raise FileFormatError(path, "is a folder or a special file, not a trie file; pass the trie file itself.")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < 8 or head[:8] != MAGIC:
        hint = ("It looks like a reference (C++) .trie: convert it once with "
                f"`python -m dart_jax.ngram convert {path} OUT` or Trie.from_reference()."
                if looks_like_reference(head) else
                "Pass a trie written by `python -m dart_jax.ngram build/convert` or Trie.save().")
        raise FileFormatError(path, f"not a dart_jax trie file (bad magic number). {hint}")
    if len(head) < HEADER.size:
        raise FileFormatError(path, f"truncated: {size} bytes, shorter than the {HEADER.size}-byte header; "
                                    "copy or save the trie again.")
    _, version, header_size, order, n, tok_off, freq_off, cs_off, file_size = HEADER.unpack(head)
    if version != VERSION:
        raise FileFormatError(path, f"trie format version {version}; this dart_jax reads version {VERSION}. "
                                    "Rebuild or re-convert the trie with this version.")
    if header_size != HEADER.size:
        raise FileFormatError(path, f"corrupted header: header size {header_size}, expected {HEADER.size}; {REBUILD}.")
    if not 1 <= order <= MAX_ORDER:
        raise FileFormatError(path, f"corrupted header: order {order}, outside 1..{MAX_ORDER}; {REBUILD}.")
    if not 1 <= n <= size // 16:
        raise FileFormatError(path, f"corrupted header: {n} nodes, but {size} bytes hold 1..{size // 16} "
                                    f"(16 bytes per node); {REBUILD}.")
    if (tok_off, freq_off, cs_off, file_size) != layout(n):
        raise FileFormatError(path, f"corrupted header: array offsets do not match {n} nodes; {REBUILD}.")
    if size != file_size:
        raise FileFormatError(path, f"{size} bytes but its header says {file_size}: the file is "
                                    f"{'truncated' if size < file_size else 'followed by extra data'}; "
                                    "copy or save it again.")
    return int(order), int(n), (tok_off, freq_off, cs_off)


def map_arrays(path: str, n: int, offsets: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read-only memory maps of ``token``, ``freq`` and ``child_start`` (O(1) in the file size)."""
    tok_off, freq_off, cs_off = offsets
    return (
        np.asarray(np.memmap(path, dtype="<i4", mode="r", offset=tok_off, shape=(n,))),
        np.asarray(np.memmap(path, dtype="<i4", mode="r", offset=freq_off, shape=(n,))),
        np.asarray(np.memmap(path, dtype="<i8", mode="r", offset=cs_off, shape=(n + 1,))),
    )


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
