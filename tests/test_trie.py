"""N-gram trie against a plain-Python restatement of docs/spec.md §5 and a docs/spec.md §6 file writer."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest

from dart_jax.errors import FileFormatError
from dart_jax.ngram.__main__ import main as cli
from dart_jax.ngram.trie import Trie, ngram_probs, ngram_probs_batch

DEMO_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "dart_jax", "demo", "base")


# -- oracles (docs/spec.md §5 restated with dicts) ---------------------------------------------------
def oracle_counts(seqs, order):
    """{path tuple: freq}: every window of `order` tokens (cut at the sequence end) adds 1 to
    each of its prefixes, the empty one (root) included."""
    counts = Counter()
    for seq in seqs:
        seq = [int(t) for t in seq]
        for s in range(len(seq)):
            window = tuple(seq[s : s + order])
            for k in range(len(window) + 1):
                counts[window[:k]] += 1
    if () not in counts:
        counts[()] = 0
    return dict(counts)


@np.errstate(divide="ignore", invalid="ignore")  # a reduced context may have freq 0: inf/nan
def oracle_probability(counts, order, context, tokens):
    probs = [np.float32(0.0)] * len(tokens)
    lens = [0] * len(tokens)
    context = [int(t) for t in context]
    for length in range(min(order - 1, len(context)), 0, -1):
        ctx = tuple(context[len(context) - length :])
        if not counts.get(ctx):  # not a path, or counted 0 by a reduce: no evidence (docs/spec.md §5.2)
            continue
        inv = np.float32(1.0) / np.float32(counts[ctx])
        for i, t in enumerate(tokens):
            if lens[i] == 0 and ctx + (int(t),) in counts:
                probs[i] = np.float32(counts[ctx + (int(t),)]) * inv
                lens[i] = length
    return np.array(probs, np.float32), np.array(lens, np.int64)


def oracle_reduce(counts, threshold):
    """The reference's recursive reduce over a path dict (root keeps freq - dropped mass)."""
    children = defaultdict(list)
    for path in counts:
        if path:
            children[path[:-1]].append(path)
    out = {}

    def visit(path):
        dropped = 0
        for child in children[path]:
            if counts[child] >= threshold:
                out[child] = counts[child]
                dropped += visit(child)
            else:
                dropped += counts[child]
        out[path] -= dropped
        return dropped

    out[()] = counts[()]
    visit(())
    return out


def trie_to_dict(trie):
    token, freq, child_start = trie.arrays()
    out = {(): int(freq[0])}
    paths = {0: ()}
    for i in range(trie.num_nodes):
        for c in range(child_start[i], child_start[i + 1]):
            paths[c] = paths[i] + (int(token[c]),)
            out[paths[c]] = int(freq[c])
    assert len(paths) == trie.num_nodes
    return out


# -- corpora ---------------------------------------------------------------------------------
def random_corpus(rng, n_seqs=40, vocab=12, max_len=30):
    return [rng.integers(0, vocab, rng.integers(0, max_len)).tolist() for _ in range(n_seqs)]


def zipf_corpus(rng, n_seqs=60, vocab=500, eos=499):
    """Zipf tokens with phrases repeated across sequences, each sequence ending in EOS."""
    phrases = [rng.zipf(1.3, rng.integers(2, 7)) % vocab for _ in range(15)]
    seqs = []
    for _ in range(n_seqs):
        parts = []
        for _ in range(rng.integers(1, 8)):
            if rng.random() < 0.5:
                parts.append(phrases[rng.integers(len(phrases))])
            else:
                parts.append(rng.zipf(1.2, rng.integers(1, 10)) % (vocab - 1))
        seqs.append(np.concatenate(parts + [[eos]]).astype(np.int64).tolist())
    return seqs


CORPORA = {
    "random": lambda rng: random_corpus(rng),
    "zipf": lambda rng: zipf_corpus(rng),
    "tiny": lambda rng: [[1, 2, 3, 2, 2, 1, 3, 2, 3, 1, 2]],
}


