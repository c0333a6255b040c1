"""`python -m dart_jax.bench MODE`: run a benchmark and print its table or JSON. The modes and
their options are in `dart_jax.bench.options` (parsed before jax loads)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from dart_jax.api import methods as decoding_methods
from dart_jax.api.model import DEMO_DIR
from dart_jax.bench.compare import COLUMNS as COMPARE_COLUMNS, format_compare, run_compare
from dart_jax.bench.e2e import ModelSet, Workload, run_batch, run_e2e, run_phases
from dart_jax.bench.forced import parse_taus, run_forced
from dart_jax.bench.host import run_ngram, run_search
from dart_jax.bench.shapes import run_shapes
from dart_jax.bench.options import build_parser  # noqa: F401 (importable here, as before)
from dart_jax.bench.util import busy_neighbours, meta, parse_int_list
from dart_jax.errors import InputError, cli_boundary
from dart_jax.models.backend import use_compile_cache
from dart_jax.files import atomic_path
from dart_jax.ngram import MAX_ORDER

# the columns each mode's table shows, in order (the JSON rows hold these and possibly more)
TABLE_COLUMNS = {
    # DART's columns, then those of each other drafting method of dart_jax.api.methods
    "e2e": ["id", "category", "new_tokens", "ar_tok_s", "dart_tok_s", "speedup", "tau",
            *[f"{m.column}_{c}" for m in decoding_methods.all_methods() if m.drafts and m.name != "dart"
              for c in ("tok_s", "speedup", "tau")], "tau_asked", "batch", "tau_drawn", "force_ms_per_step", "overlap_tok_s", "overlap_gain"],
    "compare": COMPARE_COLUMNS,
    "phases": ["phase", "median_ms", "share"],
    "batch": ["batch", "new_tokens", "ar_tok_s", "dart_tok_s", "speedup", "tau"],
    "search": ["keep", "beam", "median_ms", "min_ms", "max_ms", "nodes", "batch", "ms_per_tree"],
    "ngram": ["num_nodes", "order", "load_ms", "query_us", "kernel_query_us", "kernel_query_us_hot",
              "kernel_query_us_root_table", "kernel_query_us_hot_root_table", "bytes_per_node_file",
              "bytes_per_node_memory", "hit_rate", "convert_mb_per_s"],
    "shapes": ["kind", "name", "gemms", "budget", "tokens", "median_ms", "min_ms", "ratio_to_decode", "ratio_to_plain"],
}


# ngram mode: the synthetic vocabulary's ids fill a Zipf table (8 bytes each) and must be trie token ids
NGRAM_MAX_VOCAB = 1 << 24


def demo_workload(args: argparse.Namespace) -> None:
    """`bench compare`'s workload where it was not given: on the SmolLM2 demo (no --ckpt, no
    --random) without --prompts, its 20 held-out prompts (the first 10 of each category of
    demo/smollm2/prompts_eval.jsonl) at 128 new tokens; elsewhere the shipped prompts at 64."""
    on_demo = args.dart is None and not args.random and (args.demo or "smollm2") == "smollm2"
    if on_demo and args.prompts is None:
        args.prompts = str(DEMO_DIR / "smollm2" / "prompts_eval.jsonl")
        args.limit = 10 if args.limit is None else args.limit
        args.max_new_tokens = 128 if args.max_new_tokens is None else args.max_new_tokens
    elif args.max_new_tokens is None:
        args.max_new_tokens = 64


def check_ngram_args(args: argparse.Namespace) -> None:
    """The ranges of the synthetic trie's options (modes ngram and search), before anything is built
    (the rest are checked where used)."""
    if not 2 <= args.vocab <= NGRAM_MAX_VOCAB:
        raise InputError(f"--vocab must be in [2, {NGRAM_MAX_VOCAB}] (ids of the synthetic corpus); got {args.vocab}.")
    if not 1 <= args.order <= MAX_ORDER:
        raise InputError(f"--order must be in [1, {MAX_ORDER}] (the n-gram length); got {args.order}.")


def run(args: argparse.Namespace, on_rows: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the mode chosen in parsed `args` and return its result dict (without `meta`); `on_rows`
    gets the result so far of a mode that has one (`e2e --force-tau`, after each row)."""
    show = not args.no_progress
    common = dict(reps=args.reps, warmup=args.warmup, seed=args.seed, show_progress=show)
    if args.mode in ("search", "ngram"):
        check_ngram_args(args)
        trie = dict(trie_path=args.trie, reference_trie=args.reference_trie, corpus=args.corpus,
                    corpus_tokens=args.corpus_tokens, vocab=args.vocab, order=args.order, clock=args.clock)
        if args.mode == "search":
            return run_search(keeps=parse_int_list(args.keeps, name="--keeps"),
                              beams=parse_int_list(args.beams, name="--beams"), draft_rows=args.draft_rows,
                              topk=args.topk, no_ngram=args.no_ngram, ngram_weight=args.ngram_weight,
                              samples=args.samples, batch=args.batch, threads=args.threads, **trie, **common)
        return run_ngram(queries=args.queries, candidates=args.candidates, hot_contexts=args.hot_contexts,
                         root_table=args.root_table, convert=args.convert, **trie, **common)
    if args.mode == "shapes":
        return run_shapes(model=args.model, config_path=args.config_path, tiny=args.tiny, layers=args.layers,
                          vocab=args.vocab, budgets=parse_int_list(args.budgets, name="--keeps"),
                          context=args.context, batch=args.batch, dtype=args.dtype, mesh=args.mesh,
                          verify_gemms=args.verify_gemms, attention=args.attention, **common)
    models = ModelSet(base=args.base, dart=args.dart, ngram=args.ngram, small_ngram=args.small_ngram,
                      random=args.random, random_layers=args.random_layers, random_hidden=args.random_hidden,
                      random_shape=args.random_shape, keep=args.keep, eagle3=getattr(args, "eagle3", None),
                      mesh=args.mesh, demo=args.demo, eagle3_total_token=getattr(args, "eagle3_total_token", None),
                      eagle3_depth=getattr(args, "eagle3_depth", None), eagle3_top_k=getattr(args, "eagle3_top_k", None),
                      device_steps=getattr(args, "device_steps", 0),
                      verify_gemms=getattr(args, "verify_gemms", "auto"), attention=getattr(args, "attention", "xla"))
    if args.mode == "compare":
        demo_workload(args)
    work = Workload(prompts=args.prompts, categories=args.categories, limit=args.limit,
                    max_new_tokens=args.max_new_tokens, max_length=args.max_length, temperature=args.temperature,
                    chat=not args.no_chat)
    if args.mode == "batch":
        return run_batch(models, work, batches=parse_int_list(args.batches, name="--batches"), **common)
    if args.mode == "compare":
        with busy_neighbours(args.neighbours):
            result = run_compare(models, work, methods=[m.strip() for m in args.methods.split(",") if m.strip()],
                                 draft_reps=args.draft_reps, **common)
        result["config"]["neighbours"] = args.neighbours
        return result
    if args.mode == "e2e" and args.force_tau:
        if args.plot:
            raise InputError("--plot draws no figure of --force-tau results; leave out --plot (the JSON has the rows)")
        batches = parse_int_list(args.force_batches, name="--force-batches")
        if args.overlap and max(batches) < 2:
            raise InputError(f"--overlap splits a pool of 2 or more rows in two halves, but --force-batches is "
                             f"{args.force_batches}: add a batch of 2 or more (e.g. --force-batches 1,4)")
        return run_forced(models, work, taus=parse_taus(args.force_tau), batches=batches, overlap=args.overlap,
                          on_rows=on_rows, **common)
    if args.mode == "e2e":
        if args.overlap:
            raise InputError("--overlap applies to the pools of --force-tau (--force-batches 2 or more); e2e without "
                             "--force-tau decodes one prompt at a time")
        return run_e2e(models, work, methods=[m.strip() for m in args.methods.split(",") if m.strip()], **common)
    return run_phases(models, work, **common)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _inline(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in d.items() if not isinstance(v, (dict, list)))


