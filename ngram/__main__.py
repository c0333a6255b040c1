"""``python -m dart_jax.ngram {build,convert,info,query,merge,reduce}``: n-gram trie tools."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .trie import Trie

_ID_KEYS = ("input_ids", "token_ids", "tokens", "ids")
_SUFFIXES = (".jsonl", ".npy", ".txt")


def _load_tokenizer(path):
    if path is None:
        return None
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"--tokenizer {path!r} is not a folder; pass a local folder with tokenizer.json "
            "(e.g. the target model's folder)."
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def _input_files(paths: list[str]) -> list[Path]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in _SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"Input {str(p)!r} does not exist.")
    if not files:
        raise FileNotFoundError(f"No {'/'.join(_SUFFIXES)} files in {paths}.")
    return files


def _sequences(files: list[Path], tokenizer, text_key: str, eos: int | None) -> Iterator[list[int]]:
    """Token-id sequences of every input, each followed by ``eos`` when given."""
    tail = [] if eos is None else [eos]

    def encode(text, where):
        if tokenizer is None:
            raise ValueError(f"{where} holds text; pass --tokenizer FOLDER to tokenize it.")
        # like the reference builder: special tokens as the tokenizer adds them, then EOS
        return list(tokenizer.encode(text, add_special_tokens=True))

    for path in files:
        if path.suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
            if arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(f"{path}: expected a 1-D or 2-D integer array of token ids; got {arr.dtype} {arr.shape}.")
            for row in arr.reshape(-1, arr.shape[-1]) if arr.ndim == 2 else [arr]:
                yield list(row.tolist()) + tail
        elif path.suffix == ".txt":
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        yield encode(line.rstrip("\n"), f"{path}:{n}") + tail
        else:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n} is not valid JSON ({e}).") from None
                    if isinstance(item, dict):
                        key = next((k for k in _ID_KEYS if k in item), None)
                        if key is not None:
                            item = item[key]
                        elif text_key in item:
                            item = encode(item[text_key], f"{path}:{n}")
                        else:
                            raise ValueError(
                                f"{path}:{n} has none of the keys {list(_ID_KEYS) + [text_key]}; "
                                "use --text-key to name the text field."
                            )
                    elif isinstance(item, str):
                        item = encode(item, f"{path}:{n}")
                    if not isinstance(item, list) or not all(isinstance(t, int) for t in item):
                        raise ValueError(f"{path}:{n}: expected a list of integer token ids.")
                    yield item + tail


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"Expected token ids separated by commas or spaces; got {text!r}.") from None


def cmd_build(args):
    tokenizer = _load_tokenizer(args.tokenizer)
    eos = args.eos
    if eos is None and tokenizer is not None and not args.no_eos:
        eos = tokenizer.eos_token_id
    seqs = _sequences(_input_files(args.inputs), tokenizer, args.text_key, None if args.no_eos else eos)
    trie = Trie.build(seqs, order=args.order, chunk_tokens=args.chunk_tokens, progress=True)
    if args.reduce is not None:
        trie = trie.reduce(args.reduce)
    trie.save(args.output)
    print(f"wrote {args.output}: {trie.num_nodes} nodes, order {trie.order}")


def cmd_convert(args):
    trie = Trie.from_reference(args.input, args.output, chunk_bytes=args.chunk_mb << 20, progress=True)
    print(f"wrote {args.output}: {trie.num_nodes} nodes, order {trie.order}")


def cmd_info(args):
    trie = Trie.load(args.trie, verify=args.verify)
    token, freq, _ = trie.arrays()
    info = {
        "path": args.trie,
        "order": trie.order,
        "num_nodes": trie.num_nodes,
        "nodes_per_depth": trie.level_sizes(),
        "root_freq": int(freq[0]),
        "file_bytes": os.path.getsize(args.trie),
        "bytes_per_node": round(os.path.getsize(args.trie) / trie.num_nodes, 3),
        "verified": args.verify,
    }
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:>16}: {v}")


def cmd_query(args):
    trie = Trie.load(args.trie)
    tokenizer = _load_tokenizer(args.tokenizer)
    if args.text is not None:
        if tokenizer is None:
            raise ValueError("--text needs --tokenizer FOLDER.")
        context = list(tokenizer.encode(args.text, add_special_tokens=False))
    else:
        context = _parse_ids(args.context or "")
    if args.tokens is not None:
        candidates = _parse_ids(args.tokens)
    else:
        candidates = trie.continuations(context, args.top)
    probs, lens = trie.probability(context, candidates)
    rows = [
        {"token": int(t), "prob": float(p), "matched_len": int(m)}
        | ({"text": tokenizer.decode([int(t)])} if tokenizer is not None else {})
        for t, p, m in zip(candidates, probs, lens)
    ]
    if args.json:
        print(json.dumps({"context": context, "results": rows}))
        return
    print(f"context {context}")
    for r in rows:
        text = f"  {r['text']!r}" if "text" in r else ""
        print(f"{r['token']:>10}  p={r['prob']:.6f}  matched={r['matched_len']}{text}")


def cmd_merge(args):
    tries = [Trie.load(p) for p in args.inputs]
    merged = tries[0]
    for t in tries[1:]:
        merged = merged.merge(t)
    merged.save(args.output)
    print(f"wrote {args.output}: {merged.num_nodes} nodes, order {merged.order}")


def cmd_reduce(args):
    reduced = Trie.load(args.input).reduce(args.threshold)
    reduced.save(args.output)
    print(f"wrote {args.output}: {reduced.num_nodes} nodes, order {reduced.order}")


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dart_jax.ngram",
        description="Build, convert, inspect and query the n-gram tries used by DART's tree search.",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser(
        "build",
        help="count n-grams of a corpus into a trie",
        description=(
            "Count every window of ORDER tokens of each sequence (docs/spec.md §5). Inputs: .jsonl files "
            f"(each line a list of token ids, an object with one of {list(_ID_KEYS)}, or text under "
            "--text-key / a JSON string, tokenized with --tokenizer), .npy files (1-D: one sequence, "
            "2-D: one per row), .txt files (one document per line, needs --tokenizer), or folders "
            "of them. With --tokenizer each sequence gets the tokenizer's EOS appended, as the "
            "reference builder does."
        ),
    )
    b.add_argument("inputs", nargs="+", help="input files or folders")
    b.add_argument("-o", "--output", required=True, help="output trie file (dart_jax format)")
    b.add_argument("--order", type=int, default=3, help="n-gram order (default 3, the reference's)")
    b.add_argument("--tokenizer", help="local tokenizer folder for text inputs")
    b.add_argument("--text-key", default="text", help="JSON field holding text (default: text)")
    b.add_argument("--eos", type=int, help="token id appended to every sequence (default: the tokenizer's EOS)")
    b.add_argument("--no-eos", action="store_true", help="append nothing to the sequences")
    b.add_argument("--chunk-tokens", type=int, default=1 << 24,
                   help="tokens counted per chunk before merging (bounds memory; default 16M)")
    b.add_argument("--reduce", type=int, metavar="T", help="drop n-grams seen fewer than T times")
    b.set_defaults(func=cmd_build)

    c = sub.add_parser(
        "convert",
        help="convert a reference (C++) .trie file",
        description="Stream a reference .trie (docs/spec.md §6) into the dart_jax format, in bounded memory "
        "(scratch files next to OUTPUT, about 40 bytes per node).",
    )
    c.add_argument("input", help="reference .trie file")
    c.add_argument("output", help="output trie file (dart_jax format)")
    c.add_argument("--chunk-mb", type=int, default=64, help="read size in MiB (default 64)")
    c.set_defaults(func=cmd_convert)

    i = sub.add_parser("info", help="describe a trie file", description="Print the order, node counts and size of a trie.")
    i.add_argument("trie")
    i.add_argument("--verify", action="store_true", help="check the whole structure (reads every node)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=cmd_info)

    q = sub.add_parser(
        "query",
        help="n-gram probabilities after a context",
        description="Print P(token | context) and the matched context length (docs/spec.md §5) for --tokens, "
        "or for the --top most frequent continuations of the longest matching context suffix.",
    )
    q.add_argument("trie")
    q.add_argument("--context", help="context token ids, e.g. '12,873'")
    q.add_argument("--text", help="context as text (needs --tokenizer)")
    q.add_argument("--tokens", help="candidate token ids (default: the top continuations)")
    q.add_argument("--top", type=int, default=10, help="number of continuations to list (default 10)")
    q.add_argument("--tokenizer", help="local tokenizer folder, to encode --text and decode results")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=cmd_query)

    m = sub.add_parser("merge", help="add tries together", description="Merge tries built on parts of a corpus (frequencies add).")
    m.add_argument("output")
    m.add_argument("inputs", nargs="+")
    m.set_defaults(func=cmd_merge)

    r = sub.add_parser("reduce", help="prune rare n-grams", description="Drop children seen fewer than THRESHOLD times (reference reduce).")
    r.add_argument("input")
    r.add_argument("output")
    r.add_argument("--threshold", type=int, required=True)
    r.set_defaults(func=cmd_reduce)
    return ap


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
