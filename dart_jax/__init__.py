"""dart_jax: DART speculative decoding for Qwen3 in JAX/Flax.

Layers, each importing only the ones below it (tests/test_layers.py keeps it so):
  dart_jax.ngram, dart_jax.convert       leaves: trie and tree search; checkpoint files and configs
  dart_jax.models                        the Qwen3 target, the draft head, sharding, module loading
  dart_jax.decoding                      engine, drafters, autoregressive decoding, sampling
  dart_jax.api, dart_jax.bench           DartModel and the CLIs; benchmarks
  dart_jax.serve                         the HTTP API and chat UI (python -m dart_jax.serve)
  dart_jax.train                         training draft heads
"""
from __future__ import annotations

import logging as _logging

from .collector import paused

__version__ = "0.1.0"
__all__ = ["DartModel", "DecodeConfig", "__version__"]


def __getattr__(name):
    # lazy, so that `import dart_jax.ngram` (a leaf, this package's child) does not load jax; the
    # garbage collector waits while jax, flax and transformers load (dart_jax.collector)
    if name == "DartModel":
        with paused():
            from .api.model import DartModel

        return DartModel
    if name == "DecodeConfig":
        with paused():
            from .api.config import DecodeConfig

        return DecodeConfig
    raise AttributeError(name)


class _NoTorchAdvice(_logging.Filter):
    """transformers says at its import that without PyTorch its models are unavailable; dart_jax
    takes only tokenizers and configs from it (no torch at run time), so that line is noise here.
    Its other messages pass."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found")


_logging.getLogger("transformers").addFilter(_NoTorchAdvice())
