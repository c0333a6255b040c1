"""The tie rule of docs/spec.md §5.5 over many random inputs with exact ties and EOS candidates.

Rows draw their probabilities from a few values (so candidates of a row, and paths through
equal-probability candidates, tie exactly: the same operands summed in the same order in the
float64 oracle and the float32 kernel), sorted as the head gives them (the kernel's early exit
on sorted rows) or shuffled; EOS is sprinkled in. A case is kept when every decision is an exact
tie or clear by a margin, so the two precisions cannot disagree. The oracle is test_tree's
plain-Python restatement, run with an n-gram model or without one.
"""
from __future__ import annotations

import numpy as np

from dart_jax.ngram import Trie, build_tree
from test_tree import MARGIN, VOCAB, check_tree, oracle, random_sequences, window_counts


def cut_gaps(ids, probs, preceding, counts, order, *, eos, beam_width, keep):
    """Every score gap at a cut (beam and final selection), the oracle's ranking restated."""
    d, k = ids.shape
    beam, pool, gaps = [((), 0.0)], [], []
    for lvl in range(d):
        row = []
        for seq, score in beam:
            history = list(preceding) + list(seq)
            context = history[max(0, len(history) - (order - 1)):]
            for j in range(k):
                inc = 0.9**lvl * np.log(float(probs[lvl, j]) + 1e-10)
                if counts is not None and lvl > 0:
                    p = 0.0
                    for n in range(min(order - 1, len(context)), 0, -1):
                        s = tuple(context[len(context) - n:])
                        if s in counts and s + (int(ids[lvl, j]),) in counts:
                            p = counts[s + (int(ids[lvl, j]),)] / counts[s]
                            break
                    inc += 0.5 * np.log(p + 1e-10)
                e = (seq + (int(ids[lvl, j]),), score + (lvl + 1) ** -0.7 * inc, len(pool))
                pool.append(e)
                row.append(e)
        row.sort(key=lambda e: (e[0][-1] == eos, -e[1], e[2]))
        for a, b in zip(row, row[1:]):
            if (a[0][-1] == eos) == (b[0][-1] == eos):
                gaps.append(a[1] - b[1])
        beam = [(e[0], e[1]) for e in row[:beam_width]]
    pool.sort(key=lambda e: (-e[1], e[2]))
    gaps += [a[1] - b[1] for a, b in zip(pool, pool[1:])]
    return gaps


def test_exact_ties_and_eos_over_many_random_inputs():
    rng = np.random.default_rng(11)
    seqs = random_sequences(rng, VOCAB, 30, 80)
    models = {None: (None, None)} | {o: (Trie.build(seqs, order=o), window_counts(seqs, o)) for o in (2, 3)}
    checked = ties = 0
    while checked < 60:
        order = [None, 2, 3][checked % 3]
        trie, counts = models[order]
        d, k = int(rng.integers(1, 5)), int(rng.integers(2, 8))
        values = rng.choice([0.4, 0.2, 0.1, 0.05, 0.025], size=3, replace=False)
        probs = np.sort(rng.choice(values, size=(d, k)), axis=1)[:, ::-1].astype(np.float32)
        if rng.random() < 0.3:
            probs = rng.permuted(probs, axis=1)
        ids = np.stack([rng.choice(VOCAB, size=k, replace=False) for _ in range(d)])
        eos = 0
        for lvl in range(d):
            if eos not in ids[lvl] and rng.random() < 0.5:
                ids[lvl, rng.integers(k)] = eos
        pre = rng.integers(0, VOCAB, size=3)
        beam_width, keep = int(rng.integers(1, 5)), int(rng.integers(1, 20))
        gaps = cut_gaps(ids, probs, pre, counts, order or 3, eos=eos, beam_width=beam_width, keep=keep)
        if any(0 < abs(g) <= MARGIN for g in gaps):
            continue
        ties += any(g == 0 for g in gaps)
        kept, _ = oracle(ids, probs, pre, counts, order or 3, eos=eos, beam_width=beam_width, keep=keep,
                         ngram_weight=0.5)
        tree = build_tree(ids, probs, pre, trie, eos_id=eos, beam_width=beam_width, keep=keep)
        check_tree(tree, kept, int(pre[-1]), keep=keep, d=d)
        checked += 1
    assert ties > 30  # the cases do exercise the tie rule
