"""Generate text with DART from the command line.

    python -m dart_jax.generate --ckpt fvliang/qwen4b-dart --small-ngram --prompt "Write a haiku"
    python -m dart_jax.generate                       # the embedded demo model, offline
    python -m dart_jax.generate --compare-ar --json   # DART vs plain decoding, machine-readable
    python -m dart_jax.generate --prompts in.jsonl --output out.jsonl --batch-size 8   # many prompts

Streams the text, then prints the mean accepted length τ and tokens/s (after a short warm-up
that compiles the shapes, so compilation is not timed). --compare-ar runs the same prompt through
plain autoregressive decoding and reports the speedup and, for greedy decoding, whether both
outputs are identical (they must be).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from tqdm.auto import tqdm

from dart_jax.decoding.batcher import pool_slots
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError, cli_boundary

from .model import DartModel

DEMO = Path(__file__).resolve().parent.parent / "demo"
DEMO_PROMPT = "What is speculative decoding?"
DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def add_model_options(ap: argparse.ArgumentParser) -> None:
    """The options that choose and shape the model (shared by `generate` and `serve`)."""
    group = ap.add_argument_group("model")
    group.add_argument("--ckpt", help="DART head: hub id or folder (default: the embedded demo model)")
    group.add_argument("--base", help="base Qwen3 model: hub id or folder (default: the published base of --ckpt)")
    group.add_argument("--ngram", help="n-gram trie: file, folder or hub id (default fvliang/dart-qwen3-ngram; "
                                       "'none' searches with the head's logits only)")
    group.add_argument("--small-ngram", action="store_true", help="use small.trie instead of full.trie")
    group.add_argument("--thinking", action="store_true",
                       help="let Qwen3 think (enable_thinking=True in the template)")
    group.add_argument("--keep", type=int, default=60, help="draft tree size (nodes besides the root)")
    group.add_argument("--beam-width", type=int, default=20)
    group.add_argument("--tree-topk", type=int, default=25, help="draft candidates per row for the tree search")
    group.add_argument("--draft-rows", type=int, default=None, help="head rows used by the tree search (default all)")
    group.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                       help="parameter/compute dtype (default float32 on CPU, bfloat16 on accelerators)")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dart_jax.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(ap)
    ap.add_argument("--prompt", help="the user message (chat-formatted unless --no-chat)")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, without the chat template")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=2048, help="prompt + generated tokens at most")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0, help="sampling top-k (0 = off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare-ar", action="store_true", help="also run plain autoregressive decoding")
    ap.add_argument("--no-warmup", action="store_true", help="time the first run, compilation included")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--prompts", metavar="FILE.jsonl",
                    help="decode many prompts in batches: one JSON object a line with 'prompt' (text or token ids) "
                         "or 'messages', an optional 'id', and optional per-line max_new_tokens, max_length, "
                         "temperature, top_p, top_k, seed (the command's options are the defaults)")
    ap.add_argument("--output", metavar="OUT.jsonl", help="with --prompts: where the results go, one line per prompt "
                                                          "in input order (default: standard output)")
    ap.add_argument("--batch-size", type=int, default=8,
                    help="with --prompts: sequences decoded together (a pool of this many slots, rounded up to a "
                         "power of two; a finished sequence's slot takes the next prompt at once)")
    return ap.parse_args(argv)


def _demo_paths() -> tuple[Path, Path, Path]:
    base, head, trie = DEMO / "base", DEMO / "head", DEMO / "ngram.trie"
    missing = [str(p) for p in (base / "config.json", base / "model.safetensors", head / "config.json",
                                head / "model.safetensors", trie) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"the embedded demo model is incomplete (missing {', '.join(missing)}); "
                                "pass a DART head with --ckpt (and --base / --ngram), or reinstall dart_jax.")
    return base, head, trie


def load_model(args) -> DartModel:
    """The model that `add_model_options`' values name (the embedded demo when --ckpt is absent)."""
    opts = dict(keep=args.keep, beam_width=args.beam_width, topk=args.tree_topk, draft_rows=args.draft_rows,
                enable_thinking=args.thinking)
    if args.ckpt is None:
        base, head, trie = _demo_paths()
        base = args.base or base
        ngram = args.ngram or trie
    else:
        base, head, ngram = args.base, args.ckpt, args.ngram
    return DartModel.from_pretrained(base, head, ngram, small_ngram=args.small_ngram, dtype=args.dtype, **opts)


_SETTING_NAMES = ("max_new_tokens", "max_length", "temperature", "top_p", "top_k", "seed")


def _settings(args) -> GenerationSettings:
    """The command's generation settings, checked once before anything is loaded; errors name the flags."""
    try:
        return GenerationSettings(*(getattr(args, name) for name in _SETTING_NAMES))
    except ValueError as e:
        message = str(e)
        for name in _SETTING_NAMES:
            message = message.replace(name, "--" + name.replace("_", "-"))
        raise ValueError(message) from None


