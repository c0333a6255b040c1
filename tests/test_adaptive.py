"""The adaptive tree budget's policy (dart_jax.decoding.adaptive) on synthetic devices: given step
costs and acceptance curves, it must settle on the size that an exhaustive calculation says is
fastest, and keep looking at the others; on a machine whose load comes and goes too."""
from __future__ import annotations

import bisect
import collections
import math
import random

import pytest

from dart_jax.decoding.adaptive import TreeSizer, auto_sizes

SIZES = (0, 3, 7, 15, 31, 60)
CHUNK = 16


class Device:
    """A synthetic device on a fake clock: a call of size s takes cost_ms[s] (dry calls: `dry_ms`,
    where given) times the machine's load at the moment it starts (`load(now)`, 1 when quiet), and
    moves the clock by that much. `calls` counts calls by size (dry ones too)."""

    def __init__(self, cost_ms, load=lambda now: 1.0, dry_ms=None):
        self.cost_ms, self.load, self.dry_ms = cost_ms, load, dry_ms or cost_ms
        self.now = 0.0
        self.calls = collections.Counter()
        self.dry = []  # (rows, sizes) of each dry calibration

    def clock(self):
        return self.now

    def call(self, size, table=None):
        seconds = self.load(self.now) * (table or self.cost_ms)[size] / 1e3
        self.now += seconds
        self.calls[size] += 1
        return seconds

    def calibrate(self, rows, sizes):
        self.dry.append((rows, list(sizes)))
        return [self.call(s, self.dry_ms) for s in sizes]


def sizer_on(device, sizes=SIZES, **kw):
    return TreeSizer(sizes, plain_tokens=CHUNK, depth=8, clock=device.clock, **kw)


def simulate(cost_ms, tau, steps=400, **kw):
    """Drive a sizer against a device whose step of size s costs cost_ms[s] and accepts tau(s)
    tokens per sequence (size 0: a plain chunk of CHUNK tokens)."""
    device = Device(cost_ms)
    sizer = sizer_on(device, **kw)
    chosen = []
    for _ in range(steps):
        size = sizer.choose(1, device.calibrate)
        chosen.append(size)
        accepted = CHUNK if size == 0 else tau(size)
        sizer.observe(size, 1, accepted, device.call(size))
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
    device = Device(CPU_LIKE)
    sizer = sizer_on(device)
    chosen = []
    for step in range(600):
        tau = bad if step < 300 else good  # the text turns predictable half way
        size = sizer.choose(1, device.calibrate)
        chosen.append(size)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), device.call(size))
    assert collections.Counter(chosen[200:300]).most_common(1)[0][0] == 0
    assert any(s > 0 for s in chosen[200:300]), "no look at the drafts while decoding plainly"
    late = collections.Counter(chosen[450:])
    assert late.most_common(1)[0][0] == best_by_enumeration(CPU_LIKE, good)


def test_costs_are_timed_ahead_once_per_row_count_only_when_eager():
    """`eager` (a warm-up): every size dry at a row count's first step, each once to compile it and
    then in rounds back to back; later steps of that row count time nothing ahead. Otherwise
    (the default) nothing runs ahead: the first step of a row count compiles one size."""
    sizes = (0, 3, 60)
    device = Device({0: 16.0, 3: 2.0, 60: 4.0})
    sizer = sizer_on(device, sizes, eager=True)
    for rows in (1, 1, 2, 1, 2):
        size = sizer.choose(rows, device.calibrate)
        sizer.observe(size, rows, CHUNK if size == 0 else 2.0, device.call(size))
    assert device.dry == [(rows, [0, 3, 60] + [0, 3, 60] * 3) for rows in (1, 2)]
    assert sizer.costs(1) == pytest.approx({0: 16.0, 3: 2.0, 60: 4.0})  # in plain tokens (1 ms each)
    lazy_device = Device({0: 16.0, 3: 2.0, 60: 4.0})
    lazy = sizer_on(lazy_device, sizes)
    first = lazy.choose(1, lazy_device.calibrate)
    assert lazy_device.dry == [] and first == 3  # the prior's favourite: 4 tokens for 1.5 plain tokens


