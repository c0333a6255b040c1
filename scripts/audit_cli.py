"""Audit: random bad values for the commands' flags and for generation requests, each sorted into
clear error / silently accepted / traceback (crash and hang would stop this script).

    python scripts/audit_cli.py [--cases 500] [--seed 0]

The validity of every value is restated here from the documented ranges (an oracle independent of
the code): a valid value must be accepted, an invalid one refused with a message naming it.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
import random
import tempfile
import traceback
from collections import Counter
from pathlib import Path

from dart_jax.api import generate as generate_cli
from dart_jax.api.model import DartModel
from dart_jax.train import __main__ as train_cli

# flag → predicate on the parsed value (None: argparse must refuse the text)
TRAIN = {"--draft-vocab": lambda v: v >= 1, "--lr": lambda v: math.isfinite(v) and v > 0,
         "--clip": lambda v: math.isfinite(v) and v > 0, "--warmup-steps": lambda v: v >= 0,
         "--stop-after": lambda v: v >= 1, "--rope-theta": lambda v: math.isfinite(v) and v > 0,
         "--weight-decay": lambda v: math.isfinite(v) and v >= 0, "--gamma": lambda v: 0 < v <= 1,
         "--epochs": lambda v: v >= 1, "--batch-size": lambda v: v >= 1, "--max-length": lambda v: v >= 3,
         "--keep-last": lambda v: v >= 1, "--seed": lambda v: v >= 0,
         "--regen-temperature": lambda v: math.isfinite(v) and v >= 0}
INTS = {"--draft-vocab", "--warmup-steps", "--stop-after", "--epochs", "--batch-size", "--max-length", "--keep-last",
        "--seed"}
GENERATE = {"--max-new-tokens": lambda v: v >= 1, "--max-length": lambda v: v >= 2,
            "--temperature": lambda v: math.isfinite(v) and v >= 0, "--top-p": lambda v: 0 < v <= 1,
            "--top-k": lambda v: v >= 0, "--seed": lambda v: 0 <= v < 2**63}
GEN_INTS = {"--max-new-tokens", "--max-length", "--top-k", "--seed"}
TEXTS = ["0", "-1", "-5", "1", "2", "7.5", "nan", "inf", "-inf", "1e400", "", "abc", "0x10", "3", "1e-3", "0.5",
         "1.5", str(2**70), str(-2**70), "100000"]


def parse(text: str, is_int: bool):
    try:
        return int(text) if is_int else float(text)
    except ValueError:
        return None


def run_quiet(fn):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return fn(), err.getvalue()
        except SystemExit as e:
            return e.code, err.getvalue()


def audit_train(rng: random.Random, n: int, folder: Path, counts: Counter) -> None:
    for _ in range(n):
        flag = rng.choice(sorted(TRAIN))
        text = rng.choice(TEXTS)
        value = parse(text, flag in INTS)
        argv = ["--base", str(folder / "missing"), "--data", str(folder / "d.jsonl"), "--out", str(folder / "o"),
                f"{flag}={text}"]
        try:
            code, err = run_quiet(lambda: train_cli.cli(argv))
        except Exception:  # noqa: BLE001 - counted
            counts["train traceback"] += 1
            traceback.print_exc()
            continue
        valid = value is not None and TRAIN[flag](value)
        if valid:  # the only problem left is the missing base: that error, not one about the flag
            counts["train clear" if code == 2 and "missing" in err else "train wrong refusal"] += 1
        elif code == 2 and (flag in err or "invalid" in err):
            counts["train clear"] += 1
        else:
            counts["train silent"] += 1
            print("silently accepted:", flag, text, err[-200:])


def audit_generate_settings(rng: random.Random, n: int, counts: Counter) -> None:
    for _ in range(n):
        flag = rng.choice(sorted(GENERATE))
        text = rng.choice(TEXTS)
        value = parse(text, flag in GEN_INTS)
        try:
            code, _ = run_quiet(lambda: generate_cli._settings(generate_cli.parse_args([f"{flag}={text}"])) and 0)
        except ValueError as e:
            code = 2 if flag in str(e) else 3
        except Exception:  # noqa: BLE001 - counted
            counts["generate traceback"] += 1
            traceback.print_exc()
            continue
        valid = value is not None and GENERATE[flag](value)
        if valid:
            counts["generate clear" if code == 0 else "generate wrong refusal"] += 1
        else:
            counts["generate clear" if code == 2 else "generate silent"] += 1


def audit_requests(model: DartModel, rng: random.Random, n: int, counts: Counter) -> None:
    vocab = model.target.config.vocab_size
    limit = model.target.config.max_position_embeddings
    for _ in range(n):
        kind = rng.choice(["float ids", "bool ids", "negative id", "id past vocab", "too long", "seed", "max_length",
                           "empty", "nested", "fine"])
        kw = {"max_new_tokens": 2}
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 8))]
        bad = True
        if kind == "float ids":
            prompt = [t + 0.5 for t in prompt]
        elif kind == "bool ids":
            prompt = [True] * len(prompt)
        elif kind == "negative id":
            prompt[0] = -rng.randrange(1, 10**6)
        elif kind == "id past vocab":
            prompt[-1] = vocab + rng.randrange(0, 10**6)
        elif kind == "too long":
            prompt = [5] * (limit + rng.randrange(0, 50))
            kw["max_length"] = limit + 100
        elif kind == "seed":
            kw["seed"] = rng.choice([-1, 2**63, 2**70, -2**70])
        elif kind == "max_length":
            kw["max_length"] = rng.choice([10**9, 10**12, 2**40])
        elif kind == "empty":
            prompt = []
        elif kind == "nested":
            prompt = [[1, 2], [3, [4]]]
        else:
            bad = False
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                import warnings
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model.generate(prompt, chat=False, **kw)
            counts["request silent" if bad else "request clear"] += 1
            if bad:
                print("silently accepted request:", kind, str(prompt)[:80], kw)
        except (ValueError, FileNotFoundError) as e:
            counts["request clear" if bad else "request wrong refusal"] += 1
            if not bad:
                print("refused a fine request:", e)
        except Exception:  # noqa: BLE001 - counted
            counts["request traceback"] += 1
            print("traceback for", kind)
            traceback.print_exc()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=500, help="cases per family")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        audit_train(rng, args.cases, Path(tmp), counts)
    audit_generate_settings(rng, args.cases, counts)
    base, head, trie = generate_cli._demo_paths("tiny")
    audit_requests(DartModel.from_pretrained(base, head, trie), rng, max(args.cases // 5, 20), counts)
    for family in ("train", "generate", "request"):
        row = {k.split(" ", 1)[1]: v for k, v in counts.items() if k.startswith(family)}
        print(f"{family:9s} tried {sum(row.values()):4d}  " + "  ".join(f"{k} {v}" for k, v in sorted(row.items())))


if __name__ == "__main__":
    main()
