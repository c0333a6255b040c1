"""Python's cyclic garbage collector waits while dart_jax imports, while a model loads and while a
program compiles, and runs again afterwards (dart_jax/collector.py). The oracle is Python's own:
`gc.callbacks` reports every collection as it starts, `gc.isenabled()` whether the collector is on."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import pytest

from dart_jax import collector
from dart_jax.decoding import compile_time


@pytest.fixture
def collector_on():
    """The collector on around the test, as it was after it."""
    before = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if before else gc.disable)()


def test_pauses_nest_across_threads_and_a_collector_turned_off_stays_off(collector_on):
    collector.pause()
    assert not gc.isenabled()
    second = threading.Thread(target=collector.pause)
    second.start()
    second.join()
    collector.resume()
    assert not gc.isenabled(), "the other thread's pause still runs"
    ended = threading.Thread(target=collector.resume)
    ended.start()
    ended.join()
    assert gc.isenabled(), "the last pause ended: the collector runs again"
    collector.resume()  # one too many: nothing happens
    assert gc.isenabled()

    gc.disable()  # the process turned it off: the pauses leave it off
    with collector.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()

    with pytest.raises(RuntimeError):
        with collector.paused():
            raise RuntimeError("the work failed")
    assert gc.isenabled(), "an error inside the pause ends it"


def test_the_collector_waits_while_a_program_traces_and_compiles_also_when_tracing_fails(collector_on):
    compile_time.install()
    seen = []

    def f(x):
        seen.append(gc.isenabled())  # runs while JAX traces f
        return jnp.sin(x) * 2

    jax.jit(f)(jnp.arange(3.0))
    assert seen == [False]
    assert gc.isenabled()

    def broken(x):
        seen.append(gc.isenabled())
        raise ValueError("a bad program")

    with pytest.raises(ValueError, match="a bad program"):
        jax.jit(broken)(jnp.arange(4.0))
    assert seen[-1] is False
    assert gc.isenabled(), "a failed trace ends the pause"

    gc.disable()
    jax.jit(f)(jnp.arange(5.0))
    assert seen[-1] is False and not gc.isenabled(), "a collector the process turned off stays off"


# in a new process: Python's collections (each one's generation) while `from dart_jax import DartModel`
# runs, while the toy demo loads, and whether the collector runs afterwards
CHILD = r"""
import contextlib, gc, json, logging, sys, threading  # the standard library's, before the count
phase = ["before"]
counts = {}
def seen(event, info):
    if event == "start":
        counts.setdefault(phase[0], []).append(info["generation"])
gc.callbacks.append(seen)
phase[0] = "import"
from dart_jax import DartModel
phase[0] = "between"
on_after_import = gc.isenabled()
phase[0] = "load"
model = DartModel.demo("tiny")
phase[0] = "after"
on_after_load = gc.isenabled()
phase[0] = "cycles"
garbage = [[] for _ in range(5000)]
for item in garbage:
    item.append(item)  # cycles only the collector frees
del garbage, item
json.dump({"counts": counts, "on_after_import": on_after_import, "on_after_load": on_after_load}, sys.stdout)
"""


def test_importing_and_loading_run_no_collection_and_leave_the_collector_on():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    counts = out["counts"]
    # young objects only, at most twice: the package's first lines before the pause, and the first
    # allocation after it (the collector on throughout saw hundreds, walking the whole heap several times)
    for phase in ("import", "load"):
        generations = counts.get(phase, [])
        assert set(generations) <= {0} and len(generations) <= 2, f"collections while {phase}ing: {generations}"
    assert out["on_after_import"] and out["on_after_load"]
    assert counts.get("cycles"), f"the collector did not run again afterwards: {counts}"
