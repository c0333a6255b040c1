"""Timing, statistics and environment helpers shared by the benchmark modes."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np


def block(x: Any) -> Any:
    """Wait for every device array in `x` (a no-op for host values)."""
    import jax

    return jax.block_until_ready(x)


def time_calls(fn: Callable[[], Any], *, reps: int, warmup: int, tick: Callable[[], Any] | None = None) -> list[float]:
    """Seconds per call of `fn` over `reps` timed calls after `warmup` untimed ones.

    Device work is waited for with `jax.block_until_ready`, so asynchronous dispatch cannot
    hide it. `tick` is called after every call (a progress bar's update).
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}; pass --reps 1 or more")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        block(fn())
        if tick:
            tick()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        block(fn())
        times.append(time.perf_counter() - t0)
        if tick:
            tick()
    return times


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Median, min and max of durations, in milliseconds."""
    if not seconds:
        raise ValueError("no timings to summarise")
    ms = [s * 1e3 for s in seconds]
    return {"median_ms": float(statistics.median(ms)), "min_ms": float(min(ms)), "max_ms": float(max(ms))}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if len(values) else float("nan")


def parse_int_list(text: str, *, name: str, minimum: int = 1) -> list[int]:
    """'1,8,16' → [1, 8, 16]; a ValueError naming the option on anything else."""
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} expects comma-separated integers such as '1,8,16', got {text!r}") from None
    if not values or min(values) < minimum:
        raise ValueError(f"{name} expects integers >= {minimum}, got {text!r}")
    return values


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    """What the numbers were measured on: JAX backend, devices, host CPU."""
    import jax

    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "host": platform.node(),
        "cpu": _cpu_name(),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
    }


def meta(argv: Sequence[str] | None) -> dict[str, Any]:
    """Date, the command line and the hardware of this run (recorded with every result)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m dart_jax.bench " + shlex.join(args),
        "hardware": hardware(),
    }


def zipf_tokens(rng: np.random.Generator, n: int, vocab: int, exponent: float = 1.1) -> np.ndarray:
    """`n` token ids in [0, vocab) with a Zipf-like law, so that an n-gram trie built on them has
    the skewed fan-out of real text (a few frequent tokens, a long tail)."""
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = ranks ** -exponent
    p /= p.sum()
    return rng.choice(vocab, size=n, p=p).astype(np.int64)


def progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr (stdout stays clean for --json)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, leave=False)
