"""N-gram-guided beam search that turns the head's d top-k rows into a draft tree (docs/spec.md §5).

The search, the pool selection and the tree encoding run in Numba on flat arrays; the Python
functions only check arguments and allocate the static-shape outputs (which the kernel fills
entirely). The trie is read through ``_access.py``'s interface, so the same kernel searches a
CSR trie (``Trie``) or a compressed one (``CompressedTrie``, docs/spec.md §6.3) with identical
results.

Search (as the reference's C++ searcher does it, scores in float32):
  * the beam starts as one empty sequence with score 0;
  * at row l every beam entry is extended by each of the k candidates of row l with
    ``score += w_lvl(l) * (w_log(l) * ln(p_logit + 1e-10) + ngram_weight * ln(p_ngram + 1e-10))``;
    the n-gram term is left out at row 0, when ``ngram_weight == 0`` and when there is no trie;
    the n-gram context is the last ``order - 1`` ids of (preceding ids + the entry's sequence);
  * every extension enters the pool; the next beam is the best ``beam_width`` extensions of
    this row, those whose last id is ``eos_id`` ranked after all others (they are otherwise
    treated like any sequence and are extended further if they make the beam);
  * after d rows the best ``keep`` entries of the whole pool (by score alone) form the tree.

Tie-breaking (deterministic): the pool is numbered in creation order — row by row, within a
row by beam rank then by candidate column. Among equal keys the entry with the lower number
wins, both for the beam and for the final selection. Increments are never positive
(probabilities are clipped to 1 and the weights must be >= 0), so a child never beats its
parent, which has the lower number: the kept set is closed under taking parents, a tree.

Encoding (padded to static shapes, see :class:`DraftTree`): node 0 is the root (the last
preceding id, depth 0); nodes 1.. are the kept entries sorted by depth, and within a depth by
selection rank (score descending, then pool number). Retrieve rows list the leaves in
lexicographic order of their token paths (as the reference does), ties by node index.
"""
from __future__ import annotations

import functools
import math
import dataclasses
import threading
from typing import Callable, NamedTuple, Sequence, Union

import numpy as np
from numba import njit, prange

from dart_jax.errors import InputError

from ._format import MAX_ORDER
from ._access import trie_children_keyed, trie_find_child, trie_freq_at, trie_keys, trie_root_child, trie_size

__all__ = [
    "DraftTree",
    "TreeSettings",
    "build_tree",
    "build_tree_batch",
    "compile_search",
    "default_level_weight",
    "default_logit_weight",
]

WeightSpec = Union[Callable[[int], float], Sequence[float], np.ndarray, None]


class DraftTree(NamedTuple):
    """A draft tree padded to static shapes (``n = keep + 1`` node slots, root included).

    Real entries: nodes ``0 .. num_nodes-1`` and retrieve rows ``0 .. num_leaves-1``.
    Padded node slots hold token 0, position 0, parent -1, and a mask row that is all False
    except the diagonal (so a padded query still has one key to attend to and never makes a
    NaN); no real node's row has True in a padded column. Padded retrieve rows and the tail
    of each retrieve row beyond the leaf's depth hold -1. The batch form stacks every field
    along a leading axis B (``num_nodes``/``num_leaves`` become int32[B]).
    """

    tokens: np.ndarray  # int32[n] target token ids; tokens[0] is the root
    positions: np.ndarray  # int32[n] depth in the tree (root 0)
    parents: np.ndarray  # int32[n] parent node, -1 for the root and padding
    mask: np.ndarray  # bool[n, n] mask[i, j]: node j is an ancestor of node i or i itself
    retrieve: np.ndarray  # int32[keep, d+1] one row per leaf: [0, node at depth 1, ..., leaf]
    num_nodes: np.ndarray  # int32 scalar: real nodes, root included
    num_leaves: np.ndarray  # int32 scalar: real retrieve rows


def default_level_weight(level: int) -> float:
    return (level + 1) ** -0.7


def default_logit_weight(level: int) -> float:
    return 0.9**level


# ---------------------------------------------------------------------------------------------
# Numba kernels
# ---------------------------------------------------------------------------------------------

_INT32_MAX = np.iinfo(np.int32).max
_OK, _BAD_IDS, _BAD_PROBS, _BAD_PRECEDING = 0, 1, 2, 3


