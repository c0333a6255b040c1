"""N-gram trie and the n-gram-guided tree search (Numba, CPU). A leaf of the project: it imports
nothing else of dart_jax but its errors."""
from __future__ import annotations

from ._numba_cache import refresh as _refresh_numba_cache

_refresh_numba_cache()  # before the kernels below load their cached builds

from ._format import MAX_ORDER  # noqa: E402
from .compressed import CompressedTrie, check_trie_vocab, compress, load_any, trie_format  # noqa: E402
from .tree import DraftTree, TreeSettings, build_tree, build_tree_batch, compile_search  # noqa: E402
from .trie import Trie  # noqa: E402

__all__ = ["Trie", "CompressedTrie", "check_trie_vocab", "compress", "load_any", "trie_format", "MAX_ORDER", "build_tree",
           "build_tree_batch", "compile_search", "DraftTree", "TreeSettings"]
