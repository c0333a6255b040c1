"""`ngram export` / `Trie.to_reference` / `CompressedTrie.to_reference`: dart_jax tries written in
the reference's `.trie` format (docs/spec.md §6.1). Oracles: a plain-Python reading of the bytes
(struct.unpack per §6.1) and the window counts of docs/spec.md §5.1 (`trie_oracle`); the
project's own reader of the format (`Trie.from_reference`) must give back every node."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from dart_jax.errors import InputError
from dart_jax.ngram import CompressedTrie, Trie, compress
from dart_jax.ngram import _reference_write
from dart_jax.ngram.__main__ import main as cli
from trie_oracle import window_counts, write_reference


def parse_reference(data: bytes):
    """docs/spec.md §6.1 restated: (order, [(token, parent, freq, [(child token, child id), ...])])."""
    order, count = struct.unpack_from("<QQ", data, 0)
    pos, nodes = 16, []
    for _ in range(count):
        token, parent, freq, n_children = struct.unpack_from("<iQiQ", data, pos)
        pos += 24
        children = [struct.unpack_from("<iQ", data, pos + 12 * k) for k in range(n_children)]
        pos += 12 * n_children
        nodes.append((token, parent, freq, children))
    assert pos == len(data), "bytes after the last record"
    return order, nodes


def paths_and_counts(nodes):
    """{path: freq} of a parsed file, walking the child lists from node 0; checks each child's own
    token and parent field against its parent's list."""
    out, todo = {(): nodes[0][2]}, [(0, ())]
    while todo:
        node, path = todo.pop()
        for token, child in nodes[node][3]:
            assert nodes[child][0] == token and nodes[child][1] == node
            out[path + (token,)] = nodes[child][2]
            todo.append((child, path + (token,)))
    assert len(out) == len(nodes)
    return out


def test_a_hand_made_trie_is_written_byte_for_byte_as_the_spec_says(tmp_path):
    # order 2 over the windows (3 5) (5 3) (5 9) (3 5) (9) (5): root 6; 3:2, 5:3, 9:1; 3 5:2, 5 3:1, 5 9:1
    trie = Trie(np.array([0, 3, 5, 9, 5, 3, 9], np.int32), np.array([6, 2, 3, 1, 2, 1, 1], np.int32),
                np.array([1, 4, 5, 7, 7, 7, 7, 7], np.int64), order=2)
    path = trie.to_reference(tmp_path / "hand.trie", progress=False)
    data = open(path, "rb").read()
    assert len(data) == 16 + 24 * 7 + 12 * 6
    assert parse_reference(data) == (2, [
        (0, 0, 6, [(3, 1), (5, 2), (9, 3)]),
        (3, 0, 2, [(5, 4)]),
        (5, 0, 3, [(3, 5), (9, 6)]),
        (9, 0, 1, []),
        (5, 1, 2, []),
        (3, 2, 1, []),
        (9, 2, 1, []),
    ])


def _corpus(rng, kind):
    if kind == "zipf":
        return [np.minimum(rng.zipf(1.3, rng.integers(1, 200)), 5000) for _ in range(60)]
    return [rng.integers(0, 40, rng.integers(0, 120)) for _ in range(50)]


@pytest.mark.parametrize("order", [1, 3, 5])
@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_round_trip_gives_back_every_node_and_every_lookup(tmp_path, monkeypatch, order, kind):
    rng = np.random.default_rng(order * 7 + len(kind))
    seqs = _corpus(rng, kind)
    source = Trie.build(seqs, order=order)
    # small windows: records, children's tokens and parents each cross many chunk boundaries
    monkeypatch.setattr(_reference_write, "_NODES", 37)
    path = source.to_reference(tmp_path / "out.trie", progress=False, chunk_bytes=300)
    data = open(path, "rb").read()
    parsed_order, nodes = parse_reference(data)
    assert parsed_order == order and len(nodes) == source.num_nodes
    assert paths_and_counts(nodes) == window_counts([s.tolist() for s in seqs], order)

    back = Trie.from_reference(path, progress=False)
    assert back.order == order
    for want, got in zip(source.arrays(), back.arrays()):  # token, count and children of every node
        np.testing.assert_array_equal(got, want)
    for _ in range(30):
        context = rng.integers(0, 45, rng.integers(1, order + 2))
        cands = rng.integers(0, 45, 20)
        for want, got in zip(source.probability(context, cands), back.probability(context, cands)):
            np.testing.assert_array_equal(got, want)
    assert sorted(os.listdir(tmp_path)) == ["out.trie"]  # no scratch left behind


