"""`python -m dart_jax.train ... --profile N`: where a training step's time goes.

The step is run in separately jitted pieces, each timed with `jax.block_until_ready` after it:
data loading (the batch made on the host, and its taps read from the cache in cache mode), host
work (the batch put on the devices, the loss and metric sums read back), the target's forward
(`Trainer.states`; not run in cache mode), the head's forward and backward with the teacher's
logits (`Trainer.grads`) and the optimizer (`Trainer.update`). The same steps are also timed as
the trainer runs them, one fused jitted step, which XLA may schedule better than the pieces: both
are shown. The profile trains (it takes N split and N fused steps from the run's position) but
saves nothing but its table.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from .data import Dataset
from .loop import Trainer, load_batch
from .settings import TrainSettings

PARTS = ("data", "host", "target", "head", "optimizer")
LABELS = {"data": "data loading", "host": "host work", "target": "target forward",
          "head": "head forward+backward", "optimizer": "optimizer"}


def split_step(trainer: Trainer, data: Dataset, settings: TrainSettings, step: int, pad_id: int, taps) -> dict:
    """One training step in pieces: {part: seconds} of PARTS, "step" (the wall time of it all) and "tokens"."""
    times = {}
    start = last = time.perf_counter()

    def lap(part):
        nonlocal last
        now = time.perf_counter()
        times[part] = times.get(part, 0.0) + now - last
        last = now

    batch, tokens = load_batch(data, settings, step, pad_id, taps)
    lap("data")
    batch = jax.block_until_ready(trainer.put(batch))
    lap("host")
    if "states" not in batch:
        batch["states"] = jax.block_until_ready(trainer.states(trainer.target_state, batch["ids"]))
    lap("target")
    (loss, sums), grads = jax.block_until_ready(trainer.grads(trainer.params, trainer.target_state, batch))
    lap("head")
    trainer.params, trainer.opt_state = jax.block_until_ready(trainer.update(trainer.params, trainer.opt_state, grads))
    lap("optimizer")
    jax.device_get((loss, sums))
    lap("host")
    return {**times, "step": last - start, "tokens": tokens}


def fused_step(trainer: Trainer, data: Dataset, settings: TrainSettings, step: int, pad_id: int, taps) -> dict:
    """One training step as `train_loop` runs it: {"data", "device" (put and the jitted step), "host", "step", "tokens"}."""
    start = time.perf_counter()
    batch, tokens = load_batch(data, settings, step, pad_id, taps)
    loaded = time.perf_counter()
    loss, sums = trainer.step(batch)
    jax.block_until_ready((trainer.params, loss, sums))
    stepped = time.perf_counter()
    jax.device_get((loss, sums))
    end = time.perf_counter()
    return {"data": loaded - start, "device": stepped - loaded, "host": end - stepped, "step": end - start,
            "tokens": tokens}


def profile(trainer: Trainer, data: Dataset, settings: TrainSettings, *, start_step: int, steps: int, pad_id: int,
            taps=None, mode: str = "online") -> dict:
    """Time `steps` split and `steps` fused steps from micro-step `start_step` (wrapping around the
    run's steps), after one warm-up step of each kind per padded length met (compilations excluded)."""
    total = settings.epochs * -(-len(data) // settings.batch_size)
    order = [(start_step + i) % total for i in range(steps)]
    lengths = {}
    for step in order:
        t = load_batch(data, settings, step, pad_id)[0]["ids"].shape[1]
        lengths.setdefault(t, step)
    for step in lengths.values():
        split_step(trainer, data, settings, step, pad_id, taps)
        fused_step(trainer, data, settings, step, pad_id, taps)
    split = [split_step(trainer, data, settings, step, pad_id, taps) for step in order]
    fused = [fused_step(trainer, data, settings, step, pad_id, taps) for step in order]

    def mean(rows, key):
        return float(np.mean([r.get(key, 0.0) for r in rows]))

    tokens = mean(fused, "tokens")
    return {"mode": mode, "steps": steps, "batch_size": settings.batch_size, "tokens_per_step": tokens,
            "backend": jax.default_backend(), "devices": jax.device_count(),
            "split": {**{part: mean(split, part) for part in PARTS}, "step": mean(split, "step")},
            "fused": {key: mean(fused, key) for key in ("data", "device", "host", "step")},
            "tokens_per_s": tokens / mean(fused, "step")}


def table(result: dict) -> str:
    """The profile as a text table: seconds per step and share of the split step."""
    split, fused = result["split"], result["fused"]
    rows = [f"profile of {result['steps']} steps ({result['mode']} taps, batch {result['batch_size']}, "
            f"{result['tokens_per_step']:.0f} tokens a step, {result['backend']} x{result['devices']})",
            f"{'part':<24}{'ms/step':>10}{'share':>8}"]
    for part in PARTS:
        rows.append(f"{LABELS[part]:<24}{1e3 * split[part]:>10.2f}{100 * split[part] / split['step']:>7.1f}%")
    rows += [f"{'sum of the parts':<24}{1e3 * sum(split[p] for p in PARTS):>10.2f}",
             f"{'split step (wall)':<24}{1e3 * split['step']:>10.2f}",
             f"{'fused step (wall)':<24}{1e3 * fused['step']:>10.2f}   "
             f"(data {1e3 * fused['data']:.2f}, device {1e3 * fused['device']:.2f}, host {1e3 * fused['host']:.2f})",
             f"{'tokens/s (fused)':<24}{result['tokens_per_s']:>10.1f}"]
    return "\n".join(rows)
