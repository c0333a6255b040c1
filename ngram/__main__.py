"""``python -m dart_jax.ngram {build,convert,compress,export,info,query,merge,reduce}``: n-gram trie tools.

Every command runs through ``dart_jax.errors.cli_boundary``: a bad file or argument ends as one
``error: …`` line and exit code 2. Numeric options are checked against their ranges before any
work starts, and output paths before anything is read.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dart_jax.errors import (FileFormatError, InputError, MissingFileError, check_text, cli_boundary,
                             load_tokenizer_folder, parse_json)

from ._atomic import check_apart, check_output, scratch_dir
from ._format import looks_like_reference, MAGIC as CSR_MAGIC
from ._reference import MAX_CHUNK_BYTES
from .compressed import MAGIC as COMPRESSED_MAGIC, compress, load_any
from .trie import MAX_ORDER, MAX_TOKEN_ID, Trie

_ID_KEYS = ("input_ids", "token_ids", "tokens", "ids")
_SUFFIXES = (".jsonl", ".npy", ".txt")


def _load_tokenizer(path):
    if path is None:
        return None
    if not os.path.isdir(path):
        raise MissingFileError(
            f"--tokenizer {path!r} is not a folder; pass a local folder with tokenizer.json "
            "(e.g. the target model's folder)."
        )
    return load_tokenizer_folder(path)


def _input_files(paths: list[str], suffixes=_SUFFIXES) -> list[Path]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in suffixes)
        elif p.is_file():
            files.append(p)
        else:
            raise MissingFileError(f"Input {str(p)!r} does not exist.")
    if not files:
        raise MissingFileError(f"No {'/'.join(suffixes)} files in {paths}; name the suffixes to read from folders "
                               "with --suffixes (e.g. --suffixes .py,.md).")
    return files


def _ids(item, where: str) -> list[int]:
    """A JSON list of token ids, checked (bools are not ids, and ids must fit the trie)."""
    if not isinstance(item, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in item):
        raise FileFormatError(where, "expected a list of integer token ids.")
    bad = [t for t in item if not 0 <= t <= MAX_TOKEN_ID]
    if bad:
        raise FileFormatError(where, f"token id {bad[0]} is outside [0, {MAX_TOKEN_ID}]; pass token ids from "
                                     "the tokenizer.")
    return item


def _load_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FileFormatError(path, f"not a readable .npy array ({e}).") from None
    if not isinstance(arr, np.ndarray) or arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.integer):
        raise FileFormatError(path, f"expected a 1-D or 2-D integer array of token ids; got "
                                    f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}.")
    if arr.size and (arr.min() < 0 or arr.max() > MAX_TOKEN_ID):
        raise FileFormatError(path, f"holds token ids outside [0, {MAX_TOKEN_ID}] ({arr.min()} .. {arr.max()}).")
    return arr


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            yield from enumerate(f, 1)
    except UnicodeDecodeError as e:
        raise FileFormatError(path, f"not UTF-8 text ({e.reason} at byte {e.start}).") from None


def _sequences(files: list[Path], tokenizer, text_key: str, eos: int | None) -> Iterator[list[int]]:
    """Token-id sequences of every input, each followed by ``eos`` when given."""
    tail = [] if eos is None else [eos]

    def encode(text, where):
        if not isinstance(text, str):
            raise FileFormatError(where, f"the text field holds {type(text).__name__}, not a string.")
        if tokenizer is None:
            raise InputError(f"{where} holds text; pass --tokenizer FOLDER to tokenize it.")
        check_text(text, where)
        # like the reference builder: special tokens as the tokenizer adds them, then EOS
        return list(tokenizer.encode(text, add_special_tokens=True))

    for path in files:
        if path.suffix == ".npy":
            arr = _load_npy(path)
            for row in arr.reshape(-1, arr.shape[-1]) if arr.ndim == 2 else [arr]:
                yield list(row.tolist()) + tail
        elif path.suffix == ".txt":
            for n, line in _text_lines(path):
                if line.strip():
                    yield encode(line.rstrip("\n"), f"{path}:{n}") + tail
        elif path.suffix != ".jsonl":  # any other file (source code, markdown, ...): one text document
            text = "".join(line for _, line in _text_lines(path))
            if text.strip():
                yield encode(text, str(path)) + tail
        else:
            for n, line in _text_lines(path):
                if not line.strip():
                    continue
                where = f"{path}:{n}"
                item = parse_json(line, where, "one JSON object, string or list of token ids a line.")
                if isinstance(item, dict):
                    key = next((k for k in _ID_KEYS if k in item), None)
                    if key is not None:
                        item = item[key]
                    elif text_key in item:
                        item = encode(item[text_key], where)
                    else:
                        raise FileFormatError(where, f"has none of the keys {list(_ID_KEYS) + [text_key]}; "
                                                     "use --text-key to name the text field.")
                elif isinstance(item, str):
                    item = encode(item, where)
                yield _ids(item, where) + tail


_MAX_FREQ = 2**31 - 1  # frequencies are int32
_MAX_CHUNK_MB = MAX_CHUNK_BYTES >> 20


def _parse_ids(text: str, flag: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise InputError(f"{flag} expects token ids separated by commas or spaces; got {text!r}.") from None
    bad = [t for t in ids if not 0 <= t <= MAX_TOKEN_ID]
    if bad:
        raise InputError(f"{flag} holds token id {bad[0]}, outside [0, {MAX_TOKEN_ID}].")
    return ids


def _check_range(flag: str, value, lo: int, hi: int | None = None, what: str = "") -> None:
    """InputError naming the flag and its valid range unless ``lo <= value <= hi`` (None is unset)."""
    if value is None or (value >= lo and (hi is None or value <= hi)):
        return
    valid = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise InputError(f"{flag} must be {'in ' if hi is not None else ''}{valid}{what}; got {value}.")


def _check_args(args) -> None:
    """Ranges of the numeric options of every command (before any work starts)."""
    if args.command == "build":
        _check_range("--order", args.order, 1, MAX_ORDER, " (the n-gram length; the reference uses 3)")
        _check_range("--chunk-tokens", args.chunk_tokens, 1)
        _check_range("--reduce", args.reduce, 1, _MAX_FREQ, " (a count: n-grams seen fewer times are dropped)")
        _check_range("--eos", args.eos, 0, MAX_TOKEN_ID, " (a token id)")
        check_output(args.output, "--output")
        check_apart(args.output, [*(("", path) for path in args.inputs), ("--tokenizer", args.tokenizer)],
                    "--output", inside_ok=True)  # a .trie is not among the --suffixes read
    elif args.command in ("convert", "compress", "export"):
        _check_range("--chunk-mb", args.chunk_mb, 1, _MAX_CHUNK_MB, " MiB")
        check_output(args.output, {"compress": "compressed trie output", "convert": "converted trie output",
                                   "export": "reference .trie output"}[args.command])
        if args.command != "export":  # export names the input trie itself in its own refusal
            check_apart(args.output, [("", args.input)])
    elif args.command == "query":
        _check_range("--top", args.top, 1)
    elif args.command == "reduce":
        _check_range("--threshold", args.threshold, 1, _MAX_FREQ, " (a count: n-grams seen fewer times are dropped)")
        check_output(args.output, "output")
        check_apart(args.output, [("", args.input)])
    elif args.command == "merge":
        check_output(args.output, "output")
        check_apart(args.output, [("", path) for path in args.inputs])


def cmd_build(args):
    tokenizer = _load_tokenizer(args.tokenizer)
    eos = args.eos
    if eos is None and tokenizer is not None and not args.no_eos:
        eos = tokenizer.eos_token_id
    suffixes = tuple(x if x.startswith(".") else "." + x for x in args.suffixes.split(",") if x)
    seqs = _sequences(_input_files(args.inputs, suffixes), tokenizer, args.text_key, None if args.no_eos else eos)
    trie = Trie.build(seqs, order=args.order, chunk_tokens=args.chunk_tokens, progress=True)
    if trie.num_nodes <= 1:
        raise InputError(f"no tokens in {', '.join(args.inputs)} (empty files, blank lines or empty id lists): "
                         "a trie needs at least one sequence; pass files that hold text or token ids.")
    if args.reduce is not None:
        trie = trie.reduce(args.reduce)
    trie.save(args.output)
    print(f"wrote {args.output}: {trie.num_nodes} nodes, order {trie.order}")


def cmd_convert(args):
    trie = Trie.from_reference(args.input, args.output, chunk_bytes=args.chunk_mb << 20, progress=True)
    print(f"wrote {args.output}: {trie.num_nodes} nodes, order {trie.order}")


def cmd_compress(args):
    """CSR or reference input (told apart by the magic number) -> compressed trie."""
    path = os.fspath(args.input)
    if not os.path.isfile(path):
        raise MissingFileError(f"No trie file at {path!r}; pass a trie written by `ngram build`/`convert` or a "
                               "reference .trie.")
    with open(path, "rb") as f:
        head = f.read(16)
    out = check_output(args.output, "compressed trie output")
    if head[:8] == COMPRESSED_MAGIC:
        raise InputError(f"{path} is already a compressed trie; pass a CSR trie or a reference .trie.")
    with contextlib.ExitStack() as stack:
        if head[:8] == CSR_MAGIC:
            trie = Trie.load(path)
            csr_bytes = os.path.getsize(path)
        elif looks_like_reference(head):  # converted to a CSR trie in a scratch folder beside the output
            scratch = os.path.join(stack.enter_context(scratch_dir(os.path.dirname(out))), "converted.trie")
            trie = Trie.from_reference(path, out=scratch, chunk_bytes=args.chunk_mb << 20, progress=True)
            csr_bytes = os.path.getsize(scratch)
        else:
            raise FileFormatError(path, "neither a dart_jax trie nor a reference .trie (unknown header); pass a file "
                                        "written by `ngram build`/`convert` or a reference .trie.")
        try:
            result = compress(trie, out)
        finally:
            del trie  # its memory maps closed before the scratch folder goes
    size = os.path.getsize(out)
    print(f"wrote {out}: {result.num_nodes} nodes, order {result.order}, {size} bytes "
          f"({size / result.num_nodes:.3f} bytes/node; CSR {csr_bytes / result.num_nodes:.3f})")


def cmd_export(args):
    """CSR or compressed input -> reference .trie (docs/spec.md §6.1)."""
    path = os.fspath(args.input)
    if not os.path.isfile(path):
        raise MissingFileError(f"No trie file at {path!r}; pass a trie written by `ngram build`, `convert` or "
                               "`compress`.")
    out = check_output(args.output, "reference .trie output")
    if os.path.exists(out) and os.path.samefile(path, out):
        raise InputError(f"the output {out!r} is the input trie itself; write the reference .trie to another name.")
    with open(path, "rb") as f:
        head = f.read(16)
    if head[:8] not in (CSR_MAGIC, COMPRESSED_MAGIC) and looks_like_reference(head):
        raise InputError(f"{path} is already a reference .trie; copy it as it is (or `ngram convert` it to ours).")
    trie = load_any(path)
    trie.to_reference(out, chunk_bytes=args.chunk_mb << 20)
    print(f"wrote {out}: {trie.num_nodes} nodes, order {trie.order}, {os.path.getsize(out)} bytes (reference .trie)")


def cmd_info(args):
    trie = load_any(args.trie, verify=args.verify)
    compressed = not isinstance(trie, Trie)
    info = {
        "path": args.trie,
        "format": "compressed" if compressed else "csr",
        "order": trie.order,
        "num_nodes": trie.num_nodes,
        "nodes_per_depth": trie.level_sizes(),
        "root_freq": int(trie.root_freq if compressed else trie.arrays()[1][0]),
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
    trie = load_any(args.trie)
    if not isinstance(trie, Trie) and args.tokens is None:
        trie = trie.to_csr()  # continuations list children: decode (small tries; pass --tokens for big ones)
    tokenizer = _load_tokenizer(args.tokenizer)
    if args.text is not None:
        if tokenizer is None:
            raise InputError("--text needs --tokenizer FOLDER.")
        context = list(tokenizer.encode(check_text(args.text, "--text"), add_special_tokens=False))
    else:
        context = _parse_ids(args.context or "", "--context")
    if args.tokens is not None:
        candidates = _parse_ids(args.tokens, "--tokens")
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
    b.add_argument("inputs", nargs="+", help="input files or folders. By suffix: .jsonl = one JSON value per line (a "
                   "list of ids, a string, or an object with input_ids/token_ids/tokens/ids or --text-key); .npy = "
                   "integer arrays; .txt = one text per line; any other file = one plain-text document (needs "
                   "--tokenizer)")
    b.add_argument("--suffixes", default=",".join(_SUFFIXES),
                   help="suffixes of the files read from folders, comma-separated (default .jsonl,.npy,.txt; "
                   "e.g. .py,.md for source trees)")
    b.add_argument("-o", "--output", required=True, help="output trie file (dart_jax format)")
    b.add_argument("--order", type=int, default=3, help=f"n-gram order, 1..{MAX_ORDER} (default 3, the reference's)")
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
        "(scratch files in a folder next to OUTPUT, about 37 bytes per node, removed at the end; OUTPUT "
        "appears only when complete).",
    )
    c.add_argument("input", help="reference .trie file")
    c.add_argument("output", help="output trie file (dart_jax format)")
    c.add_argument("--chunk-mb", type=int, default=64, help=f"read size in MiB, 1..{_MAX_CHUNK_MB} (default 64)")
    c.set_defaults(func=cmd_convert)

    z = sub.add_parser(
        "compress",
        help="write a compressed trie (3.5 bytes per node on a realistic corpus; same answers)",
        description="Compress a dart_jax CSR trie or a reference .trie (detected by its header) into the compressed "
        "format (docs/spec.md §6.3): same answers, a quarter of the bytes. Works in chunks (bounded memory); a "
        "reference .trie is first streamed into a CSR scratch file next to OUTPUT (removed at the end).",
    )
    z.add_argument("input", help="CSR trie (ngram build/convert) or reference .trie")
    z.add_argument("output", help="output file (compressed format)")
    z.add_argument("--chunk-mb", type=int, default=64, help=f"read size in MiB for a reference input, 1..{_MAX_CHUNK_MB}")
    z.set_defaults(func=cmd_compress)

    e = sub.add_parser(
        "export",
        help="write a trie in the reference's .trie format (for the PyTorch reference)",
        description="Write a dart_jax trie (CSR or compressed, detected by its header) as a reference .trie "
        "(docs/spec.md §6.1), which the PyTorch reference (fvliang/DART) loads as it is and `ngram convert` reads "
        "back to the same trie. Streamed in chunks (bounded memory; a progress bar for big tries); about 36 bytes "
        "per node; OUTPUT appears only when complete and may not be the input.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    e.add_argument("input", help="dart_jax trie (ngram build/convert/compress)")
    e.add_argument("output", help="output file (reference .trie)")
    e.add_argument("--chunk-mb", type=int, default=64, help=f"write size in MiB, 1..{_MAX_CHUNK_MB}")
    e.set_defaults(func=cmd_export)

    i = sub.add_parser("info", help="describe a trie file (either format)",
                       description="Print the format, order, node counts and size (bytes per node) of a trie.")
    i.add_argument("trie")
    i.add_argument("--verify", action="store_true", help="check every node: CSR files also their tokens (every load checks the children "
                   "table, the frequencies and the depth); compressed files every packed field, the counts and the "
                   "sibling order (a plain load checks only their header and per-level tables)")
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
    q.add_argument("--top", type=int, default=10, help="number of continuations to list, >= 1 (default 10)")
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
    r.add_argument("--threshold", type=int, required=True,
                   help="a count >= 1: children seen fewer times are dropped")
    r.set_defaults(func=cmd_reduce)
    return ap


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)

    def body() -> None:
        _check_args(args)
        args.func(args)

    return cli_boundary(body, prog="dart_jax.ngram")


if __name__ == "__main__":
    sys.exit(main())