def test_a_converted_reference_trie_and_a_reduced_one_come_back_as_they_were(tmp_path):
    seqs = [[1, 2, 3, 1, 2, 4, 2, 3, 9], [4, 4, 4, 1], [2, 3]]
    counts = window_counts(seqs, 3)
    write_reference(tmp_path / "given.trie", counts, 3, root_freq=-5)  # a reduced reference root: negative
    ours = Trie.from_reference(tmp_path / "given.trie", progress=False)
    _, nodes = parse_reference(open(ours.to_reference(tmp_path / "again.trie", progress=False), "rb").read())
    assert paths_and_counts(nodes) == {**counts, (): -5}

    reduced = Trie.build(seqs, order=3).reduce(2)
    back = Trie.from_reference(reduced.to_reference(tmp_path / "reduced.trie", progress=False), progress=False)
    for want, got in zip(reduced.arrays(), back.arrays()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("escapes", [False, True])
def test_a_compressed_trie_exports_the_same_file(tmp_path, monkeypatch, escapes):
    rng = np.random.default_rng(5)
    source = Trie.build(_corpus(rng, "zipf"), order=3)
    plain = open(source.to_reference(tmp_path / "csr.trie", progress=False), "rb").read()
    packed = compress(source, tmp_path / "c.ctrie", escapes=escapes)
    monkeypatch.setattr(_reference_write, "_NODES", 53)
    path = CompressedTrie.load(tmp_path / "c.ctrie").to_reference(tmp_path / "from_c.trie", progress=False,
                                                                  chunk_bytes=1000)
    assert open(path, "rb").read() == plain
    back = Trie.from_reference(path, progress=False)
    for want, got in zip(source.arrays(), back.arrays()):
        np.testing.assert_array_equal(got, want)
    context, cands = [3, 1], np.arange(30)
    for want, got in zip(packed.probability(context, cands), back.probability(context, cands)):
        np.testing.assert_array_equal(got, want)


def test_counts_beyond_int32_are_refused_and_nothing_is_left(tmp_path):
    token, cs = np.array([0, 4], np.int32), np.array([1, 2, 2], np.int64)
    freq = np.array([2**31, 2**31], np.int64)
    with pytest.raises(InputError, match="node 0 counts 2147483648 windows"):
        _reference_write.write_reference(tmp_path / "big.trie", 2, 2, lambda a, b: (token[a:b], freq[a:b], cs[a:b + 1]))
    assert os.listdir(tmp_path) == []
    with pytest.raises(InputError, match="chunk_bytes"):
        _reference_write.write_reference(tmp_path / "x.trie", 2, 2, lambda a, b: (token[a:b], freq[a:b], cs[a:b + 1]),
                                         chunk_bytes=0)


def test_cli_export(tmp_path, capsys):
    rng = np.random.default_rng(1)
    source = Trie.build(_corpus(rng, "uniform"), order=3)
    source.save(tmp_path / "ours.trie")
    compress(source, tmp_path / "ours.ctrie")
    for name in ("ours.trie", "ours.ctrie"):
        out = tmp_path / f"{name}.ref"
        assert cli(["export", str(tmp_path / name), str(out)]) == 0
        assert f"{source.num_nodes} nodes, order 3" in capsys.readouterr().out
        for want, got in zip(source.arrays(), Trie.from_reference(out, progress=False).arrays()):
            np.testing.assert_array_equal(got, want)

    os.symlink(tmp_path / "ours.trie", tmp_path / "alias.trie")
    refused = {
        "same": (["export", str(tmp_path / "ours.trie"), str(tmp_path / "ours.trie")], "input trie itself"),
        "alias": (["export", str(tmp_path / "ours.trie"), str(tmp_path / "alias.trie")], "input trie itself"),
        "reference": (["export", str(tmp_path / "ours.trie.ref"), str(tmp_path / "again.trie")], "already a reference"),
        "missing": (["export", str(tmp_path / "none.trie"), str(tmp_path / "x.trie")], "No trie file"),
        "folder": (["export", str(tmp_path / "ours.trie"), str(tmp_path / "no" / "x.trie")], "does not exist"),
        "chunk": (["export", str(tmp_path / "ours.trie"), str(tmp_path / "x.trie"), "--chunk-mb", "0"], "--chunk-mb"),
    }
    before = sorted(os.listdir(tmp_path))
    for argv, message in refused.values():
        assert cli(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert sorted(os.listdir(tmp_path)) == before
    Trie.load(tmp_path / "ours.trie", verify=True)  # the refused same-path export left the input intact

    with pytest.raises(SystemExit):
        cli(["export", "--help"])
    assert "(default: 64)" in capsys.readouterr().out
