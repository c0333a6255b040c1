"""Bad trie files, values and paths get a clear error (docs/spec.md §6): the order is bounded and
checked against the real depth, every load checks the children table and the frequencies, writes
are atomic and a killed conversion's scratch space is cleaned by the next run, and the CLIs
name the flag and its range. Expected outcomes come from plain-Python restatements of the
spec's invariants, never from the code under test."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections import Counter

import numpy as np
import pytest

from dart_jax import bench
from dart_jax.api.model import load_trie
from dart_jax.errors import FileFormatError, InputError, ResourceError
from dart_jax.ngram import MAX_ORDER, Trie, build_tree, _atomic, _memory, _reference
from dart_jax.ngram.__main__ import main as ngram_cli
from trie_oracle import window_counts, write_reference

SEQS = [[5, 1, 2, 3, 1, 2, 4, 9], [1, 2, 3, 7, 7, 7, 1], [3, 1, 2, 3, 1]]
HEADER_ORDER_AT = 16  # u64 order in both formats


# -- oracles: docs/spec.md §5.1 counts and §6 layouts restated in plain Python ------------------------


def csr_of(counts):
    """§6.2 arrays from a path -> freq dict: breadth-first, siblings by token."""
    nodes = sorted(counts, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(nodes)}
    token = [p[-1] if p else 0 for p in nodes]
    freq = [counts[p] for p in nodes]
    nchild = Counter(index[p[:-1]] for p in nodes if p)
    child_start = [1]
    for i in range(len(nodes)):
        child_start.append(child_start[-1] + nchild[i])
    return token, freq, child_start


def loads_cleanly(child_start, freq, order):
    """docs/spec.md §6.2's checks of every load, restated: a tiling breadth-first children table,
    frequencies >= 0 and children counting no more than their node (root excepted), depth <= order."""
    n = len(freq)
    cs = [int(x) for x in child_start]
    if cs[0] != 1 or cs[n] != n:
        return False
    for i in range(n):
        if cs[i + 1] < cs[i] or cs[i] <= i or cs[i + 1] > n:
            return False
    if any(f < 0 for f in freq[1:]):
        return False
    if any(sum(freq[cs[i]:cs[i + 1]]) > freq[i] for i in range(1, n)):
        return False
    depth = [0] * n
    for i in range(n):
        for c in range(cs[i], cs[i + 1]):
            depth[c] = depth[i] + 1
    return max(depth) <= order


def write_ours(path, token, freq, child_start, order):
    """A §6.2 file written from the spec's table (not by Trie.save)."""
    n = len(token)
    align = lambda x: (x + 63) // 64 * 64  # noqa: E731
    tok_off, freq_off = 64, align(64 + 4 * n)
    cs_off = align(freq_off + 4 * n)
    size = cs_off + 8 * (n + 1)
    buf = bytearray(size)
    struct.pack_into("<8sIIQQQQQQ", buf, 0, b"DJNGTRIE", 1, 64, order, n, tok_off, freq_off, cs_off, size)
    buf[tok_off:tok_off + 4 * n] = np.asarray(token, "<i4").tobytes()
    buf[freq_off:freq_off + 4 * n] = np.asarray(freq, "<i4").tobytes()
    buf[cs_off:size] = np.asarray(child_start, "<i8").tobytes()
    path.write_bytes(bytes(buf))
    return cs_off


@pytest.fixture
def good(tmp_path):
    counts = window_counts(SEQS, 3)
    path = tmp_path / "good.trie"
    cs_off = write_ours(path, *csr_of(counts), 3)
    return path, counts, cs_off


def one_error_line(err: str) -> bool:
    """stderr holds exactly one `error:` line and no traceback (progress bars may share stderr)."""
    return len([line for line in err.splitlines() if "error:" in line]) == 1 and "Traceback" not in err


def fast(fn, seconds=2.0):
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        assert time.perf_counter() - t0 < seconds, "took too long: a huge value reached a loop or an allocation"


