"""CSR trie against the compressed trie, side by side in one process: bytes per node, compress
time, 25-candidate query latency and the tree search at the reference setting (d 8, top-k 25,
beam 20, keep 60), with the trees asserted identical.

    python benchmarks/trie_formats.py zipf 200000        # synthetic Zipf corpus (bench search's default)
    python benchmarks/trie_formats.py phrases 3000000    # synthetic phrases, vocabulary 151936
    python benchmarks/trie_formats.py stdlib 40          # 40 MB of this Python's standard library, demo tokenizer
    python benchmarks/trie_formats.py code 300           # 300 MB of Python source, a 151 643-token BPE trained on it
    python benchmarks/trie_formats.py zipf 200000 --before old_tree.py   # also an earlier tree search
    python benchmarks/trie_formats.py code 300 --keep /tmp/code300       # keep the tries for later runs

`--before FILE`: a module exposing `build_tree` (e.g. `git show 3a90185:ngram/tree.py` with its
relative imports made absolute) timed beside the current one, its trees asserted identical.
"""
import argparse
import atexit
import glob
import importlib.util
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time

import numpy as np
from numba import njit

from dart_jax.bench.host import _draft_inputs, _phrase_corpus, _queries, _zipf_corpus
from dart_jax.ngram import CompressedTrie, Trie, build_tree, compress
from dart_jax.ngram.compressed import ngram_probs_any


@njit(cache=False)  # not cached: Numba's cache would not notice a change in the ngram package's code
def qloop(tr, order, contexts, cands, out_p, out_len):
    t = 0.0
    for q in range(contexts.shape[0]):
        out_p[:] = 0; out_len[:] = 0
        ngram_probs_any(tr, order, contexts[q], cands[q], out_p, out_len)
        t += out_p[0]
    return t

def best_of(fn, trials=5):
    ts = []
    for _ in range(trials):
        t0 = time.process_time(); fn(); ts.append(time.process_time() - t0)
    return min(ts), statistics.median(ts)

def corpus_stdlib(limit_mb):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(__file__), "..", "dart_jax", "demo", "base"))
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    seqs, total = [], 0
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except Exception:
            continue
        ids = np.array(tok.encode(text, add_special_tokens=False), np.int32)
        seqs.append(ids); total += len(text)
        if total > limit_mb * 1e6:
            break
    return seqs, total, tok.vocab_size

