"""What a warm start pays before XLA: the SmolLM2 demo target's 8-node tree verify traced and
lowered from Python, against the same program exported once (`jax.export`, serialized StableHLO)
and read back: seconds to trace, lower, export and serialize, deserialize and lower the exported
program, and to compile each (the persistent cache off), and whether both give the same outputs.
A probe for skipping the model's tracing in a new process (needs `flatbuffers`).

    python benchmarks/program_export.py [--nodes 8]
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.api.model import DartModel
from dart_jax.models.qwen3 import init_cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    args = ap.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    model = DartModel.demo()
    target = model.target
    graph, state = nnx.split(target)
    n = args.nodes
    structured = (state, jnp.zeros((1, n), jnp.int32), jnp.arange(100, 100 + n, dtype=jnp.int32)[None],
                  jnp.tril(jnp.ones((n, n), bool))[None], init_cache(target.config, 1, 512), jnp.array([100], jnp.int32))
    leaves, tree = jax.tree.flatten(structured)

    def verify(*flat):  # flat arrays in and out: an exported program's signature holds no module types
        state, ids, pos, mask, cache, clen = jax.tree.unflatten(tree, flat)
        m = nnx.merge(graph, state)
        h, taps, kv = m.verify(ids, pos, mask, cache, clen, return_taps=True)
        return jax.tree.leaves((m.lm_logits(h).argmax(-1), taps, kv))

    f, figures = jax.jit(verify), {}
    t0 = time.perf_counter()
    traced = f.trace(*leaves)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    blob = jax.export.export(f)(*leaves).serialize()
    t3 = time.perf_counter()
    exported = jax.export.deserialize(blob)
    t4 = time.perf_counter()
    lowered_back = jax.jit(exported.call).trace(*leaves).lower()
    t5 = time.perf_counter()
    figures.update(trace_s=t1 - t0, lower_s=t2 - t1, export_serialize_s=t3 - t2, serialized_mb=len(blob) / 1e6,
                   deserialize_s=t4 - t3, exported_trace_lower_s=t5 - t4)
    t0 = time.perf_counter()
    original = lowered.compile()
    t1 = time.perf_counter()
    back = lowered_back.compile()
    t2 = time.perf_counter()
    figures.update(compile_original_s=t1 - t0, compile_exported_s=t2 - t1)
    figures["same_outputs"] = all(np.array_equal(np.asarray(a), np.asarray(b))
                                  for a, b in zip(jax.tree.leaves(original(*leaves)), jax.tree.leaves(back(*leaves))))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