# -- 1. the order is bounded and checked against the real depth ------------------------------------
@pytest.mark.parametrize("order", [0, MAX_ORDER + 1, 10**6, 2**63])
def test_an_out_of_range_header_order_is_a_fast_clear_error_in_both_formats(good, tmp_path, order):
    path, counts, _ = good
    raw = bytearray(path.read_bytes())
    struct.pack_into("<Q", raw, HEADER_ORDER_AT, order)
    path.write_bytes(bytes(raw))
    for verify in (False, True):
        with pytest.raises(FileFormatError, match=rf"good\.trie: corrupted header: order {order}, outside 1\.\.64"):
            fast(lambda: Trie.load(path, verify=verify))
    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, order)
    for out in (None, tmp_path / "conv.trie"):
        with pytest.raises(FileFormatError, match=rf"ref\.trie: .*order {order} \(expected 1\.\.64\)"):
            fast(lambda: Trie.from_reference(ref, out, progress=False))
    assert sorted(os.listdir(tmp_path)) == ["good.trie", "ref.trie"]


def test_the_largest_order_loads_and_an_order_below_the_depth_does_not(good, tmp_path):
    path, counts, _ = good
    raw = bytearray(path.read_bytes())
    struct.pack_into("<Q", raw, HEADER_ORDER_AT, MAX_ORDER)
    path.write_bytes(bytes(raw))
    assert Trie.load(path).order == MAX_ORDER  # the structure allows it; the counts are an order-3 trie's
    with pytest.raises(FileFormatError, match="good.trie: .*counts are those of an order-3 trie, not of the order 64"):
        Trie.load(path, verify=True)
    struct.pack_into("<Q", raw, HEADER_ORDER_AT, 2)  # the paths have 3 tokens
    path.write_bytes(bytes(raw))
    for verify in (False, True):
        with pytest.raises(FileFormatError, match="good.trie: .*longer than its order 2.*rebuild"):
            Trie.load(path, verify=verify)
    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, 2)
    with pytest.raises(FileFormatError, match="ref.trie: .*longer than its order 2"):
        Trie.from_reference(ref, progress=False)


def test_order_64_builds_and_counts_like_the_oracle():
    seqs = [list(range(70)), [3, 1, 2] * 30]
    trie = Trie.build(seqs, order=MAX_ORDER)
    token, freq, child_start = (a.tolist() for a in trie.arrays())
    assert (token, freq, child_start) == tuple(csr_of(window_counts(seqs, MAX_ORDER)))


@pytest.mark.parametrize("order", [0, -1, MAX_ORDER + 1, 10**6, 2**70, True, 2.5])
def test_the_api_rejects_out_of_range_orders_before_allocating(order):
    with pytest.raises(InputError, match="order"):
        fast(lambda: Trie.build(SEQS, order=order))
    token, freq, child_start = (np.asarray(a, dt) for a, dt in zip(csr_of(window_counts(SEQS, 3)),
                                                                    (np.int32, np.int32, np.int64)))
    with pytest.raises(InputError, match="order"):
        Trie(token, freq, child_start, order)

    class DuckTrie:  # build_tree takes anything with arrays() and order
        def arrays(self):
            return token, freq, child_start
    duck = DuckTrie()
    duck.order = order
    with pytest.raises(InputError, match=r"trie\.order"):
        fast(lambda: build_tree(np.array([[1, 2]]), np.array([[0.6, 0.4]]), [1], duck, eos_id=None))


