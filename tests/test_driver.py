"""The one pool driver (dart_jax/decoding/driver.py): the compile-time and warm-time accounting of
its steps, checked on a scripted pool against a by-hand restatement of the rule; and generate,
generate_many, the server's scheduler and the bench's pool (`bench e2e`'s batch mode), which all
step their pools through it, giving the same tokens and accepted lengths for the same request (each
also equal to plain greedy decoding)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from dart_jax.bench.e2e import decode_pool
from dart_jax.decoding.batcher import Request, StepEvent
from dart_jax.decoding.driver import Driver
from dart_jax.decoding.requests import Budget, Stats
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.serve.scheduler import Scheduler, thread_sink


class ScriptedPool:
    """A pool whose steps are a script: each step moves the listed requests by the listed token
    counts (several per request: one device call of several steps), and compiles a new program
    first where the script says so."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = [Request(None, GenerationSettings(), Stats(), Budget(frozenset(), 100, 100), i)
                         for i in range(2)]
        self.busy, self.waiting = list(self.requests), []

    @property
    def active(self):
        return bool(self.script)

    def step(self):
        compile_new, moves = self.script.pop(0)
        if compile_new:  # a program never seen before: its tracing and XLA compilation
            jax.jit(lambda x, n=len(self.script): jnp.cumsum(x * (n + 1.5)))(jnp.arange(33.0)).block_until_ready()
        return [StepEvent(self.requests[r], [7] * n, n, same_call=i > 0)
                for r, counts in moves.items() for i, n in enumerate(counts)]


def test_driver_times_each_step_and_shares_it_with_the_requests_in_the_pool():
    script = [(True, {0: [1], 1: [1]}), (False, {0: [3]}), (False, {0: [2, 4], 1: [1]}), (True, {1: [2]})]
    pool = ScriptedPool(script)
    steps = list(Driver(pool).run())
    assert len(steps) == 4 and steps[0].compile_s > 0 and steps[3].compile_s > 0
    assert steps[1].compile_s == steps[2].compile_s == 0
    # the rule restated: a call that compiled counts as waiting for every request in the pool; one
    # that did not counts its tokens and, once per request and call, its wall seconds
    for r, request in enumerate(pool.requests):
        waited = sum(s.compile_s for s in steps if s.compile_s)
        tokens = sum(len(e.ids) for s in steps if not s.compile_s for e in s.events if e.request is request)
        seconds = sum(s.wall_s for s in steps if not s.compile_s and any(e.request is request for e in s.events))
        assert request.clock.compile_s == pytest.approx(waited)
        assert request.clock.tokens == tokens and request.clock.seconds == pytest.approx(seconds)
    assert pool.requests[0].clock.tokens == 3 + 2 + 4 and pool.requests[1].clock.tokens == 1


@pytest.fixture(scope="module")
def tiny():
    from dart_jax.api.model import DartModel

    model = DartModel.demo("tiny", keep=16)
    model.compile_notice = None
    return model


def test_generate_generate_many_the_scheduler_and_the_bench_drive_alike(tiny):
    prompt = tiny.encode("What is speculative decoding?")
    settings = GenerationSettings(max_new_tokens=20, max_length=256)
    plain = tiny.generate_ar(prompt, chat=False, settings=settings).token_ids
    one = tiny.generate(prompt, chat=False, settings=settings)
    (many,) = tiny.generate_many([prompt], settings, chat=False)
    scheduler = Scheduler(tiny, slots=1, max_length=256).start()
    try:
        q, sink = thread_sink()
        scheduler.submit(prompt, settings, sink)
        events = []
        while not (event := q.get(timeout=300)).done:
            events.append(event)
        events.append(event)
    finally:
        scheduler.stop()
    served = [t for e in events for t in e.ids]
    served_lengths = [e.accepted for e in events if e.ids][1:]  # the first is the prefill's token
    (benched,) = decode_pool(tiny, [prompt], settings)
    assert one.token_ids == many.token_ids == served == benched.token_ids == plain
    assert one.accept_lengths == many.accept_lengths == served_lengths == benched.stats.accept_lengths


def test_generate_reaches_the_engines_step_in_at_most_ten_frames(tiny, monkeypatch):
    """DESIGN.md's walk of one request: from `DartModel.generate` to `Engine.step` (the jitted
    step's caller) through the driver, in at most 10 frames."""
    import traceback

    from dart_jax.decoding.engine import Engine

    stacks = []
    step = Engine.step

    def recorded(self, *args, **kwargs):
        stacks.append(traceback.extract_stack()[:-1])  # this wrapper's own frame left out
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "step", recorded)
    tiny.generate(tiny.encode("What is speculative decoding?"), chat=False, max_new_tokens=8)
    stack = stacks[0]
    start = max(i for i, frame in enumerate(stack) if frame.name == "generate" and frame.filename.endswith("model.py"))
    walk = [frame.name for frame in stack[start:]] + ["Engine.step"]
    assert len(walk) <= 10, walk
