"""The compressed trie format (docs/spec.md §6.3): same nodes, numbering and answers as the CSR
format, in about a fifth of the bytes.

Nodes keep the CSR numbering (breadth-first, children sorted by token), so node ids,
frequencies and every probability are the CSR trie's. Per node the file holds
  * its children offset: ``child_start`` in blocks of 128 values, each block a base (and the bit
    offset of its fields) in ``kid_blocks`` and 127 differences from the base in the bit length
    of the block's largest one (0 bits for a block of leaves);
  * its token as a rank into its level's sorted table of distinct tokens, in ``ceil(log2)`` of
    that table's size bits (a per-level dense table token -> rank + 1 maps a query token to the
    rank at once, 0 = the token never occurs at that level);
  * its freq as a rank into its level's sorted table of distinct frequencies (exact int64
    counts), in a narrow field whose all-ones value escapes to a full-width rank stored aside
    (numbered by a bit vector of escape marks with sampled counts) on levels where that saves bytes.

The query functions below take the trie as the tuple ``CompressedTrie.search_arrays()`` returns and
clamp every index they read to its array, so a damaged file gives wrong answers at worst, never an
out-of-bounds read. A plain load checks the header and the per-level tables only; the per-node
fields are checked by ``check_compressed`` (``verify=True``, ``check()``, ``to_csr()``).
"""
from __future__ import annotations

import numpy as np
from numba import njit

KID_SHIFT = 7  # children offsets: blocks of 128 values, each a base and fixed-width differences
KID_BLOCK = 1 << KID_SHIFT
RANK_SHIFT = 8  # escape marks: the number of marks before every 256th node

# indices of the tuple (see CompressedTrie.search_arrays)
_META, _LEVEL_START, _TOK_WIDTH, _TOK_BIT, _TOK_COUNT, _CNT_WIDTH, _CNT_BIT, _CNT_TAB_START, _CNT_TABLE, \
    _ESC_WIDTH, _ESC_BIT, _ESC_BEFORE, _REMAP, _KID_BLOCKS, _KID_WORDS, _TOK_WORDS, _CNT_WORDS, _ESC_MARKS, \
    _ESC_RANK, _ESC_WORDS, _TOK_TABLE, _TOK_TAB_START = range(22)
# meta: [N, V (largest token + 1), order]
# The small readers below are plain calls, not Numba-inlined (`inline="always"`): inlining copies
# their typed IR into every caller, which made the tree search's first compilation about a quarter
# longer, while LLVM inlines such calls on its own and the search ran as fast either way.
DENSE_MAX = 1 << 24  # largest V for which the file holds the dense token -> rank tables (4 bytes per id and level)


@njit(cache=True)
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True)
def _word(words, w):
    """words[w], or 0 outside the array (a bounds-checked read)."""
    if w < 0 or w >= words.shape[0]:
        return np.uint64(0)
    return words[w]


@njit(cache=True)
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


@njit(cache=True)
def _read_bits_in(words, bit, width):
    """``read_bits`` without the bounds checks, for bits that ``_fits`` has vouched for."""
    w = bit >> 6
    s = np.uint64(bit & 63)
    # branchless: the next word's bits shifted in by 64 - s in two steps (0 when s = 0)
    v = (words[w] >> s) | ((words[w + 1] << np.uint64(1)) << (np.uint64(63) - s))
    return np.int64(v & ((np.uint64(1) << np.uint64(width)) - np.uint64(1)))


@njit(cache=True)
def _read(words, bit, width, checked):
    """``read_bits`` where ``checked`` (a range ``_fits`` did not vouch for: a damaged file), else
    the unchecked read."""
    if checked:
        return read_bits(words, bit, width)
    return _read_bits_in(words, bit, width)


@njit(cache=True)
def _fits(words, first_bit, last_bit):
    """Whether every value of a field between these bit offsets (the first bit of the first value,
    the first bit of the last one) can be read without leaving ``words`` (a value of <= 63 bits may
    reach into the next word)."""
    return first_bit >= 0 and last_bit >= first_bit and (last_bit >> 6) + 1 < words.shape[0]


