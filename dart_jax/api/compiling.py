"""Compilation as users see it: how long it took (so that speeds leave it out), a notice while
it runs, and the persistent XLA cache the command lines turn on (a second run of the same shapes
loads its executables instead of compiling them again).

JAX reports the start (a scalar event holding the start time) and the duration of every trace,
lowering and backend compilation through `jax.monitoring`, Numba the start and end of each
compilation of the tree search (the first run after installing or upgrading); listeners,
installed once, add them up per thread, outermost event only (a function compiled inside
another's compilation is part of its time).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TextIO

import jax
from numba.core import event as numba_event

from dart_jax.models.backend import no_compile_cache, use_compile_cache  # noqa: F401 (importable from here)

from .options import default_cache_dir  # noqa: F401 (the command lines' option default, defined with them)

_NUMBA = "numba:compile"
_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
           "/jax/core/compile/backend_compile_duration", _NUMBA)
# the jitted functions of dart_jax.decoding, in words
_NAMES = {"_step": "the DART decode step", "_prefill": "the DART prefill", "_decode": "the plain decode step",
          "_plain": "the plain-decoding chunk (tree size 0)", "_decode_chunk": "the plain decode loop",
          "_prefill_rows": "the plain prefill", "_step_rows": "the DART decode step of half a pool",
          "_device_steps": "the device loop", _NUMBA: "the tree search (Numba)"}

_lock = threading.Lock()
_installed = False
_local = threading.local()
_busy: dict[int, tuple[float, str]] = {}  # thread id → (start, function) of the compilation running in it


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
        state.start = time.perf_counter()
        _busy[threading.get_ident()] = (time.monotonic(), str(kwargs.get("fun_name", "")))


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event not in _EVENTS:
        return
    state = _state()
    if state.depth == 0:  # a compilation that began before the listener was installed
        return
    state.depth -= 1
    if state.depth == 0:
        spent = time.perf_counter() - state.start
        _busy.pop(threading.get_ident(), None)
        for timer in state.timers:
            timer.seconds += spent
            timer.compilations += 1


class _NumbaCompiles(numba_event.Listener):
    def on_start(self, event) -> None:
        _on_start(_NUMBA, 0, fun_name=_NUMBA)

    def on_end(self, event) -> None:
        _on_duration(_NUMBA, 0.0)


def install() -> None:
    """Listen to JAX's and Numba's compilation events (idempotent; the listeners cost nothing
    between compilations)."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_scalar_listener(_on_start)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            numba_event.register(_NUMBA, _NumbaCompiles())
            _installed = True


def describe(name: str) -> str:
    """What a compilation event's function is, in words: JAX names the lowering and compilation of
    `f` "jit(f)", its tracing "f"; a function without words of its own is named as it is."""
    bare = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name
    return _NAMES.get(bare) or (f"the program {bare}" if bare else "a helper")


def compiling_in(thread_id: int | None) -> tuple[float, str] | None:
    """(seconds so far, what in words) of the compilation that thread `thread_id` runs now, or None
    (e.g. for a server's UI to show "compiling…" instead of a speed while its scheduler compiles)."""
    busy = _busy.get(thread_id) if thread_id is not None else None
    if busy is None:
        return None
    start, name = busy
    return time.monotonic() - start, describe(name)


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


class CompileNotice:
    """While a compilation has run for more than `after` seconds, shows "compiling <what> for this
    shape… N s" on `stream` (updated in place on a terminal), and once compilation has been idle
    for a moment (or at `settle()`), how long it took. For the command lines: `with CompileNotice(): ...`."""

    def __init__(self, stream: TextIO | None = None, *, after: float = 1.0, idle: float = 0.5,
                 cache: Path | None = None):
        install()
        self.stream = stream if stream is not None else sys.stderr
        self.after, self.idle, self.cache = after, idle, cache
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._shown_since: float | None = None  # when the notice went up
        self._seen: dict[str, None] = {}  # what compiled while it was up, in words, in order
        self._last_busy = 0.0
        self._thread = threading.Thread(target=self._watch, name="dart_jax-compile-notice", daemon=True)
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __enter__(self) -> "CompileNotice":
        _notices.append(self)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        _notices.remove(self)
        with self._lock:
            self._close(time.monotonic())

    def settle(self) -> None:
        """End the notice's line now when nothing is compiling (before the command prints more)."""
        with self._lock:
            if not _busy:
                self._close(self._last_busy)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream: the notice is not worth an error
            pass

    def _close(self, end: float) -> None:
        if self._shown_since is not None:
            self._write(("\r\x1b[K" if self._tty else "") + f"compiled {_listed(self._seen)} in "
                        f"{end - self._shown_since:.1f} s\n")
            self._shown_since = None
            self._seen = {}

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                now = time.monotonic()
                running = list(_busy.values())
                if running:
                    self._last_busy = now
                    start = min(running)[0]
                    # every compilation running now (the tree search compiles beside XLA's), oldest first
                    now_running = dict.fromkeys(describe(name) for _, name in sorted(running))
                    what = " and ".join(now_running)
                    self._seen.update(now_running)
                    if self._shown_since is None and now - start >= self.after:
                        self._shown_since = start
                        where = (f"kept in {self.cache} for later runs" if self.cache
                                 else "not kept: the compilation cache is off")
                        self._write(f"compiling {what} (once per tree size, prompt length bucket and cache size; "
                                    f"{where})…" + ("" if self._tty else "\n"))
                    if self._shown_since is not None and self._tty:
                        self._write(f"\rcompiling {what} for this shape… {now - self._shown_since:.0f} s\x1b[K")
                elif now - self._last_busy >= self.idle:
                    self._close(self._last_busy)
                    self._seen = {}  # short compilations that never showed a notice


_notices: list[CompileNotice] = []


def _listed(seen: dict[str, None]) -> str:
    """The programs a notice saw compile, in words: the named ones, then how many helpers."""
    named = [w for w in seen if w in _NAMES.values()]
    helpers = len(seen) - len(named)
    if helpers:
        named.append(f"{helpers} helper program{'s' * (helpers > 1)}")
    if len(named) > 1:
        return ", ".join(named[:-1]) + " and " + named[-1]
    return named[0] if named else "a helper program"

# how long a compilation runs before the Python API says so (`DartModel.compile_notice`)
API_NOTICE_AFTER = 1.0


def cache_in_use() -> Path | None:
    """The persistent compilation cache's folder, None when it is off."""
    folder = jax.config.jax_compilation_cache_dir
    return Path(folder) if folder and jax.config.jax_enable_compilation_cache else None


@contextlib.contextmanager
def api_notice(stream: TextIO | bool | None):
    """Around a Python API call: a `CompileNotice` on `stream` (True: stderr) saying what compiles
    and for how long, unless `stream` is None or False, or a notice runs already (a command
    line's or a server's)."""
    if stream is True:
        stream = sys.stderr
    if stream is None or stream is False or _notices:
        yield
        return
    with CompileNotice(stream, after=API_NOTICE_AFTER, cache=cache_in_use()):
        yield


def settle() -> None:
    """End the line of every running `CompileNotice` whose compilations are over."""
    for notice in list(_notices):
        notice.settle()