def test_sizes_and_their_checks():
    assert auto_sizes(60) == (3, 15, 60)
    assert auto_sizes(8) == (8,)  # a 4-node tree is within 3x of a 9-node one: left out
    assert auto_sizes(11) == (3, 11)
    assert auto_sizes(46) == (3, 46) and auto_sizes(47) == (3, 15, 47)
    assert auto_sizes(100) == (3, 15, 100)  # a 64-node tree within 3x of a 101-node one
    assert auto_sizes(3) == (3,)
    assert TreeSizer((16,)).choose(1, lambda rows, sizes: pytest.fail("a fixed size needs no timing")) == 16
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
    device = Device(true_ms, dry_ms={s: (2.2 if s == wrong_size else 1.0) * true_ms[s] for s in SIZES})
    sizer = sizer_on(device, eager=True)
    chosen = []
    for _ in range(300):
        size = sizer.choose(1, device.calibrate)
        chosen.append(size)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), device.call(size))
    late = collections.Counter(chosen[150:])
    assert late.most_common(1)[0][0] == best, (late, sizer.summary())


def test_one_stalled_step_does_not_turn_the_choice():
    """A plain chunk that stalls once (50× its usual time: an executable loaded for a new window)
    must not hand the next steps to a tree that is slower."""
    tau = saturating(0.4)  # poor drafts: plain decoding is the fastest by far
    device = Device(CPU_LIKE)
    sizer = sizer_on(device)
    for _ in range(40):
        size = sizer.choose(1, device.calibrate)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), device.call(size))
    assert sizer.choose(1, device.calibrate) == 0
    sizer.observe(0, 1, CHUNK, 50 * device.call(0))
    after = [sizer.choose(1, device.calibrate) for _ in range(3)]
    assert after.count(0) >= 2, (after, sizer.summary())


def test_drafting_pays_only_where_some_tree_could_beat_plain_decoding():
    """`drafting_pays` against a direct calculation: some size's most accepted tokens per second
    above plain decoding's (a size timed dry only, or by fewer than 5 samples of real steps,
    counted at half its cost)."""
    def sizer_after(cost_ms, observe):
        device = Device(cost_ms)
        sizer = sizer_on(device, eager=True)
        assert sizer.drafting_pays(1)  # nothing measured yet
        sizer.choose(1, device.calibrate)
        for s in observe:  # every size three times in turn: 5 samples or more of each one's real steps
            sizer.observe(s, 1, CHUNK if s == 0 else 1.0, device.call(s))
        return sizer

    def oracle(cost_ms, observed):
        plain = CHUNK / cost_ms[0]
        return any(min(s, 8) + 1 > plain * cost_ms[s] / (1 if s in observed else 2) for s in SIZES if s)

    slow_verify = {0: 16 * 0.5, 3: 9.0, 7: 12.0, 15: 20.0, 31: 40.0, 60: 80.0}  # a tree never pays
    for cost_ms in (GPU_LIKE, CPU_LIKE, slow_verify):
        for observed in ((), SIZES * 3):
            assert sizer_after(cost_ms, observed).drafting_pays(1) == oracle(cost_ms, observed)
    assert not sizer_after(slow_verify, SIZES * 3).drafting_pays(1)
    assert sizer_after(slow_verify, SIZES * 3).drafting_pays(2)  # another row count: not measured yet
    assert sizer_after(GPU_LIKE, SIZES * 3).drafting_pays(1)
    lazy_device = Device(slow_verify)
    lazy = sizer_on(lazy_device)
    for s in (7, 7, 3):  # trees only: plain decoding not timed yet, so a tree may still pay
        lazy.observe(s, 1, 1.0, lazy_device.call(s))
    assert lazy.drafting_pays(1)


# ------------------------------------------------------------------------------------------------
# per-sequence acceptance (RowAcceptance) against a plain restatement of the rule

POOL_SIZES, DEPTH = (0, 3, 15), 8
POOL_MS = {0: CHUNK * 17.0, 3: 40.0, 15: 60.0}  # a CPU: a chunk of plain tokens, two tree sizes


