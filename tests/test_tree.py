"""Tree search (docs/spec.md §5) against a plain-Python restatement written here.

The oracle keeps sequences as tuples, scores in float64, the n-gram model as a dict of window
counts, and ranks with Python's sort; the kernel under test works on CSR arrays in float32.
Random inputs are drawn until no decision (beam cut, keep cut) is closer than a margin, so the
two precisions cannot disagree; exact ties are tested separately with inputs whose scores are
bit-identical in both.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from dart_jax.ngram.tree import DraftTree, TreeSettings, build_tree, build_tree_batch
from dart_jax.ngram.compressed import compress
from dart_jax.ngram.trie import Trie

MARGIN = 1e-3


# ------------------------------------------------------------------ oracle (docs/spec.md §5 in Python)


def window_counts(sequences, order):
    """freq of a path = number of windows of `order` tokens (shorter at the end) starting with it."""
    counts = {}
    for seq in sequences:
        seq = [int(t) for t in seq]
        for i in range(len(seq)):
            window = seq[i : i + order]
            for n in range(1, len(window) + 1):
                key = tuple(window[:n])
                counts[key] = counts.get(key, 0) + 1
    return counts


def ngram_p(counts, order, context, tok):
    for n in range(min(order - 1, len(context)), 0, -1):
        suffix = tuple(context[len(context) - n :])
        # a suffix counted 0 (left by a reduce) is no evidence: back off (docs/spec.md §5.2)
        if counts.get(suffix, 0) > 0 and suffix + (tok,) in counts:
            return counts[suffix + (tok,)] / counts[suffix]
    return 0.0


def oracle(ids, probs, preceding, counts, order, *, eos, beam_width, keep, ngram_weight,
           level_weight=lambda l: (l + 1) ** -0.7, logit_weight=lambda l: 0.9**l):
    """Returns the kept entries [(path, score, pool number)] in rank order and the smallest
    score gap at any cut that decided membership."""
    d, k = len(ids), len(ids[0])
    beam = [((), 0.0)]
    pool = []
    gaps = [math.inf]
    for lvl in range(d):
        row = []
        for seq, score in beam:
            history = list(preceding) + list(seq)
            context = history[max(0, len(history) - (order - 1)):] if order > 1 else []
            for j in range(k):
                inc = logit_weight(lvl) * math.log(float(probs[lvl][j]) + 1e-10)
                if counts is not None and lvl > 0 and ngram_weight > 0:
                    inc += ngram_weight * math.log(ngram_p(counts, order, context, int(ids[lvl][j])) + 1e-10)
                entry = (seq + (int(ids[lvl][j]),), score + level_weight(lvl) * inc, len(pool))
                pool.append(entry)
                row.append(entry)
        row.sort(key=lambda e: (e[0][-1] == eos, -e[1], e[2]))
        if lvl + 1 < d and len(row) > beam_width:
            a, b = row[beam_width - 1], row[beam_width]
            if (a[0][-1] == eos) == (b[0][-1] == eos):
                gaps.append(a[1] - b[1])
        beam = [(e[0], e[1]) for e in row[:beam_width]]
    pool.sort(key=lambda e: (-e[1], e[2]))
    if len(pool) > keep:
        gaps.append(pool[keep - 1][1] - pool[keep][1])
    return pool[:keep], min(gaps)


# ------------------------------------------------------------------ checks of the encoding


def node_paths(tree: DraftTree):
    n = int(tree.num_nodes)
    paths = [()]
    for i in range(1, n):
        p = int(tree.parents[i])
        assert 0 <= p < i, f"parent of node {i} is {p}: nodes must follow their parents"
        paths.append(paths[p] + (int(tree.tokens[i]),))
    return paths


def check_tree(tree: DraftTree, kept, root, *, keep, d):
    n = int(tree.num_nodes)
    assert tree.tokens.shape == (keep + 1,) and tree.tokens.dtype == np.int32
    assert tree.positions.shape == (keep + 1,) and tree.parents.shape == (keep + 1,)
    assert tree.mask.shape == (keep + 1, keep + 1) and tree.mask.dtype == np.bool_
    assert tree.retrieve.shape == (keep, d + 1) and tree.retrieve.dtype == np.int32
    assert n == len(kept) + 1

    paths = node_paths(tree)
    assert sorted(paths[1:]) == sorted(e[0] for e in kept)
    assert int(tree.tokens[0]) == root and int(tree.parents[0]) == -1
    assert [int(x) for x in tree.positions[:n]] == [len(p) for p in paths]
    assert all(np.diff(tree.positions[:n]) >= 0), "nodes must be sorted by depth"

    distinct = len(set(paths)) == len(paths)
    if distinct:  # within a depth, nodes follow the selection rank
        rank = {e[0]: r for r, e in enumerate(kept)}
        for i in range(2, n):
            if len(paths[i]) == len(paths[i - 1]):
                assert rank[paths[i]] > rank[paths[i - 1]]

    ancestors = [{0}]
    for i in range(1, n):
        ancestors.append(ancestors[int(tree.parents[i])] | {i})
    for i in range(n):
        for j in range(n):
            assert tree.mask[i, j] == (j in ancestors[i]), (i, j)
            # With distinct paths, "ancestor" is "path prefix" (independent of parents[]).
            if distinct:
                assert tree.mask[i, j] == (paths[i][: len(paths[j])] == paths[j])

    # Padding as documented.
    assert not tree.tokens[n:].any() and not tree.positions[n:].any()
    assert (tree.parents[n:] == -1).all()
    assert not tree.mask[:n, n:].any() and not tree.mask[n:, :n].any()
    assert (tree.mask[n:, n:] == np.eye(keep + 1 - n, dtype=bool)).all()

    has_child = {int(p) for p in tree.parents[1:n]}
    leaves = [i for i in range(1, n) if i not in has_child]
    if distinct:
        assert {paths[i] for i in leaves} == {
            p for p in paths[1:] if not any(q != p and q[: len(p)] == p for q in paths)
        }
    nl = int(tree.num_leaves)
    assert nl == len(leaves)
    expected_order = sorted(leaves, key=lambda i: (paths[i], i))
    for r, leaf in enumerate(expected_order):
        chain = [leaf]
        while chain[-1] != 0:
            chain.append(int(tree.parents[chain[-1]]))
        row = chain[::-1] + [-1] * (d + 1 - len(chain))
        assert tree.retrieve[r].tolist() == row
    assert (tree.retrieve[nl:] == -1).all()


# ------------------------------------------------------------------ inputs


def random_sequences(rng, vocab, n_seq, length):
    # A skewed stream so that contexts recur and the n-gram term matters.
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    return [rng.choice(vocab, size=length, p=p) for _ in range(n_seq)]


def random_topk(rng, vocab, d, k, eos, eos_rate=0.4):
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(d)])
    for lvl in range(d):
        if eos not in ids[lvl] and rng.random() < eos_rate:
            ids[lvl, rng.integers(k)] = eos
    logits = np.sort(rng.normal(scale=2.0, size=(d, k)), axis=1)[:, ::-1]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)
    return ids, probs


VOCAB = 12


@pytest.fixture(scope="module")
def corpora():
    rng = np.random.default_rng(1234)
    seqs = random_sequences(rng, VOCAB, 30, 80)
    return {order: (Trie.build(seqs, order=order), window_counts(seqs, order)) for order in (2, 3, 4)}


def draw_case(rng, corpora, *, d=None, k=None, beam_width=None, keep=None, order=None, n_pre=None):
    d = d or int(rng.integers(1, 6))
    k = k or int(rng.integers(1, 8))
    beam_width = beam_width or int(rng.integers(1, 6))
    keep = keep or int(rng.integers(1, 30))
    order = order or int(rng.choice([2, 3, 4]))
    n_pre = n_pre or int(rng.integers(1, 5))
    eos = 0
    trie, counts = corpora[order]
    while True:
        ids, probs = random_topk(rng, VOCAB, d, k, eos)
        preceding = rng.integers(0, VOCAB, size=n_pre)
        kept, gap = oracle(ids, probs, preceding, counts, order, eos=eos, beam_width=beam_width,
                           keep=keep, ngram_weight=0.5)
        if gap > MARGIN:
            return dict(ids=ids, probs=probs, preceding=preceding, trie=trie, counts=counts,
                        order=order, eos=eos, beam_width=beam_width, keep=keep, d=d, kept=kept)


# ------------------------------------------------------------------ tests


def test_random_trees_match_oracle(corpora):
    rng = np.random.default_rng(0)
    for _ in range(60):
        c = draw_case(rng, corpora)
        tree = build_tree(c["ids"], c["probs"], c["preceding"], c["trie"], eos_id=c["eos"],
                          beam_width=c["beam_width"], keep=c["keep"])
        check_tree(tree, c["kept"], int(c["preceding"][-1]), keep=c["keep"], d=c["d"])


def test_default_size_trees_match_oracle(corpora):
    rng = np.random.default_rng(1)
    vocab = 40
    seqs = random_sequences(rng, vocab, 50, 200)
    trie, counts = Trie.build(seqs, order=3), window_counts(seqs, 3)
    for _ in range(3):
        while True:
            ids, probs = random_topk(rng, vocab, 8, 25, eos=1)
            preceding = rng.integers(0, vocab, size=5)
            kept, gap = oracle(ids, probs, preceding, counts, 3, eos=1, beam_width=20, keep=60,
                               ngram_weight=0.5)
            if gap > MARGIN:
                break
        tree = build_tree(ids, probs, preceding, trie, eos_id=1)
        check_tree(tree, kept, int(preceding[-1]), keep=60, d=8)


def test_trie_without_root_table_matches_oracle(corpora):
    """A trie-like object with only ``arrays()``/``order`` takes the binary-search path for
    depth-1 lookups instead of ``Trie.root_table()``; both must give the oracle's tree."""

    class PlainTrie:
        def __init__(self, trie):
            self.order = trie.order
            self._arrays = trie.arrays()

        def arrays(self):
            return self._arrays

    rng = np.random.default_rng(5)
    for _ in range(30):
        c = draw_case(rng, corpora)
        for trie in (c["trie"], PlainTrie(c["trie"])):
            tree = build_tree(c["ids"], c["probs"], c["preceding"], trie, eos_id=c["eos"],
                              beam_width=c["beam_width"], keep=c["keep"])
            check_tree(tree, c["kept"], int(c["preceding"][-1]), keep=c["keep"], d=c["d"])


