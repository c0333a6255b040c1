"""Can XLA:CPU compile the target's programs faster without slowing them? The SmolLM2 demo's
target, one plain token (`extend` of one row, then the LM head's argmax) and an 8-node tree verify
(`verify` with taps), each compiled ahead of time under several XLA option sets (per program, with
`compiler_options`), then all of them run in turns: compile CPU seconds and the run's median and
minimum milliseconds per option set, side by side in one process.

    python benchmarks/compile_options.py [--rounds 40] [--output FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from dart_jax.api.model import DartModel
from dart_jax.models.qwen3 import init_cache

VARIANTS = {
    "default": {},
    "no_expensive": {"xla_llvm_disable_expensive_passes": True},
    "o1_no_expensive": {"xla_backend_optimization_level": 1, "xla_llvm_disable_expensive_passes": True},
    "o0_no_expensive": {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--output")
    args = ap.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)  # every variant compiles for real
    model = DartModel.demo()
    target = model.target
    graph, state = nnx.split(target)
    cache, clen, n = init_cache(target.config, 1, 512), jnp.array([100], jnp.int32), args.nodes

    def plain(state, ids, cache, clen):
        m = nnx.merge(graph, state)
        h, _, cache = m.extend(ids, cache, clen)
        return m.lm_logits(h[:, -1]).argmax(-1), cache

    def verify(state, ids, pos, mask, cache, clen):
        m = nnx.merge(graph, state)
        h, taps, kv = m.verify(ids, pos, mask, cache, clen, return_taps=True)
        return m.lm_logits(h).argmax(-1), taps, kv

    programs = {"plain": (plain, (state, jnp.zeros((1, 1), jnp.int32), cache, clen)),
                "verify": (verify, (state, jnp.zeros((1, n), jnp.int32), jnp.arange(100, 100 + n, dtype=jnp.int32)[None],
                                    jnp.tril(jnp.ones((n, n), bool))[None], cache, clen))}
    compiled, rows = {}, {}
    for name, options in VARIANTS.items():
        for kind, (fn, fn_args) in programs.items():
            lowered = jax.jit(fn).lower(*fn_args)
            start = time.process_time()
            compiled[name, kind] = lowered.compile(compiler_options=options or None)
            rows[name, kind] = {"variant": name, "program": kind, "options": options,
                                "compile_cpu_s": time.process_time() - start}
    times = {key: [] for key in compiled}
    for _ in range(args.rounds):
        for key, program in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(program(*programs[key[1]][1]))
            times[key].append(time.perf_counter() - start)
    for key, row in rows.items():
        row.update(run_ms_median=1e3 * statistics.median(times[key]), run_ms_min=1e3 * min(times[key]))
        print(f"{row['variant']:>16} {row['program']:>6}: compile {row['compile_cpu_s']:.2f} CPU s, run median "
              f"{row['run_ms_median']:.2f} ms, min {row['run_ms_min']:.2f} ms")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(list(rows.values()), f, indent=1)


if __name__ == "__main__":
    main()
