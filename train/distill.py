"""`python -m dart_jax.train.distill PROMPTS OUT --base BASE`: self-distillation data, the target's
own answers to a file of prompts, made in a continuous-batching pool and written one conversation
at a time as each finishes (heads learn best on the target's own outputs).

PROMPTS is JSONL: each line {"prompt": "..."} or {"messages": [...]} (a conversation up to the turn
to answer; a final assistant turn is dropped and answered anew), with any other fields kept. OUT
gets one line per answered prompt: its fields, "index" (the prompt's line number, counted from 0),
"messages" ending with the target's answer, and "finish_reason" ("stop" or "length"). A run that
stops (even kill -9) resumes where it stopped: prompts already in OUT are skipped, a torn last
line is cut away. Prompts whose conversation repeats an earlier one are answered once.

Plain decoding is the default; `--method dart --ckpt HEAD` drafts with a DART head (the answers are
the same greedy tokens; which is faster depends on the batch and the hardware: `--limit` a few
dozen prompts and compare the tokens/s each prints).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from dart_jax.errors import InputError, cli_boundary

ARGS_HELP = "see `python -m dart_jax.train.distill --help`"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dart_jax.train.distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", help="JSONL of prompts ({'prompt': ...} or {'messages': [...]}) per line")
    p.add_argument("out", help="JSONL the answers are appended to (resumed when it exists)")
    p.add_argument("--base", required=True, help="the target: a folder, hub id or .gguf file")
    p.add_argument("--method", choices=("ar", "dart"), default="ar",
                   help="plain decoding (default), or DART drafting with --ckpt")
    p.add_argument("--ckpt", help="a DART head (folder or hub id), for --method dart")
    p.add_argument("--ngram", help="the DART n-gram trie (default: the head's; 'none': the head alone)")
    p.add_argument("--slots", type=int, default=32, help="sequences decoded together (default: %(default)s)")
    p.add_argument("--refill", type=float, default=0.25,
                   help="admit waiting prompts once this share of the slots is free (each admission "
                        "prefills the pool's live rows once; default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="tokens per answer (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy answers (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (each prompt its own, from this and its index)")
    p.add_argument("--limit", type=int, help="answer at most this many prompts (after those already done)")
    p.add_argument("--system", help="a system prompt put before each conversation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def check_args(args) -> None:
    if args.method == "dart" and not args.ckpt:
        raise InputError("--method dart drafts with a DART head: pass --ckpt HEAD (or use --method ar)")
    if args.method == "ar" and (args.ckpt or args.ngram):
        raise InputError("--ckpt/--ngram are for --method dart; drop them or pass --method dart")
    if args.slots < 1 or args.max_new_tokens < 1:
        raise InputError("--slots and --max-new-tokens must be >= 1")
    if not 0 < args.refill <= 1:
        raise InputError(f"--refill is a share of the slots in (0, 1], got {args.refill}")
    if not 0 <= args.temperature <= 100:
        raise InputError(f"--temperature must be within [0, 100], got {args.temperature}")
    if args.limit is not None and args.limit < 1:
        raise InputError(f"--limit must be >= 1, got {args.limit}")
    if not Path(args.prompts).is_file():
        raise InputError(f"{args.prompts}: no such file; pass a JSONL file of prompts ({ARGS_HELP})")
    if Path(args.out).resolve() == Path(args.prompts).resolve():
        raise InputError("OUT is the prompts file: the answers go to a file of their own")


if __name__ == "__main__" and cli_boundary(lambda: check_args(build_parser().parse_args()),
                                           prog="dart_jax.train.distill"):
    sys.exit(2)


def read_prompts(path, system: str | None = None) -> list[dict]:
    """The prompts of `path` as rows with "messages" (the turns to answer; a final assistant turn
    dropped). A line that is not such a row is an InputError naming the line."""
    from dart_jax.errors import parse_json

    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = parse_json(line, f"{path}:{n}", "one JSON object a line, {\"prompt\": ...} or {\"messages\": [...]}")
            if not isinstance(row, dict):
                raise InputError(f"{path} line {n}: expected a JSON object, got {type(row).__name__}")
            if isinstance(row.get("prompt"), str):
                messages = [{"role": "user", "content": row["prompt"]}]
            elif isinstance(row.get("messages"), list) and row["messages"] and all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in row["messages"]):
                messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
                if messages[-1]["role"] == "assistant":
                    messages = messages[:-1]
            else:
                raise InputError(f"{path} line {n}: needs \"prompt\" (a string) or \"messages\" (a list of "
                                 "{role, content} strings)")
            if not messages or messages[-1]["role"] == "assistant":
                raise InputError(f"{path} line {n}: nothing to answer (the conversation ends with an assistant turn)")
            if system is not None and messages[0]["role"] != "system":
                messages = [{"role": "system", "content": system}, *messages]
            rows.append({**row, "index": len(rows), "messages": messages})
    return rows


def conversation_key(messages: list[dict]) -> str:
    """Two conversations are the same when their turns are, whitespace aside."""
    return json.dumps([[m["role"], " ".join(m["content"].split())] for m in messages])


def resume(out: Path) -> set[int]:
    """The prompt indices already answered in `out`; a torn last line (a run killed while writing
    it) is cut away, so that appending goes on from a whole line."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    whole = data.rfind(b"\n") + 1
    if whole < len(data):
        with open(out, "r+b") as f:
            f.truncate(whole)
    done = set()
    for n, line in enumerate(data[:whole].decode("utf-8", errors="replace").splitlines(), 1):
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{out} line {n} is not an answer this command wrote; pass a new OUT file") from None
    return done


