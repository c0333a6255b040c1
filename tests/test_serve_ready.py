"""A server that is ready when it says so: its warm-up compiles, ahead of time, every program the
first requests of each method run (`dart_jax.decoding.ahead`), single requests first; JAX's own
compiler log (its "Compiling ..." record per program lowered, not our counters) then sees no
compilation while those requests are served."""
from __future__ import annotations

import types

import pytest

from dart_jax.decoding.batcher import SlotPool


@pytest.mark.parametrize("busy, slots, rows", [
    ([0], 8, 1), ([0, 1], 8, 2), ([0, 2], 8, 4), ([0, 1, 2, 3], 8, 4), ([4], 8, 8), ([0, 1, 2], 3, 3), ([0], 1, 1)])
def test_a_pool_computes_the_power_of_two_rows_that_hold_its_highest_busy_slot(busy, slots, rows):
    # a lone request in slot 0 is one row, not two: the rows are slots 0 … 2^j - 1, the fewest that
    # reach the highest busy slot, never more than the pool
    pool = types.SimpleNamespace(busy=[object() if i in busy else None for i in range(slots)], slots=slots)
    assert SlotPool._live(pool) == rows
