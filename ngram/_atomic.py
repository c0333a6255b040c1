"""Atomic output files and self-cleaning scratch space for trie writers (docs/spec.md §6.2): the
one implementation is `dart_jax.files`, shared with the checkpoint writers; this module hands its
names on."""
from __future__ import annotations

from dart_jax.files import PREFIX, _host, atomic_path, check_apart, check_output, clean_stale, scratch_dir, stale_entries

__all__ = ["PREFIX", "atomic_path", "check_apart", "check_output", "clean_stale", "scratch_dir", "stale_entries"]
