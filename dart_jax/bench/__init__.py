"""Benchmarks: `python -m dart_jax.bench MODE` (see `cli`; its options: `options`)."""
from __future__ import annotations

from .options import build_parser

__all__ = ["TABLE_COLUMNS", "build_parser", "format_table", "main", "plot", "run"]


def __getattr__(name):
    # lazy, so that `python -m dart_jax.bench` parses its arguments (dart_jax.bench.options) before jax loads
    if name in __all__:
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'dart_jax.bench' has no attribute {name!r}")
