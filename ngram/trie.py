"""N-gram trie (docs/spec.md §5) as flat CSR arrays, with Numba lookups and a memory-mapped file format.

Layout (docs/spec.md §6.2): nodes in breadth-first order, node 0 = root.
  token       int32[N]    token of the edge into the node (0 for the root)
  freq        int32[N]    number of counted windows that start with the node's path
  child_start int64[N+1]  children of node i are child_start[i] .. child_start[i+1]-1, sorted by token
16 bytes per node, plus a token -> depth-1 node table (``root_table``, 4 bytes per vocabulary
id, built on first use, not stored) that makes depth-1 lookups O(1). Frequencies are int32 like
the reference's; building or merging counts that do not fit raises InputError (a ValueError).

File format (``save``/``load``), little-endian: a 64-byte header
  magic b"DJNGTRIE", u32 version, u32 header size, u64 order, u64 node count,
  u64 offsets of token, freq and child_start, u64 file size
then the three arrays at 64-byte aligned offsets. ``load`` memory-maps them and checks the
header, the children table and the frequencies (one pass, docs/spec.md §6.2); ``verify=True``
also checks the tokens. ``save`` writes atomically (a temporary name, renamed when complete).
"""
from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
from tqdm.auto import tqdm

from dart_jax.errors import FileFormatError, InputError

from . import _build
from ._atomic import atomic_path, check_output
from ._format import MAX_ORDER, REBUILD, create_file, map_arrays, read_header
from ._memory import check_memory
from ._reference import convert_reference
from ._reference_write import CHUNK_BYTES, write_reference
from ._query import build_root_table, find_path, ngram_probs, ngram_probs_batch

__all__ = ["Trie", "MAX_ORDER", "ngram_probs", "ngram_probs_batch"]

MAX_TOKEN_ID = np.iinfo(np.int32).max - 1  # +1 must still fit in int32 (window padding)
_INT32 = np.iinfo(np.int32)


def check_order(order, what: str = "order") -> int:
    """``order`` as an int in ``[1, MAX_ORDER]`` (InputError otherwise), before anything is sized by it."""
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)):
        raise InputError(f"{what} must be an integer in [1, {MAX_ORDER}]; got {order!r}.")
    if not 1 <= int(order) <= MAX_ORDER:
        raise InputError(f"{what} must lie in [1, {MAX_ORDER}] (the n-gram length; the reference uses 3); got {order}.")
    return int(order)


def _structure_problem(token, freq, child_start, order, *, full: bool) -> str | None:
    """What is wrong with the arrays (docs/spec.md §6.2), or None: ``full=False`` runs the checks of
    every load (children table, frequencies, depth), ``full=True`` also the tokens."""
    if full:
        status, node = _build.check_csr(token, freq, child_start, order)
    else:
        status, node = _build.check_offsets(freq, child_start, order)
    return None if status == _build.OK else _build.CHECK_MESSAGES[status].format(node=node, order=order)


def _to_int32_freq(freq: np.ndarray, what: str) -> np.ndarray:
    if freq.size and (freq.max() > _INT32.max or freq.min() < _INT32.min):
        raise InputError(
            f"{what}: a frequency ({int(freq.max())}) does not fit in int32, the frequency type of "
            "the trie (and of the reference). Build from less data or reduce() the parts first."
        )
    return freq.astype(np.int32)


