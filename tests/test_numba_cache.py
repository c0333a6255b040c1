"""Numba's cached kernels are dropped when any source of the n-gram package changed (Numba itself
only notices a change of the file that holds the compiled function)."""
from __future__ import annotations

from dart_jax.ngram._numba_cache import refresh


def test_cached_kernels_go_when_a_helper_changes(tmp_path):
    (tmp_path / "tree.py").write_text("def search(): pass\n")
    (tmp_path / "_query.py").write_text("def child(): return 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    kernel = [cache / "tree.search-10.py311.nbi", cache / "tree.search-10.py311.1.nbc"]
    for f in kernel:
        f.write_bytes(b"compiled")
    assert refresh(tmp_path)  # no stamp yet: whatever is cached may be stale
    assert not any(f.exists() for f in kernel)
    for f in kernel:
        f.write_bytes(b"compiled")
    assert not refresh(tmp_path) and all(f.exists() for f in kernel)  # same sources: kept
    (tmp_path / "_query.py").write_text("def child(): return 2\n")  # only a helper changes
    assert refresh(tmp_path) and not any(f.exists() for f in kernel)
    (tmp_path / "other.txt").write_text("not a source")
    assert not refresh(tmp_path)
