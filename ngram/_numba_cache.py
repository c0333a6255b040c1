"""Numba's on-disk cache, kept honest across edits and upgrades.

Numba keys a cached kernel by the source file of the function it compiled, not by the files of
the functions it calls or inlines: after an edit or an upgrade that changes only a helper module
(say the trie reads in `_query.py`), a kernel in `tree.py` would be loaded stale and compute with
the old helper. So the package's sources are hashed together at import; when the hash differs from
the one stamped beside the cache, the package's cached kernels are deleted first and compile again.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_STAMP = "dart_jax_ngram_sources.sha256"


def refresh(folder: Path = _HERE) -> bool:
    """Delete this package's Numba cache files when its sources changed since they were written;
    → whether anything was deleted. A read-only install is left alone (Numba then caches in its
    per-user folder, under a path of its own per installed copy)."""
    digest = hashlib.sha256()
    for source in sorted(folder.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    cache = folder / "__pycache__"
    stamp = cache / _STAMP
    try:
        if stamp.read_text() == digest.hexdigest():
            return False
    except OSError:
        pass
    removed = False
    try:
        cache.mkdir(exist_ok=True)
        for stale in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            stale.unlink(missing_ok=True)
            removed = True
        stamp.write_text(digest.hexdigest())
    except OSError:
        return False
    return removed