def read_requests(path: str | Path, defaults: GenerationSettings) -> list[dict]:
    """The lines of a --prompts file as {'id', 'prompt', 'settings'}; a bad line is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts file {path} not found; pass a JSONL file with one "
                                "{\"prompt\": ...} or {\"messages\": [...]} object per line.")
    requests = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
                raise ValueError("expected an object with exactly one of 'prompt' and 'messages'")
            prompt = item.get("prompt", item.get("messages"))
            if not prompt or not isinstance(prompt, (str, list)):
                raise ValueError("'prompt' must be non-empty text or token ids, 'messages' a non-empty list")
            unknown = sorted(set(item) - {"prompt", "messages", "id", *_SETTING_NAMES})
            if unknown:
                raise ValueError(f"unknown field(s) {unknown}; known: prompt, messages, id, {', '.join(_SETTING_NAMES)}")
            settings = dataclasses.replace(defaults, **{k: item[k] for k in _SETTING_NAMES if k in item})
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{n}: {e}") from None
        requests.append({"id": item.get("id", n), "line": n, "prompt": prompt, "settings": settings})
    if not requests:
        raise ValueError(f"{path} holds no prompts.")
    return requests


def run_batch(args) -> list[dict]:
    """--prompts: decode every line, in batches of --batch-size, and write one result line per prompt."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}.")
    requests = read_requests(args.prompts, _settings(args))
    model = load_model(args)
    chat = not args.no_chat
    ids = []
    for request in requests:
        try:
            ids.append(model.encode(request["prompt"], chat))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{args.prompts}: prompt {request['line']}: {e}") from None
    pool = model.batcher(pool_slots(args.batch_size, len(ids)), max(r["settings"].max_length for r in requests))
    try:
        handles = []
        for request, prompt_ids in zip(requests, ids):
            try:
                handles.append(pool.submit(prompt_ids, request["settings"]))
            except ValueError as e:
                raise ValueError(f"{args.prompts}: prompt {request['line']}: {e}") from None
        with tqdm(total=len(handles), desc="generate", unit="prompt", file=sys.stderr) as bar:
            while pool.active:
                bar.update(sum(request.done for request, _, _ in pool.step()))
    finally:
        pool.close()
    lines = []
    for request, handle in zip(requests, handles):
        text = model.decode(handle.token_ids)
        lines.append({"id": request["id"], "text": text, "token_ids": list(handle.token_ids),
                      "finish_reason": handle.finish_reason, "accept_lengths": list(handle.stats.accept_lengths),
                      "tau": handle.stats.mean_accept_length, "new_tokens": handle.stats.new_tokens})
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    if args.output:
        out = Path(args.output)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    else:
        sys.stdout.write(text)
    return lines


def run(args, out=None) -> dict:
    out = out or sys.stdout
    settings = _settings(args)
    if args.prompt is not None and not args.prompt.strip():
        raise InputError("--prompt is empty; give the text to answer, or leave --prompt out for the default prompt.")
    model = load_model(args)
    prompt = args.prompt if args.prompt is not None else (DEMO_PROMPT if args.ckpt is None else DEFAULT_PROMPT)
    chat = not args.no_chat
    prompt_ids = model.encode(prompt, chat)
    if len(prompt_ids) >= args.max_length:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens but --max-length is {args.max_length}.")
    if not args.no_warmup:
        warm = dataclasses.replace(settings, max_new_tokens=min(4, args.max_new_tokens))
        model.generate(prompt_ids, chat=chat, settings=warm)
        if args.compare_ar:
            model.generate_ar(prompt_ids, chat=chat, settings=dataclasses.replace(settings, max_new_tokens=2))

    stats = Stats()
    pieces = []
    for piece, _ in model.stream(prompt_ids, chat=chat, stats=stats, settings=settings):
        pieces.append(piece)
        if not args.json:
            out.write(piece)
            out.flush()
    text = "".join(pieces)
    report = {"prompt": prompt, "text": text, "token_ids": list(stats.token_ids),
              "accept_lengths": list(stats.accept_lengths), "stats": stats.as_dict()}
    if args.compare_ar:
        ar = model.generate_ar(prompt_ids, chat=chat, settings=settings)
        report["ar"] = {"text": ar.text, "token_ids": ar.token_ids, "stats": ar.stats}
        ar_tps = ar.stats["tokens_per_s"]
        report["speedup"] = stats.tokens_per_s / ar_tps if ar_tps > 0 else None
        report["greedy_match"] = (ar.token_ids == report["token_ids"]) if args.temperature == 0 else None
    if args.json:
        out.write(json.dumps(report) + "\n")
    else:
        s = report["stats"]
        out.write(f"\n\n[DART] {s['new_tokens']} tokens in {s['steps']} steps, tau {s['tau']:.2f}, "
                  f"{s['tokens_per_s']:.1f} tokens/s (verify+draft {s['device_s']:.2f}s, tree search "
                  f"{s['tree_s']:.2f}s, host {s['host_s']:.2f}s)\n")
        if args.compare_ar:
            a = report["ar"]["stats"]
            speed = "n/a" if report["speedup"] is None else f"{report['speedup']:.2f}x"
            out.write(f"[AR]   {a['new_tokens']} tokens, {a['tokens_per_s']:.1f} tokens/s; speedup {speed}")
            if report["greedy_match"] is not None:
                out.write(f"; greedy outputs {'identical' if report['greedy_match'] else 'DIFFER'}")
            out.write("\n")
    return report


def main(argv=None) -> int:
    args = parse_args(argv)

    def body() -> None:
        run_batch(args) if args.prompts else run(args)
    return cli_boundary(body, prog="dart_jax.generate")


if __name__ == "__main__":
    sys.exit(main())