def format_table(result: dict[str, Any]) -> str:
    """The result as aligned text: the setup, a header line, the rows, then the summary."""
    rows = result["rows"]
    columns = [c for c in TABLE_COLUMNS[result["mode"]] if any(c in r for r in rows)]
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    hw = result["meta"]["hardware"]
    lines = [f"dart_jax.bench {result['mode']} — {hw['backend']} ({hw['device_kind']}, {hw['cpu_count']} host cores), "
             f"{result['meta']['date']}"]
    for key, value in result["config"].items():
        if isinstance(value, dict):
            lines.append(f"  {key}: {_inline(value)}")
        elif not isinstance(value, list):
            lines.append(f"  {key}: {value}")
    lines.append("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    if result["mode"] == "compare":
        return "\n".join(lines + format_compare(result, _fmt))
    lines.append("summary: " + _inline(result["summary"]))
    for key, value in result["summary"].items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            lines += [f"  {key} {name}: {_inline(v)}" for name, v in value.items()]
        elif isinstance(value, dict):
            lines.append(f"  {key}: {_inline(value)}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Draw the mode's figure to `path` (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib; install it with `pip install matplotlib` "
                         "(or `pip install 'dart-jax[plot]'`)") from None
    mode, rows, summary = result["mode"], result["rows"], result["summary"]
    if mode == "e2e":
        cats = summary["per_category"]
        names = list(cats)
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.bar(names, [cats[n]["speedup"] for n in names], color="tab:blue")
        a.axhline(1.0, color="grey", lw=0.8)
        a.set_title("speedup over autoregressive (median)")
        b.bar(names, [cats[n]["tau"] for n in names], color="tab:orange")
        b.set_title("mean accepted length τ")
    elif mode == "batch":
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        sizes = [r["batch"] for r in rows]
        a.plot(sizes, [r["dart_tok_s"] for r in rows], marker="o", label="DART")
        a.plot(sizes, [r["ar_tok_s"] for r in rows], marker="o", label="autoregressive")
        a.set_xscale("log", base=2)
        a.set_xlabel("batch size")
        a.set_ylabel("tokens/s")
        a.legend()
        b.plot(sizes, [r["speedup"] for r in rows], marker="o", color="tab:green")
        b.axhline(1.0, color="grey", lw=0.8)
        b.set_xscale("log", base=2)
        b.set_xlabel("batch size")
        b.set_title("speedup over autoregressive")
    elif mode == "phases":
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        rows = [r for r in rows if r["phase"] != "step_total"]
        names = [r["phase"] for r in rows]
        a.barh(names, [r["median_ms"] for r in rows], color="tab:green")
        a.set_xlabel("median ms per step")
        a.invert_yaxis()
        left = 0.0
        for r in rows:
            b.barh(["step"], [r["share"]], left=left, label=r["phase"])
            left += r["share"]
        b.set_xlim(0, 1)
        b.set_title("share of a step")
        b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    elif mode == "search":
        fig, a = plt.subplots(figsize=(6, 4))
        for beam in sorted({r["beam"] for r in rows}):
            sel = [r for r in rows if r["beam"] == beam]
            a.plot([r["keep"] for r in sel], [r["median_ms"] for r in sel], marker="o", label=f"beam {beam}")
        a.set_xlabel("tree size (keep)")
        a.set_ylabel("median ms")
        a.legend()
    elif mode == "ngram":
        fig, a = plt.subplots(figsize=(6, 4))
        r = rows[0]
        a.bar(["Trie.probability", "kernel"], [r["query_us"], r["kernel_query_us"]], color="tab:purple")
        a.set_ylabel(f"µs per query of {r['candidates_per_query']} candidates")
        a.set_title(f"{r['num_nodes']} nodes, load {r['load_ms']:.3g} ms")
    else:
        fig, a = plt.subplots(figsize=(6, 4))
        verify = [r for r in rows if r["kind"] == "verify"]
        a.plot([r["tokens"] for r in verify], [r["median_ms"] for r in verify], marker="o", label="verify step")
        a.axhline(summary["decode_ms"], color="grey", ls="--", label="1-token decode call")
        a.axhline(summary["plain_token_ms"], color="black", ls=":", label="plain decoding, per token (device loop)")
        a.set_xlabel("tokens per step (budget + root)")
        a.set_ylabel("median ms")
        a.set_title(result["config"]["shape"])
        a.legend()
    fig.suptitle(f"dart_jax.bench {mode} ({result['meta']['hardware']['backend']})", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> None:
        use_compile_cache()  # a later run of the same shapes loads its programs (figures leave compilation out)
        head = {"mode": args.mode, "meta": meta(argv)}
        partial = Path(f"{args.output}.partial") if args.output else None

        def keep_rows(so_far: dict[str, Any]) -> None:  # a run killed later keeps the rows it measured
            write_text_atomic(partial, json.dumps({**head, **so_far, "partial": True}, indent=2) + "\n")

        result = {**head, **run(args, on_rows=keep_rows if partial else None)}
        text = json.dumps(result, indent=2)
        if args.output:
            write_text_atomic(Path(args.output), text + "\n")
            partial.unlink(missing_ok=True)
        if args.plot:
            plot(result, args.plot)
        print(text if args.json else format_table(result))
    return cli_boundary(body, prog=f"dart_jax.bench {args.mode}")


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(os.path.abspath(path)) as tmp:
        Path(tmp).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