def test_ngram_term_changes_the_tree(corpora):
    """Guards against an n-gram term that is silently ignored."""
    rng = np.random.default_rng(2)
    trie, _ = corpora[3]
    differs = 0
    for _ in range(20):
        ids, probs = random_topk(rng, VOCAB, 4, 6, eos=0)
        pre = rng.integers(0, VOCAB, size=3)
        a = build_tree(ids, probs, pre, trie, eos_id=0, beam_width=3, keep=10)
        b = build_tree(ids, probs, pre, None, eos_id=0, beam_width=3, keep=10)
        differs += sorted(node_paths(a)) != sorted(node_paths(b))
    assert differs > 0


def test_weights_as_parameters(corpora):
    rng = np.random.default_rng(3)
    trie, counts = corpora[3]
    lw = [1.0, 0.3, 2.0, 0.7]
    gw = lambda l: 1.0 / (l + 1)  # noqa: E731
    checked = 0
    while checked < 10:
        ids, probs = random_topk(rng, VOCAB, 4, 5, eos=0)
        pre = rng.integers(0, VOCAB, size=3)
        kept, gap = oracle(ids, probs, pre, counts, 3, eos=0, beam_width=3, keep=12, ngram_weight=1.5,
                           level_weight=lambda l: lw[l], logit_weight=gw)
        if gap <= MARGIN:
            continue
        tree = build_tree(ids, probs, pre, trie, eos_id=0, beam_width=3, keep=12, ngram_weight=1.5,
                          level_weight=lw, logit_weight=gw)
        check_tree(tree, kept, int(pre[-1]), keep=12, d=4)
        checked += 1


