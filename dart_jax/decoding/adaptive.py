"""The adaptive tree budget (`keep="auto"`): each step uses the draft tree size that is expected to
give the most tokens per second on this device, for the sequences it decodes.

Why: a bigger tree accepts more tokens per step (the best tree of `s` nodes is the first `s` of
the best-first selection, so it contains every smaller one) but costs more to verify. On a GPU a
60-node verify costs about one decode step, so the biggest tree pays; on a CPU the cost grows with
the tree and a big tree only pays when the drafts are good. Which size wins depends on the
device, the model, the batch and the text, so it is measured, not guessed:

- **cost** (per pool, shared by its rows): the first time a pool steps with a given number of live
  rows, every size's whole step (tree search, transfers, device work) is timed on the pool's own
  caches (dry steps whose results are dropped: their writes land past the committed length, which
  the next real step overwrites); size 0 is a chunk of plain decoding. While decoding, a size's own
  steps replace its entry with their exponential average, and the sizes not used lately follow the
  average ratio of observed to timed steps, so the table tracks the growing attention window and
  the machine's load. An observation counts as at most twice the running figure: a one-off stall
  (an executable loaded for a new window, another process) does not steer the choice for long.
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
sum over r in R of accept_r(s) / cost(s), the pool's expected tokens per second (one size serves
the whole pool step; ties go to the smaller size), unless plain decoding beats every tree size
even with doubt: each row's estimate of the size raised by `plain_doubt` standard errors
(spread(s) / sqrt(n), spread(s) the pooled running spread of a step's accepted length around its
sequence's estimate, n the row's own steps of the size plus its prior, at most the
(2 − w) / w steps an average of weight w remembers). A tree step is cheap and tells how the text
drafts; a plain chunk commits many tokens blind, and a sequence's estimate after a few steps is
noisy (one step accepts one token, the next several), so a short run of poor drafts alone does
not send a sequence whose drafts pay to plain decoding. Two ways back from a choice:

- **probe**: while plain chunks win, each row counts the seconds of plain decoding since its last
  tree step; once some live row has spent `cost(probe) / probe_share` there, the next step is a
  tree of the size with the best expected rate (a probe), so that a sequence whose text turns
  predictable gets trees back within a chunk or two. A probe costs at most `probe_share` of the
  time spent decoding plainly, less the tokens it still commits (a bonus at least).
- **exploration**: every `explore_every` steps (every quarter of that while plain chunks win) a size that could still beat the current choice even
  at its most accepted is tried once, and a size that cannot is never paid for (a size whose cost
  comes from the dry steps alone counts as hopeful at half that cost, so that one noisy timing at
  warm-up does not rule it out for good).

Where no tree size could beat plain decoding even at its most accepted (a device on which
verifying costs too much for this model), the engine decodes new requests with its plain decoder,
without the drafter's prefill and calls (`drafting_pays`). Every size is one compiled variant of
the step (a handful of sizes), so nothing compiles after the first steps.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from dart_jax.models.multihost import agree


def auto_sizes(keep: int) -> tuple[int, ...]:
    """The tree sizes (nodes besides the root) that `keep="auto"` chooses among, up to `keep`:
    3, 15, 63, … (node counts 4, 16, 64 with the root: each size costs a compilation, so they are
    spaced by 4×) and `keep` itself."""
    sizes = [s for s in (3, 15, 63, 255) if s < keep]
    return tuple(sizes) + (int(keep),)


@dataclasses.dataclass
class RowAcceptance:
    """One sequence's acceptance figures (module docstring): per tree size, its estimate of the
    accepted length and how many of its own steps went into it; the seconds of plain decoding
    since its last tree step."""

    tau: dict[int, float]  # starts at the prior (`TreeSizer.row`)
    seen: dict[int, int] = dataclasses.field(default_factory=dict)
    plain_s: float = 0.0  # plain decoding since its last tree step or probe
    stale: bool = False  # a plain chunk since its last tree step


@dataclasses.dataclass
class TreeSizer:
    """The per-step choice of a tree size among `sizes` (ascending), for one engine: the costs and
    the pooled acceptance (a new sequence's prior) carry over from one generation (or pool) to the
    next; each sequence's own figures live in its `RowAcceptance` (`row()`)."""

    sizes: tuple[int, ...]
    plain_tokens: int = 0  # tokens per call of size 0 (a chunk of plain decoding), when it is a choice
    depth: int | None = None  # the deepest tree (draft rows): a step accepts at most min(size, depth) + 1
    explore_every: int = 16
    smoothing: float = 0.2  # weight of the newest observation in the pooled running averages
    row_smoothing: float = 0.15  # the least weight of a sequence's newest step in its own estimate
    plain_doubt: float = 1.0  # standard errors added to a sequence's tree estimates against plain decoding
    prior_optimism: float = 0.25  # a new sequence's prior: this share of the way from the pooled figure to the most
    probe_share: float = 0.1  # a probe after plain decoding costs at most this share of its time
    _costs: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
    _tau: dict[int, float] = dataclasses.field(default_factory=dict)
    _spread: dict[int, float] = dataclasses.field(default_factory=dict)  # size → running mean squared error of row estimates
    _scale: float = 1.0
    _seconds: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)  # (rows, size) → observed
    _steps: int = 0
    _last: int | None = None

    def __post_init__(self):
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 0:
            raise ValueError(f"tree sizes must be distinct integers >= 0 in ascending order, got {self.sizes}.")
        if 0 in self.sizes and self.plain_tokens < 1:
            raise ValueError("size 0 (plain decoding) needs plain_tokens >= 1.")

    @property
    def adaptive(self) -> bool:
        return len(self.sizes) > 1

    def costs(self, rows: int, measure: Callable[[int], dict[int, float]]) -> dict[int, float]:
        """Seconds per device step of each size for a pool step over `rows` rows: measured once
        (`measure(rows)`), then kept."""
        if rows not in self._costs:
            self._costs[rows] = measure(rows)
        return self._costs[rows]

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

    def choose(self, rows: int, measure: Callable[[int], dict[int, float]],
               live: Sequence[RowAcceptance] = ()) -> int:
        """The size for the next step of a pool computing `rows` rows whose busy sequences have the
        figures `live` (none given: one sequence with the pooled figures); `measure(rows)` times
        every size the first time a row count is seen. Over several processes, process 0's choice
        (each process times its own steps, and all must run the same one)."""
        if not self.adaptive:
            return self.sizes[0]
        return agree(self._choose(rows, measure, live))

    def _choose(self, rows: int, measure: Callable[[int], dict[int, float]], live: Sequence[RowAcceptance]) -> int:
        costs = self.costs(rows, measure)
        cost = {s: self._seconds.get((rows, s), self._scale * costs[s]) for s in self.sizes}
        members = list(live) or [None]
        rate = {s: sum(self.row_accept(r, s) for r in members) / cost[s] for s in self.sizes}
        trees = [s for s in self.sizes if s]
        best = max(trees, key=lambda s: (rate[s], -s)) if trees else 0
        if 0 in self.sizes and all(rate[0] > rate[s] + sum(self.doubt(r, s) for r in members) / cost[s] for s in trees):
            best = 0
        self._steps += 1
        if best == 0 and trees and live:
            probe = max(trees, key=lambda s: (rate[s], -s))
            if max(r.plain_s for r in live) * self.probe_share >= cost[probe]:
                for r in live:
                    r.plain_s = 0.0
                return probe
        # sooner while plain chunks win (many tokens a call; with rows given the probes come first)
        every = max(self.explore_every // 4, 1) if best == 0 else self.explore_every
        if self._steps % every == 0:
            # a cost known only from the dry steps may be off (one noisy timing at warm-up): such a
            # size stays hopeful while it could win at half its timed cost, until its first real step
            hopeful = [s for s in self.sizes if s != best and len(members) * self.most_accepted(s) / cost[s]
                       * (1 if (rows, s) in self._seconds else 2) > rate[best]]
            if hopeful:
                return max(hopeful, key=lambda s: (rate[s], -s))
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
        it accepted the most it can (a cost known from the dry steps alone counted at half, as in
        the exploration): False once the costs are known and none can, so that decoding needs no
        drafter at all (the engine then runs its plain decoder). True before anything is measured.
        Over several processes, process 0's answer."""
        if not self.adaptive or 0 not in self.sizes:
            return True
        return bool(agree(int(self._drafting_pays(rows))))

    def _drafting_pays(self, rows: int) -> bool:
        if not self.adaptive or 0 not in self.sizes or rows not in self._costs:
            return True
        costs = self._costs[rows]
        cost = {s: self._seconds.get((rows, s), self._scale * costs[s]) for s in self.sizes}
        plain = self.expected_accept(0) / cost[0]
        return any(self.most_accepted(s) / cost[s] * (1 if (rows, s) in self._seconds else 2) > plain
                   for s in self.sizes if s)

    def observe(self, size: int, rows: int, accepted: float, seconds: float,
                per_row: Sequence[tuple[RowAcceptance, float]] = ()) -> None:
        """What a step of `size` did: the mean accepted length over its sequences (bonus included,
        or the tokens of a plain chunk), its time (tree search, transfers, device work), and
        `per_row` each stepped sequence's figures with its own accepted length."""
        if not self.adaptive:
            return
        a = self.smoothing
        self._tau[size] = accepted if size not in self._tau else (1 - a) * self._tau[size] + a * accepted
        key = (rows, size)
        # one slow outlier (a window size met for the first time, loaded from the compilation
        # cache; the machine busy elsewhere) counts as at most twice the running figure
        seconds = min(seconds, 2 * self._seconds.get(key, self._scale * self._costs[rows][size]))
        ratio = seconds / max(self._costs[rows][size], 1e-9)
        self._scale = ratio if self._last is None else (1 - a) * self._scale + a * ratio
        self._seconds[key] = seconds if key not in self._seconds else (1 - a) * self._seconds[key] + a * seconds
        self._last = size
        for row, count in per_row:
            if size == 0:
                row.plain_s, row.stale = row.plain_s + seconds, True
                continue
            n = row.seen.get(size, 0) + 1  # the prior counts as one observation
            row.seen[size] = n
            error = (count - row.tau[size]) ** 2
            self._spread[size] = error if size not in self._spread else (1 - a) * self._spread[size] + a * error
            weight = max(1 / (n + 1), self.row_smoothing, 0.5 if row.stale else 0.0)
            row.tau[size] += weight * (count - row.tau[size])
            row.plain_s, row.stale = 0.0, False

    def summary(self) -> dict[str, object]:
        """The running figures (for stats and benchmarks)."""
        return {"tau_by_size": {s: round(t, 3) for s, t in sorted(self._tau.items())},
                "step_ms_by_size": {rows: {s: round(1e3 * c, 3) for s, c in costs.items()}
                                    for rows, costs in self._costs.items()},
                "observed_ms": {f"{rows}x{size}": round(1e3 * t, 3) for (rows, size), t in sorted(self._seconds.items())},
                "scale": round(self._scale, 3),
                "spread_by_size": {s: round(float(np.sqrt(v)), 3) for s, v in sorted(self._spread.items())}}


def median_time(run: Callable[[], object], repeats: int) -> float:
    """The median wall time of `repeats` calls of `run` (which must block until its work is done)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
