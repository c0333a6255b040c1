"""The store of exported programs (`dart_jax.decoding.exported`): a program traced once is read
back by a later jit of it (a new process's) without tracing, and decodes as transformers does; a
damaged file, or one of another format, is written again; an edited source, a function the source
hash does not cover, or an output the store cannot describe, is traced; a JAX without the private
functions that call a stored program keeps the store off. Traces are counted where they happen: in
the Python body of the jitted function. (A second process reading the engine's programs:
tests/test_compile_cache.py.)"""
from __future__ import annotations

import functools
import importlib
import logging
import pickle
import shutil
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.bench.tiny import make_tiny_qwen3
from dart_jax.decoding import autoregressive, exported
from dart_jax.decoding.autoregressive import split_flat
from dart_jax.decoding.sampling import SamplingParams
from dart_jax.decoding.state import PoolState
from dart_jax.models.checkpoints import load_qwen3
from dart_jax.models.qwen3 import init_cache

START = [[5, 9], [17, 3]]  # two prompts of two tokens, decoded greedily
STEPS = 3
folder_of_the_cache = exported.folder  # as imported: the suite's conftest turns the store off while a module runs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_qwen3(tmp_path_factory.mktemp("q"), vocab_size=64, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, seed=5)
    return folder, load_qwen3(folder, dtype=jnp.float32)


@pytest.fixture(scope="module")
def want(tiny):
    """transformers' greedy continuation of START, STEPS tokens."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(tiny[0], dtype=torch.float32).eval()
    ids = torch.tensor(START)
    with torch.no_grad():
        for _ in range(STEPS):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[:, len(START[0]):].tolist()


@pytest.fixture
def store(tmp_path, monkeypatch):
    folder = tmp_path / "exported"
    monkeypatch.setattr(exported, "folder", lambda: folder)
    return folder


def counted(fn, traces: list):
    """`fn` noting each run of its body (a trace), under fn's own module and name."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        traces.append(fn.__name__)
        return fn(*args, **kwargs)
    return run


def decode(target, fn) -> list:
    """START's greedy continuation: its prompts through the one-token step jitted as `exported.jit`
    does (a new jax.jit, so a trace of its own), one token at a time, over a pool's state."""
    model, state = split_flat(target)
    step = exported.jit(fn, model, static_argnames=("window", "live"), donate_argnames="pool")
    pool = PoolState(init_cache(target.config, 2, 16, jnp.float32), None, jnp.zeros(2, jnp.int32),
                     jnp.zeros((2, 2), jnp.uint32), SamplingParams.rows([(0.0, 1.0, 0)] * 2))
    out = []
    for i in range(len(START[0]) + STEPS - 1):
        token = jnp.asarray([row[i] for row in START], jnp.int32) if i < len(START[0]) else token
        token, pool = step(state, token, pool, window=16)
        if i >= len(START[0]) - 1:
            out.append(np.asarray(token).tolist())
    return np.array(out).T.tolist()


def test_a_program_read_back_decodes_as_transformers(tiny, want, store):
    traces = []
    step = counted(autoregressive._decode, traces)
    assert decode(tiny[1], step) == want and traces == ["_decode"]
    (path,) = store.iterdir()
    assert path.read_bytes().startswith(b"dart_jax exported program 1\n")
    assert decode(tiny[1], step) == want and traces == ["_decode"]  # read back: not traced again


def stored_once(tiny, store) -> tuple[Path, bytes, list]:
    traces = []
    step = counted(autoregressive._decode, traces)
    decode(tiny[1], step)
    (path,) = store.iterdir()
    return path, path.read_bytes(), traces


