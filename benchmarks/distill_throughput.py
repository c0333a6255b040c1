"""Self-distillation throughput, side by side in one process on the SmolLM2 demo's target: the
same prompts answered by plain decoding, both in a `PlainBatcher` pool of the engine, in static
batches of prompts of similar lengths (`train.distill.batch_answers`, what `python -m
dart_jax.train.distill` runs) and continuously batched (`pool_answers`: a finished sequence's slot
refilled), alternating, each warmed up first; the answers must be identical.

    python benchmarks/distill_throughput.py PROMPTS.jsonl [--n 64] [--batch 32] [--rounds 2]

Prints one JSON line per run and the ratio pool/static of tokens per second.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from dart_jax.api.model import DartModel
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.train.distill import batch_answers, pool_answers, read_prompts


def answers(engine, jobs, batch, run):
    """{key: new ids} of `jobs` answered by `run(pool)` over a plain pool of `batch` slots."""
    pool = engine.batcher(batch, max(s.max_length for _, _, s in jobs), plain=True)
    try:
        return {key: list(ids) for key, ids, _ in run(pool)}
    finally:
        pool.close()


def static(engine, jobs, batch):
    return answers(engine, jobs, batch, lambda pool: batch_answers(pool, jobs))


def pooled(engine, jobs, batch, refill):
    return answers(engine, jobs, batch, lambda pool: pool_answers(pool, jobs, refill))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--refill", type=float, default=0.25)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    model = DartModel.demo("smollm2")
    engine, tok = model.engine, model.get_tokenizer()
    eos = sorted(engine.eos_ids)
    rows = read_prompts(args.prompts)[:args.n]
    jobs, warm = [], []
    for i, r in enumerate(rows):
        ids = tok(tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        jobs.append((i, ids, GenerationSettings(max_new_tokens=args.max_new, max_length=len(ids) + args.max_new)))
        warm.append((i, ids, GenerationSettings(max_new_tokens=40, max_length=len(ids) + 40)))
    runs = {"static": lambda: static(engine, jobs, args.batch),
            "pool": lambda: pooled(engine, jobs, args.batch, args.refill)}
    static(engine, warm[:args.batch], args.batch)  # warm-up: the shapes compile once
    pooled(engine, warm[:args.batch], args.batch, args.refill)
    rates = {name: [] for name in runs}
    answers = {}
    for r in range(args.rounds):
        for name, fn in (runs.items() if r % 2 == 0 else reversed(runs.items())):
            t0 = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - t0
            tokens = sum(len(o) for o in out.values())
            rates[name].append(tokens / seconds)
            answers[name] = {k: [t for t in o if t not in eos] for k, o in out.items()}
            print(json.dumps({"run": name, "round": r, "tokens": tokens, "seconds": round(seconds, 2),
                              "tokens_per_s": round(tokens / seconds, 1)}), flush=True)
    same = answers["static"] == answers["pool"]
    print(json.dumps({"median_tokens_per_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
                      "ratio_pool_over_static": round(statistics.median(rates["pool"]) /
                                                      statistics.median(rates["static"]), 3),
                      "identical_answers": same}))


if __name__ == "__main__":
    main()
