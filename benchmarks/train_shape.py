"""The trainer at a target's real shape, random weights: tokens/s, device memory, online vs cached taps.

    python benchmarks/train_shape.py --shape Qwen3-8B [--layers 36] [--seq 2048] [--batch 4] [--steps 3] --output FILE.json
    python benchmarks/train_shape.py --shape tiny --layers 6 --seq 128 --batch 2 --steps 2 --output FILE.json  # a CPU check

No checkpoint and no data are needed: the target's weights are drawn on the device
(`bench.e2e.random_target`, the random sets' law, in the trainer's dtype: bfloat16 on an
accelerator, float32 on a CPU), the data are random token ids, every sequence `--seq` long (every
token on the loss mask), and the DART head has the trainer's default sizes (`TrainSettings`:
draft length 7, 32 000 draft ids, 64 anchors a sequence; widths of the target's, as
`train.loop.head_config_for` makes them). It runs the trainer's own code, on one device:

 1. online taps: `train.profile.profile` (the step in jitted pieces, then as training runs it);
 2. the cache pass: `train.taps.build_cache` in bfloat16 (the `--taps-dtype` default), first over
    one batch in a scratch folder (its compilation; with a persistent compilation cache the timed
    pass loads the program), then over every sequence, timed;
 3. cached taps: the profile again, the taps read from that cache;
 4. an epoch each way (`train.loop.train_loop`, no checkpoints), compiled already by the profiles:
    the tokens/s of its metrics line;
 5. with several devices, 1 and 3 again on a data-parallel mesh over all of them (`--batch` a
    device), on the same cache; on one device this is skipped, and the JSON says so.

Device memory: after each part, the devices' `memory_stats()` (peak and in use, bytes; null where
the backend does not tell, e.g. XLA:CPU). The JSON's rows (one a mesh and taps mode) hold the
profile's split and fused step and the epoch's tokens/s; `cache_pass` holds the pass. After each
part the JSON so far goes to `<output>.partial` ("partial": true), so that a run cut short by a
time limit keeps what it measured; the finished run writes `--output` and removes it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="Qwen3-8B", help="a Qwen3 shape of bench.shapes.KNOWN_SHAPES, or tiny")
    ap.add_argument("--layers", type=int, default=None, help="depth (default the shape's)")
    ap.add_argument("--seq", type=int, default=2048, help="tokens a sequence (the trainer's --max-length)")
    ap.add_argument("--batch", type=int, default=4, help="sequences a step on one device")
    ap.add_argument("--steps", type=int, default=3, help="timed steps of each profile (after one warm-up step)")
    ap.add_argument("--epoch-steps", type=int, default=4, help="steps an epoch on one device")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, required=True, help="the JSON result")
    args = ap.parse_args(argv)
    for name in ("seq", "batch", "steps", "epoch_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def memory() -> list[dict] | None:
    """Every device's peak and current bytes in use, or None where the backend does not tell."""
    import jax  # noqa: PLC0415 (the command parses its flags before jax loads)

    stats = [d.memory_stats() for d in jax.local_devices()]
    if not all(stats):
        return None
    return [{"peak_bytes": s.get("peak_bytes_in_use"), "bytes_in_use": s.get("bytes_in_use"),
             "bytes_limit": s.get("bytes_limit")} for s in stats]