@njit(cache=True)
def _check_inputs(topk_ids, topk_probs, preceding, n_preceding):
    for lvl in range(topk_ids.shape[0]):
        for j in range(topk_ids.shape[1]):
            if topk_ids[lvl, j] < 0 or topk_ids[lvl, j] > _INT32_MAX:
                return _BAD_IDS
            p = topk_probs[lvl, j]
            if not (p >= 0 and math.isfinite(p)):
                return _BAD_PROBS
    for t in range(n_preceding):
        if preceding[t] < 0 or preceding[t] > _INT32_MAX:
            return _BAD_PRECEDING
    return _OK


@njit(cache=True)
def _suffix_nodes_of_preceding(tr, n_trie, preceding, n_preceding, out):
    """out[L] = trie node of the last L preceding ids (-1 when not a path), L = 1 .. len(out)-1."""
    for length in range(1, out.shape[0]):
        out[length] = -1
        if length > n_preceding:
            continue
        node = trie_root_child(tr, n_trie, preceding[n_preceding - length])
        for t in range(n_preceding - length + 1, n_preceding):
            if node < 0:
                break
            node = trie_find_child(tr, n_trie, node, preceding[t])
        out[length] = node


@njit(cache=True, error_model="numpy")
def _search_one(
    topk_ids,
    topk_probs,
    preceding,
    n_preceding,
    tr,
    order,
    use_ngram,
    ngram_weight,
    level_w,
    logit_w,
    eos_id,
    beam_width,
    keep,
    out_tokens,
    out_positions,
    out_parents,
    out_mask,
    out_retrieve,
):
    """Search one sequence and write its padded tree into the ``out_*`` arrays.

    ``tr`` is the trie as the tuple ``trie_access.py`` reads (either format). Returns (status,
    num_nodes, num_leaves); status is ``_OK`` or names the bad input. ``out_*`` must be
    allocated as the Python wrappers do (zeros, parents and retrieve -1).

    Same result as scoring the whole pool and sorting it, with these shortcuts:
      * the beam of the row and the global best-``keep`` list are kept sorted as entries are
        made, their last entries' keys cached as thresholds; an entry whose score bound (its
        score with the n-gram term taken as 0, the largest it can be) would enter neither is
        dropped before its n-gram lookup, as the lists' thresholds only rise; when a row's
        logit terms do not increase along the columns (top-k rows as the head gives them) the
        rest of that beam entry's candidates cannot enter either, so the loop stops there (after
        a non-EOS candidate: a later EOS one ranks lower still in the beam, but a later non-EOS
        one may beat an EOS threshold);
      * n-gram probabilities (docs/spec.md §5, as ``ngram_probs`` of trie.py) come from per-entry
        suffix nodes: each beam entry carries the trie nodes of its last 1 .. order-1 ids,
        found from its parent's lookups, and the lookups under a node are shared by every beam
        entry of the row with that suffix node (a memo slot per distinct node, found by a small
        hash): the first time a row needs a node, all k candidates are looked up under it at
        once (binary searches in lockstep, far cheaper than one after another);
      * the hot loop touches only flat arrays indexed in place (no array views, no helper calls
        taking arrays), so Numba emits no reference counting inside it.
    """
    d, k = topk_ids.shape
    out_tokens[:] = 0
    out_positions[:] = 0
    out_parents[:] = -1
    out_mask[:, :] = False
    out_retrieve[:, :] = -1
    status = _check_inputs(topk_ids, topk_probs, preceding, n_preceding)
    if status != _OK:
        return status, 0, 0

    cap = k
    width = 1
    for _ in range(1, d):
        width = min(beam_width, width * k)
        cap += width * k
    pool_score = np.empty(cap, np.float32)
    pool_parent = np.empty(cap, np.int32)
    pool_token = np.empty(cap, np.int32)
    pool_depth = np.empty(cap, np.int32)
    pool_eos = np.empty(cap, np.bool_)
    pool_slot = np.empty(cap, np.int32)  # beam rank of the parent
    pool_col = np.empty(cap, np.int32)  # candidate column

    W = beam_width
    ranks = np.empty((2, W), np.int64)  # ranks[p]: this row's beam, ranks[1 - p]: the next one
    best = np.empty(keep, np.int64)
    p = 0
    ranks[0, 0] = -1
    n_beam = 1
    n_best = 0
    best_thr = np.float32(0.0)  # score of best[keep - 1] once the list is full

    one = np.float32(1.0)
    tiny = np.float32(1e-10)
    ngw = np.float32(ngram_weight)
    logit_term = np.empty((d, k), np.float32)
    for lvl in range(d):
        gw = np.float32(logit_w[lvl])
        for j in range(k):
            pr = min(np.float32(topk_probs[lvl, j]), one)
            logit_term[lvl, j] = np.float32(math.log(pr + tiny)) * gw

    n_trie = trie_size(tr)
    m = order - 1 if (use_ngram and ngram_weight > 0 and n_trie > 0 and order > 1) else 0
    miss_term = np.float32(math.log(tiny)) * ngw
    ctx = np.full((2, W, m + 1), -1, np.int64)  # ctx[p, b, L]: trie node of beam entry b's last L ids
    _suffix_nodes_of_preceding(tr, n_trie, preceding, n_preceding, ctx[0, 0])
    memo_cap = max(W * m, 1)
    memo_node = np.empty(memo_cap, np.int64)
    memo_inv = np.empty(memo_cap, np.float32)
    memo_done = np.empty(memo_cap, np.bool_)
    memo_empty = np.empty(memo_cap, np.bool_)  # the slot's node has count 0: no evidence, skipped (0/0 is a miss)
    memo_child = np.empty((memo_cap, k), np.int64)  # child of the slot's node per candidate, or -1
    memo_freq = np.empty((memo_cap, k), np.float32)  # float32 freq of each found child
    memo_ng = np.empty((memo_cap, k), np.float32)  # its n-gram term; 1 (never a term) until needed
    memo_len = np.empty(memo_cap, np.int64)  # the slot's suffix length L: its children are at depth L + 1
    cand_keys = np.empty((m + 1, k), np.int64)  # cand_keys[L]: this row's candidates as keys at depth L + 1
    beam_memo = np.full((W, m + 1), -1, np.int64)
    hash_size = 4
    while hash_size < 2 * memo_cap:
        hash_size *= 2
    hash_slot = np.full(hash_size, -1, np.int64)

    n_pool = 0
    for lvl in range(d):
        q = 1 - p
        lw = np.float32(level_w[lvl])
        with_ngram = m > 0 and lvl > 0
        to_beam = lvl + 1 < d
        monotone = True
        for j in range(1, k):
            if logit_term[lvl, j] > logit_term[lvl, j - 1]:
                monotone = False
        if m > 0:
            for length in range(1, m + 1):
                trie_keys(tr, length + 1, topk_ids, lvl, cand_keys[length])
            n_memo = 0
            for bi in range(n_beam):
                for length in range(1, m + 1):
                    node = ctx[p, bi, length]
                    slot = -1
                    if node >= 0:
                        h = (node * 0x9E3779B1) & (hash_size - 1)
                        while True:
                            s = hash_slot[h]
                            if s < 0:
                                slot = n_memo
                                n_memo += 1
                                hash_slot[h] = slot
                                memo_node[slot] = node
                                memo_len[slot] = length
                                node_freq = trie_freq_at(tr, length, node)
                                memo_empty[slot] = node_freq == 0
                                memo_inv[slot] = one / np.float32(max(node_freq, 1))
                                memo_done[slot] = False
                                break
                            if memo_node[s] == node:
                                slot = s
                                break
                            h = (h + 1) & (hash_size - 1)
                    beam_memo[bi, length] = slot
            for s in range(n_memo):  # empty the hash for the next row
                h = (memo_node[s] * 0x9E3779B1) & (hash_size - 1)
                while hash_slot[h] >= 0:
                    hash_slot[h] = -1
                    h = (h + 1) & (hash_size - 1)
        n_row = 0
        row_thr_eos = False  # key of ranks[q, W - 1] once the next beam is full
        row_thr = np.float32(0.0)
        for bi in range(n_beam):
            parent = ranks[p, bi]
            base = np.float32(0.0) if parent < 0 else pool_score[parent]
            for j in range(k):
                tok = topk_ids[lvl, j]
                is_eos = tok == eos_id
                term = logit_term[lvl, j]
                score = base + lw * term
                # an entry numbered after every listed one enters a full list only by a strictly
                # better key: (non-EOS first,) higher score
                enters_beam = to_beam and (
                    n_row < W or (row_thr_eos and not is_eos) or (row_thr_eos == is_eos and score > row_thr)
                )
                enters_best = n_best < keep or score > best_thr
                if not (enters_beam or enters_best):
                    if monotone and not (to_beam and is_eos):
                        break
                    continue
                if with_ngram:
                    ng = miss_term
                    for length in range(m, 0, -1):
                        slot = beam_memo[bi, length]
                        if slot < 0 or memo_empty[slot]:
                            continue
                        if not memo_done[slot]:
                            trie_children_keyed(tr, n_trie, memo_node[slot], memo_len[slot] + 1, cand_keys[memo_len[slot]],
                                                memo_child, memo_freq, slot)
                            for c in range(k):
                                memo_ng[slot, c] = one
                            memo_done[slot] = True
                        if memo_child[slot, j] >= 0:
                            ng = memo_ng[slot, j]
                            if ng > 0:
                                pn = memo_freq[slot, j] * memo_inv[slot]
                                if not pn <= one:  # also a NaN from a corrupted trie: scores stay finite
                                    pn = one
                                ng = np.float32(math.log(pn + tiny)) * ngw
                                memo_ng[slot, j] = ng
                            break
                    score = base + lw * (term + ng)
                    enters_beam = to_beam and (
                        n_row < W or (row_thr_eos and not is_eos) or (row_thr_eos == is_eos and score > row_thr)
                    )
                    enters_best = n_best < keep or score > best_thr
                    if not (enters_beam or enters_best):
                        continue
                i = n_pool
                n_pool += 1
                pool_score[i] = score
                pool_parent[i] = parent
                pool_token[i] = tok
                pool_depth[i] = lvl + 1
                pool_eos[i] = is_eos
                pool_slot[i] = bi
                pool_col[i] = j
                if enters_beam:
                    if n_row == W:
                        pos = W - 1
                    else:
                        pos = n_row
                        n_row += 1
                    while pos > 0:
                        w = ranks[q, pos - 1]
                        if pool_eos[w] != is_eos:
                            if is_eos:
                                break
                        elif not score > pool_score[w]:
                            break
                        ranks[q, pos] = w
                        pos -= 1
                    ranks[q, pos] = i
                    if n_row == W:
                        w = ranks[q, W - 1]
                        row_thr_eos = pool_eos[w]
                        row_thr = pool_score[w]
                if enters_best:
                    if n_best == keep:
                        pos = keep - 1
                    else:
                        pos = n_best
                        n_best += 1
                    while pos > 0 and score > pool_score[best[pos - 1]]:
                        best[pos] = best[pos - 1]
                        pos -= 1
                    best[pos] = i
                    if n_best == keep:
                        best_thr = pool_score[best[keep - 1]]
        if to_beam:
            if m > 0:
                for r in range(n_row):
                    e = ranks[q, r]
                    bi = pool_slot[e]
                    j = pool_col[e]
                    ctx[q, r, 1] = trie_root_child(tr, n_trie, topk_ids[lvl, j])
                    for length in range(2, m + 1):
                        slot = beam_memo[bi, length - 1]
                        if slot < 0:
                            ctx[q, r, length] = -1
                            continue
                        if not memo_done[slot]:
                            trie_children_keyed(tr, n_trie, memo_node[slot], memo_len[slot] + 1, cand_keys[memo_len[slot]],
                                                memo_child, memo_freq, slot)
                            for c in range(k):
                                memo_ng[slot, c] = one
                            memo_done[slot] = True
                        ctx[q, r, length] = memo_child[slot, j]
            p = q
            n_beam = n_row

    # Nodes sorted by depth (stable: within a depth by selection rank).
    n_sel = n_best
    n_nodes = n_sel + 1
    node_of = np.full(n_pool, -1, np.int32)
    depth_count = np.zeros(d + 2, np.int64)
    for r in range(n_sel):
        depth_count[pool_depth[best[r]] + 1] += 1
    for t in range(1, d + 2):
        depth_count[t] += depth_count[t - 1]
    order_nodes = np.empty(n_sel, np.int64)
    for r in range(n_sel):
        pi = best[r]
        dd = pool_depth[pi]
        slot = depth_count[dd]
        depth_count[dd] += 1
        order_nodes[slot] = pi
        node_of[pi] = slot + 1

    depth = np.zeros(n_nodes, np.int64)
    paths = np.zeros((n_nodes, d), np.int64)
    has_child = np.zeros(n_nodes, np.bool_)
    out_tokens[0] = preceding[n_preceding - 1]
    out_mask[0, 0] = True
    for i in range(1, n_nodes):
        pi = order_nodes[i - 1]
        par = 0 if pool_parent[pi] < 0 else node_of[pool_parent[pi]]
        dd = pool_depth[pi]
        out_tokens[i] = pool_token[pi]
        out_positions[i] = dd
        out_parents[i] = par
        depth[i] = dd
        has_child[par] = True
        for t in range(dd - 1):
            paths[i, t] = paths[par, t]
        paths[i, dd - 1] = pool_token[pi]
        for j in range(i):
            out_mask[i, j] = out_mask[par, j]
        out_mask[i, i] = True
    for i in range(n_nodes, out_tokens.shape[0]):
        out_mask[i, i] = True

    # Leaves in lexicographic order of their paths (a prefix first), ties by node index.
    leaves = np.empty(n_nodes, np.int64)
    n_leaves = 0
    for i in range(1, n_nodes):
        if has_child[i]:
            continue
        pos = n_leaves
        n_leaves += 1
        while pos > 0:
            a = leaves[pos - 1]  # does node i sort before node a?
            la = depth[i]
            lb = depth[a]
            less = la < lb
            for t in range(min(la, lb)):
                if paths[i, t] != paths[a, t]:
                    less = paths[i, t] < paths[a, t]
                    break
            if not less:  # equal paths: i > a keeps a first
                break
            leaves[pos] = a
            pos -= 1
        leaves[pos] = i
    for r in range(n_leaves):
        node = leaves[r]
        while node > 0:
            out_retrieve[r, depth[node]] = node
            node = out_parents[node]
        out_retrieve[r, 0] = 0
    return _OK, n_nodes, n_leaves


