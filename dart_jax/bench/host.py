"""Host-side benchmarks: the n-gram trie (`ngram` mode) and the tree search (`search` mode).

Both run on the CPU in Numba code, so they need no model. Without a trie file they build a
synthetic one from Zipf-distributed token sequences, which gives the skewed fan-out of text.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from dart_jax.bench.util import median, progress, summary_ms, time_calls, zipf_tokens
from dart_jax.ngram import Trie, build_tree
from dart_jax.ngram.trie import ngram_probs


@njit(cache=True)
def _query_loop(token, freq, child_start, order, contexts, cands, out_p, out_len):
    # one kernel call per query, all inside compiled code: the cost without Python dispatch
    total = 0.0
    for q in range(contexts.shape[0]):
        ngram_probs(token, freq, child_start, order, contexts[q], cands[q], out_p, out_len)
        total += out_p[0]
    return total


def _synthetic_sequences(rng: np.random.Generator, corpus_tokens: int, vocab: int, seq_len: int) -> list[np.ndarray]:
    stream = zipf_tokens(rng, corpus_tokens, vocab)
    return [stream[i:i + seq_len] for i in range(0, len(stream), seq_len)]


def _load_or_build_trie(*, trie_path, reference_trie, corpus_tokens, vocab, order, seq_len, rng):
    """(trie, facts about how it was obtained, corpus sequences or None)."""
    if trie_path and reference_trie:
        raise ValueError("pass either --trie (our format) or --reference-trie (a reference .trie file), not both")
    if trie_path or reference_trie:
        path = Path(trie_path or reference_trie)
        if not path.is_file():
            raise FileNotFoundError(f"trie file {path} not found; pass an existing file or omit it to use a synthetic trie")
        t0 = time.perf_counter()
        trie = Trie.load(path) if trie_path else Trie.from_reference(path, progress=False)
        return trie, {"source": str(path), "open_s": time.perf_counter() - t0}, None
    if corpus_tokens < order + 2:
        raise ValueError(f"--corpus-tokens must be at least the order + 2 ({order + 2}), got {corpus_tokens}")
    sequences = _synthetic_sequences(rng, corpus_tokens, vocab, seq_len)
    t0 = time.perf_counter()
    trie = Trie.build(sequences, order=order)
    build_s = time.perf_counter() - t0
    return trie, {"source": f"synthetic zipf corpus: {corpus_tokens} tokens, vocab {vocab}", "build_s": build_s}, sequences


def _queries(rng, trie: Trie, sequences, vocab: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Contexts of order-1 tokens and k candidates each. From a corpus, half of the candidates are
    tokens seen after a context somewhere, so the lookups walk the trie like real drafts do."""
    c = max(trie.order - 1, 1)
    contexts = np.empty((n, c), np.int64)
    cands = np.empty((n, k), np.int64)
    if sequences:
        stream = np.concatenate(sequences)
        starts = rng.integers(0, len(stream) - c - 1, size=n)
        for q, s in enumerate(starts):
            contexts[q] = stream[s:s + c]
            seen = stream[rng.integers(0, len(stream), size=k // 2)]
            cands[q] = np.concatenate([stream[s + c:s + c + 1], seen, zipf_tokens(rng, k - 1 - k // 2, vocab)])
    else:
        token, _, child_start = trie.arrays()
        # contexts along random trie paths, candidates from the children seen there and at random
        for q in range(n):
            node, path = 0, []
            for _ in range(c):
                lo, hi = int(child_start[node]), int(child_start[node + 1])
                if hi <= lo:
                    break
                node = int(rng.integers(lo, hi))
                path.append(int(token[node]))
            path = ([0] * (c - len(path))) + path
            contexts[q] = path
            cands[q] = token[rng.integers(1, len(token), size=k)]
    return contexts, cands


def run_ngram(*, trie_path: str | None = None, reference_trie: str | None = None, corpus_tokens: int = 200_000,
              vocab: int = 151_936, order: int = 3, seq_len: int = 256, queries: int = 2000, candidates: int = 25,
              reps: int = 5, warmup: int = 1, seed: int = 0, show_progress: bool = True) -> dict[str, Any]:
    """Load time, memory per node and query latency of an n-gram trie."""
    if queries < 1 or candidates < 1:
        raise ValueError(f"--queries and --candidates must be >= 1, got {queries} and {candidates}")
    rng = np.random.default_rng(seed)
    bar = progress(3 + 2 * (reps + warmup), "ngram", show_progress)
    trie, source, sequences = _load_or_build_trie(trie_path=trie_path, reference_trie=reference_trie,
                                                  corpus_tokens=corpus_tokens, vocab=vocab, order=order,
                                                  seq_len=seq_len, rng=rng)
    bar.update()
    arrays = trie.arrays()
    memory_bytes = int(sum(a.nbytes for a in arrays))
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(trie_path) if trie_path else Path(tmp) / "bench.trie"
        save_s = None
        if not trie_path:
            t0 = time.perf_counter()
            trie.save(file)
            save_s = time.perf_counter() - t0
        bar.update()
        file_bytes = sum(f.stat().st_size for f in ([file] if file.is_file() else file.rglob("*")) if f.is_file())
        load_times = time_calls(lambda: Trie.load(file), reps=reps, warmup=warmup, tick=bar.update)
    num_nodes = int(trie.num_nodes)

    contexts, cands = _queries(rng, trie, sequences, vocab, queries, candidates)
    per_call = []
    for q in range(queries):
        t0 = time.perf_counter()
        probs, _ = trie.probability(contexts[q], cands[q])
        per_call.append(time.perf_counter() - t0)
    hits = float(np.mean([np.mean(trie.probability(contexts[q], cands[q])[0] > 0) for q in range(min(queries, 200))]))
    bar.update()
    token, freq, child_start = arrays
    out_p = np.zeros(candidates, np.float32)
    out_len = np.zeros(candidates, np.int64)
    kernel = time_calls(lambda: _query_loop(token, freq, child_start, trie.order, contexts, cands, out_p, out_len),
                        reps=reps, warmup=max(warmup, 1), tick=bar.update)
    bar.close()
    row = {
        "num_nodes": num_nodes,
        "order": int(trie.order),
        "file_bytes": int(file_bytes),
        "bytes_per_node_file": file_bytes / max(num_nodes, 1),
        "bytes_per_node_memory": memory_bytes / max(num_nodes, 1),
        "load_ms": summary_ms(load_times)["median_ms"],
        "query_us": median(per_call) * 1e6,
        "kernel_query_us": median(kernel) / queries * 1e6,
        "candidates_per_query": candidates,
        "hit_rate": hits,
    }
    if "build_s" in source:
        row["build_s"] = source["build_s"]
    if save_s is not None:
        row["save_s"] = save_s
    config = {"source": source["source"], "order": int(trie.order), "queries": queries, "candidates": candidates,
              "reps": reps, "warmup": warmup, "seed": seed}
    summary = {k: row[k] for k in ("num_nodes", "load_ms", "query_us", "kernel_query_us", "bytes_per_node_file")}
    return {"mode": "ngram", "config": config, "rows": [row], "summary": summary}


def run_search(*, keeps=(8, 16, 32, 60), beams=(5, 10, 20), draft_length: int = 8, topk: int = 25,
               vocab: int = 151_936, trie_path: str | None = None, reference_trie: str | None = None,
               corpus_tokens: int = 200_000, order: int = 3, no_ngram: bool = False, samples: int = 16,
               reps: int = 30, warmup: int = 3, seed: int = 0, show_progress: bool = True) -> dict[str, Any]:
    """Time `build_tree` alone over a grid of tree sizes (keep) and beam widths."""
    if draft_length < 1 or topk < 1 or samples < 1:
        raise ValueError(f"--draft-length, --topk and --samples must be >= 1, got {draft_length}, {topk}, {samples}")
    if topk > vocab:
        raise ValueError(f"--topk ({topk}) cannot exceed --vocab ({vocab})")
    rng = np.random.default_rng(seed)
    trie, source = None, {"source": "none (--no-ngram)"}
    if not no_ngram:
        trie, source, _ = _load_or_build_trie(trie_path=trie_path, reference_trie=reference_trie,
                                              corpus_tokens=corpus_tokens, vocab=vocab, order=order,
                                              seq_len=256, rng=rng)
    eos_id = vocab - 1
    ranks = np.arange(1, vocab + 1, dtype=np.float64) ** -1.1
    ranks /= ranks.sum()
    inputs = []
    for _ in range(samples):
        # distinct candidates per row, drawn like text tokens; probabilities = softmax of top-k logits
        ids = np.stack([rng.choice(vocab, size=topk, replace=False, p=ranks) for _ in range(draft_length)]).astype(np.int32)
        logits = -np.sort(-rng.normal(0.0, 2.0, size=(draft_length, topk)), axis=1)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)
        preceding = zipf_tokens(rng, draft_length, vocab).astype(np.int32)
        inputs.append((ids, probs, preceding))
    grid = [(k, b) for k in keeps for b in beams]
    bar = progress(len(grid) * (reps + warmup), "search", show_progress)
    rows = []
    for keep, beam in grid:
        counter = {"i": 0, "nodes": []}

        def call():
            ids, probs, preceding = inputs[counter["i"] % samples]
            counter["i"] += 1
            tree = build_tree(ids, probs, preceding, trie, eos_id=eos_id, beam_width=beam, keep=keep)
            counter["nodes"].append(int(tree.num_nodes))
            return tree

        times = time_calls(call, reps=reps, warmup=warmup, tick=bar.update)
        rows.append({"keep": keep, "beam": beam, **summary_ms(times), "nodes": float(np.mean(counter["nodes"]))})
    bar.close()
    config = {"source": source["source"], "draft_length": draft_length, "topk": topk, "vocab": vocab,
              "samples": samples, "reps": reps, "warmup": warmup, "seed": seed, "ngram": not no_ngram}
    best = max(rows, key=lambda r: (r["keep"], r["beam"]))
    summary = {"largest_keep": best["keep"], "largest_beam": best["beam"], "median_ms": best["median_ms"]}
    return {"mode": "search", "config": config, "rows": rows, "summary": summary}