def main(argv=None) -> int:
    args = parse(argv)
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415
    from jax.sharding import Mesh  # noqa: PLC0415

    from dart_jax.bench.e2e import random_target  # noqa: PLC0415
    from dart_jax.bench.shapes import shape_fields  # noqa: PLC0415
    from dart_jax.bench.util import hardware  # noqa: PLC0415
    from dart_jax.convert.qwen3 import target_config_from_hf  # noqa: PLC0415
    from dart_jax.models.head import DartHead  # noqa: PLC0415
    from dart_jax.models.qwen3 import default_dtype  # noqa: PLC0415
    from dart_jax.models.sharding import shard_module  # noqa: PLC0415
    from dart_jax.train.data import Dataset, batches_per_epoch  # noqa: PLC0415
    from dart_jax.train.loop import Trainer, data_mesh, head_config_for, set_vocab, train_loop  # noqa: PLC0415
    from dart_jax.train.profile import profile  # noqa: PLC0415
    from dart_jax.train.settings import TrainSettings  # noqa: PLC0415
    from dart_jax.train.taps import build_cache, target_identity  # noqa: PLC0415
    from dart_jax.train.vocab import build_draft_vocab  # noqa: PLC0415

    label, fields = shape_fields(tiny=args.shape == "tiny", model=None if args.shape == "tiny" else args.shape,
                                 layers=args.layers)
    config = target_config_from_hf(fields)
    if args.seq > config.max_position_embeddings:
        raise SystemExit(f"--seq {args.seq} exceeds the shape's {config.max_position_embeddings} positions")
    devices = jax.device_count()
    defaults = TrainSettings()
    draft_vocab = min(defaults.draft_vocab, config.vocab_size)
    # one device's epoch is --epoch-steps steps; the data-parallel mesh's at least two of its own
    samples = max(args.epoch_steps * args.batch, 2 * args.batch * devices)
    rng = np.random.default_rng(args.seed)
    ids = [rng.integers(0, config.vocab_size, args.seq, dtype=np.int32) for _ in range(samples)]
    data = Dataset(ids=ids, loss_mask=[np.ones(args.seq, bool) for _ in ids])
    used, _, _ = build_draft_vocab(zip(data.ids, data.loss_mask), config.vocab_size, draft_vocab)
    dtype = default_dtype()
    start = time.perf_counter()
    target = random_target(config, args.seed, dtype)
    jax.block_until_ready(nnx.state(target))
    drawn_s = time.perf_counter() - start

    def settings_for(batch: int) -> TrainSettings:
        return TrainSettings(max_length=args.seq, batch_size=batch, draft_vocab=draft_vocab, seed=args.seed)

    def trainer_on(mesh: Mesh, settings: TrainSettings) -> Trainer:
        """The target placed on `mesh` (replicated over a data mesh) and a fresh head there, as the trainer's run does."""
        shard_module(target, mesh)
        head_config = head_config_for(target.config, settings.draft_length, draft_vocab, settings.rope_theta)
        head = DartHead(head_config, target.embed_tokens, dtype=jnp.float32, param_dtype=jnp.float32,
                        rngs=nnx.Rngs(settings.seed))
        set_vocab(head, used)
        shard_module(head, mesh)
        total = settings.epochs * batches_per_epoch(len(data), settings.batch_size)
        return Trainer(target, head, settings, total, mesh)

    def epoch(trainer: Trainer, settings: TrainSettings, taps) -> float:
        """tokens/s of one epoch, as train_loop logs it."""
        per_epoch = batches_per_epoch(len(data), settings.batch_size)
        lines = []
        train_loop(trainer, data, settings, None, start_step=0, end_step=per_epoch, save_every=per_epoch,
                   log_every=per_epoch, pad_id=0, progress=False, log=lines.append, taps=taps)
        return json.loads(lines[-1])["tokens_per_s"]

    def row(mesh_label: str, n: int, result: dict, epoch_tok_s: float | None) -> dict:
        return {"mesh": mesh_label, "devices": n, "taps": result["mode"], "batch": result["batch_size"],
                "tokens_per_step": result["tokens_per_step"], "tokens_per_s": result["tokens_per_s"],
                "split_ms": {k: 1e3 * v for k, v in result["split"].items()},
                "fused_ms": {k: 1e3 * v for k, v in result["fused"].items()},
                "epoch_tokens_per_s": epoch_tok_s, "memory": memory()}

    out = {"mode": "train", "meta": {"hardware": hardware()},
           "config": {"shape": args.shape, "label": label, "layers": config.num_hidden_layers,
                      "hidden": config.hidden_size, "vocab": config.vocab_size, "seq": args.seq, "batch": args.batch,
                      "samples": samples, "steps": args.steps, "target_dtype": np.dtype(dtype).name,
                      "draft_length": defaults.draft_length, "draft_vocab": draft_vocab,
                      "anchors_per_seq": defaults.anchors_per_seq, "weights": "drawn on the device",
                      "drawn_seconds": drawn_s},
           "rows": [], "cache_pass": None, "data_parallel": None, "partial": True}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(args.output.name + ".partial")

    def measured(new_row: dict | None = None, **parts) -> None:
        """Record a part: <output>.partial after each, so that a run cut short keeps what it measured."""
        if new_row is not None:
            out["rows"].append(new_row)
            r = new_row
            print(f"{r['mesh']:>9} {r['taps']:>6}: {r['tokens_per_s']:10.1f} tok/s (profile), "
                  f"{r['epoch_tokens_per_s']:10.1f} tok/s (epoch)", flush=True)
        out.update(parts)
        partial.write_text(json.dumps(out, indent=1) + "\n")

    one = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    settings = settings_for(args.batch)
    trainer = trainer_on(one, settings)
    online = profile(trainer, data, settings, start_step=0, steps=args.steps, pad_id=0)
    measured(row("1 device", 1, online, epoch(trainer, settings, None)))
    with tempfile.TemporaryDirectory(prefix="dart_jax_train_shape_") as tmp:
        identity = target_identity(target, f"random {label}")
        opts = {"dtype": "bfloat16", "batch_size": settings.batch_size, "max_length": args.seq, "mesh": one,
                "pad_id": 0, "shard_bytes": 256 * 2**20, "progress": False, "log": lambda line: None}
        start = time.perf_counter()
        build_cache(Path(tmp) / "warm-up", Dataset(ids=ids[:args.batch], loss_mask=data.loss_mask[:args.batch]),
                    target, identity, **opts)
        warm_s = time.perf_counter() - start
        start = time.perf_counter()
        cache = build_cache(Path(tmp) / "taps", data, target, identity, **opts)
        pass_s = time.perf_counter() - start
        tokens = samples * args.seq
        measured(cache_pass={"tokens": tokens, "seconds": pass_s, "tokens_per_s": tokens / pass_s,
                             "warm_up_seconds": warm_s, "dtype": "bfloat16",
                             "bytes": sum(p.stat().st_size for p in (Path(tmp) / "taps").glob("shard-*.bin")),
                             "memory": memory()})
        print(f"cache pass: {tokens} tokens in {pass_s:.2f} s (warm-up {warm_s:.2f} s)", flush=True)
        cached = profile(trainer, data, settings, start_step=0, steps=args.steps, pad_id=0, taps=cache, mode="cache")
        measured(row("1 device", 1, cached, epoch(trainer, settings, cache)))
        if devices > 1:
            wide = settings_for(args.batch * devices)
            trainer = trainer_on(data_mesh(), wide)
            for taps, mode in ((None, "online"), (cache, "cache")):
                result = profile(trainer, data, wide, start_step=0, steps=args.steps, pad_id=0, taps=taps, mode=mode)
                measured(row(f"data={devices}", devices, result, epoch(trainer, wide, taps)))
            data_parallel = f"data={devices}: {args.batch} sequences a device"
        else:
            data_parallel = "skipped: one device (a data-parallel mesh needs several)"
    out.update(data_parallel=data_parallel, partial=False)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    partial.unlink()
    print(f"data-parallel mesh: {data_parallel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
