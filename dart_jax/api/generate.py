"""The body of `python -m dart_jax.generate`: load the model, decode, print. Its usage and options
are in `dart_jax.api.options` (which parses them before jax loads)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import sys
import textwrap
import warnings
from pathlib import Path

import jax
from tqdm.auto import tqdm

from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError, MissingFileError, check_text, cli_boundary, read_json
from dart_jax.files import atomic_path
from dart_jax.models.backend import defaults_for
from dart_jax.models.multihost import is_writer

from .compiling import CompileNotice, CompileTimer, holding_notices, no_compile_cache, settle, use_compile_cache
from . import methods as decoding_methods
from .prompts import ROLES, check_messages, read_prompt_file  # noqa: F401 (ROLES: importable from here, as before)
from .config import DecodeConfig
from .options import (DEFAULT_BATCH_SIZE, FUSED_CHOICES, HelpFormatter, add_model_options, check_modes,  # noqa: F401
                      check_output, parse_args, tree_size)
from .model import (DEMO_CPU_MAX_KEEP, DEMO_DIR, DEMOS, METHODS, DartModel, demo_eagle3, demo_options, demo_paths,
                    length_notice)

DEMO = DEMO_DIR
# a held-out prompt of each demo (not in its head's training data nor in its trie)
DEMO_PROMPTS = {"smollm2": "Write a Python function that checks whether a string is a palindrome.",
                "tiny": "What is speculative decoding?"}
DEMO_PROMPT = DEMO_PROMPTS["tiny"]
DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def _demo_paths(name: str = "smollm2") -> tuple[Path, Path, Path]:
    return demo_paths(name, DEMO)


def load_model(args) -> DartModel:
    """The model that `add_model_options`' values name (the demo, --demo, when --ckpt is absent), its
    settings the DecodeConfig its flags give (`DecodeConfig.from_args`: the same fields as the
    Python API's). --no-compile-cache turns JAX's persistent compilation cache off first (the model
    turns it on, `compiling.use_compile_cache`)."""
    if getattr(args, "no_compile_cache", False):
        no_compile_cache()
    opts = {"config": DecodeConfig.from_args(args)}
    if getattr(args, "eagle3", None):
        opts["eagle3"] = args.eagle3
    if args.ckpt is None:
        base, head, trie = _demo_paths(getattr(args, "demo", "smollm2"))
        opts = demo_options(getattr(args, "demo", "smollm2"), opts)
        base = args.base or base
        ngram = args.ngram or trie
    else:
        base, head, ngram = args.base, args.ckpt, args.ngram
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
    requests = []
    for n, item in read_prompt_file(path, fields=("id", *_SETTING_NAMES)):
        try:
            settings = dataclasses.replace(defaults, **{k: item[k] for k in _SETTING_NAMES if k in item})
        except (ValueError, TypeError) as e:
            raise InputError(f"{path}:{n}: {e}") from None
        requests.append({"id": item.get("id", n), "line": n, "prompt": item.get("prompt", item.get("messages")),
                         "settings": settings})
    return requests


def run_batch(args) -> list[dict]:
    """--prompts: decode every line, in batches of --batch-size, and write one result line per prompt."""
    batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}.")
    _check_modes(args)
    if args.output:
        check_output(args.output)
    requests = read_requests(args.prompts, _settings(args))
    model = load_model(args)
    prompts = [request["prompt"] for request in requests]
    with tqdm(total=len(requests), desc="generate", unit="prompt", file=sys.stderr) as bar:
        try:
            results = model.generate_many(prompts, [r["settings"] for r in requests], chat=not args.no_chat,
                                          batch_size=batch_size, stop=args.stop, stop_token_ids=args.stop_id,
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
        with atomic_path(os.path.abspath(args.output)) as tmp:
            Path(tmp).write_text(text, encoding="utf-8")
    elif not args.output:
        sys.stdout.write(text)
    return lines


def read_messages(path: str | Path, system: str | None = None) -> list[dict]:
    """A --messages file: a JSON list of {"role", "content"} objects (system, user, assistant);
    `system` (--system) goes first unless the file has a system message of its own."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--messages file {path} not found; pass a JSON file holding a list of "
                                "{\"role\": ..., \"content\": ...} objects.")
    messages = read_json(path, "a list of {\"role\": ..., \"content\": ...} objects.")
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
    check_modes(args)  # the checks that need nothing loaded (the command line runs them before jax loads too)
    eagle3_flags = [f"--{k.replace('_', '-')}" for k in ("eagle3_total_token", "eagle3_depth", "eagle3_top_k")
                    if getattr(args, k) is not None]
    if eagle3_flags and not args.eagle3 and (args.ckpt is not None or demo_eagle3(args.demo) is None):
        raise InputError(f"{', '.join(eagle3_flags)}: EAGLE-3 tree sizes, but no EAGLE-3 head is loaded; add "
                         "--eagle3 PATH or drop them.")


