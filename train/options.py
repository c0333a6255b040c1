"""The flags of `python -m dart_jax.train` and their checks: argparse and `TrainSettings` only
(no jax), so that `--help` and a bad flag are answered at once, before the heavy libraries load."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from dart_jax.errors import DefaultsHelpFormatter, InputError
from dart_jax.files import check_apart

from .settings import DEFAULT_GAMMA, METHODS, TrainSettings

TAPS_DTYPE = "bfloat16"  # --taps-dtype when not given
TAPS_SHARD_MB = 256.0  # --taps-shard-mb when not given


def build_parser() -> argparse.ArgumentParser:
    d = TrainSettings()
    p = argparse.ArgumentParser(
        prog="python -m dart_jax.train", formatter_class=DefaultsHelpFormatter,
        description="Train a draft head on JSONL conversations with the frozen target as teacher: DART "
                    "(annealed KL over the d rows, prefix-shared masked training) or EAGLE-3 (--method eagle3: "
                    "training-time test over --ttt-steps unrolled draft steps). Re-running with the same "
                    "--out resumes from the latest checkpoint; the result is exported to OUT/head.")
    p.add_argument("--base", required=True, help="target (Qwen3 or Llama family): hub id, local folder or .gguf file (its tokenizer renders the data)")
    p.add_argument("--data", required=True, help="JSONL file: ShareGPT 'conversations' or OpenAI 'messages' per line")
    p.add_argument("--out", required=True, help="run folder: checkpoints, encoded data, vocabulary, exported head")
    p.add_argument("--method", choices=METHODS, default=d.method,
                   help="dart: a DART head; eagle3: an EAGLE-3 head (published AngelSlim/SpecForge layout)")
    p.add_argument("--init-head", help="start from this head (hub id or folder) of --method's kind; its draft "
                                       "vocabulary is kept, or for a DART head grown to a larger --draft-vocab "
                                       "(the training targets it lacks, most frequent first)")
    p.add_argument("--tokenizer", help="tokenizer folder or hub id when it is not stored with --base")
    p.add_argument("--draft-length", type=int, default=d.draft_length, help="dart: m mask slots (d = m + 1 rows)")
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps,
                   help="eagle3: draft steps unrolled in training (training-time test)")
    p.add_argument("--draft-vocab", type=int, default=None, help="draft vocabulary size (default min(32000, target vocab))")
    p.add_argument("--max-length", type=int, default=d.max_length, help="samples are cut to this many tokens")
    p.add_argument("--anchors-per-seq", type=int, default=d.anchors_per_seq, help="dart: anchor positions sampled per sequence")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per micro-batch (all devices)")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer update")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (linear warm-up, then cosine to 0)")
    p.add_argument("--warmup-steps", type=int, default=None, help="warm-up updates (default 2%% of all updates)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    p.add_argument("--clip", type=float, default=d.clip, help="gradient clipping (global norm)")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the data (default {d.epochs})")
    p.add_argument("--gamma", type=float, default=argparse.SUPPRESS,
                   help="loss weight γ^r of row r (dart) or of unrolled step r (eagle3) "
                        f"(default: {DEFAULT_GAMMA['dart']} for dart, {DEFAULT_GAMMA['eagle3']} for eagle3)")
    p.add_argument("--rope-theta", type=float, default=d.rope_theta, help="RoPE base of a new head")
    p.add_argument("--seed", type=int, default=d.seed, help="fixes the init, the data order and the anchors")
    p.add_argument("--save-every", type=int, default=500, help="checkpoint every N micro-batches")
    p.add_argument("--log-every", type=int, default=50, help="log loss, per-row accuracy α and τ every N micro-batches")
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept")
    p.add_argument("--stop-after", type=int, default=None,
                   help="stop once N micro-batches are done (a later run with the same --out resumes)")
    p.add_argument("--regenerate", action="store_true", help="replace the assistant turns by the target's own replies")
    p.add_argument("--regen-temperature", type=float, default=0.0, help="0 = greedy regeneration")
    p.add_argument("--regen-max-new", type=int, default=512, help="new tokens per regenerated turn")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed JSONL lines (counted) instead of failing")
    # the choices of `dart_jax.models.qwen3.MODEL_DTYPES`, which this light module cannot import (jax)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="target dtype (default float32 on CPU, bfloat16 on accelerators); the head trains in float32")
    p.add_argument("--mesh", metavar="SPEC", default=None,
                   help="devices: 'data=N' data parallel over N devices (default: all local devices), "
                        "'data=2,model=2' also shards the frozen target over 'model' (heads, MLP, vocabulary)")
    p.add_argument("--taps", choices=("auto", "cache", "online"), default="auto",
                   help="cache: a first pass stores the target's taps (its three hidden-state taps and final hidden "
                        "state) for every sequence in --taps-dir and every step reads them instead of running the "
                        "target (resumable, checksummed); online: the target runs every step (for data too big to "
                        "cache); auto: cache when there are 2 or more epochs, one process, and the cache takes at "
                        "most half the free disk space there, else online (the choice is printed)")
    # the cache's options default to None, "not given", so that --taps online can refuse them
    p.add_argument("--taps-dir", default=None, help="the taps cache's folder (default OUT/taps)")
    p.add_argument("--taps-dtype", choices=("bfloat16", "float32"), default=None,
                   help=f"the cache's dtype (default {TAPS_DTYPE}: it halves the cache's size; the effect on the loss "
                        "is in README)")
    p.add_argument("--taps-shard-mb", type=float, default=None,
                   help=f"size of one cache file: a killed cache pass resumes from the last finished one (default "
                        f"{TAPS_SHARD_MB:g})")
    p.add_argument("--profile", type=int, default=None, metavar="N",
                   help="time N training steps split into data loading, host work, the target's forward, the "
                        "head's forward+backward and the optimizer (separately jitted pieces, each timed with "
                        "block_until_ready; the fused step is timed too), print the table, write it as JSON to "
                        "--profile-json and stop (no checkpoint is saved)")
    p.add_argument("--profile-json", default=None, help="where --profile writes its JSON (default OUT/profile.json)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    return p


def settings_from_args(args, vocab_size: int) -> TrainSettings:
    return TrainSettings(
        draft_length=args.draft_length, draft_vocab=args.draft_vocab or min(32000, vocab_size),
        max_length=args.max_length, anchors_per_seq=args.anchors_per_seq, batch_size=args.batch_size,
        grad_accum=args.grad_accum, lr=args.lr, warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
        clip=args.clip, epochs=args.epochs, seed=args.seed, rope_theta=args.rope_theta,
        gamma=getattr(args, "gamma", DEFAULT_GAMMA[args.method]), method=args.method,
        ttt_steps=args.ttt_steps)


def check_args(args) -> None:
    """The flags that TrainSettings does not hold; TrainSettings checks its own (before any loading)."""
    for name in ("save_every", "log_every", "keep_last", "regen_max_new"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.stop_after is not None and args.stop_after < 1:
        raise InputError(f"--stop-after must be >= 1 (micro-batches), got {args.stop_after}.")
    if args.profile is not None and args.profile < 1:
        raise InputError(f"--profile must be >= 1 (steps to time), got {args.profile}.")
    cache_flags = [f"--{name.replace('_', '-')}" for name in ("taps_dir", "taps_dtype", "taps_shard_mb")
                   if getattr(args, name) is not None]
    if args.taps == "online" and cache_flags:
        raise InputError(f"--taps online runs the target every step and makes no taps cache, so {', '.join(cache_flags)} "
                         f"would do nothing; drop {'them' if len(cache_flags) > 1 else 'it'}, or pass --taps cache "
                         "(or auto).")
    args.taps_dtype = args.taps_dtype or TAPS_DTYPE
    args.taps_shard_mb = TAPS_SHARD_MB if args.taps_shard_mb is None else args.taps_shard_mb
    if not (math.isfinite(args.taps_shard_mb) and args.taps_shard_mb > 0):
        raise InputError(f"--taps-shard-mb must be a finite number > 0, got {args.taps_shard_mb}.")
    if args.draft_vocab is not None and args.draft_vocab < 1:
        raise InputError(f"--draft-vocab must be >= 1, got {args.draft_vocab}.")
    if not (math.isfinite(args.regen_temperature) and args.regen_temperature >= 0):
        raise InputError(f"--regen-temperature must be a finite number >= 0, got {args.regen_temperature}.")
    settings_from_args(args, vocab_size=max(args.draft_vocab or 1, 1))  # TrainSettings' own checks
    inputs = [("--base", args.base), ("--data", args.data), ("--init-head", args.init_head),
              ("--tokenizer", args.tokenizer)]
    check_apart(args.out, inputs, "--out")
    if args.taps_dir is not None:  # the cache deletes what it does not own in its folder
        check_apart(args.taps_dir, inputs, "--taps-dir")
    out = Path(os.path.expanduser(args.out))
    if (out / "config.json").is_file() and not (out / "run.json").is_file():
        raise InputError(f"--out {args.out} holds a model or head (config.json) and is no training run (no run.json): "
                         "training would write its checkpoints and head there. Pass a fresh folder.")


DISTILL_DESCRIPTION = """Self-distillation data: the target's own answers to a file of prompts (heads
learn best on the target's own outputs), made in batches of prompts of similar lengths and written
one conversation at a time as each finishes.

