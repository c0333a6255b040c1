"""How long compilation takes, counted where it happens (so that speeds leave it out): JAX
reports the start (a scalar event holding the start time) and the duration of every trace,
lowering and backend compilation through `jax.monitoring`, Numba the start and end of each
compilation of the tree search (the first run after installing or upgrading); listeners,
installed once, add them up per thread, outermost event only (a function compiled inside
another's compilation is part of its time). `CompileTimer` is what the pool driver times its
steps with; `busy` what each thread compiles now (the notices of `dart_jax.api.compiling`). While a
thread compiles, Python's garbage collector waits (`dart_jax.collector`)."""
from __future__ import annotations

import threading
import time

import jax
from numba.core import event as numba_event

from dart_jax import collector

NUMBA = "numba:compile"
_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
           "/jax/core/compile/backend_compile_duration", NUMBA)
_lock = threading.Lock()
_installed = False
_local = threading.local()
busy: dict[int, tuple[float, str]] = {}  # thread id → (start, function) of the compilation running in it


def _state():
    if not hasattr(_local, "depth"):
        _local.depth, _local.start, _local.timers = 0, 0.0, []
    return _local


def _on_start(event: str, value, **kwargs) -> None:
    if event not in _EVENTS:
        return
    state = _state()
    state.depth += 1
    if state.depth == 1:
        collector.pause()
        state.start = time.perf_counter()
        busy[threading.get_ident()] = (time.monotonic(), str(kwargs.get("fun_name", "")))


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event not in _EVENTS:
        return
    state = _state()
    if state.depth == 0:  # a compilation that began before the listener was installed
        return
    state.depth -= 1
    if state.depth == 0:
        collector.resume()
        spent = time.perf_counter() - state.start
        busy.pop(threading.get_ident(), None)
        for timer in state.timers:
            timer.seconds += spent
            timer.compilations += 1


class _NumbaCompiles(numba_event.Listener):
    def on_start(self, event) -> None:
        _on_start(NUMBA, 0, fun_name=NUMBA)

    def on_end(self, event) -> None:
        _on_duration(NUMBA, 0.0)


def install() -> None:
    """Listen to JAX's and Numba's compilation events (idempotent; the listeners cost nothing
    between compilations)."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_scalar_listener(_on_start)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            numba_event.register(NUMBA, _NumbaCompiles())
            _installed = True


class CompileTimer:
    """`with timer:` adds up the seconds this thread spends compiling (tracing, lowering, XLA or
    loading from the persistent cache) inside the block, and `wall` the block's own seconds;
    re-entering keeps adding."""

    def __init__(self):
        install()
        self.seconds = 0.0
        self.wall = 0.0
        self.compilations = 0
        self.last_wall = self.last_seconds = 0.0
        self._entered = self._before = 0.0

    def __enter__(self) -> "CompileTimer":
        _state().timers.append(self)
        self._entered, self._before = time.perf_counter(), self.seconds
        return self

    def __exit__(self, *exc) -> None:
        self.last_wall = time.perf_counter() - self._entered
        self.last_seconds = self.seconds - self._before  # compilation inside the block just ended
        self.wall += self.last_wall
        _state().timers.remove(self)
