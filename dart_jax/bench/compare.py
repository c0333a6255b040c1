"""`python -m dart_jax.bench compare`: the drafting methods side by side on one target.

Every prompt is generated with each method (DART, EAGLE-3, and plain decoding, the baseline:
the device loop of `generate_ar`), in one run, so the ratios share the machine's state. Per
method: tokens/s, speedup over plain decoding (median and range over the prompts, and per
category), τ (tokens per target step), the acceptance per draft depth, the drafter's own
device time per step (its `extend` call — DART's one head forward, EAGLE-3's commit plus its
autoregressive draft steps — jitted and timed alone at the run's tree settings), the host tree
search per step, and whether the output equals plain decoding. The JSON keeps the e2e rows per
prompt under `prompt_rows`.
"""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from dart_jax.decoding.autoregressive import split_flat

from .e2e import ModelSet, Workload, run_e2e, tree_label
from .util import summary_ms

COLUMNS = ["method", "tree", "tok_s", "speedup", "speedup_min", "speedup_max", "tau", "acceptance_per_depth",
           "draft_ms", "tree_ms", "step_ms", "same"]


def _engine(model, method: str):
    return model.engine if method == "dart" else getattr(model, f"{method}_engine")


def drafting_ms(engine, *, context: int = 256, reps: int = 20, seed: int = 0) -> float:
    """Median device time of one drafting call as a step makes it after accepting its deepest
    path: the drafter's `extend` over depth + 1 accepted rows at `context` committed tokens,
    with the engine's tree settings (static shapes as in the step), on random inputs."""
    drafter = engine.drafter
    cls = type(drafter)
    depth, k, nodes = engine.depth, engine.tree.topk, engine.n_nodes
    dtype = engine.target.dtype
    model, state = split_flat(drafter.module)  # as the engine passes it: a flat tuple
    length = context + 2 * (depth + 1) + 64
    cache = drafter.init_cache(1, length, dtype)
    key_taps, key_ids = jax.random.split(jax.random.key(seed))
    taps = jax.random.normal(key_taps, (1, depth + 1, 3 * engine.target.config.hidden_size), dtype)
    follow = jax.random.randint(key_ids, (1, depth + 1), 0, engine.vocab_size, jnp.int32)
    cache_len, n_real = jnp.asarray([context], jnp.int32), jnp.asarray([depth + 1], jnp.int32)

    @jax.jit
    def draft(state, taps, follow, cache, cache_len, n_real):
        module = model.merge(state)
        window = cls.cache_window(cache, length, 1)
        proposal, _ = cls.extend(module, taps, follow, window, cache_len, n_real, rows=depth, k=k, nodes=nodes)
        return proposal

    args = (state, taps, follow, cache, cache_len, n_real)
    jax.block_until_ready(draft(*args))  # compile
    times = []
    for _ in range(max(reps, 3)):
        t0 = time.perf_counter()
        jax.block_until_ready(draft(*args))
        times.append(time.perf_counter() - t0)
    return summary_ms(times)["median_ms"]


def _tree_text(engine, method: str) -> str:
    if method == "eagle3":
        return f"{engine.tree.keep + 1} nodes, {engine.drafter.depth} steps, top-{engine.tree.topk}"
    label = tree_label(engine)
    return f"{label + 1} nodes" if isinstance(label, int) else label


def run_compare(models: ModelSet, work: Workload, *, reps: int = 1, warmup: int = 1, seed: int = 0,
                show_progress: bool = True, methods=("dart", "eagle3", "ar"), draft_reps: int = 20) -> dict[str, Any]:
    """The side-by-side comparison (see the module's docstring) as {mode, config, rows, summary,
    prompt_rows}: one row per method, plain decoding first."""
    methods = tuple(dict.fromkeys(methods))
    drafting = [m for m in methods if m != "ar"]

    def probe(model) -> dict[str, Any]:
        out = {}
        for m in drafting:
            engine = _engine(model, m)
            out[m] = {"draft_ms": drafting_ms(engine, reps=draft_reps, seed=seed), "tree": _tree_text(engine, m)}
        return out

    e2e = run_e2e(models, work, reps=reps, warmup=warmup, seed=seed, show_progress=show_progress, methods=methods,
                  probe=probe)
    prompt_rows, summary = e2e["rows"], e2e["summary"]
    n = len(prompt_rows)
    ar_rate = summary["ar_tok_s"]
    rows = [{"method": "ar", "tree": "-", "tok_s": ar_rate, "speedup": 1.0, "speedup_min": 1.0, "speedup_max": 1.0,
             "tau": 1.0, "acceptance_per_depth": "-", "draft_ms": float("nan"), "tree_ms": float("nan"),
             "step_ms": 1e3 / ar_rate, "same": f"{n}/{n}"}]
    for m in drafting:
        key = "" if m == "dart" else f"{m}_"  # e2e's keys: DART's unprefixed, the others' "<method>_..."
        speedups = [r[f"{key}speedup"] for r in prompt_rows]
        same = sum(bool(r["same_output" if m == "dart" else f"{m}_same"]) for r in prompt_rows)
        figures = summary["drafting"][m]
        tau, rate = summary[f"{key}tau"], summary[f"{m}_tok_s"]
        rows.append({"method": m, "tree": summary["probe"][m]["tree"], "tok_s": rate,
                     "speedup": summary[f"{key}speedup"], "speedup_min": min(speedups), "speedup_max": max(speedups),
                     "tau": tau, "acceptance_per_depth": " ".join(f"{a:.2f}" for a in figures["accept_per_depth"]),
                     "draft_ms": summary["probe"][m]["draft_ms"], "tree_ms": figures["tree_ms_per_step"],
                     "step_ms": 1e3 * tau / rate, "same": f"{same}/{n}"})
    per_category = {cat: {m: figures[f"{'' if m == 'dart' else m + '_'}speedup"] for m in drafting}
                    for cat, figures in summary["per_category"].items()}
    out_summary = {"speedup": {r["method"]: r["speedup"] for r in rows}, "tau": {r["method"]: r["tau"] for r in rows},
                   "per_category_speedup": per_category,
                   "all_same_output": all(r["same"] == f"{n}/{n}" for r in rows)}
    if "dart" in drafting and "eagle3" in drafting:
        by = {r["method"]: r for r in rows}
        out_summary["dart_over_eagle3"] = by["dart"]["speedup"] / by["eagle3"]["speedup"]
    config = {**e2e["config"], "methods": ",".join(methods), "draft_reps": draft_reps}
    return {"mode": "compare", "config": config, "rows": rows, "summary": out_summary, "prompt_rows": prompt_rows,
            "e2e_summary": summary}


def format_compare(result: dict[str, Any], fmt) -> list[str]:
    """The method table's extra lines: per-category speedups and DART's speedup over EAGLE-3's."""
    summary = result["summary"]
    lines = []
    for cat, speedups in summary["per_category_speedup"].items():
        lines.append(f"  {cat}: " + ", ".join(f"{m} {fmt(v)}x" for m, v in speedups.items()))
    if "dart_over_eagle3" in summary:
        ratio = summary["dart_over_eagle3"]
        lines.append(f"DART's speedup / EAGLE-3's: {fmt(ratio)} ({(ratio - 1) * 100:+.0f}%; the paper reports about "
                     f"+30%, up to +65% on code, on Qwen3 with GPUs)")
    return lines
