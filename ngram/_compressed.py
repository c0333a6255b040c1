"""The compressed trie format (docs/spec.md §6.3): same nodes, numbering and answers as the CSR
format, in about a quarter of the bytes.

Nodes keep the CSR numbering (breadth-first, children sorted by token), so node ids,
frequencies and every probability are the CSR trie's. Per node the file holds
  * its children offsets as one Elias–Fano sequence: ``child_start`` (N+1 non-decreasing values
    in 0..N) as a bit vector with a one at ``child_start[i] + i`` for every i (the low part of the
    code has 0 bits since the universe is not larger than the count), plus the position of every
    128th one so that ``select`` scans a few words;
  * its token as a rank into its level's sorted table of distinct tokens, in ``ceil(log2)`` of
    that table's size bits (a per-level dense table token -> rank + 1 maps a query token to the
    rank at once, 0 = the token never occurs at that level);
  * its freq as a rank into its level's sorted table of distinct frequencies (exact int64 counts).

The query functions below take the trie as the tuple ``CompressedTrie.search_arrays()`` returns and
clamp every index they read to its array, so a damaged file gives wrong answers at worst, never an
out-of-bounds read; ``check_compressed`` (every load) finds the damage first.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

SAMPLE_SHIFT = 7  # select samples: the position of every 128th one (half a bit per node)

# indices of the tuple (see CompressedTrie.search_arrays)
_META, _LEVEL_START, _TOK_WIDTH, _TOK_BIT, _TOK_COUNT, _CNT_WIDTH, _CNT_BIT, _CNT_TAB_START, _CNT_TABLE, _REMAP, \
    _EF, _SAMPLES, _TOK_WORDS, _CNT_WORDS, _TOK_TABLE, _TOK_TAB_START = range(16)
# meta: [N, V (largest token + 1), order]
DENSE_MAX = 1 << 24  # largest V for which the file holds the dense token -> rank tables (4 bytes per id and level)


@njit(cache=True, inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True, inline="always")
def _word(words, w):
    """words[w], or 0 outside the array (a bounds-checked read)."""
    if w < 0 or w >= words.shape[0]:
        return np.uint64(0)
    return words[w]


@njit(cache=True, inline="always")
def read_bits(words, bit, width):
    """The ``width``-bit value (width <= 63) at bit offset ``bit`` of a packed array."""
    if width == 0:
        return np.int64(0)
    w = bit >> 6
    s = bit & 63
    v = _word(words, w) >> np.uint64(s)
    if s + width > 64:
        v |= _word(words, w + 1) << np.uint64(64 - s)
    return np.int64(v & ((np.uint64(1) << np.uint64(width)) - np.uint64(1)))


@njit(cache=True, inline="always")
def _read_bits_in(words, bit, width):
    """``read_bits`` without the bounds checks, for bits that ``_fits`` has vouched for."""
    w = bit >> 6
    s = bit & 63
    v = words[w] >> np.uint64(s)
    if s + width > 64:
        v |= words[w + 1] << np.uint64(64 - s)
    return np.int64(v & ((np.uint64(1) << np.uint64(width)) - np.uint64(1)))


@njit(cache=True, inline="always")
def _read(words, bit, width, checked):
    """``read_bits`` where ``checked`` (a range ``_fits`` did not vouch for: a damaged file), else
    the unchecked read."""
    if checked:
        return read_bits(words, bit, width)
    return _read_bits_in(words, bit, width)


@njit(cache=True, inline="always")
def _fits(words, first_bit, last_bit):
    """Whether every value of a field between these bit offsets (the first bit of the first value,
    the first bit of the last one) can be read without leaving ``words`` (a value of <= 63 bits may
    reach into the next word)."""
    return first_bit >= 0 and last_bit >= first_bit and (last_bit >> 6) + 1 < words.shape[0]


@njit(cache=True, inline="always")
def _select_in_word(bits, r):
    """Position of the r-th (from 0) set bit of ``bits``, which has more than r set bits: the
    byte holding it from the bytes' running popcounts, then at most 7 bits cleared in that byte."""
    x = bits - ((bits >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    running = x * np.uint64(0x0101010101010101)  # byte j: set bits in bytes 0..j
    shift = 0
    before = np.int64(0)
    while shift < 56:
        upto = np.int64((running >> np.uint64(shift)) & np.uint64(0xFF))
        if upto > r:
            break
        before = upto
        shift += 8
    byte = (bits >> np.uint64(shift)) & np.uint64(0xFF)
    for _ in range(r - before):
        byte &= byte - np.uint64(1)
    return shift + np.int64(trailing_zeros(byte))


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_select_pair(ef, samples, i):
    """(child_start[i], child_start[i+1]) from the Elias–Fano bit vector: the i-th and (i+1)-th
    ones' positions minus their index. Reads are clamped; a damaged vector gives -1, -1."""
    s = i >> SAMPLE_SHIFT
    if s < 0 or s >= samples.shape[0]:
        return np.int64(-1), np.int64(-1)
    p = samples[s]
    r = i - (s << SAMPLE_SHIFT)  # ones still to skip after the sampled one
    w = p >> 6
    if w < 0 or w >= ef.shape[0]:
        return np.int64(-1), np.int64(-1)
    bits = ef[w] & (~np.uint64(0) << np.uint64(p & 63))
    c = _popcount(bits)
    while c <= r:
        r -= c
        w += 1
        if w >= ef.shape[0]:
            return np.int64(-1), np.int64(-1)
        bits = ef[w]
        c = _popcount(bits)
    at = _select_in_word(bits, r)  # r < popcount(bits) <= 64
    first = (w << 6) + at
    bits &= ~np.uint64(0) << np.uint64(at) << np.uint64(1)  # the ones after it (a shift by 64 in two steps)
    while bits == 0:
        w += 1
        if w >= ef.shape[0]:
            return np.int64(-1), np.int64(-1)
        bits = ef[w]
    second = (w << 6) + np.int64(trailing_zeros(bits))
    return first - i, second - i - 1


@njit(cache=True, inline="always")
def ef_size(tr):
    return tr[_META][0] if tr[_META].shape[0] > 0 else np.int64(0)


@njit(cache=True, inline="always")
def node_level(level_start, node):
    """Level (depth) of ``node``: the last L with level_start[L] <= node."""
    lo = 0
    hi = level_start.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if level_start[mid] <= node:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always")
def _freq_at(level_start, cnt_width, cnt_bit, cnt_tab_start, cnt_table, cnt_words, lvl, node):
    """freq of ``node`` of level ``lvl``: its rank read from the packed field, looked up in the
    level's table (clamped to the level's part of the table)."""
    w = cnt_width[lvl]
    rank = read_bits(cnt_words, cnt_bit[lvl] + (node - level_start[lvl]) * w, w)
    idx = min(cnt_tab_start[lvl] + rank, cnt_tab_start[lvl + 1] - 1)
    if idx < 0 or idx >= cnt_table.shape[0]:
        return np.int64(0)
    return cnt_table[idx]


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_freq(tr, node):
    level_start = tr[_LEVEL_START]
    lvl = node_level(level_start, node)
    if lvl + 1 >= tr[_CNT_TAB_START].shape[0] or lvl >= tr[_CNT_WIDTH].shape[0]:
        return np.int64(0)
    return _freq_at(level_start, tr[_CNT_WIDTH], tr[_CNT_BIT], tr[_CNT_TAB_START], tr[_CNT_TABLE], tr[_CNT_WORDS],
                    lvl, node)


@njit(cache=True, inline="always")
def _children(ef, samples, level_start, tok_width, n, node):
    """(first child, number of children, level of the children) of ``node``, clamped to that level."""
    if node < 0 or node >= n:
        return np.int64(0), np.int64(0), np.int64(0)
    lo, hi = ef_select_pair(ef, samples, node)
    lvl = node_level(level_start, node) + 1
    if lvl + 1 >= level_start.shape[0] or lvl >= tok_width.shape[0]:
        return np.int64(0), np.int64(0), np.int64(0)
    lo = max(lo, level_start[lvl])
    hi = min(hi, level_start[lvl + 1], n)
    return lo, hi - lo, lvl


@njit(cache=True, inline="always")
def _rank_of(remap, tok_table, tok_tab_start, lvl, tok):
    """Rank of ``tok`` among the level's distinct tokens, or -1 when it never occurs there."""
    if remap.shape[1] > 0:
        if tok < 0 or tok >= remap.shape[1] or lvl < 1 or lvl > remap.shape[0]:
            return np.int64(-1)
        return np.int64(remap[lvl - 1, tok]) - 1
    # no dense tables (ids up to 2**31): binary search in the level's sorted token table
    if lvl < 0 or lvl + 1 >= tok_tab_start.shape[0]:
        return np.int64(-1)
    lo = max(tok_tab_start[lvl], 0)
    hi = min(tok_tab_start[lvl + 1], tok_table.shape[0])
    if hi <= lo:
        return np.int64(-1)
    size = hi - lo
    while size > 1:
        half = size >> 1
        if tok_table[lo + half] <= tok:
            lo += half
        size -= half
    return lo - tok_tab_start[lvl] if tok_table[lo] == tok else np.int64(-1)


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_root_child(tr, n, tok):
    """The root's children are the whole first level, sorted by token: child = 1 + rank."""
    level_start = tr[_LEVEL_START]
    if level_start.shape[0] < 3:
        return np.int64(-1)
    rank = _rank_of(tr[_REMAP], tr[_TOK_TABLE], tr[_TOK_TAB_START], 1, tok)
    if rank < 0 or 1 + rank >= min(level_start[2], n):
        return np.int64(-1)
    return 1 + rank


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_find_child(tr, n, node, tok):
    level_start = tr[_LEVEL_START]
    tok_width = tr[_TOK_WIDTH]
    lo, size, lvl = _children(tr[_EF], tr[_SAMPLES], level_start, tok_width, n, node)
    if size <= 0:
        return np.int64(-1)
    rank = _rank_of(tr[_REMAP], tr[_TOK_TABLE], tr[_TOK_TAB_START], lvl, tok)
    if rank < 0:
        return np.int64(-1)
    words = tr[_TOK_WORDS]
    width = tok_width[lvl]
    base = tr[_TOK_BIT][lvl] - level_start[lvl] * width
    checked = width == 0 or not _fits(words, base + lo * width, base + (lo + size - 1) * width)
    while size > 1:
        half = size >> 1
        if _read(words, base + (lo + half) * width, width, checked) <= rank:
            lo += half
        size -= half
    return lo if _read(words, base + lo * width, width, checked) == rank else np.int64(-1)


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_keys(tr, level, cands, row, out):
    """``out[i]`` = the rank of ``cands[row, i]`` among the tokens of ``level`` (-1: absent), the key
    ``ef_children_keyed`` searches for under any node whose children are at that level."""
    for i in range(cands.shape[1]):
        out[i] = _rank_of(tr[_REMAP], tr[_TOK_TABLE], tr[_TOK_TAB_START], level, cands[row, i])


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_children(tr, n, node, cands, row, out_child, out_freq, slot, ranks):
    """``trie_children`` (see _access.py) on the compressed format: the same lockstep binary
    searches as the CSR kernel, over the packed ranks (``ranks``: scratch of k int64)."""
    lo, size, lvl = _children(tr[_EF], tr[_SAMPLES], tr[_LEVEL_START], tr[_TOK_WIDTH], n, node)
    if size > 0:
        ef_keys(tr, lvl, cands, row, ranks)
    _search_children(tr, lo, size, lvl, ranks, out_child, out_freq, slot)


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ef_children_keyed(tr, n, node, ranks, out_child, out_freq, slot):
    """``ef_children`` with the candidates' ranks at the children's level given (``ef_keys``)."""
    lo, size, lvl = _children(tr[_EF], tr[_SAMPLES], tr[_LEVEL_START], tr[_TOK_WIDTH], n, node)
    _search_children(tr, lo, size, lvl, ranks, out_child, out_freq, slot)


@njit(cache=True, inline="always")
def _search_children(tr, lo, size, lvl, ranks, out_child, out_freq, slot):
    """The children [lo, lo + size) of level ``lvl`` whose ranks are ``ranks`` (lockstep binary
    searches over the packed ranks), with their frequencies."""
    k = ranks.shape[0]
    if size <= 0:
        for i in range(k):
            out_child[slot, i] = -1
        return
    level_start = tr[_LEVEL_START]
    words = tr[_TOK_WORDS]
    width = tr[_TOK_WIDTH][lvl]
    base = tr[_TOK_BIT][lvl] - level_start[lvl] * width
    for i in range(k):
        out_child[slot, i] = lo
    checked = width == 0 or not _fits(words, base + lo * width, base + (lo + size - 1) * width)
    while size > 1:
        half = size >> 1
        for i in range(k):
            b = out_child[slot, i]
            out_child[slot, i] = b + half * (_read(words, base + (b + half) * width, width, checked) <= ranks[i])
        size -= half
    cnt_width, cnt_bit, cnt_tab_start = tr[_CNT_WIDTH], tr[_CNT_BIT], tr[_CNT_TAB_START]
    cnt_table, cnt_words = tr[_CNT_TABLE], tr[_CNT_WORDS]
    for i in range(k):
        ch = out_child[slot, i]
        if ranks[i] < 0 or read_bits(words, base + ch * width, width) != ranks[i]:
            out_child[slot, i] = -1
        else:
            out_freq[slot, i] = np.float32(_freq_at(level_start, cnt_width, cnt_bit, cnt_tab_start, cnt_table,
                                                    cnt_words, lvl, ch))


# ------------------------------------------------------------------------------- encoding


@njit(cache=True)
def pack_bits(values, width, words, bit0):
    """OR ``values`` (non-negative, < 2**width) into ``words`` from bit ``bit0`` on, ``width`` bits each."""
    if width == 0:
        return
    for i in range(values.shape[0]):
        v = np.uint64(values[i])
        bit = bit0 + i * width
        w = bit >> 6
        s = bit & 63
        words[w] |= v << np.uint64(s)
        if s + width > 64:
            words[w + 1] |= v >> np.uint64(64 - s)


@njit(cache=True)
def pack_ef(child_start, first, words):
    """Set the bit child_start[i] + i for i = first .. first + len - 1."""
    for t in range(child_start.shape[0]):
        pos = child_start[t] + first + t
        words[pos >> 6] |= np.uint64(1) << np.uint64(pos & 63)


@njit(cache=True)
def remap_ranks(token, remap_row, out):
    for i in range(token.shape[0]):
        out[i] = remap_row[token[i]] - 1


# ------------------------------------------------------------------------------- checks

C_OK, C_OFFSETS, C_TOKEN, C_COUNT, C_NEG, C_SUM, C_ORDER = 0, 1, 2, 3, 4, 5, 6
CHECK_MESSAGES = {
    C_OFFSETS: "the children offsets of node {node} are not the contiguous, non-decreasing ranges of the next level",
    C_TOKEN: "node {node} has a token rank outside its level's table",
    C_COUNT: "node {node} has a frequency rank outside its level's table",
    C_NEG: "node {node} has a negative frequency",
    C_SUM: "the children of node {node} count more windows than the node",
    C_ORDER: "the children of node {node} are not in strictly increasing token order",
}


@njit(cache=True)
def check_compressed(tr, full):
    """(status, node): one pass over every node: children ranges (decoded from the Elias–Fano
    vector) tile each next level in order, token and frequency ranks lie inside their tables,
    frequencies are >= 0 (but the root's) and children count no more than their parent; with
    ``full`` also strictly increasing sibling tokens."""
    n = ef_size(tr)
    level_start = tr[_LEVEL_START]
    levels = level_start.shape[0] - 1
    expect = np.int64(1)
    for lvl in range(levels):
        width = tr[_TOK_WIDTH][lvl]
        cwidth = tr[_CNT_WIDTH][lvl]
        n_counts = tr[_CNT_TAB_START][lvl + 1] - tr[_CNT_TAB_START][lvl]
        n_tokens = tr[_TOK_COUNT][lvl]
        for node in range(level_start[lvl], level_start[lvl + 1]):
            lo, hi = ef_select_pair(tr[_EF], tr[_SAMPLES], node)
            next_end = level_start[lvl + 2] if lvl + 2 < level_start.shape[0] else n
            if lo != expect or hi < lo or hi > next_end or (hi > lo and lo < level_start[lvl + 1]):
                return C_OFFSETS, node
            expect = hi
            rank = read_bits(tr[_CNT_WORDS], tr[_CNT_BIT][lvl] + (node - level_start[lvl]) * cwidth, cwidth)
            if rank >= n_counts:
                return C_COUNT, node
            if lvl > 0:
                trank = read_bits(tr[_TOK_WORDS], tr[_TOK_BIT][lvl] + (node - level_start[lvl]) * width, width)
                if trank >= n_tokens:
                    return C_TOKEN, node
            f = ef_freq(tr, node)
            if node > 0 and f < 0:
                return C_NEG, node
            if node > 0 and hi > lo:
                total = np.int64(0)
                for c in range(lo, hi):
                    total += ef_freq(tr, c)
                if total > f:
                    return C_SUM, node
            if full and hi - lo > 1:
                cw = tr[_TOK_WIDTH][lvl + 1]
                base = tr[_TOK_BIT][lvl + 1] - level_start[lvl + 1] * cw
                prev = read_bits(tr[_TOK_WORDS], base + lo * cw, cw)
                for c in range(lo + 1, hi):
                    cur = read_bits(tr[_TOK_WORDS], base + c * cw, cw)
                    if cur <= prev:
                        return C_ORDER, node
                    prev = cur
        if expect != (level_start[lvl + 2] if lvl + 2 < level_start.shape[0] else n):
            return C_OFFSETS, level_start[lvl + 1] - 1
    return C_OK, -1
