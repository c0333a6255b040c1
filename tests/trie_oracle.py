"""docs/spec.md §5.1 in plain Python: the count of every n-gram prefix of every window (the oracle
of the trie tests), and a writer of the reference's `.trie` layout (§6.1) from such counts."""
from __future__ import annotations

import struct
from collections import Counter, defaultdict


def window_counts(seqs, order):
    counts = Counter({(): 0})
    for seq in seqs:
        for s in range(len(seq)):
            window = tuple(seq[s:s + order])
            for k in range(len(window) + 1):
                counts[window[:k]] += 1
    return dict(counts)


def write_reference(path, counts, order, root_freq=None):
    """A §6.1 file from a path -> freq dict: node ids in reverse breadth-first order (not ours),
    children listed unsorted; `root_freq` replaces the root's count."""
    nodes = sorted(counts, key=lambda p: (len(p), p))
    ids = {(): 0}
    for k, p in enumerate(reversed(nodes[1:])):
        ids[p] = k + 1
    kids = defaultdict(list)
    for p in nodes[1:]:
        kids[p[:-1]].append(p)
    with open(path, "wb") as f:
        f.write(struct.pack("<QQ", order, len(nodes)))
        for p in sorted(nodes, key=lambda p: ids[p]):
            freq = counts[p] if p or root_freq is None else root_freq
            f.write(struct.pack("<iQiQ", p[-1] if p else 0, ids[p[:-1]] if p else 0, freq, len(kids[p])))
            for c in reversed(kids[p]):
                f.write(struct.pack("<iQ", c[-1], ids[c]))
