"""Plain decoding two ways, side by side in one process on a demo model: the loop that
`AutoregressiveDecoder.decode_batch` ran until issue 51 (restated below as `removed_loop`: the
decoder's prefill, then its chunk program until every budget is done, over the pool's state without
a pool) and a `PlainBatcher` pool stepped by the pool driver (`driver.decode` for one
prompt, `driver.decode_together` for a batch: what every plain-decoding consumer runs now). The
same prompts, programs and cache set (the pool's cache length for both). Each prompt alone, then
the batch, runs both paths back to back, in an order that alternates, so that a busy machine's
load falls on both alike; prints tokens/s per path and batch size per round, their medians, and
the ratio driver / removed loop (of the medians, and the median of each round's ratio).

    python benchmarks/plain_paths.py [--demo smollm2] [--rounds 7] [--max-new-tokens 128] [--limit 3] [--batch 3]
                                     [--no-eos]
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import jax.numpy as jnp
import numpy as np

from dart_jax.api.model import DartModel
from dart_jax.bench.e2e import load_prompts
from dart_jax.decoding.autoregressive import attention_window
from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.driver import decode, decode_together
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.requests import Budget
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.decoding.state import PoolState


def prefill_prompts(decoder, prompts, state: PoolState, length: int):
    """`prompts` prefilled into the first rows of the pool's `state` (caches of `length` slots) as the
    plain pool does, one call of the decoder's prefill per chunk: (each prompt's first token [b], the
    next state)."""
    chunk, lens = decoder.shapes.chunk, np.array([len(p) for p in prompts], np.int32)
    padded = np.zeros((len(prompts), decoder.shapes.padded(int(lens.max()))), np.int32)
    for i, p in enumerate(prompts):
        padded[i, :len(p)] = p
    token = jnp.zeros(len(prompts), jnp.int32)
    for offset in range(0, padded.shape[1], chunk):
        start = np.where(lens > offset, offset, length).astype(np.int32)
        token, state = decoder.prefill(decoder.state, jnp.asarray(padded[:, offset:offset + chunk]), jnp.asarray(lens),
                                       jnp.asarray(start), token, state, window=attention_window(offset + chunk, length))
    return token, state


def removed_loop(decoder, prompts, settings) -> list[list[int]]:
    """The new ids of `prompts` decoded together by the removed `decode_batch` loop (its stats left out)."""
    prompts = [np.asarray(p, np.int32) for p in prompts]
    b, lens = len(prompts), np.array([p.size for p in prompts], np.int32)
    budgets = [Budget(decoder.eos_ids, s.max_new_tokens, s.max_length - p.size) for s, p in zip(settings, prompts)]
    params, keys = GenerationSettings.sampling_rows(settings)
    # the pool's cache length, so that both paths reuse one cache set
    length, caches = decoder.pool.take(decoder.shapes.cache_length(max(s.max_length for s in settings) + 1), b)
    state = PoolState(*caches, cache_len=jnp.asarray(lens), keys=keys, params=params)
    try:
        token, state = prefill_prompts(decoder, prompts, state, length)
        for budget, t in zip(budgets, np.asarray(token)):
            budget.take([t])
        committed = int(lens.max())
        remaining = jnp.asarray([0 if budget.done else budget.limit - len(budget.out) for budget in budgets], jnp.int32)
        while not all(budget.done for budget in budgets):
            out, token, remaining, state = decoder.decode_chunk(
                decoder.state, token, state, remaining, decoder.eos_row,
                window=attention_window(committed + decoder.chunk, length), chunk=decoder.chunk)
            committed += decoder.chunk
            for budget, row in zip(budgets, np.asarray(out)):
                if not budget.done:
                    budget.take(row[row >= 0])
    finally:
        decoder.pool.keep(length, state.caches(), b)
    return [budget.out for budget in budgets]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="smollm2", choices=("smollm2", "tiny"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=3, help="prompts decoded one at a time (default 3)")
    ap.add_argument("--batch", type=int, default=3, help="prompts decoded together (default 3; 0: none)")
    ap.add_argument("--no-eos", action="store_true",
                    help="decode past the EOS ids, every answer to --max-new-tokens (the tiny demo's answers are short)")
    args = ap.parse_args()
    model = DartModel.demo(args.demo)
    model.compile_notice = None
    engine = model.engine
    if args.no_eos:  # an EOS id outside the vocabulary: never sampled, and both paths check it as usual
        engine = Engine(model.target, DartDrafter(model.head), None, eos_ids=(engine.vocab_size,), tree_eos_id=None,
                        shapes=engine.shapes)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    prompts = [model.encode(p["prompt"]) for p in load_prompts(None)[:max(args.limit, args.batch)]]
    # (batch, the prompts of one timed pair of runs): each unit runs both paths back to back
    units = [(1, [ids]) for ids in prompts[:args.limit]] + ([(args.batch, prompts[:args.batch])] if args.batch else [])
    paths = {"removed loop": lambda group: removed_loop(engine.baseline, group, [settings] * len(group)),
             "driver pool": lambda group: ([[t for e in decode(engine, group[0], settings, plain=True) for t in e.ids]]
                                           if len(group) == 1 else
                                           decode_together(engine, group, [settings] * len(group), plain=True))}
    for _, group in units:  # compile, and check that both give the same tokens
        outs = [run(group) for run in paths.values()]
        if outs[0] != outs[1]:
            raise SystemExit("the driver's tokens differ from the removed loop's")
    batches = sorted({b for b, _ in units})
    rates = {(name, b): [] for name in paths for b in batches}
    for r in range(args.rounds):
        tokens, seconds = collections.Counter(), collections.Counter()
        for u, (b, group) in enumerate(units):
            for name, run in (paths.items() if (r + u) % 2 == 0 else reversed(paths.items())):
                start = time.perf_counter()
                tokens[name, b] += sum(map(len, run(group)))
                seconds[name, b] += time.perf_counter() - start
        for key in rates:
            rates[key].append(tokens[key] / seconds[key])
    report = {}
    for b in batches:
        old, new = rates["removed loop", b], rates["driver pool", b]
        report[f"batch {b}"] = {
            "removed loop tokens/s": [round(x, 2) for x in old], "driver pool tokens/s": [round(x, 2) for x in new],
            "median removed loop": round(statistics.median(old), 2),
            "median driver pool": round(statistics.median(new), 2),
            "ratio of medians": round(statistics.median(new) / statistics.median(old), 4),
            "median of per-round ratios": round(statistics.median(n / o for n, o in zip(new, old)), 4)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
