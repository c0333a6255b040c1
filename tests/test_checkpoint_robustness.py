"""Bad configs, weights and output paths give one clear error naming the file and the field.

Each case breaks one thing of a tiny checkpoint (written by dart_jax.bench.tiny) and expects the
project's user-error class (`dart_jax.errors`: ValueError / FileNotFoundError subclasses) with a
message naming the file and the field or tensor. What must still load is compared with an
independent reading: transformers' own config class for the defaults, NumPy for the weights.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dart_jax.bench.tiny import make_tiny_head, make_tiny_qwen3
from dart_jax.convert import DartHeadConfig, Qwen3Config, export_dart_head, load_qwen3_config, read_head, write_dart_head
from dart_jax.convert.__main__ import main as convert_main
from dart_jax.convert.files import clean_leftovers
from dart_jax.errors import FileFormatError, InputError, MissingFileError
from dart_jax.models.checkpoints import load_dart_head, load_qwen3

ROOT = Path(__file__).resolve().parent.parent
SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)
HEAD_SIZES = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    base = make_tiny_qwen3(root / "base", **SIZES, seed=3)
    head = make_tiny_head(root / "head", base, draft_vocab_size=40, draft_length=3, seed=4, **HEAD_SIZES)
    return base, head


def _copy(src: Path, dst: Path, *, config: dict | None = None, tensors: dict | None = None) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _tensors(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def _names(error: pytest.ExceptionInfo, *words: str) -> None:
    message = str(error.value)
    for word in words:
        assert word in message, f"{word!r} not in: {message}"


# ---------------------------------------------------------------- config values
NAN, INF = float("nan"), float("inf")
BAD_QWEN3 = [  # (changes to config.json, the field the message must name)
    ({"vocab_size": None}, "vocab_size"),
    ({"vocab_size": "64"}, "vocab_size"),
    ({"vocab_size": 64.0}, "vocab_size"),
    ({"hidden_size": True}, "hidden_size"),
    ({"intermediate_size": -48}, "intermediate_size"),
    ({"num_hidden_layers": 2}, "num_hidden_layers"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"head_dim": None}, "head_dim"),
    ({"head_dim": 15}, "head_dim"),
    ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
    ({"rms_norm_eps": NAN}, "rms_norm_eps"),
    ({"rms_norm_eps": None}, "rms_norm_eps"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -10000.0}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": NAN}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": INF}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "1e4"}}, "rope_theta"),
    ({"rope_theta": 0.0}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 0, "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "linear", "factor": NAN, "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 0, "rope_theta": 10000.0}}, "beta_fast"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1.0}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": 7}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "mrope"}}, "mrope"),
    ({"rope_parameters": [10000.0]}, "rope_parameters"),
    ({"rope_scaling": ["linear", 2.0]}, "rope_scaling"),
    ({"rope_scaling": {"type": "linear"}}, "factor"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"max_position_embeddings": -5}, "max_position_embeddings"),
    ({"max_position_embeddings": 1.5}, "max_position_embeddings"),
    ({"eos_token_id": 64}, "eos_token_id"),
    ({"eos_token_id": -1}, "eos_token_id"),
    ({"eos_token_id": [2, 64]}, "eos_token_id"),
    ({"eos_token_id": "2"}, "eos_token_id"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"attention_bias": "no"}, "attention_bias"),
    ({"layer_types": 5}, "layer_types"),
    ({"use_sliding_window": True}, "sliding"),
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
]


@pytest.mark.parametrize("change, field", BAD_QWEN3, ids=[f"{k}={v!r}"[:40] for (c, _) in BAD_QWEN3 for k, v in c.items()])
def test_bad_qwen3_config_value_is_named(tiny, tmp_path, change, field):
    base, _ = tiny
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**_config(base), **change}))
    with pytest.raises(FileFormatError) as error:
        load_qwen3_config(folder)
    assert isinstance(error.value, ValueError)
    _names(error, str(folder / "config.json"), field)


def test_a_missing_field_is_named(tiny, tmp_path):
    base, _ = tiny
    folder = tmp_path / "base"
    folder.mkdir()
    config = _config(base)
    del config["intermediate_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileFormatError) as error:
        load_qwen3_config(folder)
    _names(error, "config.json", "intermediate_size", "missing")


def test_absent_values_default_as_transformers_does(tiny):
    """Absent optional fields take the defaults of transformers' own Qwen3Config (the oracle):
    head_dim 128 (not hidden_size // heads), 32 kv heads, null kv heads = heads."""
    transformers = pytest.importorskip("transformers")
    base, _ = tiny
    config = {k: v for k, v in _config(base).items()
              if k not in ("head_dim", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")}
    config["num_attention_heads"] = 32
    for extra in ({}, {"num_key_value_heads": None}, {"num_key_value_heads": 4}):
        ours = Qwen3Config.from_hf({**config, **extra})
        theirs = transformers.Qwen3Config(**{**config, **extra})
        for field in ("head_dim", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta"):
            theirs_value = theirs.rope_parameters["rope_theta"] if field == "rope_theta" else getattr(theirs, field)
            assert getattr(ours, field) == theirs_value, (field, extra)


BAD_HEAD = [
    ({"draft_length": 7.5}, "draft_length"),
    ({"draft_length": 7.0}, "draft_length"),
    ({"draft_length": 1_000_000}, "draft_length"),
    ({"draft_length": 0}, "draft_length"),
    ({"draft_length": "3"}, "draft_length"),
    ({"draft_length": True}, "draft_length"),
    ({"vocab_size": None}, "vocab_size"),
    ({"draft_vocab_size": 65}, "draft_vocab_size"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"rope_theta": 0}, "rope_theta"),
    ({"rope_theta": NAN}, "rope_theta"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ({"rope_scaling": [1, 2]}, "rope_scaling"),
    ({"rope_scaling": {"type": "linear"}}, "factor"),
    ({"rope_scaling": {"type": "dynamic", "factor": 0.0}}, "factor"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0}}, "factor"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"hidden_act": None}, "hidden_act"),
    ({"target_hidden_size": "32"}, "target_hidden_size"),
]


@pytest.mark.parametrize("change, field", BAD_HEAD, ids=[f"{k}={v!r}"[:40] for (c, _) in BAD_HEAD for k, v in list(c.items())[-1:]])
def test_bad_head_config_value_is_named(tiny, tmp_path, change, field):
    _, head = tiny
    folder = _copy(head, tmp_path / "head", config={**_config(head), **change})
    with pytest.raises(FileFormatError) as error:
        read_head(folder)
    _names(error, str(folder / "config.json"), field)


def test_configs_built_in_python_are_checked_too():
    fields = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                  vocab_size=64, draft_vocab_size=40)
    assert DartHeadConfig(**fields, draft_length=np.int64(3)).draft_length == 3
    assert type(DartHeadConfig(**fields, draft_length=np.int64(3)).draft_length) is int
    for bad in (7.5, "3", True, 0, 257):
        with pytest.raises(InputError, match="draft_length"):
            DartHeadConfig(**fields, draft_length=bad)
    with pytest.raises(InputError, match="rms_norm_eps"):
        Qwen3Config(**SIZES, rms_norm_eps=float("nan"))
    with pytest.raises(InputError, match="eos_token_id"):
        Qwen3Config(**SIZES, eos_token_ids=(64,))


