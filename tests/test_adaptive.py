"""The adaptive tree budget's policy (dart_jax.decoding.adaptive) on synthetic devices: given step
costs and acceptance curves, it must settle on the size that an exhaustive calculation says is
fastest, and keep looking at the others."""
from __future__ import annotations

import collections

import pytest

from dart_jax.decoding.adaptive import TreeSizer, auto_sizes

SIZES = (0, 3, 7, 15, 31, 60)
CHUNK = 16


def simulate(cost_ms, tau, steps=400):
    """Drive a sizer against a device whose step of size s costs cost_ms[s] and accepts tau(s)
    tokens per sequence (size 0: a plain chunk of CHUNK tokens)."""
    sizer = TreeSizer(SIZES, plain_tokens=CHUNK, depth=8)
    chosen = []
    for _ in range(steps):
        size = sizer.choose(1, lambda rows: {s: cost_ms[s] / 1e3 for s in SIZES})
        chosen.append(size)
        accepted = CHUNK if size == 0 else tau(size)
        sizer.observe(size, 1, accepted, cost_ms[size] / 1e3)
    return chosen, sizer


def best_by_enumeration(cost_ms, tau):
    rate = {s: (CHUNK / cost_ms[0]) if s == 0 else tau(s) / cost_ms[s] for s in SIZES}
    return max(SIZES, key=lambda s: rate[s])


GPU_LIKE = {0: 16 * 1.0, 3: 1.05, 7: 1.06, 15: 1.08, 31: 1.1, 60: 1.15}  # verify ≈ one decode step
CPU_LIKE = {0: 16 * 0.5, 3: 1.6, 7: 2.2, 15: 3.4, 31: 6.0, 60: 11.0}  # cost grows with the tree


def saturating(top):
    return lambda s: min(1 + top * (1 - 0.85 ** s), 9.0)


@pytest.mark.parametrize("cost_ms,tau", [
    (GPU_LIKE, saturating(3.0)),  # good drafts on a GPU: the biggest tree
    (CPU_LIKE, saturating(7.0)),  # very good drafts on a CPU: a middle size
    (CPU_LIKE, saturating(0.4)),  # poor drafts on a CPU: plain decoding
    (GPU_LIKE, saturating(0.1)),  # hopeless drafts, even on a GPU: plain decoding
])
def test_settles_on_the_fastest_size(cost_ms, tau):
    chosen, sizer = simulate(cost_ms, tau)
    best = best_by_enumeration(cost_ms, tau)
    counts = collections.Counter(chosen[100:])
    assert counts.most_common(1)[0][0] == best, (best, counts, sizer.summary())
    assert counts[best] >= 0.75 * sum(counts.values())


def test_keeps_exploring_and_follows_a_change_in_acceptance():
    good, bad = saturating(7.0), saturating(0.2)
    sizer = TreeSizer(SIZES, plain_tokens=CHUNK, depth=8)
    costs = {s: CPU_LIKE[s] / 1e3 for s in SIZES}
    chosen = []
    for step in range(600):
        tau = bad if step < 300 else good  # the text turns predictable half way
        size = sizer.choose(1, lambda rows: costs)
        chosen.append(size)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), costs[size])
    assert collections.Counter(chosen[200:300]).most_common(1)[0][0] == 0
    assert any(s > 0 for s in chosen[200:300]), "no look at the drafts while decoding plainly"
    late = collections.Counter(chosen[450:])
    assert late.most_common(1)[0][0] == best_by_enumeration(CPU_LIKE, good)


def test_costs_are_measured_once_per_row_count():
    calls = []
    sizer = TreeSizer((0, 3, 60), plain_tokens=CHUNK, depth=8)

    def measure(rows):
        calls.append(rows)
        return {0: 0.016, 3: 0.002, 60: 0.004}

    for rows in (1, 1, 2, 1, 2):
        size = sizer.choose(rows, measure)
        sizer.observe(size, rows, CHUNK if size == 0 else 2.0, 0.002)
    assert calls == [1, 2]