# -- a writer of the reference format (docs/spec.md §6) -------------------------------------------------
def write_reference(path, counts, order, rng, *, tamper=None):
    """Node ids: root 0, the rest a random permutation (not breadth-first); children shuffled."""
    paths = sorted(counts, key=len)
    ids = {(): 0}
    for p, i in zip(paths[1:], rng.permutation(len(paths) - 1) + 1):
        ids[p] = int(i)
    by_id = {i: p for p, i in ids.items()}
    children = defaultdict(list)
    for p in paths[1:]:
        children[p[:-1]].append(p)
    records = []
    for i in range(len(paths)):
        p = by_id[i]
        kids = [children[p][j] for j in rng.permutation(len(children[p]))]
        rec = dict(token=p[-1] if p else 0, parent=ids[p[:-1]] if p else 0, freq=counts[p],
                   kids=[(k[-1], ids[k]) for k in kids])
        records.append(rec)
    if tamper:
        tamper(records)
    with open(path, "wb") as f:
        f.write(struct.pack("<QQ", order, len(records)))
        for r in records:
            f.write(struct.pack("<iQiQ", r["token"], r["parent"], r["freq"], len(r["kids"])))
            for tok, cid in r["kids"]:
                f.write(struct.pack("<iQ", tok, cid))


# -- building ----------------------------------------------------------------------------------
@pytest.mark.parametrize("corpus", sorted(CORPORA))
@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_build_matches_oracle_counts(corpus, order):
    seqs = CORPORA[corpus](np.random.default_rng(order))
    trie = Trie.build(seqs, order=order)
    trie.check()
    assert trie.order == order
    assert trie_to_dict(trie) == oracle_counts(seqs, order)
    token, freq, cs = trie.arrays()
    assert (token.dtype, freq.dtype, cs.dtype) == (np.int32, np.int32, np.int64)
    assert trie.nbytes <= 16 * trie.num_nodes + 8


def test_build_wide_tokens_uses_unpacked_path():
    # 4 tokens of 31 bits do not fit a 64-bit key: the lexsort path must agree with the oracle
    rng = np.random.default_rng(0)
    seqs = [(rng.integers(0, 4, 20) * 600_000_000).tolist() for _ in range(10)]
    trie = Trie.build(seqs, order=4)
    trie.check()
    assert trie_to_dict(trie) == oracle_counts(seqs, 4)


def test_chunked_build_and_merge_equal_single_build():
    rng = np.random.default_rng(1)
    a, b = zipf_corpus(rng), zipf_corpus(rng)
    whole = Trie.build(a + b)
    chunked = Trie.build(a + b, chunk_tokens=50)
    merged = Trie.build(a).merge(Trie.build(b))
    for other in (chunked, merged):
        other.check()
        for x, y in zip(whole.arrays(), other.arrays()):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="order"):
        whole.merge(Trie.build(a, order=2))


@pytest.mark.parametrize("bad, match", [
    ([[1, -2, 3]], "outside"),
    ([[1, 2**31]], "outside"),
    ([[[1, 2], [3, 4]]], "1-D"),
    ([[1.5, 2.0]], "integer"),
])
def test_build_rejects_bad_ids(bad, match):
    with pytest.raises(ValueError, match=match):
        Trie.build(bad)
    with pytest.raises(ValueError, match="order"):
        Trie.build([[1, 2]], order=0)
    with pytest.raises(ValueError, match="list of sequences"):
        Trie.build([1, 2, 3])
    with pytest.raises(ValueError, match="threshold"):
        Trie.build([[1, 2]]).reduce(2.5)


# -- probability -------------------------------------------------------------------------------
@pytest.mark.parametrize("corpus", ["random", "zipf", "tiny"])
@pytest.mark.parametrize("order", [2, 3, 4])
def test_probability_matches_oracle(corpus, order):
    rng = np.random.default_rng(7)
    seqs = CORPORA[corpus](rng)
    trie = Trie.build(seqs, order=order)
    counts = oracle_counts(seqs, order)
    vocab = max(max(s) for s in seqs if s) + 3
    contexts = [[], [int(rng.integers(vocab))]]
    for s in seqs[:20]:
        if len(s) > 2:
            i = int(rng.integers(1, len(s)))
            contexts.append(s[max(0, i - int(rng.integers(1, 6))) : i])
    contexts += [rng.integers(0, vocab, int(rng.integers(1, 5))).tolist() for _ in range(10)]
    for ctx in contexts:
        cands = rng.integers(0, vocab, 25).tolist()
        p, m = trie.probability(ctx, cands)
        ep, em = oracle_probability(counts, order, ctx, cands)
        np.testing.assert_array_equal(m, em)
        np.testing.assert_array_equal(p.view(np.uint32), ep.view(np.uint32))
    hits = sum(int((trie.probability(c, np.arange(vocab))[1] > 0).sum()) for c in contexts)
    assert hits > 0