@njit(cache=True)
def kid_value(blocks, words, i):
    """child_start[i]: its block's base plus its packed difference (0 for a block's first value),
    or -1 when a read would leave the arrays (a damaged file)."""
    b = i >> KID_SHIFT
    if i < 0 or 2 * b + 3 >= blocks.shape[0]:
        return np.int64(-1)
    j = i & (KID_BLOCK - 1)
    base = blocks[2 * b]
    if j == 0:
        return base
    bit0 = blocks[2 * b + 1]
    width = (blocks[2 * b + 3] - bit0) // (KID_BLOCK - 1)
    bit = bit0 + (j - 1) * width
    if width < 0 or width > 62 or bit < 0 or (bit >> 6) + 1 >= words.shape[0]:
        return np.int64(-1)
    return base + _read_bits_in(words, bit, width)


@njit(cache=True)
def kid_pair(blocks, words, i):
    """(child_start[i], child_start[i + 1]); -1 where damaged."""
    return kid_value(blocks, words, i), kid_value(blocks, words, i + 1)


@njit(cache=True)
def mark_rank(marks, mark_rank_tab, i):
    """Number of escape marks on nodes 0 .. i-1: the sampled count before node i's 256-node
    block plus the popcounts of at most four words; -1 when a read would leave the arrays."""
    k = i >> RANK_SHIFT
    last = i >> 6
    if i < 0 or k >= mark_rank_tab.shape[0] or last >= marks.shape[0]:
        return np.int64(-1)
    r = mark_rank_tab[k]
    for w in range(k << (RANK_SHIFT - 6), last):
        r += _popcount(marks[w])
    rem = i & 63
    if rem:
        r += _popcount(marks[last] & ((np.uint64(1) << np.uint64(rem)) - np.uint64(1)))
    return r


@njit(cache=True)
def ct_size(tr):
    return tr[_META][0] if tr[_META].shape[0] > 0 else np.int64(0)


@njit(cache=True)
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


@njit(cache=True)
def count_rank(tr, lvl, node):
    """The rank of ``node``'s frequency in its level's table: the packed narrow field, or, where that
    holds the level's escape value (all ones), the full-width rank stored for the node's escape
    (numbered by the marks before it). -1 when a read would leave the arrays."""
    w = tr[_CNT_WIDTH][lvl]
    words = tr[_CNT_WORDS]
    bit = tr[_CNT_BIT][lvl] + (node - tr[_LEVEL_START][lvl]) * w
    if bit < 0 or (bit >> 6) + 1 >= words.shape[0]:
        return np.int64(-1)
    rank = _read_bits_in(words, bit, w)
    wide = tr[_ESC_WIDTH][lvl]
    if wide > 0 and rank == (np.int64(1) << w) - 1:
        e = mark_rank(tr[_ESC_MARKS], tr[_ESC_RANK], node) - tr[_ESC_BEFORE][lvl]
        ewords = tr[_ESC_WORDS]
        bit = tr[_ESC_BIT][lvl] + e * wide
        if e < 0 or bit < 0 or (bit >> 6) + 1 >= ewords.shape[0]:
            return np.int64(-1)
        rank = _read_bits_in(ewords, bit, wide)
    return rank


@njit(cache=True)
def _freq_at(tr, lvl, node):
    """freq of ``node`` of level ``lvl`` (its rank looked up in the level's table, clamped to the
    level's part of the table; 0 where damaged)."""
    cnt_tab_start, cnt_table = tr[_CNT_TAB_START], tr[_CNT_TABLE]
    rank = count_rank(tr, lvl, node)
    if rank < 0:
        return np.int64(0)
    idx = min(cnt_tab_start[lvl] + rank, cnt_tab_start[lvl + 1] - 1)
    if idx < 0 or idx >= cnt_table.shape[0]:
        return np.int64(0)
    return cnt_table[idx]


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ct_freq_at(tr, lvl, node):
    """freq of ``node``, known to be at depth ``lvl``."""
    if lvl < 0 or lvl + 1 >= tr[_CNT_TAB_START].shape[0] or lvl >= tr[_CNT_WIDTH].shape[0] \
            or lvl >= tr[_ESC_WIDTH].shape[0] or lvl >= tr[_LEVEL_START].shape[0]:
        return np.int64(0)
    return _freq_at(tr, lvl, node)


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ct_freq(tr, node):
    level_start = tr[_LEVEL_START]
    lvl = node_level(level_start, node)
    if lvl + 1 >= tr[_CNT_TAB_START].shape[0] or lvl >= tr[_CNT_WIDTH].shape[0] or lvl >= tr[_ESC_WIDTH].shape[0]:
        return np.int64(0)
    return _freq_at(tr, lvl, node)


