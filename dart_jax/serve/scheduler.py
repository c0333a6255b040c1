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

The warm-up (`warmup`, its stages in dart_jax/serve/warmup.py) compiles every program the pools
run ahead of time, in threads of its own, single requests of every method first; while the rest
warms behind a serving server, a pool admits only as many requests at once, for prompts as long,
as is warm (the others wait in order), so that no request runs a program still compiling.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from dart_jax.api import methods as decoding_methods
from dart_jax.api.compiling import CompileTimer, compiling_in
from dart_jax.api.model import DartModel
from dart_jax.api.methods import TREE_SIZE_RANGE, max_tree_nodes
from dart_jax.decoding import ahead
from dart_jax.decoding.batcher import SlotPool
from dart_jax.decoding.driver import Driver
from dart_jax.decoding.requests import Stats, WarmTime
from dart_jax.decoding.settings import GenerationSettings

from .warmup import WARM_LENGTH, Compiler, OutOfMaps, Progress, Stage, plan

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
    stop_at_eos: bool = True  # False: decode past EOS (a warm-up's, to run its steps whatever the model answers)
    warmup: bool = False  # one of the warm-up's own requests
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
        most = max_tree_nodes(model.engine.tree, model.engine.drafter.max_depth)
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
        # the warm-up (`warmup`): how far it is (GET /health), its threads compiling ahead, and while
        # it runs behind the server, per pool what is warm and the requests held back until it is
        self.background_warmup = True  # False: every stage warms before the server serves (`warmup`)
        self.compiles_ahead = True  # False: the warm-up's requests compile what they run, in this thread
        self.progress: Progress | None = None
        self._compiler: Compiler | None = None
        self._held: dict[tuple, collections.deque[Job]] = {}  # pool → clients' requests waiting for the warm-up, in order
        self._warm_held: dict[tuple, list[Job]] = {}  # pool → a stage's requests waiting for its clients to leave
        self._warm: dict[tuple, list[tuple[int, int]]] | None = None  # pool → (rows, prompt tokens) warm; None: no limit
        self._warm_prompt: dict[tuple, int] = {}  # pool → the longest prompt its warm-up covers
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
               method: str = "dart", tree_size: int | None = None, stop_at_eos: bool = True,
               warmup: bool = False) -> Job:
        """Queue a generation; its events go to `sink`. Raises ValueError for a bad request.
        `stop_at_eos=False` decodes past EOS up to the token limits; `warmup`: the warm-up's own."""
        size = self.check(prompt_ids, settings, method, tree_size)
        job = Job(next(self._ids), method, list(prompt_ids), settings, size, sink, stop_at_eos=stop_at_eos,
                  warmup=warmup)
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
        if self._compiler is not None:
            self._compiler.close()
        self._inbox.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def compiling_ahead(self) -> bool:
        """Whether one of the warm-up's threads is inside a compilation now."""
        return self._compiler is not None and self._compiler.busy

    def warmup_plan(self, full: bool = True, length: int = WARM_LENGTH) -> list[Stage]:
        """The stages of `warmup`, in its order (`dart_jax.serve.warmup.plan`)."""
        return plan(self.methods, self.slots, self.max_length, full=full, length=length)

    def warmup(self, prompt_ids, max_new_tokens: int = 4, *, full: bool = True, length: int = WARM_LENGTH,
               on_stage: Callable[[int, int, Stage, float | None], None] | None = None,
               ready: Callable[[], None] | None = None, threads: int | None = None) -> None:
        """Warm the server up, stage by stage (`warmup_plan`, dart_jax/serve/warmup.py): each
        stage's programs compiled ahead of time by `threads` threads (default: the usable cores, at
        most 4; a stage's programs compile while the stage before runs its requests, those of the
        stages after the single requests' once these are warm), then its
        requests (`prompt_ids`, `max_new_tokens` tokens each, past EOS, half of them sampling) run
        at once through this scheduler. `ready()` is called once the single-request stages are
        warm (the server then accepts requests); `on_stage(n, of, stage, seconds)` hears of each
        stage as it starts (seconds None) and as it ends.

        While the warm-up goes on behind a serving server (`background_warmup`), a pool admits
        only what is warm (the rule that no request runs a program still compiling): up to as
        many requests at once as its warm stages cover for their prompts (prompts longer than the
        warm-up covers count as its longest), the others waiting in order; a stage's requests
        join its pool only when no client's request is in it, and no client's joins while they
        run; a pool whose clients fill what is warm takes no more of them until it has emptied and
        the stage due has run. Requests of other tree sizes, and every request once the warm-up
        has ended (or stopped), are admitted as they come. An answer that grows past the
        sequences its stage covers before a longer stage is warm compiles its next attention
        window in its own step (admission sees only the prompt). `interrupt` ends the warm-up early (it
        returns then); a failed compilation or request raises."""
        stages = self.warmup_plan(full, length)
        progress = self.progress = Progress(stages)
        if threads is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            threads = min(4, cores or 1)
        compiler = self._compiler = Compiler(threads, progress)
        if self.background_warmup:
            self._inbox.put(("warming", stages))
        try:
            programs = self._programs(stages)
            # the single requests' programs first and alone: the rest would take cores from them
            futures = [[compiler.submit(p) for p in listed] if stage.ready else [] for stage, listed in
                       zip(stages, programs)]
            for n, stage in enumerate(stages, 1):
                progress.current = n - 1
                if on_stage is not None:
                    on_stage(n, len(stages), stage, None)
                began = time.monotonic()
                try:
                    compiled = self._wait(futures[n - 1])
                except OutOfMaps as e:
                    if not progress.ready:
                        raise
                    log.warning("the warm-up %s", e)
                    progress.finish(str(e))
                    return
                if not compiled or not self._warm_requests(stage, prompt_ids, max_new_tokens):
                    progress.finish("interrupted: the server stops")
                    return
                self._inbox.put(("warmed", stage))
                if on_stage is not None:
                    on_stage(n, len(stages), stage, time.monotonic() - began)
                if stage.ready and (n == len(stages) or not stages[n].ready):
                    progress.ready = True
                    if ready is not None:
                        ready()
                    futures = [done if s.ready else [compiler.submit(p) for p in listed]
                               for s, done, listed in zip(stages, futures, programs)]
            progress.current = len(stages)
            progress.finish()
        except BaseException as e:
            progress.finish(f"{type(e).__name__}: {e}")
            raise
        finally:
            compiler.close()
            if self.background_warmup:
                self._inbox.put(("warmed", None))  # the pools admit as they come from now on

    def _programs(self, stages: list[Stage]) -> list[list[ahead.Program]]:
        """The programs each stage compiles ahead (those of an earlier stage left out). The pools
        are made (their caches allocated) in the scheduler thread."""
        out, seen = [], set()
        for stage in stages:
            listed = [] if not self.compiles_ahead else self._call(lambda s=stage: ahead.programs(
                self._pool(*self._stage_pool(s)), s.rows, s.prompt_length, s.length))
            out.append([p for p in listed if (stage.method, p) not in seen])
            seen.update((stage.method, p) for p in out[-1])
            self.progress.add_programs(len(out[-1]))
        return out

    def _wait(self, futures: list[concurrent.futures.Future]) -> bool:
        """Wait for these compilations (raising the first error); False when the server stops first."""
        pending = set(futures)
        while pending:
            if self._closing.is_set() or self._stop.is_set():
                return False
            done, pending = concurrent.futures.wait(pending, timeout=0.25)
            for future in done:
                if future.cancelled():
                    return False
                future.result()
        return True

    def _warm_requests(self, stage: Stage, prompt_ids, max_new_tokens: int) -> bool:
        """A stage's requests, all at once, decoding past EOS (so that their steps run whatever the
        model answers), every second one sampling; False when the server stops first."""
        queues = []
        for i in range(stage.rows):
            settings = GenerationSettings(max_new_tokens=max_new_tokens, max_length=self.max_length,
                                          temperature=0.7 if i % 2 else 0.0, seed=i)
            q, sink = thread_sink()
            try:
                self.submit(prompt_ids, settings, sink, method=stage.method, stop_at_eos=False, warmup=True)
            except RuntimeError:
                if self._closing.is_set() or self._stop.is_set():
                    return False
                raise
            queues.append(q)
        for q in queues:
            while not (event := q.get()).done:
                pass
            if event.finish_reason in ("shutdown", "cancelled"):
                return False
            if event.error:
                raise RuntimeError(f"warm-up of method {stage.method!r} failed: {event.error}")
        return True

    def _call(self, fn: Callable[[], Any]) -> Any:
        """`fn()` run by the scheduler thread (what touches the pools), its result or error here."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._refuse_if_down()
            self._inbox.put(("call", (fn, future)))
        return future.result()

    # ------------------------------------------------------------------ the scheduler thread
    def _key(self, method: str, tree_size: int | None) -> tuple[str, int | None]:
        return method, tree_size if decoding_methods.get(method).tree_per_request else None

    def _stage_pool(self, stage: Stage) -> tuple[str, int | None]:
        """The pool a warm-up stage warms: its method's at the default tree size."""
        return self._key(stage.method, decoding_methods.get(stage.method).tree_size(self.model))

    def _pool(self, method: str, tree_size: int | None) -> SlotPool:
        key = self._key(method, tree_size)
        if key not in self._pools:
            self._pools[key] = decoding_methods.get(method).pool(self.model, self.slots, self.max_length, tree_size)
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
        self._release()
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
            elif kind == "call":
                self._run_call(*job)
            elif kind == "warming":  # the stages about to warm: their pools admit what is warm from now on
                self._warm = {self._stage_pool(stage): [] for stage in job}
                for stage in job:
                    key = self._stage_pool(stage)
                    self._warm_prompt[key] = max(self._warm_prompt.get(key, 0), stage.prompt_length)
            elif kind == "warmed":  # a stage is warm (None: the warm-up ended; its pools admit as they come)
                if job is None:
                    self._warm = None
                elif self._warm is not None:
                    self._warm[self._stage_pool(job)].append((job.rows, job.prompt_length))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    @staticmethod
    def _run_call(fn: Callable[[], Any], future: concurrent.futures.Future) -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - the caller's to handle
            future.set_exception(e)

    def _in_pool(self, key) -> tuple[list[Job], list[Job]]:
        """The clients' jobs and the warm-up's in pool `key` (running or about to join)."""
        pool = self._pools.get(key)
        jobs = [] if pool is None else [self._jobs.get(r) for r in (*pool.busy, *pool.waiting) if r is not None]
        jobs = [j for j in jobs if j is not None]
        return [j for j in jobs if not j.warmup], [j for j in jobs if j.warmup]

    def _warm_rows(self, key, prompt: int) -> int | None:
        """How many requests at once pool `key` may hold while the warm-up goes on, for prompts of
        up to `prompt` tokens (None: no limit)."""
        if self._warm is None or key not in self._warm:
            return None
        prompt = min(prompt, self._warm_prompt[key])
        return max((rows for rows, covered in self._warm[key] if covered >= prompt), default=0)

    def _admissible(self, key, job: Job, held: bool = False) -> bool:
        """Whether `job` may join its pool now (the rule of `warmup`); `held`: it waits in `_held`."""
        clients, warming = self._in_pool(key)
        if job.warmup:  # a stage's requests run alone
            return not clients
        if warming:
            return False
        if held and self._warm_held.get(key):  # clients wait for what is warm: the pool empties for the stage due
            return False
        pool = self._pools.get(key)
        joining = [self._jobs[r] for r in (pool.waiting if pool is not None else ()) if r in self._jobs]
        rows = self._warm_rows(key, max(len(j.prompt_ids) for j in [*joining, job]))
        return rows is None or len(clients) + 1 <= rows

    def _admit(self, job: Job) -> None:
        """Into its pool, or held back (in order) while the warm-up has not warmed what it needs."""
        key = self._key(job.method, job.tree_size)
        if job.warmup and not self._admissible(key, job):
            self._warm_held.setdefault(key, []).append(job)
        elif not job.warmup and (self._held.get(key) or not self._admissible(key, job)):
            self._held.setdefault(key, collections.deque()).append(job)
        else:
            self._enter(job)

    def _release(self) -> None:
        """The held requests that may join their pools now: a stage's all together, clients in order."""
        for key in list(self._warm_held):
            if self._warm_held[key] and self._admissible(key, self._warm_held[key][0]):
                for job in self._warm_held.pop(key):
                    if not job.done:
                        self._enter(job)
        for key, held in list(self._held.items()):
            while held and (held[0].done or self._admissible(key, held[0], held=True)):
                job = held.popleft()
                if not job.done:
                    self._enter(job)
            if not held:
                del self._held[key]

    def _enter(self, job: Job) -> None:
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
        for held in (*self._held.values(), *self._warm_held.values()):
            if job in held:
                held.remove(job)
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
        jobs = [*self._jobs.values(), *(j for held in (*self._held.values(), *self._warm_held.values()) for j in held)]
        self._held.clear()
        self._warm_held.clear()
        while True:
            try:
                kind, job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                jobs.append(job)
            elif kind == "call":
                job[1].set_exception(RuntimeError("the server is shutting down."))
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
