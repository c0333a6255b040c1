"""A damaged tokenizer.json (the tokenizers library raises a bare Exception) is one clear
FileFormatError naming the file, wherever a tokenizer is loaded: the Python API, training, the
n-gram builder (issue 42)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.errors import FileFormatError, MissingFileError, load_tokenizer_folder

DEMO = Path(__file__).resolve().parents[1] / "dart_jax" / "demo"
DAMAGES = {"truncated": lambda text: text[: len(text) // 2],
           "wrong structure": lambda text: json.dumps({"model": {"type": "BPE", "vocab": 5}}),
           "no model": lambda text: json.dumps({"added_tokens": []}),
           "deep": lambda text: "[" * 100000 + "]" * 100000,
           "zeroed": lambda text: "\0" * len(text)}


@pytest.fixture(params=list(DAMAGES))
def damaged_base(tmp_path, request):
    base = tmp_path / "base"
    shutil.copytree(DEMO / "base", base)
    path = base / "tokenizer.json"
    path.write_text(DAMAGES[request.param](path.read_text()))
    return base


def test_the_intact_tokenizer_loads(tmp_path):
    tok = load_tokenizer_folder(DEMO / "base")
    assert tok.decode(tok.encode("hello", add_special_tokens=False)) == "hello"


def test_the_loader_names_the_damaged_file(damaged_base):
    with pytest.raises(FileFormatError, match=r"tokenizer\.json: .*restore it"):
        load_tokenizer_folder(damaged_base)


def test_a_folder_without_tokenizer_files(tmp_path):
    with pytest.raises(MissingFileError, match="no usable tokenizer"):
        load_tokenizer_folder(tmp_path)


def test_the_api_names_it(damaged_base):
    from dart_jax import DartModel

    with pytest.raises(FileFormatError, match=r"tokenizer\.json"):
        DartModel.from_pretrained(damaged_base, DEMO / "head", DEMO / "ngram.trie", dtype="float32")


def test_training_names_it(damaged_base):
    from dart_jax.train.data import load_tokenizer

    with pytest.raises(FileFormatError, match=r"tokenizer\.json"):
        load_tokenizer(damaged_base)


def test_the_ngram_builder_names_it_in_one_error_line(damaged_base, tmp_path):
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "hello world"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "dart_jax.ngram", "build", str(text), "--tokenizer", str(damaged_base),
                           "--out", str(tmp_path / "t.trie")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "tokenizer.json" in lines[0], done.stderr
