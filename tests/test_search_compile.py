"""`compile_search` compiles, in a background thread, the very kernel specialisation that the
decoding loop's searches then use: the inputs of every search are normalised to one type (a
read-only view of a device buffer, int32 ids or a slice of the preceding ids would each make
Numba compile the kernel again), so a search after it compiles nothing."""
from __future__ import annotations

import numpy as np
import pytest

from dart_jax.ngram import compile_search
from dart_jax.ngram.compressed import compress
from dart_jax.ngram.tree import _search_one, build_tree
from dart_jax.ngram.trie import Trie


def _kinds_of_trie(tmp_path):
    rng = np.random.default_rng(3)
    trie = Trie.build([rng.integers(0, 40, 30).tolist() for _ in range(20)], order=3)
    return {"csr": trie, "compressed": compress(trie, tmp_path / "t.ctrie"), "none": None}


@pytest.mark.parametrize("kind", ["csr", "compressed", "none"])
def test_a_search_after_compile_search_compiles_nothing(kind, tmp_path):
    trie = _kinds_of_trie(tmp_path)[kind]
    thread = compile_search(trie)
    thread.join(timeout=600)
    assert not thread.is_alive()
    compiled = len(_search_one.signatures)
    # as the decoding loop hands them over: int32 ids and read-only float32 probabilities (views of
    # device results), the preceding ids a slice of a wider int64 array
    ids = np.arange(12, dtype=np.int32).reshape(3, 4) % 40
    probs = np.full((3, 4), 0.25, np.float32)
    probs.flags.writeable = False
    preceding = np.arange(10, dtype=np.int64).reshape(2, 5)[0, 1:4]
    tree = build_tree(ids, probs, preceding, trie, eos_id=2, beam_width=4, keep=5)
    assert len(_search_one.signatures) == compiled
    assert int(tree.num_nodes) == 6  # it searched: 5 kept nodes and the root (3 rows of 4 candidates have enough)
    assert tree.tokens[0] == preceding[-1]  # the root is the last preceding id