def test_kernel_callable_from_numba_and_batch_form():
    from numba import njit

    seqs = zipf_corpus(np.random.default_rng(3))
    trie = Trie.build(seqs)

    @njit
    def query_all(token, freq, cs, order, ctxs, cands, out_p, out_len):
        for b in range(ctxs.shape[0]):
            ngram_probs(token, freq, cs, order, ctxs[b], cands[b], out_p[b], out_len[b])

    rng = np.random.default_rng(0)
    long = [s for s in seqs if len(s) >= 3]
    ctxs = np.array([s[:2] for s in long], np.int64)
    cands = rng.integers(0, 500, (len(ctxs), 25)).astype(np.int64)
    cands[:, 0] = [s[2] for s in long]
    p1 = np.empty(cands.shape, np.float32)
    l1 = np.empty(cands.shape, np.int64)
    query_all(*trie.arrays(), trie.order, ctxs, cands, p1, l1)
    p2 = np.empty_like(p1)
    l2 = np.empty_like(l1)
    lens = rng.integers(0, 3, len(ctxs))
    ngram_probs_batch(*trie.arrays(), trie.order, ctxs, lens, cands, p2, l2)
    for b in range(len(ctxs)):
        ep, el = trie.probability(ctxs[b], cands[b])
        np.testing.assert_array_equal((p1[b], l1[b]), (ep, el))
        ep, el = trie.probability(ctxs[b, : lens[b]], cands[b])
        np.testing.assert_array_equal((p2[b], l2[b]), (ep, el))
    assert (l1[:, 0] > 0).all()


def test_root_table_and_lockstep_search_match_binary_search():
    from numba import njit

    from dart_jax.ngram._query import build_root_table, find_child, find_children

    seqs = zipf_corpus(np.random.default_rng(11))
    trie = Trie.build(seqs)
    token, freq, cs = trie.arrays()
    table = trie.root_table()
    kids = {int(token[c]): c for c in range(cs[0], cs[1])}  # the root's children, read directly
    assert table.dtype == np.int32 and table.shape[0] == max(kids) + 1
    assert {t: int(n) for t, n in enumerate(table) if n >= 0} == kids
    assert trie.root_table() is table and not table.flags.writeable
    assert build_root_table(token[:1], cs[:2]).shape[0] == 0  # no valid children range

    @njit
    def both(token, cs, node, cands):
        one = np.array([find_child(token, cs, token.shape[0], node, t) for t in cands])
        many = np.empty(cands.shape[0], np.int64)
        find_children(token, cs, token.shape[0], node, cands, many, cands.shape[0])
        return one, many

    rng = np.random.default_rng(1)
    for node in list(range(0, trie.num_nodes, 37)) + [trie.num_nodes - 1]:
        cands = rng.integers(0, 502, 25)
        cands[:3] = token[cs[node] : cs[node] + 3] if cs[node + 1] - cs[node] >= 3 else cands[:3]
        one, many = both(token, cs, node, cands)
        np.testing.assert_array_equal(one, many)

    @njit
    def query(token, freq, cs, order, ctxs, cands, root, use_root):
        p = np.empty(cands.shape, np.float32)
        n = np.empty(cands.shape, np.int64)
        for b in range(ctxs.shape[0]):
            if use_root:
                ngram_probs(token, freq, cs, order, ctxs[b], cands[b], p[b], n[b], root)
            else:
                ngram_probs(token, freq, cs, order, ctxs[b], cands[b], p[b], n[b])
        return p, n

    ctxs = np.array([s[:2] for s in seqs if len(s) >= 3] + [[600, 1], [1, 600]], np.int64)
    cands = rng.integers(0, 510, (len(ctxs), 25))
    with_table = query(token, freq, cs, trie.order, ctxs, cands, table, True)
    without = query(token, freq, cs, trie.order, ctxs, cands, table, False)
    np.testing.assert_array_equal(with_table[0].view(np.uint32), without[0].view(np.uint32))
    np.testing.assert_array_equal(with_table[1], without[1])
    assert (with_table[1] > 0).any()


