"""Continuous batching: a fixed pool of sequence slots on the device that requests join and leave.

`Batcher(engine, slots, max_length)` holds the caches of `slots` sequences and, per slot, its
committed length, PRNG key, sampling settings and the drafter's last proposal. `submit` queues a
request (token ids and its own `GenerationSettings`); each `step` either prefills waiting requests
into the free slots (one jitted call; the other slots are left untouched) or runs one speculative
step for every busy slot (one jitted call, one tree search over the busy slots, one transfer each
way). A request that finishes frees its slot at once. The pool size and every shape are static, so
requests come and go without compiling anything after warm-up.

`Batcher(..., overlap=True)` (`Engine.batcher(slots, overlap=True)`) overlaps the host's tree
search with the device's verify: the m live rows are split into two halves of m/2 rows (rows
0…m/2-1 and m/2…m-1), each stepped by its own jitted call (`Engine.step_rows`, one compiled step
for both halves). JAX dispatches asynchronously, so one `step` lands the half whose step is on the
device (blocks on its answer), dispatches the other half's step (its trees were searched during
the previous call) and searches the landed half's next trees while that step runs: a pipeline of
half-steps, each `step` returning one half's tokens. Outputs are those of the default path (each
row's step is the same computation on its own rows; greedy outputs are equal, and with a fixed
tree size sampled ones too, the keys being per row). The pipeline stops (the step in flight
lands alone) to admit waiting requests, and when the live rows change or one half has no busy
row (then the default whole-pool step runs); tree size 0 (keep="auto"'s plain chunks) runs on the
whole pool. When it pays: each half-step runs the whole model once more (on a GPU at small batch
it streams every weight again, ≈ the cost of a plain token of the target), so overlap wins only
where the host search of one half takes at least what the second device call adds: large batches
of big trees on an accelerator, never batch 1 (no split), nor a CPU, where XLA already keeps every
core busy with the device work (benchmarks/RESULTS.md has the measured break-even). `overlap_stats` counts
the half-steps and the host's search and wait seconds (how much search the device time hid).

How a step advances the busy slots (host step, device loop, plain chunk, overlapped halves) is one
small strategy each, in decoding/advance.py; `Batcher._advance` picks the one that runs.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.errors import InputError, check_type
from dart_jax.models.multihost import to_host

from .adaptive import RowAcceptance
from .advance import DeviceLoop, HostStep, Overlapped, PlainChunk, time_dry
from .autoregressive import attention_window, live_rows
from .compile_time import CompileTimer
from .device_tree import TreeEdit
from .layout import device_steps_layout, plain_layout, prefill_layout, step_layout, tree_layout
from .requests import Budget, Stats, WarmTime
from .sampling import SamplingParams, row_keys, to_device
from .settings import GenerationSettings, check_settings
from .state import PoolState


@dataclasses.dataclass(eq=False)
class Request:
    """A submitted generation; `token_ids` grows as it runs, `done` when it stopped."""

    prompt_ids: np.ndarray
    settings: GenerationSettings
    stats: Stats
    budget: Budget
    index: int  # submission order
    slot: int | None = None
    cancelled: bool = False
    _started: float = 0.0
    clock: WarmTime = dataclasses.field(default_factory=WarmTime)  # its share of the pool's calls (`driver.Driver`)

    @property
    def token_ids(self) -> list[int]:
        return self.budget.out

    @property
    def done(self) -> bool:
        return self.budget.done

    @property
    def finish_reason(self) -> str | None:
        """'eos', 'length' or 'cancelled' once done, else None."""
        if not self.done:
            return None
        if self.cancelled:
            return "cancelled"
        return "eos" if self.token_ids and self.token_ids[-1] in self.budget.eos_ids else "length"


@dataclasses.dataclass(frozen=True, eq=False)
class StepEvent:
    """What one request got from one step of a pool: `ids`, the new token ids its budget kept;
    `accepted`, the step's accepted length (0 for the prefill's first token, k+1 for a speculative
    step, 1 for plain tokens); `plain`, whether the ids came from plain decoding (a `PlainBatcher`,
    or tree size 0 of keep="auto") with no draft to accept; `same_call`, whether the step came from
    the same device call as the request's event before it (an engine with `device_steps` takes
    several steps a call: the call's time belongs to its first event). Unpacks as (request, ids,
    accepted)."""

    request: "Request"
    ids: list[int]
    accepted: int
    plain: bool = False
    same_call: bool = False

    def __iter__(self):
        return iter((self.request, self.ids, self.accepted))


def pool_slots(batch_size: int, requests: int) -> int:
    """Slots for `requests` requests in batches of at most `batch_size`: a power of two (few pool
    shapes to compile), and no more than the requests need."""
    if int(batch_size) < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}.")
    return min(1 << (int(batch_size) - 1).bit_length(), 1 << (max(requests, 1) - 1).bit_length())


class SlotPool:
    """A fixed pool of `slots` sequences of at most `max_length` tokens over `engine`: requests
    queue, join free slots, run and leave. The decoding of a step is the subclass's (`_admit`:
    prefill waiting requests into free slots; `_advance`: one step of every busy slot)."""

    def __init__(self, engine, slots: int, max_length: int = 2048):
        """`engine`: a `dart_jax.decoding.engine.Engine` (its jitted calls, drafter, trie and caches),
        for a `PlainBatcher` an `AutoregressiveDecoder`."""
        if int(slots) < 1:
            raise ValueError(f"the pool needs at least one slot, got {slots}.")
        if int(max_length) < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}.")
        self.engine, self.slots, self.max_length = engine, int(slots), int(max_length)
        self.length = self._cache_length()
        b = self.slots
        self.settings: list[GenerationSettings | None] = [None] * b
        # a set held from an earlier pool may be longer than asked: its length is the pool's
        self.length, caches = engine.pool.take(
            self.length, self.slots, what=f"a pool of {self.slots} slots of {self.length} cache positions",
            fix="use fewer slots (batch size) or a smaller max_length.")
        # the keys are placeholders: a request brings its own
        self.state = PoolState(*caches, cache_len=to_device(np.zeros((b,), np.int32)), keys=row_keys([0] * b),
                               params=self._params())
        self._stale_params = False
        self.committed = np.zeros(b, np.int64)  # tokens in each slot's cache (the host's copy of cache_len)
        self.busy: list[Request | None] = [None] * b
        self.waiting: collections.deque[Request] = collections.deque()
        self._submitted = 0
        self.closed = False  # close() handed the caches back: no request joins and no step runs after it

    # ------------------------------------------------------------------ requests
    def submit(self, prompt_ids, settings: GenerationSettings = GenerationSettings(),
               stats: Stats | None = None, *, stop_at_eos: bool = True) -> Request:
        """Queue a request; it joins the pool at a step when a slot is free. `stop_at_eos=False`
        decodes past the model's EOS ids, up to the token limits (a warm-up that must run steps
        whatever the model answers)."""
        self._check_open("submit")
        settings = check_settings(settings)
        if settings.max_length > self.max_length:
            raise ValueError(f"the request's max_length {settings.max_length} exceeds the pool's {self.max_length}; "
                             "open the pool with a larger max_length.")
        ids = self.engine.check_request(prompt_ids, settings)
        stats = stats if stats is not None else Stats()
        budget = Budget(self.engine.eos_ids if stop_at_eos else frozenset(), settings.max_new_tokens,
                        settings.max_length - ids.size)
        stats.prompt_tokens, stats.token_ids = ids.size, budget.out
        request = Request(ids, settings, stats, budget, self._submitted)
        self._submitted += 1
        self.waiting.append(request)
        return request

    def cancel(self, request: Request) -> bool:
        """Stop a request now: a waiting one leaves the queue, a running one frees its slot (the
        next admission overwrites its cache rows). Its tokens so far stay; finish_reason becomes
        'cancelled'. False when it had already finished."""
        check_type(request, "request", Request, "a Request (the handle that submit() returned)")
        if request.done:
            return False
        request.cancelled, request.budget.done = True, True
        if request in self.waiting:
            self.waiting.remove(request)
        elif request.slot is not None and self.busy[request.slot] is request:
            request.stats.total_s = time.perf_counter() - request._started
            self._release(request.slot)
        return True

    @property
    def active(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting) or any(r is not None for r in self.busy)

    def step(self) -> list[StepEvent]:
        """Admit waiting requests into free slots, or else advance every busy slot by one step.
        Returns (request, new token ids, accepted length; 0 for a prefill's first token) for each
        request that moved."""
        self._check_open("step")
        free = [i for i, r in enumerate(self.busy) if r is None]
        if self.waiting and free:
            return self._admit(free)
        if any(r is not None for r in self.busy):
            return self._advance()
        return []

    def close(self) -> None:
        """Give the caches back to the engine for the next pool (unfinished requests stay unfinished);
        once: a second close gives nothing back twice."""
        if self.closed:
            return
        self.closed = True
        now = time.perf_counter()
        for request in self.busy:
            if request is not None:
                request.stats.total_s = now - request._started
        self._keep_caches()
        self.busy = [None] * self.slots
        self.waiting.clear()

    def _check_open(self, call: str) -> None:
        if self.closed:
            raise InputError(f"{call}() on a closed pool: close() gave its caches back to the engine, another pool "
                             "may hold them now; open a new pool (DartModel.batcher / Engine.batcher).")

    def _cache_length(self) -> int:
        """Cache slots per sequence of this pool (its caches are the engine's `new_caches`)."""
        raise NotImplementedError

    def _keep_caches(self) -> None:
        self.engine.pool.keep(self.length, self.state.caches(), self.slots)

    def _admit(self, free: list[int]) -> list[StepEvent]:
        raise NotImplementedError

    def _advance(self) -> list[StepEvent]:
        raise NotImplementedError

    # ------------------------------------------------------------------ device calls
    def _params(self) -> SamplingParams:
        # an empty slot decodes greedily: when every busy slot is greedy the sampling work is skipped
        return SamplingParams.rows([(s.temperature, s.top_p, s.top_k) if s else (0.0, 1.0, 0)
                                    for s in self.settings])

    def _take(self, request: Request, ids: list[int], accepted: int, plain: bool = False,
              same_call: bool = False) -> StepEvent:
        kept = request.budget.take(ids)
        request.stats.uncount(len(ids) - len(kept), plain)
        request.stats.new_tokens = len(request.token_ids)
        if request.done:
            request.stats.total_s = time.perf_counter() - request._started
            self._release(request.slot)
        return StepEvent(request, kept, accepted, plain, same_call)

    def _record(self, slot: int, steps: list, *, size: int | None, device_s: float, tree_s: float = 0.0,
                plain: bool = False) -> list[StepEvent]:
        """A busy slot's committed length, its request's stats and budget after a device call that
        moved it, and one event per step: `steps` (ids, count) per step of the call: `count`
        tokens committed (the accepted nodes and the bonus, or with `plain` a chunk of plain tokens,
        each a step of its own), `ids` what the request's budget is offered (cut at a stop); `size`
        the steps' tree size (None: a pool that never drafts records none); the call's `device_s` and
        `tree_s` count once."""
        request = self.busy[slot]
        s = request.stats
        s.device_s += device_s
        s.tree_s += tree_s
        events = []
        for i, (ids, count) in enumerate(steps):
            self.committed[slot] += count
            if plain:
                s.steps += count
                s.accept_lengths.extend([1] * count)
                s.tree_sizes.extend([] if size is None else [size] * count)
            else:
                s.steps += 1
                s.accept_lengths.append(count)
                s.tree_sizes.append(size)
            events.append(self._take(request, np.asarray(ids).tolist(), 1 if plain else count, plain, i > 0))
        return events

    def _release(self, slot: int) -> None:
        self.busy[slot] = None
        if self.settings[slot].temperature > 0:  # a free slot should not keep the batch sampling
            self._stale_params = True
        self.settings[slot] = None

    def _joining(self, free: list[int]) -> tuple[list[tuple[int, Request]], np.ndarray, np.ndarray, np.ndarray]:
        """Waiting requests into the lowest free slots: (slot, request) pairs, then for the first m
        rows of the pool (`live_rows`: those up to the highest busy slot) the ids padded to whole chunks [m,T],
        prompt lengths [m] and start [m] (0 for a joining row; the cache length for a row left
        alone, whose writes then fall past the cache and are dropped). Sets the new keys and params."""
        joining = [(slot, self.waiting.popleft()) for slot in free[:len(self.waiting)]]
        start_time = time.perf_counter()
        for slot, request in joining:
            self.settings[slot], request.slot, self.busy[slot] = request.settings, slot, request
            request._started = start_time
        m = self._live()
        ids = np.zeros((m, self.engine.shapes.padded(max(r.prompt_ids.size for _, r in joining))), np.int32)
        prompt_len = np.ones(m, np.int32)
        start = np.full(m, self.length, np.int32)
        seeds = {}
        for slot, request in joining:
            ids[slot, :request.prompt_ids.size] = request.prompt_ids
            prompt_len[slot], start[slot] = request.prompt_ids.size, 0
            seeds[slot] = request.settings.seed
        self.state, self._stale_params = self.state.replace(params=self._params(), keys=self._keys(seeds)), False
        return joining, ids, prompt_len, start

    def _keys(self, seeds: dict[int, int]) -> jax.Array:
        """The pool's PRNG keys with the joining slots' fresh from their seeds (`seeds`, slot →
        seed), the other busy rows' as they are (made on the host: `sampling.row_keys`)."""
        if all(slot in seeds for slot, r in enumerate(self.busy) if r is not None):
            return row_keys([seeds.get(slot, 0) for slot in range(self.slots)])
        fresh = row_keys(list(seeds.values()))
        data = np.array(jax.random.key_data(self.state.keys))  # the rows decoding: their keys have moved on
        data[list(seeds)] = np.asarray(jax.random.key_data(fresh))
        return jax.random.wrap_key_data(to_device(data))

    def _chunks(self, ids: np.ndarray, prompt_len: np.ndarray, start: np.ndarray, follow: int = 0):
        """The prefill's calls, one per chunk of the joining prompts (`_joining`'s ids, prompt lengths
        and start): (the chunk's ids [m, chunk + follow] from its offset, each row's start in it: the
        offset where the row joins and its prompt reaches it, else the cache length (left alone),
        the offset)."""
        chunk = self.engine.shapes.chunk
        for offset in range(0, ids.shape[1], chunk):
            part = np.zeros((ids.shape[0], chunk + follow), np.int32)
            taken = ids[:, offset:offset + chunk + follow]
            part[:, :taken.shape[1]] = taken
            rows_start = np.where((start == 0) & (prompt_len > offset), offset, self.length).astype(np.int32)
            yield part, rows_start, offset

    def _live(self) -> int:
        return live_rows(max(i for i, r in enumerate(self.busy) if r is not None), self.slots)

    def _joined(self, joining, prompt_len: np.ndarray) -> None:
        joined = np.zeros(self.slots, bool)
        joined[[slot for slot, _ in joining]] = True
        lengths = np.zeros(self.slots, np.int32)
        lengths[:prompt_len.size] = prompt_len
        self.state = self.state.replace(cache_len=jnp.where(to_device(joined), to_device(lengths),
                                                            self.state.cache_len))


class DraftEdit:
    """A change to the draft trees a `Batcher` verifies, given at its construction (`Batcher(...,
    edit=)`, `Engine.batcher(..., edit=)`); DART's own pool has none. `searched` edits the trees the
    host searched for a step, before they are packed; with `device_steps` the trees are searched in
    the device loop, and `device` (a `device_tree.TreeEdit`, or None: no change there) edits them
    there, fed `device_inputs` each call, its output fields handed to `device_answer`. The
    forced-acceptance benchmark (`dart_jax/bench/forced.py`) is such an edit."""

    device: TreeEdit | None = None

    def searched(self, pool: "Batcher", trees: dict[str, np.ndarray], rows: list[int], start: int) -> None:
        """Edit in place the trees (`tree_layout` fields) of the busy slots `rows`, slot s in row
        s - start of each array."""

    def device_inputs(self, pool: "Batcher", rows: list[int], m: int, steps: int) -> Any:
        """`device`'s inputs for a call of `steps` steps over the first m rows (`rows` busy)."""

    def device_answer(self, pool: "Batcher", rows: list[int], out: dict) -> None:
        """The call's unpacked answer (`device_steps_layout` with `device`'s fields) for the busy `rows`."""


class Batcher(SlotPool):
    """The DART pool: each step verifies every busy slot's draft tree in one jitted call."""

    def __init__(self, engine, slots: int, max_length: int = 2048, *, overlap: bool = False,
                 edit: DraftEdit | None = None):
        """`overlap`: step the busy rows in two halves, the host searching one half's trees while the
        device verifies the other (module docstring); `edit`: a change to every drafted tree (`DraftEdit`)."""
        super().__init__(engine, slots, max_length)
        self.edit = edit
        if overlap and engine.device_steps:
            raise InputError("overlap searches trees on the host while the device verifies; this engine searches "
                             "them on the device (device_steps): use one or the other")
        self.overlap = bool(overlap)
        self._overlapped = Overlapped()  # overlap's pipeline, idle without it
        self.depth, self.k = engine.depth, engine.tree.topk
        self.fields = engine.drafter.proposal_fields(self.depth, self.k, engine.n_nodes)
        self.outputs = step_layout(self.depth, self.fields)
        self.trees = {size: tree_layout(size + 1, self.depth) for size in engine.tree_sizes if size}
        self.plain = plain_layout(engine.plain_chunk, self.fields)
        b = self.slots
        self.proposal = {f.name: np.zeros((b, *f.shape), np.float32 if f.dtype == "float32" else np.int32)
                         for f in self.fields}
        # the tree search's context per slot, as the reference passes it (docs/spec.md §5.4): after the
        # prefill the prompt and the first token, after a step the root, the accepted ids and the
        # bonus; kept up to the longest that is read (the trie's order - 1) or written (depth + 2)
        order = engine.trie.order if engine.trie is not None else 0
        self.context = max(self.depth + 2, order - 1)
        device_edit = edit.device if edit is not None else None
        self.device_outputs = (device_steps_layout(engine.device_steps, self.depth, self.context, self.fields,
                                                   extra=device_edit.fields(engine.device_steps) if device_edit else ())
                               if engine.device_steps else None)
        self.preceding = np.zeros((b, self.context), np.int64)
        self.preceding_len = np.ones(b, np.int64)
        self._empty = {size: self._empty_trees(size + 1) for size in engine.tree_sizes if size}
        # each busy slot's own acceptance figures (dart_jax.decoding.adaptive), new at its admission
        self.acceptance: list[RowAcceptance | None] = [None] * b
        # the sizer's costs leave compilation out (a size's first step, a new attention window)
        self._compiling = CompileTimer()
        # the advance modes (decoding/advance.py): size 0's, and the other sizes' one, chosen here
        self._plain_chunk = PlainChunk()
        self._tree_step = DeviceLoop() if engine.device_steps else HostStep()

    @property
    def overlap_stats(self) -> dict:
        """overlap's half-steps, restarts, and the host's search and wait seconds (module docstring)."""
        return self._overlapped.stats

    def _cache_length(self) -> int:
        return self.engine.cache_length(self.max_length - 1, self.max_length)

    def _admit(self, free: list[int]) -> list[StepEvent]:
        engine = self.engine
        start_time = time.perf_counter()
        joining, ids, prompt_len, start = self._joining(free)
        answers = []  # per chunk; a row's answer is its last chunk's
        for part, rows_start, offset in self._chunks(ids, prompt_len, start, follow=1):
            window = attention_window(offset + engine.drafter.reach(engine.shapes.chunk), self.length)
            packed, self.state = engine.prefill(to_device(part), to_device(prompt_len), to_device(rows_start),
                                                self.state, rows=self.depth, k=self.k, nodes=engine.n_nodes,
                                                window=window)
            answers.append(packed)
        self._joined(joining, prompt_len)
        last = (prompt_len - 1) // engine.shapes.chunk
        answers = {c: np.asarray(answers[c]) for c in set(last.tolist())}  # to the host: the chunks read
        out = prefill_layout(self.fields).unpack(np.stack([answers[c][row] for row, c in enumerate(last)]))
        elapsed = time.perf_counter() - start_time
        events = []
        for slot, request in joining:
            self.acceptance[slot] = engine.sizer.row()
            first = int(out["first"][slot])
            self._follow_up(slot, out, slot, np.append(request.prompt_ids, first)[-self.context:])
            self.committed[slot] = request.prompt_ids.size
            request.stats.prefill_s = elapsed
            events.append(self._take(request, [first], 0))
        return events

    def step(self) -> list[StepEvent]:
        if self._overlapped.flight is not None and self.waiting and any(r is None for r in self.busy):
            return self._overlapped.land_alone(self)  # overlap: the step in flight lands before requests join
        return super().step()

    def close(self) -> None:
        self._overlapped.drop()  # a step in flight is dropped with its requests unfinished
        super().close()

    def _advance(self) -> list[StepEvent]:
        """Every busy slot one step on, by the one advance mode (decoding/advance.py) this step calls
        for: the overlapped pipeline while it runs; else, of the tree size the sizer chooses, a
        plain chunk for size 0, the pool's tree step (host step or device loop) for the others."""
        engine = self.engine
        if self._stale_params:
            self.state, self._stale_params = self.state.replace(params=self._params()), False
        if self.overlap:
            plan = self._overlapped.halves(self)
            if plan is not None or self._overlapped.flight is not None:
                return self._overlapped.advance(self, plan)
        rows = [i for i, r in enumerate(self.busy) if r is not None]
        m = self._live()  # rows past m are free and not computed
        committed = int(self.committed[rows].max())
        size = engine.sizer.choose(m, lambda m, sizes: time_dry(self, m, committed, sizes), self._figures(rows))
        mode = self._plain_chunk if size == 0 else self._tree_step
        return mode.advance(self, rows, m, size, committed)

    def _search(self, size: int, rows: list[int], m: int, start: int = 0, *, dry: bool = False) -> np.ndarray:
        """The busy rows' draft trees of `size` nodes besides the root, packed for the first m rows
        (free slots among them get a root-only tree); with `start`, for the m rows from that one
        (`rows` among them: an overlapped pool's half). The pool's `edit` changes them, unless `dry`
        (the sizer's timing: no tree of it is verified)."""
        engine = self.engine
        found = engine.drafter.tree({name: a[rows] for name, a in self.proposal.items()}, self.preceding[rows],
                                    self.preceding_len[rows], engine.trie, engine.tree_settings(size),
                                    engine.tree_eos_id)
        empty = self._empty[size]
        if len(rows) == m:
            trees = {name: getattr(found, name) for name in empty}
        else:
            at = [r - start for r in rows] if start else rows
            trees = {name: array[:m].copy() for name, array in empty.items()}
            for name in trees:
                trees[name][at] = getattr(found, name)
        if self.edit is not None and not dry:
            self.edit.searched(self, trees, rows, start)
        return self.trees[size].pack(trees)

    def _figures(self, slots) -> list[RowAcceptance]:
        """The acceptance figures of these busy slots, for the sizer's choice."""
        return [self.acceptance[slot] for slot in slots]

    def _per_row(self, slots, counts) -> list[tuple[RowAcceptance, float]]:
        """(figures, accepted length) of these slots after a step (`TreeSizer.observe`)."""
        return [(self.acceptance[slot], float(c)) for slot, c in zip(slots, counts)]

    def _roots(self, m: int) -> np.ndarray:
        """Each of the first m rows' pending token (the last one, not yet in the cache)."""
        return self.preceding[np.arange(m), self.preceding_len[:m] - 1].astype(np.int32)

    def _uncompiled(self) -> float:
        """The seconds of the last block timed by `_compiling`, less what it spent compiling."""
        return max(self._compiling.last_wall - self._compiling.last_seconds, 0.0)

    def _follow_up(self, slot: int, out: dict, row: int, preceding: np.ndarray) -> None:
        """What the next tree search of `slot` reads: the drafter's proposal (row `row` of the device
        call's unpacked answer `out`) and the ids fed to it (`preceding`, the root last)."""
        for f in self.fields:
            self.proposal[f.name][slot] = out[f.name][row]
        self._set_preceding(slot, preceding)

    def _commit(self, slot: int, out: dict, row: int, preceding: np.ndarray, steps: list[tuple[np.ndarray, int]], *,
                size: int, device_s: float, tree_s: float = 0.0, plain: bool = False) -> list[StepEvent]:
        """The one bookkeeping of a busy slot after a device call that moved it: its next search's
        inputs (`_follow_up`), then `SlotPool._record` (committed length, stats, budget, events)."""
        self._follow_up(slot, out, row, preceding)
        return self._record(slot, steps, size=size, device_s=device_s, tree_s=tree_s, plain=plain)

    def _set_preceding(self, slot: int, ids: np.ndarray) -> None:
        self.preceding[slot, :ids.size] = ids
        self.preceding_len[slot] = ids.size

    def _empty_trees(self, n: int) -> dict[str, np.ndarray]:
        """The trees of free slots, `n` node slots: the root alone (no search, nothing to accept but the bonus)."""
        b, depth = self.slots, self.depth
        return {"tokens": np.zeros((b, n), np.int32), "positions": np.zeros((b, n), np.int32),
                "parents": np.full((b, n), -1, np.int32), "mask": np.broadcast_to(np.eye(n, dtype=bool), (b, n, n)).copy(),
                "retrieve": np.full((b, n - 1, depth + 1), -1, np.int32)}


class PlainBatcher(SlotPool):
    """Plain autoregressive decoding of the target in the same kind of pool, over `decoder` (an
    `AutoregressiveDecoder`: an `Engine`'s `baseline`, or one over a target alone): each step
    decodes a chunk of up to `AutoregressiveDecoder.chunk` tokens for every busy slot in one jitted
    device loop. The one plain-decoding loop: `generate_ar`, the server's method "ar", the
    benchmarks' baselines and training's answers all run it."""

    def __init__(self, decoder, slots: int, max_length: int = 2048):
        super().__init__(decoder, slots, max_length)
        # the tree size its tokens are recorded with: None (plain decoding, method "ar"), or 0 where
        # keep="auto" decodes a pool plainly because no tree size can pay (`driver.pool_for`)
        self.tree_size: int | None = None
        self.decoder = decoder
        self.token = jnp.zeros((self.slots,), jnp.int32)  # each slot's last token, not yet in the cache

    def _cache_length(self) -> int:
        return self.engine.shapes.cache_length(self.max_length + 1)

    def _admit(self, free: list[int]) -> list[StepEvent]:
        d = self.decoder
        start_time = time.perf_counter()
        joining, ids, prompt_len, start = self._joining(free)
        for part, rows_start, offset in self._chunks(ids, prompt_len, start):
            self.token, self.state = d.prefill(d.state, to_device(part), to_device(prompt_len),
                                               to_device(rows_start), self.token, self.state,
                                               window=attention_window(offset + self.engine.shapes.chunk, self.length))
        self._joined(joining, prompt_len)
        first = to_host(self.token)  # a joining row's pending token is its first
        elapsed = time.perf_counter() - start_time
        events = []
        for slot, request in joining:
            self.committed[slot] = request.prompt_ids.size
            request.stats.prefill_s = elapsed
            events.append(self._take(request, [int(first[slot])], 0))
        return events

    def _advance(self) -> list[StepEvent]:
        d = self.decoder
        if self._stale_params:
            self.state, self._stale_params = self.state.replace(params=self._params()), False
        rows = [i for i, r in enumerate(self.busy) if r is not None]
        m, chunk = self._live(), d.chunk
        remaining = np.zeros(m, np.int32)  # free slots among the first m rows: 0, they do not move
        for slot in rows:
            budget = self.busy[slot].budget
            remaining[slot] = budget.limit - len(budget.out)
        t0 = time.perf_counter()
        window = attention_window(int(self.committed[rows].max()) + chunk, self.length)
        # the EOS ids end a row on the device, unless no busy request stops at them (a warm-up)
        eos = self.engine.eos_row
        if not any(self.busy[slot].budget.eos_ids for slot in rows):
            eos = jnp.full_like(eos, -1)
        out, self.token, _, self.state = d.decode_chunk(d.state, self.token, self.state, to_device(remaining), eos,
                                                        window=window, chunk=chunk, live=m)
        host = to_host(out)
        elapsed = time.perf_counter() - t0
        events = []
        for slot in rows:
            fed = host[slot][host[slot] >= 0]
            events += self._record(slot, [(fed, fed.size)], size=self.tree_size, device_s=elapsed, plain=True)
        return events