@njit(cache=True)
def _children_at(tr, n, node, lvl):
    """(first child, number of children) of ``node`` whose children are at depth ``lvl``, clamped
    to that level."""
    level_start = tr[_LEVEL_START]
    if node < 0 or node >= n or lvl < 1 or lvl + 1 >= level_start.shape[0] or lvl >= tr[_TOK_WIDTH].shape[0] \
            or lvl >= tr[_CNT_WIDTH].shape[0] or lvl >= tr[_ESC_WIDTH].shape[0] or lvl + 1 >= tr[_CNT_TAB_START].shape[0]:
        return np.int64(0), np.int64(0)
    lo, hi = kid_pair(tr[_KID_BLOCKS], tr[_KID_WORDS], node)
    # clamped into the level before the subtraction, which then cannot overflow whatever damaged
    # block bases gave (the load does not check them; only verify does)
    lo = min(max(lo, level_start[lvl]), level_start[lvl + 1])
    hi = max(min(hi, level_start[lvl + 1], n), lo)
    return lo, hi - lo


@njit(cache=True)
def _children(tr, n, node):
    """(first child, number of children, level of the children) of ``node``, clamped to that level."""
    if node < 0 or node >= n:
        return np.int64(0), np.int64(0), np.int64(0)
    lvl = node_level(tr[_LEVEL_START], node) + 1
    lo, size = _children_at(tr, n, node, lvl)
    return lo, size, lvl


@njit(cache=True)
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
def ct_root_child(tr, n, tok):
    """The root's children are the whole first level, sorted by token: child = 1 + rank."""
    level_start = tr[_LEVEL_START]
    if level_start.shape[0] < 3:
        return np.int64(-1)
    rank = _rank_of(tr[_REMAP], tr[_TOK_TABLE], tr[_TOK_TAB_START], 1, tok)
    if rank < 0 or 1 + rank >= min(level_start[2], n):
        return np.int64(-1)
    return 1 + rank


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ct_find_child(tr, n, node, tok):
    level_start = tr[_LEVEL_START]
    tok_width = tr[_TOK_WIDTH]
    lo, size, lvl = _children(tr, n, node)
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
def ct_keys(tr, level, cands, row, out):
    """``out[i]`` = the rank of ``cands[row, i]`` among the tokens of ``level`` (-1: absent), the key
    ``ct_children_keyed`` searches for under any node whose children are at that level."""
    for i in range(cands.shape[1]):
        out[i] = _rank_of(tr[_REMAP], tr[_TOK_TABLE], tr[_TOK_TAB_START], level, cands[row, i])


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ct_children(tr, n, node, cands, row, out_child, out_freq, slot, ranks):
    """``trie_children`` (see _access.py) on the compressed format: the same lockstep binary
    searches as the CSR kernel, over the packed ranks (``ranks``: scratch of k int64)."""
    lo, size, lvl = _children(tr, n, node)
    keys = ranks[:cands.shape[1]]  # the scratch may be longer than k
    if size > 0:
        ct_keys(tr, lvl, cands, row, keys)
    _search_children(tr, lo, size, lvl, keys, out_child, out_freq, slot)


@njit(cache=True, _nrt=False)  # no reference counting: called per lookup
def ct_children_keyed(tr, n, node, lvl, ranks, out_child, out_freq, slot):
    """``ct_children`` for a node whose children are at depth ``lvl``, with the candidates' ranks at
    that level given (``ct_keys``)."""
    lo, size = _children_at(tr, n, node, lvl)
    _search_children(tr, lo, size, lvl, ranks, out_child, out_freq, slot)


@njit(cache=True)
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
    for i in range(k):
        ch = out_child[slot, i]
        if ranks[i] < 0 or _read(words, base + ch * width, width, checked) != ranks[i]:
            out_child[slot, i] = -1
        else:
            out_freq[slot, i] = np.float32(_freq_at(tr, lvl, ch))


# ------------------------------------------------------------------------------- encoding


