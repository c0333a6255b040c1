"""The compressed trie format (docs/spec.md §6.3): answers against a plain-Python restatement of
§5.1/§5.2 (window counts in a dict, float32 arithmetic written out) and identical to the CSR
trie's; trees identical on both formats; damaged files are clear errors, never crashes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import struct
from collections import defaultdict

import numpy as np
import pytest

from dart_jax.api.model import load_trie
from dart_jax.errors import FileFormatError, InputError
from dart_jax.ngram import CompressedTrie, Trie, build_tree, build_tree_batch, compress, load_any
from dart_jax.ngram.__main__ import main as ngram_cli
from trie_oracle import window_counts, write_reference

MAX_ID = 2**31 - 2


# -- oracles -----------------------------------------------------------------------------------


def oracle_probability(counts, order, context, cands):
    """docs/spec.md §5.2: longest suffix first, P = f32(freq(s·c)) * (1 / f32(freq(s)))."""
    p = [np.float32(0)] * len(cands)
    m = [0] * len(cands)
    context = [int(t) for t in context]
    for length in range(min(order - 1, len(context)), 0, -1):
        s = tuple(context[len(context) - length:])
        if s not in counts:
            continue
        inv = np.float32(1) / np.float32(counts[s])
        for i, c in enumerate(cands):
            if m[i] == 0 and s + (int(c),) in counts:
                p[i] = np.float32(np.float32(counts[s + (int(c),)]) * inv)
                m[i] = length
    return np.array(p, np.float32), np.array(m, np.int64)


def csr_of(counts):
    """§6.2 arrays from a path -> freq dict: breadth-first, siblings by token (freq as int64)."""
    nodes = sorted(counts, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(nodes)}
    nchild = defaultdict(int)
    for p in nodes[1:]:
        nchild[index[p[:-1]]] += 1
    child_start = [1]
    for i in range(len(nodes)):
        child_start.append(child_start[-1] + nchild[i])
    token = np.array([p[-1] if p else 0 for p in nodes], np.int32)
    return token, np.array([counts[p] for p in nodes], np.int64), np.array(child_start, np.int64)


class WideTrie:
    """CSR arrays with int64 counts (beyond what the CSR format stores): what ``compress`` reads."""

    def __init__(self, counts, order):
        self.order = order
        self._arrays = csr_of(counts)
        self.num_nodes = len(self._arrays[0])
        depth = defaultdict(int)
        for p in counts:
            depth[len(p)] += 1
        self._levels = [depth[d] for d in range(max(depth) + 1)]

    def arrays(self):
        return self._arrays

    def level_sizes(self):
        return self._levels

    def check(self, full=True):
        pass


def queries(rng, counts, vocab, n, k=25):
    keys = [p for p in counts if p]
    for _ in range(n):
        ctx = list(keys[rng.integers(len(keys))]) + list(rng.integers(0, vocab, size=rng.integers(0, 3)))
        rng.shuffle(ctx) if rng.random() < 0.2 else None
        seen = [keys[rng.integers(len(keys))][-1] for _ in range(k // 2)]
        yield ctx, np.array(seen + list(rng.integers(0, vocab + 3, size=k - k // 2)), np.int64)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    rng = np.random.default_rng(7)
    out = []
    # frequency fields with escapes (docs/spec.md §6.3) forced on, off, or where they save bytes
    for order, vocab, n_seq, escapes in ((1, 30, 5, True), (2, 50, 20, False), (3, 400, 40, True), (4, 60, 30, None),
                                         (3, 151_936, 30, True)):
        p = 1.0 / np.arange(1, vocab + 1) ** 1.1
        seqs = [rng.choice(vocab, size=int(rng.integers(1, 120)), p=p / p.sum()) for _ in range(n_seq)]
        trie = Trie.build(seqs, order=order)
        path = tmp_path_factory.mktemp("c") / f"o{order}.ctrie"
        out.append((order, vocab, window_counts(seqs, order), trie, compress(trie, path, escapes=escapes), path))
    return out


# -- answers -----------------------------------------------------------------------------------


def test_probabilities_match_the_oracle_and_the_csr_trie(corpora):
    rng = np.random.default_rng(0)
    for order, vocab, counts, trie, ctrie, _ in corpora:
        assert ctrie.num_nodes == trie.num_nodes and ctrie.level_sizes() == trie.level_sizes()
        for ctx, cands in queries(rng, counts, vocab, 60):
            want = oracle_probability(counts, order, ctx, cands)
            got = ctrie.probability(ctx, cands)
            csr = trie.probability(ctx, cands)
            for a, b, c in zip(want, got, csr):
                np.testing.assert_array_equal(a, b)
                np.testing.assert_array_equal(b, c)


def test_decoding_gives_back_the_csr_arrays(corpora):
    for *_, trie, ctrie, _path in corpora:
        for a, b in zip(ctrie.to_csr().arrays(), trie.arrays()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_trees_are_identical_on_both_formats(corpora):
    rng = np.random.default_rng(1)
    for order, vocab, counts, trie, ctrie, _ in corpora:
        keys = [p for p in counts if p]
        for _ in range(8):
            d, k = int(rng.integers(1, 6)), int(rng.integers(1, 9))
            ids = np.array([[keys[rng.integers(len(keys))][-1] if rng.random() < 0.6 else rng.integers(vocab)
                             for _ in range(k)] for _ in range(d)], np.int64)
            probs = np.sort(rng.dirichlet(np.ones(k), d), axis=1)[:, ::-1].astype(np.float32)
            pre = np.array(keys[rng.integers(len(keys))], np.int64)
            kw = dict(eos_id=int(ids[0, 0]), beam_width=int(rng.integers(1, 6)), keep=int(rng.integers(1, 25)))
            for x, y in zip(build_tree(ids, probs, pre, trie, **kw), build_tree(ids, probs, pre, ctrie, **kw)):
                np.testing.assert_array_equal(x, y)
            batch = (np.stack([ids, ids[::-1]]), np.stack([probs, probs]), np.stack([pre, pre]))
            for x, y in zip(build_tree_batch(*batch, trie, **kw), build_tree_batch(*batch, ctrie, **kw)):
                np.testing.assert_array_equal(x, y)


ADVERSARIAL = {
    # one long chain: every node has a single child
    "chain": ({(): 10, **{tuple(range(1, i + 1)): 10 - i for i in range(1, 9)}}, 8),
    # a root and a node with thousands of children
    "fan_out": ({(): 9000, (5,): 4000, **{(t,): 1 for t in range(6, 5006)},
                 **{(5, t): 1 for t in range(0, 3000)}}, 2),
    # counts of 1 and of 2**40 (wider than the CSR format's int32)
    "huge_counts": ({(): 2**41 + 1, (0,): 2**40, (0, 0): 2**40 - 1, (0, 1): 1, (MAX_ID,): 2**40 + 1,
                     (MAX_ID, MAX_ID): 2**40, (MAX_ID, 0): 1}, 2),
    # token id 0 and the largest id at every level (no dense remap table for such ids)
    "extreme_ids": ({(): 12, (0,): 6, (MAX_ID,): 6, (0, MAX_ID): 3, (0, 0): 2, (MAX_ID, 0): 5,
                     (0, MAX_ID, 0): 2, (MAX_ID, 0, MAX_ID): 4}, 3),
    # N + 1 = 256 children offsets: exactly two blocks of 128, so the last node's end is a block's base
    "block_edge": ({(): 5000, (1,): 300, **{(t,): t + 1 for t in range(2, 60)}, **{(1, t): 1 for t in range(195)}}, 2),
    # N + 1 = 129: the last offset alone in a block
    "block_edge_plus_one": ({(): 20000, **{(t,): 2 * t for t in range(1, 128)}}, 1),
}


@pytest.mark.parametrize("escapes", [True, False])
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_tries_answer_like_the_oracle(name, escapes, tmp_path):
    counts, order = ADVERSARIAL[name]
    ctrie = compress(WideTrie(counts, order), tmp_path / "a.ctrie", escapes=escapes)
    ctrie = CompressedTrie.load(tmp_path / "a.ctrie", verify=True)
    rng = np.random.default_rng(3)
    tokens = sorted({t for p in counts for t in p} | {1, 2, MAX_ID - 1})
    keys = [p for p in counts if p]
    keys = [keys[i] for i in rng.permutation(len(keys))[:40]] + [(), (7, 7), (5,)]
    for ctx in keys:
        for start in rng.permutation(range(0, len(tokens), 25))[:8]:
            cands = np.array(tokens[start:start + 25], np.int64)
            want = oracle_probability(counts, order, ctx, cands)
            got = ctrie.probability(ctx, cands)
            np.testing.assert_array_equal(want[0], got[0])
            np.testing.assert_array_equal(want[1], got[1])
    if all(v < 2**31 for v in counts.values()) and name != "huge_counts":
        csr = Trie(*csr_of(counts)[:1], csr_of(counts)[1].astype(np.int32), csr_of(counts)[2], order)
        for ctx in keys:
            cands = np.array(tokens[:25], np.int64)
            for a, b in zip(csr.probability(ctx, cands), ctrie.probability(ctx, cands)):
                np.testing.assert_array_equal(a, b)


def test_the_format_is_small_on_skewed_text(corpora, tmp_path):
    *_, trie, ctrie, path = corpora[2]
    assert path.stat().st_size / trie.num_nodes < 6  # the 400-token corpus; realistic figures in RESULTS.md
    sizes = {}
    for escapes in (True, False, None):
        compress(trie, tmp_path / f"{escapes}.ctrie", escapes=escapes)
        sizes[escapes] = (tmp_path / f"{escapes}.ctrie").stat().st_size
    assert sizes[True] < sizes[False]  # skewed counts: escapes pay
    assert sizes[None] == sizes[True]  # and the default takes them when they do


# -- damaged files -----------------------------------------------------------------------------


def mutations(data: bytes, rng, n):
    for _ in range(n):
        buf = bytearray(data)
        kind = rng.integers(4)
        if kind == 0:
            buf[rng.integers(len(buf))] ^= 1 << int(rng.integers(8))
        elif kind == 1:
            at = int(rng.integers(len(buf) - 8))
            buf[at:at + 8] = rng.integers(0, 256, size=8, dtype=np.uint8).tobytes()
        elif kind == 2:
            buf = buf[:int(rng.integers(len(buf)))]
        else:
            at = int(rng.integers(16, 56 + 20 * 16))  # header and section table
            buf[at] = int(rng.integers(256))
        yield bytes(buf)


def survives(path, cands, ctx):
    """Load a damaged file plainly (header and tables) and answer from it, which must not crash
    whatever the damage; then with verify. → whether the verified load accepted it."""
    for verify in (False, True):
        try:
            trie = CompressedTrie.load(path, verify=verify)
        except FileFormatError as e:
            assert str(path) in str(e)
            return False
        trie.probability(ctx, cands)
        ids = np.resize(cands, (3, 5))
        build_tree(ids, np.full((3, 5), 0.2, np.float32), ctx, trie, eos_id=None, beam_width=3, keep=10)
    return True


def fuzz(corpora, tmp_path, n, seed):
    *_, ctrie, path = corpora[2]
    data = path.read_bytes()
    rng = np.random.default_rng(seed)
    target = tmp_path / "bad.ctrie"
    loaded = 0
    for bad in mutations(data, rng, n):
        target.write_bytes(bad)
        loaded += survives(target, np.arange(0, 450, 18, dtype=np.int64), np.array([3, 1, 2], np.int64))
    assert loaded < n  # most damage is found by a verified load


def test_damaged_files_are_errors_or_still_answer(corpora, tmp_path):
    fuzz(corpora, tmp_path, 150, 0)


@pytest.mark.slow
def test_damaged_files_long_fuzz(corpora, tmp_path):
    fuzz(corpora, tmp_path, 20_000, 1)


def test_header_damage_is_a_clear_error(corpora, tmp_path):
    *_, path = corpora[2]
    data = bytearray(path.read_bytes())
    cases = {
        "version": (8, struct.pack("<I", 9), "version 9"),
        "order": (16, struct.pack("<Q", 0), "order 0"),
        "size": (48, struct.pack("<Q", 1), "header says 1"),
    }
    for name, (at, raw, message) in cases.items():
        bad = bytearray(data)
        bad[at:at + len(raw)] = raw
        target = tmp_path / f"{name}.ctrie"
        target.write_bytes(bytes(bad))
        with pytest.raises(FileFormatError, match=message):
            CompressedTrie.load(target)
    (tmp_path / "short.ctrie").write_bytes(bytes(data[:40]))
    with pytest.raises(FileFormatError, match="truncated"):
        CompressedTrie.load(tmp_path / "short.ctrie")



def section_view(data: bytearray, name: str, dtype: str) -> np.ndarray:
    """The named section of a compressed file as a writable array (the header's section table,
    docs/spec.md §6.3; the order of the sections is the spec's)."""
    names = ["level_start", "tok_width", "tok_bit", "tok_count", "cnt_width", "cnt_bit", "cnt_tab_start", "cnt_table",
             "esc_width", "esc_bit", "esc_before", "remap", "kid_blocks", "kid_words", "tok_words", "cnt_words",
             "esc_marks", "esc_rank", "esc_words", "tok_table"]
    offset, length = struct.unpack_from("<QQ", data, struct.calcsize("<8sIIQQQQQ") + 16 * names.index(name))
    return np.frombuffer(memoryview(data)[offset:offset + length], dtype)


def test_damaged_node_fields_are_found_by_verify(corpora, tmp_path, monkeypatch):
    """Per-node damage that the queries would only clamp is reported by a verified load: a rank
    past its level's table, a negative count, children counting more than their parent, siblings
    out of order. A plain load checks the header and the per-level tables only (it never walks the
    nodes), and answers from the damaged file without reading out of bounds."""
    *_, path = corpora[2]
    data = path.read_bytes()

    def load_damaged(damage, verify=True):
        bad = bytearray(data)
        damage(bad)
        target = tmp_path / "bad.ctrie"
        target.write_bytes(bytes(bad))
        return CompressedTrie.load(target, verify=verify)

    def ranks_all_ones(name):
        def damage(bad):
            words = section_view(bad, name, "<u8")
            words[:] = np.uint64(2**64 - 1)
        return damage

    def count_table(value):
        def damage(bad):
            table = section_view(bad, "cnt_table", "<i8")
            table[-1] = value  # the largest count of the deepest level: a leaf's
        return damage

    def swap_siblings(bad):
        ls, cs = section_view(bad, "level_start", "<i8"), csr_of(corpora[2][2])[2]
        width = int(section_view(bad, "tok_width", "<i8")[2])
        words = section_view(bad, "tok_words", "<u8")
        base = int(section_view(bad, "tok_bit", "<i8")[2]) - int(ls[2]) * width
        parent = next(i for i in range(int(ls[1]), int(ls[2])) if cs[i + 1] - cs[i] >= 2)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        a, b = base + int(cs[parent]) * width, base + (int(cs[parent]) + 1) * width
        bits[a:a + width], bits[b:b + width] = bits[b:b + width].copy(), bits[a:a + width].copy()
        words[:] = np.packbits(bits, bitorder="little").view("<u8")

    def flip_mark(bad):
        marks = section_view(bad, "esc_marks", "<u8")
        marks[1] ^= np.uint64(1 << 5)  # node 69 gains or loses its escape mark

    def shift_mark_count(bad):
        section_view(bad, "esc_rank", "<i8")[1] += 1  # marks before node 256

    def move_block_base(bad):
        section_view(bad, "kid_blocks", "<i8")[2] += 1  # the children offsets of nodes 128..255

    assert section_view(bytearray(data), "esc_marks", "<u8").any()  # this trie has escapes
    assert CompressedTrie.load(path).num_nodes > 300
    for damage, message in ((flip_mark, "escape mark"), (shift_mark_count, "escape mark"),
                            (move_block_base, "node 12[78]"),
                            (ranks_all_ones("cnt_words"), "frequency rank outside"),
                            (ranks_all_ones("tok_words"), "token rank outside"),
                            (count_table(-5), "negative frequency"),
                            (count_table(2**40), "count more windows than the node")):
        with pytest.raises(FileFormatError, match=message):
            load_damaged(damage)
        with pytest.raises(FileFormatError, match=message):
            CompressedTrie.load(tmp_path / "bad.ctrie").check()
    with pytest.raises(FileFormatError, match="strictly increasing token order"):
        load_damaged(swap_siblings)
    import dart_jax.ngram.compressed as module

    def walked(*args):
        raise AssertionError("a plain load walked the nodes")

    monkeypatch.setattr(module, "check_compressed", walked)
    for damage in (flip_mark, move_block_base, ranks_all_ones("cnt_words"), count_table(-5), swap_siblings):
        trie = load_damaged(damage, verify=False)
        p, matched = trie.probability(np.array([3, 1, 2]), np.arange(0, 450, 18))
        assert p.shape == (25,) and matched.shape == (25,)
    monkeypatch.undo()
    with pytest.raises(FileFormatError, match="bad.ctrie.*token rank outside"):  # decoding checks every node first
        load_damaged(ranks_all_ones("tok_words"), verify=False).to_csr()


_PURE_PYTHON_QUERIES = """
import sys, warnings
import numpy as np
warnings.simplefilter("ignore")  # numpy's int64 overflow warnings: the wrap-around is the point
from dart_jax.ngram import _compressed as C
from dart_jax.ngram.compressed import CompressedTrie
k = 4
cands = np.array([[0, 3, 7, 15]], np.int64)
child, freq = np.empty((1, k), np.int64), np.empty((1, k), np.float32)
scratch = np.empty(k + 3, np.int64)  # longer than k, as the interface allows
for path in sys.argv[1:]:
    ct = CompressedTrie.load(path)
    tr, n = ct.search_arrays(), np.int64(ct.num_nodes)
    for node in range(-1, int(n) + 1, int(sys.argv[1] != path) * 6 + 1):  # damaged files: every 7th node
        lvl = np.int64(C.node_level(tr[C._LEVEL_START], node))
        for tok in (0, 3, 15):
            C.ct_find_child(tr, n, np.int64(node), np.int64(tok))
        C.ct_root_child(tr, n, np.int64(node % 16))
        C.ct_children(tr, n, np.int64(node), cands, 0, child, freq, 0, scratch)
        C.ct_children_keyed(tr, n, np.int64(node), lvl + 1, np.array([0, 1, -1, 2], np.int64), child, freq, 0)
        C.ct_freq(tr, np.int64(node))
print("ok")
"""


def test_damaged_offsets_cannot_overflow_the_children_range(tmp_path):
    """Block bases that a plain load does not check, set so that a node's children range would
    overflow int64 (start 2**62 + 1, end -2**63 + 2), and random damage to the per-node sections:
    every lookup must stay inside the arrays.
    Run as plain Python (NUMBA_DISABLE_JIT: NumPy's wrapping int64 and Python's bounds-checked
    indexing), which shows what the compiled code's overflow assumptions could hide."""
    seqs = [np.random.default_rng(0).integers(0, 16, 4000).astype(np.int32)]
    trie = Trie.build(seqs, order=3, progress=False)
    good = tmp_path / "good.ctrie"
    compress(trie, good)
    node = 255
    cs = trie.arrays()[2]
    assert node < trie.num_nodes and cs[node + 1] > cs[node]  # a node with children, in block 1
    data = bytearray(good.read_bytes())
    blocks = section_view(data, "kid_blocks", "<i8")
    diff = int(cs[node]) - int(blocks[2])  # node 255's packed difference from block 1's base
    blocks[2] = np.int64((1 << 62) + 1 - diff)  # node 255's children start at 2**62 + 1 ...
    blocks[4] = np.int64(-(1 << 63) + 2)  # ... and node 256's (its end) at -2**63 + 2
    bad = tmp_path / "bad.ctrie"
    bad.write_bytes(bytes(data))
    CompressedTrie.load(bad)  # the plain load accepts it
    with pytest.raises(FileFormatError, match="children"):
        CompressedTrie.load(bad, verify=True)
    # and random damage to the per-node sections that the plain load accepts
    rng = np.random.default_rng(3)
    damaged = [good, bad]
    sections = ("kid_blocks", "kid_words", "tok_words", "cnt_words", "esc_marks", "esc_rank", "esc_words", "remap")
    while len(damaged) < 24:
        data = bytearray(good.read_bytes())
        for _ in range(int(rng.integers(1, 4))):
            part = section_view(data, str(rng.choice(sections)), "<u1")
            if part.size:
                part[int(rng.integers(part.size))] = int(rng.integers(256))
        path = tmp_path / f"damaged{len(damaged)}.ctrie"
        path.write_bytes(bytes(data))
        try:
            CompressedTrie.load(path)
        except FileFormatError:
            continue
        damaged.append(path)
    run = subprocess.run([sys.executable, "-c", _PURE_PYTHON_QUERIES, *map(str, damaged)],
                         env={**os.environ, "NUMBA_DISABLE_JIT": "1"}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# -- loading and the CLI -----------------------------------------------------------------------


def test_cli_compresses_either_format_and_loaders_accept_both(corpora, tmp_path, capsys):
    order, vocab, counts, trie, _, _ = corpora[2]
    trie.save(tmp_path / "csr.trie")
    write_reference(tmp_path / "ref.trie", counts, order)
    for src in ("csr.trie", "ref.trie"):
        out = tmp_path / f"{src}.ctrie"
        assert ngram_cli(["compress", str(tmp_path / src), str(out)]) == 0
        assert "bytes/node" in capsys.readouterr().out
        assert not list(tmp_path.glob("*.tmp"))
        for loaded in (load_any(out), load_trie(str(out))):
            assert isinstance(loaded, CompressedTrie)
            np.testing.assert_array_equal(loaded.probability([1, 2], np.arange(40))[0],
                                          trie.probability([1, 2], np.arange(40))[0])
        assert ngram_cli(["info", str(out), "--json", "--verify"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["format"] == "compressed" and info["num_nodes"] == trie.num_nodes
        assert info["bytes_per_node"] == round(out.stat().st_size / trie.num_nodes, 3)
    assert isinstance(load_any(tmp_path / "csr.trie"), Trie)
    assert ngram_cli(["compress", str(tmp_path / "csr.trie.ctrie"), str(tmp_path / "again.ctrie")]) == 2
    assert "already a compressed trie" in capsys.readouterr().err
    (tmp_path / "junk.bin").write_bytes(b"\xff" * 40)
    assert ngram_cli(["compress", str(tmp_path / "junk.bin"), str(tmp_path / "x.ctrie")]) == 2
    assert "neither a dart_jax trie nor a reference" in capsys.readouterr().err


def test_decoding_counts_beyond_int32_is_refused(tmp_path):
    counts, order = ADVERSARIAL["huge_counts"]
    ctrie = compress(WideTrie(counts, order), tmp_path / "h.ctrie")
    with pytest.raises(InputError, match="exceed int32"):
        ctrie.to_csr()
