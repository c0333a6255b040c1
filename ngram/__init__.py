"""N-gram trie and the n-gram-guided tree search (Numba, CPU). A leaf of the project: it imports
nothing else of dart_jax but its errors."""
from __future__ import annotations

from ._format import MAX_ORDER
from .tree import DraftTree, TreeSettings, build_tree, build_tree_batch
from .trie import Trie

__all__ = ["Trie", "MAX_ORDER", "build_tree", "build_tree_batch", "DraftTree", "TreeSettings"]
