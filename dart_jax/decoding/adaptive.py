"""The adaptive tree budget (`keep="auto"`): each step uses the draft tree size that is expected to
give the most tokens per unit of time on this device, for the sequences it decodes.

Why: a bigger tree accepts more tokens per step (the best tree of `s` nodes is the first `s` of
the best-first selection, so it contains every smaller one) but costs more to verify. On a GPU a
60-node verify costs about one decode step, so the biggest tree pays; on a CPU the cost grows with
the tree and a big tree only pays when the drafts are good. Which size wins depends on the
device, the model, the batch and the text, so it is measured, not guessed:

- **cost** (per row count of a pool step, shared by its rows), in plain tokens: a call of size s
  over m rows costs q(s) tokens of plain decoding over the same rows (size 0, a chunk of
  `plain_tokens` tokens, costs `plain_tokens`). Only ratios of calls made back to back count: other
  processes on the machine slow every call of a moment alike, so the ratio of two consecutive
  calls holds on a busy machine where wall times taken at different moments do not. Two
  consecutive calls of different sizes over the same rows (the second begun no later after the
  first than the shorter of them lasts) give one sample of log(t_b / t_a); each pair of sizes
  keeps its last `samples` (those of real steps once it has any, else dry ones). The log costs,
  plain decoding the anchor, start from the least-squares solution of each pair's median, and each
  size then takes the median over all its samples of (the other size's log cost + the sample): a
  call that stalled, or a burst that began between two calls, moves no size timed several times.
  A size without a sample is priced on the line through the tree sizes that have some (a verify's
  cost grows with its nodes), or in proportion to the prior where one has; the prior is the costs
  of the nearest row count timed, else 1 + (s + 1) / 8 plain tokens (a CPU). Compilation is no
  cost: the pool passes each call's seconds less what it spent compiling.
- **lazily timed**: nothing runs ahead. A row count's first step takes the size the priors favour
  (so that the first answer compiles one step program); after it the rule weighs plain decoding
  and the sizes run at that row count, and another size compiles and is timed when a probe, the
  exploration or the refresh first picks it, by its real steps beside steps of other sizes.
  `eager` (a warm-up that must leave nothing to compile) times every size at a row count's first
  step instead: each size once to compile it, then `calibration_rounds` rounds of every size back
  to back, dry (results dropped).
- **acceptance** (per sequence, `RowAcceptance`): each sequence keeps its own estimate per size of
  the accepted length of its steps (bonus included). A new sequence's prior is the engine's pooled
  figure (the mean over the rows of every step so far, an exponential average; for a size not tried
  yet an optimistic bound: the figure of the next bigger size tried, else the most a step can
  accept, min(size, depth) + 1) moved `prior_optimism` of the way up to that most: a new text may
  draft better than the last ones, and finding out costs a tree step or two. The prior counts as
  one observation: the k-th own step of a size weighs max(1 / (k + 1), `row_smoothing`), and the
  first tree step after plain chunks at least a half (the estimate it corrects is a chunk old), so
  the prior fades within a few steps and one sequence's bad (or good) drafts never decide another
  live sequence's estimates. A size the sequence has not stepped with yet keeps its prior, raised
  to the estimate of a smaller size it has stepped with and lowered to that of a bigger one (the
  bigger tree contains the smaller). Size 0 gives every row a whole chunk (`plain_tokens`).

The rule: a pool step over the live rows R uses the tree size s that maximises
sum over r in R of accept_r(s) / q(s), the pool's expected tokens per plain token's time (one size
serves the whole pool step; ties go to the smaller size), unless plain decoding beats every tree
size even with doubt: each row's estimate of the size raised by `plain_doubt` standard errors
(spread(s) / sqrt(n), spread(s) the pooled running spread of a step's accepted length around its
sequence's estimate, n the row's own steps of the size plus its prior, at most the
(2 − w) / w steps an average of weight w remembers). A tree step is cheap and tells how the text
drafts; a plain chunk commits many tokens blind, and a sequence's estimate after a few steps is
noisy (one step accepts one token, the next several), so a short run of poor drafts alone does
not send a sequence whose drafts pay to plain decoding. Two ways back from a choice:

- **probe**: while plain chunks win, each row counts its plain decoding since its last tree step,
  in plain tokens; once some live row has decoded q(probe) / probe_share there, the next step is a
  tree of the size with the best expected rate (a probe), so that a sequence whose text turns
  predictable gets trees back within a chunk or two. A probe costs at most `probe_share` of the
  time spent decoding plainly, less the tokens it still commits (a bonus at least).
- **exploration**: every `explore_every` steps (every quarter of that while plain chunks win) a
  size that could still beat the current choice even at its most accepted is tried once, and a
  size that cannot is never paid for. Plain decoding, the unit of every cost, comes first while it
  has no sample at that row count. A size whose cost rests on fewer than `settled` samples of real
  steps (none yet, or dry ones only) counts at half that cost, as hopeful, and as the choice it
  is held against (its rate halved): a first timing may be off, and a size not run yet is a guess.
- **refresh**: every `refresh_every` steps one size is tried once beside the current choice: one
  timed by fewer than `samples` real steps, else the runner-up by rate, so that the comparison
  that decides keeps fresh samples, and costs misjudged by samples taken across bursts, or
  changed by the load, heal.

Where no tree size could beat plain decoding even at its most accepted (a device on which
verifying costs too much for this model), the engine decodes new requests with its plain decoder,
without the drafter's prefill and calls (`drafting_pays`). Every size is one compiled variant of
the step (a handful of sizes), so nothing compiles after each has run once.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence

import numpy as np

from dart_jax.models.multihost import agree


def auto_sizes(keep: int) -> tuple[int, ...]:
    """The tree sizes (nodes besides the root) that `keep="auto"` chooses among, up to `keep`:
    3, 15, 63, … (node counts 4, 16, 64 with the root: each size costs a compilation per row count
    and attention window, so they are spaced by 4×) where `keep`'s tree has at least 3× their nodes,
    and `keep` itself. A smaller tree within 3× of `keep`'s nodes costs nearly as much to verify
    (benchmarks/RESULTS.md) while it accepts less, and a sequence stepped with it stops updating its
    estimate of the bigger tree: it is left out."""
    sizes = [s for s in (3, 15, 63, 255) if 3 * (s + 1) <= keep + 1]
    return tuple(sizes) + (int(keep),)


PRIOR_SLOPE = 1 / 8  # a tree of s nodes besides the root costs 1 + (s + 1) / 8 plain tokens before any timing

# time the calls of the given sizes over the given rows, dry and back to back: their seconds, in order
Calibrate = Callable[[int, Sequence[int]], Sequence[float]]


@dataclasses.dataclass
class RowAcceptance:
    """One sequence's acceptance figures (module docstring): per tree size, its estimate of the
    accepted length and how many of its own steps went into it; its plain decoding since its last
    tree step, in plain tokens."""

    tau: dict[int, float]  # starts at the prior (`TreeSizer.row`)
    seen: dict[int, int] = dataclasses.field(default_factory=dict)
    plain: float = 0.0  # plain tokens decoded since its last tree step or probe
    stale: bool = False  # a plain chunk since its last tree step


@dataclasses.dataclass
class _Call:
    """The last call observed: what a next call of another size pairs with."""

    rows: int
    size: int
    seconds: float
    end: float  # the sizer's clock when it was observed


@dataclasses.dataclass
class _Timing:
    """One row count's timings: per pair of sizes (a, b), a < b, the last samples of log(t_b / t_a)
    of two calls made back to back, each marked whether it came from real steps (else dry ones);
    the sizes run (compiled) at this row count."""

    pairs: dict[tuple[int, int], collections.deque] = dataclasses.field(default_factory=dict)
    run: set[int] = dataclasses.field(default_factory=set)
    calibrated: bool = False


@dataclasses.dataclass
class TreeSizer:
    """The per-step choice of a tree size among `sizes` (ascending), for one engine: the timings and
    the pooled acceptance (a new sequence's prior) carry over from one generation (or pool) to the
    next; each sequence's own figures live in its `RowAcceptance` (`row()`). `clock` is read when a
    call is observed, to tell calls made back to back."""

    sizes: tuple[int, ...]
    plain_tokens: int = 0  # tokens per call of size 0 (a chunk of plain decoding), when it is a choice
    depth: int | None = None  # the deepest tree (draft rows): a step accepts at most min(size, depth) + 1
    explore_every: int = 16
    refresh_every: int = 64  # steps between two refreshes (a size tried once beside the choice)
    smoothing: float = 0.2  # weight of the newest observation in the pooled running averages
    row_smoothing: float = 0.15  # the least weight of a sequence's newest step in its own estimate
    plain_doubt: float = 1.0  # standard errors added to a sequence's tree estimates against plain decoding
    prior_optimism: float = 0.25  # a new sequence's prior: this share of the way from the pooled figure to the most
    probe_share: float = 0.1  # a probe after plain decoding costs at most this share of its time
    samples: int = 9  # the newest samples kept per pair of sizes
    settled: int = 5  # samples of real steps before a size's cost counts in full for the exploration
    eager: bool = False  # time every size at a row count's first step (a warm-up), not as they are picked
    calibration_rounds: int = 3  # with eager: rounds of every size back to back
    clock: Callable[[], float] = time.perf_counter
    _timing: dict[int, _Timing] = dataclasses.field(default_factory=dict)
    _tau: dict[int, float] = dataclasses.field(default_factory=dict)
    _spread: dict[int, float] = dataclasses.field(default_factory=dict)  # size → running mean squared error of row estimates
    _steps: int = 0
    _last: _Call | None = None
    _samples_taken: int = 0  # every pair sample so far: what the costs below were solved from
    _solved: dict[int, tuple[int, dict[int, float]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 0:
            raise ValueError(f"tree sizes must be distinct integers >= 0 in ascending order, got {self.sizes}.")
        if 0 in self.sizes and self.plain_tokens < 1:
            raise ValueError("size 0 (plain decoding) needs plain_tokens >= 1.")

    @property
    def adaptive(self) -> bool:
        return len(self.sizes) > 1

    # ------------------------------------------------------------------ costs
    def costs(self, rows: int) -> dict[int, float]:
        """Each size's cost of a call over `rows` rows, in plain tokens (module docstring): the pair
        samples solved, a size without any priced from the others or the prior."""
        known = self._solved.get(rows)
        if known is not None and known[0] == self._samples_taken:
            return dict(known[1])
        timed = [m for m in self._timing if m != rows and self._timing[m].pairs]
        prior = self._formula()
        if timed:
            prior = self._solve(min(timed, key=lambda m: (abs(m - rows), m)), prior)
        cost = self._solve(rows, prior)
        self._solved[rows] = (self._samples_taken, cost)
        return dict(cost)

    def _formula(self) -> dict[int, float]:
        return {s: 1 + PRIOR_SLOPE * (s + 1) if s else float(self.plain_tokens) for s in self.sizes}

    def _edges(self, rows: int) -> dict[tuple[int, int], tuple[list[float], int]]:
        """(a, b) → (the samples of log(t_b / t_a) that count: those of real steps where the pair has
        any, else the dry ones; how many of real steps it has)."""
        timing, edges = self._timing.get(rows), {}
        for pair, kept in (timing.pairs.items() if timing else ()):
            live = [v for v, real in kept if real]
            edges[pair] = (live or [v for v, _ in kept], len(live))
        return edges

    def _solve(self, rows: int, prior: dict[int, float]) -> dict[int, float]:
        """The log costs from the pair samples: a least-squares start (each pair its median, the prior
        a faint pull that sets only what the pairs leave open), then each size the median over all
        its samples of (the other size's log cost + the sample), a few sweeps: one sample taken
        across the start of a burst does not move a size timed several times."""
        edges = self._edges(rows)
        anchor = math.log(self.plain_tokens) if 0 in self.sizes else None
        free = [s for s in self.sizes if s or anchor is None]
        index = {s: i for i, s in enumerate(free)}
        eqs, rhs, weights = [], [], []
        for s in free:
            eqs.append(np.eye(len(free))[index[s]])
            rhs.append(math.log(prior[s]))
            weights.append(1e-6)
        for (a, b), (values, _) in edges.items():
            eq = np.zeros(len(free))
            offset = float(statistics.median(values))
            for s, sign in ((b, 1.0), (a, -1.0)):
                if s in index:
                    eq[index[s]] += sign
                else:
                    offset -= sign * anchor
            eqs.append(eq)
            rhs.append(offset)
            weights.append(math.sqrt(len(values)))
        w = np.asarray(weights)
        solved = np.linalg.lstsq(np.asarray(eqs) * w[:, None], np.asarray(rhs) * w, rcond=None)[0]
        x = {s: float(solved[index[s]]) if s in index else anchor for s in self.sizes}
        seen: dict[int, list[tuple[int, float]]] = {}
        for (a, b), (values, _) in edges.items():
            seen.setdefault(b, []).extend((a, v) for v in values)
            seen.setdefault(a, []).extend((b, -v) for v in values)
        for _ in range(8):
            for s in free:
                if s in seen:
                    x[s] = float(statistics.median([x[t] + v for t, v in seen[s]]))
        cost = {s: math.exp(x[s]) for s in self.sizes}
        timed = sorted(s for s in seen if s)
        for s in self.sizes:
            if s and s not in seen and timed:
                cost[s] = self._extrapolate(s, {t: cost[t] for t in timed}, prior)
        return cost

    @staticmethod
    def _extrapolate(size: int, timed: dict[int, float], prior: dict[int, float]) -> float:
        """A tree size's cost from those of the tree sizes timed: on the line through them (cost in
        nodes; not falling, at least a plain token), or with one, in proportion to the prior."""
        if len(timed) == 1:
            (t, cost), = timed.items()
            return cost * prior[size] / prior[t]
        nodes = np.asarray([t + 1 for t in timed], float)
        costs = np.asarray(list(timed.values()))
        slope, level = np.polyfit(nodes, costs, 1)
        if slope < 0:
            slope, level = 0.0, float(costs.mean())
        return max(float(level + slope * (size + 1)), 1.0)

    def _real_samples(self, rows: int, size: int) -> int:
        return sum(live for pair, (_, live) in self._edges(rows).items() if size in pair)

    def _hedge(self, rows: int, size: int) -> float:
        """The share of its cost at which a size counts as hopeful: a half while its cost rests on
        fewer than `settled` samples of real steps."""
        return 0.5 if self._real_samples(rows, size) < self.settled else 1.0

    def _pair(self, timing: _Timing, a: int, seconds_a: float, b: int, seconds_b: float, real: bool) -> None:
        if a == b or seconds_a <= 0 or seconds_b <= 0:
            return
        if a > b:
            a, seconds_a, b, seconds_b = b, seconds_b, a, seconds_a
        kept = timing.pairs.setdefault((a, b), collections.deque(maxlen=self.samples))
        kept.append((math.log(seconds_b / seconds_a), real))
        self._samples_taken += 1

    def _calibrate(self, rows: int, calibrate: Calibrate) -> None:
        """`eager`: every size timed dry at this row count, each first once (compiling it where it is
        new; not a sample), then `calibration_rounds` rounds of all of them back to back."""
        timing = self._timing[rows]
        fresh = [s for s in self.sizes if s not in timing.run]
        rounds = list(self.sizes) * self.calibration_rounds
        seconds = list(calibrate(rows, fresh + rounds))[len(fresh):]
        for i in range(1, len(rounds)):
            self._pair(timing, rounds[i - 1], seconds[i - 1], rounds[i], seconds[i], real=False)
        timing.run.update(self.sizes)
        timing.calibrated = True
        self._last = None

    # ------------------------------------------------------------------ acceptance
    def most_accepted(self, size: int) -> float:
        """What one step of `size` can give at best: a whole plain chunk, or a path down a tree of
        `size` nodes (at most `depth` deep) and the bonus token."""
        if size == 0:
            return float(self.plain_tokens)
        return float(min(size, self.depth if self.depth else size) + 1)

    def expected_accept(self, size: int) -> float:
        """The pooled running mean accepted length of `size`; for a size not tried yet an optimistic
        bound: what a bigger size tried accepts (its tree contains this one), else the most it can."""
        if size in self._tau:
            return self._tau[size]
        bigger = [self._tau[s] for s in self.sizes if s > size and s in self._tau]
        return min(bigger[0], self.most_accepted(size)) if bigger and size else self.most_accepted(size)

    def row(self) -> RowAcceptance:
        """A new sequence's figures: the pooled ones moved `prior_optimism` of the way up to the most
        a step can accept, as its prior."""
        return RowAcceptance({s: self.expected_accept(s) + self.prior_optimism
                              * (self.most_accepted(s) - self.expected_accept(s)) for s in self.sizes if s})

    def row_accept(self, row: RowAcceptance | None, size: int) -> float:
        """A sequence's expected accepted length at `size` (None: the pooled figure): its own
        estimate; for a size it has not stepped with yet, its prior, at least the estimate of a
        smaller size it has stepped with and at most that of a bigger one; size 0 a whole plain chunk."""
        if row is None or size == 0:
            return self.expected_accept(size)
        if row.seen.get(size):
            return row.tau[size]
        floors = [row.tau[s] for s in self.sizes if 0 < s < size and row.seen.get(s)]
        caps = [row.tau[s] for s in self.sizes if s > size and row.seen.get(s)]
        return min([max([row.tau[size], *floors]), self.most_accepted(size), *caps])

    # ------------------------------------------------------------------ the choice
    def choose(self, rows: int, calibrate: Calibrate, live: Sequence[RowAcceptance] = ()) -> int:
        """The size for the next step of a pool computing `rows` rows whose busy sequences have the
        figures `live` (none given: one sequence with the pooled figures); `calibrate(rows, sizes)`
        times dry calls back to back, called only when `eager`. Over several processes, process 0's
        choice (each process times its own steps, and all must run the same one)."""
        if not self.adaptive:
            return self.sizes[0]
        return agree(self._choose(rows, calibrate, live))

    def _choose(self, rows: int, calibrate: Calibrate, live: Sequence[RowAcceptance]) -> int:
        timing = self._timing.setdefault(rows, _Timing())
        if self.eager and not timing.calibrated:
            self._calibrate(rows, calibrate)
        cost = self.costs(rows)
        members = list(live) or [None]
        rate = {s: sum(self.row_accept(r, s) for r in members) / cost[s] for s in self.sizes}
        # the rule weighs the sizes run at this row count (and plain decoding, whose cost is the unit);
        # a size not run yet comes in through the exploration, so that nothing compiles without a reason
        trees = [s for s in self.sizes if s and (s in timing.run or not timing.run)]
        best = max(trees, key=lambda s: (rate[s], -s)) if trees else 0
        if 0 in self.sizes and all(rate[0] > rate[s] + sum(self.doubt(r, s) for r in members) / cost[s] for s in trees):
            best = 0
        self._steps += 1
        if best == 0 and live and len(self.sizes) > 1:
            probe = max(trees or [s for s in self.sizes if s], key=lambda s: (rate[s], -s))
            if max(r.plain for r in live) * self.probe_share >= cost[probe]:
                for r in live:
                    r.plain = 0.0
                return probe
        # sooner while plain chunks win (many tokens a call; with rows given the probes come first)
        every = max(self.explore_every // 4, 1) if best == 0 else self.explore_every
        if self._steps % every == 0:
            if best and 0 in self.sizes and not any(0 in pair for pair in timing.pairs):
                return 0  # plain decoding, the unit of every cost, is timed before any other size
            # against the best at its hedged rate too: an unsettled cost of the best (one sample
            # across the start of a burst) is checked by steps beside others', not kept for good
            bar = rate[best] * self._hedge(rows, best)
            hopeful = [s for s in self.sizes if s != best
                       and len(members) * self.most_accepted(s) / (cost[s] * self._hedge(rows, s)) > bar]
            if hopeful:
                return max(hopeful, key=lambda s: (rate[s], -s))
        if self._steps % self.refresh_every == 0:
            # a size once beside the best: one timed by fewer than `samples` real steps first, else
            # the runner-up (fresh samples of the comparison that decides), so that costs misjudged
            # by samples taken across bursts, or changed by the load, heal
            others = [s for s in (0, *trees) if s != best and s in self.sizes]
            few = [s for s in others if self._real_samples(rows, s) < self.samples]
            if others:
                return max(few or others, key=lambda s: (rate[s], -s))
        return best

    def doubt(self, row: RowAcceptance | None, size: int) -> float:
        """`plain_doubt` standard errors of a sequence's estimate at a tree `size` (0 for the pooled
        figures): spread(size) / sqrt(n), n its own steps of the size and the prior, at most the
        (2 − w) / w steps that an average of least weight w = `row_smoothing` remembers; the spread
        is 1 token until a step of the size was seen."""
        if row is None:
            return 0.0
        n = min(row.seen.get(size, 0) + 1, (2 - self.row_smoothing) / self.row_smoothing)
        return self.plain_doubt * float(np.sqrt(self._spread.get(size, 1.0) / n))

    def drafting_pays(self, rows: int) -> bool:
        """Whether some tree size could beat plain decoding for a pool step over `rows` rows even if
        it accepted the most it can (its cost hedged as in the exploration): False once plain decoding
        is timed at this row count and no size can, so that decoding needs no drafter at all (the
        engine then runs its plain decoder). True before. Over several processes, process 0's answer."""
        if not self.adaptive or 0 not in self.sizes:
            return True
        return bool(agree(int(self._drafting_pays(rows))))

    def _drafting_pays(self, rows: int) -> bool:
        if not any(0 in pair for pair in self._edges(rows)):
            return True
        cost = self.costs(rows)
        plain = self.expected_accept(0) / cost[0]
        return any(self.most_accepted(s) / (cost[s] * self._hedge(rows, s)) > plain for s in self.sizes if s)

    def observe(self, size: int, rows: int, accepted: float, seconds: float,
                per_row: Sequence[tuple[RowAcceptance, float]] = ()) -> None:
        """What a step of `size` over `rows` rows did: the mean accepted length over its sequences
        (bonus included, or the tokens of a plain chunk), its seconds (tree search, transfers, device
        work; compilation left out), and `per_row` each stepped sequence's figures with its own
        accepted length. A call that follows one of another size back to back is a cost sample."""
        if not self.adaptive:
            return
        a = self.smoothing
        self._tau[size] = accepted if size not in self._tau else (1 - a) * self._tau[size] + a * accepted
        end = self.clock()
        timing = self._timing.setdefault(rows, _Timing())
        last = self._last
        if last is not None and last.rows == rows and end - seconds - last.end <= min(last.seconds, seconds):
            self._pair(timing, last.size, last.seconds, size, seconds, real=True)
        timing.run.add(size)
        self._last = _Call(rows, size, seconds, end)
        for row, count in per_row:
            if size == 0:
                row.plain, row.stale = row.plain + self.plain_tokens, True
                continue
            n = row.seen.get(size, 0) + 1  # the prior counts as one observation
            row.seen[size] = n
            error = (count - row.tau[size]) ** 2
            self._spread[size] = error if size not in self._spread else (1 - a) * self._spread[size] + a * error
            weight = max(1 / (n + 1), self.row_smoothing, 0.5 if row.stale else 0.0)
            row.tau[size] += weight * (count - row.tau[size])
            row.plain, row.stale = 0.0, False

    def summary(self) -> dict[str, object]:
        """The running figures (for stats and benchmarks): per row count the costs in plain tokens,
        the sizes run and the real steps' samples of each size's cost."""
        timed = sorted(m for m, t in self._timing.items() if t.run)
        return {"tau_by_size": {s: round(t, 3) for s, t in sorted(self._tau.items())},
                "cost_by_size": {m: {s: round(q, 3) for s, q in self.costs(m).items()} for m in timed},
                "sizes_run": {m: sorted(self._timing[m].run) for m in timed},
                "real_samples": {m: {s: self._real_samples(m, s) for s in self.sizes} for m in timed},
                "spread_by_size": {s: round(float(np.sqrt(v)), 3) for s, v in sorted(self._spread.items())}}
