"""The server's warm-up: what it compiles, in which order, and how far it is.

A pool runs one compiled program per static shape (`dart_jax.decoding.ahead`): its live rows (1,
2, 4, … requests at once), the attention window that follows a sequence's length (or holds a
prefill chunk of the prompt: any prompt length runs the same prefill), the tree size. The warm-up is a list of `Stage`s, each one method at a number of requests
at once for prompts and sequences up to a length:

1. for each method, one request at a time, prompts of up to `READY_PROMPT` tokens (a chat turn
   with its template, a short completion) and sequences in the first attention window
   (`READY_LENGTH` tokens) — the server accepts requests once these are warm;
2. for each method, one request at a time, prompts and sequences of up to `--warmup-length`
   tokens (`WARM_LENGTH` by default);
3. with `--warmup full` (the default), for each method 2, 4, … `--slots` requests at once, up to
   the same length.

Each stage's programs are compiled ahead of time by `Compiler`'s threads (`ahead.programs`, the
host search's kernels included; a program two stages share compiles once), so that the
scheduler thread, which serves the requests, never waits for a compilation of the warm-up; the
stage then runs its requests at once through the scheduler, which compiles what is left: the
small programs the pool runs between its calls (moving its slots' keys and sampling settings).
Past `--warmup-length` tokens (a longer prompt, an answer that reaches the next attention
window), and for a tree size other than the default, a request compiles its programs on first
use. `Progress` is what GET /health shows of it.

A bound no warm-up can pass: each compiled XLA:CPU program maps its kernels into memory, about a
thousand maps for a 30-layer model, and Linux ends a process whose maps reach `vm.max_map_count`
(65 530 by default: some sixty such programs). The warm-up compiles ahead only while the maps
leave `MAP_RESERVE` of that limit free, for the programs requests compile on first use; past it
it stops (`OutOfMaps`: what is warm then stays warm, the rest compiles on first use) and says how
to raise the limit.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time

from pathlib import Path

from dart_jax.decoding.ahead import Program
from dart_jax.errors import ResourceError

from .options import WARM_LENGTH  # noqa: F401 (the default --warmup-length, importable from here)

READY_PROMPT = 64  # tokens: a chat turn of a few lines with its template, or a short completion
# tokens of prompt and answer within the first attention window (256 cache slots), with room for
# what a step reads and writes past the committed ones
READY_LENGTH = 192


@dataclasses.dataclass(frozen=True)
class Stage:
    """Method `method` (`label` in words) warm for `rows` requests at once, prompts of up to
    `prompt_length` tokens and sequences (prompt and answer) of up to `length` tokens; `ready`:
    one of the stages before the server accepts requests."""

    method: str
    label: str
    rows: int
    prompt_length: int
    length: int
    ready: bool

    def __str__(self) -> str:
        return (f"{self.label}, {self.rows} request{'s' * (self.rows > 1)} at once, prompts up to "
                f"{self.prompt_length} tokens, sequences up to {self.length}")


def plan(methods: dict[str, str], slots: int, max_length: int, *, full: bool = True,
         length: int = WARM_LENGTH) -> list[Stage]:
    """The stages of a warm-up (module docstring) for `methods` (name → label) on pools of `slots`
    sequences of at most `max_length` tokens: the single requests of every method first, then
    (`full`) 2, 4, … `slots` requests at once; `length` bounds the prompts and sequences covered."""
    length = max(2, min(int(length), int(max_length)))
    first = (min(READY_PROMPT, length - 1), min(READY_LENGTH, length))
    stages = [Stage(m, label, 1, *first, True) for m, label in methods.items()]
    if (length - 1, length) != first:
        stages += [Stage(m, label, 1, length - 1, length, False) for m, label in methods.items()]
    rows = 1
    while full and rows < slots:
        rows = min(2 * rows, slots)
        stages += [Stage(m, label, rows, length - 1, length, False) for m, label in methods.items()]
    return stages


class Progress:
    """How far a warm-up is, for GET /health: each stage's state, the programs compiled ahead of
    how many, the seconds since it began. Written by the warm-up's threads, read by any."""

    def __init__(self, stages: list[Stage]):
        self.stages = list(stages)
        self.started = time.monotonic()
        self.ended: float | None = None
        self.current = 0  # the stage under way (its index), len(stages) once done
        self.ready = False
        self.error: str | None = None
        self.programs = 0
        self.compiled = 0
        self._lock = threading.Lock()

    def add_programs(self, n: int) -> None:
        with self._lock:
            self.programs += n

    def compiled_one(self) -> None:
        with self._lock:
            self.compiled += 1

    def finish(self, error: str | None = None) -> None:
        self.error = error
        self.ended = time.monotonic()

    @property
    def done(self) -> bool:
        return self.ended is not None

    def snapshot(self) -> dict:
        """The state as JSON: `stage` n of `stages` (the one under way, 1-based; `stages` when done),
        `warming` (it, in words), `warm` (the stages done), `programs` compiled ahead of `of`,
        `seconds` so far, `ready` (single requests of every method warm), `done`, `error`."""
        n = min(self.current, len(self.stages))
        end = self.ended if self.ended is not None else time.monotonic()
        out = {"stage": min(n + 1, len(self.stages)), "stages": len(self.stages),
               "warming": None if self.done or n == len(self.stages) else str(self.stages[n]),
               "warm": [str(s) for s in self.stages[:n]], "programs": self.compiled, "of": self.programs,
               "seconds": round(end - self.started, 1), "ready": self.ready, "done": self.done}
        if self.error is not None:
            out["error"] = self.error
        return out