def test_a_damaged_file_is_written_again(tiny, want, store):
    path, good, traces = stored_once(tiny, store)
    step = counted(autoregressive._decode, traces)
    for damaged in (good[: len(good) // 2], good[:40] + bytes([good[40] ^ 1]) + good[41:], good[:-1], b""):
        path.write_bytes(damaged)
        traces.clear()
        assert decode(tiny[1], step) == want and traces == ["_decode"]
        assert path.read_bytes() == good  # written again, whole
    traces.clear()
    assert decode(tiny[1], step) == want and traces == []


class Loaded(Exception):
    """Raised by unpickling `Trap`: a reader that unpickles would construct it."""


class Trap:
    def __reduce__(self):
        return Loaded, ("a stored file was unpickled",)


def test_a_file_of_another_format_is_not_read_but_written_again(tiny, want, store):
    import hashlib

    path, good, traces = stored_once(tiny, store)
    step = counted(autoregressive._decode, traces)
    header = b"dart_jax exported program 1\n"
    body = good[len(header) + 32:]
    garbage = b"not a program" * 9
    for other in (body,  # JAX's own serialization, without our header and checksum
                  pickle.dumps((None, body)) + pickle.dumps(Trap()),  # the prototype's pickle, and a trap
                  header + hashlib.sha256(garbage).digest() + garbage,  # our header, a checksum that holds, no program
                  b"dart_jax exported program 2\n" + good[len(header):]):  # a later format
        path.write_bytes(other)
        traces.clear()
        assert decode(tiny[1], step) == want and traces == ["_decode"]
        assert path.read_bytes() == good


def test_an_edited_source_is_traced_again(tiny, want, store, monkeypatch):
    traces = []
    step = counted(autoregressive._decode, traces)
    decode(tiny[1], step)
    monkeypatch.setattr(exported, "_sources", lambda: "the hash of edited sources")
    assert decode(tiny[1], step) == want and traces == ["_decode"] * 2
    assert len(list(store.iterdir())) == 2


def test_the_source_hash_follows_every_source_file(tmp_path):
    import dart_jax

    copy = tmp_path / "dart_jax"
    shutil.copytree(dart_jax.__path__[0], copy, ignore=shutil.ignore_patterns("__pycache__", "demo"))
    before = exported.source_hash([("dart_jax", copy)])
    assert exported.source_hash([("dart_jax", copy)]) == before
    edited = copy / "decoding" / "engine.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    assert exported.source_hash([("dart_jax", copy)]) != before


def _decode_elsewhere(model, state, token, pool, *, window, live=None):
    """A function outside dart_jax: the source hash does not cover it."""
    return autoregressive._decode(model, state, token, pool, window=window, live=live)


def test_a_function_outside_dart_jax_is_traced_and_not_stored(tiny, want, store):
    traces = []
    step = functools.wraps(_decode_elsewhere)(counted(_decode_elsewhere, traces))
    assert decode(tiny[1], step) == want
    assert decode(tiny[1], step) == want and traces == ["_decode_elsewhere"] * 2
    assert not store.exists()


class Answer(NamedTuple):  # a node type the store does not name
    token: jax.Array
    pool: PoolState


def _decode_answer(model, state, token, pool, *, window, live=None):
    return Answer(*autoregressive._decode(model, state, token, pool, window=window, live=live))


_decode_answer.__module__ = autoregressive.__name__  # keyed as dart_jax's own: only its output is unknown


def test_an_output_of_a_node_type_the_store_does_not_name_is_traced_and_not_stored(tiny, want, store):
    traces = []
    step = counted(_decode_answer, traces)
    with pytest.warns(UserWarning, match="_decode_answer is traced in every process"):
        assert decode(tiny[1], step) == want
        assert decode(tiny[1], step) == want
    assert traces.count("_decode_answer") >= 2 and not any(store.glob("*.jaxexp"))


def test_without_jax_s_private_call_the_store_is_off_and_decoding_is_as_before(tiny, want, store, monkeypatch,
                                                                                caplog):
    private = importlib.import_module("jax._src.export._export")
    monkeypatch.delattr(private, "_call_exported_lowering")
    with caplog.at_level(logging.INFO, logger=exported.__name__):
        call = exported._call_primitive(private)
        assert exported._call_primitive(None) is None  # the module itself gone
    assert call is None
    lines = [r.getMessage() for r in caplog.records if r.name == exported.__name__]
    assert len(lines) == 2 and all("exported programs are not kept" in line for line in lines)
    assert "lacks _call_exported_lowering (" in lines[0]
    monkeypatch.setattr(exported, "_call_p", call)
    traces = []
    step = counted(autoregressive._decode, traces)
    assert decode(tiny[1], step) == want and decode(tiny[1], step) == want
    assert traces == ["_decode"] * 2 and not store.exists()


def test_the_store_follows_the_compilation_cache_switch():
    assert folder_of_the_cache() == Path(jax.config.jax_compilation_cache_dir) / "exported"
    jax.config.update("jax_enable_compilation_cache", False)  # the conftest puts it back
    assert folder_of_the_cache() is None
