"""Prefill speed of long prompts: the seconds from a request's admission to its first token
(`Stats.prefill_s`: the prompt through the target and the drafter, and the first token on the
host), by DART and by plain decoding, each prompt length compiled by an untimed call first. That
call is also timed for what it compiles in a process that answered a first prompt already (12
tokens, both methods): the compilation a prompt of a new length costs in a warm process.

    python benchmarks/prefill_chunks.py [--demo smollm2] [--lengths 219,500] [--repeats 5] [--min-bucket N[,M...]]
                                        [--tree DIR ...]

Several `--tree` folders (checkouts of dart_jax, e.g. the code before and after a change), and
several chunk sizes (`--min-bucket 32,64`), are run in turn, every tree at every chunk size,
alternating, each run a new Python process (this file with --child) over the same prompts, so that
a busy machine's load falls on each alike; the report gives the median per tree, chunk size, length
and method, and the ratio to the first tree at the first chunk size.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("dart", "ar")


def child(demo: str, lengths: list[int], repeats: int, min_bucket: int | None) -> None:
    """In the measured process: one JSON line {length: {method: [prefill seconds]}, "compile s":
    {length: {method: seconds compiling at the length's first call}}}."""
    import numpy as np

    from dart_jax.api.model import DartModel
    from dart_jax.decoding.compile_time import CompileTimer

    model = DartModel.demo(demo, **({} if min_bucket is None else {"min_bucket": min_bucket}))
    vocab = model.target.config.vocab_size
    rng = np.random.default_rng(0)
    first = [int(t) for t in rng.integers(10, vocab, 12)]
    for method in METHODS:
        model.generate(first, max_new_tokens=1, method=method)
    out, compiled = {}, {}
    for length in lengths:
        prompt = [int(t) for t in rng.integers(10, vocab, length)]
        out[length], compiled[length] = {}, {}
        for method in METHODS:
            with CompileTimer() as timer:  # compiles what this length needs
                model.generate(prompt, max_new_tokens=1, method=method)
            compiled[length][method] = timer.seconds
            out[length][method] = [model.generate(prompt, max_new_tokens=1, method=method).stats["prefill_s"]
                                   for _ in range(repeats)]
    print(json.dumps({**out, "compile s": compiled}))


def run_once(tree: Path, argv: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, __file__, "--child", *argv], env=env, cwd=tree, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"the run in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", default="smollm2", help="the demo model (DartModel.demo's name)")
    p.add_argument("--lengths", default="219,500", help="prompt lengths in tokens, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="timed prefills per length and method in a run")
    p.add_argument("--min-bucket", help="the demo's min_bucket, or several comma-separated, each run in turn "
                                        "(default: the demo's own)")
    p.add_argument("--runs", type=int, default=2, help="runs (processes) per tree")
    p.add_argument("--tree", action="append", type=Path, help="a dart_jax checkout to run (repeatable; default this one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = p.parse_args()
    lengths = [int(n) for n in opts.lengths.split(",")]
    buckets = [None] if opts.min_bucket is None else [int(n) for n in opts.min_bucket.split(",")]
    if opts.child:
        child(opts.demo, lengths, opts.repeats, buckets[0])
        return
    trees = [t.resolve() for t in (opts.tree or [ROOT])]
    setups = [(str(tree), bucket) for tree in trees for bucket in buckets]
    argv = ["--demo", opts.demo, "--lengths", opts.lengths, "--repeats", str(opts.repeats)]
    times: dict[tuple, list[float]] = {}
    compiles: dict[tuple, list[float]] = {}
    for run in range(opts.runs):
        for tree, bucket in setups:
            result = run_once(Path(tree), argv + ([] if bucket is None else ["--min-bucket", str(bucket)]))
            for length, by_method in result.pop("compile s").items():
                for method, seconds in by_method.items():
                    compiles.setdefault((tree, bucket, int(length), method), []).append(seconds)
            for length, by_method in result.items():
                for method, seconds in by_method.items():
                    times.setdefault((tree, bucket, int(length), method), []).extend(seconds)
            print(f"run {run + 1}, {tree}, min_bucket {bucket or 'default'}: {json.dumps(result)}", flush=True)
    print(f"{'tree':<40} {'chunk':>5} {'tokens':>6} {'method':>6} {'prefill ms':>11} {'vs first':>9} "
          f"{'compiling s':>12}")
    for length in lengths:
        for method in METHODS:
            first = statistics.median(times[(*setups[0], length, method)])
            for tree, bucket in setups:
                ms = statistics.median(times[(tree, bucket, length, method)])
                compiled = statistics.median(compiles[(tree, bucket, length, method)])
                print(f"{tree[-40:]:<40} {bucket or '-':>5} {length:>6} {method:>6} {ms * 1e3:>11.1f} "
                      f"{ms / first:>8.2f}× {compiled:>12.2f}")


if __name__ == "__main__":
    main()
