"""Benchmarks for dart_jax: `python -m dart_jax.bench MODE [options]`.

Modes
  e2e      DART against plain autoregressive decoding on the same model and prompts:
           tokens/s, speedup, mean accepted length τ, accepted-length histogram.
  batch    DART (continuous batching) against batched autoregressive decoding at batch
           sizes 1, 2, 4, 8, 16: tokens/s and speedup at each.
  phases   where a DART step spends its time (verify+draft device time, top-k transfer,
           tree search, host overhead), as per-step medians and shares.
  search   the n-gram tree search alone, over tree sizes (keep) and beam widths, one tree per
           call or batched.
  ngram    n-gram trie build and load time, bytes per node, query latency, and conversion
           from the reference format.
  shapes   the target's verify step for tree budgets 1, 8, 16, 32, 60 against a 1-token decode
           call and a token of plain decoding's device loop, on a Qwen3 shape with random
           weights (no checkpoint needed).

Every mode prints a table, or JSON with --json (the keys are documented in
benchmarks/README.md), and draws a figure with --plot out.png (needs matplotlib).
Timings exclude warm-up (compilation) and are medians over --reps repetitions.
`python -m dart_jax.bench MODE --help` lists a mode's options.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from dart_jax.api.generate import tree_size
from dart_jax.bench.e2e import ModelSet, Workload, run_batch, run_e2e, run_phases
from dart_jax.bench.host import CORPORA, run_ngram, run_search
from dart_jax.bench.shapes import run_shapes
from dart_jax.bench.util import CLOCKS, meta, parse_int_list
from dart_jax.errors import InputError, cli_boundary
from dart_jax.ngram import MAX_ORDER

# the columns each mode's table shows, in order (the JSON rows hold these and possibly more)
TABLE_COLUMNS = {
    "e2e": ["id", "category", "new_tokens", "ar_tok_s", "dart_tok_s", "speedup", "tau", "eagle3_tok_s",
            "eagle3_speedup", "eagle3_tau"],
    "phases": ["phase", "median_ms", "share"],
    "batch": ["batch", "new_tokens", "ar_tok_s", "dart_tok_s", "speedup", "tau"],
    "search": ["keep", "beam", "median_ms", "min_ms", "max_ms", "nodes", "batch", "ms_per_tree"],
    "ngram": ["num_nodes", "order", "load_ms", "query_us", "kernel_query_us", "kernel_query_us_hot",
              "kernel_query_us_root_table", "kernel_query_us_hot_root_table", "bytes_per_node_file",
              "bytes_per_node_memory", "hit_rate", "convert_mb_per_s"],
    "shapes": ["kind", "budget", "tokens", "median_ms", "min_ms", "ratio_to_decode", "ratio_to_plain"],
}


def _common(p: argparse.ArgumentParser, *, reps: int, warmup: int) -> None:
    p.add_argument("--reps", type=int, default=reps, help=f"timed repetitions; medians are reported (default {reps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed runs first, for compilation (default {warmup})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout instead of a table")
    p.add_argument("--output", metavar="FILE", help="also write the JSON results to FILE")
    p.add_argument("--plot", metavar="PNG", help="draw the results to this image (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _clock_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="time with the wall clock (default) or with this process's CPU time, steadier on a machine "
                        "shared with other work (the host modes run single-threaded Numba code)")


def _trie_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trie", help="a trie in dart_jax's format (`python -m dart_jax.ngram build`); "
                                  "default: a synthetic trie built from random Zipf-distributed text")
    p.add_argument("--reference-trie", help="a .trie file of the reference release instead")
    p.add_argument("--corpus", choices=list(CORPORA), default="zipf",
                   help="the synthetic corpus: Zipf-distributed ids cut into sequences of 256 (default), or "
                        "text-shaped sequences of about 600 tokens that repeat a bank of phrases and end in EOS")
    p.add_argument("--corpus-tokens", type=int, default=200_000, help="size of the synthetic corpus (default 200000)")
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary of the synthetic data (default: Qwen3's 151936)")
    p.add_argument("--order", type=int, default=3, help="order of the synthetic trie (default 3)")


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", help="target checkpoint (hub id or folder); with --dart")
    p.add_argument("--dart", help="DART head checkpoint (hub id or folder)")
    p.add_argument("--ngram", help="n-gram trie (hub id, folder or file)")
    p.add_argument("--small-ngram", action="store_true", help="use the hub repo's small.trie")
    p.add_argument("--demo", choices=["smollm2", "tiny"], default="smollm2",
                   help="without --dart or --random: the demo set measured (smollm2 = SmolLM2-135M-Instruct with our "
                        "DART head, the default; tiny = the embedded toy)")
    p.add_argument("--random", action="store_true",
                   help="build a tiny random target + head + trie in a temporary folder (timing only; τ ≈ 1)")
    p.add_argument("--random-layers", type=int, default=4, help="layers of the random target (default 4)")
    p.add_argument("--random-hidden", type=int, default=64, help="hidden size of the random target (default 64)")
    p.add_argument("--random-shape", metavar="NAME",
                   help="give the random target a known Qwen3 shape (e.g. Qwen3-8B: widths, heads, full vocabulary, "
                        "bfloat16) with --random-layers layers; for accelerators")
    p.add_argument("--prompts", help="a JSONL file with one {\"prompt\": ..., \"category\": ...} per line "
                                     "(default: the shipped dart_jax/data/prompts.jsonl)")
    p.add_argument("--categories", help="comma-separated categories to keep (default: all)")
    p.add_argument("--limit", type=int, help="at most this many prompts per category")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + generation limit (default 2048)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--keep", type=tree_size, help="tree budget (nodes besides the root) or 'auto' (per-step choice "
                                                  "by measured speed); default: the model's default, auto")
    p.add_argument("--no-chat", action="store_true", help="feed the prompts without the chat template")
    p.add_argument("--mesh", metavar="SPEC", help="shard the model over devices: 'model=4' or 'data=2,model=4' "
                                                  "(default: one device)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dart_jax.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True, metavar="MODE")

    p = sub.add_parser("e2e", help="DART vs autoregressive: tokens/s, speedup, τ",
                       description="Generate every prompt with DART and with plain autoregressive decoding of the "
                                   "same target; report tokens/s (wall clock, prefill included), the speedup, the "
                                   "mean accepted length τ and the accepted-length histogram, per prompt and per "
                                   "category. Random weights give timings only (τ ≈ 1); τ needs a trained head.")
    _model_options(p)
    p.add_argument("--methods", default="dart,ar",
                   help="decoders to compare, comma-separated: dart, ar and optionally eagle3 (default dart,ar)")
    p.add_argument("--eagle3", metavar="PATH",
                   help="EAGLE-3 head (hub id or folder) for --methods eagle3; default over the demo or random target: "
                        "a random head (timing only)")
    _common(p, reps=1, warmup=1)

    p = sub.add_parser("phases", help="per-step time of each phase of a DART step",
                       description="Generate the prompts with DART and split each decoding step into its phases "
                                   "(verify+draft device time, top-k transfer, tree search, host overhead); "
                                   "report per-step medians and each phase's share of the step.")
    _model_options(p)
    _common(p, reps=1, warmup=1)

    p = sub.add_parser("batch", help="DART vs batched autoregressive decoding at several batch sizes",
                       description="For each batch size B, decode B prompts (cycling through the prompt file) with "
                                   "DART in a continuous-batching pool of B slots and with batched autoregressive "
                                   "decoding of the same target; report tokens/s (all new tokens over the batch's "
                                   "wall time), the speedup and τ at each B.")
    _model_options(p)
    p.add_argument("--batches", default="1,2,4,8,16", help="batch sizes, comma-separated (default 1,2,4,8,16)")
    _common(p, reps=1, warmup=1)

    p = sub.add_parser("search", help="tree search alone vs tree size and beam",
                       description="Time dart_jax.ngram.build_tree (build_tree_batch with --batch) on random draft "
                                   "candidates (Zipf-distributed ids, softmax of random sorted logits) for every "
                                   "(keep, beam) pair.")
    p.add_argument("--keeps", default="8,16,32,60", help="tree sizes, comma-separated (default 8,16,32,60)")
    p.add_argument("--beams", default="5,10,20", help="beam widths, comma-separated (default 5,10,20)")
    p.add_argument("--draft-length", type=int, default=8, help="draft rows d (default 8)")
    p.add_argument("--topk", type=int, default=25, help="candidates per row (default 25)")
    p.add_argument("--samples", type=int, default=16, help="distinct random inputs cycled through (default 16)")
    p.add_argument("--no-ngram", action="store_true", help="search on the logits alone (no trie)")
    p.add_argument("--ngram-weight", type=float, default=0.5, help="weight of the n-gram term (default 0.5)")
    p.add_argument("--batch", type=int, default=1,
                   help="time build_tree_batch on this many inputs per call (rows add batch and ms_per_tree); "
                        "default 1: build_tree")
    p.add_argument("--threads", type=int, help="Numba threads for --batch (default: Numba's)")
    _trie_options(p)
    _clock_option(p)
    _common(p, reps=30, warmup=3)

    p = sub.add_parser("ngram", help="trie load time, bytes/node, query latency",
                       description="Measure an n-gram trie: build and save time (synthetic), load time, bytes per "
                                   "node (file and arrays), per-query latency through Trie.probability and through "
                                   "the Numba kernel called from compiled code; optionally the kernel through the "
                                   "root table and over repeated contexts, and the conversion from the reference "
                                   "format.")
    _trie_options(p)
    p.add_argument("--queries", type=int, default=2000, help="queries per measurement (default 2000)")
    p.add_argument("--candidates", type=int, default=25, help="candidate tokens per query (default 25)")
    p.add_argument("--hot-contexts", type=int, metavar="N",
                   help="also time the kernel with the queries cycling over N contexts, as a decoding step "
                        "queries a few related contexts (kernel_query_us_hot)")
    p.add_argument("--root-table", action="store_true",
                   help="also time the kernel with the root table (token → depth-1 node) that the tree search "
                        "uses, and the table's size and build time")
    p.add_argument("--convert", action="store_true",
                   help="also time the conversion from the reference format (Trie.from_reference) of the trie "
                        "written in that format, or of --reference-trie")
    _clock_option(p)
    _common(p, reps=5, warmup=1)

    p = sub.add_parser("shapes", help="verify step vs decode step on a model shape (random weights)",
                       description="Time the target's verify step (root + BUDGET tree nodes against a cache of "
                                   "--context tokens, taps included) for each budget, and a 1-token decode step, "
                                   "with random weights of a known Qwen3 shape. Shapes: "
                                   "Qwen3-0.6B, Qwen3-1.7B, Qwen3-4B, Qwen3-8B, Qwen3-14B, Qwen3-32B. "
                                   "Use --tiny, or --layers/--vocab to cut a large shape down for a CPU.")
    p.add_argument("--model", help="known shape name (default Qwen3-8B)")
    p.add_argument("--config", dest="config_path", help="a Qwen3 or Llama config.json (or its folder) instead")
    p.add_argument("--tiny", action="store_true", help="a tiny shape that runs in seconds on a CPU")
    p.add_argument("--layers", type=int, help="cut the depth to N layers")
    p.add_argument("--vocab", type=int, help="cut the vocabulary to N tokens")
    p.add_argument("--budgets", default="1,8,16,32,60", help="tree budgets (default 1,8,16,32,60)")
    p.add_argument("--context", type=int, default=512, help="tokens already in the KV cache (default 512)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: float32 on CPU, bfloat16 elsewhere")
    p.add_argument("--mesh", metavar="SPEC", help="shard weights and cache over devices: 'model=4' or "
                                                  "'data=2,model=4' (default: one device)")
    _common(p, reps=10, warmup=2)
    return parser


# ngram mode: the synthetic vocabulary's ids fill a Zipf table (8 bytes each) and must be trie token ids
NGRAM_MAX_VOCAB = 1 << 24


def check_ngram_args(args: argparse.Namespace) -> None:
    """The ranges of the synthetic trie's options (modes ngram and search), before anything is built
    (the rest are checked where used)."""
    if not 2 <= args.vocab <= NGRAM_MAX_VOCAB:
        raise InputError(f"--vocab must be in [2, {NGRAM_MAX_VOCAB}] (ids of the synthetic corpus); got {args.vocab}.")
    if not 1 <= args.order <= MAX_ORDER:
        raise InputError(f"--order must be in [1, {MAX_ORDER}] (the n-gram length); got {args.order}.")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the mode chosen in parsed `args` and return its result dict (without `meta`)."""
    show = not args.no_progress
    common = dict(reps=args.reps, warmup=args.warmup, seed=args.seed, show_progress=show)
    if args.mode in ("search", "ngram"):
        check_ngram_args(args)
        trie = dict(trie_path=args.trie, reference_trie=args.reference_trie, corpus=args.corpus,
                    corpus_tokens=args.corpus_tokens, vocab=args.vocab, order=args.order, clock=args.clock)
        if args.mode == "search":
            return run_search(keeps=parse_int_list(args.keeps, name="--keeps"),
                              beams=parse_int_list(args.beams, name="--beams"), draft_length=args.draft_length,
                              topk=args.topk, no_ngram=args.no_ngram, ngram_weight=args.ngram_weight,
                              samples=args.samples, batch=args.batch, threads=args.threads, **trie, **common)
        return run_ngram(queries=args.queries, candidates=args.candidates, hot_contexts=args.hot_contexts,
                         root_table=args.root_table, convert=args.convert, **trie, **common)
    if args.mode == "shapes":
        return run_shapes(model=args.model, config_path=args.config_path, tiny=args.tiny, layers=args.layers,
                          vocab=args.vocab, budgets=parse_int_list(args.budgets, name="--budgets"),
                          context=args.context, batch=args.batch, dtype=args.dtype, mesh=args.mesh, **common)
    models = ModelSet(base=args.base, dart=args.dart, ngram=args.ngram, small_ngram=args.small_ngram,
                      random=args.random, random_layers=args.random_layers, random_hidden=args.random_hidden,
                      random_shape=args.random_shape, keep=args.keep, eagle3=getattr(args, "eagle3", None),
                      mesh=args.mesh, demo=args.demo)
    work = Workload(prompts=args.prompts, categories=args.categories, limit=args.limit,
                    max_new_tokens=args.max_new_tokens, max_length=args.max_length, temperature=args.temperature,
                    chat=not args.no_chat)
    if args.mode == "batch":
        return run_batch(models, work, batches=parse_int_list(args.batches, name="--batches"), **common)
    if args.mode == "e2e":
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
        result = {"mode": args.mode, "meta": meta(argv), **run(args)}
        text = json.dumps(result, indent=2)
        if args.output:
            write_text_atomic(Path(args.output), text + "\n")
        if args.plot:
            plot(result, args.plot)
        print(text if args.json else format_table(result))
    return cli_boundary(body, prog=f"dart_jax.bench {args.mode}")


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