def test_sizes_and_their_checks():
    assert auto_sizes(60) == (3, 15, 60)
    assert auto_sizes(8) == (3, 8)
    assert auto_sizes(100) == (3, 15, 63, 100)
    assert auto_sizes(3) == (3,)
    assert TreeSizer((16,)).choose(1, lambda rows: pytest.fail("a fixed size needs no timing")) == 16
    with pytest.raises(ValueError, match="ascending"):
        TreeSizer((7, 3))
    with pytest.raises(ValueError, match="plain_tokens"):
        TreeSizer((0, 3))


def test_never_pays_for_a_size_that_cannot_win():
    """A step of 60 nodes accepts at most depth + 1 = 9 tokens: on the CPU-like device that is
    slower than the best smaller tree's measured rate, so it is never tried."""
    tau = saturating(7.0)
    chosen, _ = simulate(CPU_LIKE, tau)
    assert 60 not in chosen and 31 not in chosen
    best = best_by_enumeration(CPU_LIKE, tau)
    assert chosen[0] != 0 and best in chosen[:5]


@pytest.mark.parametrize("wrong_size", [0, 15])
def test_a_size_timed_too_slow_at_warm_up_is_still_found(wrong_size):
    """A dry timing more than twice as slow as the size really is (a noisy warm-up) must not rule the size
    out for good: its first real steps correct it and the sizer settles on it."""
    tau = saturating(7.0) if wrong_size else saturating(0.4)
    true_ms = dict(CPU_LIKE)
    if wrong_size:  # a machine where the 15-node tree is clearly the fastest
        true_ms[15] = 2.2
    best = best_by_enumeration(true_ms, tau)
    assert best == wrong_size
    dry = {s: (2.2 if s == wrong_size else 1.0) * true_ms[s] / 1e3 for s in SIZES}
    sizer = TreeSizer(SIZES, plain_tokens=CHUNK, depth=8)
    chosen = []
    for _ in range(300):
        size = sizer.choose(1, lambda rows: dry)
        chosen.append(size)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), true_ms[size] / 1e3)
    late = collections.Counter(chosen[150:])
    assert late.most_common(1)[0][0] == best, (late, sizer.summary())


def test_one_stalled_step_does_not_turn_the_choice():
    """A plain chunk that stalls once (50× its usual time: an executable loaded for a new window)
    must not hand the next steps to a tree that is slower."""
    tau = saturating(0.4)  # poor drafts: plain decoding is the fastest by far
    costs = {s: CPU_LIKE[s] / 1e3 for s in SIZES}
    sizer = TreeSizer(SIZES, plain_tokens=CHUNK, depth=8)
    for _ in range(40):
        size = sizer.choose(1, lambda rows: costs)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), costs[size])
    assert sizer.choose(1, lambda rows: costs) == 0
    sizer.observe(0, 1, CHUNK, 50 * costs[0])
    after = [sizer.choose(1, lambda rows: costs) for _ in range(3)]
    assert after.count(0) >= 2, (after, sizer.summary())


def test_drafting_pays_only_where_some_tree_could_beat_plain_decoding():
    """`drafting_pays` against a direct calculation: some size's most accepted tokens per second
    above plain decoding's (a dry-timed size counted at half its cost)."""
    def sizer_after(cost_ms, observe):
        sizer = TreeSizer(SIZES, plain_tokens=CHUNK, depth=8)
        assert sizer.drafting_pays(1)  # nothing measured yet
        costs = {s: cost_ms[s] / 1e3 for s in SIZES}
        sizer.costs(1, lambda rows: costs)
        for s in observe:
            sizer.observe(s, 1, CHUNK if s == 0 else 1.0, costs[s])
        return sizer

    def oracle(cost_ms, observed):
        plain = CHUNK / cost_ms[0]
        return any(min(s, 8) + 1 > plain * cost_ms[s] / (1 if s in observed else 2) for s in SIZES if s)

    slow_verify = {0: 16 * 0.5, 3: 9.0, 7: 12.0, 15: 20.0, 31: 40.0, 60: 80.0}  # a tree never pays
    for cost_ms in (GPU_LIKE, CPU_LIKE, slow_verify):
        for observed in ((), SIZES):
            assert sizer_after(cost_ms, observed).drafting_pays(1) == oracle(cost_ms, observed)
    assert not sizer_after(slow_verify, SIZES).drafting_pays(1)
    assert sizer_after(slow_verify, SIZES).drafting_pays(2)  # another row count: not measured yet
    assert sizer_after(GPU_LIKE, SIZES).drafting_pays(1)
