"""Python's cyclic garbage collector paused while dart_jax builds things up: while it imports
(the CLIs' and `DartModel`'s first import), while a model loads (`DartModel.from_pretrained`), and
while a thread traces, lowers, compiles or loads a program (the events `compile_time` listens to).

That work makes hundreds of thousands of objects that either live on (modules, the model and its
programs) or are freed by reference counting as the work ends (a trace's jaxpr, a lowered module).
With the collector on, they keep triggering collections that walk every object the process holds
(after jax, flax and transformers are imported, hundreds of thousands) and free almost nothing.
Paused, the work's temporaries are freed by reference counting alone, and the collector walks the
heap once afterwards, when its own thresholds next say so (benchmarks/RESULTS.md has the figures).

`pause()` and `resume()` nest, in one thread or across threads: the collector runs again when the
last pause ends, and only if it was on when the first began (a process that turned it off keeps it
off). `paused()` is the same as a context manager or decorator. A leaf: it imports nothing of dart_jax.
"""
from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_depth = 0  # pauses running now, all threads together
_was_enabled = False  # whether the collector was on when the outermost pause began


def pause() -> None:
    """Pause the cyclic collector until the matching `resume()` (nested pauses: the last one)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1


def resume() -> None:
    """End one `pause()`: the last one turns the collector back on if it was on before the first.
    A resume without a pause does nothing."""
    global _depth
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()


@contextlib.contextmanager
def paused():
    """`pause()` on entry, `resume()` on exit, also on an error (`with paused():` or `@paused()`)."""
    pause()
    try:
        yield
    finally:
        resume()