@njit(cache=True)
def _put_bits(words, bit, width, value):
    """OR the ``width``-bit ``value`` into ``words`` at bit offset ``bit``."""
    v = np.uint64(value)
    w = bit >> 6
    s = bit & 63
    words[w] |= v << np.uint64(s)
    if s + width > 64:
        words[w + 1] |= v >> np.uint64(64 - s)


@njit(cache=True)
def pack_bits(values, width, words, bit0):
    """OR ``values`` (non-negative, < 2**width) into ``words`` from bit ``bit0`` on, ``width`` bits each."""
    if width == 0:
        return
    for i in range(values.shape[0]):
        _put_bits(words, bit0 + i * width, width, values[i])


@njit(cache=True)
def pack_kids(child_start, first, n, blocks, words):
    """Pack the differences child_start[i] - (its block's base) for i = first .. first + len - 1
    (``first`` a multiple of the block size; a block's first value is its base, not packed)."""
    for t in range(child_start.shape[0]):
        i = first + t
        j = i & (KID_BLOCK - 1)
        if j == 0 or i > n:
            continue
        b = i >> KID_SHIFT
        width = (blocks[2 * b + 3] - blocks[2 * b + 1]) // (KID_BLOCK - 1)
        if width == 0:
            continue
        _put_bits(words, blocks[2 * b + 1] + (j - 1) * width, width, child_start[t] - blocks[2 * b])


@njit(cache=True)
def pack_counts(ranks, first, width, marker, words, bit0, marks, ewords, ebit0, wide, e0):
    """Narrow fields of ``width`` bits for nodes first.. (ranks >= ``marker`` stored as the marker
    and, when ``wide`` > 0, marked and written in full at the next escape slot). Returns the
    number of escapes written (from slot ``e0`` on)."""
    e = e0
    for t in range(ranks.shape[0]):
        r = ranks[t]
        if wide > 0 and r >= marker:
            node = first + t
            marks[node >> 6] |= np.uint64(1) << np.uint64(node & 63)
            _put_bits(ewords, ebit0 + e * wide, wide, r)
            e += 1
            r = marker
        if width > 0:
            _put_bits(words, bit0 + t * width, width, r)
    return e


@njit(cache=True)
def fill_mark_ranks(marks, out):
    """out[k] = marks on nodes before node 256·k."""
    r = np.int64(0)
    per = 1 << (RANK_SHIFT - 6)
    for k in range(out.shape[0]):
        out[k] = r
        for w in range(k * per, min((k + 1) * per, marks.shape[0])):
            r += _popcount(marks[w])


@njit(cache=True)
def remap_ranks(token, remap_row, out):
    for i in range(token.shape[0]):
        out[i] = remap_row[token[i]] - 1


# ------------------------------------------------------------------------------- checks

C_OK, C_OFFSETS, C_TOKEN, C_COUNT, C_NEG, C_SUM, C_ORDER = 0, 1, 2, 3, 4, 5, 6
CHECK_MESSAGES = {
    C_OFFSETS: "the children offsets of node {node} are not the contiguous, non-decreasing ranges of the next level",
    C_TOKEN: "node {node} has a token rank outside its level's table",
    C_COUNT: "node {node} has a frequency rank outside its level's table (or an escape mark that does not match it)",
    C_NEG: "node {node} has a negative frequency",
    C_SUM: "the children of node {node} count more windows than the node",
    C_ORDER: "the children of node {node} are not in strictly increasing token order",
}


@njit(cache=True)
def _next_rank(tr, lvl, node, e):
    """(frequency rank of ``node``, escapes used so far) for a walk through level ``lvl`` in node
    order, ``e`` escapes of the level before ``node`` (no mark counting: the walk keeps count)."""
    w = tr[_CNT_WIDTH][lvl]
    rank = read_bits(tr[_CNT_WORDS], tr[_CNT_BIT][lvl] + (node - tr[_LEVEL_START][lvl]) * w, w)
    wide = tr[_ESC_WIDTH][lvl]
    if wide > 0 and rank == (np.int64(1) << w) - 1:
        rank = read_bits(tr[_ESC_WORDS], tr[_ESC_BIT][lvl] + e * wide, wide)
        e += 1
    return rank, e


