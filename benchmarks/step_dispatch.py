"""The host's share of a DART step call: how long `Engine.step` takes to return (argument handling
and dispatch, before the device runs) against the wait for its result, per step.

    python benchmarks/step_dispatch.py [--layers 36] [--keep 60] [--root CHECKOUT]

A random target of the tiny widths (bench.shapes' TINY_SHAPE) with `--layers` layers and its DART
head, so that the call's host work, which grows with the number of arrays, is not hidden by the
device's. `--root` imports dart_jax from another checkout instead of this one (its `ngram`,
`convert` and `train` folders linked under its `dart_jax/`, as the package mapping installs them),
to compare two versions of the code on one machine: run both, alternately, on a quiet machine.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=36, help="layers of the random target (default 36)")
    ap.add_argument("--keep", type=int, default=60, help="tree size besides the root (default 60)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens per generation (default 128)")
    ap.add_argument("--root", type=Path, help="a checkout to import dart_jax from (default: the installed one)")
    args = ap.parse_args(argv)
    if args.root is not None:
        if not (args.root / "dart_jax" / "ngram").exists():
            ap.error(f"--root {args.root}: link its ngram, convert and train folders under dart_jax/ first "
                     "(ln -s ../ngram dart_jax/ngram, ...)")
        # the editable install's finder would win over sys.path: leave it out
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, str(args.root.resolve()))
    import jax  # noqa: PLC0415 (after the choice of checkout)
    import numpy as np  # noqa: PLC0415
    from dart_jax.bench.e2e import random_model  # noqa: PLC0415
    from dart_jax.bench.tiny import build_random_assets  # noqa: PLC0415

    import dart_jax  # noqa: PLC0415
    print(f"dart_jax from {Path(dart_jax.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp:
        model = random_model(build_random_assets(Path(tmp), layers=args.layers, weights=False), 0, keep=args.keep)
    engine, step = model.engine, model.engine._step
    timing = {"call": [], "wait": []}

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = step(*a, **k)
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        timing["call"].append(t1 - t0)
        timing["wait"].append(time.perf_counter() - t1)
        return out

    engine._step = timed
    prompt = "hello world, this is a test of the host overhead"
    model.generate(prompt, max_new_tokens=args.new_tokens)  # compiles
    for v in timing.values():
        v.clear()
    for _ in range(2):
        model.generate(prompt, max_new_tokens=args.new_tokens)
    print(f"{args.layers} layers, {len(timing['call'])} steps: call {np.median(timing['call']) * 1e3:.3f} ms, "
          f"wait for the device {np.median(timing['wait']) * 1e3:.3f} ms (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