# -- 2. every load checks the children table and the frequencies ------------------------------------
def test_every_child_start_corruption_is_an_error_unless_the_table_stays_valid(good):
    """Every entry of child_start set to values around and far from the right one: the load
    fails (naming the file, saying what to do) exactly when the spec's invariants fail."""
    path, counts, cs_off = good
    token, freq, child_start = csr_of(counts)
    n = len(token)
    original = path.read_bytes()
    tried = refused = 0
    for i in range(n + 1):
        v = child_start[i]
        for new in {v - 2, v - 1, v + 1, v + 2, 0, -1, n + 1, 2**62, -(2**63), i}:
            if new == v:
                continue
            corrupted = child_start.copy()
            corrupted[i] = new
            raw = bytearray(original)
            struct.pack_into("<q", raw, cs_off + 8 * i, new)
            path.write_bytes(bytes(raw))
            tried += 1
            if loads_cleanly(corrupted, freq, 3):
                Trie.load(path)
                continue
            refused += 1
            with pytest.raises(FileFormatError) as e:
                Trie.load(path)
            assert str(path) in str(e.value) and "rebuild it" in str(e.value)
    assert tried > 200 and refused > 0.9 * tried  # the corruptions that still tile are few


def test_the_reported_flip_of_child_start_no_longer_gives_wrong_probabilities(good, capsys):
    """The issue's case: a flipped child_start entry loaded silently into the query command and
    DartModel. Now each of them fails on the file."""
    path, counts, cs_off = good
    token, freq, child_start = csr_of(counts)
    raw = bytearray(path.read_bytes())
    flipped = child_start[2] ^ 1  # one bit
    struct.pack_into("<q", raw, cs_off + 16, flipped)
    path.write_bytes(bytes(raw))
    corrupted = child_start.copy()
    corrupted[2] = flipped
    assert not loads_cleanly(corrupted, freq, 3)
    with pytest.raises(FileFormatError, match="good.trie: corrupted trie: "):
        load_trie(path)  # what DartModel.from_pretrained calls
    for argv in (["query", str(path), "--context", "1,2"], ["info", str(path)],
                 ["reduce", str(path), str(path) + ".r", "--threshold", "2"],
                 ["merge", str(path) + ".m", str(path), str(path)]):
        assert ngram_cli(argv) == 2
        err = capsys.readouterr().err
        assert one_error_line(err) and "good.trie" in err, err
    assert sorted(os.listdir(path.parent)) == ["good.trie"]


def test_frequencies_are_checked_on_every_load_and_tokens_by_verify(good, tmp_path):
    path, counts, _ = good
    token, freq, child_start = csr_of(counts)
    kid = 1 + token[1:child_start[1]].index(1)  # depth-1 node of token 1 (it has children)
    cases = {
        "negative": (lambda f: f.__setitem__(kid, -3), f"node {kid} has a negative frequency"),
        "children exceed": (lambda f: f.__setitem__(kid, 1), f"the children of node {kid} count more"),
    }
    for name, (damage, match) in cases.items():
        bad = list(freq)
        damage(bad)
        assert not loads_cleanly(child_start, bad, 3)
        write_ours(path, token, bad, child_start, 3)
        with pytest.raises(FileFormatError, match=f"good.trie: corrupted trie: {match}"):
            Trie.load(path)
    # the root's freq never enters a probability and is negative in reduced reference tries
    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, 3, root_freq=-12345)
    converted = Trie.from_reference(ref, tmp_path / "conv.trie", progress=False)
    assert converted.arrays()[1][0] == -12345
    Trie.load(tmp_path / "conv.trie", verify=True)
    # two siblings swapped: the structure holds (a plain load is fine), the full check is not
    swapped = list(token)
    a, b = child_start[0], child_start[0] + 1
    swapped[a], swapped[b] = swapped[b], swapped[a]
    write_ours(path, swapped, freq, child_start, 3)
    Trie.load(path)
    with pytest.raises(FileFormatError, match="not sorted by token"):
        Trie.load(path, verify=True)
    negative = list(token)
    negative[1] = -7  # the root's first child: still sorted
    write_ours(path, negative, freq, child_start, 3)
    with pytest.raises(FileFormatError, match="negative token"):
        Trie.load(path, verify=True)


