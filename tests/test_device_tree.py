"""The draft-tree search in JAX (dart_jax.decoding.device_tree) against the host's search
(dart_jax.ngram.build_tree, itself checked against the reference's trees): the same tree, field by
field, over random candidates, tries, contexts, EOS ids, ties and settings."""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.api.model import load_trie
from dart_jax.decoding.device_tree import DeviceSearch, DeviceTrie, host_tree, search_tree, search_trees
from dart_jax.ngram import Trie
from dart_jax.ngram.tree import build_tree, build_tree_batch

search = jax.jit(search_tree, static_argnames=("settings",))
DEMO_TRIE = Path(__file__).resolve().parent.parent / "dart_jax" / "demo" / "smollm2" / "ngram.trie"
P = 8  # preceding slots


def zipf_trie(rng, vocab: int, order: int = 3) -> Trie:
    return Trie.build([(rng.zipf(1.3, size=int(rng.integers(20, 200))) % vocab).tolist() for _ in range(150)],
                      order=order)


def candidates(rng, d: int, k: int, vocab: int, ties: bool):
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(d)]).astype(np.int32)
    if ties:  # every candidate of a row equally likely: the order is decided by the pool numbers
        return ids, np.full((d, k), 1.0 / k, np.float32)
    logits = np.sort(rng.normal(size=(d, k)) * 2, axis=1)[:, ::-1]
    return ids, (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)


def assert_same(expected, got: dict, what: str):
    for name, value in zip(expected._fields, expected):
        np.testing.assert_array_equal(got[name], np.asarray(value), err_msg=f"{what}: {name}")


@pytest.mark.parametrize("d,k,keep,beam,order,cases", [
    pytest.param(8, 25, 60, 20, 3, 5, marks=pytest.mark.extended),  # the largest: a second look
    (3, 5, 10, 4, 3, 8), (1, 4, 8, 3, 2, 8),
    pytest.param(5, 9, 30, 7, 4, 8, marks=pytest.mark.extended),  # the second largest: a second look too
    (2, 3, 40, 5, 3, 8),  # a beam wider than the candidates, more nodes kept than the pool holds
])
def test_device_search_builds_the_host_searchs_tree(d, k, keep, beam, order, cases):
    rng = np.random.default_rng(d * 100 + k)
    vocab = 40
    trie = zipf_trie(rng, vocab, order)
    if order == 4:  # nodes whose count is 0 (a reduced trie leaves them): no evidence, the lookup backs off
        token, freq, start = trie.arrays()
        freq = freq.copy()
        freq[1::3] = 0
        trie = Trie(token, freq, start, order)
    device_trie = DeviceTrie.from_trie(trie)
    for case in range(cases):
        ids, probs = candidates(rng, d, k, vocab, ties=case % 4 == 1)
        n = int(rng.integers(1, P + 1))
        preceding = (rng.zipf(1.3, size=n) % vocab).astype(np.int32)
        eos = int(ids[min(1, d - 1), k // 2]) if case % 3 == 0 else None
        weight = 0.0 if case == 5 else 0.5
        with_trie = case != 6
        expected = build_tree(ids, probs, preceding, trie if with_trie else None, eos_id=eos, beam_width=beam,
                              keep=keep, ngram_weight=weight)
        padded = np.zeros(P, np.int32)
        padded[:n] = preceding
        got = search(jnp.asarray(ids), jnp.asarray(probs), jnp.asarray(padded), jnp.int32(n),
                     device_trie if with_trie else None,
                     settings=DeviceSearch(keep=keep, beam_width=beam, ngram_weight=weight, eos_id=eos))
        assert_same(expected, host_tree(got), f"case {case}")


def test_device_search_of_a_batch_equals_the_host_batch_search():
    rng = np.random.default_rng(7)
    trie = zipf_trie(rng, 30)
    batch, d, k = 3, 4, 6
    rows = [candidates(rng, d, k, 30, ties=b == 1) for b in range(batch)]
    ids, probs = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    lengths = np.array([1, 5, 8], np.int32)
    preceding = (rng.zipf(1.3, size=(batch, P)) % 30).astype(np.int32)
    expected = build_tree_batch(ids, probs, preceding, trie, eos_id=int(ids[0, 1, 0]), preceding_len=lengths,
                                beam_width=5, keep=12)
    got = jax.jit(search_trees, static_argnames=("settings",))(
        jnp.asarray(ids), jnp.asarray(probs), jnp.asarray(preceding), jnp.asarray(lengths), DeviceTrie.from_trie(trie),
        settings=DeviceSearch(keep=12, beam_width=5, eos_id=int(ids[0, 1, 0])))
    assert_same(expected, host_tree(got), "batch")


def test_device_trie_finds_every_child_and_nothing_else():
    """Each node's children by binary search against a dictionary of the CSR arrays."""
    rng = np.random.default_rng(3)
    trie = zipf_trie(rng, 25)
    token, _, start = trie.arrays()
    device_trie = DeviceTrie.from_trie(trie)
    nodes = rng.integers(0, trie.num_nodes, size=400).astype(np.int32)
    nodes[:60] = 0  # the root: its children come from a table
    toks = rng.integers(0, 26, size=400).astype(np.int32)
    got = np.asarray(jax.jit(DeviceTrie.child)(device_trie, jnp.asarray(nodes), jnp.asarray(toks)))
    for node, tok, child in zip(nodes, toks, got):
        kids = {int(token[c]): c for c in range(start[node], start[node + 1])}
        assert child == kids.get(int(tok), -1)
    assert np.asarray(device_trie.child(jnp.int32(-1), jnp.int32(3))) == -1  # no node: no child


def test_device_trie_search_over_the_demos_wide_child_lists():
    """The SmolLM2 demo's trie (shipped; child lists up to 1 446 wide below a 10 714-wide root):
    children found in a few 16-way steps, against the CSR arrays read directly."""
    trie = load_trie(str(DEMO_TRIE))
    trie = trie.to_csr() if hasattr(trie, "to_csr") else trie
    token, _, start = trie.arrays()
    device_trie = DeviceTrie.from_trie(trie)
    assert device_trie.rounds == 3  # 16**3 >= 1 446 > 16**2
    rng = np.random.default_rng(5)
    common = token[1:start[1]][:600]
    nodes = rng.integers(0, trie.num_nodes, size=2000).astype(np.int32)
    nodes[:300] = 0
    toks = rng.choice(common, size=2000).astype(np.int32)
    got = np.asarray(jax.jit(DeviceTrie.child)(device_trie, jnp.asarray(nodes), jnp.asarray(toks)))
    for node, tok, child in zip(nodes, toks, got):
        assert child == next((c for c in range(start[node], start[node + 1]) if token[c] == tok), -1)