def test_probability_rejects_bad_ids():
    trie = Trie.build([[1, 2, 3]])
    with pytest.raises(ValueError, match="outside"):
        trie.probability([1, -1], [2])
    with pytest.raises(ValueError, match="1-D"):
        trie.probability([[1]], [2])


# -- reduce ------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 5, 50])
def test_reduce_matches_reference_recursion(threshold):
    seqs = zipf_corpus(np.random.default_rng(11))
    trie = Trie.build(seqs)
    reduced = trie.reduce(threshold)
    reduced.check()
    counts = oracle_counts(seqs, 3)
    assert trie_to_dict(reduced) == oracle_reduce(counts, threshold)
    assert trie_to_dict(trie) == counts  # the original is left unchanged
    ctx, cands = seqs[0][:2], list(range(500))
    np.testing.assert_array_equal(
        reduced.probability(ctx, cands), oracle_probability(oracle_reduce(counts, threshold), 3, ctx, cands)
    )


# -- own file format ---------------------------------------------------------------------------
def test_save_load_round_trip_is_memory_mapped(tmp_path):
    trie = Trie.build(zipf_corpus(np.random.default_rng(2)))
    path = tmp_path / "t.trie"
    trie.save(path)
    loaded = Trie.load(path, verify=True)
    assert loaded.order == trie.order and loaded.num_nodes == trie.num_nodes
    for x, y in zip(trie.arrays(), loaded.arrays()):
        np.testing.assert_array_equal(x, y)
        assert not y.flags.owndata and not y.flags.writeable  # a view of the mapped file
    assert os.path.getsize(path) <= 16 * trie.num_nodes + 256
    assert not os.path.exists(str(path) + ".tmp")
    np.testing.assert_array_equal(loaded.probability([5, 7], range(100)), trie.probability([5, 7], range(100)))


def _corrupt(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_load_rejects_bad_files(tmp_path):
    trie = Trie.build(zipf_corpus(np.random.default_rng(4)))
    good = tmp_path / "good.trie"
    trie.save(good)
    raw = good.read_bytes()
    n = trie.num_nodes

    def variant(name, data):
        p = tmp_path / name
        p.write_bytes(data)
        return p

    cases = [
        (variant("truncated", raw[:-9]), "truncated"),
        (variant("extra", raw + b"\0"), "extra data"),
        (variant("header_only", raw[:40]), "truncated"),
        (variant("empty", b""), "not a dart_jax trie"),
        (variant("text", b"hello world, this is not a trie at all" * 3), "not a dart_jax trie"),
        (variant("version", raw[:8] + struct.pack("<I", 99) + raw[12:]), "version 99"),
        (variant("offsets", raw[:40] + struct.pack("<Q", 12345) + raw[48:]), "offsets"),
        (variant("nodes", raw[:24] + struct.pack("<Q", n + 1) + raw[32:]), "corrupted header|offsets"),
    ]
    for path, match in cases:
        with pytest.raises(ValueError, match=match):
            Trie.load(path)
    with pytest.raises(FileNotFoundError):
        Trie.load(tmp_path / "missing.trie")

    ref = tmp_path / "ref.trie"
    write_reference(ref, oracle_counts([[1, 2, 3]], 3), 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="reference"):
        Trie.load(ref)


def test_corrupted_arrays_never_crash(tmp_path):
    trie = Trie.build(zipf_corpus(np.random.default_rng(5)))
    path = tmp_path / "c.trie"
    trie.save(path)
    _, _, cs_off = struct.unpack_from("<QQQ", path.read_bytes(), 32)
    rng = np.random.default_rng(0)
    garbage = rng.integers(-(2**62), 2**62, 40).astype("<i8")
    _corrupt(path, cs_off + 8 * 3, garbage.tobytes())
    for verify in (False, True):  # every load checks the children table
        with pytest.raises(FileFormatError, match=r"c\.trie: corrupted trie: .*child_start"):
            Trie.load(path, verify=verify)
    # arrays handed to the constructor are not checked: lookups still stay in bounds
    token, freq, child_start = (np.array(a) for a in trie.arrays())
    child_start[3:43] = garbage
    damaged = Trie(token, freq, child_start, trie.order)
    with pytest.raises(ValueError, match="Corrupted trie"):
        damaged.check()
    for _ in range(50):
        damaged.probability(rng.integers(0, 500, 2), rng.integers(0, 500, 25))
        damaged.continuations(rng.integers(0, 500, 2))
    with pytest.raises(ValueError):
        damaged.reduce(2).check()


# -- reference format --------------------------------------------------------------------------
@pytest.mark.parametrize("corpus", ["random", "zipf", "tiny"])
@pytest.mark.parametrize("to_file", [False, True])
def test_from_reference_matches_counts(tmp_path, corpus, to_file):
    rng = np.random.default_rng(9)
    seqs = CORPORA[corpus](rng)
    counts = oracle_counts(seqs, 3)
    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, 3, rng)
    out = tmp_path / "ours.trie" if to_file else None
    trie = Trie.from_reference(ref, out, chunk_bytes=64, progress=False)
    trie.check()
    assert trie.order == 3
    assert trie_to_dict(trie) == counts
    for x, y in zip(Trie.build(seqs).arrays(), trie.arrays()):
        np.testing.assert_array_equal(x, y)
    if to_file:
        assert not trie.arrays()[0].flags.writeable
        assert sorted(os.listdir(tmp_path)) == ["ours.trie", "ref.trie"]


