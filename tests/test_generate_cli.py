"""`python -m dart_jax.generate` end to end on a local tiny checkpoint, and its input errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dart_jax.api import generate
from dart_jax.bench.tiny import make_tiny_setup


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # the same tiny configuration as test_engine, so that an in-process run reuses its executables
    return make_tiny_setup(tmp_path_factory.mktemp("cli"), vocab_size=32, draft_length=3, shuffle_d2t=True,
                           num_hidden_layers=4, seed=1)


def test_cli_json_with_compare_ar(ckpt, capsys):
    base, head, trie = ckpt
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompt", "hello",
                          "--max-new-tokens", "12", "--compare-ar", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert report["greedy_match"] is True
    assert report["token_ids"] == report["ar"]["token_ids"] and 1 <= len(report["token_ids"]) <= 12
    assert report["stats"]["new_tokens"] == len(report["token_ids"])
    assert report["stats"]["tau"] > 0 and report["speedup"] > 0
    assert sum(report["accept_lengths"]) + 1 >= len(report["token_ids"])


def test_cli_streams_text_and_summary(ckpt, capsys):
    base, head, trie = ckpt
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", "none", "--prompt", "hello",
                          "--max-new-tokens", "6", "--no-warmup"])
    out = capsys.readouterr().out
    assert code == 0
    assert "[DART]" in out and "tau" in out and "tokens/s" in out


@pytest.mark.parametrize("flags,message", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--top-k", "-2"], "top-k"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--max-length", "5"], "max-length"),
    (["--keep", "0"], "keep"),
])
def test_cli_bad_inputs(ckpt, capsys, flags, message):
    base, head, trie = ckpt
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(trie), "--prompt", "hello there",
                          *flags])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_missing_files(ckpt, tmp_path, capsys):
    base, head, trie = ckpt
    assert generate.main(["--ckpt", str(tmp_path / "nohead"), "--base", str(base), "--ngram", str(trie)]) == 2
    assert "nohead" in capsys.readouterr().err
    assert generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", str(tmp_path / "none.trie")]) == 2
    assert "none.trie" in capsys.readouterr().err
    # without --base the base is looked up from the published pairs: a missing local head must
    # still be reported as missing, not as an unknown base
    assert generate.main(["--ckpt", str(tmp_path / "nohead"), "--ngram", str(trie)]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_cli_demo_assets_missing_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(generate, "DEMO", tmp_path)
    assert generate.main([]) == 2
    err = capsys.readouterr().err
    assert "demo model is incomplete" in err and "--ckpt" in err


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "dart_jax.generate", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--compare-ar" in out.stdout and "--small-ngram" in out.stdout
