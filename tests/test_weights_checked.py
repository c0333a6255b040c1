"""Weights checked, not trusted (issue 42): a GGUF conversion carries each file's SHA-256, a
damaged one is rebuilt from its GGUF file or refused with the command that rebuilds it; the demo's
GGUF file is hashed again whenever its size or modification time change."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from dart_jax.convert import gguf_folder
from dart_jax.convert import packaged
from dart_jax.convert.__main__ import main as convert_main
from dart_jax.convert.target import target_folder
from dart_jax.errors import FileFormatError, MissingFileError

from test_llama import make_gguf


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def zero_bytes(path, at: int, n: int = 64):
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes(n))


@pytest.fixture()
def converted(tmp_path):
    _, _, gguf = make_gguf(tmp_path, "F32")
    folder = gguf_folder(gguf, cache_dir=tmp_path / "cache")
    return gguf, folder, snapshot(folder)


def test_the_manifest_holds_every_files_sha256(converted):
    _, folder, before = converted
    files = json.loads(before["gguf_source.json"])["files"]
    assert set(files) == set(before) - {"gguf_source.json"}
    for name, entry in files.items():
        assert entry == {"size": len(before[name]), "sha256": hashlib.sha256(before[name]).hexdigest()}


@pytest.mark.parametrize("damage", ["zeroed", "truncated", "deleted"])
def test_a_damaged_cache_is_rebuilt_from_the_gguf_file(converted, capsys, damage):
    gguf, folder, before = converted
    weights = folder / "model.safetensors"
    if damage == "zeroed":  # same size, bytes inside a weight zeroed
        zero_bytes(weights, weights.stat().st_size // 2)
    elif damage == "truncated":
        os.truncate(weights, weights.stat().st_size - 100)
    else:
        (folder / "tokenizer.json").unlink()
    assert gguf_folder(gguf, cache_dir=folder.parent) == folder
    assert "is damaged" in capsys.readouterr().err
    assert snapshot(folder) == before  # the same bytes as the first conversion


def test_a_damaged_manifest_is_rebuilt_too(converted, capsys):
    gguf, folder, before = converted
    zero_bytes(folder / "gguf_source.json", 0, 8)
    gguf_folder(gguf, cache_dir=folder.parent)
    assert "gguf_source.json" in capsys.readouterr().err
    assert snapshot(folder) == before


def test_an_intact_cache_is_not_rebuilt(converted, capsys):
    gguf, folder, _ = converted
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    gguf_folder(gguf, cache_dir=folder.parent)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert "damaged" not in capsys.readouterr().err


def test_a_conversion_passed_as_a_folder_is_checked_and_rebuilt(converted, capsys):
    _, folder, before = converted
    zero_bytes(folder / "model.safetensors", 200)
    assert target_folder(folder) == folder
    assert "rebuilding it from" in capsys.readouterr().err
    assert snapshot(folder) == before


def test_damaged_without_its_gguf_file_names_the_command(converted):
    gguf, folder, _ = converted
    gguf.unlink()
    os.truncate(folder / "model.safetensors", 1000)
    with pytest.raises(FileFormatError, match=r"is gone; rebuild it from the \.gguf file: "
                                              r"python -m dart_jax\.convert gguf FILE\.gguf"):
        target_folder(folder)


def test_the_rebuild_command_writes_a_checked_folder(converted, tmp_path, capsys):
    gguf, folder, before = converted
    out = tmp_path / "again"
    assert convert_main(["gguf", str(gguf), str(out)]) == 0
    assert snapshot(out) == before
    assert convert_main(["gguf", str(gguf), str(gguf)]) == 2  # never over its own input
    assert "error:" in capsys.readouterr().err
    assert gguf.read_bytes()[:4] == b"GGUF"


# -- the demo's GGUF file ------------------------------------------------------------------------------
@pytest.fixture()
def fake_release(tmp_path, monkeypatch):
    """A small file standing in for the demo's GGUF (its size and SHA-256 made the release's), and
    pip made to fail, so that a re-fetch shows as MissingFileError."""
    data = os.urandom(4096)
    monkeypatch.setattr(packaged, "SMOLLM2_SIZE", len(data))
    monkeypatch.setattr(packaged, "SMOLLM2_SHA256", hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(packaged.subprocess, "run",
                        lambda *a, **k: packaged.subprocess.CompletedProcess(a, 1, "", "offline"))
    target = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    target.write_bytes(data)
    return target


def test_the_demo_gguf_is_hashed_once_per_size_and_mtime(fake_release, monkeypatch):
    assert packaged.smollm2_gguf(fake_release.parent, quiet=True) == fake_release  # hashed, recorded
    hashed = []
    real = packaged.file_sha256
    monkeypatch.setattr(packaged, "file_sha256", lambda p: hashed.append(p) or real(p))
    packaged.smollm2_gguf(fake_release.parent, quiet=True)
    assert hashed == []  # same size and mtime: the record stands
    st = fake_release.stat()
    os.utime(fake_release, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    packaged.smollm2_gguf(fake_release.parent, quiet=True)
    assert hashed == [fake_release]


def test_a_damaged_demo_gguf_is_fetched_again(fake_release, capsys):
    packaged.smollm2_gguf(fake_release.parent, quiet=True)
    zero_bytes(fake_release, 100)  # same size, finite damage, a new mtime
    with pytest.raises(MissingFileError, match="could not fetch"):
        packaged.smollm2_gguf(fake_release.parent, quiet=True)
    assert "is damaged" in capsys.readouterr().err


def test_a_damaged_record_means_hashing_again(fake_release):
    packaged.smollm2_gguf(fake_release.parent, quiet=True)
    record = fake_release.with_name(fake_release.name + ".verified.json")
    record.write_text("[" * 100000)
    assert packaged.smollm2_gguf(fake_release.parent, quiet=True) == fake_release
    assert json.loads(record.read_text())["sha256"] == packaged.SMOLLM2_SHA256  # recorded afresh


# -- the weights hashed beside the loading ---------------------------------------------------------
def test_the_weights_are_hashed_on_a_thread_and_waited_for_before_they_load(converted, capsys, monkeypatch):
    import threading

    import numpy as np
    from safetensors.numpy import load_file

    from dart_jax.convert import gguf as gguf_module
    from dart_jax.models.checkpoints import load_target

    gguf, folder, before = converted
    hashed = []
    real = gguf_module.file_sha256
    monkeypatch.setattr(gguf_module, "file_sha256",
                        lambda p: hashed.append((p.name, threading.current_thread() is threading.main_thread()))
                        or real(p))
    weights = folder / "model.safetensors"
    zero_bytes(weights, weights.stat().st_size // 2)  # same size: only its hash tells
    assert target_folder(folder, weights_later=True) == folder
    assert "damaged" not in capsys.readouterr().err  # not known yet: the small files were intact
    at_once = list(hashed)
    assert at_once and all(main for name, main in at_once if name != "model.safetensors")  # the small files now
    target = load_target(folder)  # waits for the weights' hash: damaged, rebuilt before they are read
    assert ("model.safetensors", False) in hashed  # the weights were hashed off the main thread
    assert "is damaged" in capsys.readouterr().err
    assert snapshot(folder) == before
    expected = load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(target.embed_tokens.embedding[...]), expected)


def test_small_files_are_hashed_at_once_even_when_the_weights_wait(converted, capsys):
    _, folder, before = converted
    tokenizer = folder / "tokenizer.json"
    zero_bytes(tokenizer, tokenizer.stat().st_size // 2)
    assert target_folder(folder, weights_later=True) == folder
    assert "tokenizer.json's SHA-256 differs" in capsys.readouterr().err  # rebuilt before it is read
    assert snapshot(folder) == before


def test_intact_weights_checked_later_are_remembered(converted, monkeypatch):
    from dart_jax.convert import gguf as gguf_module

    _, folder, _ = converted
    gguf_module._INTACT.clear()
    for p in folder.iterdir():  # a conversion not written just now (one is remembered after a second)
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - 60 * 10**9))
    assert target_folder(folder, weights_later=True) == folder
    assert target_folder(folder) == folder  # waits: intact
    hashed = []
    monkeypatch.setattr(gguf_module, "file_sha256", lambda p: hashed.append(p) or "")
    assert target_folder(folder) == folder and hashed == []  # remembered: nothing hashed again
