"""Issue 27, the inputs' side: text that is not valid Unicode, files that are not UTF-8, output paths
checked before the work, inputs that were silently accepted. Every case must end in one clear
`error:` line (or a named InputError) before anything is loaded or computed; the oracles are the
expected message and the absence of any work or file, never the code's own output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.api import generate
from dart_jax.errors import InputError, check_text
from dart_jax.ngram.__main__ import main as ngram_cli
from dart_jax.train.data import read_conversations

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOKENIZER = ROOT / "dart_jax" / "demo" / "base"
LONE = "caf\ud800e"  # what json.loads makes of "caf\\ud800e"
BINARY = b"\x89PNG\r\n\x1a\n\x00\x9c\xff\xfe"


def one_error_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def no_loading(monkeypatch):
    """A command that gets as far as loading the model has done the work the checks must precede."""
    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded before the input was checked")
    monkeypatch.setattr(generate, "load_model", refuse)


def test_check_text_names_the_input_and_the_bad_character():
    assert check_text("déjà vu 🙂", "--prompt") == "déjà vu 🙂"
    with pytest.raises(InputError, match=r"--prompt is not valid Unicode text: a lone surrogate U\+D800 at character 3"):
        check_text(LONE, "--prompt")
    # a command line byte that is not UTF-8 reaches Python as U+DC00 + byte (surrogateescape)
    with pytest.raises(InputError, match=r"the byte 0x9c \(not UTF-8\) at character 1"):
        check_text(b"a\x9cb".decode("utf-8", "surrogateescape"), "--system")


@pytest.mark.parametrize("flags, message", [
    (["--prompt", LONE], "--prompt is not valid Unicode"),
    (["--prompt", "hi", "--system", "a\udc9c"], "--system is not valid Unicode"),
    (["--prompt", "hi", "--stop", "\udfff"], "--stop is not valid Unicode"),
])
def test_generate_refuses_text_that_is_not_unicode_before_loading(flags, message, no_loading, capsys):
    assert generate.main(["--demo", "tiny", *flags]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_a_non_utf8_byte_on_the_real_command_line_is_one_error_line():
    proc = subprocess.run([sys.executable, "-m", "dart_jax.generate", "--demo", "tiny", "--prompt".encode(),
                           b"caf\x9c"], capture_output=True, cwd=ROOT, timeout=300,
                          env={"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err[-2000:]
    assert "the byte 0x9c (not UTF-8)" in one_error_line(err.splitlines()[-1] + "\n")
    assert "Traceback" not in err


def test_messages_files_with_bad_text_or_bytes_name_the_file(tmp_path, no_loading, capsys):
    escaped = tmp_path / "chat.json"
    escaped.write_text('[{"role": "user", "content": "caf\\ud800e"}]')
    assert generate.main(["--demo", "tiny", "--messages", str(escaped)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert str(escaped) in err and "message 0" in err and "U+D800" in err
    binary = tmp_path / "chat.bin.json"
    binary.write_bytes(BINARY)
    assert generate.main(["--demo", "tiny", "--messages", str(binary)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert str(binary) in err and "not UTF-8" in err


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "caf\\ud800e"}', "in.jsonl:1: 'prompt' is not valid Unicode"),
    ('{"prompt": "ok"}\n{"messages": [{"role": "user", "content": "\\udc80"}]}', "in.jsonl:2: the content of message 0"),
    ('{"messages": [{"role": "wizard", "content": "hi"}]}', "in.jsonl:1: message 0 has role 'wizard'"),
    (BINARY, "in.jsonl: not UTF-8 text (byte 0x89"),
])
def test_prompts_files_refuse_bad_text_unknown_roles_and_binary(content, message, tmp_path, no_loading, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert generate.main(["--demo", "tiny", "--prompts", str(src)]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_prompts_with_prompt_or_output_without_prompts_are_refused(tmp_path, no_loading, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    assert generate.main(["--demo", "tiny", "--prompts", str(src), "--prompt", "ignored?"]) == 2
    assert "drop --prompt" in one_error_line(capsys.readouterr().err)
    assert generate.main(["--demo", "tiny", "--prompt", "hi", "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "--output takes the results of --prompts" in one_error_line(capsys.readouterr().err)


def test_output_paths_are_checked_before_any_work(tmp_path, no_loading, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    missing = tmp_path / "nowhere" / "out.jsonl"
    assert generate.main(["--demo", "tiny", "--prompts", str(src), "--output", str(missing)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert "does not exist" in err and ".tmp" not in err
    folder = tmp_path / "adir"
    folder.mkdir()
    assert generate.main(["--demo", "tiny", "--prompts", str(src), "--output", str(folder)]) == 2
    assert "is a folder" in one_error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "in.jsonl"]  # no adir.tmp
    afile = tmp_path / "in.jsonl"
    assert generate.main(["--demo", "tiny", "--prompts", str(src), "--output", str(afile / "out.jsonl")]) == 2
    assert "is not a folder" in one_error_line(capsys.readouterr().err)


def test_ngram_build_refuses_lone_surrogates_and_empty_inputs(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "caf\\ud800e"}\n')
    out = tmp_path / "t.trie"
    assert ngram_cli(["build", str(src), "-o", str(out), "--tokenizer", str(DEMO_TOKENIZER)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert f"{src}:2 is not valid Unicode" in err
    assert not out.exists()
    for name, data in (("empty.txt", b""), ("blank.txt", b"\n  \n"), ("none.jsonl", b"\n")):
        (tmp_path / name).write_bytes(data)
        assert ngram_cli(["build", str(tmp_path / name), "-o", str(out), "--tokenizer", str(DEMO_TOKENIZER)]) == 2
        assert "no tokens in" in one_error_line(capsys.readouterr().err.splitlines(True)[-1])
        assert not out.exists()


def test_train_data_names_bad_unicode_and_binary_files(tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(good) + "\n" + json.dumps(good).replace("hello", "caf\\ud800e") + "\n")
    with pytest.raises(InputError, match=r"train.jsonl line 2: turn 1: 'content' is not valid Unicode"):
        read_conversations(data)
    assert len(read_conversations(data, skip_bad=True)[0]) == 1
    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(json.dumps(good).encode() + b"\n" + BINARY + b"\n")
    with pytest.raises(InputError, match=r"blob.jsonl: not UTF-8 text \(byte 0x89 on line 2\)"):
        read_conversations(binary)
    # BINARY splits into three lines (two bytes 0x0a in it), none of them a conversation
    assert read_conversations(binary, skip_bad=True) == ([read_conversations(data, skip_bad=True)[0][0]], 3)


DEMO_BASE = ROOT / "dart_jax" / "demo" / "base"


def damaged_base(tmp_path, name: str, change) -> Path:
    import shutil
    base = tmp_path / "base"
    shutil.copytree(DEMO_BASE, base)
    change(base)
    return base


def _json_edit(file: str, **fields):
    def change(base):
        path = base / file
        data = json.loads(path.read_text())
        data.update(fields)
        path.write_text(json.dumps(data))
    return change


@pytest.mark.parametrize("name, change, message", [
    ("layers", _json_edit("config.json", num_hidden_layers=4), "config.json: layer_types lists 6 layers but num_hidden_layers is 4"),
    ("template", lambda b: (b / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }"),
     "chat_template.jinja: the chat template is broken (TemplateSyntaxError"),
    ("eos-text", _json_edit("generation_config.json", eos_token_id="x"),
     "generation_config.json: eos_token_id must be a token id in [0, 512) or a list of them, got 'x'"),
    ("eos-range", _json_edit("generation_config.json", eos_token_id=[99999]), "got [99999]"),
    ("eos-json", lambda b: (b / "generation_config.json").write_text('{"eos_token_id": '), "generation_config.json: not valid JSON"),
])
def test_damaged_base_files_are_one_error_line_naming_the_file(name, change, message, tmp_path, capsys):
    """Without the checks: transformers' StrictDataclassClassValidationError, jinja2's
    TemplateSyntaxError at the first prompt, an int() message, and an EOS id silently accepted."""
    base = damaged_base(tmp_path, name, change)
    _, head, _ = generate._demo_paths("tiny")
    code = generate.main(["--ckpt", str(head), "--base", str(base), "--ngram", "none", "--prompt", "hi",
                          "--max-new-tokens", "2", "--no-warmup", "--keep", "3"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert message in one_error_line(err.splitlines(True)[-1]) and str(base) in err


def test_verify_refuses_a_trie_whose_header_order_was_changed(tmp_path, capsys):
    """The counts of an order-3 trie under a header saying 4 or 5 pass every structural check
    (no path is longer than the header's order); `--verify` compares the counts with the order.
    Oracle: the tries dart_jax writes (built, merged, reduced) verify; the edited header does not."""
    import struct

    import numpy as np

    from dart_jax.ngram import Trie
    from dart_jax.ngram._format import HEADER

    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, 30, size=int(rng.integers(1, 40))) for _ in range(40)]
    good = {"built": Trie.build(seqs, order=3), "reduced": Trie.build(seqs, order=3).reduce(2),
            "merged": Trie.build(seqs[:20], order=3).merge(Trie.build(seqs[20:], order=3)),
            "short": Trie.build([s[:2] for s in seqs], order=5)}
    for name, trie in good.items():
        trie.save(tmp_path / f"{name}.trie")
        Trie.load(tmp_path / f"{name}.trie", verify=True)
        assert ngram_cli(["info", str(tmp_path / f"{name}.trie"), "--verify"]) == 0, name
    capsys.readouterr()
    for order in (4, 5):
        path = tmp_path / f"edited{order}.trie"
        data = bytearray((tmp_path / "built.trie").read_bytes())
        fields = list(HEADER.unpack_from(data))
        fields[3] = order
        HEADER.pack_into(data, 0, *fields)
        path.write_bytes(bytes(data))
        assert Trie.load(path).order == order  # a plain load cannot tell
        assert ngram_cli(["info", str(path), "--verify"]) == 2
        err = one_error_line(capsys.readouterr().err)
        assert "counts are those of an order-3 trie" in err and f"order {order} its header says" in err


def test_convert_inspect_says_what_it_checks_and_hashes_against_the_hub_cache(tmp_path, capsys):
    """A flipped byte inside a weight passes every structural check; in a Hugging Face cache the
    blob's name is the file's hash (SHA-256 for LFS files, the git blob SHA-1 for small ones), so
    `inspect --hash` finds it. Oracle: hashlib over the original bytes, named as the hub names blobs."""
    import hashlib
    import os

    from dart_jax.convert.__main__ import main as convert_cli

    head = ROOT / "dart_jax" / "demo" / "head"
    repo = tmp_path / "models--me--head"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        data = (head / name).read_bytes()
        blob = (hashlib.sha256(data).hexdigest() if name.endswith(".safetensors")
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), snapshot / name)
    assert convert_cli(["inspect", str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "not checked: the values" in out and "sha256" not in out
    assert convert_cli(["inspect", str(snapshot), "--hash"]) == 0
    out = capsys.readouterr().out
    assert out.count("matches the hub's hash") == 2, out
    weights = Path(os.path.realpath(snapshot / "model.safetensors"))
    data = bytearray(weights.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] in ("F32", "BF16"))
    at = 8 + n + header[name]["data_offsets"][0]
    data[at] ^= 0x01  # the lowest mantissa bit of a weight: still finite, still a valid file
    weights.write_bytes(bytes(data))
    assert convert_cli(["inspect", str(snapshot)]) == 0  # the structural checks cannot see it
    capsys.readouterr()
    assert convert_cli(["inspect", str(snapshot), "--hash"]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert "model.safetensors" in err and "differs from the hub's" in err and "download it again" in err