def test_head_and_base_are_cross_checked(tiny, tmp_path):
    base, head = tiny
    other = make_tiny_qwen3(tmp_path / "other", **{**SIZES, "vocab_size": 80}, seed=5)
    target = load_qwen3(other, dtype=jnp.float32)
    with pytest.raises(InputError) as error:
        load_dart_head(head, target)
    _names(error, str(head), "vocab_size 64 != target vocab_size 80")


# ---------------------------------------------------------------- safetensors files
def _truncations(data: bytes):
    yield "header too small", data[:5]
    yield "header cut", data[:20]
    yield "data cut", data[:-7]
    yield "huge header length", (2**62).to_bytes(8, "little") + data[8:]
    yield "garbage", b"\x13" * 64
    yield "empty", b""


@pytest.mark.parametrize("which", ["base", "head"])
def test_broken_safetensors_files_are_named(tiny, tmp_path, which):
    src = tiny[0] if which == "base" else tiny[1]
    data = (src / "model.safetensors").read_bytes()
    for i, (label, broken) in enumerate(_truncations(data)):
        folder = _copy(src, tmp_path / f"{which}{i}")
        (folder / "model.safetensors").write_bytes(broken)
        with pytest.raises(FileFormatError) as error:
            if which == "base":
                load_qwen3(folder, dtype=jnp.float32)
            else:
                read_head(folder)
        _names(error, str(folder / "model.safetensors"))
        assert "safetensors" in str(error.value), label


