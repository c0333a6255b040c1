"""A `Batcher`'s advance modes: how one pool step moves every busy slot, each a small strategy over the
pool's one core (its `PoolState`, `_search`, `_commit`, `SlotPool._record`).

`Batcher._advance` picks one per step: `Overlapped` (`overlap=True`) while its pipeline of
half-steps runs; else `PlainChunk` where the sizer chose tree size 0, else the pool's tree step,
chosen once at its construction: `DeviceLoop` where the engine searches trees on the device
(`device_steps`), `HostStep` otherwise. `time_dry` is the sizer's dry timing of those calls. Each
`advance(pool, rows, m, size, committed)` takes the busy slots `rows` among the first m live rows,
the step's tree size and the longest committed length among them, and returns the step's
`StepEvent`s; `Overlapped.advance(pool, plan)` takes its `halves` instead and chooses a size per half.
"""
from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np

from .autoregressive import attention_window
from .sampling import to_device


def commit_step(pool, slot: int, out: dict, row: int, *, size: int, device_s: float, tree_s: float) -> list:
    """`pool._commit` of one speculative step (a `step_layout` answer, row `row`): the accepted path's
    tokens after the root and the bonus; the next search reads the root first, then those."""
    count = int(out["count"][row])
    fed = np.append(out["path_tokens"][row, 1:count], out["bonus"][row])
    return pool._commit(slot, out, row, np.append(out["path_tokens"][row, :1], fed), [(fed, count)], size=size,
                        device_s=device_s, tree_s=tree_s)


class HostStep:
    """One speculative step of every busy slot: the host searches the trees (`pool._search`), one
    jitted verify (`Engine.step`) over the first m rows."""

    def advance(self, pool, rows: list[int], m: int, size: int, committed: int) -> list:
        engine = pool.engine
        window = attention_window(committed + engine.drafter.reach(pool.depth + 1), pool.length)
        with pool._compiling:
            t0 = time.perf_counter()
            packed_tree = pool._search(size, rows, m)
            t1 = time.perf_counter()
            packed, pool.state = engine.step(packed_tree, pool.state, n=size + 1, depth=pool.depth, k=pool.k,
                                             window=window)
            out = pool.outputs.unpack(np.asarray(packed))
            t2 = time.perf_counter()
        engine.sizer.observe(size, m, float(out["count"][rows].mean()), pool._uncompiled(),
                             pool._per_row(rows, out["count"][rows]))
        events = []
        for slot in rows:
            events += commit_step(pool, slot, out, slot, size=size, device_s=t2 - t1, tree_s=t1 - t0)
        return events


class DeviceLoop:
    """`engine.device_steps` speculative steps in one device call, the trees searched there
    (`Engine.steps_on_device`): one event per request and step taken, as the host's steps give."""

    def advance(self, pool, rows: list[int], m: int, size: int, committed: int) -> list:
        engine, steps = pool.engine, pool.engine.device_steps
        remaining, stops = np.zeros(m, np.int32), np.zeros(m, bool)
        for slot in rows:
            budget = pool.busy[slot].budget
            remaining[slot] = budget.limit - len(budget.out)
            stops[slot] = bool(budget.eos_ids)  # submit(..., stop_at_eos=False): no EOS stops it
        # every slot the last step may read or write: its tree past the previous steps' tokens, its draft
        reach = committed + (steps - 1) * (pool.depth + 1) + engine.drafter.reach(pool.depth + 1)
        window = attention_window(reach, pool.length)
        edit = pool.edit.device if pool.edit is not None else None
        edit_inputs = pool.edit.device_inputs(pool, rows, m, steps) if edit is not None else None
        t0 = time.perf_counter()
        pending = {name: to_device(a[:m]) for name, a in pool.proposal.items()}
        pending.update(preceding=to_device(pool.preceding[:m].astype(np.int32)),
                       preceding_len=to_device(pool.preceding_len[:m].astype(np.int32)))
        packed, pool.state = engine.steps_on_device(
            pending, pool.state, {"remaining": to_device(remaining), "stops": to_device(stops)},
            depth=pool.depth, k=pool.k, window=window,
            edit=edit, edit_inputs=edit_inputs)
        out = pool.device_outputs.unpack(np.asarray(packed))
        elapsed = time.perf_counter() - t0
        if edit is not None:
            pool.edit.device_answer(pool, rows, out)
        events = []
        for slot in rows:
            counts = [int(c) for c in out["counts"][slot] if c > 0]
            tokens = out["out"][slot, :int(out["n_out"][slot])]
            ends = np.cumsum(counts)  # each step's tokens: its accepted ones and the bonus (cut at a stop)
            events += pool._commit(slot, out, slot, out["preceding"][slot, :int(out["preceding_len"][slot])],
                                   [(tokens[end - count:end], count) for end, count in zip(ends, counts)],
                                   size=engine.tree.keep, device_s=elapsed)
        return events