def _summary(result, label: str = "[DART]") -> str:
    s = result.stats
    return (f"{label} {s['new_tokens']} tokens in {s['steps']} steps, tau {s['tau']:.2f} (tokens per step), "
            f"{s['tokens_per_s']:.1f} tokens/s (verify+draft {s['device_s']:.2f}s, tree search {s['tree_s']:.2f}s, "
            f"host {s['host_s']:.2f}s"
            + (f"; compiling {s['compile_s']:.1f}s not counted" if s["compile_s"] >= 0.05 else "")
            + f"); finish: {result.finish_reason}" + _plain_note(s))


def _plain_note(stats: dict) -> str:
    """With keep="auto": how many tokens came from plain decoding (where no draft tree paid off)
    and the mean accepted length of the drafted steps alone (tau above counts plain tokens as 1)."""
    plain = stats.get("plain_tokens")
    if not plain:
        return ""
    drafted = stats["new_tokens"] - plain
    return (f"\n       {plain} of the tokens by plain decoding (keep=auto found that no draft tree paid off there: "
            f"plain_tokens), {drafted} by drafted steps whose mean accepted length is {stats['draft_tau']:.2f} "
            "(draft_tau)")


def run(args, out=None) -> dict:
    out = out or sys.stdout
    settings = _settings(args)
    stops = dict(stop=args.stop, stop_token_ids=args.stop_id)
    _check_modes(args)
    messages = read_messages(args.messages, args.system_prompt) if args.messages else None
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
    if not args.json:  # what is being answered, before the wait for compilation
        shown = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        out.write(f"[prompt] {shown}\n\n")
        out.flush()
    # The answer starts at once, with no warm-up answer before it: its first token waits for the
    # prefill alone (the decode step compiles after it), and its figures leave compilation out (the
    # pool driver's CompileTimer). Notices keep quiet while it prints and say afterwards what compiled.
    settle()  # the compile notice's last line before the answer
    sink = []
    with holding_notices():
        for piece, _ in model.stream(prompt, chat=chat, settings=settings, result=sink, method=method, **stops):
            if not args.json:
                out.write(piece)
                out.flush()
        if not args.json:
            out.write("\n")  # the answer's last line ends before anything else prints (a compile notice on stderr)
            out.flush()
    warmup = CompileTimer()  # plain decoding's warm-up under --compare-ar, after the answer
    result = sink[0]
    report = {"method": method, "prompt": prompt, "text": result.text, "token_ids": result.token_ids,
              "accept_lengths": result.accept_lengths, "stats": result.stats, "finish_reason": result.finish_reason,
              "warmup_s": warmup.wall, "warmup_compile_s": warmup.seconds}
    if result.thinking is not None:
        report["thinking"] = result.thinking
    if args.compare_ar:
        if not args.no_warmup:  # after the answer, not before it: its first token waits for nothing it does not use
            with warmup:
                model.generate_ar(prompt_ids, chat=chat, settings=dataclasses.replace(settings, max_new_tokens=2))
            settle()
        ar = model.generate_ar(prompt, chat=chat, settings=settings, **stops)
        report["ar"] = {"text": ar.text, "token_ids": ar.token_ids, "stats": ar.stats, "finish_reason": ar.finish_reason}
        ar_tps = ar.stats["tokens_per_s"]
        report["speedup"] = result.stats["tokens_per_s"] / ar_tps if ar_tps > 0 else None
        report["greedy_match"] = (ar.token_ids == report["token_ids"]) if args.temperature == 0 else None
        report.update(warmup_s=warmup.wall, warmup_compile_s=warmup.seconds)  # plain decoding's warm-up too
    notice = length_notice(result, settings)
    if notice:
        report["notice"] = notice
        print(f"note: {notice}", file=sys.stderr)
    if args.json:
        out.write(json.dumps(report) + "\n")
    else:
        out.write("\n")
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
    decoding_methods.get(args.method).engine_of(model, f"--method {args.method}")  # which option loads its drafter
    return args.method