def corpus_code(limit_mb):
    """Realistic text for the trie: the .py files of this Python's standard library and of the
    installed packages (deduplicated), tokenised with a byte-level BPE of Qwen3's vocabulary size
    (151 643 tokens) trained here on the first third of them (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    roots = dict.fromkeys([sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]])
    texts, total, seen = [], 0, set()
    for root in roots:
        for f in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            try:
                text = open(f, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError):
                continue
            if hash(text) in seen:
                continue
            seen.add(hash(text)); texts.append(text); total += len(text)
            if total > limit_mb * 1e6:
                break
        if total > limit_mb * 1e6:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts[: len(texts) // 3], trainer=trainers.BpeTrainer(
        vocab_size=151643, min_frequency=2, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    seqs = [np.array(e.ids, np.int32) for e in tok.encode_batch(texts)]
    return seqs, total, tok.get_vocab_size()

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("corpus", choices=["zipf", "phrases", "stdlib", "code"])
ap.add_argument("size", type=float, help="sequences (zipf, phrases) or megabytes of text (stdlib, code)")
ap.add_argument("--before", help="a module file with an earlier build_tree to time beside the current one")
ap.add_argument("--keep", metavar="DIR", help="keep the two tries (t.trie, t.ctrie) and the token stream (stream.npy) "
                                              "in DIR for later runs; by default they go to a temporary folder removed at the end")
args = ap.parse_args()
which = args.corpus
old_tree = None
if args.before:
    spec = importlib.util.spec_from_file_location("before_tree", args.before)
    old_tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old_tree)
tmp = args.keep or tempfile.mkdtemp(prefix="dart_jax_trie_formats_")
os.makedirs(tmp, exist_ok=True)
if not args.keep:
    atexit.register(shutil.rmtree, tmp, True)
vocab = 151936
if which == "stdlib":
    t0 = time.time(); seqs, nbytes, v = corpus_stdlib(args.size); vocab = v
    print(f"corpus: Python {sys.version.split()[0]} stdlib .py files, {nbytes/1e6:.1f} MB text, {sum(map(len, seqs))/1e6:.2f} M tokens, demo tokenizer vocab {v}; tokenize {time.time()-t0:.0f}s")
elif which == "code":
    t0 = time.time(); seqs, nbytes, v = corpus_code(args.size)
    print(f"corpus: {nbytes/1e6:.0f} MB of Python source (stdlib + installed packages), {sum(map(len, seqs))/1e6:.1f} M tokens, BPE vocab {v}; tokenizer training + tokenizing {time.time()-t0:.0f}s")
else:
    rng = np.random.default_rng(0)
    make = _zipf_corpus if which == "zipf" else _phrase_corpus
    seqs = make(rng, int(args.size), vocab)
    print(f"corpus: synthetic {which}, {sum(map(len, seqs))/1e6:.2f} M tokens, vocab {vocab}")
t0 = time.time(); trie = Trie.build(seqs, order=3, progress=False); build_s = time.time() - t0
trie.save(tmp + "/t.trie"); csr = Trie.load(tmp + "/t.trie")
t0 = time.time(); ct = compress(csr, tmp + "/t.ctrie"); comp_s = time.time() - t0
n = csr.num_nodes
print(f"nodes {n}, levels {csr.level_sizes()}, build {build_s:.1f}s, compress {comp_s:.1f}s ({n/comp_s/1e6:.2f} M nodes/s)")
print(f"bytes/node: CSR file {os.path.getsize(tmp+'/t.trie')/n:.3f}, compressed file {os.path.getsize(tmp+'/t.ctrie')/n:.3f}")
parts = sorted(((a.nbytes * 8 / n, name) for name, a in ct._s.items() if a.nbytes), reverse=True)
print("compressed, bits per node by section: " + ", ".join(f"{name} {bits:.2f}" for bits, name in parts))
CompressedTrie.load(tmp + "/t.ctrie", verify=True)  # compiled before it is timed
load_ms = best_of(lambda: CompressedTrie.load(tmp + "/t.ctrie"), 3)[0] * 1e3
verify_s = best_of(lambda: CompressedTrie.load(tmp + "/t.ctrie", verify=True), 1)[0]
print(f"compressed load {load_ms:.1f} ms (header and per-level tables; verify=True {verify_s:.2f}s); "
      f"CSR load (one check pass) {best_of(lambda: Trie.load(tmp + '/t.trie'), 1)[0]:.2f}s")
rng = np.random.default_rng(1)
contexts, cands = _queries(rng, csr, seqs, vocab, 3000, 25)
tc = (*csr.arrays(), csr.root_table())
op = np.zeros(25, np.float32); ol = np.zeros(25, np.int64)
qloop(tc, 3, contexts, cands, op, ol); qloop(ct.search_arrays(), 3, contexts, cands, op, ol)
qa, qb = [], []
for _ in range(15):  # interleaved, so both see the same machine load
    qa.append(best_of(lambda: qloop(tc, 3, contexts, cands, op, ol), 1)[0])
    qb.append(best_of(lambda: qloop(ct.search_arrays(), 3, contexts, cands, op, ol), 1)[0])
a, b = (min(qa), statistics.median(qa)), (min(qb), statistics.median(qb))
print(f"25-candidate query (2-token context), us: CSR min {a[0]/3000*1e6:.2f} med {a[1]/3000*1e6:.2f} | compressed min {b[0]/3000*1e6:.2f} med {b[1]/3000*1e6:.2f} | ratio min {b[0]/a[0]:.2f}x, median {b[1]/a[1]:.2f}x")
inputs = _draft_inputs(rng, samples=64, draft_rows=8, topk=25, vocab=vocab)
stream = np.concatenate(seqs)
if args.keep:
    np.save(os.path.join(tmp, "stream.npy"), stream)
for s in range(64):  # half of the rows follow the corpus, so lookups hit like real drafts
    ids, probs, pre = inputs[s]
    if s % 2:
        st = int(rng.integers(8, len(stream) - 20))
        ids = ids.copy()
        for l in range(8):
            if stream[st + l] not in ids[l]:
                ids[l, 0] = stream[st + l]
        inputs[s] = (ids, probs, stream[st - 8:st].astype(np.int32))
runs = [("no trie", build_tree, None), ("CSR", build_tree, csr), ("compressed", build_tree, ct)]
if old_tree is not None:
    runs.insert(0, ("before (CSR)", old_tree.build_tree, csr))
for ids, probs, pre in inputs:
    trees = [fn(ids, probs, pre, t, eos_id=vocab - 1) for _, fn, t in runs if t is not None]
    assert all(np.array_equal(u, v) for other in trees[1:] for u, v in zip(trees[0], other)), "trees differ"
res = {name: [] for name, _, _ in runs}
for trial in range(9):
    for name, fn, t in runs:
        t0 = time.process_time()
        for r in range(640):
            ids, probs, pre = inputs[r % 64]
            fn(ids, probs, pre, t, eos_id=vocab - 1)
        res[name].append((time.process_time() - t0) / 640 * 1e3)
print("tree search d8 top25 beam20 keep60, ms/tree (min / median of 9x640 calls; trees identical): " +
      "; ".join(f"{k} {min(v):.3f} / {statistics.median(v):.3f}" for k, v in res.items()) +
      f" | compressed / CSR: min {min(res['compressed']) / min(res['CSR']):.2f}x, "
      f"median {statistics.median(res['compressed']) / statistics.median(res['CSR']):.2f}x")