class PlainChunk:
    """Tree size 0: a chunk of plain decoding for every busy slot, then one drafter call over it
    (`Engine.plain`; dart_jax.decoding.adaptive)."""

    def advance(self, pool, rows: list[int], m: int, size: int, committed: int) -> list:
        engine, chunk = pool.engine, pool.engine.plain_chunk
        with pool._compiling:
            t0 = time.perf_counter()
            remaining = np.zeros(m, np.int32)
            for slot in rows:
                budget = pool.busy[slot].budget
                remaining[slot] = budget.limit - len(budget.out)
            window = attention_window(committed + engine.drafter.reach(chunk), pool.length)
            packed, pool.state = engine.plain(to_device(pool._roots(m)), pool.state, to_device(remaining),
                                              chunk=chunk, depth=pool.depth, k=pool.k, window=window)
            out = pool.plain.unpack(np.asarray(packed))
            t1 = time.perf_counter()
        counts = out["count"][rows]
        if int(counts.max()) == chunk:  # a chunk cut short by a budget or EOS says little about plain decoding
            engine.sizer.observe(0, m, float(counts.mean()), pool._uncompiled(), pool._per_row(rows, counts))
        events = []
        for slot in rows:
            fed = out["tokens"][slot, :int(out["count"][slot])]
            root = pool.preceding[slot, pool.preceding_len[slot] - 1]
            events += pool._commit(slot, out, slot, np.append(root, fed)[-pool.context:], [(fed, fed.size)], size=0,
                                   device_s=t1 - t0, plain=True)
        return events


def time_dry(pool, m: int, committed: int, sizes) -> list[float]:
    """The seconds of a call of each of `sizes` in turn, back to back, for the first m rows (a
    tree size: the tree search on the busy rows' last proposals, the transfers and the device
    step; 0: a chunk of plain decoding and the drafter's call after it), less what each spent
    compiling: the sizer's `eager` timing (dart_jax.decoding.adaptive), on this pool's caches.
    The calls' results are dropped: their writes land at and past each row's committed length,
    which the next real step overwrites, and the lengths and keys stay."""
    engine = pool.engine
    chunk = engine.plain_chunk
    # one token more than the chunk: the rows go on, so the drafter's call is timed too
    roots, full = to_device(pool._roots(m)), to_device(np.full((m,), chunk + 1, np.int32))
    plain_window = attention_window(committed + engine.drafter.reach(chunk), pool.length)
    window = attention_window(committed + engine.drafter.reach(pool.depth + 1), pool.length)
    rows = [i for i, r in enumerate(pool.busy[:m]) if r is not None]

    def call(size: int) -> None:
        if size == 0:
            packed, pool.state = _dry(pool, lambda state: engine.plain(
                roots, state, full, chunk=chunk, depth=pool.depth, k=pool.k, window=plain_window))
        else:
            tree = pool._search(size, rows, m, dry=True)
            packed, pool.state = _dry(pool, lambda state: engine.step(
                tree, state, n=size + 1, depth=pool.depth, k=pool.k, window=window))
        np.asarray(packed)

    seconds = []
    for size in sizes:
        with pool._compiling:
            call(size)
        seconds.append(pool._uncompiled())
    return seconds


def _dry(pool, call):
    """`call(state)` (a device call that donates the state and returns (packed, its next state))
    as a dry run: its caches are kept — its writes fall at and past the committed lengths — and
    the lengths and keys it advanced are dropped (the call is given copies, the pool keeps its own)."""
    kept = pool.state
    packed, after = call(kept.replace(cache_len=jnp.copy(kept.cache_len), keys=jnp.copy(kept.keys)))
    return packed, after.replace(cache_len=kept.cache_len, keys=kept.keys)


@dataclasses.dataclass(eq=False)
class _Half:
    """One half of an overlapped pool's busy rows (rows start … start+m/2-1 of the m live ones): its
    searched trees, then its step on the device."""

    half: int  # 0 or 1
    m: int  # the pool's live rows when it was searched
    start: int
    rows: list[int]  # its busy slots
    requests: tuple  # their requests, as searched
    size: int  # tree size; 0: no trees (a plain chunk of the whole pool is due)
    tree: np.ndarray | None
    search_s: float
    packed: object = None  # the step's answer (a device array) once dispatched
    dispatched: float = 0.0
    counts: list[int] = dataclasses.field(default_factory=list)
    counted: list[int] = dataclasses.field(default_factory=list)  # the slots of `counts`


