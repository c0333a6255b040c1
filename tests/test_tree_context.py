"""Issue 27: the tree search's context is the one the reference passes (docs/spec.md §5.4): after
the prefill the prompt and the first token; after a step the previous root, the accepted draft ids
and the bonus token (two ids when nothing was accepted, where the ids fed to the head are one).

The oracle restates that rule over the tokens and accepted lengths a real generation reports, on
tries of order 4 and 5 (where a context of one id and one of two give different n-gram terms), and
the trees searched from the recorded contexts must equal those searched from the oracle's."""
from __future__ import annotations

import numpy as np
import pytest

from dart_jax.api.generate import _demo_paths
from dart_jax.api.model import DartModel
from dart_jax.decoding.driver import decode
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.ngram.trie import Trie

TEXT = ("Speculative decoding drafts several tokens and lets the target verify them in one call. "
        "The draft tree holds the candidates; the n-gram trie scores them. ") * 3


@pytest.fixture(scope="module")
def tiny():
    return _demo_paths("tiny")


@pytest.mark.parametrize("order", [4, 5])
def test_the_search_context_is_the_references(order, tiny, tmp_path):
    base, head, _ = tiny
    probe = DartModel.from_pretrained(base, head, False, keep=16)
    rng = np.random.default_rng(order)
    vocab = probe.target.config.vocab_size
    seqs = [probe.encode(TEXT, chat=False)] + [list(rng.integers(0, vocab, size=40)) for _ in range(20)]
    Trie.build(seqs, order=order).save(tmp_path / "t.trie")
    model = DartModel.from_pretrained(base, head, str(tmp_path / "t.trie"), keep=16)
    engine = model.engine
    calls = []
    search = engine.drafter.tree

    def recording(proposal, preceding, preceding_len, trie, settings, eos_id):
        calls.append(([preceding[b, :preceding_len[b]].tolist() for b in range(preceding.shape[0])],
                      {k: v.copy() for k, v in proposal.items()}, settings, eos_id))
        return search(proposal, preceding, preceding_len, trie, settings, eos_id)
    engine.drafter.tree = recording

    # a prompt the head knows nothing about: steps that accept nothing come up
    prompt = [int(t) for t in rng.integers(3, vocab, size=7)]
    out = [(e.ids, e.accepted) for e in decode(engine, prompt, GenerationSettings(max_new_tokens=48, max_length=256))]
    emitted = [list(map(int, ids)) for ids, _ in out]
    counts = [int(accepted) for _, accepted in out]
    assert counts[0] == 0 and len(emitted[0]) == 1  # the prefill's first token
    assert 1 in counts[1:], "no step accepted nothing: pick another prompt"

    # the oracle: the reference's preceding ids before each search
    expected = [prompt + emitted[0]]
    for i in range(1, len(emitted)):
        root = (prompt + sum(emitted[:i], []))[-1]
        expected.append([root] + emitted[i][:counts[i]])
    width = max(engine.depth + 2, order - 1)
    assert len(calls) >= len(emitted) - 1
    for i, (got, _, _, _) in enumerate(calls):
        assert got[0] == expected[i][-width:], (i, got[0], expected[i])
        if counts[i] == 1 and i:
            assert len(got[0]) == 2  # root and bonus, as the reference
    # the trees from the kept context equal the trees from the reference's whole context
    for i, (got, proposal, settings, eos_id) in enumerate(calls):
        full = np.asarray([expected[i]], np.int64)
        kept = np.asarray([got[0]], np.int64)
        a = settings.search(proposal["cand_ids"], proposal["cand_probs"], full, np.array([full.shape[1]]),
                            engine.trie, eos_id=eos_id)
        b = settings.search(proposal["cand_ids"], proposal["cand_probs"], kept, np.array([kept.shape[1]]),
                            engine.trie, eos_id=eos_id)
        for name in a._fields:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"call {i}: {name}")
