"""Benchmarks: `python -m dart_jax.bench MODE` (see `cli`)."""
from .cli import TABLE_COLUMNS, build_parser, format_table, main, plot, run

__all__ = ["TABLE_COLUMNS", "build_parser", "format_table", "main", "plot", "run"]
