"""Fuzzing the trie loaders and the ngram CLI (docs/spec.md §5, §6): random truncations and byte
flips of small valid files of both formats either fail with a FileFormatError or load a trie
that answers queries; when the loaded trie is still the original one, its answers equal a
plain-Python restatement of §5.2 computed from the original sequences. Never another exception,
a crash or a hang: every example runs under a watchdog that ends the process (failing the run)
if it is stuck, even inside compiled code. Random CLI values end in success or one `error:` line.

The default run takes seconds; `-m slow` runs thousands of examples."""
from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import os
import struct
import sys
import tempfile
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_jax.errors import FileFormatError
from dart_jax.ngram import Trie, build_tree
from dart_jax.ngram.__main__ import main as ngram_cli
from trie_oracle import window_counts

SEQS = [[5, 1, 2, 3, 1, 2, 4, 9, 2], [1, 2, 3, 7, 7, 7, 1], [3, 1, 2, 3, 1, 0, 4]]
ORDER = 3
QUERIES = [([1, 2], [3, 4, 0, 9]), ([7], [7, 1, 2]), ([3, 1], [2, 0, 5]), ([9, 9], [1]), ([2], [3, 4, 5, 6])]
WATCHDOG_S = 60  # far above any example; only a hang reaches it


# -- oracle: docs/spec.md §5.1 counts and §5.2 probabilities in plain Python ----------------------------


def oracle_probability(counts, order, context, tokens):
    probs, lens = [np.float32(0)] * len(tokens), [0] * len(tokens)
    for length in range(min(order - 1, len(context)), 0, -1):
        ctx = tuple(context[len(context) - length:])
        if ctx not in counts:
            continue
        inv = np.float32(1) / np.float32(counts[ctx])
        for i, t in enumerate(tokens):
            if lens[i] == 0 and ctx + (t,) in counts:
                probs[i], lens[i] = np.float32(counts[ctx + (t,)]) * inv, length
    return np.array(probs, np.float32), np.array(lens, np.int64)


COUNTS = window_counts(SEQS, ORDER)


def spec_arrays(counts):
    """docs/spec.md §6.2 arrays: breadth-first, siblings by token."""
    nodes = sorted(counts, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(nodes)}
    nchild = Counter(index[p[:-1]] for p in nodes if p)
    child_start = [1]
    for i in range(len(nodes)):
        child_start.append(child_start[-1] + nchild[i])
    return [p[-1] if p else 0 for p in nodes], [counts[p] for p in nodes], child_start


EXPECTED_ARRAYS = spec_arrays(COUNTS)


def meets_spec(token, freq, child_start, order, *, full: bool) -> bool:
    """docs/spec.md §6.2's invariants restated: what every load guarantees (children table tiling
    breadth-first, non-root frequencies >= 0 and >= their children's sum, depth <= order <= 64)
    and, with ``full``, what verify adds (siblings strictly increasing, non-root tokens >= 0)."""
    n = len(freq)
    cs = [int(x) for x in child_start]
    if not 1 <= order <= 64 or cs[0] != 1 or cs[n] != n:
        return False
    if any(cs[i + 1] < cs[i] or cs[i] <= i or cs[i + 1] > n for i in range(n)):
        return False
    if any(f < 0 for f in freq[1:]) or any(sum(freq[cs[i]:cs[i + 1]]) > freq[i] for i in range(1, n)):
        return False
    depth = [0] * n
    for i in range(n):
        for c in range(cs[i], cs[i + 1]):
            depth[c] = depth[i] + 1
    if max(depth) > order:
        return False
    if full:
        if any(token[c] <= token[c - 1] for i in range(n) for c in range(cs[i] + 1, cs[i + 1])):
            return False
        if any(t < 0 for t in token[1:]):
            return False
    return True