def test_broken_index_files_are_named(tiny, tmp_path):
    sharded = make_tiny_qwen3(tmp_path / "sharded", **SIZES, seed=3, max_shard_size_bytes=20_000)
    index_path = sharded / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = load_qwen3(sharded, dtype=jnp.float32)  # intact: loads, equal to the unsharded one
    whole = load_qwen3(tiny[0], dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(model.norm.weight[...]), np.asarray(whole.norm.weight[...]))
    first = next(iter(index["weight_map"]))
    shards = sorted(set(index["weight_map"].values()))
    for label, text, words in [
        ("list", json.dumps({**index, "weight_map": list(index["weight_map"])}), ["weight_map"]),
        ("not json", '{"weight_map": {', ["not valid JSON"]),
        ("array", "[]", ["JSON object"]),
        ("path", json.dumps({"weight_map": {**index["weight_map"], first: "../x.safetensors"}}), ["weight_map", first]),
        ("number", json.dumps({"weight_map": {**index["weight_map"], first: 3}}), ["weight_map", first]),
        ("wrong shard", json.dumps({"weight_map": {**index["weight_map"],
                                                   first: next(s for s in shards if s != index["weight_map"][first])}}),
         [first]),
    ]:
        index_path.write_text(text)
        with pytest.raises(FileFormatError) as error:
            load_qwen3(sharded, dtype=jnp.float32)
        _names(error, str(index_path), *words)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_weights_are_an_error_not_cast(tiny, tmp_path, dtype):
    base, head = tiny
    tensors = _tensors(base)
    tensors["model.norm.weight"] = np.ones_like(tensors["model.norm.weight"], dtype=dtype)
    folder = _copy(base, tmp_path / "base", tensors=tensors)
    with pytest.raises(FileFormatError) as error:
        load_qwen3(folder, dtype=jnp.float32)
    _names(error, str(folder / "model.safetensors"), "model.norm.weight", "float")
    htensors = _tensors(head)
    htensors["fc.weight"] = np.round(htensors["fc.weight"] * 100).astype(dtype)
    hfolder = _copy(head, tmp_path / "head", tensors=htensors)
    with pytest.raises(FileFormatError) as error:
        load_dart_head(hfolder, load_qwen3(base, dtype=jnp.float32))
    _names(error, str(hfolder / "model.safetensors"), "fc.weight", "float")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_supported_float_kinds_load(tiny, tmp_path, dtype):
    """Weights stored as float16 / bfloat16 / float64 load, with the values NumPy reads from the file."""
    base, head = tiny
    tensors = {name: array.astype(dtype) for name, array in _tensors(base).items()}
    folder = _copy(base, tmp_path / "base", tensors=tensors)
    model = load_qwen3(folder, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(model.layers[1].self_attn.o_proj.kernel[...]),  # never fused
                                  tensors["model.layers.1.self_attn.o_proj.weight"].astype(np.float32).T)
    htensors = {name: (a.astype(dtype) if a.dtype == np.float32 else a) for name, a in _tensors(head).items()}
    hfolder = _copy(head, tmp_path / "head", tensors=htensors)
    loaded = load_dart_head(hfolder, model, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(loaded.fc.kernel[...]), htensors["fc.weight"].astype(np.float32).T)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_non_finite_weights_are_named(tiny, tmp_path, bad, dtype):
    base, head = tiny
    tensors = {name: a.astype(dtype) for name, a in _tensors(base).items()}
    name = "model.layers.2.mlp.down_proj.weight"
    tensors[name][5, 7] = bad
    folder = _copy(base, tmp_path / "base", tensors=tensors)
    with pytest.raises(FileFormatError) as error:
        load_qwen3(folder, dtype=jnp.float32)
    _names(error, str(folder / "model.safetensors"), name, "non-finite")
    htensors = _tensors(head)
    htensors["lm_head.weight"][3, 1] = bad
    hfolder = _copy(head, tmp_path / "head", tensors=htensors)
    with pytest.raises(FileFormatError) as error:
        load_dart_head(hfolder, load_qwen3(base, dtype=jnp.float32))
    _names(error, str(hfolder / "model.safetensors"), "lm_head.weight", "non-finite")


