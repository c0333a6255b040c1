"""dart_jax: DART speculative decoding for Qwen3 in JAX/Flax."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["DartModel", "__version__"]


def __getattr__(name):
    if name == "DartModel":
        from .model import DartModel

        return DartModel
    raise AttributeError(name)