class Overlapped:
    """`Batcher(overlap=True)`'s pipeline of half-steps (batcher's module docstring): the host
    searches one half's trees while the device verifies the other's (`Engine.step_rows`). Holds the
    half in flight, the other half's searched trees, and `stats` (the pool's `overlap_stats`)."""

    def __init__(self):
        self.flight: _Half | None = None  # the half whose step is on the device
        self.ready: _Half | None = None  # the other half's searched trees, dispatched when it lands
        self.plain_due = False  # the sizer chose size 0 for a half: a plain chunk of the whole pool next
        self.stats = {"half_steps": 0, "search_s": 0.0, "wait_s": 0.0, "restarts": 0}

    def halves(self, pool) -> tuple[int, int, tuple[list[int], list[int]]] | None:
        """(m live rows, m/2, the busy rows of each half) when both halves have a busy row, else None."""
        m = pool._live()
        if m < 2:
            return None
        h = m // 2
        rows = [i for i, r in enumerate(pool.busy[:m]) if r is not None]
        low, high = [i for i in rows if i < h], [i for i in rows if i >= h]
        return (m, h, (low, high)) if low and high else None

    def drop(self) -> None:
        """Forget the step in flight (its requests stay unfinished) and the searched trees."""
        self.flight = self.ready = None

    def advance(self, pool, plan) -> list:
        """One half-step of the pipeline: (start it: search half 0, dispatch it, search half 1;) land
        the half in flight, dispatch the other, search the landed half's next trees meanwhile. With
        no `plan` (`halves`: one half has no busy row), the step in flight lands alone."""
        if plan is None:
            return self.land_alone(pool)
        t_enter = time.perf_counter()
        started = self.flight is None
        if started:
            first = None if self.plain_due else self._prepare(pool, plan, 0)
            self.plain_due = False
            if first is None or first.size == 0:
                busy = [i for i, r in enumerate(pool.busy) if r is not None]
                return pool._plain_chunk.advance(pool, busy, plan[0], 0, int(pool.committed[busy].max()))
            self.stats["restarts"] += 1
            self._dispatch(pool, first)
            self.ready = self._prepare(pool, plan, 1)
        landed, self.flight = self.flight, None
        ready, self.ready = self.ready, None
        events = self._land(pool, landed)
        plan = self.halves(pool)
        if plan is not None and plan[0] == landed.m and ready is not None and ready.size:
            m, h, halves = plan
            current = halves[ready.half]
            if current != ready.rows or any(pool.busy[r] is not q for r, q in zip(ready.rows, ready.requests)):
                ready = self._prepare(pool, plan, ready.half)  # a request of that half left meanwhile: search again
            if ready.size:
                self._dispatch(pool, ready)
                self.ready = self._prepare(pool, plan, landed.half)
            else:
                self.plain_due = True
        elif ready is not None and ready.size == 0:
            self.plain_due = True
        if not started and landed.counts:
            # a round (both halves) takes about two of these calls; the sizer's costs are per round of m rows
            pool.engine.sizer.observe(landed.size, landed.m, float(np.mean(landed.counts)),
                                      2 * (time.perf_counter() - t_enter), pool._per_row(landed.counted, landed.counts))
        return events

    def land_alone(self, pool) -> list:
        """The step in flight lands and the pipeline stops (the next step starts it again)."""
        flight, self.flight, self.ready = self.flight, None, None
        self.plain_due = False
        return self._land(pool, flight)

    def _prepare(self, pool, plan, half: int) -> _Half:
        """Half `half`'s next trees: the tree size chosen for the pool's m rows (0: none, a plain chunk
        of the whole pool is due), then the search."""
        m, h, halves = plan
        rows, engine = halves[half], pool.engine
        busy = [i for i, r in enumerate(pool.busy) if r is not None]
        committed = int(pool.committed[busy].max())
        size = engine.sizer.choose(m, lambda m, sizes: time_dry(pool, m, committed, sizes), pool._figures(busy))
        requests = tuple(pool.busy[r] for r in rows)
        if size == 0:
            return _Half(half, m, half * h, rows, requests, 0, None, 0.0)
        t0 = time.perf_counter()
        tree = pool._search(size, rows, h, half * h)
        elapsed = time.perf_counter() - t0
        self.stats["search_s"] += elapsed
        return _Half(half, m, half * h, rows, requests, size, tree, elapsed)

    def _dispatch(self, pool, half: _Half) -> None:
        """Half `half`'s step onto the device (returns at once: JAX dispatches asynchronously)."""
        engine = pool.engine
        busy = [i for i, r in enumerate(pool.busy) if r is not None]
        window = attention_window(int(pool.committed[busy].max()) + engine.drafter.reach(pool.depth + 1), pool.length)
        half.dispatched = time.perf_counter()
        half.packed, pool.state = engine.step_rows(half.tree, half.start, pool.state, n=half.size + 1,
                                                   depth=pool.depth, k=pool.k, window=window)
        self.flight = half

    def _land(self, pool, half: _Half) -> list:
        """Wait for half `half`'s step and hand its rows their tokens (a request cancelled meanwhile
        is skipped: its slot is free, and the next admission resets it)."""
        t0 = time.perf_counter()
        out = pool.outputs.unpack(np.asarray(half.packed))
        t1 = time.perf_counter()
        self.stats["wait_s"] += t1 - t0
        self.stats["half_steps"] += 1
        events, counts, counted = [], [], []
        for slot, request in zip(half.rows, half.requests):
            if pool.busy[slot] is not request:
                continue
            i = slot - half.start
            counts.append(int(out["count"][i]))
            counted.append(slot)
            # device_s: from the dispatch until the answer was on the host (the other half's search ran meanwhile)
            events += commit_step(pool, slot, out, i, size=half.size, device_s=t1 - half.dispatched,
                                  tree_s=half.search_s)
        half.counts, half.counted = counts, counted
        return events
