"""Benchmarks for dart_jax: `python -m dart_jax.bench MODE [options]`.

Modes
  e2e      DART against plain autoregressive decoding on the same model and prompts:
           tokens/s, speedup, mean accepted length τ, accepted-length histogram.
  batch    DART (continuous batching) against batched autoregressive decoding at batch
           sizes 1, 2, 4, 8, 16: tokens/s and speedup at each.
  compare  DART, EAGLE-3 and plain decoding side by side on one target: tokens/s, speedup,
           τ, acceptance per depth, drafting time per step, output equality.
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

# This module (the --help text above) holds the command's options, and only argparse and light names:
# a bad flag or value is refused, and --help answered, before jax loads.

import argparse
import time

from dart_jax.api.options import DTYPE_CHOICES, MAX_DEVICE_STEPS, add_backend_flags, device_steps, tree_size

# what --clock picks: wall time, or this process's CPU time (steadier on a machine shared with
# other work, but it counts every thread, so only for single-threaded host code)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CORPORA = ("zipf", "phrases")  # --corpus: the synthetic corpora of the host modes (dart_jax.bench.host)


def _common(p: argparse.ArgumentParser, *, reps: int, warmup: int) -> None:
    p.add_argument("--reps", type=int, default=reps, help=f"timed repetitions; medians are reported (default {reps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed runs first, for compilation (default {warmup})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout instead of a table")
    p.add_argument("--output", metavar="FILE",
                   help="also write the JSON results to FILE (e2e --force-tau: the rows so far to FILE.partial after "
                        "each row, removed at the end)")
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


def _model_options(p: argparse.ArgumentParser, *, demo_workload: bool = False) -> None:
    """The options that choose the model and the prompts; `demo_workload`: bench compare's defaults
    (`bench.cli.demo_workload`: the SmolLM2 demo's held-out prompts at 128 new tokens)."""
    p.add_argument("--base", help="target checkpoint (hub id or folder); with --ckpt")
    p.add_argument("--ckpt", "--dart", dest="dart", metavar="CKPT",
                   help="DART head checkpoint (hub id or folder), as generate's --ckpt (--dart: the old spelling)")
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
                        "bfloat16) with --random-layers layers, its weights drawn on the device (no checkpoint "
                        "written; 'tiny' for a CPU check); for accelerators")
    p.add_argument("--prompts", help="a JSONL file with one {\"prompt\": ..., \"category\": ...} per line "
                                     + ("(default: on the SmolLM2 demo its 20 held-out prompts, the first 10 of each "
                                        "category of dart_jax/demo/smollm2/prompts_eval.jsonl; else the shipped "
                                        "dart_jax/data/prompts.jsonl)" if demo_workload else
                                        "(default: the shipped dart_jax/data/prompts.jsonl)"))
    p.add_argument("--categories", help="comma-separated categories to keep (default: all)")
    p.add_argument("--limit", type=int, help="at most this many prompts per category")
    p.add_argument("--max-new-tokens", type=int, default=None if demo_workload else 64,
                   help="tokens to generate per prompt " + ("(default: 128 on the SmolLM2 demo's held-out prompts, else "
                                                            "64)" if demo_workload else "(default 64)"))
    p.add_argument("--max-length", type=int, default=2048, help="prompt + generation limit (default 2048)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--keep", type=tree_size, help="tree size (nodes besides the root) or 'auto' (per-step choice "
                                                  "by measured speed); default: the model's default, auto")
    p.add_argument("--device-steps", type=device_steps, default=0, metavar="N",
                   help="DART runs N steps per device call, its trees searched on the device (needs a fixed --keep); "
                        f"default 0: one device call a step, the host searching; at most {MAX_DEVICE_STEPS}")
    add_backend_flags(p, fixed=True)
    p.add_argument("--no-chat", action="store_true", help="feed the prompts without the chat template")


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
    p.add_argument("--force-tau", metavar="T[,T…]",
                   help="force DART's mean accepted length to T (e.g. 2,3,3.61,5) on any weights, random ones "
                        "included: each tree is made to hold plain greedy decoding's next D tokens, D drawn per step "
                        "(geometric, capped at the tree depth, mean T - 1); same tree size, verify and step. Rows per "
                        "(T, batch); needs a fixed --keep and greedy decoding; with --device-steps N the trees are "
                        "edited on the device, inside the loop (see dart_jax/bench/forced.py)")
    p.add_argument("--force-batches", default="1", metavar="B[,B…]",
                   help="with --force-tau: batch sizes, DART through a pool of B slots against batched plain "
                        "decoding (default 1)")
    p.add_argument("--overlap", action="store_true",
                   help="with --force-tau at batch 2 or more: also run each pool overlapped (the host searches half "
                        "the rows' trees while the device verifies the other half; Batcher(overlap=True)) and add "
                        "its tokens/s and gain over the default pool to the row")
    _common(p, reps=1, warmup=1)

    p = sub.add_parser("compare", help="DART vs EAGLE-3 vs plain decoding: speedup, τ, acceptance, drafting time",
                       description="Generate every prompt with DART, EAGLE-3 and plain decoding (the device loop) of "
                                   "the same target in one run; one row per method: tokens/s, speedup over plain "
                                   "decoding (median, min, max, per category), τ, acceptance per draft depth, the "
                                   "drafter's device time per step (timed alone), the host tree search per step, and "
                                   "how many outputs equal plain decoding. Default: the SmolLM2 demo with the DART and "
                                   "EAGLE-3 heads we trained for it, on its 20 held-out prompts (10 code, 10 chat) "
                                   "at 128 new tokens; --prompts, --limit and --max-new-tokens change that.")
    _model_options(p, demo_workload=True)
    p.add_argument("--methods", default="dart,eagle3,ar", help="methods, comma-separated (default dart,eagle3,ar)")
    p.add_argument("--eagle3", metavar="PATH", help="EAGLE-3 head (hub id or folder); default: the demo's own")
    p.add_argument("--eagle3-total-token", type=int, help="EAGLE-3 tree size, root included (default 60; the SmolLM2 "
                                                          "demo on a CPU: 8)")
    p.add_argument("--eagle3-depth", type=int, help="EAGLE-3 draft steps (default 7; the demo on a CPU: 2)")
    p.add_argument("--eagle3-top-k", type=int, help="EAGLE-3 children per expanded node (default 10; demo on a CPU: 8)")
    p.add_argument("--draft-reps", type=int, default=20, help="timed calls of each drafter alone (default 20)")
    p.add_argument("--neighbours", type=int, default=0, metavar="N",
                   help="run beside N busy processes (one core each: compute and memory sweeps), as on a machine "
                        "shared with other work; 0 (default): none")
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
    p.add_argument("--draft-rows", type=int, default=8, help="draft rows d (the depth; default 8)")
    p.add_argument("--topk", "--tree-topk", dest="topk", type=int, default=25, help="candidates per row (default 25)")
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
    p.add_argument("--keeps", "--budgets", dest="budgets", default="1,8,16,32,60",
                   help="tree sizes (nodes besides the root), comma-separated, as search's --keeps (--budgets: the old "
                        "spelling; default 1,8,16,32,60)")
    p.add_argument("--context", type=int, default=512, help="tokens already in the KV cache (default 512)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="default: float32 on CPU, bfloat16 elsewhere")
    add_backend_flags(p, fixed=True)
    _common(p, reps=10, warmup=2)
    return parser

