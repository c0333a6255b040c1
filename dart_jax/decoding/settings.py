"""Request and shape settings of a generation, each checked once where it is made."""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from dart_jax.errors import check_int, check_number, check_type

from .sampling import SamplingParams, is_greedy, row_keys


# Past it the kept tokens are all but equally likely; far past it logits / temperature leaves float32.
MAX_TEMPERATURE = 100.0


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """One generation's limits and sampling (temperature 0 = greedy; top_p 1 and top_k 0 disable
    those filters). Invalid values raise ValueError on construction."""

    max_new_tokens: int = 512
    max_length: int = 2048  # prompt + generated tokens
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        for name in ("max_new_tokens", "max_length", "top_k", "seed"):
            check_int(getattr(self, name), name)
        for name in ("temperature", "top_p"):
            check_number(getattr(self, name), name)
        if not 0 <= int(self.seed) < 2**63:
            raise ValueError(f"seed must lie in [0, 2**63), got {self.seed}.")
        int32 = int(np.iinfo(np.int32).max)  # token counts and top_k are int32 on the device
        for name in ("max_new_tokens", "max_length", "top_k"):
            if int(getattr(self, name)) > int32:
                raise ValueError(f"{name} must be at most {int32} (int32 on the device), got {getattr(self, name)}.")
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if int(self.max_length) < 2:
            raise ValueError(f"max_length must be >= 2 (a prompt token and a new one), got {self.max_length}.")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:  # NaN fails too
            raise ValueError(f"temperature must lie in [0, {MAX_TEMPERATURE:g}] (0 = greedy), got {self.temperature}.")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1] (1 disables it), got {self.top_p}.")
        if int(self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    @staticmethod
    def sampling_rows(settings: "list[GenerationSettings]") -> tuple[SamplingParams, jax.Array]:
        """Per-sequence sampling params [B] and PRNG keys [B] of a batch of requests."""
        params = SamplingParams.rows([(s.temperature, s.top_p, s.top_k) for s in settings])
        return params, row_keys([s.seed for s in settings])


def check_settings(value, name: str = "settings") -> GenerationSettings:
    """`value` when it is a GenerationSettings, else an InputError naming the argument `name` (a dict
    makes one as GenerationSettings(**d); a list is one per prompt of a batch)."""
    fix = (" (GenerationSettings(**d) makes one of a dict d)" if isinstance(value, dict) else
           " (a list holds one per prompt of a batch)" if isinstance(value, (list, tuple)) else "")
    return check_type(value, name, GenerationSettings, f"a GenerationSettings{fix}")


@dataclasses.dataclass(frozen=True)
class ShapeSettings:
    """Static shapes: a prompt is prefilled in chunks of `min_bucket` tokens (the last one padded),
    so that every prompt length runs the same compiled prefill, and caches are rounded up to a
    multiple of cache_multiple, so that few lengths compile."""

    min_bucket: int = 32
    cache_multiple: int = 256

    def __post_init__(self):
        check_int(self.min_bucket, "min_bucket", low=1)
        check_int(self.cache_multiple, "cache_multiple", low=1)

    @property
    def chunk(self) -> int:
        """Prompt tokens per prefill call."""
        return self.min_bucket

    def padded(self, length: int) -> int:
        """A prompt of `length` tokens padded to whole chunks."""
        return -(-max(length, 1) // self.chunk) * self.chunk

    def cache_length(self, need: int) -> int:
        return -(-need // self.cache_multiple) * self.cache_multiple