def todo(rows: list[dict], done: set[int]) -> tuple[list[dict], int]:
    """(rows still to answer, duplicates skipped): a conversation seen earlier in the file is
    answered once, wherever the first one is."""
    seen, left, dupes = set(), [], 0
    for row in rows:
        key = conversation_key(row["messages"])
        if key in seen:
            dupes += 1
            continue
        seen.add(key)
        if row["index"] not in done:
            left.append(row)
    return left, dupes


def open_pool(args):
    """(pool, tokenizer) for the method: a plain-decoding pool over the target alone, or DART's."""
    import numpy as np

    from dart_jax.api.model import DartModel
    from dart_jax.convert.target import target_folder
    from dart_jax.decoding.batcher import PlainBatcher, TargetEngine
    from dart_jax.decoding.settings import ShapeSettings
    from dart_jax.errors import load_tokenizer_folder
    from dart_jax.models.checkpoints import load_target

    max_length = 4096
    if args.method == "dart":
        model = DartModel.from_pretrained(args.base, args.ckpt, args.ngram)
        return model.batcher(args.slots, max_length, "dart"), model.get_tokenizer()
    folder = target_folder(args.base)
    tokenizer = load_tokenizer_folder(folder)
    target = load_target(folder)
    eos = set(target.config.eos_token_ids) | ({int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None
                                             else set())
    engine = TargetEngine(target, sorted(int(e) for e in np.unique(list(eos))),
                          ShapeSettings(min_bucket=64, cache_multiple=64))
    return PlainBatcher(engine, args.slots, max_length), tokenizer


def run(args) -> dict:
    from tqdm.auto import tqdm

    from dart_jax.decoding.settings import GenerationSettings

    out = Path(args.out)
    rows = read_prompts(args.prompts, args.system)
    done = resume(out)
    left, dupes = todo(rows, done)
    if args.limit is not None:
        left = left[:args.limit]
    summary = {"prompts": len(rows), "duplicates": dupes, "answered_before": len(done), "answered": 0,
               "new_tokens": 0}
    if not left:
        return {**summary, "seconds": 0.0, "tokens_per_s": 0.0}
    pool, tokenizer = open_pool(args)
    eos = pool.engine.eos_ids
    queue = []
    for row in left:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        queue.append((row, ids))
    queue.reverse()  # pop() from the end takes them in file order
    refill = max(1, int(args.slots * args.refill))
    bar = tqdm(total=len(left), desc="answers", unit="prompt", disable=args.no_progress)
    start = time.perf_counter()
    handles = {}
    try:
        with open(out, "a", encoding="utf-8") as f:
            while queue or pool.active:
                free = sum(r is None for r in pool.busy) - len(pool.waiting)
                if queue and (free >= min(refill, len(queue)) or not pool.active):
                    for _ in range(min(free, len(queue))):
                        row, ids = queue.pop()
                        settings = GenerationSettings(max_new_tokens=args.max_new_tokens,
                                                      max_length=len(ids) + args.max_new_tokens,
                                                      temperature=args.temperature,
                                                      seed=(args.seed * 1_000_003 + row["index"]) % 2**32)
                        handles[pool.submit(ids, settings)] = row
                for event in pool.step():
                    request = event.request
                    if not request.done or request not in handles:
                        continue
                    row = handles.pop(request)
                    new = [t for t in request.token_ids if t not in eos]
                    answer = tokenizer.decode(new, skip_special_tokens=False)
                    record = {**row, "messages": [*row["messages"], {"role": "assistant", "content": answer}],
                              "finish_reason": request.finish_reason}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    f.flush()
                    summary["answered"] += 1
                    summary["new_tokens"] += len(request.token_ids)
                    bar.update(1)
                    bar.set_postfix(tok_s=f"{summary['new_tokens'] / (time.perf_counter() - start):.0f}")
            os.fsync(f.fileno())
    finally:
        bar.close()
        pool.close()
    seconds = time.perf_counter() - start
    return {**summary, "seconds": round(seconds, 2), "tokens_per_s": round(summary["new_tokens"] / seconds, 1)}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(cli_boundary(main, prog="dart_jax.train.distill"))
