"""One thread that owns the model and serves every request: continuous batching across clients.

Web handlers (the HTTP API's coroutines, the UI's generators) never touch JAX. They `submit` a
`Job` with a sink for its events and read the events from there; the scheduler thread admits jobs
into the pools and steps them in turn:
- the methods are those of `dart_jax.api.methods` that the model has loaded, each with the pools
  its record makes (`Method.pool`);
- method "dart": one `Batcher` pool of `slots` sequences per draft-tree size (the server's default
  size, plus any other size a request asks for, made on first use); a request's size is checked
  as the Python API checks it (`check_tree_size`) and must be one of a few offered sizes
  (`tree_sizes`), so that no client can make the server build pools, caches and compiled steps
  without bound;
- method "ar": a `PlainBatcher` pool of `slots` sequences, plain autoregressive decoding of the
  target with the device loop of `generate_ar` (up to 32 tokens per sequence and call, all
  sequences in one call): the same baseline as the CLI's and the benchmarks';
- method "eagle3" (a model loaded with an EAGLE-3 head): one `Batcher` pool over the EAGLE-3 engine
  (its tree size is the head's, fixed).
Every pool step is timed for compilation: a job's `tokens_per_s` leaves compiling out (its
`compile_s` says how much there was), and `compiling()` says what the thread compiles right now.
A job that is cancelled (the client went away, a stop string was met, the UI's Stop button) leaves
its pool at once and its slot takes the next job. Every event goes to the job's sink: a
`queue.Queue` for threads, or an asyncio queue fed through its event loop.

One request cannot take the server down: its numbers are bounded before it is queued (`check`:
what enters a fixed-width type on the device, such as top_k in int32, is refused with its limit),
and an exception while a pool steps fails only the jobs that step served (the joining ones when
the step admitted jobs, else every job of that pool, whose pool is then dropped and made afresh on
next use) with the error as their last event; the other pools go on. Should the thread end anyway,
`failure` says why, and `submit` refuses new jobs with it instead of queueing them for nobody.
`interrupt` (the server stops) ends every open job at once from the calling thread, so that its
client hears why even while the scheduler thread is busy in a long step or a compilation.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable

from dart_jax.api import methods as decoding_methods
from dart_jax.api.compiling import CompileTimer, compiling_in
from dart_jax.api.model import DartModel
from dart_jax.api.methods import TREE_SIZE_RANGE, max_tree_nodes
from dart_jax.decoding.batcher import SlotPool
from dart_jax.decoding.driver import Driver
from dart_jax.decoding.requests import Stats, WarmTime
from dart_jax.decoding.settings import GenerationSettings

log = logging.getLogger("dart_jax.serve")

# the methods every model has (name → label); more come with their drafters (dart_jax.api.methods)
METHODS = {m.name: m.label for m in decoding_methods.all_methods() if m.head_option is None}
TREE_SIZES = (8, 16, 32, 60, 96)  # the draft tree sizes a server offers besides its default
MAX_TEMPERATURE = 10.0  # the API's and the UI's ceiling: 1e308 would overflow float32 to inf and sample garbage


@dataclasses.dataclass
class Event:
    """What one step of a job produced: new token ids and the step's accepted length (0 for the
    prefill's first token, k+1 for a speculative step); `plain` when the ids came from plain
    decoding (method "ar", or a plain chunk of keep="auto"): no draft was accepted then. The last
    event has `done` and a finish reason: 'eos', 'length' or 'cancelled', or 'error' / 'shutdown'
    (the server stops) with `error` set."""

    ids: list[int]
    accepted: int
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    plain: bool = False


@dataclasses.dataclass(eq=False)
class Job:
    """A submitted generation and its figures; `token_ids` and `stats` grow as it runs."""

    id: int
    method: str
    prompt_ids: Any
    settings: GenerationSettings
    tree_size: int
    sink: Callable[[Event], None]
    stats: Stats = dataclasses.field(default_factory=Stats)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    created: float = dataclasses.field(default_factory=time.perf_counter)
    clock: WarmTime = dataclasses.field(default_factory=WarmTime)  # its Request's once admitted (`Driver`)
    stop_at_eos: bool = True  # False: a warm-up, which decodes past EOS to run (and compile) the steps
    _handle: Any = None  # its Request in a pool

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def tokens_per_s(self) -> float:
        """Steady-state speed, as the Python API's figures count it: tokens per second of the whole
        job when nothing compiled, else of its steps that compiled nothing (a freshly compiled
        program's first run is slow beyond its compilation), else without the compile time."""
        elapsed = time.perf_counter() - self.created if not self.stats.total_s else self.stats.total_s
        return self.clock.tokens_per_s(len(self.token_ids), elapsed)

    @property
    def compile_s(self) -> float:
        """Seconds its pool's steps spent compiling while it was in the pool."""
        return self.clock.compile_s


def thread_sink() -> tuple[queue.Queue, Callable[[Event], None]]:
    """A queue for a thread to read a job's events from, and the sink that fills it."""
    q: queue.Queue = queue.Queue()
    return q, q.put


def async_sink(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Queue, Callable[[Event], None]]:
    """An asyncio queue (of `loop`) to await a job's events on, and the thread-safe sink that fills it."""
    q: asyncio.Queue = asyncio.Queue()

    def put(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass
    return q, put


class Scheduler:
    """Serves `model` to many clients from one thread; `slots` sequences per pool, each of at most
    `max_length` tokens (prompt + answer)."""

    def __init__(self, model: DartModel, *, slots: int = 8, max_length: int | None = None):
        """`max_length` defaults to the target's max_position_embeddings, at most 2048."""
        if int(slots) < 1:
            raise ValueError(f"--slots must be >= 1, got {slots}.")
        if max_length is None:
            max_length = min(2048, model.target.config.max_position_embeddings)
        self.model, self.slots, self.max_length = model, int(slots), int(max_length)
        self.default_tree_size = model.engine.tree.keep
        most = max_tree_nodes(model.engine.tree, model.engine.drafter.rows)
        self.tree_sizes = sorted({self.default_tree_size} | {s for s in TREE_SIZES if s <= most})
        # name → label of every method the model has loaded (e.g. "eagle3" with --eagle3: its own pool)
        self.methods = {m.name: m.label for m in decoding_methods.loaded(model)}
        self._timer = CompileTimer()  # entered by the scheduler thread around each pool step
        self._inbox: queue.Queue = queue.Queue()
        self._pools: dict[tuple[str, int | None], SlotPool] = {}  # (method, tree size) → pool
        self._jobs: dict[Any, Job] = {}  # a pool's request → its job
        self._ids = itertools.count(1)
        self.finished: collections.Counter = collections.Counter()  # jobs ended, by finish reason
        self._open: set[Job] = set()
        # jobs end from the scheduler thread and from `interrupt`'s; a job is refused once the thread died
        self._lock = threading.Lock()
        self.failure: str | None = None  # why the scheduler thread ended, when it ended by an error
        self._stop = threading.Event()
        self._closing = threading.Event()  # interrupted: no new jobs
        self._thread = threading.Thread(target=self._loop, name="dart_jax-scheduler", daemon=True)
        # the default pool is made (and its caches allocated) now, so that a pool too large fails at start
        self._pool("dart", self.default_tree_size)

    # ------------------------------------------------------------------ client side (any thread)
    def check(self, prompt_ids, settings: GenerationSettings, method: str, tree_size: int | None) -> int:
        """Raise ValueError naming what is wrong with a request; returns its tree size (None for
        plain decoding; a method whose tree is fixed ignores `tree_size`)."""
        if method not in self.methods:
            raise ValueError(f"unknown method {method!r}; this server offers {sorted(self.methods)}.")
        check_bounds(settings)
        if settings.max_length > self.max_length:
            raise ValueError(f"max_length {settings.max_length} exceeds the server's context of {self.max_length} "
                             "tokens (start the server with a larger --max-length).")
        self.model.engine.check_request(prompt_ids, settings)
        record = decoding_methods.get(method)
        if not record.tree_per_request:
            return record.tree_size(self.model)
        size = self.default_tree_size if tree_size is None else tree_size
        low, high = TREE_SIZE_RANGE
        if isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high:
            raise ValueError(f"tree_size must be an integer in [{low}, {high}] (draft tree nodes), got {size!r}.")
        size = record.tree_size(self.model, size)  # the Python API's check (max_tree_nodes)
        if size not in self.tree_sizes:
            raise ValueError(f"tree_size {size} is not offered by this server; pick one of "
                             f"{', '.join(map(str, self.tree_sizes))} (GET /v1/models lists them).")
        return size

    def submit(self, prompt_ids, settings: GenerationSettings, sink: Callable[[Event], None], *,
               method: str = "dart", tree_size: int | None = None, stop_at_eos: bool = True) -> Job:
        """Queue a generation; its events go to `sink`. Raises ValueError for a bad request.
        `stop_at_eos=False` decodes past EOS up to the token limits (the warm-up)."""
        size = self.check(prompt_ids, settings, method, tree_size)
        job = Job(next(self._ids), method, list(prompt_ids), settings, size, sink, stop_at_eos=stop_at_eos)
        with self._lock:  # not queued after the thread's last look at its inbox
            self._refuse_if_down()
            self._open.add(job)
            self._inbox.put(("submit", job))
        return job

    def _refuse_if_down(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the server cannot generate: its scheduler stopped after an internal error "
                               f"({self.failure}); restart the server (its log has the traceback).")
        if self._stop.is_set() or self._closing.is_set():
            raise RuntimeError("the server is shutting down.")

    @property
    def running(self) -> bool:
        """Whether the scheduler thread is alive (also after `stop`, while a step it is inside goes on)."""
        return self._thread.is_alive()

    def health(self) -> str | None:
        """None while the scheduler serves; else why it does not (it stopped, or failed)."""
        try:
            self._refuse_if_down()
        except RuntimeError as e:
            return str(e)
        if not self.running:
            return "the scheduler is not running."
        return None

    def cancel(self, job: Job) -> None:
        """Stop a job (no-op once it finished); its last event says 'cancelled'."""
        if not job.done:
            self._inbox.put(("cancel", job))

    def load(self) -> dict:
        """Jobs open now (queued or running) and ended so far by finish reason."""
        return {"open": len(self._open), "finished": dict(self.finished)}

    def interrupt(self, message: str) -> None:
        """End every open job now with finish reason 'shutdown' and `message` as its error (the
        server stops: its clients hear why instead of a cut connection); later submissions are refused.
        The jobs end here, in the calling thread; the scheduler thread frees their slots when its
        current step is over."""
        with self._lock:
            self._closing.set()
            jobs = list(self._open)
        for job in jobs:
            self._finish(job, "shutdown", error=message)
        self._inbox.put(("interrupt", message))

    def start(self) -> "Scheduler":
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what is left, stop the thread, hand the caches back; waits `timeout` seconds at
        most (a step or compilation in progress finishes first)."""
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    def warmup_stages(self, full: bool = True) -> list[tuple[str, int]]:
        """(method, requests at once) of each stage of `warmup`, in its order."""
        counts = [1]
        while full and counts[-1] < self.slots:
            counts.append(min(counts[-1] * 2, self.slots))
        return [(method, count) for method in self.methods for count in counts]

    def warmup(self, prompt_ids, max_new_tokens: int = 8, *, full: bool = True,
               on_stage: Callable[[int, int, str, int, float | None], None] | None = None) -> None:
        """Compile the shapes of short requests in every method, so that clients wait for nothing:
        one request alone, and with `full` also 2, 4, … `slots` requests at once (a pool computes
        the rows up to its highest busy slot, a power of two: each count is its own compiled step).
        Plain decoding's request alone decodes past EOS, so that its chunk loop compiles whatever
        the model answers. `on_stage(n, of, method, count, seconds)` hears of each stage (see
        `warmup_stages`) as it starts (seconds None) and as it ends (its seconds), so that a
        warm-up of minutes shows how far it is. `interrupt` ends it early (the server stops before
        it serves): it returns then, at once."""
        settings = GenerationSettings(max_new_tokens=max_new_tokens, max_length=self.max_length)
        stages = self.warmup_stages(full)
        for n, (method, count) in enumerate(stages, 1):
            if on_stage is not None:
                on_stage(n, len(stages), method, count, None)
            began = time.monotonic()
            queues = []
            for _ in range(count):
                q, sink = thread_sink()
                # plain decoding's request alone decodes past EOS, so that its chunk loop (long to
                # compile) is ready even where the model ends its answer at once
                past_eos = count == 1 and not decoding_methods.get(method).drafts
                try:
                    self.submit(prompt_ids, settings, sink, method=method, stop_at_eos=not past_eos)
                except RuntimeError:
                    if self._closing.is_set():
                        return
                    raise
                queues.append(q)
            for q in queues:
                while not (event := q.get()).done:
                    pass
                if event.finish_reason == "shutdown":
                    return
                if event.error:
                    raise RuntimeError(f"warm-up of method {method!r} failed: {event.error}")
            if on_stage is not None:
                on_stage(n, len(stages), method, count, time.monotonic() - began)

    # ------------------------------------------------------------------ the scheduler thread
    def _pool(self, method: str, tree_size: int | None) -> SlotPool:
        record = decoding_methods.get(method)
        key = (method, tree_size if record.tree_per_request else None)
        if key not in self._pools:
            self._pools[key] = record.pool(self.model, self.slots, self.max_length, tree_size)
        return self._pools[key]

    def compiling(self) -> tuple[float, str] | None:
        """(seconds so far, what) of the compilation the scheduler thread runs now, or None."""
        return compiling_in(self._thread.ident)

    def _loop(self) -> None:
        try:
            while self._turn():
                pass
        except Exception as e:  # a bug outside any pool's step: every client hears of it, the log has the traceback
            log.exception("the scheduler stopped")
            with self._lock:
                self.failure = f"{type(e).__name__}: {e}"
            self._fail_all(f"internal error: {self.failure}")
        finally:
            with self._lock:  # from here on `submit` refuses: nothing is queued for a thread that has gone
                self._stop.set()
            self._fail_all(None)
            for pool in self._pools.values():
                pool.close()

    def _turn(self) -> bool:
        """One turn of the loop: take what clients asked, step every active pool; False to stop."""
        if self._stop.is_set():
            return False
        self._drain(block=not any(p.active for p in self._pools.values()))
        self._step_pools()
        return True

    def _step_pools(self) -> None:
        for key, pool in list(self._pools.items()):
            if not pool.active:
                continue
            # the jobs a step serves: those it admits when it admits (the pool's rule), else every busy one
            free = sum(r is None for r in pool.busy)
            admits = bool(pool.waiting) and free > 0
            served = list(pool.waiting)[:free] if admits else [r for r in pool.busy if r is not None]
            try:
                self._step_pool(pool)
            except Exception as e:  # one request's failure (a bug, a device error) ends the jobs it touched
                log.exception("a step of the %s pool failed", key[0])
                self._step_failed(key, pool, served, admits, f"{type(e).__name__}: {e}")

    def _step_failed(self, key, pool: SlotPool, served: list, admitted: bool, error: str) -> None:
        """End the jobs of a failed step with `error`. A failed admission leaves the pool's running
        jobs alone (the joining ones leave their slots); a failed step of every busy job leaves the
        pool in an unknown state: it is dropped, its jobs end too, and the next job makes a new one."""
        if not admitted:
            served = [r for r in [*pool.busy, *pool.waiting] if r is not None]
        for request in served:
            pool.cancel(request)
            job = self._jobs.pop(request, None)
            if job is not None:
                self._finish(job, "error", error=f"internal error: {error}")
        if not admitted:
            del self._pools[key]
            pool.close()  # its caches go back to the engine unless the failure deleted them

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, job = item
            if kind == "submit":
                self._admit(job)
            elif kind == "cancel":
                self._cancel(job)
            elif kind == "interrupt":
                self._fail_all(job, reason="shutdown")
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, job: Job) -> None:
        try:
            job._handle = self._pool(job.method, job.tree_size).submit(job.prompt_ids, job.settings, job.stats,
                                                                        stop_at_eos=job.stop_at_eos)
            job.clock = job._handle.clock  # its share of its pool's calls, kept by the pool driver
            self._jobs[job._handle] = job
        except ValueError as e:
            self._finish(job, "error", error=str(e))
        except Exception as e:  # a bug met by this request alone: it fails, the others go on
            log.exception("admitting a job failed")
            self._finish(job, "error", error=f"internal error: {type(e).__name__}: {e}")

    def _cancel(self, job: Job) -> None:
        if job.done:
            return
        if job._handle is not None:
            for pool in self._pools.values():
                if pool.cancel(job._handle):
                    break
            self._jobs.pop(job._handle, None)
        self._finish(job, "cancelled")

    def _step_pool(self, pool: SlotPool) -> None:
        # the pool driver times the call and gives each request (hence its job: `Job.clock`) its share
        moved = Driver(pool, self._timer).step().events
        # a call may move a request by several steps (an engine with device_steps): one event each,
        # the job finished at its last event
        last = {event.request: i for i, event in enumerate(moved)}
        for i, event in enumerate(moved):
            request, kept, accepted, plain = event.request, event.ids, event.accepted, event.plain
            job = self._jobs.get(request)
            if job is None:
                continue
            job.token_ids.extend(kept)
            if request.done and last[request] == i:
                del self._jobs[request]
                self._finish(job, request.finish_reason, kept, accepted, plain=plain)
            else:
                job.sink(Event(kept, accepted, plain=plain))

    def _finish(self, job: Job, reason: str, ids: list[int] | None = None, accepted: int = 0,
                error: str | None = None, plain: bool = False) -> None:
        with self._lock:  # once: `interrupt` may end a job while the scheduler thread steps it
            if job.done:
                return
            job.finish_reason = reason
            self.finished[reason] += 1
            self._open.discard(job)
        if not job.stats.total_s:
            job.stats.total_s = time.perf_counter() - job.created
        job.sink(Event(list(ids or []), accepted, True, reason, error, plain))

    def _fail_all(self, error: str | None, reason: str = "error") -> None:
        """Finish every job still open: `reason` ('error' after a crash, 'shutdown' when the server
        stops) with `error`, or 'cancelled' without one (the thread ends)."""
        jobs = list(self._jobs.values())
        while True:
            try:
                kind, job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                jobs.append(job)
        for job in jobs:
            if job._handle is not None:
                for pool in self._pools.values():
                    if pool.cancel(job._handle):
                        break
            self._finish(job, reason if error else "cancelled", error=error)
        self._jobs.clear()


def check_bounds(settings: GenerationSettings) -> None:
    """Raise ValueError when `settings` pass the library's bounds (`GenerationSettings` checks what
    enters a fixed-width type on the device) but not the server's stricter temperature ceiling,
    which the HTTP schema also applies, for requests from the UI."""
    if not settings.temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must lie in [0, {MAX_TEMPERATURE:g}] (0 = greedy), got {settings.temperature}.")
