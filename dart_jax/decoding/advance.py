"""A `Batcher`'s advance modes: how one pool step moves every busy slot, each a small strategy over the
pool's one core (its `PoolState`, `_search`, `_commit`, `SlotPool._record`).

`Batcher._advance` picks one per step: `PlainChunk` where the sizer chose tree size 0, else the
pool's tree step, chosen once at its construction: `DeviceLoop` where the engine searches trees on
the device (`device_steps`), `HostStep` otherwise. `time_dry` is the sizer's dry timing of those
calls. Each `advance(pool, rows, m, size, committed)` takes the busy slots `rows` among the first m
live rows, the step's tree size and the longest committed length among them, and returns the step's
`StepEvent`s.
"""
from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from .autoregressive import attention_window


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
        pending = {name: jnp.asarray(a[:m]) for name, a in pool.proposal.items()}
        pending.update(preceding=jnp.asarray(pool.preceding[:m], jnp.int32),
                       preceding_len=jnp.asarray(pool.preceding_len[:m], jnp.int32))
        packed, pool.state = engine.steps_on_device(
            pending, pool.state, {"remaining": jnp.asarray(remaining), "stops": jnp.asarray(stops)},
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
            packed, pool.state = engine.plain(jnp.asarray(pool._roots(m)), pool.state, jnp.asarray(remaining),
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
    roots, full = jnp.asarray(pool._roots(m)), jnp.full((m,), chunk + 1, jnp.int32)
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

