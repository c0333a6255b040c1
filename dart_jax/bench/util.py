"""Timing, statistics and environment helpers shared by the benchmark modes."""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from dart_jax.bench.options import CLOCKS  # noqa: F401 (--clock's choices; importable here, as before)


# one busy neighbour (`busy_neighbours`): a process that alternates a small matmul (the core's
# arithmetic) with a sweep over 64 MB (its share of the memory bandwidth), single-threaded, until
# its time limit or its parent's end
_NEIGHBOUR = """
import os, sys, time
import numpy as np
parent, end = os.getppid(), time.monotonic() + float(sys.argv[1])
a, b = np.random.default_rng(0).random((192, 192)), np.zeros(8 << 20)
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20):
        a = np.tanh(a @ a)
    b += 1.0
"""


@contextlib.contextmanager
def busy_neighbours(n: int, limit_s: float = 4 * 3600):
    """Run the block beside `n` processes that keep a core busy each (`--neighbours`), as other
    work on a shared machine does: compute and memory sweeps, one thread each. They end with the
    block, at `limit_s` seconds, or when this process dies."""
    if n < 0:
        raise ValueError(f"--neighbours must be >= 0, got {n}")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _NEIGHBOUR, str(limit_s)], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def check_reps(reps: int, warmup: int) -> None:
    if reps < 1 or warmup < 0:
        raise ValueError(f"--reps must be >= 1 and --warmup >= 0, got {reps} and {warmup}")


def time_calls(fn: Callable[[], Any], *, reps: int, warmup: int, tick: Callable[[], Any] | None = None,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds per call of `fn` over `reps` timed calls after `warmup` untimed ones.

    Device work is waited for with `jax.block_until_ready`, so asynchronous dispatch cannot
    hide it. `tick` is called after every call (a progress bar's update); `clock` is one of
    CLOCKS' values.
    """
    check_reps(reps, warmup)
    for _ in range(warmup):
        jax.block_until_ready(fn())
        if tick:
            tick()
    times = []
    for _ in range(reps):
        t0 = clock()
        jax.block_until_ready(fn())
        times.append(clock() - t0)
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


def zipf_probs(vocab: int, exponent: float = 1.1) -> np.ndarray:
    """P(id) ∝ (id + 1)^-exponent over [0, vocab): a few frequent tokens and a long tail, the
    skewed law of text, so that a trie built on such ids has text's fan-out."""
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -exponent
    return p / p.sum()


def zipf_tokens(rng: np.random.Generator, n: int, vocab: int, exponent: float = 1.1) -> np.ndarray:
    """`n` token ids in [0, vocab) drawn from `zipf_probs`."""
    return rng.choice(vocab, size=n, p=zipf_probs(vocab, exponent)).astype(np.int64)


def progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr (stdout stays clean for --json)."""
    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, leave=False)