@njit(cache=True, _nrt=False)  # no reference counting (it allocates nothing): the helpers take the whole tuple
def check_compressed(tr, full):
    """(status, node): a pass over every node's fields (children ranges tile each next level in
    order, escape marks sit exactly on the escaped narrow fields and their sampled counts are
    right, token and frequency ranks lie inside their tables), then a pass over what they say
    (frequencies are >= 0 but the root's, children count no more than their parent; with
    ``full`` also strictly increasing sibling tokens). Both walk the nodes in order and decode
    them as they go."""
    n = ct_size(tr)
    level_start = tr[_LEVEL_START]
    levels = level_start.shape[0] - 1
    marks, mark_tab = tr[_ESC_MARKS], tr[_ESC_RANK]
    escapes = np.int64(0)
    expect = np.int64(1)
    for lvl in range(levels):
        width = tr[_TOK_WIDTH][lvl]
        cwidth = tr[_CNT_WIDTH][lvl]
        wide = tr[_ESC_WIDTH][lvl]
        marker = (np.int64(1) << cwidth) - 1
        n_counts = tr[_CNT_TAB_START][lvl + 1] - tr[_CNT_TAB_START][lvl]
        n_tokens = tr[_TOK_COUNT][lvl]
        if escapes != tr[_ESC_BEFORE][lvl]:
            return C_COUNT, level_start[lvl]
        e_end = tr[_ESC_BEFORE][lvl + 1]
        next_end = level_start[lvl + 2] if lvl + 2 < level_start.shape[0] else n
        lo = kid_value(tr[_KID_BLOCKS], tr[_KID_WORDS], level_start[lvl])
        for node in range(level_start[lvl], level_start[lvl + 1]):
            hi = kid_value(tr[_KID_BLOCKS], tr[_KID_WORDS], node + 1)
            if lo != expect or hi < lo or hi > next_end or (hi > lo and lo < level_start[lvl + 1]):
                return C_OFFSETS, node
            expect = hi
            lo = hi
            if (node & ((1 << RANK_SHIFT) - 1)) == 0 and marks.shape[0] > 0:
                k = node >> RANK_SHIFT
                if k >= mark_tab.shape[0] or mark_tab[k] != escapes:
                    return C_COUNT, node
            narrow = read_bits(tr[_CNT_WORDS], tr[_CNT_BIT][lvl] + (node - level_start[lvl]) * cwidth, cwidth)
            marked = marks.shape[0] > 0 and ((marks[node >> 6] >> np.uint64(node & 63)) & np.uint64(1)) == 1
            escaped = wide > 0 and narrow == marker
            if marked != escaped:
                return C_COUNT, node
            rank = narrow
            if escaped:
                if escapes >= e_end:
                    return C_COUNT, node
                rank = read_bits(tr[_ESC_WORDS], tr[_ESC_BIT][lvl] + (escapes - tr[_ESC_BEFORE][lvl]) * wide, wide)
                escapes += 1
            if rank >= n_counts:
                return C_COUNT, node
            if lvl > 0:
                trank = read_bits(tr[_TOK_WORDS], tr[_TOK_BIT][lvl] + (node - level_start[lvl]) * width, width)
                if trank >= n_tokens:
                    return C_TOKEN, node
        if expect != next_end:
            return C_OFFSETS, level_start[lvl + 1] - 1
        if escapes != e_end:
            return C_COUNT, level_start[lvl + 1] - 1
    # every field is sound: now what the counts and tokens say, walking each level beside the next
    cnt_tab_start, cnt_table = tr[_CNT_TAB_START], tr[_CNT_TABLE]
    for lvl in range(levels):
        e = np.int64(0)  # escapes of this level before the node
        ce = np.int64(0)  # escapes of the next level before the child
        lo = kid_value(tr[_KID_BLOCKS], tr[_KID_WORDS], level_start[lvl])
        for node in range(level_start[lvl], level_start[lvl + 1]):
            hi = kid_value(tr[_KID_BLOCKS], tr[_KID_WORDS], node + 1)
            rank, e = _next_rank(tr, lvl, node, e)
            f = cnt_table[cnt_tab_start[lvl] + rank]
            if node > 0 and f < 0:
                return C_NEG, node
            if hi > lo:
                total = np.int64(0)
                for c in range(lo, hi):
                    crank, ce = _next_rank(tr, lvl + 1, c, ce)
                    total += cnt_table[cnt_tab_start[lvl + 1] + crank]
                if node > 0 and total > f:
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
            lo = hi
    return C_OK, -1