# -- the two valid files, written from the spec's layouts ------------------------------------------------
@functools.lru_cache(maxsize=None)
def valid_file(fmt: str) -> bytes:
    token, freq, child_start = EXPECTED_ARRAYS
    n = len(token)
    if fmt == "ours":
        align = lambda x: (x + 63) // 64 * 64  # noqa: E731
        freq_off = align(64 + 4 * n)
        cs_off = align(freq_off + 4 * n)
        size = cs_off + 8 * (n + 1)
        buf = bytearray(size)
        struct.pack_into("<8sIIQQQQQQ", buf, 0, b"DJNGTRIE", 1, 64, ORDER, n, 64, freq_off, cs_off, size)
        buf[64:64 + 4 * n] = np.asarray(token, "<i4").tobytes()
        buf[freq_off:freq_off + 4 * n] = np.asarray(freq, "<i4").tobytes()
        buf[cs_off:] = np.asarray(child_start, "<i8").tobytes()
        return bytes(buf)
    # the reference's: node ids reversed (not breadth-first), children listed in reverse
    ids = {0: 0, **{i: n - i for i in range(1, n)}}
    records = [b""] * n
    for i in range(n):
        kids = list(range(child_start[i], child_start[i + 1]))[::-1]
        parent = next((p for p in range(n) if child_start[p] <= i < child_start[p + 1]), 0)
        rec = struct.pack("<iQiQ", token[i], ids[parent], freq[i], len(kids))
        rec += b"".join(struct.pack("<iQ", token[c], ids[c]) for c in kids)
        records[ids[i]] = rec
    return struct.pack("<QQ", ORDER, n) + b"".join(records)


@contextlib.contextmanager
def watchdog():
    """End the process (a failed run, with every thread's stack) if the body hangs, even in Numba code."""
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def damaged(fmt: str, cut, flips) -> bytes:
    raw = bytearray(valid_file(fmt))
    for pos, value in flips:
        raw[pos] = value
    return bytes(raw[:cut]) if cut is not None else bytes(raw)


def load(fmt: str, path: str, *, verify: bool, to_file: bool):
    if fmt == "ours":
        return Trie.load(path, verify=verify)
    out = path + ".conv" if to_file else None
    return Trie.from_reference(path, out, chunk_bytes=64, progress=False)


def exercise(trie: Trie, *, full: bool) -> None:
    """What loaded meets the spec's invariants (all of them when verified or converted); queries,
    the tree search, reduce and merge answer (correctly when the trie is the original one)."""
    token, freq, child_start = (a.tolist() for a in trie.arrays())
    assert meets_spec(token, freq, child_start, trie.order, full=full)
    identical = trie.order == ORDER and all(np.array_equal(a, e) for a, e in zip(trie.arrays(), EXPECTED_ARRAYS))
    for context, tokens in QUERIES:
        probs, lens = trie.probability(context, tokens)
        if identical:
            want_p, want_len = oracle_probability(COUNTS, ORDER, context, tokens)
            np.testing.assert_array_equal(probs, want_p)
            np.testing.assert_array_equal(lens, want_len)
        trie.continuations(context, 3)
    ids = np.array([[1, 2, 3], [2, 3, 4]])
    probs = np.array([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]])
    tree = build_tree(ids, probs, [5, 1], trie, eos_id=9, beam_width=3, keep=6)
    assert 1 <= int(tree.num_nodes) <= 7
    trie.reduce(2)
    trie.merge(trie)


def regions(fmt: str) -> list[tuple[int, int]]:
    """(start, end) byte ranges of a valid file's parts, so that damage reaches each of them."""
    size = len(valid_file(fmt))
    if fmt == "reference":
        return [(0, 16), (16, size)]
    n = len(EXPECTED_ARRAYS[0])
    _, _, _, _, _, tok_off, freq_off, cs_off, _ = struct.unpack_from("<8sIIQQQQQQ", valid_file(fmt))
    return [(0, 64), (tok_off, tok_off + 4 * n), (freq_off, freq_off + 4 * n), (cs_off, size)]


def flips_in(fmt: str):
    spot = st.sampled_from(regions(fmt)).flatmap(lambda r: st.integers(r[0], r[1] - 1))
    return st.lists(st.tuples(spot, st.integers(0, 255)), max_size=4)  # (position, new byte)


