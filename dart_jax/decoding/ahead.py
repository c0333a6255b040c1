"""A pool's programs compiled ahead of time, without running them (the server's warm-up).

Every jitted program a pool (`batcher.SlotPool`) calls is one executable per static shape: the
live rows m (`live_rows`: the power of two holding the highest busy slot, at most the pool), the
attention window (`attention_window`: it follows the committed length, or a prefill chunk's
offset) and the tree size; a prompt of any length is prefilled in chunks of one shape. `programs` lists those a pool runs for m live rows,
prompts of up to `prompt_length` tokens and sequences of up to `length` tokens, each a `Program`
whose `compile()` lowers and compiles it (`jit(...).lower(...).compile()`) with the arguments the
pool passes: its own state (the arrays' shapes, dtypes and placement; lowering reads no data, so
a state donated meanwhile does no harm) and stand-ins of the shapes of its host-made inputs
(which the pool moves with `sampling.to_device`: no program of their own; a program in the store
of exported programs is read back, not traced: `exported`). JAX keeps what was compiled this way for the pool's calls: the
pool's first step of that shape compiles nothing. A DART pool's host search (Numba) is compiled by
one search of one tree and one of two (its single-tree and its batch kernel).

The arguments are built as the pools build them (the same windows, chunks, layouts and static
arguments); `tests/test_serve_ready.py` counts JAX's compilations after a warm-up to keep the two
in step. Programs of a mesh's engine are not listed: the engine's calls place their inputs on the
mesh (`inputs_on_mesh`), which a lowering here would not repeat; such a pool compiles in its
first steps.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .autoregressive import attention_window
from .engine import DeviceLoop
from .layout import tree_layout


@dataclasses.dataclass(frozen=True)
class Program:
    """One program of a pool: `kind` ("prefill", "step", "plain" (the plain chunk of keep="auto"),
    "loop" (the device loop), "search" (the host's tree search); "ar prefill" and "ar chunk" for
    plain decoding's pool), its live `rows`, `shape` (the attention window, the trees searched at
    once by a search), the tree `size` (None where
    there is none) and `greedy`, the static sampling branch it was compiled for (None: decided on
    the device). `lower()` traces and lowers it (Python) and returns what compiles it (XLA, which
    leaves the GIL); `compile()` does both. Equal programs compile once."""

    kind: str
    rows: int
    shape: int
    size: int | None = None
    greedy: bool | None = None
    lower: Callable[[], Callable[[], object]] = dataclasses.field(default=lambda: lambda: None, repr=False,
                                                                   compare=False)

    def compile(self) -> object:
        return self.lower()()


def prefill_windows(chunk: int, reach: int, prompt_length: int, cache: int) -> list[int]:
    """The attention windows of the prefill chunks (of `chunk` tokens, each reading or writing
    `reach` slots past its offset) of prompts of 1 … `prompt_length` tokens, in a cache of `cache` slots."""
    return sorted({attention_window(offset + reach, cache) for offset in range(0, prompt_length, chunk)})


def windows(reach: int, length: int, cache: int) -> list[int]:
    """The attention windows of a pool whose cache holds `cache` slots, over committed lengths of
    1 … `length` tokens, each step reading or writing `reach` slots past them."""
    out, needed = [], 1 + reach
    while needed <= length + reach:
        out.append(attention_window(needed, cache))
        if out[-1] >= cache:
            break
        needed = out[-1] + 1
    return out


def programs(pool, rows: int, prompt_length: int, length: int) -> list[Program]:
    """The programs `pool` (a `Batcher` or a `PlainBatcher`) runs with `rows` live rows for prompts
    of up to `prompt_length` tokens and sequences (prompt and answer) of up to `length` tokens, both
    cut at the pool's max_length: its prefill chunk at every window the prompts reach, then its steps at every
    attention window — for a `Batcher` each tree size of its engine (size 0: the plain chunk of
    keep="auto") or its device loop, and its host search; for a `PlainBatcher` its chunk of plain
    decoding. Empty for an engine over a mesh (module docstring)."""
    if pool.engine.mesh is not None:
        return []
    length = min(int(length), pool.max_length)
    prompt_length = min(int(prompt_length), length - 1)
    if hasattr(pool, "decoder"):
        return _plain_programs(pool, rows, prompt_length, length)
    return _dart_programs(pool, rows, prompt_length, length)


def _host(*shape, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
    """A host-made input of the pool: a NumPy array, moved with `sampling.to_device` (no program of its own)."""
    return jax.ShapeDtypeStruct(shape, dtype)


def _program(kind: str, rows: int, shape: int, size, state, fn, /, *args, **kwargs) -> Program:
    """`fn` (a jitted function) lowered and compiled for `args` and `kwargs`."""
    def lower():
        return fn.lower(*args, **kwargs).compile
    return Program(kind, rows, shape, size, state.params.all_greedy, lower)


def _variants(state) -> list:
    """The pool's state for each compiled variant of its sampling branch: itself where the branch
    is decided on the device (a CPU), else every row greedy and a row sampling (`SamplingParams`)."""
    if state.params.all_greedy is None:
        return [state]
    return [state.replace(params=dataclasses.replace(state.params, all_greedy=g)) for g in (True, False)]


def _dart_programs(pool, m: int, prompt_length: int, length: int) -> list[Program]:
    """A `Batcher`'s programs (its `_admit`, and its advance modes: `advance.HostStep`, `PlainChunk`, `DeviceLoop`)."""
    engine, depth, k, cache = pool.engine, pool.depth, pool.k, pool.length
    reach = engine.drafter.reach
    out = []
    for state in _variants(pool.state):
        chunk = engine.shapes.chunk
        for window in prefill_windows(chunk, reach(chunk), prompt_length, cache):
            ids, lengths, start = _host(m, chunk + 1), _host(m), _host(m)
            out.append(_program("prefill", m, window, None, state, engine._prefill, engine._state, ids, lengths, start,
                                state, rows=depth, k=k, nodes=engine.n_nodes,
                                window=window))
        if engine.device_steps:
            out += _loop_programs(pool, m, length, state)
            continue
        for size in engine.tree_sizes:
            if size == 0:
                chunk = engine.plain_chunk
                roots, remaining = _host(m), _host(m)
                out += [_program("plain", m, window, 0, state, engine._plain, engine._state, roots, state, remaining,
                                 engine.eos_row, chunk=chunk, depth=depth, k=k, window=window)
                        for window in windows(reach(chunk), length, cache)]
                continue
            tree = _host(m, tree_layout(size + 1, depth).size)  # handed over as NumPy: no move of its own
            out += [_program("step", m, window, size, state, engine._step, engine._state, tree, state, n=size + 1,
                             depth=depth, k=k, window=window)
                    for window in windows(reach(depth + 1), length, cache)]
    if not engine.device_steps and any(engine.tree_sizes):
        out.append(_search(pool, min(m, 2)))
    return out


def _search(pool, trees: int) -> Program:
    """The host's search of `trees` trees at once over zero proposals (`Batcher._search`): Numba
    compiles its kernels by their argument types, one for a single tree and one for a batch."""
    engine = pool.engine
    size = min(s for s in engine.tree_sizes if s)
    fields = {f.name: np.zeros((trees, *f.shape), np.float32 if f.dtype == "float32" else np.int32)
              for f in pool.fields}

    def run():
        return engine.drafter.tree(fields, np.zeros((trees, pool.context), np.int64), np.ones(trees, np.int64),
                                   engine.trie, engine.tree_settings(size), engine.tree_eos_id)
    return Program("search", trees, trees, None, None, lambda: run)


def _loop_programs(pool, m: int, length: int, state) -> list[Program]:
    """The device loop's programs (`advance.DeviceLoop`)."""
    engine, depth, k = pool.engine, pool.depth, pool.k
    steps = engine.device_steps
    pending = {f.name: _host(m, *f.shape, dtype=jnp.float32 if f.dtype == "float32" else jnp.int32)
               for f in pool.fields}
    pending.update(preceding=_host(m, pool.context), preceding_len=_host(m))
    limits = {"remaining": _host(m), "stops": _host(m, dtype=jnp.bool_)}
    inputs = {**limits, "eos": engine.eos_row, "edit": None}
    loop = DeviceLoop(steps, engine._device_search, None)
    reach = (steps - 1) * (depth + 1) + engine.drafter.reach(depth + 1)
    return [_program("loop", m, window, engine.tree.keep, state, engine._device_loop, engine._state, pending,
                     engine.device_trie(), state, inputs, n=engine.n_nodes,
                     depth=depth, k=k, window=window, loop=loop)
            for window in windows(reach, length, pool.length)]


def _plain_programs(pool, m: int, prompt_length: int, length: int) -> list[Program]:
    """A `PlainBatcher`'s programs (its `_admit` and `_advance`)."""
    engine, d = pool.engine, pool.decoder
    out = []
    for state in _variants(pool.state):
        chunk = engine.shapes.chunk
        for window in prefill_windows(chunk, chunk, prompt_length, pool.length):
            ids, lengths, start = _host(m, chunk), _host(m), _host(m)
            out.append(_program("ar prefill", m, window, None, state, d.prefill, d.state, ids, lengths, start,
                                pool.token, state, window=window))
        remaining = _host(m)
        out += [_program("ar chunk", m, window, None, state, d.decode_chunk, d.state, pool.token, state, remaining,
                         engine.eos_row, window=window, chunk=d.chunk, live=m)
                for window in windows(d.chunk, length, pool.length)]
    return out
