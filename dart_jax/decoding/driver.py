"""The one loop that steps a pool. `Driver.step()` runs one `SlotPool.step()`, times it (its wall
seconds and the seconds it spent compiling: `TimedStep`) and gives each request its share in the
request's `WarmTime` clock (`Request.clock`: a call that compiled counts as waiting for every
request in the pool; one that moved a request without compiling counts toward its speed). Every
consumer steps its pools through it: `DartModel.generate` (one sequence in a pool of one slot,
`single`), `generate_many`, the server's scheduler and the benchmarks."""
from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

from .autoregressive import AutoregressiveDecoder, live_rows
from .batcher import PlainBatcher, Request, SlotPool, StepEvent
from .compile_time import CompileTimer
from .requests import Stats
from .settings import GenerationSettings


@dataclasses.dataclass(frozen=True)
class TimedStep:
    """One step of a pool: what it gave each request that moved, the call's wall seconds and the
    seconds of it spent compiling (tracing, lowering, XLA or the persistent cache, Numba)."""

    events: list[StepEvent]
    wall_s: float
    compile_s: float


class Driver:
    """Steps `pool` and times every step (see the module's docstring); `timer` (a new one by
    default) adds up every step's wall and compile seconds."""

    def __init__(self, pool: SlotPool, timer: CompileTimer | None = None):
        self.pool = pool
        self.timer = timer if timer is not None else CompileTimer()

    def step(self) -> TimedStep:
        pool = self.pool
        inside = [r for r in (*pool.busy, *pool.waiting) if r is not None]
        with self.timer:
            events = pool.step()
        wall, compiled = self.timer.last_wall, self.timer.last_seconds
        if compiled:  # the compilation counts for every request that waited on it
            for request in dict.fromkeys([*inside, *(e.request for e in events)]):
                request.clock.waited(compiled)
        for event in events:
            event.request.clock.moved(len(event.ids), wall, compiled=compiled > 0, same_call=event.same_call)
        return TimedStep(events, wall, compiled)

    def run(self) -> Iterator[TimedStep]:
        """Step until every submitted request is done."""
        while self.pool.active:
            yield self.step()


def pool_for(engine, slots: int, max_length: int, *, plain: bool = False) -> SlotPool:
    """A pool of `slots` sequences on `engine` (an `Engine`, or an `AutoregressiveDecoder`, which
    decodes plainly only): plain decoding with `plain`, and also where keep="auto" finds that no
    tree size can pay on this device for that many rows (`TreeSizer.drafting_pays`: the same
    output at plain decoding's speed, each token recorded with tree size 0); else the engine's
    speculative pool."""
    if isinstance(engine, AutoregressiveDecoder):
        return PlainBatcher(engine, slots, max_length)
    if plain:
        return engine.batcher(slots, max_length, plain=True)
    if not engine.sizer.drafting_pays(live_rows(slots, slots)):
        pool = engine.batcher(slots, max_length, plain=True)
        pool.tree_size = 0
        return pool
    return engine.batcher(slots, max_length)


def single(engine, prompt_ids: Sequence[int], settings: GenerationSettings = GenerationSettings(),
           stats: Stats | None = None, *, plain: bool = False) -> tuple[SlotPool, Request]:
    """A pool of one slot (`pool_for`) holding one request, the prompt checked before any cache is
    made."""
    engine.check_request(prompt_ids, settings, warn=False)
    pool = pool_for(engine, 1, settings.max_length, plain=plain)
    try:
        return pool, pool.submit(prompt_ids, settings, stats)
    except BaseException:
        pool.close()
        raise


def decode(engine, prompt_ids: Sequence[int], settings: GenerationSettings = GenerationSettings(),
           stats: Stats | None = None, *, plain: bool = False) -> Iterator[StepEvent]:
    """The events of one sequence decoded alone (`single`), step by step; the pool is closed at
    the end or when the caller stops."""
    pool, _ = single(engine, prompt_ids, settings, stats, plain=plain)
    try:
        for step in Driver(pool).run():
            yield from step.events
    finally:
        pool.close()


def decode_together(engine, prompts: Sequence[Sequence[int]], settings: Sequence[GenerationSettings], *,
                    plain: bool = False) -> list[list[int]]:
    """The new ids of each of `prompts` (a final EOS included), each with its own `settings`,
    decoded together in one pool of as many slots (`pool_for`): they join at its first step and
    leave as they finish. The pool is closed at the end."""
    pool = pool_for(engine, len(prompts), max(s.max_length for s in settings), plain=plain)
    try:
        requests = [pool.submit(p, s) for p, s in zip(prompts, settings, strict=True)]
        for _ in Driver(pool).run():
            pass
        return [list(r.token_ids) for r in requests]
    finally:
        pool.close()
