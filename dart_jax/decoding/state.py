"""A pool's device state: what every jitted program of the engine, and of the plain decoder
(`autoregressive.AutoregressiveDecoder`), takes and gives back.

A pool of B sequences (`batcher.SlotPool`) owns one `PoolState`: the target's KV cache and the
drafter's cache (donated to each call, so they are updated in place), the committed length of
each row (one length serves both caches), each row's PRNG key and its sampling parameters. Every
device call — prefill, a speculative step, a chunk of plain decoding, the device loop — takes the
state and returns its next one with its answer: `packed, state = engine.step(tree, state, ...)`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from dart_jax.models.qwen3 import KVCache

from .sampling import SamplingParams


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PoolState:
    """`cache` the target's KVCache [L,B,S,KVH,D], `draft_cache` the drafter's own (None in a plain
    pool over a target alone), `cache_len` int32[B] the tokens committed per row, `keys` [B] PRNG
    keys, `params` SamplingParams [B]."""

    cache: KVCache
    draft_cache: Any
    cache_len: jax.Array
    keys: jax.Array
    params: SamplingParams

    def replace(self, **changes) -> "PoolState":
        return dataclasses.replace(self, **changes)

    def caches(self) -> tuple:
        return self.cache, self.draft_cache