def _tampered(tmp_path, tamper, counts=None):
    counts = counts or oracle_counts([[1, 2, 3, 1, 2, 4, 2, 3]], 3)
    path = tmp_path / "bad.trie"
    write_reference(path, counts, 3, np.random.default_rng(0), tamper=tamper)
    return path


def _set(i, key, value):
    def tamper(records):
        records[i][key] = value
    return tamper


def _set_kid(i, j, value):
    def tamper(records):
        kids = records[i]["kids"]
        kids[j] = value(kids[j], records)
    return tamper


def _detach_into_itself(records):
    """Move a child of the root under itself: still n-1 links, but a cycle the root cannot reach."""
    tok, cid = records[0]["kids"].pop()
    records[cid]["kids"].append((tok, cid))


REFERENCE_DAMAGE = {
    "child id past the end": (_set_kid(0, 0, lambda k, r: (k[0], len(r))), "child id"),
    "child id 0 (the root)": (_set_kid(0, 0, lambda k, r: (k[0], 0)), "child id"),
    "huge child id": (_set_kid(0, 0, lambda k, r: (k[0], 2**64 - 1)), "child id"),
    "parent past the end": (_set(3, "parent", 10**12), "parent id"),
    "child listed twice": (_set_kid(0, 1, lambda k, r: (k[0], r[0]["kids"][0][1])), "twice"),
    "token disagrees": (_set_kid(0, 0, lambda k, r: (k[0] + 100, k[1])), "token"),
    "too many children": (lambda r: r[0]["kids"].extend([(7, 1)] * 30), "children"),
    "a missing link": (lambda r: r[0]["kids"].pop(), "child links"),
    "a cycle": (_detach_into_itself, "cycle"),
}


