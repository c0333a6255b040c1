"""The overlapped pool (`Batcher(overlap=True)`): the host searches one half's trees while the
device verifies the other half. Oracle: plain greedy decoding of each request alone (the
autoregressive decoder), and the default pool's outputs and step counts."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from dart_jax.api.model import DartModel
from dart_jax.bench.tiny import make_tiny_setup
from dart_jax.decoding.batcher import Batcher
from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.driver import Driver, decode
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.ngram import TreeSettings, Trie

from test_engine import compilations

VOCAB, EOS = 32, 2
PROMPTS = [[5, 9, 14, 3, 27], list(range(3, 20)), [7, 7, 21, 30, 11, 4, 8, 19, 25], [12, 6, 6, 29]]
JOBS = [(PROMPTS[0], 24), (PROMPTS[1], 9), (PROMPTS[2], 30), (PROMPTS[3], 17), (PROMPTS[2], 5), (PROMPTS[1], 20)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overlap")
    base, head, trie = make_tiny_setup(folder, vocab_size=VOCAB, draft_length=3, shuffle_d2t=True,
                                       num_hidden_layers=4, seed=2)
    return DartModel.from_pretrained(base, head, trie, min_bucket=64, keep=20)


@pytest.fixture(scope="module")
def tiny(model):
    plain = Engine(model.target, DartDrafter(model.head), model.engine.trie, eos_ids=(EOS,), tree_eos_id=EOS,
                   tree=TreeSettings(keep=20), shapes=ShapeSettings(min_bucket=64))
    alone = {}
    for prompt, n in JOBS + [(p, 40) for p in PROMPTS]:
        alone[(tuple(prompt), n)] = [t for e in decode(plain, prompt, GenerationSettings(max_new_tokens=n), plain=True)
                                     for t in e.ids]
    # a trie of the target's own continuations: long accepted runs, so that rows finish at different steps
    cheat = Trie.build([p + alone[(tuple(p), 40)] for p in PROMPTS], order=3)
    return SimpleNamespace(model=model, alone=alone, cheat=cheat)


def engine_for(tiny, *, adaptive=False, keep=20):
    return Engine(tiny.model.target, DartDrafter(tiny.model.head), tiny.cheat, eos_ids=(EOS,), tree_eos_id=EOS,
                  tree=TreeSettings(keep=keep), shapes=ShapeSettings(min_bucket=64), adaptive=adaptive)


def serve(engine, overlap, jobs=JOBS, slots=4, late_after=3, cancel_after=None):
    """The jobs through a pool (the last one submitted after `late_after` steps); with `cancel_after`
    the first request is cancelled after that many steps. → (handles, pool)."""
    pool = engine.batcher(slots, 256, overlap=overlap)
    try:
        handles = [pool.submit(p, GenerationSettings(max_new_tokens=n, max_length=256)) for p, n in jobs[:-1]]
        steps = 0
        while pool.active:
            moved = pool.step()
            assert len({id(r) for r, _, _ in moved}) == len(moved)  # one event per request and step
            for request, _, _ in moved:
                if request.done:
                    assert request not in pool.busy
            steps += 1
            if steps == late_after:
                handles.append(pool.submit(jobs[-1][0], GenerationSettings(max_new_tokens=jobs[-1][1], max_length=256)))
            if steps == cancel_after:
                pool.cancel(handles[0])
    finally:
        pool.close()
    return handles, pool


@pytest.mark.extended
def test_overlap_gives_the_outputs_of_the_default_pool_and_of_plain_decoding(tiny):
    engine = engine_for(tiny)
    expected = [tiny.alone[(tuple(p), n)] for p, n in JOBS]
    default, _ = serve(engine, False)
    overlapped, pool = serve(engine, True)
    assert [h.token_ids for h in default] == [h.token_ids for h in overlapped] == expected
    assert pool.overlap_stats["half_steps"] > 4 and pool.overlap_stats["search_s"] > 0
    for d, o in zip(default, overlapped):
        s = o.stats
        assert s.steps == len(s.accept_lengths) == len(s.tree_sizes) and s.new_tokens == len(o.token_ids)
        assert set(s.tree_sizes) == {20}
        assert s.tree_s > 0 and s.device_s > 0 and s.total_s >= s.device_s
        # the same sequence of accepted lengths: a row's step is the same computation in either mode
        assert s.accept_lengths == d.stats.accept_lengths
    assert max(n for h in overlapped for n in h.stats.accept_lengths) >= 3
    # and nothing compiles once both halves' shapes have been seen
    with compilations() as compiles:
        again, _ = serve(engine, True)
    assert [h.token_ids for h in again] == expected
    assert compiles == []


@pytest.mark.extended
def test_cancelling_a_request_in_flight_leaves_the_others_exact(tiny):
    engine = engine_for(tiny)
    handles, pool = serve(engine, True, cancel_after=5)
    first = tiny.alone[(tuple(JOBS[0][0]), JOBS[0][1])]
    assert handles[0].finish_reason == "cancelled" and handles[0].token_ids == first[:len(handles[0].token_ids)]
    assert [h.token_ids for h in handles[1:]] == [tiny.alone[(tuple(p), n)] for p, n in JOBS[1:]]


@pytest.mark.extended
def test_sampled_outputs_match_the_default_path(tiny):
    """With a fixed tree size, sampling too: each row keeps its own key, split once per step of it."""
    engine = engine_for(tiny)

    def run(overlap):
        pool = Batcher(engine, 4, 256, overlap=overlap)
        try:
            handles = [pool.submit(p, GenerationSettings(max_new_tokens=n, temperature=0.8 if i % 2 else 0.0,
                                                         top_k=10, seed=i, max_length=256))
                       for i, (p, n) in enumerate(JOBS[:4])]
            for _ in Driver(pool).run():
                pass
        finally:
            pool.close()
        return [h.token_ids for h in handles], pool

    default, _ = run(False)
    overlapped, pool = run(True)
    assert overlapped == default and pool.overlap_stats["half_steps"] > 0


@pytest.mark.extended
def test_tree_size_changing_per_half_step(tiny):
    """keep="auto" picks a size before each half's search (here a fixed rotation instead of timings:
    sizes 20, 3 and 0, a plain chunk of the whole pool, which stops the pipeline): outputs stay exact."""
    engine = engine_for(tiny, adaptive=True)
    assert 0 in engine.tree_sizes and 3 in engine.tree_sizes
    rotation, observed = itertools.cycle([20, 3, 20, 20, 3, 20, 0]), []
    engine.sizer.choose = lambda rows, calibrate, live: next(rotation)
    engine.sizer.observe = lambda *args: observed.append(args)
    handles, pool = serve(engine, True)
    assert [h.token_ids for h in handles] == [tiny.alone[(tuple(p), n)] for p, n in JOBS]
    sizes = {size for h in handles for size in h.stats.tree_sizes}
    assert sizes == {0, 3, 20} and pool.overlap_stats["half_steps"] > 0 and pool.overlap_stats["restarts"] >= 1
    assert observed and all(size in (0, 3, 20) and seconds > 0 for size, _, _, seconds, _ in observed)


def test_plain_pool_has_no_overlap(model):
    with pytest.raises(ValueError, match="overlap"):
        model.engine.batcher(2, 128, plain=True, overlap=True)


@pytest.mark.extended
def test_each_row_keeps_its_own_acceptance(tiny):
    """keep="auto" in a pool (sizes played in a rotation): every busy slot has its own acceptance
    figures (new at its admission), the choice sees the busy rows' figures, and each tree step's
    accepted length goes into the figures of the request that took it, none into another's; oracle:
    each request's own stats (tree size and accepted length per step). A second look (its three
    sizes compile at every row count): tests/test_adaptive.py holds the per-sequence rule to a
    restatement, tests/test_engine.py the adaptive pool's outputs and plain chunks."""
    engine = engine_for(tiny, adaptive=True)
    observe, by_figures, rotation = engine.sizer.observe, {}, itertools.cycle([3, 20, 3, 0])
    held = []  # every figures object seen stays alive, so no later one can take its id

    def choose(rows, calibrate, live):
        assert len({id(f) for f in live}) == len(live) == sum(r is not None for r in pool_of[0].busy)
        return next(rotation)

    def spy(size, rows, accepted, seconds, per_row=()):
        for figures, count in per_row:
            if size:
                held.append(figures)
                by_figures.setdefault(id(figures), []).append((size, int(count)))
        observe(size, rows, accepted, seconds, per_row)

    engine.sizer.observe, engine.sizer.choose = spy, choose
    pool_of, batcher = [], engine.batcher

    def batcher_spy(*args, **kwargs):
        pool_of.append(batcher(*args, **kwargs))
        return pool_of[0]

    engine.batcher = batcher_spy
    handles, _ = serve(engine, False)
    assert [h.token_ids for h in handles] == [tiny.alone[(tuple(p), n)] for p, n in JOBS]
    own = [[(size, count) for size, count in zip(h.stats.tree_sizes, h.stats.accept_lengths) if size]
           for h in handles]
    assert sum(map(len, own)) > len(handles)  # tree steps were taken
    assert sorted(by_figures.values()) == sorted(steps for steps in own if steps)
