"""N-gram trie and the n-gram-guided tree search (Numba, CPU)."""
from __future__ import annotations

__all__ = ["Trie", "build_tree", "build_tree_batch", "DraftTree"]


def __getattr__(name):
    if name == "Trie":
        from .trie import Trie

        return Trie
    if name in ("build_tree", "build_tree_batch", "DraftTree"):
        from . import tree

        return getattr(tree, name)
    raise AttributeError(name)