@njit(cache=True, parallel=True)
def _search_batch(
    topk_ids,
    topk_probs,
    preceding,
    preceding_len,
    tr,
    order,
    use_ngram,
    ngram_weight,
    level_w,
    logit_w,
    eos_id,
    beam_width,
    keep,
    out_tokens,
    out_positions,
    out_parents,
    out_mask,
    out_retrieve,
    out_status,
    out_num_nodes,
    out_num_leaves,
):
    for b in prange(topk_ids.shape[0]):
        st, nn, nl = _search_one(
            topk_ids[b],
            topk_probs[b],
            preceding[b],
            preceding_len[b],
            tr,
            order,
            use_ngram,
            ngram_weight,
            level_w,
            logit_w,
            eos_id,
            beam_width,
            keep,
            out_tokens[b],
            out_positions[b],
            out_parents[b],
            out_mask[b],
            out_retrieve[b],
        )
        out_status[b] = st
        out_num_nodes[b] = nn
        out_num_leaves[b] = nl


# ---------------------------------------------------------------------------------------------
# Python entry points: argument checks and static-shape allocation
# ---------------------------------------------------------------------------------------------



def _level_weights(spec: WeightSpec, default: Callable[[int], float], d: int, name: str) -> np.ndarray:
    if spec is None:
        return _default_weights(default, d)
    if callable(spec):
        w = np.array([float(spec(level)) for level in range(d)], np.float64)
    else:
        w = np.asarray(spec, np.float64)
        if w.ndim != 1 or w.shape[0] < d:
            raise ValueError(
                f"{name} must be a callable of the row index or a 1-D sequence with at least "
                f"d={d} entries; got shape {w.shape}. Pass one weight per draft row."
            )
        w = w[:d]
    if not np.all(np.isfinite(w) & (w >= 0)):
        raise ValueError(
            f"{name} must be finite and >= 0 for every row 0..{d - 1} (so that a child never "
            f"outscores its parent); got {w.tolist()}."
        )
    return w.astype(np.float32)


