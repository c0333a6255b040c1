"""The plain-decoding baseline's device loop before and after it kept the attended window in the
loop's carry (instead of slicing the window out of the cache and writing it back for every
token), side by side in one process on the demo model: same prompt, same caches, same outputs.

    python benchmarks/baseline_loop.py [--reps 15] [--chunk 32]
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.api.model import DartModel
from dart_jax.decoding.autoregressive import attention_window, jitted, put_window, window_view
from dart_jax.decoding.sampling import sample_tokens, split_rows
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.decoding.state import PoolState
from dart_jax.models.qwen3 import KVCache
from plain_paths import prefill_prompts  # this folder's (sys.path[0] for `python benchmarks/...`)


def _decode_chunk_before(graphdef, state, token, cache, cache_len, keys, params, remaining, eos, *, window, chunk):
    """The loop as it was: the window sliced out of the cache and written back at every token."""
    target = nnx.merge(graphdef, state)
    b = token.shape[0]
    out = jnp.full((b, chunk), -1, jnp.int32)

    def body(carry):
        i, token, cache, cache_len, keys, remaining, out = carry
        active = remaining > 0
        hidden, _, cache_w = target.extend(token[:, None], window_view(cache, window), cache_len)
        cache = KVCache(k=put_window(cache.k, cache_w.k), v=put_window(cache.v, cache_w.v))
        after, now = split_rows(keys)
        new = sample_tokens(now, target.lm_logits(hidden[:, 0]), params)
        out = out.at[:, i].set(jnp.where(active, new, -1))
        stop = jnp.any(new[:, None] == eos[None, :], axis=1)
        remaining = jnp.where(active, jnp.where(stop, 0, remaining - 1), 0)
        return (i + 1, jnp.where(active, new, token), cache, cache_len + active.astype(cache_len.dtype),
                after, remaining, out)

    _, token, cache, cache_len, keys, remaining, out = jax.lax.while_loop(
        lambda c: (c[0] < chunk) & jnp.any(c[5] > 0), body,
        (jnp.int32(0), token, cache, cache_len, keys, remaining, out))
    return out, token, cache, cache_len, keys, remaining


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--chunk", type=int, default=32)
    args = ap.parse_args()
    model = DartModel.demo()
    decoder = model.engine.baseline
    graphdef, state_before = nnx.split(model.target)
    ids = np.asarray(model.encode("What is speculative decoding?"), np.int32)
    settings = GenerationSettings(max_new_tokens=args.chunk + 8)
    params, keys = GenerationSettings.sampling_rows([settings])
    length = model.engine.cache_length(ids.size, settings.max_length)
    _, caches = decoder.pool.take(length, 1)
    state = PoolState(*caches, cache_len=jnp.asarray([ids.size], jnp.int32), keys=keys, params=params)
    token, state = prefill_prompts(decoder, [ids], state, length)
    window = attention_window(ids.size + args.chunk, length)
    remaining, eos = jnp.asarray([args.chunk], jnp.int32), jnp.asarray([-1], jnp.int32)
    before = jitted(_decode_chunk_before, graphdef, static_argnames=("window", "chunk"), donate_argnames="cache")
    # both donate the cache, as the decoder's loop does: each call gets its own copy of the state (made
    # untimed); each takes the target's state as it does: an nnx State and loose arrays before, the
    # decoder's flat arrays and the pool's state after
    fns = {"before": lambda own: before(state_before, token, own.cache, own.cache_len, own.keys, own.params, remaining,
                                        eos, window=window, chunk=args.chunk)[0],
           "after": lambda own: decoder.decode_chunk(decoder.state, token, own, remaining, eos, window=window,
                                                     chunk=args.chunk)[0]}
    outputs, times = {}, {name: [] for name in fns}
    for rep in range(args.reps + 1):
        for name, fn in fns.items():
            own = jax.block_until_ready(jax.tree.map(jnp.copy, state))
            t0 = time.perf_counter()
            outputs[name] = np.asarray(fn(own))
            if rep:  # the first round compiles
                times[name].append(time.perf_counter() - t0)
    assert np.array_equal(outputs["before"], outputs["after"]), "the two loops decoded different tokens"
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.chunk}-token device loop on the demo target (window {window} slots), median of {args.reps}:")
    for name, t in med.items():
        print(f"  {name}: {1e3 * t:.2f} ms  ({args.chunk / t:.0f} tok/s)")
    print(f"  after / before: {med['before'] / med['after']:.2f}x faster; same tokens")


if __name__ == "__main__":
    main()
