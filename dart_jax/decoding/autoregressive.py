"""Plain autoregressive decoding of a Qwen3 target: the baseline of the speculative engine, the
regeneration of training data, and the decode step the benchmarks time.

Two jitted pure functions over the target's `nnx.split` state: a prefill of the padded prompt
and a one-token step. The step attends over a power-of-two window of the cache that follows the
sequence (`attention_window`), so its cost follows the sequence length, not the cache size.
"""
from __future__ import annotations

import functools
import time
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.models.qwen3 import KVCache, Qwen3, init_cache

from .sampling import SamplingParams, sample_tokens, split_rows
from .requests import Budget, Stats
from .settings import GenerationSettings, ShapeSettings

_MIN_WINDOW = 256  # smallest attention window: few compiled variants, little waste
_JITTED: dict = {}


def jitted(fn, graphdef, *static, **jit_kwargs):
    """`fn` jitted with its GraphDef (and further static arguments) bound. Binding them here keeps
    the GraphDef out of the per-call arguments: as a static argument it would be hashed on every
    step, which costs milliseconds of host time. Callers over equal GraphDefs share the jitted
    function, hence its compiled executables."""
    key = (fn, graphdef, static)
    if key not in _JITTED:
        _JITTED[key] = jax.jit(functools.partial(fn, graphdef, *static), **jit_kwargs)
    return _JITTED[key]


def attention_window(needed: int, length: int) -> int:
    """Cache slots a step attends over: the power of two >= `needed` (at least 256), capped at the
    cache length. Every slot past the committed ones is masked out anyway, so attending over a
    prefix gives the same result while the cost of a step follows the sequence, not the cache size.
    Each window is one compiled variant of a step (at most log2(length/256) + 2 of them)."""
    return min(length, max(_MIN_WINDOW, 1 << max(needed - 1, 0).bit_length()))


def window_view(cache: KVCache, window: int) -> KVCache:
    """The first `window` slots of a target cache."""
    return KVCache(k=cache.k[:, :, :window], v=cache.v[:, :, :window])


