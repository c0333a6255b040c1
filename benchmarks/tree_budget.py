"""The tree budget side by side, in one process: `keep="auto"` against fixed tree sizes, and the
plain-decoding baseline (a `PlainBatcher` of one slot: a device loop per chunk of tokens), on the
same prompts, interleaved so that the machine's load hits all alike.

    python benchmarks/tree_budget.py                      # the demo model; training + held-out prompts
    python benchmarks/tree_budget.py --sizes 16,60 --max-new-tokens 128 --reps 3 --json out.json

Prompts: the demo corpus's questions (what the demo model and its head were trained on: high
acceptance) and the shipped prompt set dart_jax/data/prompts.jsonl (held out: low acceptance).
Every method's greedy output is checked against plain decoding. Reported: tokens/s (median over
--reps, after one warm-up run of everything), τ, and the speedup over the device-loop baseline.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from dart_jax.api.model import DartModel
from dart_jax.bench.e2e import load_prompts
from dart_jax.decoding.driver import decode
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings

CORPUS = Path(__file__).resolve().parent.parent / "scripts" / "demo_corpus.jsonl"


def prompt_sets(limit: int) -> dict[str, list[str]]:
    train = [json.loads(line)["messages"][0]["content"] for line in CORPUS.read_text().splitlines() if line.strip()]
    held_out = [p["prompt"] for p in load_prompts(None)]
    return {"training": train[:limit], "held-out": held_out[:limit]}


def dart_steps(engine, plain=False):
    """One sequence through the pool driver (with `plain`, plain decoding), as (ids, settings,
    stats=) → (new ids, accepted length)."""
    return lambda ids, settings, stats: ((e.ids, e.accepted) for e in decode(engine, ids, settings, stats,
                                                                             plain=plain))


def run_steps(steps_fn, ids, settings) -> tuple[list[int], Stats, float]:
    stats, out = Stats(), []
    start = time.perf_counter()
    for kept, _ in steps_fn(ids, settings, stats=stats):
        out.extend(kept)
    return out, stats, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16,60", help="fixed tree sizes to compare with auto (default 16,60)")
    ap.add_argument("--limit", type=int, default=4, help="prompts per set (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions; medians reported (default 3)")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    args = ap.parse_args()

    model = DartModel.demo(keep="auto")
    auto = model.engine
    fixed = {int(s): auto.with_tree(dataclasses.replace(auto.tree, keep=int(s)), adaptive=False)
             for s in args.sizes.split(",")}
    methods = {"ar (device loop)": lambda ids, st: run_steps(dart_steps(auto, plain=True), ids, st),
               "auto": lambda ids, st: run_steps(dart_steps(auto), ids, st),
               **{f"keep {s}": (lambda e: lambda ids, st: run_steps(dart_steps(e), ids, st))(e)
                  for s, e in fixed.items()}}
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    rows = []
    for set_name, prompts in prompt_sets(args.limit).items():
        for prompt in prompts:
            ids = model.encode(prompt)
            rates: dict[str, list[float]] = {m: [] for m in methods}
            taus: dict[str, float] = {}
            reference = None
            for rep in range(args.reps + 1):  # the first round warms up (compiles) everything
                for name, fn in methods.items():
                    out, stats, wall = fn(ids, settings)
                    reference = reference if reference is not None else out
                    if out != reference:
                        raise SystemExit(f"{name}: greedy output differs from plain decoding on {prompt!r}")
                    if rep:
                        rates[name].append(len(out) / wall)
                        taus[name] = stats.mean_accept_length
            base = statistics.median(rates["ar (device loop)"])
            row = {"set": set_name, "prompt": prompt[:40], "tokens": len(reference),
                   **{f"{m} tok/s": round(statistics.median(r), 1) for m, r in rates.items()},
                   **{f"{m} ×": round(statistics.median(r) / base, 2) for m, r in rates.items()},
                   **{f"{m} τ": round(taus[m], 2) for m in methods if not m.startswith("ar")}}
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    print("\nsizer:", json.dumps(auto.sizer.summary()))
    for set_name in dict.fromkeys(r["set"] for r in rows):
        sel = [r for r in rows if r["set"] == set_name]
        cells = ", ".join(f"{m} {statistics.median(r[f'{m} ×'] for r in sel):.2f}×" for m in methods)
        print(f"median speedup over the device-loop baseline, {set_name} prompts: {cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