def test_ties_broken_by_pool_number(corpora):
    """Uniform probabilities and no n-gram term: every entry of a row has the same score, so
    the tree is decided by the documented tie rule alone."""
    rng = np.random.default_rng(4)
    for _ in range(10):
        d, k = int(rng.integers(1, 5)), int(rng.integers(2, 7))
        ids = np.stack([rng.choice(VOCAB, size=k, replace=False) for _ in range(d)])
        ids[0, -1] = 0
        probs = np.full((d, k), 1.0 / k, np.float32)
        pre = rng.integers(0, VOCAB, size=2)
        kept, _ = oracle(ids, probs, pre, None, 3, eos=0, beam_width=3, keep=9, ngram_weight=0.5)
        tree = build_tree(ids, probs, pre, None, eos_id=0, beam_width=3, keep=9)
        check_tree(tree, kept, int(pre[-1]), keep=9, d=d)
        again = build_tree(ids, probs, pre, None, eos_id=0, beam_width=3, keep=9)
        for x, y in zip(tree, again):
            np.testing.assert_array_equal(x, y)


def test_keep_larger_than_pool(corpora):
    rng = np.random.default_rng(5)
    c = draw_case(rng, corpora, d=3, k=3, beam_width=2, keep=40)
    tree = build_tree(c["ids"], c["probs"], c["preceding"], c["trie"], eos_id=0, beam_width=2, keep=40)
    assert int(tree.num_nodes) == 1 + 3 + 2 * 3 + 2 * 3
    check_tree(tree, c["kept"], int(c["preceding"][-1]), keep=40, d=3)


