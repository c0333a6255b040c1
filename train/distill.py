"""`python -m dart_jax.train.distill PROMPTS OUT --base BASE`: self-distillation data, the target's
own answers to a file of prompts (heads learn best on the target's own outputs), made in batches
and written one conversation at a time as each finishes. The flags and
what the files hold: `train.options.DISTILL_DESCRIPTION` (`--help`)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from dart_jax.errors import cli_boundary

from .options import build_distill_parser, check_distill_args

# answer --help and bad flags before jax loads
if __name__ == "__main__" and cli_boundary(lambda: check_distill_args(build_distill_parser().parse_args()),
                                           prog="dart_jax.train.distill"):
    sys.exit(2)

from tqdm.auto import tqdm  # noqa: E402 (after the check above, on purpose)

from dart_jax.convert.target import target_folder  # noqa: E402
from dart_jax.decoding.autoregressive import AutoregressiveDecoder  # noqa: E402
from dart_jax.decoding.batcher import PlainBatcher  # noqa: E402
from dart_jax.decoding.drafter import DartDrafter  # noqa: E402
from dart_jax.decoding.driver import Driver  # noqa: E402
from dart_jax.decoding.engine import Engine  # noqa: E402
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings  # noqa: E402
from dart_jax.errors import InputError, load_tokenizer_folder, parse_json  # noqa: E402
from dart_jax.models.checkpoints import load_dart_head, load_target  # noqa: E402
from dart_jax.ngram import check_trie_vocab, load_any  # noqa: E402

from .regenerate import stop_ids  # noqa: E402


def read_prompts(path, system: str | None = None) -> list[dict]:
    """The prompts of `path` as rows with "messages" (the turns to answer; a final assistant turn
    dropped). A line that is not such a row is an InputError naming the line."""
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


def batch_answers(pool, jobs):
    """Plain decoding of jobs (key, prompt ids, GenerationSettings) in static batches of as many
    prompts as `pool` (a `PlainBatcher`) has slots, of similar lengths (sorted by length within each
    window of 8 batches, so that a run cut short keeps the file's mix): a batch joins the empty pool
    at once and the next waits until it is done. Yields (key, new ids, finish reason) as each answer
    finishes, at the end of the device call that finished it."""
    batch, driver = pool.slots, Driver(pool)
    window = 8 * batch
    for w in range(0, len(jobs), window):
        part = sorted(jobs[w:w + window], key=lambda job: len(job[1]))
        for b in range(0, len(part), batch):
            handles = {pool.submit(ids, settings): key for key, ids, settings in part[b:b + batch]}
            for step in driver.run():
                for event in step.events:
                    request = event.request
                    if request.done and request in handles:
                        yield handles.pop(request), request.token_ids, request.finish_reason


def pool_answers(pool, jobs, refill: float):
    """Jobs (key, prompt ids, GenerationSettings) through a continuous-batching `pool`, in order:
    waiting jobs join once `refill` of the slots are free (each admission prefills the pool's live
    rows once, so joining one at a time would prefill about as often as sequences finish); the pool
    is stepped by the pool driver. Yields (key, new ids, finish reason) as each request finishes."""
    jobs = list(jobs)[::-1]  # pop() from the end takes them in order
    least = max(1, int(pool.slots * refill))
    handles = {}
    driver = Driver(pool)
    while jobs or pool.active:
        free = sum(r is None for r in pool.busy) - len(pool.waiting)
        if jobs and (free >= min(least, len(jobs)) or not pool.active):
            for _ in range(min(free, len(jobs))):
                key, ids, settings = jobs.pop()
                handles[pool.submit(ids, settings)] = key
        for event in driver.step().events:
            request = event.request
            if request.done and request in handles:
                yield handles.pop(request), request.token_ids, request.finish_reason


def open_answers(args, jobs):
    """(answers as `batch_answers` yields them, eos ids, the pool): plain decoding in static
    batches over the target alone (no head needed), or DART's pool (the head over the target, its
    trees searched with `--ngram` when given)."""
    tokenizer = load_tokenizer_folder(target_folder(args.base))
    target = load_target(target_folder(args.base))
    eos = stop_ids(target, tokenizer)
    shapes = ShapeSettings(min_bucket=64, cache_multiple=64)
    max_length = max(s.max_length for _, _, s in jobs)
    if args.method == "ar":
        pool = PlainBatcher(AutoregressiveDecoder(target, shapes, eos_ids=eos), args.slots, max_length)
        return batch_answers(pool, jobs), eos, pool
    head = load_dart_head(args.ckpt, target)
    trie = None if args.ngram is None else load_any(args.ngram)
    if trie is not None:
        check_trie_vocab(trie, target.config.vocab_size, args.ngram)
    engine = Engine(target, DartDrafter(head), trie, eos_ids=eos, tree_eos_id=tokenizer.eos_token_id, shapes=shapes)
    pool = engine.batcher(args.slots, max_length)
    return pool_answers(pool, jobs, args.refill), eos, pool


def run(args) -> dict:
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
    tokenizer = load_tokenizer_folder(target_folder(args.base))
    jobs = []
    for row in left:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        jobs.append((row, ids, GenerationSettings(max_new_tokens=args.max_new_tokens,
                                                  max_length=len(ids) + args.max_new_tokens,
                                                  temperature=args.temperature,
                                                  seed=(args.seed * 1_000_003 + row["index"]) % 2**32)))
    answers, eos, pool = open_answers(args, jobs)
    bar = tqdm(total=len(left), desc="answers", unit="prompt", disable=args.no_progress)
    start = time.perf_counter()
    try:
        with open(out, "a", encoding="utf-8") as f:
            for row, ids, reason in answers:
                answer = tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=False)
                record = {**row, "messages": [*row["messages"], {"role": "assistant", "content": answer}],
                          "finish_reason": reason}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                summary["answered"] += 1
                summary["new_tokens"] += len(ids)
                bar.update(1)
                bar.set_postfix(tok_s=f"{summary['new_tokens'] / (time.perf_counter() - start):.0f}")
            os.fsync(f.fileno())
    finally:
        bar.close()
        pool.close()
    seconds = time.perf_counter() - start
    return {**summary, "seconds": round(seconds, 2), "tokens_per_s": round(summary["new_tokens"] / seconds, 1)}


def main(argv=None) -> int:
    args = build_distill_parser().parse_args(argv)
    check_distill_args(args)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(cli_boundary(main, prog="dart_jax.train.distill"))
