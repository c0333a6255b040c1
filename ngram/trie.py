"""N-gram trie (docs/spec.md §5) as flat CSR arrays, with Numba lookups and a memory-mapped file format.

Layout (docs/spec.md §6.2): nodes in breadth-first order, node 0 = root.
  token       int32[N]    token of the edge into the node (0 for the root)
  freq        int32[N]    number of counted windows that start with the node's path
  child_start int64[N+1]  children of node i are child_start[i] .. child_start[i+1]-1, sorted by token
16 bytes per node, plus a token -> depth-1 node table (``root_table``, 4 bytes per vocabulary
id, built on first use, not stored) that makes depth-1 lookups O(1). Frequencies are int32 like
the reference's; building or merging counts that do not fit raises ValueError.

File format (``save``/``load``), little-endian: a 64-byte header
  magic b"DJNGTRIE", u32 version, u32 header size, u64 order, u64 node count,
  u64 offsets of token, freq and child_start, u64 file size
then the three arrays at 64-byte aligned offsets. ``load`` memory-maps them.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterable

import numpy as np
from tqdm.auto import tqdm

from . import _build
from ._format import HEADER, MAGIC, VERSION, create_file, layout
from ._reference import convert_reference
from ._query import build_root_table, find_path, ngram_probs, ngram_probs_batch

__all__ = ["Trie", "ngram_probs", "ngram_probs_batch"]

_MAX_TOKEN = np.iinfo(np.int32).max - 1  # +1 must still fit in int32 (window padding)

_CHECK_MESSAGES = {
    _build.BAD_LENGTHS: "array lengths disagree (token and freq need N entries, child_start N+1)",
    _build.BAD_ROOT_RANGE: "child_start must start at 1 and end at the node count",
    _build.BAD_RANGE: "node {node} has a children range that is not after it or not contiguous",
    _build.UNSORTED: "the children of node {node} are not sorted by token (or repeat a token)",
    _build.TOO_DEEP: "node {node} lies deeper than the trie order",
}


def _to_int32_freq(freq: np.ndarray, what: str) -> np.ndarray:
    if freq.size and (freq.max() > np.iinfo(np.int32).max or freq.min() < np.iinfo(np.int32).min):
        raise ValueError(
            f"{what}: a frequency ({int(freq.max())}) does not fit in int32, the frequency type of "
            "the trie (and of the reference). Build from less data or reduce() the parts first."
        )
    return freq.astype(np.int32)


def _as_ids(x, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids; got shape {arr.shape}.")
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids; got dtype {arr.dtype}.")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _MAX_TOKEN:
        raise ValueError(
            f"{what} holds token id {lo if lo < 0 else hi}, outside [0, {_MAX_TOKEN}]; "
            "pass token ids from the tokenizer, not offsets or padding values."
        )
    return arr.astype(np.int64)


class Trie:
    """A counted n-gram trie; see the module docstring for the layout and docs/spec.md §5 for semantics."""

    def __init__(self, token, freq, child_start, order: int):
        self._token = np.asarray(token)
        self._freq = np.asarray(freq)
        self._child_start = np.asarray(child_start)
        self._order = int(order)
        for name, arr, dtype in (
            ("token", self._token, np.int32),
            ("freq", self._freq, np.int32),
            ("child_start", self._child_start, np.int64),
        ):
            if arr.dtype != dtype or arr.ndim != 1:
                raise ValueError(f"Trie.{name} must be a 1-D {np.dtype(dtype)} array; got {arr.dtype} {arr.shape}.")
        n = self._token.shape[0]
        if n < 1 or self._freq.shape[0] != n or self._child_start.shape[0] != n + 1:
            raise ValueError(
                f"Trie arrays disagree: token {self._token.shape}, freq {self._freq.shape}, "
                f"child_start {self._child_start.shape}; need N >= 1, N, N+1 entries."
            )
        if self._order < 1:
            raise ValueError(f"Trie order must be >= 1; got {self._order}.")
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
                raise ValueError(f"Corrupted trie: it has paths longer than its order {self.order}.")
            sizes.append(hi - lo)
            lo, hi = (min(max(int(cs[i]), 0), n) for i in (lo, hi))
        return sizes

    def __repr__(self) -> str:
        return f"Trie(order={self.order}, num_nodes={self.num_nodes})"

    def check(self) -> None:
        """Verify the whole structure (O(N)); raise ValueError naming the first problem."""
        status, node = _build.check_csr(self._token, self._freq, self._child_start, self._order)
        if status != _build.OK:
            raise ValueError(f"Corrupted trie: {_CHECK_MESSAGES[status].format(node=node)}.")

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
        ctx = _as_ids(context, "context")
        for length in range(min(self.order - 1, ctx.shape[0]), 0, -1):
            node = find_path(self._token, self._freq, self._child_start, ctx[ctx.shape[0] - length :])
            if node < 0:
                continue
            lo, hi = int(self._child_start[node]), int(self._child_start[node + 1])
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
        if int(order) < 1:
            raise ValueError(f"order must be >= 1; got {order}.")
        order = int(order)
        result = None
        pending: list[np.ndarray] = []
        pending_tokens = 0
        bar = tqdm(desc="counting n-grams", unit="tok", unit_scale=True, disable=not progress)
        for i, seq in enumerate(sequences):
            if np.ndim(seq) == 0:
                raise ValueError(
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
        if flat.size == 0:
            windows = np.zeros((0, order), np.int64)
            starts = np.zeros(0, np.int64)
        elif bits * order <= 64:
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
            raise ValueError(f"Trie.merge needs a Trie; got {type(other).__name__}.")
        if other.order != self.order:
            raise ValueError(f"Cannot merge a trie of order {other.order} into one of order {self.order}.")
        token, freq, cs = _build.merge_csr(*self.arrays(), *other.arrays())
        if token.shape[0] == 0:
            raise ValueError("Trie.merge: an input is not a valid trie; run .check() on both.")
        return Trie._from_csr(token, freq, cs, self.order, "merge")

    def reduce(self, threshold: int) -> "Trie":
        """A new, smaller trie (reference ``reduce``; this one is left unchanged).

        Children with ``freq < threshold`` are dropped with their subtrees; each kept node's freq
        loses the mass dropped below it. Unlike the reference, whose new root starts from 0 and
        ends negative, the root keeps ``old root freq - dropped mass``; the root's freq never
        enters a probability.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)):
            raise ValueError(f"reduce threshold must be an integer count; got {threshold!r}.")
        token, freq, cs = _build.reduce_csr(*self.arrays(), np.int64(threshold))
        return Trie._from_csr(token, freq, cs, self.order, "reduce")

    # -- files -------------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the trie in the dart_jax format (to ``path + '.tmp'``, renamed at the end)."""
        path = os.fspath(path)
        out = create_file(path + ".tmp", self.order, self.num_nodes)
        for dst, src in zip(out, self.arrays()):
            dst[:] = src
            dst.flush()
        del out
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path, *, verify: bool = False) -> "Trie":
        """Memory-map a file written by ``save`` (O(1) in its size; ``verify`` checks it all)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No trie file at {path!r}.")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
        if len(head) < 8 or head[:8] != MAGIC:
            hint = ""
            if len(head) >= 16:
                order, count = struct.unpack_from("<QQ", head)
                if 1 <= order <= 64 and count >= 1:
                    hint = (
                        " It looks like a reference (C++) .trie: convert it once with "
                        f"`python -m dart_jax.ngram convert {path} OUT` or Trie.from_reference()."
                    )
            raise ValueError(f"{path!r} is not a dart_jax trie file (bad magic number).{hint}")
        if len(head) < HEADER.size:
            raise ValueError(f"{path!r} is truncated: {size} bytes, shorter than the header.")
        _, version, header_size, order, n, tok_off, freq_off, cs_off, file_size = HEADER.unpack(head)
        if version != VERSION:
            raise ValueError(
                f"{path!r} has trie format version {version}; this dart_jax reads version {VERSION}. "
                "Rebuild or re-convert the trie with this version."
            )
        if header_size != HEADER.size or order < 1 or n < 1 or n > size // 16:
            raise ValueError(f"{path!r} has a corrupted header (order {order}, {n} nodes, {size} bytes).")
        if (tok_off, freq_off, cs_off, file_size) != layout(n):
            raise ValueError(f"{path!r} has a corrupted header: array offsets do not match {n} nodes.")
        if size != file_size:
            raise ValueError(
                f"{path!r} is {size} bytes but its header says {file_size}: the file is "
                f"{'truncated' if size < file_size else 'followed by extra data'}; copy or save it again."
            )
        token = np.asarray(np.memmap(path, dtype="<i4", mode="r", offset=tok_off, shape=(n,)))
        freq = np.asarray(np.memmap(path, dtype="<i4", mode="r", offset=freq_off, shape=(n,)))
        child_start = np.asarray(np.memmap(path, dtype="<i8", mode="r", offset=cs_off, shape=(n + 1,)))
        trie = cls(token, freq, child_start, order)
        if child_start[0] != 1 or child_start[n] != n:
            raise ValueError(f"{path!r} is corrupted: its children table does not span the nodes.")
        if verify:
            try:
                trie.check()
            except ValueError as e:
                raise ValueError(f"{path!r}: {e}") from None
        return trie

    @classmethod
    def from_reference(cls, path, out=None, *, chunk_bytes: int = 1 << 26, progress: bool = True) -> "Trie":
        """Read a reference (C++) ``.trie`` (docs/spec.md §6) by streaming it.

        With ``out`` the trie is written there in the dart_jax format (scratch arrays are
        disk-backed next to it, so memory stays bounded) and returned memory-mapped; without it
        everything is built in memory.
        """
        return convert_reference(cls, path, out, chunk_bytes=chunk_bytes, progress=progress)
