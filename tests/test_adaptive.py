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
