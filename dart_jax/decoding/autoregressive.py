"""Plain autoregressive decoding of a Qwen3 target: the baseline of the speculative engine, the
regeneration of training data, and the decode step the benchmarks time.

Jitted pure functions over the target's state (`split_flat`: the arrays as one tuple) and a
pool's `PoolState` (the state every program of the engine takes too: its caches, lengths, keys
and sampling parameters; donated, and returned next beside the answer): a prefill of one
fixed-size chunk of prompts (called once per chunk: one program for every prompt length), a
one-token step and a chunk of one-token steps in one device loop (`decode_tokens`). They attend
over a power-of-two window of the cache that follows the sequence (`attention_window`), so their
cost follows the sequence length, not the cache size. The engine's prefill and plain chunk run
their target's part (`prefill_target`, `decode_pool`). `AutoregressiveDecoder` holds them; the
loop over them is a pool's (`batcher.PlainBatcher`, stepped by `driver.Driver`), as for
speculative decoding.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from dart_jax.errors import ResourceError
from dart_jax.models.backend import program_compiler_options
from dart_jax.models.qwen3 import KVCache, Qwen3, init_cache, verify_compiler_options
from dart_jax.models.sharding import constrain_cache, constrain_replicated, inputs_on_mesh

from . import exported
from .sampling import SamplingParams, host_branch, sample_tokens, split_rows
from .requests import check_request
from .settings import GenerationSettings, ShapeSettings
from .state import PoolState

_MIN_WINDOW = 256  # smallest attention window: few compiled variants, little waste
_JITTED: dict = {}


@dataclasses.dataclass(frozen=True)
class ModelDef:
    """What rebuilds a module from its arrays besides the arrays: the `nnx.split` GraphDef and the
    tree structure of its state. The jitted functions take a module's state as the flat tuple of
    its arrays (`split_flat`) and rebuild it with `merge`: JAX flattens a tuple of arrays in C++,
    where an `nnx.State` goes through Python on every call, on the host's critical path between two
    device calls (benchmarks/RESULTS.md)."""

    graph: nnx.GraphDef
    tree: jax.tree_util.PyTreeDef

    def merge(self, leaves) -> nnx.Module:
        return nnx.merge(self.graph, jax.tree.unflatten(self.tree, leaves))


def split_flat(module: nnx.Module) -> tuple[ModelDef, tuple]:
    """(ModelDef, the state's arrays as a tuple) of `module`."""
    graphdef, state = nnx.split(module)
    leaves, tree = jax.tree.flatten(state)
    return ModelDef(graphdef, tree), tuple(leaves)


def jitted(fn, model: ModelDef, *static, **jit_kwargs):
    """`fn` jitted with its ModelDef (and further static arguments) bound. Binding them here keeps
    the GraphDef out of the per-call arguments: as a static argument it would be hashed on every
    step, which costs milliseconds of host time. Callers over equal ModelDefs (and equal XLA
    `compiler_options`, if any) share the jitted function, hence its compiled executables. A new
    process reads its traces from the store of exported programs (`exported.jit`)."""
    options = jit_kwargs.get("compiler_options")
    key = (fn, model, static, tuple(sorted(options.items())) if options else None)
    if key not in _JITTED:
        _JITTED[key] = exported.jit(fn, model, static, **jit_kwargs)
    return _JITTED[key]


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    """One jitted program of a decoder, as a row of its table (`Engine.PROGRAMS`,
    `AutoregressiveDecoder.PROGRAMS`): the decoder's attribute `name` is `fn` (a pure function of
    (ModelDef, *bound, state, ..., pool, ...)) jitted by `build`, with the keyword arguments `static`
    as Python values (one compiled variant each) and the pool's state donated. `verify`: the function
    verifies trees, and gets the XLA options of its verification's size (`verify_compiler_options`,
    rows = `verify(first argument after the state)` × its `n` nodes), one compiled variant per size.
    `on_mesh`: over a Mesh, its inputs are placed there and its outputs pinned (`inputs_on_mesh`,
    `pinned`); a program that runs on one device only leaves them as they are."""

    name: str
    fn: Callable
    static: tuple[str, ...]
    verify: Callable | None = None
    on_mesh: bool = True

    def build(self, model: ModelDef, *bound, mesh=None, gemms: str = "auto"):
        """The callable for a decoder over `model` (with `bound`, e.g. the drafter's class, after it)
        on `mesh` (None: one device): jitted functions from the one factory (`jitted`), compiled
        with the backend's options (`backend.program_compiler_options`); with `verify` one per
        size, picked at each call, with their `lower` on one device."""
        mesh = mesh if self.on_mesh else None
        common = program_compiler_options()

        def make(options=None):
            options = {**(common or {}), **(options or {})}
            fn = jitted(pinned(self.fn, mesh), model, *bound, static_argnames=self.static, donate_argnames="pool",
                        **({"compiler_options": options} if options else {}))
            return inputs_on_mesh(fn, mesh)

        if self.verify is None:
            return make()
        return _by_verify_rows(make, gemms, mesh is None, self.verify)


def _by_verify_rows(make, gemms: str, lowerable: bool, sequences: Callable):
    """A program (state, tree, ..., n=...) that runs `make(compiler_options)`'s function for the XLA
    options of its verification, rows = sequences(tree) × `n` nodes (`verify_compiler_options` under
    `gemms`). With `lowerable` (no mesh: `make` returns jitted functions) it has their `lower` too."""
    by_rows: dict[int, object] = {}

    def pick(tree, n: int):
        rows = sequences(tree) * n
        if rows not in by_rows:  # `jitted` hands out one function per set of options
            by_rows[rows] = make(verify_compiler_options(rows, choice=gemms))
        return by_rows[rows]

    def run(state, tree, *args, n: int, **kwargs):
        return pick(tree, n)(state, tree, *args, n=n, **kwargs)

    def lower(state, tree, *args, n: int, **kwargs):
        return pick(tree, n).lower(state, tree, *args, n=n, **kwargs)

    if lowerable:
        run.lower = lower
    return run


def attention_window(needed: int, length: int) -> int:
    """Cache slots a step attends over: the power of two >= `needed` (at least 256), capped at the
    cache length. Every slot past the committed ones is masked out anyway, so attending over a
    prefix gives the same result while the cost of a step follows the sequence, not the cache size.
    Each window is one compiled variant of a step (at most log2(length/256) + 2 of them)."""
    return min(length, max(_MIN_WINDOW, 1 << max(needed - 1, 0).bit_length()))


def device_memory_bytes() -> int | None:
    """What the default device can hold: its allocator's limit, or the host's memory on a CPU.
    (This process's first device: another process's devices cannot be asked, multi-host.)"""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu" and hasattr(os, "sysconf"):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def check_memory(make: Callable[[], object], what: str, fix: str) -> None:
    """A ResourceError, before anything is allocated, when the arrays `make()` would build (sized
    with `jax.eval_shape`) need more than 80% of what the device holds; arrays sharded over a mesh
    count with the shard each device holds."""

    def per_device(leaf) -> int:
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        return math.prod(shape) * leaf.dtype.itemsize

    need = sum(per_device(leaf) for leaf in jax.tree.leaves(jax.eval_shape(make)))
    have = device_memory_bytes()
    if have and need > 0.8 * have:
        raise ResourceError(f"{what} needs {need / 2**30:.2f} GiB of caches but the device has "
                            f"{have / 2**30:.2f} GiB; {fix}")


def window_view(cache: KVCache, window: int | None, rows: int | None = None) -> KVCache:
    """The first `window` slots (all: None) of the first `rows` sequences (all: None) of a target cache."""
    return KVCache(k=cache.k[:, :rows, :window], v=cache.v[:, :rows, :window])


def param_rows(params: SamplingParams, m: int) -> SamplingParams:
    """The sampling params of the first m sequences (scalar params are shared by all)."""
    return jax.tree.map(lambda x: x[:m] if x.ndim else x, params)


def live_rows(busy_max: int, slots: int) -> int:
    """Rows a pool step computes: the power of two covering the busy slot of highest index
    (`busy_max`), at most the pool. Requests take the lowest free slots, so a lightly loaded pool
    computes few rows; each value is one compiled variant (at most log2(slots) + 1)."""
    return min(slots, 1 << max(busy_max, 0).bit_length())


def put_window(full: jax.Array, part: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(full, part, (0,) * full.ndim)


def last_logits(target: Qwen3, hidden: jax.Array, length: jax.Array) -> jax.Array:
    """Target logits [B,V] at position length[b]-1."""
    last = jnp.take_along_axis(hidden, (length - 1)[:, None, None], axis=1)[:, 0]  # [B,H]
    return target.lm_logits(last)


def chunk_rows(prompt_len, start, chunk: int, length: int) -> tuple[jax.Array, jax.Array]:
    """(n_real [m]: each row's prompt tokens in a prefill chunk of `chunk` tokens from slot `start`
    [m], at least 1; last [m]: whether the row's prompt ends in it) for prompts of `prompt_len` [m]
    tokens in a cache of `length` slots (a row whose `start` is past the cache is not prefilled)."""
    rest = prompt_len - start
    return jnp.clip(rest, 1, chunk), (start < length) & (rest <= chunk)


def when_final(last: jax.Array, final, other):
    """`final()` in a prefill chunk where a row's prompt ends (`last` [m], `chunk_rows`), else
    `other()`, which returns the same structure: what only a prompt's last chunk needs (the LM head,
    sampling, the drafter's proposal) is skipped in the chunks before it. Decided on the device by
    `lax.cond` where that is free (a CPU: `host_branch()` is False); on an accelerator, where a
    conditional costs a host round trip in the middle of the call, `final()` always, so that one
    program serves every chunk either way."""
    if host_branch():
        return final()
    return jax.lax.cond(jnp.any(last), final, other)


def prefill_target(target: Qwen3, ids, prompt_len, start, pool: PoolState, *, window: int, taps: bool = False):
    """The target's part of a prefill: a chunk of C = ids.shape[1] prompt tokens into the first m =
    ids.shape[0] rows of the pool, at slots `start` [m] …, attending over the first `window` cache
    slots (which hold them); a prompt of prompt_len [m] tokens is prefilled by one call per chunk,
    so that every prompt length runs one program. → (first tokens [m], sampled (and their keys
    split) for the rows whose prompt ends in this chunk, junk the host ignores for the others (0s
    where no row's ends: no LM head runs, `when_final`);
    n_real [m] and last [m] (`chunk_rows`); with `taps` the chunk's taps [m,C,3H], else None; the
    pool's state with the chunk in its cache). A row whose `start` is the cache length is left
    alone: its writes fall past the cache and are dropped, its key is kept (a pool admitting
    requests beside running ones, or a prompt that ended in an earlier chunk)."""
    cache, keys = pool.cache, pool.keys
    m, c = ids.shape
    n_real, last = chunk_rows(prompt_len, start, c, cache.k.shape[2])
    view = window_view(cache, window, m)
    hidden, chunk_taps, view = target.extend(ids, view, start, return_taps=taps)
    cache = KVCache(k=put_window(cache.k, view.k), v=put_window(cache.v, view.v))
    after, now = split_rows(keys[:m])
    keys = keys.at[:m].set(jnp.where(last, after, keys[:m]))
    params = param_rows(pool.params, m)
    first = when_final(last, lambda: sample_tokens(now, last_logits(target, hidden, n_real), params),
                       lambda: jnp.zeros((m,), jnp.int32))
    return first, n_real, last, chunk_taps, pool.replace(cache=cache, keys=keys)


def _prefill_rows(model: ModelDef, state, ids, prompt_len, start, token, pool: PoolState, *, window: int):
    """A chunk of prompts into the first m = ids.shape[0] rows of the pool (`prefill_target`) →
    (each row's pending token [B]: the first token where the row's prompt ends in this chunk, else
    the one it had; the pool's next state)."""
    m = ids.shape[0]
    first, _, last, _, pool = prefill_target(model.merge(state), ids, prompt_len, start, pool, window=window)
    return token.at[:m].set(jnp.where(last, first, token[:m])), pool


def _decode(model: ModelDef, state, token, pool: PoolState, *, window: int, live: int | None = None):
    """One token for each of the first `live` sequences (all: None); attention reads (and the new
    key/value goes to) the first `window` slots. → (the full-size token, the pool's next state)."""
    target = model.merge(state)
    cache, cache_len, keys = pool.cache, pool.cache_len, pool.keys
    m = token.shape[0] if live is None else live
    hidden, _, cache_w = target.extend(token[:m, None], window_view(cache, window, m), cache_len[:m])
    cache = KVCache(k=put_window(cache.k, cache_w.k), v=put_window(cache.v, cache_w.v))
    after, now = split_rows(keys[:m])
    new = sample_tokens(now, target.lm_logits(hidden[:, 0]), param_rows(pool.params, m))
    return token.at[:m].set(new), pool.replace(cache=cache, cache_len=cache_len.at[:m].add(1),
                                               keys=keys.at[:m].set(after))


_DECODE_CARRY = ("i", "token", "view", "keys", "remaining", "count", "out", "taps")


def decode_tokens(target, token, view: KVCache, length, keys, params: SamplingParams, remaining, eos, *, chunk: int,
                  taps: bool = False):
    """The one plain-decoding loop on the device: up to `chunk` one-token steps of B sequences over
    the cache window `view`, each sampled with the row's key split per step (so the same samples as
    step by step). `token` [B] is each row's pending token (not yet in the cache), written at slot
    `length` [B] + the tokens it decoded so far. A row stops on an id of `eos` [E] or after
    `remaining` [B] more tokens (0: done already, or a free slot); its later entries are -1. The
    loop ends as soon as every row is done. → (last token [B], view, keys [B], remaining [B],
    tokens decoded per row [B], tokens int32[B,chunk], and with `taps` each step's taps
    [B,chunk,3H], else None)."""
    b = token.shape[0]
    width = 3 * target.config.hidden_size

    def body(c: dict) -> dict:
        i, token, view, keys, remaining, count, out, tap_rows = (c[name] for name in _DECODE_CARRY)
        active = remaining > 0
        hidden, tap, view = target.extend(token[:, None], view, length + count, return_taps=taps)
        after, now = split_rows(keys)
        new = sample_tokens(now, target.lm_logits(hidden[:, 0]), params)
        out = out.at[:, i].set(jnp.where(active, new, -1))
        if taps:
            tap_rows = tap_rows.at[:, i].set(tap[:, 0])
        stop = jnp.any(new[:, None] == eos[None, :], axis=1)
        remaining = jnp.where(active, jnp.where(stop, 0, remaining - 1), 0)
        return dict(zip(_DECODE_CARRY, (i + 1, jnp.where(active, new, token), view, after, remaining,
                                        count + active.astype(jnp.int32), out, tap_rows)))

    start = dict(zip(_DECODE_CARRY, (jnp.int32(0), token, view, keys, remaining, jnp.zeros((b,), jnp.int32),
                                     jnp.full((b, chunk), -1, jnp.int32),
                                     jnp.zeros((b, chunk, width), target.dtype) if taps else None)))
    c = jax.lax.while_loop(lambda c: (c["i"] < chunk) & jnp.any(c["remaining"] > 0), body, start)
    return c["token"], c["view"], c["keys"], c["remaining"], c["count"], c["out"], c["taps"]


def decode_pool(target, token, pool: PoolState, remaining, eos, *, window: int, chunk: int, taps: bool = False):
    """`decode_tokens` over the first m = token.shape[0] rows of the pool, on the attended window
    alone, written back once after the loop (not a copy per token): `token` [m] each row's pending
    token, `remaining` [m] its budget. → (last token [m], remaining [m], tokens decoded per row [m],
    tokens int32[m,chunk], taps or None, the pool's next state: the tokens in its cache, the
    lengths advanced by them, the keys split)."""
    cache, cache_len, keys = pool.cache, pool.cache_len, pool.keys
    m = token.shape[0]
    token, view, row_keys, remaining, count, out, chunk_taps = decode_tokens(
        target, token, window_view(cache, window, m), cache_len[:m], keys[:m], param_rows(pool.params, m), remaining,
        eos, chunk=chunk, taps=taps)
    pool = pool.replace(cache=KVCache(k=put_window(cache.k, view.k), v=put_window(cache.v, view.v)),
                        cache_len=cache_len.at[:m].add(count), keys=keys.at[:m].set(row_keys))
    return token, remaining, count, out, chunk_taps, pool


def _decode_chunk(model: ModelDef, state, token, pool: PoolState, remaining, eos, *, window: int, chunk: int,
                  live: int | None = None):
    """Up to `chunk` tokens for each of the first `live` sequences (all: None) in one call, without
    the host: a device loop of one-token steps (`decode_pool`; the same keys, so the same samples,
    as `_decode` step by step). A sequence stops on an id of `eos` [E] or after `remaining` [B]
    more tokens (0: it is done already, or a free slot of a pool); its later entries are -1 and its
    length stops moving. The loop ends as soon as every sequence is done. → (tokens
    int32[live,chunk], last token [B], remaining [live], the pool's next state); rows past `live`
    are not computed."""
    m = token.shape[0] if live is None else live
    last, remaining, _, out, _, pool = decode_pool(model.merge(state), token[:m], pool, remaining[:m], eos,
                                                   window=window, chunk=chunk)
    return out, token.at[:m].set(last), remaining, pool


class CachePool:
    """Caches reused across generations: the last set is kept when it has the batch size and is
    long enough (a shape already compiled), else it is freed before `make(batch, length)` makes a
    new set (a tuple of cache pytrees)."""

    def __init__(self, make: Callable[[int, int], tuple]):
        self._make, self._held = make, None

    def take(self, length: int, batch: int = 1, *, what: str | None = None,
             fix: str = "use a smaller max_length (or fewer sequences at once).") -> tuple[int, tuple]:
        """(length of the set, the set) with at least `length` slots for `batch` sequences; a set
        that would not fit in the device's memory is a ResourceError (`what` needs …; `fix`),
        before anything is allocated."""
        held, self._held = self._held, None
        if held is not None and held[0] >= length and held[1] == batch:
            return held[0], held[2]
        del held  # free the old buffers before allocating the new ones
        check_memory(lambda: self._make(batch, length), what or f"{batch} sequence(s) of {length} cache positions",
                     fix)
        return length, self._make(batch, length)

    def keep(self, length: int, caches: tuple, batch: int = 1) -> None:
        if not any(leaf.is_deleted() for leaf in jax.tree.leaves(caches)):
            self._held = (length, batch, caches)


@functools.lru_cache(maxsize=None)
def pinned(fn, mesh):
    """`fn` (a program of a pool: → a tuple holding the pool's next `PoolState`) with the state's two
    caches pinned to their shardings on `mesh`, so that a donated cache comes back as it went in (no
    gather, no second compilation), and everything else replicated: the answers, which every host
    of a multi-host mesh reads whole, and the lengths, keys and sampling parameters (as
    `inputs_on_mesh` feeds them back); `fn` itself without a mesh."""
    if mesh is None:
        return fn

    def pin(out):
        if isinstance(out, PoolState):
            return PoolState(constrain_cache(out.cache, mesh), constrain_cache(out.draft_cache, mesh),
                             *constrain_replicated((out.cache_len, out.keys, out.params), mesh))
        return constrain_replicated(out, mesh)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return tuple(pin(out) for out in fn(*args, **kwargs))

    return run


class AutoregressiveDecoder:
    """Plain decoding of `target` with the engine's sampling: its jitted programs (a prefill, a
    one-token step, a chunk of `chunk` tokens in one device loop) and what a `PlainBatcher` asks of
    its engine: caches from a `CachePool` whose sets are (target `KVCache`, drafter cache; None
    without a drafter), `shapes`, the EOS ids and `check_request`. An `Engine` holds one over its
    own cache set (`Engine.baseline`); training decodes with one over a target alone, through a
    `PlainBatcher` stepped by the pool driver (`driver.pool_for` takes either)."""

    # its programs (`ProgramSpec`), each an attribute of the decoder: `decoder.decode_chunk(state, ...)`
    PROGRAMS = (ProgramSpec("prefill", _prefill_rows, ("window",)),
                ProgramSpec("decode", _decode, ("window", "live")),
                ProgramSpec("decode_chunk", _decode_chunk, ("window", "chunk", "live")))

    def __init__(self, target: Qwen3, shapes: ShapeSettings = ShapeSettings(), pool: CachePool | None = None, *,
                 eos_ids: Iterable[int] = ()):
        self.target, self.shapes = target, shapes
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.eos_row = jax.device_put(np.asarray(sorted(self.eos_ids) or [-1], np.int32))  # no program compiled
        model, self.state = split_flat(target)
        self.pool = pool or CachePool(lambda batch, length: (init_cache(target.config, batch, length, target.dtype),
                                                             None))
        # over a mesh (the target's parameters carry it): the caches keep their shardings, the rest
        # comes back whole on every device, so that every host of a multi-host mesh reads it
        mesh = self.mesh = next((leaf.sharding.mesh for leaf in jax.tree.leaves(self.state)
                                 if isinstance(getattr(leaf, "sharding", None), NamedSharding)), None)
        # the pool's state is donated, as to the engine's programs: the caches are updated in place
        for program in self.PROGRAMS:
            setattr(self, program.name, program.build(model, mesh=mesh))

    chunk = 32  # tokens per device loop: one host round trip per chunk, not per token

    def check_request(self, prompt_ids, settings: GenerationSettings, *, warn: bool = True) -> np.ndarray:
        """The prompt as int32 ids, or an InputError naming what is wrong (`check_request`)."""
        return check_request(self.target.config, prompt_ids, settings, warn=warn)