class RuleOracle:
    """The rule of dart_jax.decoding.adaptive restated: per row, an estimate per tree size that
    starts a quarter of the way from the pooled figure to the most a step accepts and moves toward
    each own step by max(1/(k+1), 0.15) (at least 1/2 for the first tree step after plain chunks);
    the pool step takes the tree size of most sum_r accept_r(s) / cost(s), or plain decoding where
    its rate beats every tree size's with each row's estimate raised by one standard error
    sqrt(spread / min(k+1, (2 − 0.15) / 0.15)) (spread: the running mean, weight 0.2, of the
    squared miss of a row's estimate by its step, over all rows; 1 before any); after plain chunks
    of at least 10 × a tree step's cost in some row, a probe at the best tree size."""

    def __init__(self, pooled):
        self.pooled = pooled
        self.spread = {}

    def most(self, s):
        return CHUNK if s == 0 else min(s, DEPTH) + 1

    def new_row(self):
        return {"tau": {s: self.pooled[s] + 0.25 * (self.most(s) - self.pooled[s]) for s in (3, 15)},
                "n": {3: 0, 15: 0}, "plain_s": 0.0, "stale": False}

    def accept(self, row, s):
        if s == 0:
            return CHUNK
        value = row["tau"][s]
        if row["n"][s]:
            return value
        if s == 15 and row["n"][3]:
            value = max(value, row["tau"][3])
        if s == 3 and row["n"][15]:
            value = min(value, row["tau"][15])
        return min(value, self.most(s))

    def doubt(self, row, s):
        return (self.spread.get(s, 1.0) / min(row["n"][s] + 1, (2 - 0.15) / 0.15)) ** 0.5

    def choose(self, rows):
        rate = {s: sum(self.accept(r, s) for r in rows) / POOL_MS[s] for s in POOL_SIZES}
        best = 3 if rate[3] >= rate[15] else 15
        if all(rate[0] > sum(self.accept(r, s) + self.doubt(r, s) for r in rows) / POOL_MS[s] for s in (3, 15)):
            best = 0
        if best == 0:
            probe = 3 if rate[3] >= rate[15] else 15
            if max(r["plain_s"] for r in rows) >= 10 * POOL_MS[probe]:
                for r in rows:
                    r["plain_s"] = 0.0
                return probe
        return best

    def observe(self, size, rows, counts):
        for r, c in zip(rows, counts):
            if size == 0:
                r["plain_s"] += POOL_MS[0]
                r["stale"] = True
                continue
            r["n"][size] += 1
            miss = (c - r["tau"][size]) ** 2
            self.spread[size] = miss if size not in self.spread else 0.8 * self.spread[size] + 0.2 * miss
            w = max(1 / (r["n"][size] + 1), 0.15, 0.5 if r["stale"] else 0.0)
            r["tau"][size] += w * (c - r["tau"][size])
            r["plain_s"], r["stale"] = 0.0, False


def pool_sizer():
    """A sizer on a quiet device of POOL_MS, eager: it knows the costs from its first step, as the
    restated rule does; exploration and refresh off: these tests check the rule and the probes alone."""
    device = Device(POOL_MS)
    return TreeSizer(POOL_SIZES, plain_tokens=CHUNK, depth=DEPTH, explore_every=10 ** 9, refresh_every=10 ** 9, eager=True,
                     clock=device.clock)


def step(sizer, figures, accepted):
    """One pool step of the rows `figures`; `accepted(row, size)` scripts each row's accepted length."""
    device = sizer.clock.__self__  # the Device whose clock the sizer reads (pool_sizer)
    size = sizer.choose(len(figures), device.calibrate, figures)
    counts = [CHUNK if size == 0 else accepted(i, size) for i in range(len(figures))]
    sizer.observe(size, len(figures), sum(counts) / len(counts), device.call(size), list(zip(figures, counts)))
    return size, counts


def drafts(good_from=0, top=(3.5, 6.0), poor=(1.2, 1.3)):
    """Accepted lengths by step: poor drafts, then (from `good_from`) good ones; a little noise."""
    def accepted(t, size):
        a3, a15 = top if t >= good_from else poor
        return (a3 if size == 3 else a15) + (0.5 if t % 3 == 0 else -0.25)
    return accepted


def test_pool_choice_matches_the_restated_rule():
    """Two rows with poor drafts, one of which turns good later: every step's size is the restated
    rule's, given the same scripted acceptance and costs (trees, plain chunks and probes, trees)."""
    sizer, oracle = pool_sizer(), RuleOracle({3: 4.0, 15: 9.0})
    scripts = [drafts(good_from=10 ** 6), drafts(good_from=150, top=(4.0, 7.0))]
    figures = [sizer.row(), sizer.row()]
    rows = [oracle.new_row(), oracle.new_row()]
    chosen, t = [], 0
    for _ in range(120):
        want = oracle.choose(rows)
        size, counts = step(sizer, figures, lambda i, s: scripts[i](t, s))
        assert size == want, (t, chosen[-5:], figures, rows)
        oracle.observe(size, rows, counts)
        chosen.append(size)
        t += CHUNK if size == 0 else 1
    assert {0, 3, 15} <= set(chosen) and chosen[-1] and t > 150, chosen  # every branch of the rule


