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

__version__ = "0.1.0"
__all__ = ["DartModel", "__version__"]


def __getattr__(name):
    # lazy, so that `import dart_jax.ngram` (a leaf, this package's child) does not load jax
    if name == "DartModel":
        from .api.model import DartModel

        return DartModel
    raise AttributeError(name)
