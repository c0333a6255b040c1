"""Self-distillation throughput, side by side in one process: the same prompts answered by static
batches of plain decoding (`AutoregressiveDecoder.generate_batch`, prompts sorted by length: how
scripts/make_smollm2.py's `answers` stage made the demo's data) and by `train.distill`'s
continuous-batching pool, alternating, each warmed up first; the answers must be identical.

    python benchmarks/distill_throughput.py PROMPTS.jsonl --base MODEL [--n 64] [--batch 32] [--rounds 2]

Prints one JSON line per run and the ratio pool/static of tokens per second.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from dart_jax.convert.target import target_folder
from dart_jax.decoding.autoregressive import AutoregressiveDecoder
from dart_jax.decoding.batcher import PlainBatcher, TargetEngine
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.errors import load_tokenizer_folder
from dart_jax.models.checkpoints import load_target
from dart_jax.train.distill import answers, read_prompts


def static(decoder, prompts, settings, eos, batch):
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    for b in range(0, len(order), batch):
        rows = order[b:b + batch]
        for i, new in zip(rows, decoder.generate_batch([prompts[i] for i in rows], [settings[i] for i in rows], eos)):
            out[i] = new
    return out


def pooled(engine, prompts, settings, batch, refill):
    pool = PlainBatcher(engine, batch, max(s.max_length for s in settings))
    try:
        done = dict(answers(pool, [(i, p, s) for i, (p, s) in enumerate(zip(prompts, settings))], refill))
    finally:
        pool.close()
    return [list(done[i].token_ids) for i in range(len(prompts))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts")
    p.add_argument("--base", required=True)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--refill", type=float, default=0.25)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    folder = target_folder(args.base)
    tok = load_tokenizer_folder(folder)
    target = load_target(folder)
    eos = sorted(set(target.config.eos_token_ids) | {int(tok.eos_token_id)})
    shapes = ShapeSettings(min_bucket=64, cache_multiple=64)
    rows = read_prompts(args.prompts)[:args.n]
    prompts = [tok(tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for r in rows]
    settings = [GenerationSettings(max_new_tokens=args.max_new, max_length=len(ids) + args.max_new) for ids in prompts]
    decoder = AutoregressiveDecoder(target, shapes)
    engine = TargetEngine(target, eos, shapes)
    runs = {"static": lambda: static(decoder, prompts, settings, eos, args.batch),
            "pool": lambda: pooled(engine, prompts, settings, args.batch, args.refill)}
    small = prompts[:args.batch], settings[:args.batch]
    static(decoder, small[0], [GenerationSettings(max_new_tokens=40, max_length=len(i) + 40) for i in small[0]], eos,
           args.batch)  # warm-up: the shapes compile once
    pooled(engine, small[0], [GenerationSettings(max_new_tokens=40, max_length=len(i) + 40) for i in small[0]],
           args.batch, args.refill)
    rates = {name: [] for name in runs}
    answers = {}
    for r in range(args.rounds):
        for name, fn in (runs.items() if r % 2 == 0 else reversed(runs.items())):
            t0 = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - t0
            tokens = sum(len(o) for o in out)
            rates[name].append(tokens / seconds)
            answers[name] = [[t for t in o if t not in eos] for o in out]
            print(json.dumps({"run": name, "round": r, "tokens": tokens, "seconds": round(seconds, 2),
                              "tokens_per_s": round(tokens / seconds, 1)}), flush=True)
    same = answers["static"] == answers["pool"]
    print(json.dumps({"median_tokens_per_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
                      "ratio_pool_over_static": round(statistics.median(rates["pool"]) /
                                                      statistics.median(rates["static"]), 3),
                      "identical_answers": same}))


if __name__ == "__main__":
    main()