# tracing and lowering run in Python (one thread at a time holds the GIL anyway); XLA's
# compilation, which leaves the GIL, runs side by side
_LOWERING = threading.Lock()

MAP_RESERVE = 0.25  # the share of vm.max_map_count the warm-up leaves to programs compiled on first use


def maps_in_use() -> tuple[int, int] | None:
    """(memory maps of this process, the kernel's vm.max_map_count), or None where there is no such
    limit to read (not Linux)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps), limit
    except (OSError, ValueError):
        return None


class OutOfMaps(ResourceError):
    """The warm-up stopped: another program would leave less than `MAP_RESERVE` of vm.max_map_count."""

    def __init__(self, used: int, limit: int):
        super().__init__(f"stopped before the process's memory maps reach the kernel's limit ({used} of "
                         f"vm.max_map_count {limit}; each compiled program takes hundreds to thousands): what is "
                         "warm stays warm, the rest compiles on first use; to warm more, raise the limit (sudo "
                         "sysctl -w vm.max_map_count=262144) or lower --warmup-length or --slots")


class Compiler:
    """`threads` daemon threads that compile `Program`s ahead of time in the order submitted;
    `submit` gives a future of each. `close` drops what has not started (their futures are
    cancelled); a compilation under way cannot be stopped (`busy` says whether one runs)."""

    def __init__(self, threads: int, progress: Progress | None = None):
        self._queue: queue.Queue = queue.Queue()
        self._progress = progress
        self._running = 0
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"dart_jax-warmup-compile-{i}", daemon=True)
                         for i in range(max(1, int(threads)))]
        for thread in self._threads:
            thread.start()

    def submit(self, program: Program) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._closed:
            future.cancel()
        else:
            self._queue.put((program, future))
        return future

    @property
    def busy(self) -> bool:
        return self._running > 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                _, future = self._queue.get_nowait()
            except queue.Empty:
                break
            future.cancel()
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            program, future = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running += 1
            try:
                maps = maps_in_use()
                if maps is not None and maps[0] > (1 - MAP_RESERVE) * maps[1]:
                    raise OutOfMaps(*maps)
                with _LOWERING:
                    compile_ = program.lower()
                compile_()
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits for this program
                future.set_exception(e)
            else:
                future.set_result(program)
                if self._progress is not None:
                    self._progress.compiled_one()
            finally:
                with self._lock:
                    self._running -= 1
