"""The server's warm-up says how far it is: one line as each stage (a method, a number of requests
at once) starts and ends, numbered "n of M", and what compiles in between."""
from __future__ import annotations

import io

import pytest

from dart_jax.api.model import DartModel
from dart_jax.serve.__main__ import warm_up
from dart_jax.serve.scheduler import Scheduler


@pytest.fixture(scope="module")
def scheduler():
    model = DartModel.demo("tiny", keep=4)
    scheduler = Scheduler(model, slots=3, max_length=128).start()
    yield scheduler
    scheduler.stop()


def test_stages_are_every_method_at_each_power_of_two_up_to_the_slots(scheduler):
    # the pool sizes a full warm-up compiles: 1, 2, then the slots (3), for each method in turn
    expected = [(method, count) for method in scheduler.methods for count in (1, 2, 3)]
    assert scheduler.warmup_stages(full=True) == expected
    assert scheduler.warmup_stages(full=False) == [(method, 1) for method in scheduler.methods]


def test_warmup_prints_each_stage_start_and_end_numbered(scheduler):
    out = io.StringIO()
    warm_up(scheduler, scheduler.model, full=False, stream=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("dart_jax: warm-up")]
    methods = list(scheduler.methods)
    total = len(methods)
    expected_starts = [f"dart_jax: warm-up {n} of {total}: {scheduler.methods[m]}, 1 request at once ..."
                       for n, m in enumerate(methods, 1)]
    assert lines[0::2] == expected_starts
    assert len(lines) == 2 * total
    for n, line in enumerate(lines[1::2], 1):
        assert line.startswith(f"dart_jax: warm-up {n} of {total} done in ") and line.endswith(" s")
        float(line.split("done in ")[1].removesuffix(" s"))


def test_compilations_are_named_in_words_or_by_their_function():
    from dart_jax.api.compiling import describe
    assert describe("jit(_step)") == describe("_step") == "the DART decode step"
    assert describe("jit(_pool_step)") == "the program _pool_step"
    assert describe("") == "a helper"
