"""The engine's drafter interface, and the DART head as its first drafter.

A drafter proposes, each step, what the host turns into a draft tree. The engine splits the
drafter's module together with the target (so that a shared embedding is one array), calls its
device methods inside the jitted prefill and step, moves its proposal to the host through the
step's `Layout`, and asks it for the tree. Everything the jitted functions need of a drafter is
its class (static) and its module (traced), so engines over equal modules share executables.
"""
from __future__ import annotations

import abc

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.models.head import DartHead, HeadCache, init_head_cache, write_rows
from dart_jax.ngram import DraftTree, TreeSettings

from .autoregressive import put_window
from .layout import Field


class Drafter(abc.ABC):
    """What the engine needs of a drafter. Device methods are static: they get the drafter's
    module merged from the traced state."""

    module: nnx.Module
    adaptive_tree = True  # whether `keep="auto"` may vary its tree size per step

    @property
    @abc.abstractmethod
    def max_depth(self) -> int:
        """Draft rows per call: the deepest tree it can propose has `max_depth` levels below the root
        (a tree's `depth`, `Engine.depth`, is at most this)."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Ids a row chooses from (the bound of the tree search's top-k)."""

    @abc.abstractmethod
    def reach(self, real_rows: int) -> int:
        """Cache slots past the committed length that a call over `real_rows` rows writes."""

    def check_tree(self, tree: TreeSettings) -> TreeSettings:
        """`tree` checked against this drafter (a ValueError naming what does not fit)."""
        return tree.check_fits(self.max_depth, self.vocab_size)

    @abc.abstractmethod
    def init_cache(self, batch: int, length: int, dtype):
        """A zero cache of `length` slots per sequence."""

    @staticmethod
    @abc.abstractmethod
    def cache_window(cache, window: int | None, rows: int | None = None):
        """A view of the first `window` slots (all: None) of the first `rows` sequences (all: None)
        of the cache (what a step attends over and writes)."""

    @staticmethod
    @abc.abstractmethod
    def cache_put(cache, part):
        """`cache` with its first slots of its first sequences replaced by the view `part`."""

    @staticmethod
    def cache_rows(cache, window: int, start, rows: int):
        """Like `cache_window`, for the `rows` sequences from `start` (traced) instead of the first
        ones (a pool stepping a block of its rows, `Engine.step_rows`). This default takes every
        leaf as [B, S, ...] (the layout of both drafters' caches); a drafter with another overrides
        it and `cache_put_rows`."""
        def take(a):
            a = a[:, :window]
            return jax.lax.dynamic_slice_in_dim(a, start, rows, 0)

        return jax.tree.map(take, cache)

    @staticmethod
    def cache_put_rows(cache, part, start):
        """`cache` with its first slots of the sequences from `start` replaced by the view `part`
        (`cache_rows`'s counterpart)."""
        return jax.tree.map(lambda a, p: jax.lax.dynamic_update_slice(a, p, (start,) + (0,) * (a.ndim - 1)),
                            cache, part)

    @staticmethod
    @abc.abstractmethod
    def proposal_fields(rows: int, k: int, nodes: int = 0) -> tuple[Field, ...]:
        """The per-sequence arrays a draft sends to the host (`nodes`: the tree's node slots, root
        included, for a drafter whose proposal is the tree)."""

    @staticmethod
    @abc.abstractmethod
    def prefill(module, taps, next_ids, cache, start, n_real, *, rows: int, k: int, nodes: int = 0):
        """First draft after the prompt: taps [B,T,3H] of the (padded) prompt, next_ids [B,T]
        (the token that follows each position), n_real [B] real positions, written from `start`
        [B] (0, or the cache length for a row that is not being prefilled: such writes must be
        dropped) → (proposal, cache)."""

    @staticmethod
    def fill(module, taps, next_ids, cache, start):
        """A prefill chunk that no prompt ends in: the keys and values of its rows (taps [B,T,3H],
        next_ids [B,T]) into the cache from `start` [B] (writes past it dropped), for the later
        chunks to attend to, and nothing drafted → cache. This default asks the module for
        `key_values(taps, ids, positions)` and takes the cache as a `HeadCache` (both heads'); a
        drafter with another overrides it."""
        slots = start[:, None] + jnp.arange(next_ids.shape[1], dtype=jnp.int32)[None, :]
        return write_rows(cache, slots, *module.key_values(taps, next_ids, slots))

    @staticmethod
    @abc.abstractmethod
    def extend(module, taps, next_ids, cache, cache_len, n_real, *, rows: int, k: int, nodes: int = 0):
        """Draft after a step: taps and next ids of the accepted nodes [B,D+1,·], of which
        n_real [B] are real, appended after `cache_len` [B] committed tokens → (proposal, cache)."""

    @abc.abstractmethod
    def tree(self, proposal: dict[str, np.ndarray], preceding: np.ndarray, preceding_len: np.ndarray, trie,
             settings: TreeSettings, eos_id: int | None) -> DraftTree:
        """Host side: the draft trees [B] of a proposal; `preceding` [B,P] holds the ids fed to
        the drafter this step (the first `preceding_len[b]`; the last is the root)."""


class DartDrafter(Drafter):
    """The DART head (docs/spec.md §3): one call drafts d rows; the n-gram tree search builds the tree."""

    def __init__(self, head: DartHead):
        self.module = head

    @property
    def max_depth(self) -> int:
        return self.module.num_rows

    @property
    def vocab_size(self) -> int:
        return self.module.config.draft_vocab_size

    def reach(self, real_rows: int) -> int:
        return real_rows + self.module.config.draft_length  # the m mask slots follow the real rows

    def init_cache(self, batch: int, length: int, dtype) -> HeadCache:
        return init_head_cache(self.module.config, batch, length, dtype)

    @staticmethod
    def cache_window(cache: HeadCache, window: int | None, rows: int | None = None) -> HeadCache:
        return HeadCache(k=cache.k[:rows, :window], v=cache.v[:rows, :window])

    @staticmethod
    def cache_put(cache: HeadCache, part: HeadCache) -> HeadCache:
        return HeadCache(k=put_window(cache.k, part.k), v=put_window(cache.v, part.v))

    @staticmethod
    def proposal_fields(rows: int, k: int, nodes: int = 0) -> tuple[Field, ...]:
        return (Field("cand_ids", (rows, k)), Field("cand_probs", (rows, k), "float32"))

    @staticmethod
    def prefill(module, taps, next_ids, cache, start, n_real, *, rows: int, k: int, nodes: int = 0):
        return DartDrafter.extend(module, taps, next_ids, cache, start, n_real, rows=rows, k=k)

    @staticmethod
    def extend(module, taps, next_ids, cache, cache_len, n_real, *, rows: int, k: int, nodes: int = 0):
        logits, cache = module.extend(taps, next_ids, cache, cache_len, n_real)
        # the tree search scores each row's top-k by the softmax over those k logits only
        values, idx = jax.lax.top_k(logits[:, :rows].astype(jnp.float32), k)  # [B,rows,k]
        proposal = {"cand_ids": module.to_target(idx).astype(jnp.int32), "cand_probs": jax.nn.softmax(values, axis=-1)}
        return proposal, cache

    def tree(self, proposal, preceding, preceding_len, trie, settings: TreeSettings, eos_id) -> DraftTree:
        return settings.search(proposal["cand_ids"], proposal["cand_probs"], preceding, preceding_len, trie,
                               eos_id=eos_id)
