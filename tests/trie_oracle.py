"""docs/spec.md §5.1 in plain Python: the count of every n-gram prefix of every window (the oracle
of the trie tests)."""
from __future__ import annotations

from collections import Counter


def window_counts(seqs, order):
    counts = Counter({(): 0})
    for seq in seqs:
        for s in range(len(seq)):
            window = tuple(seq[s:s + order])
            for k in range(len(window) + 1):
                counts[window[:k]] += 1
    return dict(counts)