PROMPTS is JSONL: each line {"prompt": "..."} or {"messages": [...]} (a conversation up to the turn
to answer; a final assistant turn is dropped and answered anew), with any other fields kept. OUT
gets one line per answered prompt: its fields, "index" (the prompt's line number, counted from 0),
"messages" ending with the target's answer, and "finish_reason" ("eos" or "length"). A run that
stops (even kill -9) resumes where it stopped: prompts already in OUT are skipped, a torn last
line is cut away. Prompts whose conversation repeats an earlier one are answered once.

Plain decoding is the default; `--method dart --ckpt HEAD` drafts with a DART head in a
continuous-batching pool (the answers are the same greedy tokens; which is faster depends on the
batch and the hardware: `--limit` a few dozen prompts and compare the tokens/s each prints).
"""


def build_distill_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dart_jax.train.distill", description=DISTILL_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", help="JSONL of prompts ({'prompt': ...} or {'messages': [...]}) per line")
    p.add_argument("out", help="JSONL the answers are appended to (resumed when it exists)")
    p.add_argument("--base", required=True, help="the target: a folder, hub id or .gguf file")
    p.add_argument("--method", choices=("ar", "dart"), default="ar",
                   help="plain decoding (default), or DART drafting with --ckpt")
    p.add_argument("--ckpt", help="a DART head folder, for --method dart")
    p.add_argument("--ngram", help="an n-gram .trie file (the project's formats) for --method dart's tree "
                                   "search (default: none, the head's scores alone)")
    p.add_argument("--slots", type=int, default=32, help="sequences decoded together (default: %(default)s)")
    p.add_argument("--refill", type=float, default=0.25,
                   help="--method dart's pool admits waiting prompts once this share of the slots is free "
                        "(each admission prefills the pool's live rows once; default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="tokens per answer (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy answers (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (each prompt its own, from this and its index)")
    p.add_argument("--limit", type=int, help="answer at most this many prompts (after those already done)")
    p.add_argument("--system", help="a system prompt put before each conversation")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def check_distill_args(args) -> None:
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
        raise InputError(f"{args.prompts}: no such file; pass a JSONL file of prompts (see `python -m dart_jax.train.distill --help`)")
    if Path(args.out).resolve() == Path(args.prompts).resolve():
        raise InputError("OUT is the prompts file: the answers go to a file of their own")