def compare_methods(spec: str, model) -> list[str]:
    """The methods a --compare value names ('all': every loaded one), checked."""
    if spec == "all":
        return [m.name for m in decoding_methods.loaded(model)]
    names = [m.strip() for m in spec.split(",") if m.strip()]
    known = decoding_methods.names()
    bad = [m for m in names if m not in known]
    if bad or not names:
        raise InputError(f"--compare takes a comma list of {', '.join(known)}, got {spec!r}.")
    for name in names:
        decoding_methods.get(name).engine_of(model, f"--compare with {name}")
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
    base = decoding_methods.baseline().name  # plain decoding: the speedups' baseline
    base_tps = results[base].stats["tokens_per_s"] if base in results else None
    greedy = args.temperature == 0
    report = {"prompt": prompt, "methods": {}, "warmup_s": warmup.wall, "warmup_compile_s": warmup.seconds}
    for name, result in results.items():
        tps = result.stats["tokens_per_s"]
        report["methods"][name] = {
            "text": result.text, "token_ids": result.token_ids, "accept_lengths": result.accept_lengths,
            "stats": result.stats, "finish_reason": result.finish_reason,
            "speedup": tps / base_tps if base_tps else None,
            "greedy_match": (result.token_ids == results[base].token_ids) if greedy and base in results else None}
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
    for name, item in report["methods"].items():
        note = _plain_note(item["stats"]).strip()
        if note:
            out.write(f"{name}: {note}\n")
    if warmup.wall > 0:
        out.write(f"[warm-up] {warmup.wall:.1f}s before timing ({warmup.seconds:.1f}s of it compiling)\n")
    return report


def chat_loop(args, inp=None, out=None) -> list[dict]:
    """--chat: read a message a line, stream the answer, keep the history; returns the history."""
    inp, out = inp or sys.stdin, out or sys.stdout
    settings = _settings(args)
    stops = dict(stop=args.stop, stop_token_ids=args.stop_id)
    _check_modes(args)
    start = read_messages(args.messages, args.system_prompt) if args.messages else (
        [{"role": "system", "content": args.system_prompt}] if args.system_prompt else [])
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
            with holding_notices():  # as for a single answer (`run`): a notice's line would land in the text
                for piece, _ in model.stream(history, settings=settings, result=sink, method=_method(args, model),
                                             **stops):
                    out.write(piece)
                    out.flush()
                out.write("\n")
                out.flush()
        except InputError as e:  # e.g. the history no longer fits under --max-length
            history.pop()
            out.write(f"\nerror: {e} (/reset clears the history)\n")
            continue
        result = sink[0]
        settle()
        history.append({"role": "assistant", "content": result.text})
        s = result.stats
        out.write(f"[{s['new_tokens']} tokens, tau {s['tau']:.2f}, {s['tokens_per_s']:.1f} tokens/s"
                  + (f", compiling {s['compile_s']:.1f}s not counted" if s["compile_s"] >= 0.05 else "")
                  + f"; finish: {result.finish_reason}]\n")
        notice = length_notice(result, settings)
        if notice:
            out.write(f"note: {notice}\n")
    return history


# where each backend default is overridden: (BackendDefaults field, the command's flag)
_BACKEND_FLAGS = (("device_steps", "--device-steps"), ("keep", "--keep"), ("attention", "--attention"),
                  ("verify_gemms", "--verify-gemms"), ("fused_projections", "--fused-projections"),
                  ("untied_lm_head", "DartModel.from_pretrained(untied_lm_head=)"))


def device_info() -> str:
    """--device-info: the backend, its devices (kind, count, memory where JAX reports it) and the
    defaults `from_pretrained` takes there (`models.backend.defaults_for`)."""
    devices = jax.devices()
    kinds: dict[str, int] = {}
    for device in devices:
        kinds[device.device_kind] = kinds.get(device.device_kind, 0) + 1
    lines = [f"backend: {jax.default_backend()}",
             "devices: " + ", ".join(f"{n} x {kind}" for kind, n in kinds.items())]
    for device in devices:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        limit = (stats or {}).get("bytes_limit")
        memory = f"{limit / 2**30:.1f} GiB" if limit else "not reported by JAX on this backend"
        lines.append(f"  {device.id}: {device.device_kind}, memory {memory}")
    defaults = defaults_for(jax.default_backend())
    lines.append(f"defaults on {defaults.backend} (each overridden by its option):")
    for field, flag in _BACKEND_FLAGS:
        value = getattr(defaults, field)
        if field == "device_steps" and value:
            value = f"{value} (0 where keep is 'auto' or --mesh is given)"
        if field == "keep" and value == "auto":
            value = f"auto (the SmolLM2 demo on a CPU: up to {DEMO_CPU_MAX_KEEP})"
        lines.append(f"  {field}: {value}  [{flag}]")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)

    def body() -> None:
        if args.device_info:
            print(device_info())
            return
        if args.no_compile_cache:
            no_compile_cache()
        folder = None if args.no_compile_cache else use_compile_cache()
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
