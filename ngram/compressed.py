"""The compressed trie file (docs/spec.md §6.3): ``CompressedTrie`` (load, queries, the tuple the
tree search reads), ``compress`` (from a CSR trie, streamed in chunks) and ``load_any`` (either
format, told apart by the magic number).

File, little-endian: a header ``struct "<8sIIQQQQQ"`` (magic ``DJNGCTRI``, u32 version 2, u32
header size, u64 order, u64 node count N, u64 remap width V (largest token + 1), u64 section
count 20, u64 file size), then 20 × (u64 offset, u64 byte length), then the sections at 64-byte
aligned offsets in the order of ``SECTIONS``.
"""
from __future__ import annotations

import os
import struct

import numpy as np
from numba import njit

from dart_jax.errors import FileFormatError, InputError, MissingFileError

from ._access import trie_children, trie_find_child, trie_freq, trie_root_child, trie_size
from ._atomic import atomic_path, check_output
from ._compressed import (
    CHECK_MESSAGES, C_OK, DENSE_MAX, KID_BLOCK, RANK_SHIFT, _KID_BLOCKS, _KID_WORDS, _LEVEL_START, _TOK_BIT,
    _TOK_COUNT, _TOK_WIDTH, _TOK_WORDS, check_compressed, ct_freq, fill_mark_ranks, kid_pair, pack_bits, pack_counts,
    pack_kids, read_bits, remap_ranks,
)
from ._format import MAGIC as TRIE_MAGIC, MAX_ORDER, REBUILD
from ._reference_write import CHUNK_BYTES, write_reference
from .trie import Trie, _as_ids

__all__ = ["CompressedTrie", "compress", "load_any", "MAGIC"]

MAGIC = b"DJNGCTRI"
VERSION = 2
HEADER = struct.Struct("<8sIIQQQQQ")
SECTION = struct.Struct("<QQ")
# name, dtype; the tuple the kernels read is ``meta``, these, then the start of each level's token table
SECTIONS = (
    ("level_start", "<i8"), ("tok_width", "<i8"), ("tok_bit", "<i8"), ("tok_count", "<i8"),
    ("cnt_width", "<i8"), ("cnt_bit", "<i8"), ("cnt_tab_start", "<i8"), ("cnt_table", "<i8"),
    ("esc_width", "<i8"), ("esc_bit", "<i8"), ("esc_before", "<i8"), ("remap", "<i4"),
    ("kid_blocks", "<i8"), ("kid_words", "<u8"), ("tok_words", "<u8"), ("cnt_words", "<u8"),
    ("esc_marks", "<u8"), ("esc_rank", "<i8"), ("esc_words", "<u8"), ("tok_table", "<i4"),
)
_ALIGN = 64
_CHUNK = 1 << 22  # nodes encoded at a time: bounded memory whatever the trie's size


def _empty(dtype: str) -> np.ndarray:
    """An empty section, read-only like the memory-mapped ones: the kernels see one array type
    whichever sections a file leaves empty (no escapes, no dense remap), so they compile once."""
    a = np.zeros(0, dtype)
    a.setflags(write=False)
    return a


_EMPTY = {dtype: _empty(dtype) for _, dtype in SECTIONS}


