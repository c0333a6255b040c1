"""The speculative decoding loop (SPEC §4) and the autoregressive baseline.

Device work is two jitted pure functions over the `nnx.split` state of (target, head):
- `prefill`: the prompt (padded to a power-of-two bucket) through the target, the first token,
  the head's first draft and its per-row top-k;
- `step`: tree verification → acceptance → KV commit → head call → top-k, in one call.
Both return everything the host needs as ONE packed int32 array (float probabilities are
bit-cast), so a step costs one device→host copy; the host answers with one packed int32 array
that holds the next tree (one host→device copy). The tree search (`ngram.build_tree`) runs on the
CPU in between. Caches are donated and reused across generations; every shape is static for a
given (prompt bucket, cache size, attention window), so after warm-up no generation of the same
lengths compiles anything.

Attention window: a decode step attends over the first `window` cache slots only, a power of two
(>= 256) that covers the committed length plus what the step writes, chosen on the host per step
(`attention_window`). Slots past the committed ones are masked out anyway, so the result is the
same (up to float summation order; greedy outputs checked identical), but a step's cost follows the sequence length instead of max_length (on CPU, attending over
a 2304-slot cache made a demo step ~2.5x slower). A generation that grows past the windows seen so
far compiles the step once for each new window (at most log2(cache/256) + 2 variants in all).

Cache discipline: `cache_len` (int32[B]) counts the committed tokens in the target cache; the
head's cache always holds the same number of rows (one per committed token), so one length
serves both. The step verifies the tree against the cache without writing it there, then writes
only the accepted nodes' keys/values to slots `cache_len … cache_len+k` (one in-place scatter of
d+1 slots per step, whatever the tree size), and the head writes its k+1 real rows plus m mask
slots from `cache_len`; the mask slots are dropped by advancing only by k+1.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .head import DartHead, HeadCache, init_head_cache
from .qwen3 import KVCache, Qwen3, init_cache, write_cache
from .sampling import SamplingParams, greedy_accept, process_logits, sample_accept, sample_tokens


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Tree and shape settings (defaults are the reference's)."""

    keep: int = 60  # draft nodes kept per tree (the root is extra)
    beam_width: int = 20
    topk: int = 25  # candidates per draft row given to the tree search
    draft_rows: int | None = None  # head rows used by the search; None = all of them (d)
    ngram_weight: float = 0.5
    min_bucket: int = 32  # prompts are padded to max(min_bucket, next power of two)
    cache_multiple: int = 256  # cache lengths are rounded up to this, so max_length rarely recompiles

    def validate(self, head_rows: int, draft_vocab: int) -> "EngineOptions":
        checks = [
            (self.keep >= 1, f"keep (tree size) must be >= 1, got {self.keep}"),
            (self.beam_width >= 1, f"beam_width must be >= 1, got {self.beam_width}"),
            (1 <= self.topk <= draft_vocab, f"topk must lie in [1, draft vocabulary {draft_vocab}], got {self.topk}"),
            (self.draft_rows is None or 1 <= self.draft_rows <= head_rows,
             f"draft_rows must lie in [1, {head_rows}] (the head drafts {head_rows} rows), got {self.draft_rows}"),
            (self.ngram_weight >= 0, f"ngram_weight must be >= 0, got {self.ngram_weight}"),
            (self.min_bucket >= 1 and self.cache_multiple >= 1, "min_bucket and cache_multiple must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message + ".")
        return self


@dataclasses.dataclass
class Stats:
    """Per-generation figures; times in seconds."""

    new_tokens: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    total_s: float = 0.0
    prefill_s: float = 0.0  # prompt through target (+ head), incl. the first transfer
    device_s: float = 0.0  # per-step verify + draft on the device, incl. both transfers
    tree_s: float = 0.0  # tree search on the CPU
    accept_lengths: list[int] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)  # the generated ids so far

    @property
    def host_s(self) -> float:
        return max(self.total_s - self.prefill_s - self.device_s - self.tree_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        return float(np.mean(self.accept_lengths)) if self.accept_lengths else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"new_tokens": self.new_tokens, "steps": self.steps, "prompt_tokens": self.prompt_tokens,
                "tokens_per_s": self.tokens_per_s, "tau": self.mean_accept_length, "total_s": self.total_s,
                "prefill_s": self.prefill_s, "device_s": self.device_s, "tree_s": self.tree_s, "host_s": self.host_s}


def prompt_bucket(length: int, minimum: int = 32) -> int:
    return max(minimum, 1 << max(length - 1, 0).bit_length())


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _bits(x: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)


class _Pair(nnx.Module):
    """Target and head split together, so that the shared embedding is one array."""

    def __init__(self, target: Qwen3, head: DartHead):
        self.target = target
        self.head = head


def _draft_topk(head: DartHead, logits: jax.Array, rows: int, k: int) -> tuple[jax.Array, jax.Array]:
    """Top-k draft candidates of the first `rows` rows as target ids [B,rows,k] and the softmax over
    those k logits (what the tree search scores)."""
    values, idx = jax.lax.top_k(logits[:, :rows].astype(jnp.float32), k)  # [B,rows,k]
    return head.to_target(idx).astype(jnp.int32), jax.nn.softmax(values, axis=-1)


def _last_logits(target: Qwen3, hidden: jax.Array, length: jax.Array) -> jax.Array:
    """Target logits [B,V] at position length[b]-1."""
    last = jnp.take_along_axis(hidden, (length - 1)[:, None, None], axis=1)[:, 0]  # [B,H]
    return target.lm_logits(last)


def _prefill_dart(graphdef, state, ids, prompt_len, cache: KVCache, head_cache: HeadCache, key, params, *,
                  rows: int, k: int):
    """ids int32[B,T] (prompt padded to the bucket), prompt_len int32[B] → packed
    [first token, top-k ids (rows·k), top-k probs (rows·k)] int32[B, 1+2·rows·k]."""
    pair = nnx.merge(graphdef, state)
    target, head = pair.target, pair.head
    b, t = ids.shape
    zero = jnp.zeros((b,), jnp.int32)
    with jax.named_scope("prefill_target"):
        hidden, taps, cache = target.forward_hidden(ids, cache=cache, cache_len=zero, return_taps=True)
        key, sub = jax.random.split(key)
        first = sample_tokens(sub, _last_logits(target, hidden, prompt_len), params)  # [B]
    with jax.named_scope("prefill_head"):
        # position i carries the token that follows it: prompt[1:] and then the sampled token
        shifted = jnp.concatenate([ids[:, 1:], jnp.zeros((b, 1), ids.dtype)], axis=1)
        shifted = jnp.where(jnp.arange(t)[None, :] == (prompt_len - 1)[:, None], first[:, None], shifted)
        draft_logits, head_cache = head(taps, shifted, cache=head_cache, cache_len=zero, n_real=prompt_len)
        cand, probs = _draft_topk(head, draft_logits, rows, k)
    packed = jnp.concatenate([first[:, None], cand.reshape(b, -1), _bits(probs).reshape(b, -1)], axis=1)
    return packed, cache, head_cache, key


_MIN_WINDOW = 256  # smallest attention window: few compiled variants, little waste


def attention_window(needed: int, length: int) -> int:
    """Cache slots a step attends over: the power of two >= `needed` (at least _MIN_WINDOW), capped
    at the cache length. Every slot past the committed ones is masked out anyway, so attending over a
    prefix gives the same result while the cost of a step follows the sequence, not the cache size.
    Each window is one compiled variant of the step (at most log2(length/256) + 2 of them)."""
    return min(length, max(_MIN_WINDOW, 1 << max(needed - 1, 0).bit_length()))


def _window_caches(cache: KVCache, head_cache: HeadCache | None, window: int):
    """The first `window` slots of the caches (read-only views for attention)."""
    cache_w = KVCache(k=cache.k[:, :, :window], v=cache.v[:, :, :window])
    if head_cache is None:
        return cache_w, None
    return cache_w, HeadCache(k=head_cache.k[:, :window], v=head_cache.v[:, :window])


def _put_window(full: jax.Array, part: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(full, part, (0,) * full.ndim)


def _unpack_tree(tree: jax.Array, n: int, depth: int):
    b = tree.shape[0]
    sizes = (n, n, n, n * n, (n - 1) * (depth + 1))
    parts = jnp.split(tree, np.cumsum(sizes)[:-1], axis=1)
    tokens, positions, parents, mask, retrieve = parts
    return tokens, positions, parents, mask.reshape(b, n, n) > 0, retrieve.reshape(b, n - 1, depth + 1)


def _step_dart(graphdef, state, tree, cache: KVCache, head_cache: HeadCache, cache_len, key, params, *,
               n: int, depth: int, k: int, window: int):
    """One speculative step. tree int32[B, ·] packed by `Engine._pack_tree`; returns packed
    [count, path tokens (depth+1), bonus, top-k ids (depth·k), top-k probs (depth·k)]. Attention
    reads only the first `window` cache slots, which must hold every slot the head writes
    (cache_len + depth + 1 + m)."""
    pair = nnx.merge(graphdef, state)
    target, head = pair.target, pair.head
    b = tree.shape[0]
    tokens, positions, parents, mask, retrieve = _unpack_tree(tree, n, depth)
    cache_w, head_w = _window_caches(cache, head_cache, window)
    with jax.named_scope("verify"):
        # the tree's keys/values stay out of the cache: only the accepted path is written below
        hidden, taps, tree_kv = target.forward_hidden_kv(tokens, positions=cache_len[:, None] + positions,
                                                         cache=cache_w, cache_len=cache_len, mask=mask, return_taps=True)
        logits = target.lm_logits(hidden)  # [B,N,V]
    with jax.named_scope("accept"):
        key, sub = jax.random.split(key)

        def sampled(logits):
            probs = process_logits(logits, params)
            return jax.vmap(sample_accept)(jax.random.split(sub, b), probs, tokens, parents, retrieve)

        path, count, bonus = jax.lax.cond(params.greedy, lambda x: jax.vmap(greedy_accept)(x, tokens, retrieve),
                                          sampled, logits)
    with jax.named_scope("commit"):
        at = path[None, :, :, None, None]  # [1,B,D+1,1,1] over [L,B,N,KVH,D]
        accepted = KVCache(k=jnp.take_along_axis(tree_kv.k, at, axis=2), v=jnp.take_along_axis(tree_kv.v, at, axis=2))
        cache = write_cache(cache, cache_len, accepted)
    with jax.named_scope("draft"):
        path_tokens = jnp.take_along_axis(tokens, path, axis=1)  # [B,D+1]; entries past count are junk
        accepted_taps = jnp.take_along_axis(taps, path[..., None], axis=1)  # [B,D+1,3H]
        follow = jnp.concatenate([path_tokens[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)
        follow = jnp.where(jnp.arange(depth + 1)[None, :] == (count - 1)[:, None], bonus[:, None], follow)
        draft_logits, head_w = head(accepted_taps, follow, cache=head_w, cache_len=cache_len, n_real=count)
        head_cache = HeadCache(k=_put_window(head_cache.k, head_w.k), v=_put_window(head_cache.v, head_w.v))
        cand, cand_probs = _draft_topk(head, draft_logits, depth, k)
    packed = jnp.concatenate([count[:, None], path_tokens, bonus[:, None], cand.reshape(b, -1),
                              _bits(cand_probs).reshape(b, -1)], axis=1)
    return packed, cache, head_cache, cache_len + count, key


def _prefill_ar(graphdef, state, ids, prompt_len, cache: KVCache, key, params):
    target = nnx.merge(graphdef, state)
    zero = jnp.zeros((ids.shape[0],), jnp.int32)
    hidden, _, cache = target.forward_hidden(ids, cache=cache, cache_len=zero)
    key, sub = jax.random.split(key)
    return sample_tokens(sub, _last_logits(target, hidden, prompt_len), params), cache, key


def _decode_ar(graphdef, state, token, cache: KVCache, cache_len, key, params, *, window: int):
    """One token; attention reads (and the new key/value goes to) the first `window` slots."""
    target = nnx.merge(graphdef, state)
    cache_w, _ = _window_caches(cache, None, window)
    hidden, _, cache_w = target.forward_hidden(token[:, None], cache=cache_w, cache_len=cache_len)
    cache = KVCache(k=_put_window(cache.k, cache_w.k), v=_put_window(cache.v, cache_w.v))
    key, sub = jax.random.split(key)
    nxt = sample_tokens(sub, target.lm_logits(hidden[:, 0]), params)
    return nxt, cache, cache_len + 1, key


_DONATE = ("cache", "head_cache")
_JITTED: dict = {}


def _jitted(fn, graphdef, **jit_kwargs):
    """`fn` jitted with its GraphDef bound. Binding it here, once per Engine, keeps the GraphDef out
    of the per-call arguments: as a static argument it would be hashed on every step, which costs
    milliseconds of host time. Engines over equal GraphDefs share the jitted function, hence its
    compiled executables."""
    key = (fn, graphdef)
    if key not in _JITTED:
        _JITTED[key] = jax.jit(functools.partial(fn, graphdef), **jit_kwargs)
    return _JITTED[key]


def _check_request(prompt_ids: Sequence[int], vocab: int, max_new_tokens: int, max_length: int, temperature: float,
                   top_p: float, top_k: int) -> np.ndarray:
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"the prompt must be a non-empty sequence of token ids, got shape {ids.shape}.")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt token ids must be integers, got dtype {ids.dtype}.")
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab}) (the target's vocabulary); "
                         f"found range [{ids.min()}, {ids.max()}].")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    if ids.size >= int(max_length):
        raise ValueError(f"the prompt has {ids.size} tokens but max_length is {max_length}: max_length counts the "
                         "prompt plus the generated tokens, so raise max_length or shorten the prompt.")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}.")
    if not (0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1] (1 disables it), got {top_p}.")
    if int(top_k) < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}.")
    return ids.astype(np.int32)


