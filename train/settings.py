"""`TrainSettings`: everything (besides the files) that decides the result of a training run.

Kept apart from the loop (no jax here), so that the command line answers `--help` and checks its
flags before the heavy libraries load.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from dart_jax.errors import InputError

METHODS = ("dart", "eagle3")
# the per-row (DART, docs/spec.md §7) or per-step (EAGLE-3's recipe) weight γ of the loss
DEFAULT_GAMMA = {"dart": 0.6, "eagle3": 0.8}


@dataclasses.dataclass
class TrainSettings:
    """Everything (besides the files) that decides the result of a run. `method` "dart" trains a
    DART head (draft_length, anchors_per_seq), "eagle3" an EAGLE-3 head (ttt_steps)."""

    draft_length: int = 7
    draft_vocab: int = 32000
    max_length: int = 2048
    anchors_per_seq: int = 64
    batch_size: int = 1
    grad_accum: int = 1
    lr: float = 2e-5
    warmup_steps: int | None = None
    weight_decay: float = 0.0
    clip: float = 0.5
    epochs: int = 3
    gamma: float = 0.6
    seed: int = 0
    rope_theta: float = 10000.0
    method: str = "dart"
    ttt_steps: int = 7

    def __post_init__(self):
        """Each value checked once, with the command's flag named (`--draft-vocab` for draft_vocab)."""
        def flag(name):
            return "--" + name.replace("_", "-")
        for name in ("draft_length", "draft_vocab", "max_length", "anchors_per_seq", "batch_size", "grad_accum",
                     "epochs", "seed", "warmup_steps", "ttt_steps"):
            value = getattr(self, name)
            if value is None and name == "warmup_steps":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"{flag(name)} must be an integer, got {value!r}.")
            low = 0 if name in ("seed", "warmup_steps") else 1
            if value < low:
                raise InputError(f"{flag(name)} must be >= {low}, got {value}.")
        for name, low, inclusive in (("lr", 0.0, False), ("weight_decay", 0.0, True), ("clip", 0.0, False),
                                     ("gamma", 0.0, False), ("rope_theta", 0.0, False)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(value) or value < low or (value == low and not inclusive):
                raise InputError(f"{flag(name)} must be a finite number {'>=' if inclusive else '>'} {low:g}, "
                                 f"got {value!r}.")
        if self.method not in METHODS:
            raise InputError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}.")
        if self.gamma > 1:
            raise InputError(f"--gamma must lie in (0, 1], got {self.gamma}.")
        if self.max_length < 3:
            raise InputError("--max-length must be at least 3 (an anchor, the root token and one target).")