def _as_ids(x, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise InputError(f"{what} must be a 1-D sequence of token ids; got shape {arr.shape}.")
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{what} must hold integer token ids; got dtype {arr.dtype}.")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > MAX_TOKEN_ID:
        raise InputError(
            f"{what} holds token id {lo if lo < 0 else hi}, outside [0, {MAX_TOKEN_ID}]; "
            "pass token ids from the tokenizer, not offsets or padding values."
        )
    return arr.astype(np.int64)


class Trie:
    """A counted n-gram trie; see the module docstring for the layout and docs/spec.md §5 for semantics."""

    def __init__(self, token, freq, child_start, order: int):
        self._token = np.asarray(token)
        self._freq = np.asarray(freq)
        self._child_start = np.asarray(child_start)
        for name, arr, dtype in (
            ("token", self._token, np.int32),
            ("freq", self._freq, np.int32),
            ("child_start", self._child_start, np.int64),
        ):
            if arr.dtype != dtype or arr.ndim != 1:
                raise InputError(f"Trie.{name} must be a 1-D {np.dtype(dtype)} array; got {arr.dtype} {arr.shape}.")
        n = self._token.shape[0]
        if n < 1 or self._freq.shape[0] != n or self._child_start.shape[0] != n + 1:
            raise InputError(
                f"Trie arrays disagree: token {self._token.shape}, freq {self._freq.shape}, "
                f"child_start {self._child_start.shape}; need N >= 1, N, N+1 entries."
            )
        self._order = check_order(order, "Trie order")
        self._root_table = None

    # -- accessors ---------------------------------------------------------------------------
    @property
    def order(self) -> int:
        return self._order

    @property
    def num_nodes(self) -> int:
        return int(self._token.shape[0])

    @property
    def nbytes(self) -> int:
        return self._token.nbytes + self._freq.nbytes + self._child_start.nbytes

    def max_token(self) -> int:
        """The largest token id of the trie's n-grams (-1 when it holds none): the vocabulary it was
        built for reaches at least this far."""
        return int(self._token[1:].max()) if self.num_nodes > 1 else -1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(token int32[N], freq int32[N], child_start int64[N+1])`` for Numba code."""
        return self._token, self._freq, self._child_start

    def root_table(self) -> np.ndarray:
        """``int32[max root token + 1]``: token -> child of the root, -1 where none (empty when
        the ids are too large for a table). Built on first use (O(root children)), then kept;
        pass it as ``root`` to ``ngram_probs`` for O(1) depth-1 lookups."""
        if self._root_table is None:
            table = build_root_table(self._token, self._child_start)
            table.flags.writeable = False
            self._root_table = table
        return self._root_table

    def level_sizes(self) -> list[int]:
        """Number of nodes at each depth 0..order (breadth-first order makes levels ranges)."""
        cs, n = self._child_start, self.num_nodes
        sizes, lo, hi = [], 0, 1
        while hi > lo:
            if len(sizes) > self.order:
                raise InputError(f"Corrupted trie: it has paths longer than its order {self.order}.")
            sizes.append(hi - lo)
            lo, hi = (min(max(int(cs[i]), 0), n) for i in (lo, hi))
        return sizes

    def __repr__(self) -> str:
        return f"Trie(order={self.order}, num_nodes={self.num_nodes})"

    def check(self, *, full: bool = True) -> None:
        """Verify the structure (O(N), docs/spec.md §6.2); raise InputError naming the first problem.
        ``full=False`` runs only the checks every ``load`` does (children table, frequencies,
        depth); the full check also verifies the tokens."""
        problem = _structure_problem(self._token, self._freq, self._child_start, self._order, full=full)
        if problem is not None:
            raise InputError(f"Corrupted trie: {problem}.")

    # -- queries -----------------------------------------------------------------------------
    def probability(self, context, tokens) -> tuple[np.ndarray, np.ndarray]:
        """docs/spec.md §5 ``P(token | context)`` for each token: ``(probs float32[n], matched_len int64[n])``.

        Same result as the reference ``get_probability``: longest suffix of the context (at most
        order-1 tokens) that is a path and has the token as a child; 0 and length 0 otherwise.
        """
        ctx = _as_ids(context, "context")
        cands = _as_ids(tokens, "tokens")
        out_p = np.zeros(cands.shape[0], np.float32)
        out_len = np.zeros(cands.shape[0], np.int64)
        ngram_probs(self._token, self._freq, self._child_start, self._order, ctx, cands, out_p, out_len,
                    self.root_table())
        return out_p, out_len

    def continuations(self, context, top: int = 10) -> np.ndarray:
        """The ``top`` most frequent children of the longest suffix of ``context`` (at most
        order-1 tokens) that is a path with children, most frequent first (ties: lower id)."""
        if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 0:
            raise InputError(f"top must be an integer >= 0 (continuations to list); got {top!r}.")
        ctx = _as_ids(context, "context")
        n = self.num_nodes
        for length in range(min(self.order - 1, ctx.shape[0]), 0, -1):
            node = find_path(self._token, self._freq, self._child_start, ctx[ctx.shape[0] - length :])
            if node < 0:
                continue
            lo = min(max(int(self._child_start[node]), node + 1), n)
            hi = min(max(int(self._child_start[node + 1]), lo), n)
            if hi > lo:
                kids = np.arange(lo, hi)
                best = kids[np.lexsort((self._token[kids], -self._freq[kids].astype(np.int64)))]
                return self._token[best[:top]].astype(np.int64)
        return np.zeros(0, np.int64)

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        sequences: Iterable,
        order: int = 3,
        *,
        chunk_tokens: int = 1 << 24,
        progress: bool = False,
    ) -> "Trie":
        """Count every window of ``order`` tokens of each sequence (docs/spec.md §5).

        Each sequence (a conversation, ending in EOS if the caller wants EOS counted) contributes
        the windows starting at each of its positions, cut short at its end. Sequences are
        counted in chunks of about ``chunk_tokens`` tokens and the chunk tries merged, so memory
        follows the number of distinct n-grams rather than the corpus size.
        """
        order = check_order(order)
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, (int, np.integer)) or chunk_tokens < 1:
            raise InputError(f"chunk_tokens must be an integer >= 1; got {chunk_tokens!r}.")
        result = None
        pending: list[np.ndarray] = []
        pending_tokens = 0
        # shown after a second only; an error clears it, so that the error line stands alone
        bar = tqdm(desc="counting n-grams", unit="tok", unit_scale=True, disable=not progress, delay=1.0)
        try:
            for i, seq in enumerate(sequences):
                if np.ndim(seq) == 0:
                    raise InputError(
                        f"Trie.build takes a list of sequences; item {i} is a single id ({seq!r}). "
                        "Wrap one sequence in a list: Trie.build([ids])."
                    )
                ids = _as_ids(seq, f"sequence {i}")
                if ids.size == 0:
                    continue
                pending.append(ids)
                pending_tokens += ids.size
                if pending_tokens >= chunk_tokens:
                    result = cls._add_chunk(result, pending, order)
                    bar.update(pending_tokens)
                    pending, pending_tokens = [], 0
            result = cls._add_chunk(result, pending, order)
            bar.update(pending_tokens)
        except BaseException:
            bar.leave = False
            raise
        finally:
            bar.close()
        return result

    @classmethod
    def _add_chunk(cls, result, seqs, order):
        if result is None:
            return cls._build_chunk(seqs, order)
        return result.merge(cls._build_chunk(seqs, order)) if seqs else result

    @classmethod
    def _build_chunk(cls, seqs: list[np.ndarray], order: int) -> "Trie":
        flat = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
        offsets = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum([s.size for s in seqs], out=offsets[1:])
        bits = int(flat.max() + 1).bit_length() if flat.size else 1
        packed = bits * order <= 64
        # the window keys (or matrix), their sorted copy and the distinct windows
        per_token = 8 * order + 18 if packed else 17 * order + 16
        check_memory(flat.size * per_token, f"counting {flat.size} tokens at order {order}",
                     "count fewer tokens per chunk (chunk_tokens, --chunk-tokens) or lower the order (--order)")
        if flat.size == 0:
            windows = np.zeros((0, order), np.int64)
            starts = np.zeros(0, np.int64)
        elif packed:
            keys = np.empty(flat.size, np.uint64)
            _build.pack_windows(flat, offsets, order, bits, keys)
            keys.sort()
            starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
            windows = _build.unpack_windows(keys[starts], order, bits)
        else:
            all_windows = _build.window_matrix(flat, offsets, order)
            all_windows = all_windows[np.lexsort(all_windows.T[::-1])]
            new_row = np.concatenate(([True], (all_windows[1:] != all_windows[:-1]).any(axis=1)))
            starts = np.flatnonzero(new_row)
            windows = all_windows[starts]
        counts = np.diff(np.append(starts, flat.size)).astype(np.int64)
        return cls._from_csr(*_build.csr_from_windows(windows, counts), order)

    @classmethod
    def _from_csr(cls, token, freq64, child_start, order, what="build") -> "Trie":
        return cls(token, _to_int32_freq(freq64, what), child_start, order)

    def merge(self, other: "Trie") -> "Trie":
        """A new trie counting both tries' windows (reference ``add_all``: frequencies add)."""
        if not isinstance(other, Trie):
            raise InputError(f"Trie.merge needs a Trie; got {type(other).__name__}.")
        if other.order != self.order:
            raise InputError(f"Cannot merge a trie of order {other.order} into one of order {self.order}.")
        token, freq, cs = _build.merge_csr(*self.arrays(), *other.arrays())
        if token.shape[0] == 0:
            raise InputError("Trie.merge: an input is not a valid trie; run .check() on both.")
        return Trie._from_csr(token, freq, cs, self.order, "merge")

    def reduce(self, threshold: int) -> "Trie":
        """A new, smaller trie (reference ``reduce``; this one is left unchanged).

        Children with ``freq < threshold`` are dropped with their subtrees; each kept node's freq
        loses the mass dropped below it. Unlike the reference, whose new root starts from 0 and
        ends negative, the root keeps ``old root freq - dropped mass``; the root's freq never
        enters a probability.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)):
            raise InputError(f"reduce threshold must be an integer count; got {threshold!r}.")
        # frequencies are int32: a threshold beyond their range acts as the range's end
        threshold = min(max(int(threshold), int(_INT32.min)), int(_INT32.max) + 1)
        token, freq, cs = _build.reduce_csr(*self.arrays(), np.int64(threshold))
        return Trie._from_csr(token, freq, cs, self.order, "reduce")

    # -- files -------------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the trie in the dart_jax format, atomically: to a temporary name in the same
        folder, renamed to ``path`` when complete (a killed save leaves ``path`` as it was)."""
        path = check_output(path, "trie output")
        with atomic_path(path) as tmp:
            out = create_file(tmp, self.order, self.num_nodes)
            for dst, src in zip(out, self.arrays()):
                dst[:] = src
                dst.flush()
            del out, dst

    @classmethod
    def load(cls, path, *, verify: bool = False) -> "Trie":
        """Memory-map a file written by ``save`` (docs/spec.md §6.2).

        Always checked: the header (order within ``1..MAX_ORDER``, sizes against the file
        length) and, in one pass over ``child_start`` and ``freq``, the children table, the
        frequencies and the depth (at most the order). ``verify`` also checks the tokens.
        Any problem is a FileFormatError naming the file.
        """
        path = os.fspath(path)
        order, n, offsets = read_header(path)
        trie = cls(*map_arrays(path, n, offsets), order)
        problem = _structure_problem(*trie.arrays(), order, full=verify)
        if problem is None and verify:
            status, depth = _build.check_levels(trie._freq, trie._child_start, order)
            if status != _build.OK:
                problem = _build.CHECK_MESSAGES[status].format(node=depth, order=order)
        if problem is not None:
            raise FileFormatError(path, f"corrupted trie: {problem}; {REBUILD}.")
        return trie

    def to_reference(self, path, *, progress: bool = True, chunk_bytes: int = CHUNK_BYTES) -> str:
        """Write the trie as a reference (C++) ``.trie`` (docs/spec.md §6.1), which the PyTorch
        reference loads as it is: streamed in chunks after a full check (``check``), written
        atomically (a temporary name, renamed when complete), ``chunk_bytes`` at a time (in
        ``[1, 2**34]``); returns the absolute path.
        ``Trie.from_reference`` reads it back to the same arrays."""
        self.check(full=True)
        token, freq, cs = self.arrays()
        return write_reference(path, self.order, self.num_nodes, lambda a, b: (token[a:b], freq[a:b], cs[a:b + 1]),
                               progress=progress, chunk_bytes=chunk_bytes)

    @classmethod
    def from_reference(cls, path, out=None, *, chunk_bytes: int = 1 << 26, progress: bool = True) -> "Trie":
        """Read a reference (C++) ``.trie`` (docs/spec.md §6) by streaming it.

        With ``out`` the trie is written there in the dart_jax format (scratch arrays are
        disk-backed in a scratch folder next to it, so memory stays bounded) and returned
        memory-mapped; the output appears only when complete, and the scratch folder is removed
        at the end (or by the next conversion into that folder when this one is killed). Without
        ``out`` everything is built in memory. A damaged file is a FileFormatError naming it;
        ``chunk_bytes`` (bytes read at a time) must lie in ``[1, 2**34]``.
        """
        return convert_reference(cls, path, out, chunk_bytes=chunk_bytes, progress=progress)