@functools.lru_cache(maxsize=64)
def _default_weights(fn: Callable[[int], float], d: int) -> np.ndarray:
    w = np.array([fn(level) for level in range(d)], np.float32)
    w.flags.writeable = False
    return w


# The kernels' inputs are made writable, C-ordered arrays whatever the caller passes (a read-only
# view of a device buffer, a slice): Numba compiles a kernel per argument type, and one type is
# what `compile_search` compiles ahead.
_KERNEL_INPUT = ("C", "W")


def _as_int64(x, name: str, shape: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.int64 and x.size and x.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer token ids {shape}; got dtype {x.dtype}.")
    return np.require(x, np.int64, _KERNEL_INPUT)


def _check_topk(topk_ids, topk_probs, ndim: int, shape: str):
    ids = _as_int64(topk_ids, "topk_ids", shape)
    probs = np.require(topk_probs, np.float32, _KERNEL_INPUT)
    if ids.ndim != ndim or probs.shape != ids.shape or 0 in ids.shape:
        raise ValueError(
            f"topk_ids and topk_probs must have the same non-empty shape {shape}; got "
            f"{ids.shape} and {probs.shape}."
        )
    return ids, probs


def _check_search_args(beam_width: int, keep: int, ngram_weight: float, eos_id) -> int:
    if int(beam_width) < 1:
        raise ValueError(f"beam_width must be >= 1; got {beam_width}.")
    if int(keep) < 1:
        raise ValueError(f"keep must be >= 1 (the tree budget without the root); got {keep}.")
    if not (math.isfinite(ngram_weight) and ngram_weight >= 0):
        raise ValueError(f"ngram_weight must be a finite number >= 0; got {ngram_weight}.")
    return -1 if eos_id is None else int(eos_id)


def _raise_for(status: int, where: str = "") -> None:
    if status == _BAD_IDS:
        raise ValueError(
            f"topk_ids{where} must be target token ids in [0, 2**31). Map draft ids to target ids "
            "(head.to_target) first."
        )
    if status == _BAD_PROBS:
        raise ValueError(
            f"topk_probs{where} must be finite and non-negative (the softmax over each row's top-k logits)."
        )
    if status == _BAD_PRECEDING:
        raise ValueError(f"preceding_ids{where} must be token ids in [0, 2**31).")


def _readonly(x: np.ndarray) -> np.ndarray:
    x.flags.writeable = False
    return x


# Same dtypes as Trie.arrays() and Trie.root_table() (an empty table: binary search), so that
# trie=None and tries without a table reuse the compiled specialisation.
_NO_ROOT_TABLE = _readonly(np.zeros(0, np.int32))
_NO_TRIE = (np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(2, np.int64), _NO_ROOT_TABLE)


def _trie_arrays(trie):
    """(the tuple the kernels read, order, whether there is a trie): ``search_arrays()`` of a
    trie that has it (either format, see ``_access.py``), else the CSR arrays of ``arrays()``."""
    if trie is None:
        return _NO_TRIE, 1, False
    # the search keeps order-1 suffix nodes per beam entry: a huge order must not size buffers
    order = trie.order
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= order <= MAX_ORDER:
        raise InputError(f"trie.order must be an integer in [1, {MAX_ORDER}]; got {order!r}.")
    if hasattr(trie, "search_arrays"):
        return trie.search_arrays(), int(order), True
    token, freq, child_start = trie.arrays()
    root = trie.root_table() if hasattr(trie, "root_table") else _NO_ROOT_TABLE
    return (token, freq, child_start, root), int(order), True


def build_tree(
    topk_ids,
    topk_probs,
    preceding_ids,
    trie,
    *,
    eos_id: int | None,
    beam_width: int = 20,
    keep: int = 60,
    ngram_weight: float = 0.5,
    level_weight: WeightSpec = None,
    logit_weight: WeightSpec = None,
) -> DraftTree:
    """Build one draft tree (docs/spec.md §5) padded to ``keep + 1`` nodes.

    Args:
      topk_ids: int [d, k] target token ids of each row's top-k draft candidates.
      topk_probs: float [d, k] softmax over each row's top-k logits (values above 1 are
        clipped to 1).
      preceding_ids: int [P >= 1] the ids fed to the head this step; the last one is the root.
      trie: a ``Trie`` (anything with ``.arrays()`` and ``.order``) or None for logits only.
      eos_id: candidates equal to it are ranked after all others in the beam; None: no such rule.
      beam_width, keep: beam size per row and number of nodes kept (root excluded).
      ngram_weight: weight of ln(p_ngram + 1e-10); 0 or ``trie=None`` leave the term out.
      level_weight, logit_weight: w_lvl(l) and w_log(l) as callables of the row index or
        sequences of at least d values; defaults (l+1)**-0.7 and 0.9**l.
    """
    ids, probs = _check_topk(topk_ids, topk_probs, 2, "[d, k]")
    preceding = _as_int64(preceding_ids, "preceding_ids", "[P]")
    if preceding.ndim != 1 or preceding.shape[0] == 0:
        raise ValueError(
            f"preceding_ids must be a non-empty 1-D sequence (its last id is the root); got shape {preceding.shape}."
        )
    eos = _check_search_args(beam_width, keep, ngram_weight, eos_id)
    d = ids.shape[0]
    level_w = _level_weights(level_weight, default_level_weight, d, "level_weight")
    logit_w = _level_weights(logit_weight, default_logit_weight, d, "logit_weight")
    tr, order, use_ngram = _trie_arrays(trie)

    n = keep + 1
    tokens = np.empty(n, np.int32)
    positions = np.empty(n, np.int32)
    parents = np.empty(n, np.int32)
    mask = np.empty((n, n), np.bool_)
    retrieve = np.empty((keep, d + 1), np.int32)
    status, num_nodes, num_leaves = _search_one(
        ids, probs, preceding, preceding.shape[0], tr, order, use_ngram,
        float(ngram_weight), level_w, logit_w, eos, int(beam_width), int(keep),
        tokens, positions, parents, mask, retrieve,
    )
    _raise_for(status)
    return DraftTree(tokens, positions, parents, mask, retrieve, np.int32(num_nodes), np.int32(num_leaves))


def build_tree_batch(
    topk_ids,
    topk_probs,
    preceding_ids,
    trie,
    *,
    eos_id: int | None,
    preceding_len=None,
    beam_width: int = 20,
    keep: int = 60,
    ngram_weight: float = 0.5,
    level_weight: WeightSpec = None,
    logit_weight: WeightSpec = None,
) -> DraftTree:
    """:func:`build_tree` for B sequences at once (threads across sequences); fields stacked.

    ``topk_ids``/``topk_probs`` are [B, d, k]; ``preceding_ids`` is [B, P] whose first
    ``preceding_len[b]`` entries (default P) are sequence b's preceding ids.
    """
    ids, probs = _check_topk(topk_ids, topk_probs, 3, "[B, d, k]")
    preceding = _as_int64(preceding_ids, "preceding_ids", "[B, P]")
    bsz, d, _ = ids.shape
    if preceding.ndim != 2 or preceding.shape[0] != bsz:
        raise ValueError(f"preceding_ids must be [B={bsz}, P]; got shape {preceding.shape}.")
    if preceding_len is None:
        lens = np.full(bsz, preceding.shape[1], np.int64)
    else:
        lens = np.ascontiguousarray(np.asarray(preceding_len), np.int64)
        if lens.shape != (bsz,):
            raise ValueError(f"preceding_len must be [B={bsz}]; got shape {lens.shape}.")
    if bsz and (lens.min() < 1 or lens.max() > preceding.shape[1]):
        raise ValueError(
            f"preceding_len must lie in [1, P={preceding.shape[1]}] (every sequence needs its root id); "
            f"got range [{lens.min()}, {lens.max()}]."
        )
    eos = _check_search_args(beam_width, keep, ngram_weight, eos_id)
    level_w = _level_weights(level_weight, default_level_weight, d, "level_weight")
    logit_w = _level_weights(logit_weight, default_logit_weight, d, "logit_weight")
    tr, order, use_ngram = _trie_arrays(trie)

    n = keep + 1
    tokens = np.empty((bsz, n), np.int32)
    positions = np.empty((bsz, n), np.int32)
    parents = np.empty((bsz, n), np.int32)
    mask = np.empty((bsz, n, n), np.bool_)
    retrieve = np.empty((bsz, keep, d + 1), np.int32)
    num_nodes = np.zeros(bsz, np.int32)
    num_leaves = np.zeros(bsz, np.int32)
    status = np.zeros(bsz, np.int64)
    _search_batch(
        ids, probs, preceding, lens, tr, order, use_ngram,
        float(ngram_weight), level_w, logit_w, eos, int(beam_width), int(keep),
        tokens, positions, parents, mask, retrieve, status, num_nodes, num_leaves,
    )
    bad = np.flatnonzero(status)
    if bad.size:
        _raise_for(int(status[bad[0]]), f" of sequence {bad[0]}")
    return DraftTree(tokens, positions, parents, mask, retrieve, num_nodes, num_leaves)


def compile_search(trie) -> threading.Thread:
    """Compile `build_tree`'s kernel for `trie`'s arrays (or load it from Numba's cache) in a
    daemon thread started now, so that the first search finds it ready: tens of seconds on a
    first run, which overlap whatever the caller does meanwhile (loading weights, compiling the
    model's steps in XLA, which leaves the GIL). A search that comes sooner waits for it at
    Numba's compiler lock rather than compiling again. Returns the thread (join it to wait)."""
    def run() -> None:
        try:
            build_tree(np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32), np.zeros(1, np.int64), trie,
                       eos_id=0, beam_width=1, keep=1)
        except Exception:  # noqa: BLE001 - only a head start: the first real search raises what is wrong
            pass

    thread = threading.Thread(target=run, name="dart_jax-compile-tree-search", daemon=True)
    thread.start()
    return thread


