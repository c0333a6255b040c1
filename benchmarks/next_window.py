"""A sequence that grows into an attention window its process has not compiled yet: the seconds the
request's own thread spends compiling (or waiting for the programs compiled beside it) and the
request's wall seconds, with the next window compiled ahead (`ahead.NextWindow`, the pool driver's
default) and without (`Driver(next_window=None)`: each program compiles in the step that first
needs it).

    python benchmarks/next_window.py [--demo smollm2] [--length 219] [--new-tokens 128] [--runs 2]

Each run is a new Python process (this file with --child) with the persistent compilation cache
off, so that each compiles the same programs: the demo answers a first 12-token prompt by DART and
by plain decoding (the first window compiled), then a random prompt of `--length` tokens is decoded
`--new-tokens` past it, EOS ignored (as the HumanEval prompt of issue 49 did), once by each method.
The modes alternate run by run, so that a busy machine's load falls on each alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("ahead", "in the step")


def child(demo: str, length: int, new_tokens: int, ahead: bool) -> None:
    """In the measured process: one JSON line {method: {"compile_s", "wall_s", "tokens"}}."""
    import numpy as np

    from dart_jax.api.model import DartModel
    from dart_jax.decoding.driver import Driver, pool_for
    from dart_jax.decoding.settings import GenerationSettings

    model = DartModel.demo(demo)
    rng = np.random.default_rng(0)
    vocab = model.target.config.vocab_size
    first = [int(t) for t in rng.integers(10, vocab, 12)]
    model.generate(first, max_new_tokens=16, chat=False)
    model.generate_ar(first, max_new_tokens=16, chat=False)
    prompt = [int(t) for t in rng.integers(10, vocab, length)]
    settings = GenerationSettings(max_new_tokens=new_tokens, max_length=2048)
    out = {}
    for method, plain in (("dart", False), ("ar", True)):
        pool = pool_for(model.engine, 1, settings.max_length, plain=plain)
        try:
            request = pool.submit(prompt, settings, stop_at_eos=False)
            driver = Driver(pool) if ahead else Driver(pool, next_window=None)
            start = time.perf_counter()
            for _ in driver.run():
                pass
            wall = time.perf_counter() - start
        finally:
            pool.close()
        out[method] = {"compile_s": driver.timer.seconds, "wall_s": wall, "tokens": len(request.token_ids)}
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="smollm2")
    ap.add_argument("--length", type=int, default=219, help="prompt tokens (default 219)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens decoded past the prompt (default 128)")
    ap.add_argument("--runs", type=int, default=2, help="processes per mode (default 2)")
    ap.add_argument("--json", help="also write every run's figures here")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.demo, args.length, args.new_tokens, args.child == "ahead")
        return
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for i in range(args.runs):
        for mode in MODES:
            load = os.getloadavg()[0]
            done = subprocess.run([sys.executable, __file__, "--child", mode, "--demo", args.demo, "--length",
                                   str(args.length), "--new-tokens", str(args.new_tokens)],
                                  env=env, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the {mode} run failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            runs[mode].append({"load": load, **figures})
            print(f"run {i + 1}, {mode}: " + ", ".join(
                f"{m} compiling {f['compile_s']:.1f} s of {f['wall_s']:.1f} s ({f['tokens']} tokens)"
                for m, f in figures.items()) + f" (load {load:.1f})", flush=True)
    for method in ("dart", "ar"):
        for mode in MODES:
            compile_s = statistics.median(r[method]["compile_s"] for r in runs[mode])
            wall_s = statistics.median(r[method]["wall_s"] for r in runs[mode])
            print(f"{method}, next window {mode}: compiling on the request's thread {compile_s:.1f} s, "
                  f"wall {wall_s:.1f} s (median of {len(runs[mode])})")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
