"""Plain decoding two ways, side by side in one process on the SmolLM2 demo: the baseline decoder's
own loop (`Engine.generate_ar_steps`, `AutoregressiveDecoder.decode_batch`) and a pool of one slot
stepped by the pool driver (`driver.decode(..., plain=True)`, a `PlainBatcher`: what
`DartModel.generate_ar` runs since the driver), the same prompts and chunked device loop, timed in
turns; prints tokens/s per path (median over the rounds) and their ratio.

    python benchmarks/plain_paths.py [--rounds 5] [--max-new-tokens 128] [--limit 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from dart_jax.api.model import DartModel
from dart_jax.bench.e2e import load_prompts
from dart_jax.decoding.driver import decode
from dart_jax.decoding.settings import GenerationSettings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=3, help="prompts (default 3)")
    args = ap.parse_args()
    model = DartModel.demo()
    model.compile_notice = None
    engine = model.engine
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    prompts = [model.encode(p["prompt"]) for p in load_prompts(None)[:args.limit]]
    paths = {"baseline loop": lambda ids: [t for kept, _ in engine.generate_ar_steps(ids, settings) for t in kept],
             "driver pool": lambda ids: [t for e in decode(engine, ids, settings, plain=True) for t in e.ids]}
    for run in paths.values():  # compile
        for ids in prompts:
            run(ids)
    rates = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, run in paths.items():
            start = time.perf_counter()
            outs = [run(ids) for ids in prompts]
            rates[name].append(sum(map(len, outs)) / (time.perf_counter() - start))
    medians = {name: statistics.median(r) for name, r in rates.items()}
    print(json.dumps({"tokens_per_s": rates, "median": medians,
                      "driver_over_baseline": medians["driver pool"] / medians["baseline loop"]}, indent=1))


if __name__ == "__main__":
    main()