def test_weights_beyond_the_load_dtype_are_named(tiny, tmp_path):
    base, _ = tiny
    tensors = {name: a.astype(np.float64) for name, a in _tensors(base).items()}
    tensors["model.norm.weight"][0] = 1e300  # finite in the file, infinite as float32
    folder = _copy(base, tmp_path / "base", tensors=tensors)
    with pytest.raises(FileFormatError) as error:
        load_qwen3(folder, dtype=jnp.float32)
    _names(error, "model.norm.weight", "float32")


# ---------------------------------------------------------------- the head's vocabulary mapping
def _vocab_case(head, kind):
    t = _tensors(head)
    used = np.arange(40) + t["d2t"]  # the target ids, by an independent reading of the file
    assert len(set(used.tolist())) == 40 and t["t2d"].sum() == 40
    if kind == "duplicate":  # draft id 1 onto draft id 0's target id; t2d adjusted so only the duplicate is wrong
        t["d2t"][1] = used[0] - 1
        t["t2d"][used[1]] = False
    elif kind == "t2d extra":
        t["t2d"][np.flatnonzero(~t["t2d"])[0]] = True
    elif kind == "t2d missing":
        t["t2d"][used[7]] = False
    elif kind == "t2d bytes":
        t["t2d"] = t["t2d"].view(np.uint8).copy()
        t["t2d"][used[0]] = 2
        t["t2d"] = t["t2d"].view(np.bool_)
    elif kind == "d2t float":
        t["d2t"] = t["d2t"].astype(np.float32)
    elif kind == "d2t outside":
        t["d2t"][-1] = 64
    return t


@pytest.mark.parametrize("kind, words", [
    ("duplicate", ["same target id", "draft ids 0 and 1"]),
    ("t2d extra", ["t2d disagrees with d2t"]),
    ("t2d missing", ["t2d disagrees with d2t"]),
    ("t2d bytes", ["t2d must hold only"]),
    ("d2t float", ["d2t must hold integers"]),
    ("d2t outside", ["outside the target vocabulary"]),
])
def test_broken_vocabulary_mapping_is_a_problem_of_the_head(tiny, tmp_path, kind, words):
    base, head = tiny
    folder = _copy(head, tmp_path / "head", tensors=_vocab_case(head, kind))
    with pytest.raises(FileFormatError) as error:
        read_head(folder)
    _names(error, str(folder / "model.safetensors"), *words)
    with pytest.raises(FileFormatError) as error:
        load_dart_head(folder, load_qwen3(base, dtype=jnp.float32))
    _names(error, str(folder), *words)


# ---------------------------------------------------------------- export: atomic, output paths
def _same_head(a: Path, b: Path) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert set(ta) == set(tb)
    for name in ta:
        np.testing.assert_array_equal(ta[name], tb[name], err_msg=name)
    assert _config(a)["draft_length"] == _config(b)["draft_length"]


def test_export_writes_and_replaces_a_head(tiny, tmp_path):
    _, head = tiny
    out = export_dart_head(head, tmp_path / "out")
    _same_head(head, out)
    export_dart_head(head, tmp_path / "out", "bfloat16")  # replaces the previous export
    back = _tensors(tmp_path / "out")
    assert back["fc.weight"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back["fc.weight"], _tensors(head)["fc.weight"].astype(ml_dtypes.bfloat16))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no scratch left beside it


