"""The store of exported programs (`dart_jax.decoding.exported`): a program traced once is read
back by a later jit of it (a new process's) without tracing, and decodes as transformers does; a
damaged file is written again; an edited source, or a function the source hash does not cover,
is traced. Traces are counted where they happen: in the Python body of the jitted function.
(A second process reading the engine's programs: tests/test_compile_cache.py.)"""
from __future__ import annotations

import functools
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.bench.tiny import make_tiny_qwen3
from dart_jax.decoding import autoregressive, exported
from dart_jax.decoding.autoregressive import split_flat
from dart_jax.decoding.sampling import SamplingParams
from dart_jax.models.checkpoints import load_qwen3
from dart_jax.models.qwen3 import init_cache

START = [[5, 9], [17, 3]]  # two prompts of two tokens, decoded greedily
STEPS = 3


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
    does (a new jax.jit, so a trace of its own), one token at a time."""
    model, state = split_flat(target)
    step = exported.jit(fn, model, static_argnames=("window", "live"), donate_argnames="cache")
    cache = init_cache(target.config, 2, 16, jnp.float32)
    length, keys = jnp.zeros(2, jnp.int32), jnp.zeros((2, 2), jnp.uint32)
    params = SamplingParams.rows([(0.0, 1.0, 0)] * 2)
    out = []
    for i in range(len(START[0]) + STEPS - 1):
        token = jnp.asarray([row[i] for row in START], jnp.int32) if i < len(START[0]) else token
        token, cache, length, keys = step(state, token, cache, length, keys, params, window=16)
        if i >= len(START[0]) - 1:
            out.append(np.asarray(token).tolist())
    return np.array(out).T.tolist()


def test_a_program_read_back_decodes_as_transformers(tiny, want, store):
    traces = []
    step = counted(autoregressive._decode, traces)
    assert decode(tiny[1], step) == want and traces == ["_decode"]
    assert len(list(store.iterdir())) == 1
    assert decode(tiny[1], step) == want and traces == ["_decode"]  # read back: not traced again


def test_a_damaged_file_is_written_again(tiny, want, store):
    traces = []
    step = counted(autoregressive._decode, traces)
    decode(tiny[1], step)
    (path,) = store.iterdir()
    good = path.read_bytes()
    for damaged in (good[: len(good) // 2], good[:40] + bytes([good[40] ^ 1]) + good[41:], b""):
        path.write_bytes(damaged)
        traces.clear()
        assert decode(tiny[1], step) == want and traces == ["_decode"]
        assert path.read_bytes() == good  # written again, whole
    traces.clear()
    assert decode(tiny[1], step) == want and traces == []


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


def _decode_elsewhere(model, state, token, cache, cache_len, keys, params, *, window, live=None):
    """A function outside dart_jax: the source hash does not cover it."""
    return autoregressive._decode(model, state, token, cache, cache_len, keys, params, window=window, live=live)


def test_a_function_outside_dart_jax_is_traced_and_not_stored(tiny, want, store):
    traces = []
    step = functools.wraps(_decode_elsewhere)(counted(_decode_elsewhere, traces))
    assert decode(tiny[1], step) == want
    assert decode(tiny[1], step) == want and traces == ["_decode_elsewhere"] * 2
    assert not store.exists()


def test_the_store_follows_the_compilation_cache_switch():
    import jax

    assert exported.folder() == Path(jax.config.jax_compilation_cache_dir) / "exported"
    jax.config.update("jax_enable_compilation_cache", False)  # the conftest puts it back
    assert exported.folder() is None