mutations = st.sampled_from(["ours", "reference"]).flatmap(lambda fmt: st.tuples(
    st.just(fmt),
    st.one_of(st.none(), st.integers(0, len(valid_file(fmt)))),  # truncate to this many bytes
    flips_in(fmt),
    st.booleans(),  # verify (ours) / convert to a file (reference)
))


def check_mutation(fmt, cut, flips, flag):
    data = damaged(fmt, cut, flips)
    with tempfile.TemporaryDirectory() as d, watchdog():
        path = os.path.join(d, "t.trie")
        with open(path, "wb") as f:
            f.write(data)
        try:
            trie = load(fmt, path, verify=flag, to_file=flag)
        except FileFormatError as e:
            assert str(path) in str(e)  # the message names the file
            assert sorted(os.listdir(d)) == ["t.trie"]  # a failed conversion leaves nothing
            return
        exercise(trie, full=flag or fmt == "reference")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_damaged_files_give_a_file_error_or_a_working_trie(mutation):
    check_mutation(*mutation)


@pytest.mark.slow
@settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_damaged_files_long_run(mutation):
    check_mutation(*mutation)


def test_the_undamaged_files_answer_like_the_oracle():
    """The property's other half can fail: both valid files must load into the expected trie."""
    for fmt in ("ours", "reference"):
        for flag in (False, True):
            check_mutation(fmt, None, [], flag)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "t.trie")
                with open(path, "wb") as f:
                    f.write(valid_file(fmt))
                trie = load(fmt, path, verify=flag, to_file=flag)
                assert [a.tolist() for a in trie.arrays()] == list(EXPECTED_ARRAYS)


# -- the ngram CLI's numeric options ----------------------------------------------------------------------
VALUES = st.one_of(st.integers(-3, 3), st.integers(-(2**40), 2**40), st.sampled_from([64, 65, 2**31 - 1, 2**31, 16384]))
OPTIONS = {"build": ["--order", "--chunk-tokens", "--reduce", "--eos"], "convert": ["--chunk-mb"],
           "query": ["--top"], "reduce": ["--threshold"]}


@functools.lru_cache(maxsize=None)
def cli_inputs() -> dict[str, str]:
    d = tempfile.mkdtemp(prefix="fuzz-trie-cli-")
    paths = {"data": os.path.join(d, "data.jsonl"), "ours": os.path.join(d, "t.trie"),
             "reference": os.path.join(d, "ref.trie"), "dir": d}
    with open(paths["data"], "w") as f:
        f.write("\n".join(json.dumps(s) for s in SEQS))
    for fmt in ("ours", "reference"):
        with open(paths[fmt], "wb") as f:
            f.write(valid_file(fmt))
    return paths


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(OPTIONS)).flatmap(
    lambda cmd: st.tuples(st.just(cmd), st.lists(st.tuples(st.sampled_from(OPTIONS[cmd]), VALUES), min_size=1,
                                                 max_size=3))))
def test_random_cli_values_succeed_or_give_one_error_line(capsys, case):
    cmd, flags = case
    p = cli_inputs()
    out = os.path.join(p["dir"], "out.trie")
    base = {"build": ["build", p["data"], "-o", out], "convert": ["convert", p["reference"], out],
            "query": ["query", p["ours"], "--context", "1,2"], "reduce": ["reduce", p["ours"], out]}[cmd]
    if cmd == "reduce" and "--threshold" not in [f for f, _ in flags]:
        base += ["--threshold", "2"]
    argv = base + [x for flag, value in flags for x in (flag, str(value))]
    with watchdog():
        code = ngram_cli(argv)
    err = capsys.readouterr().err
    if code == 0:
        assert "error" not in err
        if cmd != "query":
            Trie.load(out, verify=True)
    else:
        assert code == 2 and "Traceback" not in err, err
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and any(flag in lines[0] for flag, _ in flags), err
    with contextlib.suppress(FileNotFoundError):
        os.remove(out)
