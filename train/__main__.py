"""`python -m dart_jax.train`: train a DART (docs/spec.md §7) or EAGLE-3 (`--method eagle3`,
train/eagle3.py) draft head for a target."""
from __future__ import annotations

import sys

from dart_jax.errors import cli_boundary

from .options import build_parser, check_args, settings_from_args

# answer --help and bad flags before jax, flax and orbax load (seconds)
if __name__ == "__main__" and cli_boundary(lambda: check_args(build_parser().parse_args()), prog="dart_jax.train"):
    sys.exit(2)

import contextlib
import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from dart_jax.errors import FileFormatError, InputError, read_json
from dart_jax.files import file_sha256
from dart_jax.convert.target import target_folder
from dart_jax.models.backend import use_compile_cache
from dart_jax.models.checkpoints import load_dart_head, load_eagle3_head, load_target, save_dart_head
from dart_jax.models.head import DartHead
from dart_jax.models.multihost import is_writer, wait_for_all
from dart_jax.models.sharding import make_mesh, shard_module

from .checkpoint import Checkpoints
from .data import Dataset, encode_dataset, load_tokenizer, read_conversations, read_npz
from .eagle3 import eagle3_loss, new_eagle3_head, save_eagle3_head
from .loop import Trainer, batches_per_epoch, data_mesh, head_config_for, save_npz_atomic, set_vocab, train_loop, \
    widened_head, write_json_atomic
from .profile import profile, table as profile_table
from .regenerate import Regenerator
from .settings import TrainSettings
from .taps import TapsCache, build_cache, choose_mode, state_width, target_identity
from .vocab import build_draft_vocab, grow_draft_vocab, used_from_d2t

# what a run folder holds that was derived from its inputs (rebuilt when they change before training began)
DERIVED = ("data.npz", "vocab.npz", "regenerated.jsonl")
# settings that run folders made before they existed do not record (those runs used the defaults)
LATER_SETTINGS = ("method", "ttt_steps")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_args(args)
    run(args)
    return 0


def differences(previous: dict, recorded: dict) -> list[str]:
    """What differs between a run folder's run.json and this run's inputs, in words. A setting
    added to TrainSettings after run.json was written (LATER_SETTINGS) counts as its default."""
    defaults = dataclasses.asdict(TrainSettings())
    before = {**{k: defaults[k] for k in LATER_SETTINGS}, **previous.get("settings", {})}
    changed = sorted(k for k in set(before) | set(recorded["settings"]) if before.get(k) != recorded["settings"].get(k))
    out = [f"--{k.replace('_', '-')} {before.get(k)} → {recorded['settings'].get(k)}" for k in changed]
    for key, flag in (("base", "--base"), ("data", "--data"), ("init_head", "--init-head"),
                      ("regenerate", "--regenerate")):
        if key in previous and previous[key] != recorded[key]:
            out.append(f"{flag} {previous[key]} → {recorded[key]}")
    if previous.get("data") == recorded["data"] and previous.get("data_sha256") not in (None, recorded["data_sha256"]):
        out.append(f"the content of --data {recorded['data']} (sha256 {previous['data_sha256'][:12]}… → "
                   f"{recorded['data_sha256'][:12]}…)")
    return out


def claim_run_folder(out: Path, recorded: dict, has_checkpoint: bool) -> None:
    """Check `out` against this run and record it in run.json. A folder that holds checkpoints
    resumes only with the same inputs (anything else is refused, naming what differs); one that
    was never trained (an earlier run failed or stopped before its first checkpoint) is taken over,
    dropping what was derived from the old inputs."""
    run_file = out / "run.json"
    if run_file.exists():
        try:
            previous = read_json(run_file, "the run's record")
            if not isinstance(previous, dict):
                raise FileFormatError(run_file, "not a JSON object")
        except FileFormatError:
            previous = {"settings": {}, "damaged": True}
        changed = differences(previous, recorded) if not previous.get("damaged") else ["run.json is damaged"]
        if changed and has_checkpoint:
            raise InputError(f"{out} holds checkpoints of a run with other settings or data ({'; '.join(changed)}); "
                             "it resumes only with the same options and data. Pass a fresh --out to train anew, or "
                             "rerun with the options it was made with.")
        if changed:
            stale = [name for name in DERIVED if (out / name).exists()]
            for name in stale:
                (out / name).unlink()
            print(f"{out}: its earlier run had not trained yet and was made with other inputs ({'; '.join(changed)});"
                  f" starting over{' (rebuilding ' + ', '.join(stale) + ')' if stale else ''}", file=sys.stderr)
    write_json_atomic(run_file, recorded)