def test_all_candidates_eos(corpora):
    """EOS entries still fill the beam (after any others) and are extended."""
    rng = np.random.default_rng(6)
    trie, counts = corpora[3]
    for k in (1, 3):
        ids = np.zeros((4, k), np.int64)
        _, probs = random_topk(rng, VOCAB, 4, k, eos=0)
        kept, _ = oracle(ids, probs, [5, 6], counts, 3, eos=0, beam_width=2, keep=20, ngram_weight=0.5)
        tree = build_tree(ids, probs, [5, 6], trie, eos_id=0, beam_width=2, keep=20)
        check_tree(tree, kept, 6, keep=20, d=4)
        assert int(tree.positions[: int(tree.num_nodes)].max()) == 4


def test_eos_ranked_last_in_beam(corpora):
    """The most probable candidate of row 0 is EOS; with beam 1 the search continues from
    the best non-EOS candidate."""
    ids = np.array([[0, 3, 4], [5, 6, 7]])
    probs = np.array([[0.9, 0.06, 0.04], [0.5, 0.3, 0.2]], np.float32)
    tree = build_tree(ids, probs, [1], None, eos_id=0, beam_width=1, keep=10)
    paths = node_paths(tree)
    assert (0,) in paths and (3, 5) in paths and not any(p[:1] == (0,) and len(p) > 1 for p in paths)
    tree = build_tree(ids, probs, [1], None, eos_id=None, beam_width=1, keep=10)
    assert (0, 5) in node_paths(tree)


def test_single_row(corpora):
    rng = np.random.default_rng(7)
    for _ in range(5):
        c = draw_case(rng, corpora, d=1)
        tree = build_tree(c["ids"], c["probs"], c["preceding"], c["trie"], eos_id=0,
                          beam_width=c["beam_width"], keep=c["keep"])
        check_tree(tree, c["kept"], int(c["preceding"][-1]), keep=c["keep"], d=1)
        assert int(tree.num_leaves) == int(tree.num_nodes) - 1


def test_preceding_shorter_than_context(corpora):
    rng = np.random.default_rng(8)
    for _ in range(10):
        c = draw_case(rng, corpora, order=4, n_pre=1, d=4)
        tree = build_tree(c["ids"], c["probs"], c["preceding"], c["trie"], eos_id=0,
                          beam_width=c["beam_width"], keep=c["keep"])
        check_tree(tree, c["kept"], int(c["preceding"][-1]), keep=c["keep"], d=4)


def test_ngram_weight_zero_and_no_trie(corpora):
    rng = np.random.default_rng(9)
    trie, _ = corpora[3]
    for _ in range(10):
        ids, probs = random_topk(rng, VOCAB, 4, 6, eos=0)
        pre = rng.integers(0, VOCAB, size=3)
        kept, gap = oracle(ids, probs, pre, None, 3, eos=0, beam_width=3, keep=15, ngram_weight=0.0)
        if gap <= MARGIN:
            continue
        for t in (build_tree(ids, probs, pre, trie, eos_id=0, beam_width=3, keep=15, ngram_weight=0.0),
                  build_tree(ids, probs, pre, None, eos_id=0, beam_width=3, keep=15)):
            check_tree(t, kept, int(pre[-1]), keep=15, d=4)