def test_reference_files_with_negative_tokens_or_frequencies_are_refused(tmp_path):
    counts = window_counts(SEQS, 3)
    for key, match in [("token", "negative token id -4"), ("freq", "negative frequency -4")]:
        ref = tmp_path / f"{key}.trie"
        write_reference(ref, counts, 3)
        raw = bytearray(ref.read_bytes())
        struct.pack_into("<i", raw, 16 + 24 + 12 * len([p for p in counts if len(p) == 1])
                         + (0 if key == "token" else 12), -4)  # node 1's record follows the root's
        ref.write_bytes(bytes(raw))
        with pytest.raises(FileFormatError, match=f"{key}.trie: corrupted: node 1 has the {match}"):
            Trie.from_reference(ref, progress=False)


def test_bad_trie_paths_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="No trie file"):
        Trie.load(tmp_path / "missing.trie")
    with pytest.raises(FileFormatError, match="is a folder"):
        Trie.load(tmp_path)
    with pytest.raises(FileFormatError, match="is a folder"):
        Trie.from_reference(tmp_path, progress=False)
    empty = tmp_path / "empty.trie"
    empty.write_bytes(b"")
    for fn in (Trie.load, lambda p: Trie.from_reference(p, progress=False)):
        with pytest.raises(FileFormatError, match="empty.trie"):
            fn(empty)


