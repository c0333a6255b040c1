"""Host-side bookkeeping of a request: its prompt's checks, its output budget, its figures."""
from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np

from dart_jax.errors import InputError


def check_prompt(prompt_ids: Sequence[int], vocab: int, max_length: int, *, max_positions: int | None = None) -> np.ndarray:
    """A prompt as int32 ids, or an InputError naming what is wrong with it: not a flat sequence of
    integers (floats and bools are refused, not truncated), ids outside the vocabulary, no room
    left under max_length, or longer than the model's positions (`max_positions`)."""
    items = list(prompt_ids) if not isinstance(prompt_ids, np.ndarray) else prompt_ids
    ids = np.asarray(items)
    if ids.ndim != 1 or ids.size == 0:
        raise InputError(f"the prompt must be a non-empty sequence of token ids, got shape {ids.shape}.")
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"prompt token ids must be integers, got {ids.dtype} values such as {ids.flat[0]!r}.")
    if ids.min() < 0 or ids.max() >= vocab:
        raise InputError(f"prompt token ids must lie in [0, {vocab}) (the target's vocabulary); "
                         f"found range [{ids.min()}, {ids.max()}].")
    if ids.size >= int(max_length):
        raise InputError(f"the prompt has {ids.size} tokens but max_length is {max_length}: max_length counts the "
                         "prompt plus the generated tokens, so raise max_length or shorten the prompt.")
    if max_positions is not None and ids.size >= max_positions:
        raise InputError(f"the prompt has {ids.size} tokens but the model knows positions up to "
                         f"{max_positions} (max_position_embeddings): shorten the prompt.")
    return ids.astype(np.int32)


def check_request(config, prompt_ids, settings, *, warn: bool = True) -> np.ndarray:
    """A request's prompt as int32 ids for a target of `config` (its vocabulary and positions), or
    an InputError naming what is wrong (`check_prompt`); warns (`warn`) when the answer may run past
    the target's max_position_embeddings, at the line that submitted the request (a pool's
    `submit`, through its engine's `check_request`)."""
    limit = config.max_position_embeddings
    ids = check_prompt(prompt_ids, config.vocab_size, settings.max_length, max_positions=limit)
    if warn and ids.size + min(settings.max_new_tokens, settings.max_length - ids.size) > limit:
        warnings.warn(f"prompt ({ids.size} tokens) + answer (up to {settings.max_new_tokens}) may run past the "
                      f"model's max_position_embeddings ({limit}); tokens past it are unreliable: lower "
                      "max_new_tokens / max_length.", stacklevel=4)
    return ids


class Budget:
    """One sequence's output: appends tokens until EOS, max_new_tokens or max_length."""

    def __init__(self, eos_ids: frozenset[int], max_new_tokens: int, room: int):
        self.eos_ids, self.limit, self.out, self.done = eos_ids, min(max_new_tokens, room), [], False

    def take(self, ids) -> list[int]:
        """Append what still counts of `ids`; returns that part."""
        kept = []
        for t in ids:
            if self.done:
                break
            kept.append(int(t))
            self.done = int(t) in self.eos_ids or len(self.out) + len(kept) >= self.limit
        self.out.extend(kept)
        return kept


@dataclasses.dataclass
class WarmTime:
    """A generation's share of its pool's device calls, the one rule for the Python API and the
    server: `compile_s`, seconds the pool spent compiling while it was there; `tokens` and
    `seconds` of the calls that moved it and compiled nothing, a call that moved it by several
    steps (an engine with `device_steps`: `StepEvent.same_call`) counted once, at its first."""

    compile_s: float = 0.0
    tokens: int = 0
    seconds: float = 0.0

    def waited(self, compiled: float) -> None:
        """A call of its pool compiled for `compiled` seconds while the generation was in it."""
        self.compile_s += compiled

    def moved(self, tokens: int, wall: float, *, compiled: bool, same_call: bool) -> None:
        """A step gave it `tokens`; its device call took `wall` seconds (`compiled`: and compiled)."""
        if not compiled:
            self.tokens += tokens
            self.seconds += 0.0 if same_call else wall

    def tokens_per_s(self, tokens: int, elapsed: float) -> float:
        """Steady-state speed of `tokens` in `elapsed` seconds: all of them when nothing compiled,
        else those of the calls that compiled nothing (a freshly compiled program's first run is
        slow beyond its compilation), else the elapsed time without the compilation."""
        if self.compile_s == 0:
            return tokens / elapsed if elapsed > 0 else 0.0
        if self.tokens > 0 and self.seconds > 0:
            return self.tokens / self.seconds
        rest = elapsed - self.compile_s
        return tokens / rest if rest > 0 else 0.0


@dataclasses.dataclass
class Stats:
    """Per-generation figures of one sequence; times in seconds."""

    new_tokens: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    total_s: float = 0.0
    prefill_s: float = 0.0  # prompt through target (+ drafter), incl. the first transfer
    device_s: float = 0.0  # per-step verify + draft on the device, incl. both transfers
    tree_s: float = 0.0  # tree construction on the CPU
    accept_lengths: list[int] = dataclasses.field(default_factory=list)
    tree_sizes: list[int] = dataclasses.field(default_factory=list)  # per speculative step, nodes besides the root
    token_ids: list[int] = dataclasses.field(default_factory=list)  # the generated ids so far
    cut: int = 0  # tokens in accept_lengths that the budget or a stop string cut off (`uncount`)

    @property
    def host_s(self) -> float:
        return max(self.total_s - self.prefill_s - self.device_s - self.tree_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def mean_accept_length(self) -> float:
        """τ: the tokens the steps gave that were kept, per step (`cut` ones left out)."""
        return (sum(self.accept_lengths) - self.cut) / len(self.accept_lengths) if self.accept_lengths else 0.0

    def uncount(self, n: int, plain: bool = False) -> None:
        """The last `n` tokens of the steps were cut off (max_new_tokens, max_length, an EOS, a stop
        string). Of a speculative step they stay in its accepted length (what the target accepted)
        and count in `cut`, which τ leaves out; plain-decoding steps (one token each) that were cut
        are no steps at all."""
        if not plain:
            self.cut += n
            return
        for _ in range(min(n, len(self.accept_lengths))):
            if len(self.tree_sizes) == len(self.accept_lengths):
                self.tree_sizes.pop()
            self.accept_lengths.pop()
            self.steps -= 1

    def as_dict(self) -> dict[str, Any]:
        return {"new_tokens": self.new_tokens, "steps": self.steps, "prompt_tokens": self.prompt_tokens,
                "tokens_per_s": self.tokens_per_s, "tau": self.mean_accept_length, "total_s": self.total_s,
                "prefill_s": self.prefill_s, "device_s": self.device_s, "tree_s": self.tree_s, "host_s": self.host_s,
                **self.tree_figures()}

    def tree_figures(self) -> dict[str, Any]:
        """With an adaptive tree budget: the tokens that came from plain-decoding chunks (size 0),
        τ over the speculative steps alone, and how many steps used each tree size."""
        if not self.tree_sizes:
            return {}
        drafted = [a for a, size in zip(self.accept_lengths, self.tree_sizes) if size]
        sizes = collections.Counter(size for size in self.tree_sizes if size)
        return {"plain_tokens": len(self.tree_sizes) - len(drafted),
                "draft_tau": float(np.mean(drafted)) if drafted else 0.0,
                "tree_size_steps": {int(k): v for k, v in sorted(sizes.items())}}