@dataclasses.dataclass(frozen=True)
class TreeSettings:
    """How draft trees are searched (defaults are the reference's, docs/spec.md §5): the search
    reads the `topk` best candidates of the first `draft_rows` rows (None: all rows), keeps a beam
    of `beam_width` per row and `keep` nodes besides the root, and weighs the n-gram term by
    `ngram_weight`. Checked on construction; `check_fits` checks them against a drafter."""

    keep: int = 60
    beam_width: int = 20
    topk: int = 25
    draft_rows: int | None = None
    ngram_weight: float = 0.5

    def __post_init__(self):
        checks = [
            (isinstance(self.keep, int) and self.keep >= 1, f"keep (tree size) must be an integer >= 1, got {self.keep!r}"),
            (isinstance(self.beam_width, int) and self.beam_width >= 1,
             f"beam_width must be an integer >= 1, got {self.beam_width!r}"),
            (isinstance(self.topk, int) and self.topk >= 1, f"topk must be an integer >= 1, got {self.topk!r}"),
            (self.draft_rows is None or (isinstance(self.draft_rows, int) and self.draft_rows >= 1),
             f"draft_rows must be None or an integer >= 1, got {self.draft_rows!r}"),
            (math.isfinite(self.ngram_weight) and self.ngram_weight >= 0,
             f"ngram_weight must be a finite number >= 0, got {self.ngram_weight!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message + ".")

    def check_fits(self, rows: int, draft_vocab: int) -> "TreeSettings":
        """These settings against a drafter of `rows` rows over a vocabulary of `draft_vocab` ids."""
        if self.topk > draft_vocab:
            raise ValueError(f"topk must lie in [1, draft vocabulary {draft_vocab}], got {self.topk}.")
        if self.draft_rows is not None and self.draft_rows > rows:
            raise ValueError(f"draft_rows must lie in [1, {rows}] (the head drafts {rows} rows), got {self.draft_rows}.")
        return self

    def rows_used(self, rows: int) -> int:
        """Rows the search reads of a drafter that drafts `rows`."""
        return self.draft_rows or rows

    def search(self, topk_ids, topk_probs, preceding_ids, preceding_len, trie, *, eos_id) -> DraftTree:
        """`build_tree_batch` with these settings ([B, ...] fields). One sequence goes through the
        single-tree kernel: starting the batch kernel's threads costs more than its search."""
        if len(topk_ids) == 1:
            one = build_tree(topk_ids[0], topk_probs[0], np.asarray(preceding_ids)[0, :int(preceding_len[0])], trie,
                             eos_id=eos_id, beam_width=self.beam_width, keep=self.keep, ngram_weight=self.ngram_weight)
            return DraftTree(*(np.asarray(field)[None] for field in one))
        return build_tree_batch(topk_ids, topk_probs, preceding_ids, trie, eos_id=eos_id, preceding_len=preceding_len,
                                beam_width=self.beam_width, keep=self.keep, ngram_weight=self.ngram_weight)