# -- 3. atomic writes, scratch space cleaned -----------------------------------------------------------
def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_save_refuses_folders_and_missing_folders_and_is_atomic(tmp_path, monkeypatch):
    trie = Trie.build(SEQS)
    with pytest.raises(InputError, match="is a folder"):
        trie.save(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        trie.save(tmp_path / "no" / "such" / "t.trie")
    out = tmp_path / "t.trie"
    out.write_bytes(b"previous contents")

    def failing_create(path, order, n):  # the disk fills up half-way
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device", path)
    monkeypatch.setattr("dart_jax.ngram.trie.create_file", failing_create)
    with pytest.raises(OSError, match="No space left"):
        trie.save(out)
    assert out.read_bytes() == b"previous contents"
    assert sorted(os.listdir(tmp_path)) == ["t.trie"]  # no temporary file left
    monkeypatch.undo()
    trie.save(out)
    assert sorted(os.listdir(tmp_path)) == ["t.trie"]
    assert [a.tolist() for a in Trie.load(out, verify=True).arrays()] == list(csr_of(window_counts(SEQS, 3)))


def test_leftovers_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    host = _atomic._host()
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale_dir = tmp_path / f"{_atomic.PREFIX}{host}-{dead}-0a1b"
        stale_dir.mkdir()
        (stale_dir / "node_token").write_bytes(b"x" * 1000)
        stale_file = tmp_path / f"{_atomic.PREFIX}{host}-{dead}-99ff.tmp"
        stale_file.write_bytes(b"partial trie")
        busy = tmp_path / f"{_atomic.PREFIX}{host}-{live.pid}-1234"
        busy.mkdir()
        other_host = tmp_path / f"{_atomic.PREFIX}otherhost-{dead}-1234"
        other_host.mkdir()
        unrelated = tmp_path / "notes.tmp"
        unrelated.write_text("mine")
        Trie.build(SEQS).save(tmp_path / "t.trie")
        assert sorted(os.listdir(tmp_path)) == sorted(["t.trie", busy.name, other_host.name, "notes.tmp"])
    finally:
        live.kill()
        live.wait()


KILLED_CONVERSION = textwrap.dedent("""
    import os, signal, sys
    from dart_jax.ngram import Trie, _reference
    real_walk = _reference._walk
    def walk_then_die(*args):
        real_walk(*args)          # the scratch arrays and the output are half-way
        os.kill(os.getpid(), signal.SIGKILL)
    _reference._walk = walk_then_die
    Trie.from_reference(sys.argv[1], sys.argv[2], progress=False)
""")


def test_a_killed_conversion_leaves_no_output_and_the_next_run_cleans_its_scratch(tmp_path):
    counts = window_counts(SEQS, 3)
    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, 3)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "conv.trie"
    r = subprocess.run([sys.executable, "-c", KILLED_CONVERSION, str(ref), str(out)], capture_output=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()
    left = sorted(os.listdir(out_dir))
    assert "conv.trie" not in left
    assert len(left) == 2 and all(name.startswith(_atomic.PREFIX) for name in left)  # scratch folder + output
    assert any(os.path.isdir(out_dir / name) and os.listdir(out_dir / name) for name in left)
    trie = Trie.from_reference(ref, out, progress=False)
    assert sorted(os.listdir(out_dir)) == ["conv.trie"]
    assert [a.tolist() for a in trie.arrays()] == list(csr_of(counts))


def test_a_conversion_that_fails_midway_keeps_the_previous_output_and_leaves_nothing(tmp_path, monkeypatch):
    counts = window_counts(SEQS, 3)
    ref = tmp_path / "ref.trie"
    write_reference(ref, counts, 3)
    out = tmp_path / "conv.trie"
    Trie.from_reference(ref, out, progress=False)
    before = out.read_bytes()

    def broken_walk(*args):
        raise RuntimeError("simulated failure")
    monkeypatch.setattr(_reference, "_walk", broken_walk)
    with pytest.raises(RuntimeError, match="simulated"):
        Trie.from_reference(ref, out, progress=False)
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["conv.trie", "ref.trie"]


def test_conversion_output_paths_are_checked_before_reading(tmp_path):
    ref = tmp_path / "ref.trie"
    write_reference(ref, window_counts(SEQS, 3), 3)
    with pytest.raises(InputError, match="is a folder"):
        Trie.from_reference(ref, tmp_path, progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Trie.from_reference(ref, tmp_path / "missing" / "x.trie", progress=False)
    with pytest.raises(InputError, match="is the reference file itself"):
        Trie.from_reference(ref, ref, progress=False)
    for chunk in (0, -1, 2**40, 1.5):
        with pytest.raises(InputError, match="chunk_bytes"):
            Trie.from_reference(ref, progress=False, chunk_bytes=chunk)
    assert sorted(os.listdir(tmp_path)) == ["ref.trie"]


def test_memory_needs_are_checked_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setattr(_memory, "available_memory", lambda: 100)
    with pytest.raises(ResourceError, match=r"counting .* tokens at order 3 needs .*--chunk-tokens"):
        Trie.build(SEQS)
    ref = tmp_path / "ref.trie"
    write_reference(ref, window_counts(SEQS, 3), 3)
    with pytest.raises(ResourceError, match="in memory needs .*pass an output file"):
        Trie.from_reference(ref, progress=False)


# -- 4. CLI values ------------------------------------------------------------------------------------
BAD_NGRAM_ARGS = [
    (["build", "{data}", "-o", "{out}", "--order", "0"], "--order must be in [1, 64]"),
    (["build", "{data}", "-o", "{out}", "--order", "100000"], "--order must be in [1, 64]"),
    (["build", "{data}", "-o", "{out}", "--reduce", "-5"], "--reduce must be in [1, 2147483647]"),
    (["build", "{data}", "-o", "{out}", "--reduce", "0"], "--reduce must be in [1, 2147483647]"),
    (["build", "{data}", "-o", "{out}", "--chunk-tokens", "0"], "--chunk-tokens must be >= 1"),
    (["build", "{data}", "-o", "{out}", "--eos", "-1"], "--eos must be in [0, 2147483646]"),
    (["build", "{data}", "-o", "{dir}"], "is a folder"),
    (["build", "{data}", "-o", "{dir}/missing/t.trie"], "does not exist; create it first"),
    (["convert", "{ref}", "{out}", "--chunk-mb", "0"], "--chunk-mb must be in [1, 16384]"),
    (["convert", "{ref}", "{out}", "--chunk-mb", "-64"], "--chunk-mb must be in [1, 16384]"),
    (["convert", "{ref}", "{out}", "--chunk-mb", "99999999"], "--chunk-mb must be in [1, 16384]"),
    (["convert", "{ref}", "{dir}"], "is a folder"),
    (["query", "{trie}", "--top", "-1"], "--top must be >= 1"),
    (["query", "{trie}", "--top", "0"], "--top must be >= 1"),
    (["query", "{trie}", "--context", "1,-2"], "--context holds token id -2"),
    (["query", "{trie}", "--tokens", "1,99999999999999"], "--tokens holds token id 99999999999999"),
    (["query", "{trie}", "--context", "1,x"], "--context expects token ids"),
    (["reduce", "{trie}", "{out}", "--threshold", "-5"], "--threshold must be in [1, 2147483647]"),
    (["reduce", "{trie}", "{dir}", "--threshold", "2"], "is a folder"),
    (["merge", "{dir}", "{trie}"], "is a folder"),
    (["info", "{dir}"], "is a folder"),
    (["info", "{ref}"], "looks like a reference"),
]


@pytest.fixture
def cli_files(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(s) for s in SEQS))
    trie = tmp_path / "t.trie"
    write_ours(trie, *csr_of(window_counts(SEQS, 3)), 3)
    ref = tmp_path / "ref.trie"
    write_reference(ref, window_counts(SEQS, 3), 3)
    return {"data": data, "trie": trie, "ref": ref, "out": tmp_path / "out.trie", "dir": tmp_path}


@pytest.mark.parametrize("argv, message", BAD_NGRAM_ARGS, ids=[" ".join(a[0:1] + a[-2:]) for a, _ in BAD_NGRAM_ARGS])
def test_bad_ngram_arguments_get_one_error_line_naming_them(cli_files, capsys, argv, message):
    before = sorted(os.listdir(cli_files["dir"]))
    assert ngram_cli([a.format(**cli_files) for a in argv]) == 2
    captured = capsys.readouterr()
    assert one_error_line(captured.err) and message in captured.err, captured.err
    assert sorted(os.listdir(cli_files["dir"])) == before  # nothing written


def test_bad_input_files_of_build_are_named(cli_files, capsys):
    d = cli_files["dir"]
    cases = {
        "bools.jsonl": ("[true, 2]\n", "bools.jsonl:1: expected a list of integer token ids"),
        "big.jsonl": ("[1, 4294967296]\n", "big.jsonl:1: token id 4294967296 is outside"),
        "text.jsonl": ('{"text": 5}\n', "text.jsonl:1: the text field holds int"),
        "latin.jsonl": (b"[1, 2]\n\xff\xfe\n", "latin.jsonl: not UTF-8 text"),
        "broken.npy": (b"\x93NUMPY garbage", "broken.npy: not a readable .npy array"),
    }
    for name, (content, message) in cases.items():
        (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        assert ngram_cli(["build", str(d / name), "-o", str(d / "x.trie")]) == 2
        err = capsys.readouterr().err
        assert one_error_line(err) and message in err, err
    np.save(d / "neg.npy", np.array([[1, -3]]))
    assert ngram_cli(["build", str(d / "neg.npy"), "-o", str(d / "x.trie")]) == 2
    assert "neg.npy: holds token ids outside" in capsys.readouterr().err
    assert not (d / "x.trie").exists()


def test_the_ngram_module_answers_bad_arguments_without_a_traceback(cli_files):
    r = subprocess.run([sys.executable, "-m", "dart_jax.ngram", "build", str(cli_files["data"]), "-o",
                        str(cli_files["out"]), "--order", "100000"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and one_error_line(r.stderr) and "error: --order must be in" in r.stderr, r.stderr


@pytest.mark.parametrize("argv, message", [
    (["--vocab", "0"], "--vocab must be in [2, 16777216]"),
    (["--vocab", "1"], "--vocab must be in [2, 16777216]"),
    (["--vocab", str(2**40)], "--vocab must be in [2, 16777216]"),
    (["--order", "0"], "--order must be in [1, 64]"),
    (["--order", "100000"], "--order must be in [1, 64]"),
])
def test_bench_ngram_checks_its_values(capsys, argv, message):
    assert bench.main(["ngram", "--no-progress", "--reps", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert one_error_line(err) and message in err, err