def test_export_output_paths(tiny, tmp_path):
    _, head = tiny
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError) as error:
        export_dart_head(head, tmp_path / "file")
    _names(error, str(tmp_path / "file"), "not a folder")
    assert (tmp_path / "file").read_text() == "x"
    with pytest.raises(MissingFileError) as error:
        export_dart_head(head, tmp_path / "missing" / "deeper" / "out")
    _names(error, str(tmp_path / "missing" / "deeper"), "does not exist")
    with pytest.raises(InputError) as error:
        export_dart_head(head, tmp_path / "file" / "out")
    _names(error, str(tmp_path / "file"), "is a file")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    with pytest.raises(InputError) as error:
        export_dart_head(head, busy)
    _names(error, str(busy), "notes.txt")
    assert (busy / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "file"]
    # the Python writer may create missing parent folders (training writes runs/<name>/head)
    tensors = _tensors(head)
    config = read_head(head)[1]
    write_dart_head(tmp_path / "new" / "deeper" / "head", config, tensors)
    _same_head(head, tmp_path / "new" / "deeper" / "head")


_KILLABLE_EXPORT = """
import sys, time
import dart_jax.convert.dart_head as dh
def stuck(path, tensors, metadata=None):
    path.write_bytes(b"partial")
    print("ready", flush=True)
    time.sleep(120)
dh.write_tensors = stuck
dh.export_dart_head(sys.argv[1], sys.argv[2])
"""


def _export_killed(head: Path, dest: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE_EXPORT, str(head), str(dest)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_export_leaves_no_partial_head(tiny, tmp_path):
    _, head = tiny
    dest = tmp_path / "head"
    _export_killed(head, dest)
    assert not dest.exists()  # no head/ with only config.json
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".head.partial-")]
    assert len(leftovers) == 1 and (leftovers[0] / "config.json").exists()
    export_dart_head(head, tmp_path / "other")  # the next export in the folder cleans up, whatever its name
    assert not any(p.exists() for p in leftovers)
    export_dart_head(head, dest)
    _same_head(head, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head", "other"]
    # killed while replacing a complete head: the previous one stays
    _export_killed(head, dest)
    _same_head(head, dest)
    export_dart_head(head, dest, "bfloat16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head", "other"]


def test_a_kill_between_the_renames_is_repaired(tiny, tmp_path):
    """A writer killed after moving the old head aside and before moving the new one in: the next
    write to the destination puts the old one back before it proceeds."""
    _, head = tiny
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dest = tmp_path / "head"
    shutil.copytree(head, tmp_path / f".head.old-{dead.pid}-abcd1234")
    shutil.copytree(head, tmp_path / f".head.partial-{dead.pid}-abcd1234")
    clean_leftovers(dest)
    _same_head(head, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]


# ---------------------------------------------------------------- the command line
def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "dart_jax.convert", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_cli_bad_input_is_one_error_line_and_exit_2(tiny, tmp_path):
    _, head = tiny
    truncated = _copy(head, tmp_path / "truncated")
    (truncated / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes()[:5])
    bad_config = _copy(head, tmp_path / "bad_config", config={**_config(head), "draft_length": 7.5})
    (tmp_path / "a_file").write_text("x")
    start = time.time()
    for args, words in [
        (["inspect", str(truncated)], ["model.safetensors", "header too small"]),
        (["inspect", str(bad_config)], ["config.json", "draft_length"]),
        (["export", str(head), str(tmp_path / "a_file")], ["a_file", "not a folder"]),
        (["inspect", str(tmp_path / "nowhere")], ["nowhere"]),
    ]:
        result = _run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        line = _one_error_line(result.stderr)
        assert all(word in line for word in words), line
    assert time.time() - start < 120
    ok = _run_cli("inspect", str(head))
    assert ok.returncode == 0 and "d2t/t2d consistent" in ok.stdout, ok.stderr


def test_cli_in_process_exit_codes(tiny, tmp_path, capsys):
    _, head = tiny
    cases = [
        ["inspect", str(_copy(head, tmp_path / "dup", tensors=_vocab_case(head, "duplicate")))],
        ["export", str(head), str(tmp_path / "missing" / "out")],
        ["inspect", str(_copy(head, tmp_path / "nan", config={**_config(head), "rope_theta": math.nan}))],
    ]
    for args in cases:
        assert convert_main(args) == 2, args
        _one_error_line(capsys.readouterr().err)
