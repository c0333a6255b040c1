"""Draft vocabulary (docs/spec.md §7, the EAGLE-3 convention): the most frequent training targets."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def build_draft_vocab(samples: Iterable[tuple[np.ndarray, np.ndarray]], vocab_size: int, draft_vocab_size: int):
    """(used_ids int64[Vd] sorted, d2t int64[Vd], t2d bool[V]) from (ids, loss_mask) samples.

    Counts every token on the loss mask; keeps the `draft_vocab_size` most frequent (ties go to
    the smaller id); when fewer distinct tokens occur, the smallest unseen ids fill the rest so
    that the head keeps the requested size. d2t[i] = used[i] − i; t2d[v] = v is used.
    """
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"--draft-vocab must be in 1..{vocab_size} (the target's vocabulary size), got {draft_vocab_size}")
    used = np.sort(by_frequency(target_counts(samples, vocab_size))[:draft_vocab_size]).astype(np.int64)
    d2t, t2d = vocab_from_used(used, vocab_size)
    return used, d2t, t2d


def target_counts(samples: Iterable[tuple[np.ndarray, np.ndarray]], vocab_size: int) -> np.ndarray:
    """int64[V]: how often each id is a training target (on the loss mask) in (ids, loss_mask) samples."""
    counts = np.zeros(vocab_size, np.int64)
    for ids, mask in samples:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id out of range 0..{vocab_size - 1} in the training data; is --base the tokenizer's model?")
        np.add.at(counts, ids[np.asarray(mask, bool)], 1)
    return counts


def by_frequency(counts: np.ndarray) -> np.ndarray:
    """All ids by count descending, ties to the smaller id."""
    return np.lexsort((np.arange(len(counts)), -counts))


def vocab_from_used(used: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """d2t int64[Vd] and t2d bool[V] for the sorted target ids `used`."""
    used = np.asarray(used, np.int64)
    d2t = used - np.arange(len(used), dtype=np.int64)
    t2d = np.zeros(vocab_size, bool)
    t2d[used] = True
    return d2t, t2d


def used_from_d2t(d2t: np.ndarray) -> np.ndarray:
    """The target ids of the draft vocabulary, inverse of `vocab_from_used`."""
    d2t = np.asarray(d2t, np.int64)
    return d2t + np.arange(len(d2t), dtype=np.int64)


def grow_draft_vocab(used: np.ndarray, samples: Iterable[tuple[np.ndarray, np.ndarray]], vocab_size: int,
                     draft_vocab_size: int) -> np.ndarray:
    """`used` (a head's draft vocabulary, sorted target ids) grown to `draft_vocab_size` ids: the
    training targets it lacks, most frequent first (ties to the smaller id), then the smallest
    unseen ids as `build_draft_vocab` fills. Returns the sorted ids; every id of `used` stays."""
    used = np.asarray(used, np.int64)
    if draft_vocab_size < len(used) or draft_vocab_size > vocab_size:
        raise ValueError(f"a draft vocabulary of {len(used)} can grow to {len(used)}..{vocab_size} ids, "
                         f"not {draft_vocab_size}")
    counts = target_counts(samples, vocab_size)
    counts[used] = -1  # already in: never picked again
    return np.sort(np.concatenate([used, by_frequency(counts)[:draft_vocab_size - len(used)]]))


def mapped_columns(kernel: np.ndarray, rows: np.ndarray, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """LM-head columns [H, len(new)] for the ids `new`, from a head's columns `kernel` [H, len(old)]
    for the ids `old`: the linear map A [H, H] that best takes the target's output rows `rows`
    [V, H] of `old` to those columns (least squares, rows[old] @ A ≈ kernel.T) applied to the
    target's rows of `new`. A head's columns live in its own space; the map carries what the
    target knows of the new tokens into it."""
    x = np.asarray(rows[old], np.float64)
    a, *_ = np.linalg.lstsq(x, np.asarray(kernel, np.float64).T, rcond=None)
    return (np.asarray(rows[new], np.float64) @ a).T.astype(np.float32)