def test_batch_equals_single_calls(corpora):
    rng = np.random.default_rng(10)
    trie, _ = corpora[3]
    bsz, d, k, P = 5, 4, 6, 6
    ids = np.zeros((bsz, d, k), np.int64)
    probs = np.zeros((bsz, d, k), np.float32)
    for b in range(bsz):
        ids[b], probs[b] = random_topk(rng, VOCAB, d, k, eos=0)
    pre = rng.integers(0, VOCAB, size=(bsz, P))
    lens = np.array([1, 6, 3, 2, 5])
    batch = build_tree_batch(ids, probs, pre, trie, eos_id=0, preceding_len=lens, beam_width=4, keep=17)
    assert batch.num_nodes.shape == (bsz,) and batch.mask.shape == (bsz, 18, 18)
    for b in range(bsz):
        single = build_tree(ids[b], probs[b], pre[b, : lens[b]], trie, eos_id=0, beam_width=4, keep=17)
        for name, x, y in zip(DraftTree._fields, batch, single):
            np.testing.assert_array_equal(x[b], y, err_msg=name)


def test_tree_settings_search_one_and_many_sequences_like_the_oracle(corpora):
    """TreeSettings.search (single kernel for one sequence, threads for several) gives each
    sequence the tree of the plain-Python oracle."""
    rng = np.random.default_rng(11)
    cases = [draw_case(rng, corpora, d=3, k=5, beam_width=3, keep=9, order=3, n_pre=3) for _ in range(3)]
    settings = TreeSettings(keep=9, beam_width=3, topk=5)
    for group in (cases[:1], cases):
        tree = settings.search(np.stack([c["ids"] for c in group]), np.stack([c["probs"] for c in group]),
                               np.stack([c["preceding"] for c in group]), np.full(len(group), 3), group[0]["trie"],
                               eos_id=0)
        assert tree.tokens.shape == (len(group), 10)
        for b, c in enumerate(group):
            check_tree(DraftTree(*(np.asarray(f)[b] for f in tree)), c["kept"], c["preceding"][-1], keep=9, d=3)