class _Budget:
    """Appends tokens until EOS, max_new_tokens or max_length; returns the part that counts."""

    def __init__(self, eos_ids: frozenset[int], max_new_tokens: int, room: int):
        self.eos_ids, self.limit, self.out, self.done = eos_ids, min(max_new_tokens, room), [], False

    def take(self, ids: Sequence[int]) -> list[int]:
        kept = []
        for t in ids:
            if self.done:
                break
            kept.append(int(t))
            self.done = int(t) in self.eos_ids or len(self.out) + len(kept) >= self.limit
        self.out.extend(kept)
        return kept


class Engine:
    """DART decoding for one (target, head, trie) triple. Batch 1 is what the host loop runs;
    every device array keeps its batch dimension."""

    def __init__(self, target: Qwen3, head: DartHead, trie=None, *, eos_ids: Sequence[int], tree_eos_id: int | None,
                 options: EngineOptions = EngineOptions(), mesh=None):
        self.target, self.head, self.trie, self.mesh = target, head, trie, mesh
        self.options = options.validate(head.num_rows, head.config.draft_vocab_size)
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.tree_eos_id = tree_eos_id
        self.rows = options.draft_rows or head.num_rows
        self.n_nodes = options.keep + 1
        self._pair_def, self._pair_state = nnx.split(_Pair(target, head))
        self._target_def, self._target_state = nnx.split(target)
        self._prefill_dart = _jitted(_prefill_dart, self._pair_def, static_argnames=("rows", "k"),
                                     donate_argnames=_DONATE)
        self._step_dart = _jitted(_step_dart, self._pair_def, static_argnames=("n", "depth", "k", "window"),
                                  donate_argnames=_DONATE)
        self._prefill_ar = _jitted(_prefill_ar, self._target_def, donate_argnames="cache")
        self._decode_ar = _jitted(_decode_ar, self._target_def, static_argnames="window", donate_argnames="cache")
        self._held: tuple[int, KVCache, HeadCache] | None = None

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    # ------------------------------------------------------------------ caches and packing
    def cache_length(self, prompt_len: int, max_length: int) -> int:
        """Slots needed: the head's prefill writes bucket + m; a step at committed length
        S <= max_length-2 writes the tree to S+N-1 and the head to S+(d_used+1)+m-1."""
        m = self.head.config.draft_length
        bucket = prompt_bucket(prompt_len, self.options.min_bucket)
        need = max(bucket + m, max_length + max(self.n_nodes, self.rows + 1 + m))
        return _round_up(need, self.options.cache_multiple)

    def _take_caches(self, length: int) -> tuple[int, KVCache, HeadCache]:
        """Caches of at least `length` slots: the ones of the last generation when they are long
        enough (a shape already compiled), else fresh ones."""
        held, self._held = self._held, None
        if held is not None and held[0] >= length:
            return held
        del held  # free the old buffers before allocating the new ones
        dtype = self.target.dtype
        cache = init_cache(self.target.config, 1, length, dtype)
        if self.mesh is not None:
            from .sharding import shard_cache

            cache = shard_cache(cache, self.mesh)
        return length, cache, init_head_cache(self.head.config, 1, length, dtype)

    def _keep_caches(self, length: int, cache: KVCache, head_cache: HeadCache) -> None:
        if not (cache.k.is_deleted() or head_cache.k.is_deleted()):
            self._held = (length, cache, head_cache)

    def _pack_tree(self, tree) -> np.ndarray:
        n, depth = self.n_nodes, self.rows
        parts = [tree.tokens, tree.positions, tree.parents, tree.mask.astype(np.int32).reshape(n * n),
                 tree.retrieve.reshape((n - 1) * (depth + 1))]
        return np.concatenate([np.asarray(p, np.int32).reshape(-1) for p in parts])[None, :]

    def _unpack_draft(self, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        size = self.rows * self.options.topk
        ids = host[:size].reshape(self.rows, self.options.topk)
        probs = host[size:2 * size].view(np.float32).reshape(self.rows, self.options.topk)
        return ids, probs

    def _build_tree(self, cand: np.ndarray, probs: np.ndarray, preceding: list[int]):
        from .ngram import build_tree

        o = self.options
        return build_tree(cand, probs, np.asarray(preceding, np.int64), self.trie, eos_id=self.tree_eos_id,
                          beam_width=o.beam_width, keep=o.keep, ngram_weight=o.ngram_weight)

    def _prepare(self, prompt_ids, max_new_tokens, max_length, temperature, top_p, top_k, seed):
        ids = _check_request(prompt_ids, self.vocab_size, max_new_tokens, max_length, temperature, top_p, top_k)
        bucket = prompt_bucket(ids.size, self.options.min_bucket)
        padded = np.zeros((1, bucket), np.int32)
        padded[0, :ids.size] = ids
        params = SamplingParams.make(temperature, top_p, top_k)
        budget = _Budget(self.eos_ids, int(max_new_tokens), int(max_length) - ids.size)
        return ids, jnp.asarray(padded), jnp.full((1,), ids.size, jnp.int32), params, jax.random.key(seed), budget

    # ------------------------------------------------------------------ decoding loops
    def generate_steps(self, prompt_ids: Sequence[int], *, max_new_tokens: int = 512, max_length: int = 2048,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                       stats: Stats | None = None) -> Iterator[tuple[list[int], int]]:
        """DART decoding. Yields (new token ids, accepted length k+1 of the step; 0 for the first
        token, which comes from the prefill). Stops after EOS (included), max_new_tokens or max_length."""
        stats = stats if stats is not None else Stats()
        ids, padded, prompt_len, params, key, budget = self._prepare(
            prompt_ids, max_new_tokens, max_length, temperature, top_p, top_k, seed)
        stats.prompt_tokens = ids.size
        stats.token_ids = budget.out
        length, cache, head_cache = self._take_caches(self.cache_length(ids.size, max_length))
        k = self.options.topk
        start = time.perf_counter()
        try:
            packed, cache, head_cache, key = self._prefill_dart(self._pair_state, padded, prompt_len, cache, head_cache,
                                                                key, params, rows=self.rows, k=k)
            host = np.asarray(packed)[0]
            stats.prefill_s = time.perf_counter() - start
            root = int(host[0])
            cand, probs = self._unpack_draft(host[1:])
            preceding = ids.tolist() + [root]
            kept = budget.take([root])
            stats.new_tokens = len(budget.out)
            yield kept, 0
            cache_len = prompt_len
            depth = self.rows
            committed = ids.size  # cache_len on the host, for the attention window
            reach = depth + 1 + self.head.config.draft_length  # slots past cache_len the head writes
            while not budget.done:
                t0 = time.perf_counter()
                tree = self._build_tree(cand, probs, preceding)
                packed_tree = self._pack_tree(tree)
                t1 = time.perf_counter()
                packed, cache, head_cache, cache_len, key = self._step_dart(
                    self._pair_state, jax.device_put(packed_tree), cache, head_cache, cache_len, key,
                    params, n=self.n_nodes, depth=depth, k=k, window=attention_window(committed + reach, length))
                host = np.asarray(packed)[0]
                t2 = time.perf_counter()
                stats.tree_s += t1 - t0
                stats.device_s += t2 - t1
                count = int(host[0])
                committed += count
                path_tokens = host[1:2 + depth][:count].tolist()
                bonus = int(host[2 + depth])
                cand, probs = self._unpack_draft(host[3 + depth:])
                preceding = path_tokens + [bonus]
                stats.steps += 1
                stats.accept_lengths.append(count)
                kept = budget.take(path_tokens[1:] + [bonus])
                stats.new_tokens = len(budget.out)
                yield kept, count
        finally:
            stats.total_s = time.perf_counter() - start
            self._keep_caches(length, cache, head_cache)

    def generate_ar_steps(self, prompt_ids: Sequence[int], *, max_new_tokens: int = 512, max_length: int = 2048,
                          temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                          stats: Stats | None = None) -> Iterator[tuple[list[int], int]]:
        """Plain autoregressive decoding of the target with the same sampling; yields ([token], 1)."""
        stats = stats if stats is not None else Stats()
        ids, padded, prompt_len, params, key, budget = self._prepare(
            prompt_ids, max_new_tokens, max_length, temperature, top_p, top_k, seed)
        stats.prompt_tokens = ids.size
        stats.token_ids = budget.out
        # the DART sizing, so that both decoders share one cache set (and its compiled shape)
        length, cache, head_cache = self._take_caches(self.cache_length(ids.size, max_length))
        start = time.perf_counter()
        try:
            token, cache, key = self._prefill_ar(self._target_state, padded, prompt_len, cache, key, params)
            first = int(np.asarray(token)[0])
            stats.prefill_s = time.perf_counter() - start
            kept = budget.take([first])
            stats.new_tokens = len(budget.out)
            yield kept, 0
            cache_len = prompt_len
            committed = ids.size
            while not budget.done:
                t0 = time.perf_counter()
                token, cache, cache_len, key = self._decode_ar(self._target_state, token, cache, cache_len, key,
                                                               params, window=attention_window(committed + 1, length))
                committed += 1
                nxt = int(np.asarray(token)[0])
                stats.device_s += time.perf_counter() - t0
                stats.steps += 1
                stats.accept_lengths.append(1)
                kept = budget.take([nxt])
                stats.new_tokens = len(budget.out)
                yield kept, 1
        finally:
            stats.total_s = time.perf_counter() - start
            self._keep_caches(length, cache, head_cache)
