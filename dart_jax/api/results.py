"""What a generation gives back: `GenerationResult`, its figures (tokens/s with compilation left
out), the notice when max_length cut an answer, and the tests of what a prompt is. Re-exported by
`dart_jax.api.model`."""
from __future__ import annotations

import dataclasses
from typing import AbstractSet, Any, Iterable, Mapping, Sequence

import numpy as np

from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.errors import InputError


@dataclasses.dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only; a final EOS (or stop id) is included when generation stopped on it
    text: str  # the answer: without a stop string, and without Qwen3's <think> block (see `thinking`)
    accept_lengths: list[int]  # per speculative step, k+1 (the bonus token counted)
    stats: dict[str, Any]  # figures(): tokens_per_s leaves compilation out, compile_s says how much there was
    prompt_ids: list[int]
    # "eos": an EOS id of the model; "stop": a stop string or stop id; "length": max_new_tokens or max_length
    finish_reason: str = "length"
    thinking: str | None = None  # the text inside <think>…</think> when the chat template has Qwen3's switch


def figures(stats: Stats, compile_s: float = 0.0, new_tokens: int | None = None, wall_s: float | None = None,
            warm: tuple[int, float] | None = None) -> dict[str, Any]:
    """A generation's figures for users. `compile_s`: the time spent compiling within the
    generation's `wall_s` (default its total_s). `tokens_per_s`: the steady-state speed: when
    something compiled, the tokens per second of the steps that compiled nothing (`warm`: their
    tokens and seconds; a freshly compiled program's first run is slow beyond its compilation),
    else of the whole call. `wall_tokens_per_s`: everything counted in."""
    out = stats.as_dict()
    if new_tokens is not None:
        out["new_tokens"] = new_tokens
    n = out["new_tokens"]
    wall = out["total_s"] if wall_s is None else float(wall_s)
    compile_s = min(float(compile_s), wall)
    out["compile_s"] = compile_s
    if compile_s == 0:
        out["tokens_per_s"] = n / wall if wall > 0 else 0.0
    elif warm is not None and warm[0] > 0 and warm[1] > 0:
        out["tokens_per_s"] = warm[0] / warm[1]
    else:  # every step compiled: the best there is
        out["tokens_per_s"] = n / (wall - compile_s) if wall - compile_s > 0 else 0.0
    out["wall_tokens_per_s"] = n / wall if wall > 0 else 0.0
    return out


def length_notice(result: "GenerationResult", settings: GenerationSettings) -> str | None:
    """A sentence when max_length (not max_new_tokens) cut the answer short, else None."""
    n, room = len(result.token_ids), settings.max_length - len(result.prompt_ids)
    if result.finish_reason != "length" or n >= settings.max_new_tokens or n < room:
        return None
    return (f"the answer was cut after {n} tokens by max_length {settings.max_length} (the prompt has "
            f"{len(result.prompt_ids)} tokens, max_new_tokens was {settings.max_new_tokens}); raise max_length "
            "(--max-length) for a longer answer.")


def check_prompt_kind(prompt):
    """`prompt`, a one-shot iterator (a generator) read into a list once so that every later look
    sees its items; or an InputError with the fix for what cannot be a prompt, before it is taken
    apart: bytes or a memoryview (they would read as token ids), an array (NumPy, JAX, torch: its
    items are arrays, not ints), one message dict (its keys would read as two prompts), a set (its
    order is arbitrary: ids, or the results of a batch, would come in hash order), None, a number."""
    if isinstance(prompt, memoryview):
        raise InputError("the prompt is a memoryview; pass text (bytes(prompt).decode('utf-8')) or a list of int "
                         "token ids.")
    if isinstance(prompt, (bytes, bytearray)):
        raise InputError("the prompt is bytes; pass text (prompt.decode('utf-8')) or a list of int token ids.")
    if hasattr(prompt, "__array__"):
        raise InputError(f"the prompt is an array ({type(prompt).__name__}); pass prompt.tolist(): token ids, or a "
                         "list of them per prompt of a batch.")
    if isinstance(prompt, Mapping):
        raise InputError("the prompt is one message dict; wrap it in a list to pass a messages list: "
                         "[{'role': 'user', 'content': ...}].")
    if isinstance(prompt, AbstractSet):
        raise InputError(f"the prompt is a {type(prompt).__name__}, whose order is arbitrary (token ids, or a batch's "
                         "results, would come in hash order); pass a list.")
    if not isinstance(prompt, (str, Iterable)):
        raise InputError(f"the prompt must be a string, a list of int token ids, a messages list of {{'role', "
                         f"'content'}} dicts, or a list of those; got {type(prompt).__name__} {prompt!r:.40}.")
    return prompt if isinstance(prompt, (str, Sequence)) else list(prompt)


def is_batch(prompt) -> bool:
    """Whether `prompt` is a list of prompts: not a string, not a sequence of token ids, not a
    `messages` list of {role, content} dicts."""
    prompt = check_prompt_kind(prompt)
    if isinstance(prompt, str):
        return False
    items = list(prompt)
    if not items:
        raise ValueError("the prompt is empty: pass a string, token ids, a messages list, or a non-empty list of those.")
    if all(isinstance(t, (int, float, np.number)) for t in items):
        _check_ids(items)
        return False
    return not all(isinstance(t, Mapping) for t in items)


def _check_ids(items: Sequence) -> list[int]:
    """Token ids as ints; floats and bools are an error, not truncated."""
    bad = [t for t in items if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer))]
    if bad:
        raise InputError(f"token ids must be integers, got {bad[0]!r}; pass a string, a list of int token ids, "
                         "or a messages list.")
    return [int(t) for t in items]


def _finish_reason(token_ids: Sequence[int], eos_ids: frozenset[int]) -> str:
    return "eos" if token_ids and token_ids[-1] in eos_ids else "length"