def put_window(full: jax.Array, part: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(full, part, (0,) * full.ndim)


def last_logits(target: Qwen3, hidden: jax.Array, length: jax.Array) -> jax.Array:
    """Target logits [B,V] at position length[b]-1."""
    last = jnp.take_along_axis(hidden, (length - 1)[:, None, None], axis=1)[:, 0]  # [B,H]
    return target.lm_logits(last)


def _prefill(graphdef, state, ids, prompt_len, cache: KVCache, keys, params: SamplingParams):
    """ids [B,T] (padded prompts), per-sequence keys [B] and params [B] → first tokens [B]."""
    target = nnx.merge(graphdef, state)
    hidden, _, cache = target.extend(ids, cache, jnp.zeros((ids.shape[0],), jnp.int32))
    keys, now = split_rows(keys)
    return sample_tokens(now, last_logits(target, hidden, prompt_len), params), cache, keys


def _decode(graphdef, state, token, cache: KVCache, cache_len, keys, params: SamplingParams, *, window: int):
    """One token per sequence; attention reads (and the new key/value goes to) the first `window` slots."""
    target = nnx.merge(graphdef, state)
    hidden, _, cache_w = target.extend(token[:, None], window_view(cache, window), cache_len)
    cache = KVCache(k=put_window(cache.k, cache_w.k), v=put_window(cache.v, cache_w.v))
    keys, now = split_rows(keys)
    return sample_tokens(now, target.lm_logits(hidden[:, 0]), params), cache, cache_len + 1, keys


class CachePool:
    """Caches reused across generations: the last set is kept when it has the batch size and is
    long enough (a shape already compiled), else it is freed before `make(batch, length)` makes a
    new set (a tuple of cache pytrees)."""

    def __init__(self, make: Callable[[int, int], tuple]):
        self._make, self._held = make, None

    def take(self, length: int, batch: int = 1) -> tuple[int, tuple]:
        """(length of the set, the set) with at least `length` slots for `batch` sequences."""
        held, self._held = self._held, None
        if held is not None and held[0] >= length and held[1] == batch:
            return held[0], held[2]
        del held  # free the old buffers before allocating the new ones
        return length, self._make(batch, length)

    def keep(self, length: int, caches: tuple, batch: int = 1) -> None:
        if not any(leaf.is_deleted() for leaf in jax.tree.leaves(caches)):
            self._held = (length, batch, caches)


class AutoregressiveDecoder:
    """Plain decoding of `target` with the engine's sampling; caches come from a `CachePool`
    whose sets start with a target `KVCache` (other caches in the set are kept untouched)."""

    def __init__(self, target: Qwen3, shapes: ShapeSettings = ShapeSettings(), pool: CachePool | None = None):
        self.target, self.shapes = target, shapes
        graphdef, self.state = nnx.split(target)
        self.pool = pool or CachePool(lambda batch, length: (init_cache(target.config, batch, length, target.dtype),))
        self.prefill = jitted(_prefill, graphdef, donate_argnames="cache")
        self.decode = jitted(_decode, graphdef, static_argnames="window", donate_argnames="cache")

    def decode_batch(self, prompts: list, settings: list[GenerationSettings], eos_ids, *,
                     cache_length: int | None = None, stats: list | None = None) -> Iterator[list[list[int]]]:
        """B prompts together, one jitted token step for all of them, each within its own budget (a
        finished sequence idles): yields the new ids of every sequence at each step ([first] from the
        prefill, then one token; [] once done) until all are done. `cache_length` defaults to what
        the longest request needs; `stats` (one `Stats` per sequence) get prefill_s, device_s,
        steps, accept_lengths and total_s."""
        prompts = [np.asarray(p, np.int32) for p in prompts]
        b, lens = len(prompts), np.array([p.size for p in prompts], np.int32)
        padded = np.zeros((b, self.shapes.bucket(int(lens.max()))), np.int32)
        for i, p in enumerate(prompts):
            padded[i, :p.size] = p
        eos = frozenset(int(e) for e in eos_ids)
        budgets = [Budget(eos, s.max_new_tokens, s.max_length - p.size) for s, p in zip(settings, prompts)]
        stats = stats if stats is not None else [Stats() for _ in prompts]
        params, keys = GenerationSettings.sampling_rows(settings)
        if cache_length is None:
            cache_length = self.shapes.cache_length(max(padded.shape[1], max(s.max_length for s in settings)) + 1)
        length, caches = self.pool.take(cache_length, b)
        cache, rest = caches[0], caches[1:]
        start = time.perf_counter()
        try:
            token, cache, keys = self.prefill(self.state, jnp.asarray(padded), jnp.asarray(lens), cache, keys, params)
            first = np.asarray(token)
            for s in stats:
                s.prefill_s = time.perf_counter() - start
            yield [budget.take([t]) for budget, t in zip(budgets, first)]
            cache_len, committed = jnp.asarray(lens), int(lens.max())
            while not all(budget.done for budget in budgets):
                t0 = time.perf_counter()
                token, cache, cache_len, keys = self.decode(self.state, token, cache, cache_len, keys, params,
                                                            window=attention_window(committed + 1, length))
                committed += 1
                host = np.asarray(token)
                for s, budget in zip(stats, budgets):
                    if not budget.done:
                        s.device_s += time.perf_counter() - t0
                        s.steps += 1
                        s.accept_lengths.append(1)
                yield [budget.take([t]) for budget, t in zip(budgets, host)]
        finally:
            for s in stats:
                s.total_s = time.perf_counter() - start
            self.pool.keep(length, (cache, *rest), b)

    def generate_batch(self, prompts: list, settings: list[GenerationSettings], eos_ids) -> list[list[int]]:
        """The new ids of each prompt (a final EOS included when generation stopped on it), decoded
        together: the batched baseline."""
        outs: list[list[int]] = [[] for _ in prompts]
        for rows in self.decode_batch(prompts, settings, eos_ids):
            for out, kept in zip(outs, rows):
                out.extend(kept)
        return outs

    def generate(self, prompt_ids, settings: GenerationSettings, eos_ids) -> list[int]:
        """The new ids after `prompt_ids` (a final EOS included when generation stopped on it)."""
        return self.generate_batch([prompt_ids], [settings], eos_ids)[0]
