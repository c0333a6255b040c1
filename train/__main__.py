"""`python -m dart_jax.train`: train a DART draft head for a Qwen3 target (docs/spec.md §7)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from dart_jax.errors import InputError, cli_boundary
from dart_jax.models.checkpoints import load_dart_head, load_qwen3, save_dart_head
from dart_jax.models.head import DartHead
from dart_jax.models.sharding import shard_module

from .checkpoint import Checkpoints
from .data import Dataset, encode_dataset, load_tokenizer, read_conversations
from .loop import (Trainer, TrainSettings, batches_per_epoch, data_mesh, head_config_for, save_npz_atomic, set_vocab,
                   train_loop, write_json_atomic)
from .regenerate import Regenerator
from .vocab import build_draft_vocab, used_from_d2t


def build_parser() -> argparse.ArgumentParser:
    d = TrainSettings()
    p = argparse.ArgumentParser(
        prog="python -m dart_jax.train", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a DART draft head on JSONL conversations with the frozen target as teacher "
                    "(annealed KL over the d rows, prefix-shared masked training). Re-running with the same "
                    "--out resumes from the latest checkpoint; the result is exported to OUT/head.")
    p.add_argument("--base", required=True, help="target Qwen3: hub id or local folder (its tokenizer renders the data)")
    p.add_argument("--data", required=True, help="JSONL file: ShareGPT 'conversations' or OpenAI 'messages' per line")
    p.add_argument("--out", required=True, help="run folder: checkpoints, encoded data, vocabulary, exported head")
    p.add_argument("--init-head", help="start from this DART head (hub id or folder); its draft vocabulary is kept")
    p.add_argument("--tokenizer", help="tokenizer folder or hub id when it is not stored with --base")
    p.add_argument("--draft-length", type=int, default=d.draft_length, help="m mask slots (d = m + 1 rows)")
    p.add_argument("--draft-vocab", type=int, default=None, help="draft vocabulary size (default min(32000, target vocab))")
    p.add_argument("--max-length", type=int, default=d.max_length, help="samples are cut to this many tokens")
    p.add_argument("--anchors-per-seq", type=int, default=d.anchors_per_seq, help="anchor positions sampled per sequence")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per micro-batch (all devices)")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer update")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (linear warm-up, then cosine to 0)")
    p.add_argument("--warmup-steps", type=int, default=None, help="warm-up updates (default 2%% of all updates)")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    p.add_argument("--clip", type=float, default=d.clip, help="gradient clipping (global norm)")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--gamma", type=float, default=d.gamma, help="annealing factor of the per-row KL weights γ^(t−1)")
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
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="target dtype (default float32 on CPU, bfloat16 on accelerators); the head trains in float32")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    return p


def _settings(args, vocab_size: int) -> TrainSettings:
    return TrainSettings(
        draft_length=args.draft_length, draft_vocab=args.draft_vocab or min(32000, vocab_size),
        max_length=args.max_length, anchors_per_seq=args.anchors_per_seq, batch_size=args.batch_size,
        grad_accum=args.grad_accum, lr=args.lr, warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
        clip=args.clip, epochs=args.epochs, gamma=args.gamma, seed=args.seed, rope_theta=args.rope_theta)


def _check_args(args) -> None:
    """The flags that TrainSettings does not hold; TrainSettings checks its own (before any loading)."""
    for name in ("save_every", "log_every", "keep_last", "regen_max_new"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.stop_after is not None and args.stop_after < 1:
        raise InputError(f"--stop-after must be >= 1 (micro-batches), got {args.stop_after}.")
    if args.draft_vocab is not None and args.draft_vocab < 1:
        raise InputError(f"--draft-vocab must be >= 1, got {args.draft_vocab}.")
    if not (math.isfinite(args.regen_temperature) and args.regen_temperature >= 0):
        raise InputError(f"--regen-temperature must be a finite number >= 0, got {args.regen_temperature}.")
    _settings(args, vocab_size=max(args.draft_vocab or 1, 1))  # TrainSettings' own checks


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    run(args)
    return 0


def run(args) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mesh = data_mesh()
    n_dev = mesh.devices.size
    if args.batch_size % n_dev:
        raise ValueError(f"--batch-size {args.batch_size} must be a multiple of the {n_dev} local devices (data parallel)")
    target = load_qwen3(args.base, dtype=args.dtype, mesh=mesh)
    settings = _settings(args, target.config.vocab_size)
    progress = not args.no_progress

    init = None
    if args.init_head:
        init = load_dart_head(args.init_head, target, dtype=jnp.float32)
        if args.draft_vocab is not None and args.draft_vocab != init.config.draft_vocab_size:
            raise ValueError(f"--init-head has a draft vocabulary of {init.config.draft_vocab_size} (kept when "
                             f"continuing from it); drop --draft-vocab or pass {init.config.draft_vocab_size}")
        if init.config.draft_length != settings.draft_length:
            raise ValueError(f"--init-head has draft_length {init.config.draft_length}; pass --draft-length "
                             f"{init.config.draft_length}")
        settings = dataclasses.replace(settings, draft_vocab=init.config.draft_vocab_size)
    run_file = out / "run.json"
    recorded = {"settings": dataclasses.asdict(settings), "base": str(args.base), "data": str(Path(args.data).absolute()),
                "init_head": args.init_head, "regenerate": args.regenerate}
    if run_file.exists():
        previous = json.loads(run_file.read_text())
        changed = sorted(k for k in set(previous["settings"]) | set(recorded["settings"])
                         if previous["settings"].get(k) != recorded["settings"].get(k))
        if changed:
            raise ValueError(f"{out} holds a run with other settings ({', '.join(changed)} differ); resume with the same "
                             "options or pick a fresh --out")
    write_json_atomic(run_file, recorded)

    tokenizer = load_tokenizer(args.tokenizer or args.base)
    pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else 0
    data_file = out / "data.npz"
    if data_file.exists():
        data = Dataset.load(data_file)
    else:
        conversations, bad = read_conversations(args.data, skip_bad=args.skip_bad)
        if bad:
            print(f"skipped {bad} malformed lines of {args.data}", file=sys.stderr)
        if args.regenerate:
            regen = Regenerator(target, tokenizer, max_new_tokens=args.regen_max_new,
                                temperature=args.regen_temperature, seed=args.seed)
            bar = tqdm(conversations, desc="regenerate", disable=not progress)
            conversations = [regen.conversation(c, i) for i, c in enumerate(bar)]
            with open(out / "regenerated.jsonl", "w", encoding="utf-8") as f:
                for c in conversations:
                    f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
        data, dropped = encode_dataset(tokenizer, conversations, settings.max_length, progress=progress)
        if dropped:
            print(f"dropped {dropped} conversations with no assistant token within --max-length", file=sys.stderr)
        data.save(data_file)

    vocab_file = out / "vocab.npz"
    if vocab_file.exists():
        with np.load(vocab_file) as f:
            used = f["used"]
    elif init is not None:
        used = used_from_d2t(np.asarray(init.d2t.get_value()))
    else:
        used, _, _ = build_draft_vocab(zip(data.ids, data.loss_mask), target.config.vocab_size, settings.draft_vocab)
    save_npz_atomic(vocab_file, used=used)

    if init is not None:
        head = init
    else:
        config = head_config_for(target.config, settings.draft_length, len(used), settings.rope_theta)
        head = DartHead(config, target.embed_tokens, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(settings.seed))
        set_vocab(head, used)
    shard_module(head, mesh)

    per_epoch = batches_per_epoch(len(data), settings.batch_size)
    total = settings.epochs * per_epoch
    trainer = Trainer(target, head, settings, total // settings.grad_accum, mesh)
    checkpoints = Checkpoints(out / "ckpt", args.keep_last)
    start = checkpoints.latest_step() or 0
    if start:
        trainer.load_train_state(checkpoints.restore(start, trainer.train_state()))
        print(f"resuming from micro-step {start} of {total}", file=sys.stderr)
    end = total if args.stop_after is None else min(total, args.stop_after)
    print(f"{len(data)} samples, {per_epoch} batches/epoch, {total} micro-batches, draft vocab {len(used)}, "
          f"{n_dev} device(s) ({jax.default_backend()})", file=sys.stderr)
    train_loop(trainer, data, settings, checkpoints, start_step=start, end_step=end, save_every=args.save_every,
               log_every=args.log_every, pad_id=pad_id, progress=progress,
               log=lambda line: print(line, file=sys.stderr), metrics_file=out / "metrics.json")
    checkpoints.close()
    if end < total:
        print(f"stopped after micro-step {end} of {total}; run again with the same --out to resume", file=sys.stderr)
        return out
    folder = save_dart_head(out / "head", trainer.head_config, nnx.state(trainer.head()))
    print(f"exported the head to {folder}", file=sys.stderr)
    return folder


def cli(argv=None) -> int:
    """`main` for the command line: a bad input is one `error:` line and exit code 2, not a traceback."""
    return cli_boundary(lambda: main(argv), prog="dart_jax.train")


if __name__ == "__main__":
    sys.exit(cli())
