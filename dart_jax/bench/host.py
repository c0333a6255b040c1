"""Host-side benchmarks: the n-gram trie (`ngram` mode) and the tree search (`search` mode).

Both run on the CPU in Numba code, so they need no model. Without a trie file they build a
synthetic one: Zipf-distributed token sequences (`zipf`), which give the skewed fan-out of text,
or text-shaped sequences that also repeat a bank of phrases and end in EOS (`phrases`).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import njit

from dart_jax.bench.options import CORPORA  # noqa: F401 (importable here, as before)
from dart_jax.bench.util import CLOCKS, median, progress, summary_ms, time_calls, zipf_probs, zipf_tokens
from dart_jax.ngram import Trie, build_tree, build_tree_batch
from dart_jax.ngram.trie import ngram_probs



@njit(cache=True)
def _query_loop(token, freq, child_start, order, contexts, cands, out_p, out_len, root):
    # one kernel call per query, all inside compiled code: the cost without Python dispatch
    total = 0.0
    for q in range(contexts.shape[0]):
        ngram_probs(token, freq, child_start, order, contexts[q], cands[q], out_p, out_len, root)
        total += out_p[0]
    return total


@njit(cache=True)
def _reference_bytes(token, freq, child_start, order):
    """The trie in the reference format (docs/spec.md §6), children listed in descending token order."""
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
        buf[p:p + 4].view(np.int32)[0] = token[i]
        buf[p + 4:p + 12].view(np.int64)[0] = parent[i]
        buf[p + 12:p + 16].view(np.int32)[0] = freq[i]
        buf[p + 16:p + 24].view(np.int64)[0] = child_start[i + 1] - child_start[i]
        p += 24
        for c in range(child_start[i + 1] - 1, child_start[i] - 1, -1):
            buf[p:p + 4].view(np.int32)[0] = token[c]
            buf[p + 4:p + 12].view(np.int64)[0] = c
            p += 12
    return buf


def _zipf_corpus(rng: np.random.Generator, corpus_tokens: int, vocab: int, seq_len: int = 256) -> list[np.ndarray]:
    stream = zipf_tokens(rng, corpus_tokens, vocab)
    return [stream[i:i + seq_len] for i in range(0, len(stream), seq_len)]


def _phrase_corpus(rng: np.random.Generator, corpus_tokens: int, vocab: int) -> list[np.ndarray]:
    """Sequences of about 600 tokens ending in EOS (the last id): 40 % of the pieces come from a
    bank of 5000 phrases of 3 to 12 tokens, picked by a Zipf law, the rest are runs of Zipf ids,
    which are permuted so that the frequent tokens are not simply the small ids."""
    eos = vocab - 1
    ids = rng.permutation(vocab - 1)

    def zipf(n):
        return ids[(rng.zipf(1.15, n) - 1) % (vocab - 1)]

    phrases = [zipf(int(rng.integers(3, 13))) for _ in range(5000)]
    phrase_rank = (rng.zipf(1.3, corpus_tokens) - 1) % len(phrases)
    pieces, total, k = [], 0, 0
    while total < corpus_tokens:
        if rng.random() < 0.4:
            piece = phrases[phrase_rank[k]]
            k += 1
        else:
            piece = zipf(int(rng.integers(1, 12)))
        pieces.append(piece)
        total += piece.size
    stream = np.concatenate(pieces)[:corpus_tokens]
    cuts = np.sort(rng.choice(np.arange(1, corpus_tokens), size=max(1, corpus_tokens // 600), replace=False))
    return [np.append(s, eos) for s in np.split(stream, cuts)]


def _load_or_build_trie(*, trie_path, reference_trie, corpus, corpus_tokens, vocab, order, rng):
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
    if corpus not in CORPORA:
        raise ValueError(f"--corpus must be one of {', '.join(CORPORA)}, got {corpus!r}")
    if corpus_tokens < order + 2:
        raise ValueError(f"--corpus-tokens must be at least the order + 2 ({order + 2}), got {corpus_tokens}")
    make = _zipf_corpus if corpus == "zipf" else _phrase_corpus
    sequences = make(rng, corpus_tokens, vocab)
    tokens = int(sum(len(s) for s in sequences))
    t0 = time.perf_counter()
    trie = Trie.build(sequences, order=order)
    build_s = time.perf_counter() - t0
    return trie, {"source": f"synthetic {corpus} corpus: {corpus_tokens} tokens, vocab {vocab}", "tokens": tokens,
                  "build_s": build_s, "build_tokens_per_s": tokens / build_s}, sequences


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


def run_ngram(*, trie_path: str | None = None, reference_trie: str | None = None, corpus: str = "zipf",
              corpus_tokens: int = 200_000, vocab: int = 151_936, order: int = 3, queries: int = 2000,
              candidates: int = 25, hot_contexts: int | None = None, root_table: bool = False,
              convert: bool = False, clock: str = "wall", reps: int = 5, warmup: int = 1, seed: int = 0,
              show_progress: bool = True) -> dict[str, Any]:
    """Load time, memory per node and query latency of an n-gram trie; optionally the latency
    through the root table, over a few repeated contexts, and the conversion from the reference
    format."""
    if queries < 1 or candidates < 1:
        raise ValueError(f"--queries and --candidates must be >= 1, got {queries} and {candidates}")
    if hot_contexts is not None and hot_contexts < 1:
        raise ValueError(f"--hot-contexts must be >= 1, got {hot_contexts}")
    if clock not in CLOCKS:
        raise ValueError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    timer = CLOCKS[clock]
    rng = np.random.default_rng(seed)
    roots = (None, "root_table") if root_table else (None,)
    cycles = (None, "hot") if hot_contexts else (None,)
    kernel_warmup = max(warmup, 1)  # the first call compiles
    kernel_runs = len(roots) * len(cycles) + convert
    bar = progress(3 + (reps + warmup) * (1 + root_table) + (reps + kernel_warmup) * kernel_runs, "ngram",
                   show_progress)
    trie, source, sequences = _load_or_build_trie(trie_path=trie_path, reference_trie=reference_trie, corpus=corpus,
                                                  corpus_tokens=corpus_tokens, vocab=vocab, order=order, rng=rng)
    bar.update()
    arrays = trie.arrays()
    num_nodes = int(trie.num_nodes)
    row: dict[str, Any] = {"num_nodes": num_nodes, "order": int(trie.order), "nodes_per_depth": trie.level_sizes()}
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(trie_path) if trie_path else Path(tmp) / "bench.trie"
        if not trie_path:
            t0 = time.perf_counter()
            trie.save(file)
            row["save_s"] = time.perf_counter() - t0
        bar.update()
        files = [file] if file.is_file() else file.rglob("*")
        row["file_bytes"] = sum(f.stat().st_size for f in files if f.is_file())
        row["bytes_per_node_file"] = row["file_bytes"] / max(num_nodes, 1)
        row["bytes_per_node_memory"] = sum(a.nbytes for a in arrays) / max(num_nodes, 1)
        row["load_ms"] = summary_ms(time_calls(lambda: Trie.load(file), reps=reps, warmup=warmup, tick=bar.update,
                                               clock=timer))["median_ms"]
        if root_table:
            # the table is built on a trie's first use: time it on freshly loaded ones
            fresh = iter([Trie.load(file) for _ in range(reps + warmup)])
            build = time_calls(lambda: next(fresh).root_table(), reps=reps, warmup=warmup, tick=bar.update,
                               clock=timer)
            row["root_table_bytes"] = int(trie.root_table().nbytes)
            row["root_table_build_ms"] = summary_ms(build)["median_ms"]
        if convert:
            reference = Path(reference_trie) if reference_trie else Path(tmp) / "bench.ref.trie"
            if not reference_trie:
                _reference_bytes(*arrays, trie.order).tofile(reference)
            converted = {}

            def convert_once():
                converted["trie"] = Trie.from_reference(reference, progress=False)

            seconds = time_calls(convert_once, reps=reps, warmup=kernel_warmup, tick=bar.update, clock=timer)
            row["reference_file_bytes"] = reference.stat().st_size
            row["convert_s"] = median(seconds)
            row["convert_mb_per_s"] = row["reference_file_bytes"] / row["convert_s"] / 1e6
            row["convert_identical"] = all(np.array_equal(a, b) for a, b in zip(converted["trie"].arrays(), arrays))
    contexts, cands = _queries(rng, trie, sequences, vocab, queries, candidates)
    per_call = []
    for q in range(queries):
        t0 = timer()
        trie.probability(contexts[q], cands[q])
        per_call.append(timer() - t0)
    row["query_us"] = median(per_call) * 1e6
    row["hit_rate"] = float(np.mean([np.mean(trie.probability(contexts[q], cands[q])[0] > 0)
                                     for q in range(min(queries, 200))]))
    row["candidates_per_query"] = candidates
    bar.update()
    out_p = np.zeros(candidates, np.float32)
    out_len = np.zeros(candidates, np.int64)
    # a decoding step queries a few related contexts many times: cycling over `hot_contexts` of
    # them shows the latency with the trie's paths in the CPU caches
    hot = np.arange(queries) % (hot_contexts or 1)
    for root in roots:
        for cycle in cycles:
            ctx, cand = (contexts[hot], cands[hot]) if cycle else (contexts, cands)
            table = trie.root_table() if root else None
            seconds = time_calls(lambda: _query_loop(*arrays, trie.order, ctx, cand, out_p, out_len, table),
                                 reps=reps, warmup=kernel_warmup, tick=bar.update, clock=timer)
            key = "_".join(["kernel_query_us", *filter(None, (cycle, root))])
            row[key] = median(seconds) / queries * 1e6
    bar.close()
    for key in ("tokens", "build_s", "build_tokens_per_s"):
        if key in source:
            row[key] = source[key]
    config = {"source": source["source"], "order": int(trie.order), "queries": queries, "candidates": candidates,
              "hot_contexts": hot_contexts, "root_table": root_table, "convert": convert, "clock": clock,
              "reps": reps, "warmup": warmup, "seed": seed}
    summary = {k: row[k] for k in ("num_nodes", "load_ms", "query_us", "kernel_query_us", "bytes_per_node_file")}
    return {"mode": "ngram", "config": config, "rows": [row], "summary": summary}


def _draft_inputs(rng, *, samples: int, draft_rows: int, topk: int, vocab: int):
    """`samples` (ids [d, k], probs [d, k], preceding [d]): distinct candidates per row drawn like
    text tokens, probabilities the softmax of sorted random logits."""
    p = zipf_probs(vocab)
    inputs = []
    for _ in range(samples):
        ids = np.stack([rng.choice(vocab, size=topk, replace=False, p=p) for _ in range(draft_rows)]).astype(np.int32)
        logits = -np.sort(-rng.normal(0.0, 2.0, size=(draft_rows, topk)), axis=1)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)
        inputs.append((ids, probs, zipf_tokens(rng, draft_rows, vocab).astype(np.int32)))
    return inputs


def run_search(*, keeps=(8, 16, 32, 60), beams=(5, 10, 20), draft_rows: int = 8, topk: int = 25,
               vocab: int = 151_936, trie_path: str | None = None, reference_trie: str | None = None,
               corpus: str = "zipf", corpus_tokens: int = 200_000, order: int = 3, no_ngram: bool = False,
               ngram_weight: float = 0.5, samples: int = 16, batch: int = 1, threads: int | None = None,
               clock: str = "wall", reps: int = 30, warmup: int = 3, seed: int = 0,
               show_progress: bool = True) -> dict[str, Any]:
    """Time `build_tree` alone over a grid of tree sizes (keep) and beam widths; with `batch` > 1,
    `build_tree_batch` on that many inputs per call (on `threads` Numba threads)."""
    if min(draft_rows, topk, samples, batch) < 1:
        raise ValueError(f"--draft-rows, --topk, --samples and --batch must be >= 1, got {draft_rows}, {topk}, "
                         f"{samples}, {batch}")
    if topk > vocab:
        raise ValueError(f"--topk ({topk}) cannot exceed --vocab ({vocab})")
    if threads is not None and not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"--threads must lie in [1, {numba.config.NUMBA_NUM_THREADS}] (Numba's thread pool), "
                         f"got {threads}")
    if clock not in CLOCKS:
        raise ValueError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    rng = np.random.default_rng(seed)
    trie, source = None, {"source": "none (--no-ngram)"}
    if not no_ngram:
        trie, source, _ = _load_or_build_trie(trie_path=trie_path, reference_trie=reference_trie, corpus=corpus,
                                              corpus_tokens=corpus_tokens, vocab=vocab, order=order, rng=rng)
    eos_id = vocab - 1
    inputs = _draft_inputs(rng, samples=samples, draft_rows=draft_rows, topk=topk, vocab=vocab)
    if batch > 1:
        # call s builds the trees of inputs s·batch, s·batch + 1, ... (cycled), stacked
        inputs = [tuple(np.stack(parts) for parts in zip(*(inputs[(s * batch + j) % samples] for j in range(batch))))
                  for s in range(samples)]
    search = build_tree_batch if batch > 1 else build_tree
    grid = [(k, b) for k in keeps for b in beams]
    bar = progress(len(grid) * (reps + warmup), "search", show_progress)
    rows = []
    threads_before = numba.get_num_threads()
    if threads is not None:
        numba.set_num_threads(threads)
    try:
        for keep, beam in grid:
            counter = {"i": 0, "nodes": []}

            def call():
                ids, probs, preceding = inputs[counter["i"] % samples]
                counter["i"] += 1
                tree = search(ids, probs, preceding, trie, eos_id=eos_id, beam_width=beam, keep=keep,
                              ngram_weight=ngram_weight)
                counter["nodes"].append(np.mean(tree.num_nodes))
                return tree

            times = summary_ms(time_calls(call, reps=reps, warmup=warmup, tick=bar.update, clock=CLOCKS[clock]))
            row = {"keep": keep, "beam": beam, **times, "nodes": float(np.mean(counter["nodes"]))}
            if batch > 1:
                row.update(batch=batch, ms_per_tree=times["median_ms"] / batch)
            rows.append(row)
    finally:
        numba.set_num_threads(threads_before)
    bar.close()
    config = {"source": source["source"], "draft_rows": draft_rows, "topk": topk, "vocab": vocab,
              "samples": samples, "ngram": not no_ngram, "ngram_weight": ngram_weight, "batch": batch,
              "threads": threads or threads_before, "clock": clock, "reps": reps, "warmup": warmup, "seed": seed}
    if trie is not None:
        config["trie_nodes"] = int(trie.num_nodes)
        if "build_s" in source:
            config["trie_build_s"] = source["build_s"]
    best = max(rows, key=lambda r: (r["keep"], r["beam"]))
    summary = {"largest_keep": best["keep"], "largest_beam": best["beam"], "median_ms": best["median_ms"]}
    return {"mode": "search", "config": config, "rows": rows, "summary": summary}