def test_one_sequence_does_not_steer_another():
    """Two sequences stepped by one engine's sizer (each alone in its pool step): the second one's
    choices are the same whether the first one drafts well or badly."""
    def run(first):
        sizer = pool_sizer()
        a, b = sizer.row(), sizer.row()
        good = drafts()
        chosen = []
        for t in range(60):
            step(sizer, [a], lambda i, s: first(t, s))
            chosen.append(step(sizer, [b], lambda i, s: good(t, s))[0])
        return chosen, sizer
    with_bad, bad_sizer = run(drafts(good_from=10 ** 6))
    with_good, good_sizer = run(drafts())
    assert with_bad == with_good
    assert bad_sizer.summary()["tau_by_size"] != good_sizer.summary()["tau_by_size"]  # the pooled figures differ


def test_a_tree_is_retried_soon_after_a_plain_stretch():
    """A sequence with poor drafts decodes plainly; a probe (3 or 15 nodes, 40 or 60 ms) follows
    once 10 × its cost of plain chunks (272 ms each) ran, so at most 3 chunks in a row; once its
    text turns predictable it is back to trees within two probes and stays there."""
    sizer = pool_sizer()
    row = sizer.row()
    turn, accepted = 400, drafts(good_from=400)
    chosen, t = [], 0
    while t < 800:
        size, counts = step(sizer, [row], lambda i, s: accepted(t, s))
        chosen.append((t, size))
        t += counts[0]
    before = [s for tt, s in chosen if 100 <= tt < turn]
    assert before.count(0) > len(before) / 2, before  # plain decoding while the drafts are poor
    runs, gap = [], 0
    for s in before:
        gap = gap + 1 if s == 0 else 0
        runs.append(gap)
    most_chunks = -(-10 * max(POOL_MS[3], POOL_MS[15]) // POOL_MS[0])
    assert most_chunks == 3 and max(runs) <= most_chunks, before
    after = [s for tt, s in chosen if tt >= turn]
    last_plain = max((i for i, s in enumerate(after) if s == 0), default=-1)
    assert last_plain < 2 * (most_chunks + 1) and after[-1], after[:20]


def test_a_new_sequence_starts_from_the_pooled_figures_a_quarter_of_the_way_to_the_most():
    sizer = pool_sizer()
    for _ in range(30):
        step(sizer, [sizer.row()], lambda i, s: 1.0)  # rows whose drafts never accept a token
    pooled = sizer.summary()["tau_by_size"]
    pooled.setdefault(3, min(pooled[15], 4))  # a size not tried: the bigger tree's figure, at most 3 + 1
    prior = sizer.row().tau
    for s in (3, 15):
        most = min(s, DEPTH) + 1
        assert pooled[s] < 2 and prior[s] == pytest.approx(pooled[s] + 0.25 * (most - pooled[s]), abs=1e-3)


def test_a_short_run_of_poor_drafts_does_not_send_a_paying_sequence_to_plain_decoding():
    """A sequence whose drafts pay on average (3 nodes accept 2.9 a step against the 2.35 at which
    a 40 ms tree step and 17 ms plain tokens break even) but come in runs of 1s (three in a row every
    ten steps, as real text gives them) stays on trees; one that accepts 1.2 a step goes plain."""
    pattern = [4, 4, 1, 1, 1, 4, 3, 3, 4, 4]  # mean 2.9
    assert sum(pattern) / len(pattern) > 40.0 / 17.0
    sizer = pool_sizer()
    row = sizer.row()
    chosen = [step(sizer, [row], lambda i, s: pattern[t % len(pattern)] + (0.0 if s == 3 else 0.3))[0]
              for t in range(200)]
    assert 0 not in chosen, chosen
    poor = sizer.row()
    chosen = [step(sizer, [poor], lambda i, s: 1.2)[0] for _ in range(60)]
    assert chosen[-10:].count(0) >= 5, chosen


def contention(seed: int, steps: int):
    """A machine shared with busy neighbours: per step, the factor by which everything runs slower
    than alone; quiet stretches and bursts of 2.5–4× of random length, as other processes come and go."""
    rng, factors, busy = random.Random(seed), [], False
    while len(factors) < steps:
        busy = not busy
        level = rng.uniform(2.5, 4.0) if busy else 1.0
        factors += [level * rng.uniform(0.9, 1.1)] * rng.randint(3, 25)
    return factors[:steps]


@pytest.mark.parametrize("seed", range(4))
def test_a_busy_machine_does_not_send_paying_drafts_to_plain_decoding(seed):
    """Good drafts on a CPU-like device, where a tree pays (the fixed best tree is about 1.3× plain
    decoding, as the demo's is): with every observed step slowed by the contention of its moment (the same factor for
    whatever size runs then, as other processes slow all work alike), the sizer stays on trees and
    on the fastest one; the costs it compares are the same steps' relative costs, not timings taken
    at different moments."""
    tau = saturating(7.0)
    best = best_by_enumeration(CPU_LIKE, tau)
    assert best != 0 and (tau(best) / CPU_LIKE[best]) / (CHUNK / CPU_LIKE[0]) > 1.25
    device = Device(CPU_LIKE)
    sizer = sizer_on(device)
    chosen = []
    for load in contention(seed, 500):
        device.load = lambda now, load=load: load
        size = sizer.choose(1, device.calibrate)
        chosen.append(size)
        sizer.observe(size, 1, CHUNK if size == 0 else tau(size), device.call(size))
    late = collections.Counter(chosen[100:])
    assert late[0] <= 0.05 * sum(late.values()), (late, sizer.summary())
    assert late.most_common(1)[0][0] == best, (late, sizer.summary())


def bursts(seed: int, horizon_s: float):
    """The load of a machine shared with busy neighbours, in time (the fake clock's seconds): quiet
    stretches and bursts of 1.5–4× lasting 10–400 ms each (a few tree steps to hundreds, inside one
    plain chunk or across several), as other processes come and go; each call ±15 % on its own."""
    rng, jitter = random.Random(seed), random.Random(seed + 1000)
    edges, levels, now, busy = [], [], 0.0, rng.random() < 0.5
    while now < horizon_s:
        now += rng.uniform(0.01, 0.4)
        edges.append(now)
        levels.append(rng.uniform(1.5, 4.0) if busy else 1.0)
        busy = not busy
    return lambda now: levels[min(bisect.bisect_right(edges, now), len(levels) - 1)] * jitter.uniform(0.85, 1.15)


def integer_draws(seed: int):
    """Accepted lengths as whole tokens whose mean is the curve's: floor(tau) or one more."""
    rng = random.Random(seed)
    return lambda tau: math.floor(tau) + (rng.random() < tau - math.floor(tau))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("top", [7.0, 0.4])
def test_under_bursts_of_contention_trees_where_they_pay_and_plain_where_they_do_not(seed, top):
    """A fake clock whose load comes in bursts (`bursts`: every call slowed by the load of its
    moment, so calls made back to back share it), whole accepted lengths around the curve: where
    the best fixed tree beats plain decoding (1.31× here) the sizer stays on trees, mostly the best
    one, and where drafts do not pay (0.58× at best) it decodes plainly; either way its choices are
    worth at least 90 % of the best fixed choice's tokens per unit of the device's own time (the
    load left out: what the choices give, not what the neighbours took)."""
    tau = saturating(top)
    rate = {s: (CHUNK if s == 0 else tau(s)) / CPU_LIKE[s] for s in SIZES}  # tokens per ms, alone
    best = max(SIZES, key=rate.get)
    pays = top > 1
    assert (best != 0) == pays and (rate[best] / rate[0] > 1.25 if pays else max(rate[s] for s in SIZES if s) / rate[0] < 0.6)
    device = Device(CPU_LIKE, load=bursts(seed, 120.0))
    sizer = sizer_on(device)
    draw = integer_draws(seed)
    chosen, tokens, work = [], 0.0, 0.0
    for step in range(1500):
        size = sizer.choose(1, device.calibrate)
        accepted = CHUNK if size == 0 else draw(tau(size))
        sizer.observe(size, 1, accepted, device.call(size))
        chosen.append(size)
        if step >= 300:
            tokens, work = tokens + accepted, work + CPU_LIKE[size]
    assert device.now < 120.0
    late = collections.Counter(chosen[300:])
    assert tokens / work >= 0.9 * rate[best], (tokens / work, rate, late, sizer.summary())
    if pays:
        assert late[0] <= 0.02 * sum(late.values()) and late.most_common(1)[0][0] == best, (late, sizer.summary())
    else:
        plain_ms = late[0] * CPU_LIKE[0]
        assert plain_ms >= 0.8 * sum(n * CPU_LIKE[s] for s, n in late.items()), (late, sizer.summary())
