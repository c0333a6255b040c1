"""The draft-tree search of docs/spec.md §5 in JAX, so that it can run on the accelerator.

The host's search (`dart_jax.ngram.build_tree`, Numba) sits between two device calls in every
step: the device waits while the host searches, and each step pays a host round trip (on a GPU a
host call costs more than a token of a device loop; benchmarks/RESULTS.md has the figures). A
search written with array operations of static shapes can
run inside the step's own program, which is what a decoding loop on the device needs.

`search_tree` builds the same tree as `build_tree` — the same scores (float32, the same formula
and order of operations, each product rounded before its sum as there rather than fused into an
FMA), the same pool numbering and tie-breaking, the same node order, mask and retrieve rows — but
without `build_tree`'s pruning: every extension of every beam entry is scored (d · beam_width · k
entries), then sorted. On a GPU each array operation is a kernel or more, launched one after the
other, so the search is written for few of them and no chains of dependent ones: a level makes
one trie search (every suffix of every beam entry extended by every candidate: it scores the
level and gives the next beam its suffixes), and each pool entry carries its ancestors' pool
numbers, so that parents, mask, token paths and retrieve rows come out of a few elementwise
comparisons rather than a walk up the tree. Its parts run under named scopes (context, level_i,
select, links), which `dart_jax.bench.profile` reports one by one. One difference can remain:
`build_tree` takes each logarithm in double precision and rounds it to float32, XLA computes it
in float32, which may differ in the last bit
(about one value in seven on XLA:CPU); two pool entries whose scores are that close may then rank
the other way round, and the trees differ. Either tree is a valid draft: greedy DART's output does
not depend on the tree (its accepted lengths, and sampled draws, may).

The trie is `DeviceTrie`: the CSR trie's arrays (`dart_jax.ngram.Trie`, 12 bytes a node, and a
table of the root's children) on the device, a child found by a search that cuts its siblings'
sorted list into 16 parts a step (a fixed number of steps: the largest list's). Inputs are not
checked here (the caller's drafter gives ids in range and probabilities in [0, 1]).

`TreeEdit` is the device loop's one hook: a change to each searched tree before its verify, with
a state of its own carried from step to step (a benchmark uses it; DART itself edits nothing).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.ngram import Trie
from dart_jax.ngram.tree import DraftTree, default_level_weight, default_logit_weight

_TINY = np.float32(1e-10)
SEARCH_WAYS = 16  # parts a child list is cut into per step of the trie's search (DeviceTrie.rounds)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DeviceTrie:
    """A CSR trie's arrays as device arrays (`from_trie`): `token`, `freq` (int32 [N]) and `start`
    (int32 [N + 1]: node i's children are start[i] .. start[i+1] - 1, sorted by token), and `root`,
    the root's children as a table token → child (-1: none; `Trie.root_table`). Static: `order`,
    and `rounds`, the steps of the search under any other node: each step cuts a child list into
    SEARCH_WAYS parts at once (one gather of the cut points, a count), so that a list of 1 446
    children takes 3 steps rather than 11 halvings, each step a kernel or two on a GPU (the root's
    own list, a whole vocabulary wide, would need the most: the table answers for it)."""

    token: jax.Array
    freq: jax.Array
    start: jax.Array
    root: jax.Array
    order: int = dataclasses.field(metadata={"static": True})
    rounds: int = dataclasses.field(metadata={"static": True})

    @classmethod
    def from_trie(cls, trie: Trie) -> "DeviceTrie":
        token, freq, child_start = trie.arrays()
        if child_start[-1] >= 2**31:
            raise ValueError(f"a trie of {child_start[-1]} nodes does not fit the device search's int32 indices")
        root = trie.root_table()
        if root.size == 0 and child_start[1] > child_start[0]:
            raise ValueError("the trie's root children have ids too large for a table (>= 2**24): the device search "
                             "cannot take it; search on the host (device_steps=0)")
        widths = np.diff(child_start)[1:]
        largest = int(widths.max()) if widths.size else 0
        rounds = 0
        while SEARCH_WAYS ** rounds < largest:
            rounds += 1
        return cls(jnp.asarray(token, jnp.int32), jnp.asarray(freq, jnp.int32), jnp.asarray(child_start, jnp.int32),
                   jnp.asarray(root if root.size else np.full(1, -1, np.int32), jnp.int32), int(trie.order), rounds)

    def child(self, node, tok):
        """The child of each `node` (int32, -1: none) whose token is `tok` (broadcast), or -1."""
        n = self.token.shape[0]
        valid = (node >= 1) & (node < n)
        safe = jnp.where(valid, node, 0)
        lo = jnp.where(valid, self.start[safe], 0)
        size = jnp.where(valid, self.start[safe + 1] - lo, 0)
        lo, size, tok = jnp.broadcast_arrays(lo, size, tok)
        cuts = jnp.arange(1, SEARCH_WAYS, dtype=jnp.int32)
        for _ in range(self.rounds):
            # [lo, lo + size) holds the last child whose token is <= tok (siblings are sorted, distinct):
            # keep the part of the SEARCH_WAYS parts (`step` long) that begins with it
            step = (size + SEARCH_WAYS - 1) // SEARCH_WAYS
            at = cuts * step[..., None]  # [..., ways - 1] offsets of the parts after the first
            inside = at < size[..., None]
            below = self.token[jnp.clip(lo[..., None] + at, 0, n - 1)] <= tok[..., None]
            part = jnp.sum(inside & below, axis=-1, dtype=jnp.int32)
            lo = lo + part * step
            size = jnp.where(size > 1, jnp.minimum(step, size - part * step), size)
        found = (size > 0) & (self.token[jnp.clip(lo, 0, n - 1)] == tok)
        below = jnp.where(found, lo, -1)
        return jnp.where(jnp.broadcast_to(node, below.shape) == 0, self.root_child(tok), below).astype(jnp.int32)

    def root_child(self, tok):
        """The root's child whose token is `tok` (int32, any shape), or -1: one lookup in the table."""
        size = self.root.shape[0]
        return jnp.where((tok >= 0) & (tok < size), self.root[jnp.clip(tok, 0, size - 1)], -1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class DeviceSearch:
    """The search's settings (as `build_tree`'s arguments): static under `jax.jit`."""

    keep: int = 60
    beam_width: int = 20
    ngram_weight: float = 0.5
    eos_id: int | None = None

    def weights(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        level = np.array([default_level_weight(i) for i in range(d)], np.float64).astype(np.float32)
        logit = np.array([default_logit_weight(i) for i in range(d)], np.float64).astype(np.float32)
        return level, logit


def _rounded(product):
    """`product` rounded to float32 before its sum is taken, as the host's search rounds it: kept out
    of the addition that follows, which XLA would otherwise fuse into one FMA (rounded once)."""
    return jax.lax.optimization_barrier(product)


def _lexsort_first(keys: tuple, count: int):
    """Indices of the `count` first entries under `jnp.lexsort(keys)` (last key primary)."""
    return jnp.lexsort(keys)[:count]


def search_tree(topk_ids, topk_probs, preceding, n_preceding, trie: DeviceTrie | None,
                settings: DeviceSearch) -> DraftTree:
    """One sequence's draft tree (docs/spec.md §5) padded to keep + 1 nodes, as `build_tree`.

    topk_ids int32 [d, k], topk_probs float32 [d, k], preceding int32 [P] whose first
    `n_preceding` (int32 scalar, >= 1) entries are the ids fed to the head (the last: the root)."""
    d, k = topk_ids.shape
    W, keep = settings.beam_width, settings.keep
    level_w, logit_w = settings.weights(d)
    eos = -1 if settings.eos_id is None else int(settings.eos_id)
    ngw = np.float32(settings.ngram_weight)
    use_ngram = trie is not None and settings.ngram_weight > 0 and trie.order > 1
    m = trie.order - 1 if use_ngram else 0
    miss = np.float32(np.float32(math.log(_TINY)) * ngw)
    one = np.float32(1.0)

    ids = topk_ids.astype(jnp.int32)
    logit_term = _rounded(jnp.log(jnp.minimum(topk_probs.astype(jnp.float32), one) + _TINY) * jnp.asarray(logit_w)[:, None])

    # the beam: score, validity, the pool numbers of its entries' ancestors by depth (each entry
    # itself included; -1 past its depth; the empty sequence's: none), trie nodes of its last L ids
    beam_score = jnp.zeros((W,), jnp.float32)
    beam_ok = jnp.zeros((W,), bool).at[0].set(True)
    beam_anc = jnp.full((W, d), -1, jnp.int32)
    nodes = [jnp.full((W,), -1, jnp.int32) for _ in range(m + 1)]  # nodes[L][b], L = 1 .. m
    with jax.named_scope("context"):
        for length in range(1, m + 1):
            ok = n_preceding >= length
            node = trie.root_child(preceding[jnp.maximum(n_preceding - length, 0)])
            for t in range(1, length):
                node = trie.child(node, preceding[jnp.clip(n_preceding - length + t, 0, preceding.shape[0] - 1)])
            nodes[length] = nodes[length].at[0].set(jnp.where(ok, node, -1))

    pool = {name: [] for name in ("score", "token", "depth", "ok", "ancestors")}
    for lvl in range(d):
        with jax.named_scope(f"level_{lvl}"):
            lw = np.float32(level_w[lvl])
            term = logit_term[lvl][None, :]  # [1, k]
            tok = jnp.broadcast_to(ids[lvl][None, :], (W, k))
            if m and (lvl > 0 or lvl + 1 < d):
                # each beam entry's suffixes (lengths m .. 1) extended by each candidate: every lookup of
                # the level in one search; it scores this level and gives the next beam its suffixes
                suffixes = jnp.stack([nodes[length] for length in range(m, 0, -1)])[:, :, None]  # [m, W, 1]
                children = trie.child(suffixes, jnp.broadcast_to(tok, (m, W, k)))
            if m and lvl > 0:
                ng = jnp.full((W, k), miss, jnp.float32)
                done = jnp.zeros((W, k), bool)
                for at, length in enumerate(range(m, 0, -1)):
                    s = suffixes[at]  # [W, 1]
                    s_freq = trie.freq[jnp.maximum(s, 0)]
                    usable = (s >= 0) & (s_freq > 0)  # a node of count 0 is no evidence: back off
                    child = children[at]
                    hit = usable & (child >= 0) & ~done
                    pn = _rounded(trie.freq[jnp.maximum(child, 0)].astype(jnp.float32)
                                  * (one / s_freq.astype(jnp.float32)))
                    pn = jnp.where(pn <= one, pn, one)  # a NaN too
                    ng = jnp.where(hit, _rounded(jnp.log(pn + _TINY) * ngw), ng)
                    done = done | hit
                score = beam_score[:, None] + _rounded(lw * (term + ng))
            else:
                score = beam_score[:, None] + _rounded(lw * term)
            score = jnp.broadcast_to(score, (W, k))
            ok = jnp.broadcast_to(beam_ok[:, None], (W, k))
            is_eos = tok == eos
            number = lvl * W * k + jnp.arange(W * k, dtype=jnp.int32)  # creation order: beam rank, then column
            ancestors = jnp.where(jnp.arange(d) == lvl, number.reshape(W, k, 1), beam_anc[:, None, :]).reshape(W * k, d)
            pool["score"].append(score.reshape(-1))
            pool["token"].append(tok.reshape(-1))
            pool["depth"].append(jnp.full((W * k,), lvl + 1, jnp.int32))
            pool["ok"].append(ok.reshape(-1))
            pool["ancestors"].append(ancestors)
            if lvl + 1 < d:  # the next beam: (valid, non-EOS first, higher score, lower number)
                flat_ok, flat_score = ok.reshape(-1), score.reshape(-1)
                best = _lexsort_first((number, -flat_score, is_eos.reshape(-1), ~flat_ok), W)
                if m:  # the new entries' suffixes: the root's child, then the parent's suffixes extended
                    extended = children.reshape(m, W * k)[:, best]  # [m, W]: from lengths m .. 1
                    nodes = [nodes[0], trie.root_child(tok.reshape(-1)[best])] + [extended[m - length + 1]
                                                                                  for length in range(2, m + 1)]
                beam_score, beam_ok, beam_anc = flat_score[best], flat_ok[best], ancestors[best]

    n = keep + 1
    with jax.named_scope("select"):
        score = jnp.concatenate(pool["score"])
        token = jnp.concatenate(pool["token"])
        depth = jnp.concatenate(pool["depth"])
        ok = jnp.concatenate(pool["ok"])
        number = jnp.arange(score.shape[0], dtype=jnp.int32)
        # the best `keep` of the whole pool by score alone (ties: lower number); fewer if the pool is
        # smaller. A chosen entry's ancestors are chosen too: a child scores no higher than its parent
        # (every term is a logarithm of at most 1) and comes later in the pool.
        chosen = _lexsort_first((number, -score, ~ok), min(keep, score.shape[0]))
        chosen_ok = ok[chosen]
        n_sel = chosen_ok.sum().astype(jnp.int32)
        # nodes 1..: by depth, within a depth by selection rank
        by_depth = jnp.lexsort((jnp.arange(chosen.shape[0], dtype=jnp.int32), depth[chosen], ~chosen_ok))
        order = chosen[by_depth]
        order_ok = chosen_ok[by_depth]
        pad = n - 1 - order.shape[0]
        real = jnp.concatenate([jnp.ones((1,), bool), order_ok, jnp.zeros((pad,), bool)])
        root = preceding[jnp.maximum(n_preceding - 1, 0)].astype(jnp.int32)
        tokens = jnp.where(real, jnp.concatenate([root[None], token[order], jnp.zeros((pad,), jnp.int32)]), 0)
        positions = jnp.where(real, jnp.concatenate([jnp.zeros((1,), jnp.int32), depth[order],
                                                     jnp.zeros((pad,), jnp.int32)]), 0)
    with jax.named_scope("links"):
        # each node's ancestors by depth as node indices (its own index at its depth, -1 past it;
        # the root's and padding's rows: -1): the pool numbers matched against the chosen order
        by_pool = jnp.concatenate(pool["ancestors"])[order]  # [c, d]
        match = (by_pool[:, :, None] == order[None, None, :]) & order_ok[None, None, :]
        linked = jnp.where(order_ok[:, None] & match.any(axis=2), jnp.argmax(match, axis=2).astype(jnp.int32) + 1, -1)
        ancestors = jnp.concatenate([jnp.full((1, d), -1, jnp.int32), linked, jnp.full((pad, d), -1, jnp.int32)])
        index = jnp.arange(n, dtype=jnp.int32)
        above = jnp.take_along_axis(ancestors, jnp.clip(positions - 2, 0, d - 1)[:, None], axis=1)[:, 0]
        parents = jnp.where(real & (index >= 1), jnp.where(positions >= 2, above, 0), -1)
        mask = ((index[:, None] == index[None, :]) | ((real & (index >= 1))[:, None] & (index[None, :] == 0))
                | jnp.any(ancestors[:, :, None] == index[None, None, :], axis=1))
        paths = jnp.where(ancestors >= 0, tokens[jnp.maximum(ancestors, 0)], -1)  # [n, d]
        has_child = jnp.any(parents[:, None] == index[None, :], axis=0)
        leaf = real & ~has_child & (index >= 1)
        # leaves in lexicographic order of their token paths (a prefix first: -1 pads), ties by index
        leaf_order = jnp.lexsort((index, *[paths[:, t] for t in range(d - 1, -1, -1)], ~leaf))[:n - 1]
        n_leaves = leaf.sum().astype(jnp.int32)
        row_ok = jnp.arange(n - 1) < n_leaves
        retrieve = jnp.where(row_ok[:, None], jnp.concatenate([jnp.zeros((n - 1, 1), jnp.int32),
                                                               ancestors[leaf_order]], axis=1), -1)
    return DraftTree(tokens, positions, parents, mask, retrieve, n_sel + 1, n_leaves)


def search_trees(topk_ids, topk_probs, preceding, preceding_len, trie: DeviceTrie | None,
                 settings: DeviceSearch) -> DraftTree:
    """`search_tree` for B sequences ([B, ...] inputs; fields stacked)."""
    return jax.vmap(lambda i, p, pre, n: search_tree(i, p, pre, n, trie, settings))(
        topk_ids, topk_probs, preceding, preceding_len)


class LoopStep(NamedTuple):
    """What a `TreeEdit` sees of step `i` of the device loop, for the m rows of the call: `active`
    bool[m] (rows still decoding), `n_out` int32[m] (tokens each row committed in earlier steps of
    this call), and after the commit `emitted` int32[m] (tokens it commits at this step) and
    `follow` int32[m, depth + 1] (those tokens first; zeros before the commit)."""
    i: jax.Array
    active: jax.Array
    n_out: jax.Array
    emitted: jax.Array | None = None
    follow: jax.Array | None = None


class TreeEdit:
    """A change to the searched trees of every step of `Engine.steps_on_device` before their verify.
    An instance is a static argument of the compiled loop (hashable, e.g. a frozen dataclass: one
    compiled loop per distinct edit); `inputs` is a pytree of device arrays handed to each call.
    `start` makes the edit's state (a pytree carried through the loop), `before_verify` edits the
    trees (the `tree_layout` fields, [m, ...]) and `after_commit` updates the state from what the
    step committed; `fields` are extra per-row outputs of the call (`layout.Field`s, appended to
    `device_steps_layout`) and `outputs` their values from the final state."""

    def start(self, inputs: Any, m: int, steps: int) -> Any:
        raise NotImplementedError

    def before_verify(self, tree: dict, state: Any, inputs: Any, step: LoopStep) -> tuple[dict, Any]:
        raise NotImplementedError

    def after_commit(self, state: Any, inputs: Any, step: LoopStep) -> Any:
        return state

    def fields(self, steps: int) -> tuple:
        return ()

    def outputs(self, state: Any) -> dict:
        return {}


def host_tree(tree: DraftTree) -> dict[str, Any]:
    """A device tree's fields as NumPy arrays (for comparisons and tests)."""
    return {name: np.asarray(value) for name, value in zip(DraftTree._fields, tree)}
