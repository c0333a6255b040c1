"""Writing a folder atomically (`atomic_folder`, `clean_leftovers`), apart from its inputs
(`check_apart`): the one implementation is `dart_jax.files`, shared with the n-gram trie writers;
this module hands its names on."""
from __future__ import annotations

from dart_jax.files import atomic_folder, check_apart, clean_leftovers

__all__ = ["atomic_folder", "check_apart", "clean_leftovers"]