class _DropBars:
    """A stderr that passes messages on and drops progress bars (tqdm rewrites its line with \r)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return len(text) if "\r" in text else self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def cached(path: Path, load):
    """What `load` reads from a file this run folder derived before (data.npz, vocab.npz), or None
    when there is none; a damaged one (a FileFormatError) is named in a notice and derived again."""
    if not path.exists():
        return None
    try:
        return load(path)
    except FileFormatError as e:
        print(f"dart_jax.train: {e} It is derived again.", file=sys.stderr)
        return None


def open_taps(args, out: Path, data: Dataset, target, settings: TrainSettings, mesh, pad_id: int, progress: bool,
              needed: bool) -> TapsCache | None:
    """The taps cache of this run (built or completed first) when --taps picks it, else None."""
    folder = Path(args.taps_dir) if args.taps_dir else out / "taps"
    mode, why = choose_mode(args.taps, data, state_width(target.config), args.taps_dtype, folder, settings.epochs)
    if mode == "online" or not needed:
        print(f"taps: online ({why})" if needed else "taps: nothing left to train", file=sys.stderr)
        return None
    print(f"taps: {why} in {folder}", file=sys.stderr)
    return build_cache(folder, data, target, target_identity(target, args.base), dtype=args.taps_dtype,
                       batch_size=settings.batch_size, max_length=settings.max_length, mesh=mesh, pad_id=pad_id,
                       shard_bytes=int(args.taps_shard_mb * 2**20), progress=progress,
                       log=lambda line: print(line, file=sys.stderr))


def run(args) -> Path:
    use_compile_cache()  # the target's and the step's programs are kept on disk for the next run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mesh = make_mesh(args.mesh, option="--mesh") if getattr(args, "mesh", None) else data_mesh()
    n_dev = mesh.shape["data"]
    if args.batch_size % n_dev:
        raise ValueError(f"--batch-size {args.batch_size} must be a multiple of the {n_dev} data-parallel devices "
                         "(the mesh's data axis)")
    if not Path(args.data).is_file():
        raise FileNotFoundError(f"--data {args.data}: no such file; pass a JSONL file of conversations.")
    progress = not args.no_progress
    bars = contextlib.nullcontext() if progress else contextlib.redirect_stderr(_DropBars(sys.stderr))
    with bars:
        target = load_target(args.base, dtype=args.dtype, mesh=mesh)
    settings = settings_from_args(args, target.config.vocab_size)

    eagle3 = settings.method == "eagle3"
    init = None
    if args.init_head:
        with bars:
            init = (load_eagle3_head if eagle3 else load_dart_head)(args.init_head, target, dtype=jnp.float32)
        init_vocab = init.config.draft_vocab_size
        if args.draft_vocab is not None and args.draft_vocab != init_vocab and (eagle3 or args.draft_vocab < init_vocab):
            raise ValueError(f"--init-head has a draft vocabulary of {init_vocab}: a DART head's can grow (a larger "
                             f"--draft-vocab), never shrink, and an EAGLE-3 head's is kept; drop --draft-vocab or pass "
                             f"{'' if eagle3 else 'at least '}{init_vocab}")
        if not eagle3 and init.config.draft_length != settings.draft_length:
            raise ValueError(f"--init-head has draft_length {init.config.draft_length}; pass --draft-length "
                             f"{init.config.draft_length}")
        settings = dataclasses.replace(settings, draft_vocab=max(args.draft_vocab or 0, init_vocab))
    recorded = {"settings": dataclasses.asdict(settings), "base": str(args.base), "data": str(Path(args.data).absolute()),
                "data_sha256": file_sha256(args.data), "init_head": args.init_head, "regenerate": args.regenerate}
    checkpoints = Checkpoints(out / "ckpt", args.keep_last)
    try:  # a failed run still closes its checkpoint manager
        if is_writer():  # one process writes the run's files (python -m dart_jax.launch: several)
            claim_run_folder(out, recorded, checkpoints.latest_step() is not None)
        wait_for_all("dart_jax.train: run folder claimed")

        tokenizer = load_tokenizer(args.tokenizer or target_folder(args.base))
        pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else 0
        data_file = out / "data.npz"
        data = cached(data_file, Dataset.load)
        if data is None:
            conversations, bad = read_conversations(args.data, skip_bad=args.skip_bad)
            if bad:
                print(f"skipped {bad} malformed lines of {args.data}", file=sys.stderr)
            if args.regenerate:
                regen = Regenerator(target, tokenizer, max_new_tokens=args.regen_max_new,
                                    temperature=args.regen_temperature, seed=args.seed)
                bar = tqdm(conversations, desc="regenerate", disable=not progress)
                conversations = [regen.conversation(c, i) for i, c in enumerate(bar)]
                if is_writer():
                    with open(out / "regenerated.jsonl", "w", encoding="utf-8") as f:
                        for c in conversations:
                            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
            data, dropped = encode_dataset(tokenizer, conversations, settings.max_length, progress=progress)
            if dropped:
                print(f"dropped {dropped} conversations with no assistant token within --max-length", file=sys.stderr)
            if is_writer():
                data.save(data_file)

        vocab_file = out / "vocab.npz"
        used = cached(vocab_file, lambda path: read_npz(path, ("used",))["used"])
        if used is None and init is not None:
            used = used_from_d2t(np.asarray(init.d2t.get_value()))
            if settings.draft_vocab > len(used):  # grown by the training targets it lacks, most frequent first
                used = grow_draft_vocab(used, zip(data.ids, data.loss_mask), target.config.vocab_size,
                                        settings.draft_vocab)
        elif used is None:
            used, _, _ = build_draft_vocab(zip(data.ids, data.loss_mask), target.config.vocab_size, settings.draft_vocab)
        save_npz_atomic(vocab_file, used=used)

        if init is not None:
            head = init if len(used) == init.config.draft_vocab_size else widened_head(init, target, used)
        elif eagle3:
            head = new_eagle3_head(target, len(used), settings.rope_theta, settings.seed)
            set_vocab(head, used)
        else:
            config = head_config_for(target.config, settings.draft_length, len(used), settings.rope_theta)
            head = DartHead(config, target.embed_tokens, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(settings.seed))
            set_vocab(head, used)
        shard_module(head, mesh)

        per_epoch = batches_per_epoch(len(data), settings.batch_size)
        total = settings.epochs * per_epoch
        loss_fn = functools.partial(eagle3_loss, gamma=settings.gamma, steps=settings.ttt_steps) if eagle3 else None
        trainer = Trainer(target, head, settings, total // settings.grad_accum, mesh, loss_fn)
        start, state = checkpoints.restore_latest(trainer.train_state(), writer=is_writer(),
                                                  log=lambda line: print(line, file=sys.stderr))
        if start:
            trainer.load_train_state(state)
            print(f"resuming from micro-step {start} of {total}", file=sys.stderr)
        end = total if args.stop_after is None else min(total, args.stop_after)
        print(f"{len(data)} samples, {per_epoch} batches/epoch, {total} micro-batches, draft vocab {len(used)}, "
              f"{n_dev} device(s) ({jax.default_backend()})", file=sys.stderr)
        taps = open_taps(args, out, data, target, settings, mesh, pad_id, progress, start < end or args.profile is not None)
        if args.profile:
            report = profile(trainer, data, settings, start_step=start, steps=args.profile, pad_id=pad_id, taps=taps,
                             mode="online" if taps is None else "cache")
            print(profile_table(report))
            write_json_atomic(Path(args.profile_json or out / "profile.json"), report)
            return out
        train_loop(trainer, data, settings, checkpoints, start_step=start, end_step=end, save_every=args.save_every,
                   log_every=args.log_every, pad_id=pad_id, progress=progress,
                   log=lambda line: print(line, file=sys.stderr), metrics_file=out / "metrics.json", taps=taps)
    finally:
        checkpoints.close()
    if end < total:
        print(f"stopped after micro-step {end} of {total}; run again with the same --out to resume", file=sys.stderr)
        return out
    if not is_writer():
        return out / "head"
    if eagle3:
        folder = save_eagle3_head(out / "head", trainer.head())
    else:
        folder = save_dart_head(out / "head", trainer.head_config, nnx.state(trainer.head()))
    print(f"exported the head to {folder}", file=sys.stderr)
    return folder


def cli(argv=None) -> int:
    """`main` for the command line: a bad input is one `error:` line and exit code 2, not a traceback."""
    return cli_boundary(lambda: main(argv), prog="dart_jax.train")


if __name__ == "__main__":
    sys.exit(cli())
