"""Compilation as users see it: a notice while it runs (what compiles, in words, and for how
long) and the persistent XLA cache (`use_compile_cache`: a second run of the same shapes loads its
executables instead of compiling them again). The counting itself, `CompileTimer`, lives with
the pool driver (`dart_jax.decoding.compile_time`)."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

import jax

from dart_jax.decoding.compile_time import NUMBA, CompileTimer, busy, install  # noqa: F401 (CompileTimer: importable from here)
from dart_jax.models.backend import no_compile_cache, use_compile_cache  # noqa: F401 (importable from here)

from .options import default_cache_dir  # noqa: F401 (the command lines' option default, defined with them)

# the jitted functions of dart_jax.decoding, in words
_NAMES = {"_step": "the DART decode step", "_prefill": "the DART prefill", "_decode": "the plain decode step",
          "_plain": "the plain-decoding chunk (tree size 0)", "_decode_chunk": "the plain decode loop",
          "_prefill_rows": "the plain prefill", "_step_rows": "the DART decode step of half a pool",
          "_device_steps": "the device loop", NUMBA: "the tree search (Numba)"}


def describe(name: str) -> str:
    """What a compilation event's function is, in words: JAX names the lowering and compilation of
    `f` "jit(f)", its tracing "f"; a function without words of its own is named as it is."""
    bare = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name
    return _NAMES.get(bare) or (f"the program {bare}" if bare else "a helper")


def compiling_in(thread_id: int | None) -> tuple[float, str] | None:
    """(seconds so far, what in words) of the compilation that thread `thread_id` runs now, or None
    (e.g. for a server's UI to show "compiling…" instead of a speed while its scheduler compiles)."""
    running = busy.get(thread_id) if thread_id is not None else None
    if running is None:
        return None
    start, name = running
    return time.monotonic() - start, describe(name)


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
        self._held: list[str] | None = None  # while an answer prints (`hold`): the lines it will say after

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
            if not busy:
                self._close(self._last_busy)

    def hold(self) -> None:
        """From now on say nothing while compiling (an answer is printing on the same terminal, which a
        notice's line would break): what compiles meanwhile is said, one line, at `release()`."""
        with self._lock:
            if self._shown_since is not None and busy:  # still running: its line ends here, unfinished
                self._write(("\r\x1b[K" if self._tty else "") + f"compiling {_listed(self._seen)}; "
                            "the answer begins meanwhile\n")
                self._shown_since, self._seen = None, {}
            self._close(self._last_busy)
            self._held = []

    def release(self) -> None:
        """Say what compiled since `hold()` (how long, and that the answer's figures leave it out), and
        show notices again."""
        with self._lock:
            if not busy:
                self._close(self._last_busy)
            held, self._held = self._held or [], None
            for line in held:
                self._write(line)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream: the notice is not worth an error
            pass

    def _close(self, end: float) -> None:
        if self._shown_since is not None:
            said = f"compiled {_listed(self._seen)} in {end - self._shown_since:.1f} s"
            if self._held is not None:
                self._held.append(said + " while answering (the answer's figures leave it out)\n")
            else:
                self._write(("\r\x1b[K" if self._tty else "") + said + "\n")
            self._shown_since = None
            self._seen = {}

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                now = time.monotonic()
                running = list(busy.values())
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
                        if self._held is None:
                            self._write(f"compiling {what} (once per tree size, attention window and cache size; "
                                        f"{where})…" + ("" if self._tty else "\n"))
                    if self._shown_since is not None and self._tty and self._held is None:
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


@contextlib.contextmanager
def holding_notices():
    """Around an answer that prints as it comes: every running `CompileNotice` keeps quiet inside
    (a notice's line would land in the answer's text) and says afterwards what compiled meanwhile."""
    notices = list(_notices)
    for notice in notices:
        notice.hold()
    try:
        yield
    finally:
        for notice in notices:
            notice.release()