def _aligned(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def _bits(count: int) -> int:
    """Bits of a rank into a table of ``count`` entries."""
    return max(int(count) - 1, 0).bit_length()


def _words(bits: int) -> int:
    return bits // 64 + 2  # one spare word: a read of the last value may touch the next word


def _kid_blocks(n: int) -> int:
    """Blocks of the children offsets: the N + 1 values of child_start, 128 a block."""
    return (n + 1 + KID_BLOCK - 1) // KID_BLOCK


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Exact bit lengths of non-negative int64s."""
    out = np.zeros(x.shape, np.int64)
    for b in range(63):
        out += (x >> b) > 0
    return out


def _count_layout(hist: np.ndarray, force: bool) -> tuple[int, int]:
    """(narrow width, escapes) for a level whose distinct counts, ascending, occur ``hist`` times:
    a rank below 2^w - 1 is stored in w bits, any other rank as the escape value w ones plus its
    full-width rank aside. (full width, 0) is the plain layout; ``force`` takes the best w below it."""
    full = _bits(hist.size)
    n = int(hist.sum())
    above = np.concatenate([np.cumsum(hist[::-1])[::-1], [0]])  # above[r]: nodes of rank >= r
    best = (float("inf"), full, 0) if force and full > 0 else (n * full, full, 0)
    for w in range(full):
        e = int(above[min((1 << w) - 1, hist.size)])
        best = min(best, (n * w + e * full, w, e))
    return best[1], best[2]


class CompressedTrie:
    """A memory-mapped compressed trie: the same nodes, numbering and answers as the CSR ``Trie``
    it was made from (``probability``, ``search_arrays`` for the tree search)."""

    def __init__(self, order: int, num_nodes: int, vocab: int, sections: dict[str, np.ndarray]):
        self._order = int(order)
        self._n = int(num_nodes)
        self._vocab = int(vocab)
        self._s = sections
        self._path = "<memory>"  # the file it was loaded from, for error messages
        meta = np.array([self._n, self._vocab, self._order], np.int64)
        remap = sections["remap"].reshape(self._order, -1 if sections["remap"].size else 0)
        tok_tab_start = np.concatenate([[0], np.cumsum(sections["tok_count"])]).astype(np.int64)
        self._tr = (meta, *(remap if name == "remap" else sections[name] for name, _ in SECTIONS), tok_tab_start)

    @property
    def order(self) -> int:
        return self._order

    def max_token(self) -> int:
        """The largest token id of the trie's n-grams, as its header records it (the remap width - 1)."""
        return self._vocab - 1

    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self._s.values()))

    @property
    def root_freq(self) -> int:
        return int(self._s["cnt_table"][0]) if self._s["cnt_table"].size else 0

    def level_sizes(self) -> list[int]:
        ls = self._s["level_start"]
        return [int(ls[i + 1] - ls[i]) for i in range(len(ls) - 1)]

    def search_arrays(self) -> tuple:
        """The tuple the Numba lookups read (``_access.py``)."""
        return self._tr

    def __repr__(self) -> str:
        return f"CompressedTrie(order={self._order}, num_nodes={self._n})"

    def probability(self, context, tokens) -> tuple[np.ndarray, np.ndarray]:
        """(P, matched length) of each token after ``context``: docs/spec.md §5.2, as ``Trie.probability``."""
        ctx = np.ascontiguousarray(_as_ids(context, "context"), np.int64)
        cands = np.ascontiguousarray(_as_ids(tokens, "tokens"), np.int64)
        out_p = np.zeros(cands.shape[0], np.float32)
        out_len = np.zeros(cands.shape[0], np.int64)
        if cands.size:
            ngram_probs_any(self._tr, self._order, ctx, cands, out_p, out_len)
        return out_p, out_len

    def check(self, *, full: bool = True) -> None:
        """Walk every node (``full``: also the sibling order); FileFormatError naming the file."""
        status, node = check_compressed(self._tr, full)
        if status != C_OK:
            raise FileFormatError(self._path, f"corrupted compressed trie: {CHECK_MESSAGES[status].format(node=node)}; "
                                        f"compress it again (`python -m dart_jax.ngram compress`) or {REBUILD}.")

    def to_csr(self) -> Trie:
        """Decode into an in-memory CSR ``Trie`` (16 bytes per node), after checking every node (the
        decoder indexes the token table by the packed ranks, which a plain load does not check)."""
        self.check(full=True)
        token, freq, child_start = self._nodes(0, self._n)
        if self._n and (freq[1:].max(initial=0) > np.iinfo(np.int32).max):
            raise InputError("this trie's frequencies exceed int32, which the CSR format cannot hold.")
        return Trie(token, freq.astype(np.int32), child_start, self._order)

    def _nodes(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(token int32, freq int64, child_start int64) of nodes ``lo .. hi-1`` (``hi - lo + 1`` offsets)."""
        token = np.zeros(hi - lo, np.int32)
        freq = np.zeros(hi - lo, np.int64)
        child_start = np.zeros(hi - lo + 1, np.int64)
        _decode(self._tr, self._s["tok_table"], lo, hi, token, freq, child_start)
        return token, freq, child_start

    # -- files -------------------------------------------------------------------------------
    def to_reference(self, path, *, progress: bool = True, chunk_bytes: int = CHUNK_BYTES) -> str:
        """Write the trie as a reference ``.trie`` (docs/spec.md §6.1), which the PyTorch
        reference loads as it is; decoded a range of nodes at a time after a full check (the
        decoder indexes the token table by packed ranks). Atomic (a temporary name, renamed when
        complete); returns the absolute path. Counts beyond int32 are an InputError."""
        self.check(full=True)
        return write_reference(path, self._order, self._n, self._nodes, progress=progress, chunk_bytes=chunk_bytes)

    @classmethod
    def load(cls, path, *, verify: bool = False) -> "CompressedTrie":
        """Memory-map a compressed trie and check its header, section table and per-level tables:
        O(order + N / 128) work, milliseconds even for a billion nodes. ``verify`` also walks every
        node (children ranges, escape marks, ranks, frequencies, sibling order: ``check``), which
        takes about 30-40 ns per node. Unverified damage inside the packed node fields cannot read
        out of bounds (every query read is clamped); it can only make drafts worse, and the target
        checks every drafted token, so the generated text stays the same. FileFormatError naming
        the file."""
        path = os.fspath(path)
        order, n, vocab, sections = _read(path)
        trie = cls(order, n, vocab, sections)
        trie._path = path
        if verify:
            trie.check(full=True)
        return trie


# ------------------------------------------------------------------------------------ queries

@njit(cache=True, error_model="numpy")
def ngram_probs_any(tr, order, context, cands, out_p, out_len):
    """``ngram_probs`` (docs/spec.md §5.2) through the query interface of either format."""
    k = cands.shape[0]
    c = context.shape[0]
    n = trie_size(tr)
    if c == 0 or n == 0:
        return
    cand2 = cands.reshape((1, k))
    child = np.empty((1, k), np.int64)
    fr = np.empty((1, k), np.float32)
    scratch = np.empty(k, np.int64)
    for length in range(min(order - 1, c), 0, -1):
        node = trie_root_child(tr, n, context[c - length])
        for j in range(c - length + 1, c):
            if node < 0:
                break
            node = trie_find_child(tr, n, node, context[j])
        if node < 0 or trie_freq(tr, node) == 0:  # a count reduced to 0 is no evidence (docs/spec.md §5.2)
            continue
        inv = np.float32(1.0) / np.float32(trie_freq(tr, node))
        trie_children(tr, n, node, cand2, 0, child, fr, 0, scratch)
        for i in range(k):
            if child[0, i] >= 0 and out_len[i] == 0:
                out_p[i] = fr[0, i] * inv
                out_len[i] = length


@njit(cache=True)
def _decode(tr, tok_table, lo, hi, token, freq, child_start):
    """Nodes ``lo .. hi-1`` into ``token[:hi-lo]``, ``freq[:hi-lo]`` and ``child_start[:hi-lo+1]``."""
    level_start = tr[_LEVEL_START]
    tok_width, tok_bit, tok_count = tr[_TOK_WIDTH], tr[_TOK_BIT], tr[_TOK_COUNT]
    n = level_start[level_start.shape[0] - 1]
    base = 0
    for lvl in range(level_start.shape[0] - 1):
        for node in range(max(level_start[lvl], lo), min(level_start[lvl + 1], hi)):
            if lvl > 0:
                r = read_bits(tr[_TOK_WORDS], tok_bit[lvl] + (node - level_start[lvl]) * tok_width[lvl], tok_width[lvl])
                token[node - lo] = tok_table[base + r]
            freq[node - lo] = ct_freq(tr, node)
            child_start[node - lo] = kid_pair(tr[_KID_BLOCKS], tr[_KID_WORDS], node)[0]
        base += tok_count[lvl]
    if hi > lo:
        child_start[hi - lo] = n if hi == n else kid_pair(tr[_KID_BLOCKS], tr[_KID_WORDS], hi)[0]


# ------------------------------------------------------------------------------------ file

def _layout(sizes: list[int]) -> tuple[list[int], int]:
    off = _aligned(HEADER.size + SECTION.size * len(SECTIONS))
    offsets = []
    for nbytes in sizes:
        offsets.append(off)
        off = _aligned(off + nbytes)
    return offsets, off


def _read(path: str):
    if not os.path.exists(path):
        raise MissingFileError(f"No trie file at {path!r}; pass the path of a trie written by "
                               "`python -m dart_jax.ngram build`, `convert` or `compress`.")
    if not os.path.isfile(path):
        raise FileFormatError(path, "is a folder or a special file, not a trie file; pass the trie file itself.")
    size = os.path.getsize(path)
    table_end = HEADER.size + SECTION.size * len(SECTIONS)
    with open(path, "rb") as f:
        head = f.read(table_end)
    if head[:8] != MAGIC:
        raise FileFormatError(path, "not a compressed dart_jax trie (bad magic number); pass a file written by "
                                    "`python -m dart_jax.ngram compress`.")
    if len(head) < table_end:
        raise FileFormatError(path, f"truncated: {size} bytes, shorter than the {table_end}-byte header; "
                                    "copy or compress the trie again.")
    _, version, header_size, order, n, vocab, count, file_size = HEADER.unpack_from(head)
    bad = "corrupted header: {}; compress the trie again (`python -m dart_jax.ngram compress`)."
    if version != VERSION:
        raise FileFormatError(path, f"compressed trie format version {version}; this dart_jax reads version "
                                    f"{VERSION}. Compress the trie again with this version.")
    if header_size != HEADER.size or count != len(SECTIONS):
        raise FileFormatError(path, bad.format(f"header size {header_size} / {count} sections, expected "
                                               f"{HEADER.size} / {len(SECTIONS)}"))
    if not 1 <= order <= MAX_ORDER:
        raise FileFormatError(path, bad.format(f"order {order}, outside 1..{MAX_ORDER}"))
    if not 1 <= n <= size * 8 or not 1 <= vocab <= 1 << 31:
        raise FileFormatError(path, bad.format(f"{n} nodes / remap width {vocab} impossible for a {size}-byte file"))
    if size != file_size:
        raise FileFormatError(path, f"{size} bytes but its header says {file_size}: the file is "
                                    f"{'truncated' if size < file_size else 'followed by extra data'}; "
                                    "copy or compress it again.")
    fixed = {"level_start": order + 2, "tok_width": order + 1, "tok_bit": order + 1, "tok_count": order + 1,
             "cnt_width": order + 1, "cnt_bit": order + 1, "cnt_tab_start": order + 2,
             "remap": order * vocab if vocab <= DENSE_MAX else 0,
             "esc_width": order + 1, "esc_bit": order + 1, "esc_before": order + 2,
             "kid_blocks": 2 * (_kid_blocks(n) + 1)}
    sections = {}
    prev_end = table_end
    for i, (name, dtype) in enumerate(SECTIONS):
        off, nbytes = SECTION.unpack_from(head, HEADER.size + SECTION.size * i)
        item = np.dtype(dtype).itemsize
        if off % _ALIGN or off < prev_end or nbytes % item or off + nbytes > size:
            raise FileFormatError(path, bad.format(f"section {name} at {off} with {nbytes} bytes lies outside "
                                                   "the file or overlaps another"))
        if name in fixed and nbytes // item != fixed[name]:
            raise FileFormatError(path, bad.format(f"section {name} holds {nbytes // item} values, expected "
                                                   f"{fixed[name]} for order {order} and {n} nodes"))
        prev_end = off + nbytes
        sections[name] = np.asarray(np.memmap(path, dtype=dtype, mode="r", offset=off, shape=(nbytes // item,))) \
            if nbytes else _EMPTY[dtype]
    problem = _table_problem(order, n, vocab, sections)
    if problem:
        raise FileFormatError(path, bad.format(problem))
    return int(order), int(n), int(vocab), sections


def _table_problem(order, n, vocab, s) -> str | None:
    """What is wrong with the small per-level tables (O(order + N / 128)), or None."""
    ls = s["level_start"]
    if ls[0] != 0 or ls[1] != 1 or ls[-1] != n or np.any(np.diff(ls) < 0):
        return "level starts are not 0, 1, ... non-decreasing ..., node count"
    tw, cw, ew = s["tok_width"], s["cnt_width"], s["esc_width"]
    if any(np.any(x < 0) or np.any(x > 62) for x in (tw, cw, ew)):
        return "a field width outside 0..62 bits"
    sizes = np.diff(ls)
    tok_bit = np.concatenate([[0], np.cumsum(sizes * tw)])
    cnt_bit = np.concatenate([[0], np.cumsum(sizes * cw)])
    if not np.array_equal(tok_bit[:-1], s["tok_bit"]) or not np.array_equal(cnt_bit[:-1], s["cnt_bit"]):
        return "per-level bit offsets do not follow from the level sizes and widths"
    if len(s["tok_words"]) < _words(int(tok_bit[-1])) or len(s["cnt_words"]) < _words(int(cnt_bit[-1])):
        return "a packed section is shorter than its levels need"
    tc = s["tok_count"]
    if np.any(tc < 0) or tc.sum() != len(s["tok_table"]) or np.any(tc > (1 << tw.astype(np.int64))) or tc[0] != 1:
        return "per-level token table sizes do not match the token table or the widths"
    cts = s["cnt_tab_start"]
    if cts[0] != 0 or cts[-1] != len(s["cnt_table"]) or np.any(np.diff(cts) < 1):
        return "per-level frequency table offsets are not increasing from 0 to the table's size"
    if np.any(np.diff(cts) > (1 << np.where(ew > 0, ew, cw).astype(np.int64))):
        return "a frequency table larger than its rank width"
    eb = s["esc_before"]
    per_level = np.diff(eb)
    if eb[0] != 0 or np.any(per_level < 0) or np.any(per_level > sizes) or np.any((ew == 0) & (per_level > 0)):
        return "per-level escape counts are not non-decreasing from 0, or name a level without escapes"
    esc_bit = np.concatenate([[0], np.cumsum(per_level * ew)])
    if not np.array_equal(esc_bit[:-1], s["esc_bit"]) or len(s["esc_words"]) < (_words(int(esc_bit[-1])) if eb[-1] else 0):
        return "escape bit offsets or the escape section do not follow from the escape counts"
    marks, ranks = (_words(n), (n >> RANK_SHIFT) + 1) if eb[-1] else (0, 0)
    if len(s["esc_marks"]) != marks or len(s["esc_rank"]) != ranks:
        return f"escape marks / counts hold {len(s['esc_marks'])} / {len(s['esc_rank'])} values, expected {marks} / {ranks}"
    blocks = s["kid_blocks"]
    bits = blocks[1::2]
    span = np.diff(bits)
    if bits[0] != 0 or np.any(span < 0) or np.any(span % (KID_BLOCK - 1)) or np.any(span // (KID_BLOCK - 1) > 62) \
            or len(s["kid_words"]) < _words(int(bits[-1])):
        return "children offset blocks have bit offsets that are not a whole width apart or leave their section"
    return None


def compress(trie: Trie, path, *, chunk: int = _CHUNK, progress=None, escapes: bool | None = None) -> CompressedTrie:
    """Write ``trie`` (a CSR ``Trie``, typically memory-mapped by ``Trie.load``) as a compressed
    trie file at ``path`` and return it loaded. Works on ``chunk`` nodes at a time (memory
    bounded by the chunk, the per-level tables and the remap tables, not by the trie's size);
    written atomically. ``escapes``: store the frequency ranks in narrow fields with escapes
    (docs/spec.md §6.3) when that saves bytes (None), always (True) or never (False)."""
    path = check_output(path, "compressed trie output")
    trie.check(full=True)  # sorted siblings and sound offsets: what the encoding relies on
    token, freq, child_start = trie.arrays()
    order, n = int(trie.order), int(trie.num_nodes)
    chunk = max(chunk // KID_BLOCK, 1) * KID_BLOCK
    depth_sizes = trie.level_sizes()
    levels = order + 1
    depth_sizes = (list(depth_sizes) + [0] * levels)[:levels]
    ls = np.concatenate([[0], np.cumsum(depth_sizes)]).astype(np.int64)
    if ls[-1] != n:
        raise InputError(f"the trie's levels hold {ls[-1]} nodes, not {n}: check it (`ngram info --verify`).")
    # pass 1: the distinct tokens and frequencies of every level (with how often each frequency
    # occurs) and the width of every block of children offsets
    top = 0
    for a in range(1, n, chunk):
        top = max(top, int(token[a:min(a + chunk, n)].max()))
    vocab = top + 1
    dense = vocab <= DENSE_MAX
    remap = np.zeros((order, vocab if dense else 0), np.int32)
    tok_tables, cnt_tables, cnt_hists = [np.zeros(1, np.int32)], [], []
    for lvl in range(levels):
        lo, hi = int(ls[lvl]), int(ls[lvl + 1])
        counts, hist = np.zeros(0, np.int64), np.zeros(0, np.int64)
        present = np.zeros(0, np.int32)
        for a in range(lo, hi, chunk):
            b = min(a + chunk, hi)
            values, times = np.unique(np.asarray(freq[a:b], np.int64), return_counts=True)
            counts, where = np.unique(np.concatenate([counts, values]), return_inverse=True)
            hist = np.bincount(where, np.concatenate([hist, times]), minlength=counts.size).astype(np.int64)
            if lvl > 0 and dense:
                remap[lvl - 1, np.asarray(token[a:b])] = 1
            elif lvl > 0:
                present = np.union1d(present, np.asarray(token[a:b])).astype(np.int32)
        cnt_tables.append(counts if counts.size else np.zeros(1, np.int64))
        cnt_hists.append(hist if counts.size else np.zeros(1, np.int64))
        if lvl > 0:
            if dense:
                present = np.flatnonzero(remap[lvl - 1]).astype(np.int32)
                remap[lvl - 1, present] = np.arange(1, present.size + 1, dtype=np.int32)
            tok_tables.append(present)
    nb = _kid_blocks(n)
    kid_blocks = np.zeros(2 * (nb + 1), np.int64)
    for a in range(0, nb, chunk):
        b = min(a + chunk, nb)
        first = np.arange(a, b, dtype=np.int64) * KID_BLOCK
        base = np.asarray(child_start[first])
        kid_blocks[2 * a:2 * b:2] = base
        span = np.asarray(child_start[np.minimum(first + KID_BLOCK - 1, n)]) - base
        kid_blocks[2 * a + 3:2 * b + 2:2] = _bit_length(span) * (KID_BLOCK - 1)
    kid_blocks[-2] = n
    kid_blocks[1::2] = np.cumsum(kid_blocks[1::2])
    tok_count = np.array([t.size for t in tok_tables], np.int64)
    tok_width = np.array([0] + [_bits(c) for c in tok_count[1:]], np.int64)
    full_width = np.array([_bits(t.size) for t in cnt_tables], np.int64)
    layouts = [_count_layout(h, bool(escapes)) for h in cnt_hists]
    sizes = np.diff(ls)
    saved = sum(int(s) * int(f) - (int(s) * w + e * int(f)) for s, f, (w, e) in zip(sizes, full_width, layouts))
    if escapes is False or (escapes is None and saved <= n + (n >> 2) + 128):  # marks: 1 bit + 1/4 bit of counts
        layouts = [(int(f), 0) for f in full_width]
    cnt_width = np.array([w for w, _ in layouts], np.int64)
    n_esc = np.array([e for _, e in layouts], np.int64)
    esc_width = np.where(n_esc > 0, full_width, 0).astype(np.int64)
    esc_before = np.concatenate([[0], np.cumsum(n_esc)]).astype(np.int64)
    esc_bit_all = np.concatenate([[0], np.cumsum(n_esc * esc_width)]).astype(np.int64)
    tok_bit_all = np.concatenate([[0], np.cumsum(sizes * tok_width)]).astype(np.int64)
    cnt_bit_all = np.concatenate([[0], np.cumsum(sizes * cnt_width)]).astype(np.int64)
    cnt_tab_start = np.concatenate([[0], np.cumsum([t.size for t in cnt_tables])]).astype(np.int64)
    small = {
        "level_start": ls, "tok_width": tok_width, "tok_bit": tok_bit_all[:-1], "tok_count": tok_count,
        "cnt_width": cnt_width, "cnt_bit": cnt_bit_all[:-1], "cnt_tab_start": cnt_tab_start,
        "cnt_table": np.concatenate(cnt_tables), "esc_width": esc_width, "esc_bit": esc_bit_all[:-1],
        "esc_before": esc_before, "remap": remap.reshape(-1), "kid_blocks": kid_blocks,
        "tok_table": np.concatenate(tok_tables),
    }
    any_esc = bool(esc_before[-1])
    counts = {"kid_words": _words(int(kid_blocks[-1])), "tok_words": _words(int(tok_bit_all[-1])),
              "cnt_words": _words(int(cnt_bit_all[-1])), "esc_marks": _words(n) if any_esc else 0,
              "esc_rank": (n >> RANK_SHIFT) + 1 if any_esc else 0,
              "esc_words": _words(int(esc_bit_all[-1])) if any_esc else 0}
    nbytes = [(small[name].size if name in small else counts[name]) * np.dtype(dt).itemsize for name, dt in SECTIONS]
    offsets, file_size = _layout(nbytes)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, HEADER.size, order, n, vocab, len(SECTIONS), file_size))
            for off, nb_ in zip(offsets, nbytes):
                f.write(SECTION.pack(off, nb_))
            f.truncate(file_size)
        out = {}
        for (name, dt), off, nb_ in zip(SECTIONS, offsets, nbytes):
            out[name] = np.memmap(tmp, dtype=dt, mode="r+", offset=off, shape=(nb_ // np.dtype(dt).itemsize,)) \
                if nb_ else np.zeros(0, dt)
            if nb_ and name in small:
                out[name][:] = small[name]
        # pass 2: the packed per-node fields and the children offsets, chunk by chunk
        for a in range(0, n + 1, chunk):
            b = min(a + chunk, n + 1)
            pack_kids(np.asarray(child_start[a:b]), a, n, kid_blocks, out["kid_words"])
        ranks = np.empty(min(chunk, n), np.int64)
        for lvl in range(levels):
            lo, hi = int(ls[lvl]), int(ls[lvl + 1])
            e = 0
            for a in range(lo, hi, chunk):
                b = min(a + chunk, hi)
                r = ranks[:b - a]
                if lvl > 0 and tok_width[lvl]:
                    if dense:
                        remap_ranks(np.asarray(token[a:b]), remap[lvl - 1], r)
                    else:
                        r[:] = np.searchsorted(tok_tables[lvl], np.asarray(token[a:b]))
                    pack_bits(r, tok_width[lvl], out["tok_words"], tok_bit_all[lvl] + (a - lo) * tok_width[lvl])
                r[:] = np.searchsorted(cnt_tables[lvl], np.asarray(freq[a:b], np.int64))
                e = pack_counts(r, a, int(cnt_width[lvl]), (1 << int(cnt_width[lvl])) - 1, out["cnt_words"],
                                int(cnt_bit_all[lvl] + (a - lo) * cnt_width[lvl]), out["esc_marks"],
                                out["esc_words"], int(esc_bit_all[lvl]), int(esc_width[lvl]), e)
                if progress:
                    progress(b - a)
            if e != n_esc[lvl]:
                raise AssertionError(f"level {lvl}: {e} escapes written, {n_esc[lvl]} counted")
        if any_esc:
            fill_mark_ranks(out["esc_marks"], out["esc_rank"])
        for m in out.values():
            if isinstance(m, np.memmap):
                m.flush()
        del out
    return CompressedTrie.load(path)


def load_any(path, *, verify: bool = False):
    """A ``Trie`` or a ``CompressedTrie``, whichever format the file's magic number names."""
    path = os.fspath(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(8)
        if magic == MAGIC:
            return CompressedTrie.load(path, verify=verify)
    return Trie.load(path, verify=verify)


def check_trie_vocab(trie, vocab_size: int, where) -> None:
    """An InputError naming the trie `where` when it holds a token id outside a model's vocabulary
    of `vocab_size` ids: a trie built with another tokenizer, whose n-grams would draft nonsense.
    (A trie records no vocabulary size; its largest id is what can be checked.)"""
    top = trie.max_token()
    if top >= vocab_size:
        raise InputError(f"the n-gram trie {where} holds token id {top}, outside the model's vocabulary of "
                         f"{vocab_size} ids: it was built with another tokenizer. Pass the trie made for this model, "
                         "or build one with its tokenizer (python -m dart_jax.ngram build ... --tokenizer BASE).")


def trie_format(path) -> str | None:
    """Which of dart_jax's trie formats the file at `path` is, by its magic number: "trie" (the CSR
    file of `Trie.save`), "compressed" (`CompressedTrie.save`), or None (anything else, such as a
    reference .trie, which `Trie.from_reference` converts). `load_any` loads either of ours."""
    with open(path, "rb") as f:
        magic = f.read(8)
    return {MAGIC: "compressed", TRIE_MAGIC: "trie"}.get(magic)


def is_compressed(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == MAGIC