@pytest.mark.parametrize("case", sorted(REFERENCE_DAMAGE))
def test_from_reference_rejects_corrupted_files(tmp_path, case):
    tamper, match = REFERENCE_DAMAGE[case]
    path = _tampered(tmp_path, tamper)
    with pytest.raises(ValueError, match=match):
        Trie.from_reference(path, progress=False)
    with pytest.raises(ValueError, match=match):
        Trie.from_reference(path, tmp_path / "out.trie", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["bad.trie"]  # no output, no scratch files left


def test_from_reference_rejects_truncated_and_foreign_files(tmp_path):
    good = _tampered(tmp_path, None)
    raw = good.read_bytes()
    for cut in [0, 7, 16, 17, 40, len(raw) // 2, len(raw) - 1]:
        p = tmp_path / f"cut{cut}.trie"
        p.write_bytes(raw[:cut])
        with pytest.raises(ValueError, match="truncated|too short|nodes but"):
            Trie.from_reference(p, chunk_bytes=16, progress=False)
    extra = tmp_path / "extra.trie"
    extra.write_bytes(raw + b"\0" * 5)
    with pytest.raises(ValueError, match="after its last node"):
        Trie.from_reference(extra, progress=False)
    ours = tmp_path / "ours.trie"
    Trie.build([[1, 2]]).save(ours)
    with pytest.raises(ValueError, match="already a dart_jax trie"):
        Trie.from_reference(ours, progress=False)
    deep = tmp_path / "deep.trie"
    write_reference(deep, oracle_counts([[1, 2, 3, 4]], 3), 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="longer than its order 2"):
        Trie.from_reference(deep, progress=False)
    text = tmp_path / "text.trie"
    text.write_bytes(b"this is a text file, not a trie " * 4)
    with pytest.raises(ValueError, match="does not look like"):
        Trie.from_reference(text, progress=False)
    with pytest.raises(FileNotFoundError):
        Trie.from_reference(tmp_path / "missing.trie", progress=False)


# -- command line ------------------------------------------------------------------------------
def test_cli_build_info_query_convert_merge_reduce(tmp_path, capsys):
    rng = np.random.default_rng(6)
    seqs = zipf_corpus(rng)
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(s if i % 2 else {"input_ids": s}) for i, s in enumerate(seqs)))
    npy = tmp_path / "more.npy"
    np.save(npy, np.array([[1, 2, 3, 4], [4, 3, 2, 1]]))
    out = tmp_path / "t.trie"
    assert cli(["build", str(data), str(npy), "-o", str(out), "--eos", "499"]) == 0
    expected = [s + [499] for s in seqs] + [[1, 2, 3, 4, 499], [4, 3, 2, 1, 499]]
    assert trie_to_dict(Trie.load(out)) == oracle_counts(expected, 3)

    capsys.readouterr()
    assert cli(["info", str(out), "--verify", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_nodes"] == len(oracle_counts(expected, 3)) and info["bytes_per_node"] <= 16 + 256 / info["num_nodes"]

    ctx = expected[0][:2]
    assert cli(["query", str(out), "--context", ",".join(map(str, ctx)), "--json", "--top", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    counts = oracle_counts(expected, 3)
    follow = sorted(((-c, p[-1]) for p, c in counts.items() if len(p) == 3 and list(p[:2]) == ctx))[:3]
    assert [r["token"] for r in rows] == [t for _, t in follow]
    assert [r["prob"] for r in rows] == [float(x) for x in oracle_probability(counts, 3, ctx, [t for _, t in follow])[0]]

    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, 3, rng)
    conv = tmp_path / "conv.trie"
    assert cli(["convert", str(ref), str(conv)]) == 0
    assert trie_to_dict(Trie.load(conv)) == counts
    merged = tmp_path / "m.trie"
    assert cli(["merge", str(merged), str(out), str(conv)]) == 0
    assert trie_to_dict(Trie.load(merged)) == oracle_counts(expected + expected, 3)
    reduced = tmp_path / "r.trie"
    assert cli(["reduce", str(out), str(reduced), "--threshold", "3"]) == 0
    assert trie_to_dict(Trie.load(reduced)) == oracle_reduce(counts, 3)

    assert cli(["info", str(ref)]) == 2
    assert "reference" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n')
    assert cli(["build", str(bad), "-o", str(tmp_path / "x.trie")]) == 2
    assert "text-key" in capsys.readouterr().err


def test_cli_build_text_with_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    lines = ["the draft model proposes tokens", "the target model checks the draft tokens"]
    data = tmp_path / "corpus.jsonl"
    data.write_text("\n".join(json.dumps({"text": t}) for t in lines))
    out = tmp_path / "t.trie"
    assert cli(["build", str(data), "-o", str(out), "--tokenizer", DEMO_TOKENIZER]) == 0
    seqs = [tok.encode(t, add_special_tokens=True) + [tok.eos_token_id] for t in lines]
    assert trie_to_dict(Trie.load(out)) == oracle_counts(seqs, 3)


def test_cli_help_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "dart_jax.ngram", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "convert" in r.stdout and "query" in r.stdout
