"""`ngram build` reads files that are neither .jsonl nor .npy/.txt as plain-text documents (issue
16), folders by --suffixes; a missing trie file gets trie-specific advice."""
from __future__ import annotations

import os

import pytest
from transformers import AutoTokenizer

from dart_jax.errors import MissingFileError
from dart_jax.ngram import Trie
from dart_jax.ngram.__main__ import main as cli
from trie_oracle import window_counts

DEMO_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "dart_jax", "demo", "base")
SOURCE = 'def add(a, b):\n    """Add."""\n    return a + b\n\n\nprint(add(1, 2))\n'


def counts_of(trie):
    token, freq, child_start = trie.arrays()
    out, paths = {(): int(freq[0])}, {0: ()}
    for i in range(trie.num_nodes):
        for c in range(child_start[i], child_start[i + 1]):
            paths[c] = paths[i] + (int(token[c]),)
            out[paths[c]] = int(freq[c])
    return out


def test_source_files_are_plain_text_documents(tmp_path):
    tok = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    src = tmp_path / "code"
    src.mkdir()
    (src / "a.py").write_text(SOURCE)
    (src / "notes.md").write_text("not read: .md is not among --suffixes\n")
    expected = [list(tok.encode(SOURCE, add_special_tokens=True)) + [7]]
    out = tmp_path / "t.trie"
    assert cli(["build", str(src / "a.py"), "-o", str(out), "--tokenizer", DEMO_TOKENIZER, "--eos", "7"]) == 0
    assert counts_of(Trie.load(out)) == window_counts(expected, 3)
    assert cli(["build", str(src), "-o", str(out), "--tokenizer", DEMO_TOKENIZER, "--eos", "7",
                "--suffixes", ".py"]) == 0
    assert counts_of(Trie.load(out)) == window_counts(expected, 3)


def test_a_folder_without_the_suffixes_names_the_option(tmp_path, capsys):
    (tmp_path / "a.py").write_text(SOURCE)
    assert cli(["build", str(tmp_path), "-o", str(tmp_path / "t.trie")]) == 2
    assert "--suffixes" in capsys.readouterr().err


def test_a_missing_trie_gets_trie_advice(tmp_path):
    with pytest.raises(MissingFileError, match="ngram build"):
        Trie.load(tmp_path / "none.trie")