def test_tree_settings_are_checked():
    with pytest.raises(ValueError, match="keep"):
        TreeSettings(keep=0)
    with pytest.raises(ValueError, match="draft_rows"):
        TreeSettings(draft_rows=9).check_fits(rows=8, draft_vocab=100)
    with pytest.raises(ValueError, match="topk"):
        TreeSettings(topk=200).check_fits(rows=8, draft_vocab=100)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(topk_ids=np.zeros((2, 3), np.int64), topk_probs=np.zeros((2, 4), np.float32)), "same non-empty shape"),
        (dict(preceding_ids=[]), "non-empty"),
        (dict(topk_probs=np.full((2, 3), np.nan, np.float32)), "finite and non-negative"),
        (dict(topk_ids=np.full((2, 3), -1)), r"\[0, 2\*\*31\)"),
        (dict(keep=0), "keep"),
        (dict(beam_width=0), "beam_width"),
        (dict(ngram_weight=-1.0), "ngram_weight"),
        (dict(level_weight=[1.0]), "level_weight"),
        (dict(logit_weight=lambda l: -1.0), "logit_weight"),
        (dict(preceding_ids=[1, -2]), "preceding_ids"),
        (dict(topk_ids=np.ones((2, 3)) * 0.5), "integer token ids"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(topk_ids=np.arange(6).reshape(2, 3), topk_probs=np.full((2, 3), 1 / 3, np.float32),
                preceding_ids=[1, 2], trie=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build_tree(args.pop("topk_ids"), args.pop("topk_probs"), args.pop("preceding_ids"), args.pop("trie"),
                   eos_id=0, **args)


def test_batch_bad_preceding_len():
    ids = np.zeros((2, 2, 3), np.int64)
    probs = np.full((2, 2, 3), 1 / 3, np.float32)
    with pytest.raises(ValueError, match="preceding_len"):
        build_tree_batch(ids, probs, np.ones((2, 4), np.int64), None, eos_id=0, preceding_len=[0, 4])


# ------------------------------------------------------------------ counts reduced to 0 (issue 27)


def reduce_counts(counts, threshold):
    """docs/spec.md §5.3 on a path -> freq dict: a child counted under `threshold` goes with its
    subtree; each kept path loses what was dropped below it (a kept child's own loss included)."""
    children = {}
    for path in counts:
        children.setdefault(path[:-1], []).append(path)

    def loss(path):  # freq dropped below `path`
        return sum(counts[c] if counts[c] < threshold else loss(c) for c in children.get(path, ()))
    out = {}

    def keep(path):
        for c in children.get(path, ()):
            if counts[c] >= threshold:
                out[c] = counts[c] - loss(c)
                keep(c)
    keep(())
    return out


@pytest.mark.parametrize("order", [3, 4])
def test_counts_reduced_to_zero_are_a_miss_in_lookups_and_trees(order, tmp_path):
    """A reduce leaves kept paths counted 0 (every window through them went on to dropped
    children). 0/0 must be no evidence (back off; docs/spec.md §5.2), never P = 1 or NaN:
    probabilities and trees against the plain-Python restatement above on such a trie."""
    rng = np.random.default_rng(order)
    vocab, a, b = 12, 50, 51  # `a` and `b` only in the planted sequences
    seqs = random_sequences(rng, vocab, 20, 60)
    # `a b` then a different rare id each time: `a`, `a b` (and `b`) keep only mass that is dropped
    seqs += [np.array([a, b, 100 + i, *rng.integers(0, vocab, size=order)]) for i in range(6)]
    threshold = 3
    counts = reduce_counts(window_counts(seqs, order), threshold)
    trie = Trie.build(seqs, order=order).reduce(threshold)
    token, freq, child_start = trie.arrays()
    paths, got = {0: ()}, {}
    for i in range(trie.num_nodes):
        for c in range(child_start[i], child_start[i + 1]):
            paths[c] = paths[i] + (int(token[c]),)
            got[paths[c]] = int(freq[c])
    assert got == counts  # the restatement of reduce is the trie's
    tokens = sorted({t for path in counts for t in path})
    zero_parents = [p for p, f in counts.items() if f == 0 and any(counts.get(p + (t,), 1) == 0 for t in tokens)]
    assert zero_parents, "the corpus must leave a 0/0 lookup"
    assert counts[(a,)] == 0 and counts[(a, b)] == 0

    # lookups: every context of up to order-1 ids over the corpus's vocabulary, every candidate
    cands = np.array(tokens)
    contexts = [list(p) for p in counts if len(p) < order] + [[int(x) for x in rng.integers(0, vocab, size=order)]
                                                                 for _ in range(40)]
    packed = compress(trie, tmp_path / "reduced.ctrie")  # the compressed format's own lookup
    for context in contexts:
        want = [ngram_p(counts, order, context, int(t)) for t in cands]
        for each in (trie, packed):
            p, _ = each.probability(context, cands)
            assert np.isfinite(p).all() and np.allclose(p, want, rtol=1e-6, atol=0), (context, p, want)
    p, length = trie.probability([a], [b])
    assert p[0] == 0.0 and length[0] == 0  # `a` counted 0: no evidence for `b` after it

    # tree search on contexts that end in zero-count paths, against the oracle
    checked = 0
    for _ in range(200):
        d, k, beam_width, keep = int(rng.integers(2, 5)), int(rng.integers(2, 7)), int(rng.integers(1, 5)), int(rng.integers(3, 25))
        start = zero_parents[int(rng.integers(len(zero_parents)))]
        preceding = np.array([*rng.integers(0, vocab, size=int(rng.integers(0, 3))), *start])
        ids, probs = random_topk(rng, vocab, d, k, eos=0)
        ids[1, 0] = next(t for t in tokens if counts.get(start + (t,), 1) == 0)  # a 0/0 candidate in row 1
        if len(set(ids[1].tolist())) < k:
            continue
        kept, gap = oracle(ids, probs, preceding, counts, order, eos=0, beam_width=beam_width, keep=keep,
                           ngram_weight=0.5)
        if gap <= MARGIN:
            continue
        for each in (trie, packed):
            tree = build_tree(ids, probs, preceding, each, eos_id=0, beam_width=beam_width, keep=keep)
            check_tree(tree, kept, int(preceding[-1]), keep=keep, d=d)
        checked += 1
    assert checked >= 50
