"""N-gram trie benchmark: size per node, build and conversion speed, load time, query latency.

    python benchmarks/bench_ngram.py [--tokens 4000000] [--json]
or from Python: ``run_ngram_bench(...) -> dict`` (used by ``python -m dart_jax.bench ngram``).

The corpus is synthetic but shaped like text: Zipf-distributed ids over a Qwen3-sized vocabulary,
with a bank of phrases repeated across sequences, each sequence ending in EOS.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
from numba import njit

from dart_jax.bench.host import _query_loop
from dart_jax.ngram.trie import Trie, ngram_probs


def make_corpus(num_tokens: int, *, vocab: int = 151_936, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    eos = vocab - 1
    ids = rng.permutation(vocab - 1)  # frequent tokens are not simply the small ids

    def zipf(n):
        return ids[(rng.zipf(1.15, n) - 1) % (vocab - 1)]

    phrases = [zipf(int(rng.integers(3, 13))) for _ in range(5000)]
    phrase_rank = (rng.zipf(1.3, num_tokens) - 1) % len(phrases)
    pieces, total, k = [], 0, 0
    while total < num_tokens:
        if rng.random() < 0.4:
            piece = phrases[phrase_rank[k]]
            k += 1
        else:
            piece = zipf(int(rng.integers(1, 12)))
        pieces.append(piece)
        total += piece.size
    stream = np.concatenate(pieces)[:num_tokens]
    cuts = np.sort(rng.choice(np.arange(1, num_tokens), size=max(1, num_tokens // 600), replace=False))
    return [np.append(s, eos) for s in np.split(stream, cuts)]


@njit(cache=True)
def _query_loop_root(token, freq, child_start, root, order, contexts, cands, out_p, out_len):
    acc = 0.0
    for q in range(contexts.shape[0]):
        ngram_probs(token, freq, child_start, order, contexts[q], cands[q], out_p, out_len, root)
        acc += out_p[0]
    return acc


@njit(cache=True)
def _reference_bytes(token, freq, child_start, order):
    """The trie in the reference format (SPEC §6), children listed in descending token order."""
    n = token.shape[0]
    buf = np.empty(16 + 24 * n + 12 * (n - 1), np.uint8)
    v = buf[:16].view(np.uint64)
    v[0] = order
    v[1] = n
    p = 16
    parent = np.zeros(n, np.int64)
    for i in range(n):
        for c in range(child_start[i], child_start[i + 1]):
            parent[c] = i
    for i in range(n):
        nc = child_start[i + 1] - child_start[i]
        buf[p : p + 4].view(np.int32)[0] = token[i]
        buf[p + 4 : p + 12].view(np.int64)[0] = parent[i]
        buf[p + 12 : p + 16].view(np.int32)[0] = freq[i]
        buf[p + 16 : p + 24].view(np.int64)[0] = nc
        p += 24
        for c in range(child_start[i + 1] - 1, child_start[i] - 1, -1):
            buf[p : p + 4].view(np.int32)[0] = token[c]
            buf[p + 4 : p + 12].view(np.int64)[0] = c
            p += 12
    return buf


def run_ngram_bench(num_tokens: int = 4_000_000, *, order: int = 3, vocab: int = 151_936,
                    num_queries: int = 200_000, seed: int = 0, workdir: str | None = None) -> dict:
    """Build, save, load, convert and query a trie of a ``num_tokens`` synthetic corpus."""
    rng = np.random.default_rng(seed + 1)
    warm = Trie.build(make_corpus(2000, vocab=vocab, seed=seed), order=order)  # compile outside timers
    warm.probability([1, 2], [3])
    corpus = make_corpus(num_tokens, vocab=vocab, seed=seed)
    n_tokens = sum(s.size for s in corpus)

    t0 = time.perf_counter()
    trie = Trie.build(corpus, order=order)
    build_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = os.path.join(tmp, "bench.trie")
        t0 = time.perf_counter()
        trie.save(path)
        save_s = time.perf_counter() - t0
        file_bytes = os.path.getsize(path)
        t0 = time.perf_counter()
        loaded = Trie.load(path)
        load_s = time.perf_counter() - t0

        ref = os.path.join(tmp, "bench.ref.trie")
        _reference_bytes(*warm.arrays(), order)
        _reference_bytes(*trie.arrays(), order).tofile(ref)
        Trie.from_reference(_small_reference(tmp, warm), progress=False)
        t0 = time.perf_counter()
        converted = Trie.from_reference(ref, os.path.join(tmp, "conv.trie"), progress=False)
        convert_s = time.perf_counter() - t0
        ref_bytes = os.path.getsize(ref)
        same = all(np.array_equal(a, b) for a, b in zip(converted.arrays(), trie.arrays()))
        del converted

        # contexts: 2-token windows of the corpus; candidates: the true next token + 24 others
        flat = np.concatenate(corpus)
        pos = rng.integers(0, flat.size - 3, num_queries)
        contexts = np.stack([flat[pos], flat[pos + 1]], axis=1).astype(np.int64)
        cands = flat[rng.integers(0, flat.size, (num_queries, 25))].astype(np.int64)
        cands[:, 0] = flat[pos + 2]
        out_p = np.empty(25, np.float32)
        out_len = np.empty(25, np.int64)
        args = (*loaded.arrays(), order, contexts, cands, out_p, out_len)
        _query_loop(*args[:4], contexts[:10], cands[:10], out_p, out_len)
        # CPU time, not wall time: on a shared machine the wall clock counts other processes
        t0 = time.process_time()
        _query_loop(*args)
        query_us = (time.process_time() - t0) / num_queries * 1e6
        # a decoding step queries a few hundred related contexts: cycle over 100 of them
        cyc = np.arange(num_queries) % 100
        t0 = time.process_time()
        _query_loop(*loaded.arrays(), order, contexts[cyc], cands[cyc], out_p, out_len)
        hot_query_us = (time.process_time() - t0) / num_queries * 1e6
        t0 = time.process_time()
        root = loaded.root_table()
        root_table_s = time.process_time() - t0
        root_args = (*loaded.arrays(), root, order)
        _query_loop_root(*root_args, contexts[:10], cands[:10], out_p, out_len)
        t0 = time.process_time()
        _query_loop_root(*root_args, contexts, cands, out_p, out_len)
        root_query_us = (time.process_time() - t0) / num_queries * 1e6
        t0 = time.process_time()
        _query_loop_root(*root_args, contexts[cyc], cands[cyc], out_p, out_len)
        root_hot_query_us = (time.process_time() - t0) / num_queries * 1e6
        t0 = time.perf_counter()
        for q in range(min(num_queries, 20_000)):
            loaded.probability(contexts[q], cands[q])
        py_query_us = (time.perf_counter() - t0) / min(num_queries, 20_000) * 1e6
        del loaded, args, root_args

    return {
        "tokens": int(n_tokens),
        "order": order,
        "num_nodes": trie.num_nodes,
        "nodes_per_depth": trie.level_sizes(),
        "bytes_per_node_in_memory": trie.nbytes / trie.num_nodes,
        "bytes_per_node_file": file_bytes / trie.num_nodes,
        "build_s": build_s,
        "build_tokens_per_s": n_tokens / build_s,
        "save_s": save_s,
        "load_s": load_s,
        "reference_file_bytes": ref_bytes,
        "convert_s": convert_s,
        "convert_MB_per_s": ref_bytes / convert_s / 1e6,
        "convert_identical": bool(same),
        "query_us_numba_random_contexts": query_us,
        "query_us_numba_100_contexts_cycled": hot_query_us,
        "query_us_python_api": py_query_us,
        "root_table_bytes": int(root.nbytes),
        "root_table_build_s": root_table_s,
        "query_us_numba_random_contexts_root_table": root_query_us,
        "query_us_numba_100_contexts_cycled_root_table": root_hot_query_us,
    }


def _small_reference(tmp, trie):
    path = os.path.join(tmp, "warm.ref.trie")
    _reference_bytes(*trie.arrays(), trie.order).tofile(path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4_000_000, help="corpus size (default 4M)")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    res = run_ngram_bench(args.tokens, order=args.order, num_queries=args.queries)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:>30}: {v:.4g}" if isinstance(v, float) else f"{k:>30}: {v}")


if __name__ == "__main__":
    main()
