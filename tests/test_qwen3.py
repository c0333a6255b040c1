"""dart_jax.qwen3 + convert.qwen3 against transformers' Qwen3 (torch, fp32, eval) as the oracle."""
from __future__ import annotations

import functools
import json
import shutil
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from dart_jax.api.model import DartModel
from dart_jax.bench.tiny import make_tiny_qwen3, make_tiny_setup
from dart_jax.convert.qwen3 import load_qwen3_config
from dart_jax.models import backend
from dart_jax.models.checkpoints import load_qwen3
from dart_jax.convert.safetensors_io import read_tensors, write_tensors
from dart_jax.convert.qwen3 import Qwen3Config
from dart_jax.errors import InputError
from dart_jax.models.qwen3 import (KVCache, check_attention, cudnn_device_problem, default_dtype,
                                   init_cache, verify_compiler_options, write_cache)
from dart_jax.models.sharding import DEFAULT_RULES, logical_to_spec, shard_cache, shard_module

CONFIGS = {
    # odd sizes, GQA 1:1, untied, 5 layers (taps 2, 2, 2)
    "h48_gqa1_untied": dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, head_dim=16,
                            intermediate_size=80, num_hidden_layers=5, tie_word_embeddings=False, vocab_size=300),
    # GQA 4:1, tied, 7 layers (taps 2, 3, 4)
    "h64_gqa4_tied": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                          intermediate_size=96, num_hidden_layers=7, tie_word_embeddings=True, vocab_size=320),
    # head_dim independent of hidden/heads, a single KV head
    "h32_mqa_hd12": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=12,
                         intermediate_size=64, num_hidden_layers=6, tie_word_embeddings=True, vocab_size=256),
}
PROMPT_LEN = 304


def hf_run(folder, ids, dtype=torch.float32):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    with torch.no_grad():
        out = model(torch.as_tensor(np.asarray(ids)), output_hidden_states=True)
    return out.logits.float().numpy(), [h.float().numpy() for h in out.hidden_states]


@functools.partial(jax.jit, static_argnums=0)
def _full(graphdef, state, ids):
    model = nnx.merge(graphdef, state)
    hidden, taps = model.forward_hidden(ids, return_taps=True)
    return model(ids), taps, hidden


def full_forward(model, ids):
    """(logits, taps, hidden) of a plain causal forward, compiled once per config and shape."""
    graphdef, state = nnx.split(model)
    return _full(graphdef, state, jnp.asarray(ids))


@functools.partial(jax.jit, static_argnums=0)
def _cached(graphdef, state, ids, cache, cache_len, mask, positions):
    TRACES.append(ids.shape)  # a Python side effect: runs only when jit traces (i.e. compiles)
    model = nnx.merge(graphdef, state)
    if mask is None:  # append to the cache
        hidden, taps, cache = model.extend(ids, cache, cache_len, return_taps=True)
    else:  # a tree against the cache, which is left as it is
        hidden, taps, _ = model.verify(ids, positions, mask, cache, cache_len, return_taps=True)
    return model.lm_logits(hidden), taps, cache


TRACES: list = []


def cached_forward(model, ids, cache, cache_len, mask=None, positions=None):
    graphdef, state = nnx.split(model)
    return _cached(graphdef, state, jnp.asarray(ids), cache, jnp.asarray(cache_len), mask, positions)


def random_ids(vocab, shape, seed):
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    return {name: make_tiny_qwen3(root / name, seed=i, **kw) for i, (name, kw) in enumerate(CONFIGS.items())}


@pytest.fixture(scope="module")
def full_runs(ckpts):
    """Per config: the model, a 2 x PROMPT_LEN prompt and our plain forward on it."""
    runs = {}
    for i, (name, folder) in enumerate(ckpts.items()):
        model = load_qwen3(folder, dtype=jnp.float32)
        ids = random_ids(model.config.vocab_size, (2, PROMPT_LEN), seed=100 + i)
        runs[name] = (model, ids, *full_forward(model, ids))
    return runs


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_taps_match_transformers(ckpts, full_runs, name):
    model, ids, logits, taps, hidden = full_runs[name]
    cfg = model.config
    ref_logits, ref_hidden = hf_run(ckpts[name], ids)
    assert logits.shape == (2, PROMPT_LEN, cfg.vocab_size) and logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=1e-4, rtol=0)
    n = cfg.num_hidden_layers
    assert cfg.tap_layers == (2, n // 2, n - 3)
    ref_taps = np.concatenate([ref_hidden[i] for i in (2, n // 2, n - 3)], axis=-1)
    assert taps.shape == (2, PROMPT_LEN, 3 * cfg.hidden_size)
    np.testing.assert_allclose(np.asarray(taps), ref_taps, atol=1e-4, rtol=0)
    # forward_hidden's hidden is the final-normed state that HF reports last
    np.testing.assert_allclose(np.asarray(hidden), ref_hidden[-1], atol=1e-4, rtol=0)


def test_cpu_loader_gives_tied_models_a_transposed_lm_head(full_runs):
    """On a CPU the loader copies a tied embedding into an [H, V] LM head (Qwen3.untie_lm_head);
    elsewhere a tied model keeps the embedding alone. The parity test above checks the logits
    against transformers, this one the copy itself."""
    for name, (model, *_rest) in full_runs.items():
        if not CONFIGS[name]["tie_word_embeddings"]:
            continue
        assert model.config.tie_word_embeddings
        if jax.default_backend() != "cpu":
            assert model.lm_head is None
            continue
        assert model.lm_head is not None
        np.testing.assert_array_equal(np.asarray(model.lm_head.kernel[...]),
                                      np.asarray(model.embed_tokens.embedding[...]).T)
        hidden = np.asarray(random_ids(7, (3, model.config.hidden_size), seed=5), np.float32) / 7
        np.testing.assert_allclose(np.asarray(model.lm_logits(jnp.asarray(hidden))),
                                   hidden @ np.asarray(model.embed_tokens.embedding[...]).T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_projections_match_transformers(ckpts, name):
    """fused_projections=True (a GPU's default layout) gives each layer one q/k/v kernel and one
    gate/up kernel in place of the separate ones; a plain forward, a cached prefill and a chain
    verified against the cache all give transformers' logits."""
    model = load_qwen3(ckpts[name], dtype=jnp.float32, fused_projections=True)
    cfg = model.config
    assert model.fused_projections
    names = {".".join(map(str, path)) for path, _ in nnx.iter_graph(model)}
    assert "layers.0.self_attn.qkv_proj.kernel" in names and "layers.0.mlp.gate_up_proj.kernel" in names
    assert not any(set(n.split(".")) & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} for n in names)
    width = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    assert model.layers[0].self_attn.qkv_proj.kernel.shape == (cfg.hidden_size, width)
    ids = random_ids(cfg.vocab_size, (2, 40), seed=7)
    ref_logits, _ = hf_run(ckpts[name], ids)
    logits, _, _ = full_forward(model, ids)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=1e-4, rtol=0)
    cache = init_cache(cfg, 2, CACHE_SLOTS, jnp.float32)
    logits, _, cache = cached_forward(model, ids[:, :PREFILL], cache, np.zeros(2, np.int32))
    np.testing.assert_allclose(np.asarray(logits), ref_logits[:, :PREFILL], atol=1e-4, rtol=0)
    chain = 8  # the next tokens as a chain tree against the cache
    mask = jnp.asarray(np.broadcast_to(np.tril(np.ones((chain, chain), bool)), (2, chain, chain)))
    positions = jnp.asarray(np.broadcast_to(np.arange(PREFILL, PREFILL + chain), (2, chain)), jnp.int32)
    logits, _, _ = cached_forward(model, ids[:, PREFILL:PREFILL + chain], cache, np.full(2, PREFILL, np.int32),
                                  mask, positions)
    np.testing.assert_allclose(np.asarray(logits), ref_logits[:, PREFILL:PREFILL + chain], atol=1e-4, rtol=0)


def library_attention_on_xla(monkeypatch) -> list:
    """`jax.nn.dot_product_attention` with XLA standing in for cuDNN (which needs a GPU): the
    attention "cudnn" path then runs on this CPU, its calls counted (the list)."""
    calls, real = [], jax.nn.dot_product_attention

    def stand_in(*args, implementation=None, **kwargs):
        calls.append(implementation)
        return real(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    return calls


@pytest.mark.parametrize("name", ["h64_gqa4_tied", "h32_mqa_hd12"])
def test_fused_attention_matches_transformers(ckpts, name, monkeypatch):
    """attention "cudnn" (`Qwen3.use_attention`): the cached forwards attend through
    `jax.nn.dot_product_attention` (the cache's window and, in a verify, the tree's nodes side by
    side, under one mask); its XLA implementation standing in for cuDNN, a cached prefill, decoding
    and a chain verified against the cache give transformers' logits."""
    calls = library_attention_on_xla(monkeypatch)
    model = load_qwen3(ckpts[name], dtype=jnp.float32)
    model.attention_kernel = "cudnn"  # use_attention refuses it on a CPU (see below)
    cfg = model.config
    ids = random_ids(cfg.vocab_size, (2, 40), seed=9)
    ref_logits, _ = hf_run(ckpts[name], ids)
    cache = init_cache(cfg, 2, CACHE_SLOTS, jnp.float32)
    logits, _, cache = cached_forward(model, ids[:, :PREFILL], cache, np.zeros(2, np.int32))
    np.testing.assert_allclose(np.asarray(logits), ref_logits[:, :PREFILL], atol=1e-4, rtol=0)
    assert calls and set(calls) == {"cudnn"}  # every layer through the library, asking for cuDNN
    one, _, _ = cached_forward(model, ids[:, PREFILL:PREFILL + 1], cache, np.full(2, PREFILL, np.int32))
    np.testing.assert_allclose(np.asarray(one[:, 0]), ref_logits[:, PREFILL], atol=1e-4, rtol=0)
    chain = 8
    mask = jnp.asarray(np.broadcast_to(np.tril(np.ones((chain, chain), bool)), (2, chain, chain)))
    positions = jnp.asarray(np.broadcast_to(np.arange(PREFILL, PREFILL + chain), (2, chain)), jnp.int32)
    calls.clear()
    logits, _, _ = cached_forward(model, ids[:, PREFILL:PREFILL + chain], cache, np.full(2, PREFILL, np.int32),
                                  mask, positions)
    np.testing.assert_allclose(np.asarray(logits), ref_logits[:, PREFILL:PREFILL + chain], atol=1e-4, rtol=0)
    assert len(calls) == cfg.num_hidden_layers


@pytest.mark.extended
def test_dart_and_its_baseline_attend_with_the_chosen_kernel(tmp_path, monkeypatch):
    """A DartModel over a target set to attention "cudnn" (XLA standing in for cuDNN): DART's steps
    and plain decoding, the baseline, both go through the library function, and greedy DART gives
    plain decoding's tokens, with the host's search and in the device loop."""
    calls = library_attention_on_xla(monkeypatch)
    base, head, trie = make_tiny_setup(tmp_path, vocab_size=200, draft_length=3, num_hidden_layers=4, seed=4)
    plain_model = DartModel.from_pretrained(base, head, trie, min_bucket=64, keep=8)
    target = plain_model.target
    target.attention_kernel = "cudnn"  # (use_attention refuses it on a CPU)
    for device_steps in (0, 3):
        model = DartModel.from_modules(target, plain_model.head, plain_model.tokenizer, plain_model.engine.trie,
                                       eos_ids=sorted(plain_model.engine.eos_ids), min_bucket=64, keep=8,
                                       device_steps=device_steps)
        for first, prompt in zip((True, False), ([5, 6, 7, 8, 9], [30, 31, 32])):
            calls.clear()  # (the stand-in runs when a program is traced: a program's first call)
            plain = model.generate_ar(prompt, max_new_tokens=20, chat=False).token_ids
            assert bool(calls) == (first and not device_steps), "plain decoding: not through the library"
            calls.clear()
            dart = model.generate(prompt, max_new_tokens=20, chat=False).token_ids
            assert bool(calls) == first, "DART: not through the library"
            assert dart == plain and len(plain) == 20
    with pytest.raises(InputError, match="runs on one device, not over a mesh"):  # refused before any use
        DartModel.from_modules(target, plain_model.head, plain_model.tokenizer, None, eos_ids=[1], keep=8,
                               mesh="model=1", attention="cudnn")


def test_attention_kernel_is_checked(ckpts, monkeypatch):
    """A kernel that does not exist, cuDNN off a GPU, on a GPU cuDNN's flash attention cannot use
    (ROCm, compute capability below 8.0) and for a float32 model are refused with the option's
    name and the fix; "xla" is the default."""
    model = load_qwen3(next(iter(ckpts.values())), dtype=jnp.float32)
    assert model.attention_kernel == "xla"
    with pytest.raises(InputError, match=r"attention \(--attention\) must be one of xla, cudnn, pallas, got 'flash'"):
        model.use_attention("flash")
    with pytest.raises(InputError, match=r"needs an NVIDIA GPU of compute capability 8.0 or more; this process runs "
                                         r"on cpu: use attention \"xla\""):
        model.use_attention("cudnn")
    assert model.attention_kernel == "xla"
    h200 = SimpleNamespace(compute_capability="9.0", device_kind="NVIDIA H200")
    assert cudnn_device_problem(h200) is None
    assert "compute capability 7.5" in cudnn_device_problem(SimpleNamespace(compute_capability="7.5", device_kind="T4"))
    assert "not a CUDA device" in cudnn_device_problem(SimpleNamespace(device_kind="AMD Instinct MI250X"))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [h200])
    assert check_attention("cudnn", jnp.bfloat16) == "cudnn"
    with pytest.raises(InputError, match=r"takes a bfloat16 or float16 model, this one computes in float32: load it "
                                         r"in bfloat16 \(--dtype bfloat16\)"):
        model.use_attention("cudnn")
    monkeypatch.setattr(jax, "devices", lambda *a: [SimpleNamespace(compute_capability="7.0", device_kind="V100")])
    with pytest.raises(InputError, match=r"the device \(V100\) has compute capability 7.0: use attention \"xla\""):
        check_attention("cudnn", jnp.bfloat16)


def test_verify_gemms_switch():
    """On a GPU a verification of 32 rows or more compiles with Triton's GEMMs off (cuBLAS), fewer
    rows with XLA's defaults; "xla" never turns them off, "cublas" always; other backends keep
    XLA's defaults; a bad value is refused, naming the option and its values."""
    off = {"xla_gpu_enable_triton_gemm": False}
    assert verify_compiler_options(31, "gpu") is None and verify_compiler_options(32, "gpu") == off
    assert verify_compiler_options(61, "cpu") is None and verify_compiler_options(61, "tpu") is None
    assert verify_compiler_options(2, "gpu", choice="cublas") == off
    assert verify_compiler_options(976, "gpu", choice="xla") is None
    with pytest.raises(InputError, match="verify_gemms \\(--verify-gemms\\) must be one of auto, xla, cublas"):
        verify_compiler_options(61, "gpu", choice="triton")


def test_fused_projections_option_overrides_the_backend_default(ckpts, monkeypatch):
    """The loader fuses the projections where the backend's defaults say so (here a faked GPU), and
    fused_projections=False / True overrides that either way."""
    path = next(iter(ckpts.values()))
    monkeypatch.setattr(backend, "current_backend", lambda: "gpu")
    assert load_qwen3(path, dtype=jnp.float32).fused_projections
    assert not load_qwen3(path, dtype=jnp.float32, fused_projections=False).fused_projections
    monkeypatch.setattr(backend, "current_backend", lambda: "cpu")
    assert not load_qwen3(path, dtype=jnp.float32).fused_projections
    assert load_qwen3(path, dtype=jnp.float32, fused_projections=True).fused_projections


PREFILL, CACHE_SLOTS = 24, 64


def test_cached_decode_matches_full_forward_and_does_not_recompile(full_runs):
    model, seq, full_logits, full_taps, _ = full_runs["h64_gqa4_tied"]
    cfg = model.config
    prefill = (24, 17)  # rows at different lengths: row 1's slots 17..23 are written but not valid
    cache = init_cache(cfg, 2, CACHE_SLOTS, jnp.float32)
    assert isinstance(cache, KVCache)
    assert cache.k.shape == (cfg.num_hidden_layers, 2, CACHE_SLOTS, cfg.num_key_value_heads, cfg.head_dim)
    logits, taps, cache = cached_forward(model, seq[:, :PREFILL], cache, np.zeros(2, np.int32))
    for b, p in enumerate(prefill):
        np.testing.assert_allclose(np.asarray(logits[b, :p]), np.asarray(full_logits[b, :p]), atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.asarray(taps[b, :p]), np.asarray(full_taps[b, :p]), atol=1e-4, rtol=0)
    cache_len = np.array(prefill, np.int32)
    TRACES.clear()
    for _ in range(12):
        step_ids = seq[np.arange(2), cache_len][:, None]  # [2,1]
        logits, taps, cache = cached_forward(model, step_ids, cache, cache_len)
        rows = np.arange(2)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), np.asarray(full_logits)[rows, cache_len], atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.asarray(taps[:, 0]), np.asarray(full_taps)[rows, cache_len], atol=1e-4, rtol=0)
        cache_len += 1
    assert TRACES == [(2, 1)], f"decode steps of one shape were traced {len(TRACES)} times"


def _random_tree(rng, n):
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    anc = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return parents, anc, anc.sum(1) - 1


def test_tree_verify_matches_each_root_to_node_path(full_runs):
    model, prefix, *_ = full_runs["h64_gqa4_tied"]
    cfg = model.config
    rng = np.random.default_rng(3)
    n, prefix_lens = 12, np.array([PREFILL, 14], np.int32)
    trees = [_random_tree(rng, n) for _ in range(2)]
    assert all(t[2].max() < n - 1 for t in trees), "trees should branch"
    tokens = random_ids(cfg.vocab_size, (2, n), seed=5)
    cache = init_cache(cfg, 2, CACHE_SLOTS, jnp.float32)
    _, _, cache = cached_forward(model, prefix[:, :PREFILL], cache, np.zeros(2, np.int32))
    mask = np.stack([t[1] for t in trees])
    positions = prefix_lens[:, None] + np.stack([t[2] for t in trees])
    logits, taps, _ = cached_forward(model, tokens, cache, prefix_lens, jnp.asarray(mask), jnp.asarray(positions))

    # oracle: each root-to-node path appended to its row's prefix, run as one plain causal sequence;
    # right padding does not change a causal forward at the path's last position
    paths, ends = np.zeros((2 * n, PREFILL + n), np.int32), []
    for b in range(2):
        anc = trees[b][1]
        for i in range(n):
            path = tokens[b, anc[i]]  # ancestors precede their descendants (parent index < child index)
            seq = np.concatenate([prefix[b, :prefix_lens[b]], path])
            paths[b * n + i, :len(seq)] = seq
            ends.append(len(seq) - 1)
    ref_logits, ref_taps, _ = full_forward(model, paths)
    rows = np.arange(2 * n)
    got_logits, got_taps = np.asarray(logits).reshape(2 * n, -1), np.asarray(taps).reshape(2 * n, -1)
    np.testing.assert_allclose(got_logits, np.asarray(ref_logits)[rows, ends], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got_taps, np.asarray(ref_taps)[rows, ends], atol=1e-4, rtol=0)


def test_sharded_and_bf16_checkpoints(tmp_path):
    kw = CONFIGS["h48_gqa1_untied"]
    single = make_tiny_qwen3(tmp_path / "single", seed=7, **kw)
    sharded = make_tiny_qwen3(tmp_path / "sharded", seed=7, max_shard_size_bytes=60_000, **kw)
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    ids = random_ids(kw["vocab_size"], (1, 64), seed=8)
    a, b = load_qwen3(single, dtype=jnp.float32), load_qwen3(sharded, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(full_forward(a, ids)[0]), np.asarray(full_forward(b, ids)[0]))

    bf16 = make_tiny_qwen3(tmp_path / "bf16", seed=9, dtype="bfloat16", **kw)
    assert any(v.dtype.name == "bfloat16" for v in read_tensors(bf16).values())
    m32 = load_qwen3(bf16, dtype=jnp.float32)
    assert m32.layers[0].self_attn.o_proj.kernel[...].dtype == jnp.float32  # never fused
    ref_logits, _ = hf_run(bf16, ids, dtype=torch.float32)  # HF upcasts the bf16 weights exactly
    logits32 = np.asarray(full_forward(m32, ids)[0])
    np.testing.assert_allclose(logits32, ref_logits, atol=1e-4, rtol=0)
    m16 = load_qwen3(bf16, dtype=jnp.bfloat16)
    assert m16.embed_tokens.embedding[...].dtype == jnp.bfloat16
    logits16 = np.asarray(full_forward(m16, ids)[0])
    assert logits16.dtype == np.float32
    assert np.corrcoef(logits16.ravel(), logits32.ravel())[0, 1] > 0.99
    assert np.mean(logits16.argmax(-1) == logits32.argmax(-1)) > 0.8


def _edit_checkpoint(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = read_tensors(dst)
    edit(tensors)
    write_tensors(dst / "model.safetensors", tensors)
    return dst


def test_loader_errors_name_the_problem(ckpts, tmp_path):
    src = ckpts["h48_gqa1_untied"]
    gone = "model.layers.3.mlp.up_proj.weight"
    missing = _edit_checkpoint(src, tmp_path / "missing", lambda t: t.pop(gone))
    with pytest.raises(ValueError, match="missing tensors.*" + gone.replace(".", r"\.")):
        load_qwen3(missing)
    bogus = {"model.layers.9.bogus.weight": np.ones(3, np.float32)}
    extra = _edit_checkpoint(src, tmp_path / "extra", lambda t: t.update(bogus))
    with pytest.raises(ValueError, match=r"unexpected tensors.*model\.layers\.9\.bogus\.weight"):
        load_qwen3(extra)
    bad = "model.layers.1.self_attn.k_proj.weight"
    misshaped = _edit_checkpoint(src, tmp_path / "misshaped", lambda t: t.update({bad: t[bad][:-1]}))
    with pytest.raises(ValueError, match=bad.replace(".", r"\.") + r".*shape \(47, 48\), expected \(48, 48\)"):
        load_qwen3(misshaped)
    tied_with_head = tmp_path / "tied_with_head"
    shutil.copytree(src, tied_with_head)
    cfg = json.loads((tied_with_head / "config.json").read_text())
    (tied_with_head / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match=r"tie_word_embeddings=true.*lm_head\.weight"):
        load_qwen3(tied_with_head)

    no_config = tmp_path / "no_config"
    shutil.copytree(src, no_config)
    (no_config / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_qwen3(no_config)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(src / "config.json", no_weights / "config.json")
    with pytest.raises(FileNotFoundError, match="no weights"):
        load_qwen3(no_weights)
    with pytest.raises(FileNotFoundError, match="neither an existing local path nor a hub id"):
        load_qwen3(tmp_path / "does" / "not" / "exist")
    bad_cfg = tmp_path / "bad_cfg"
    shutil.copytree(src, bad_cfg)
    (bad_cfg / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 2}))
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        load_qwen3(bad_cfg)


def test_config_reads_rope_theta_from_either_layout():
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=5, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, model_type="qwen3")
    v5 = Qwen3Config.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 123456.0}})
    v4 = Qwen3Config.from_hf({**base, "rope_theta": 123456.0, "rope_scaling": None})
    assert v5 == v4 and v5.rope_theta == 123456.0 and v5.rope_scaling is None
    yarn5 = Qwen3Config.from_hf({**base, "max_position_embeddings": 256,
                                 "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5}})
    yarn4 = Qwen3Config.from_hf({**base, "max_position_embeddings": 256, "rope_theta": 5e5,
                                 "rope_scaling": {"type": "yarn", "factor": 4.0}})
    assert yarn5 == yarn4 and yarn5.rope_scaling_dict["original_max_position_embeddings"] == 256
    hash(yarn5)  # static under jit
    with pytest.raises(ValueError, match="model_type"):
        Qwen3Config.from_hf({**base, "model_type": "llama"})


def test_yarn_rope_scaling_matches_transformers(tmp_path):
    kw = dict(CONFIGS["h32_mqa_hd12"], max_position_embeddings=512)
    folder = make_tiny_qwen3(tmp_path / "yarn", seed=11, **kw,
                             rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                              "original_max_position_embeddings": 128})
    cfg = load_qwen3_config(folder)
    assert cfg.rope_scaling_dict["rope_type"] == "yarn"
    model = load_qwen3(folder, dtype=jnp.float32)
    ids = random_ids(kw["vocab_size"], (1, 300), seed=12)  # well past the original 128 positions
    ref_logits, _ = hf_run(folder, ids)
    np.testing.assert_allclose(np.asarray(full_forward(model, ids)[0]), ref_logits, atol=1e-4, rtol=0)


def test_hub_snapshot_resolves_offline(ckpts, full_runs, tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--tiny-owner--tiny-qwen3"
    shutil.copytree(ckpts["h64_gqa4_tied"], repo / "snapshots" / ("ab" * 20))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))  # read when huggingface_hub was imported
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    model = load_qwen3("tiny-owner/tiny-qwen3", dtype=jnp.float32)
    _, ids, logits, *_ = full_runs["h64_gqa4_tied"]
    np.testing.assert_array_equal(np.asarray(full_forward(model, ids)[0]), np.asarray(logits))
    with pytest.raises(FileNotFoundError, match="not found in the local Hugging Face cache"):
        load_qwen3("tiny-owner/absent-model")


def test_sharding_rules_and_one_device_mesh(ckpts, full_runs):
    assert default_dtype() == jnp.float32  # the test run is on CPU
    mesh8 = AbstractMesh((2, 4), ("data", "model"))
    assert logical_to_spec(("embed", "heads"), (64, 64), mesh8) == PartitionSpec(None, "model")
    assert logical_to_spec(("vocab", "embed"), (30, 64), mesh8) == PartitionSpec(None, None)  # 30 % 4 != 0
    assert logical_to_spec(("batch", "seq", "kv_heads"), (4, 8, 8), mesh8) == PartitionSpec("data", None, "model")
    assert logical_to_spec(("heads", "mlp"), (8, 8), mesh8) == PartitionSpec("model", None)  # one use per mesh axis
    assert set(DEFAULT_RULES) >= {"batch", "seq", "heads", "kv_heads", "head_dim", "embed", "mlp", "vocab", "layers"}

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    model = load_qwen3(ckpts["h64_gqa4_tied"], dtype=jnp.float32, mesh=mesh)
    kernel = model.layers[0].self_attn.q_proj.kernel
    assert kernel.get_metadata()["logical_axes"] == ("embed", "heads")
    assert isinstance(kernel[...].sharding, NamedSharding) and kernel[...].sharding.mesh.shape == mesh.shape
    assert all(isinstance(v.sharding, NamedSharding) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    moved = shard_module(load_qwen3(ckpts["h64_gqa4_tied"], dtype=jnp.float32), mesh)
    for _, var in nnx.iter_graph(moved):
        if isinstance(var, nnx.Param):
            axes = var.get_metadata()["logical_axes"]
            assert var[...].sharding == NamedSharding(mesh, logical_to_spec(axes, var.shape, mesh)), axes
    _, ids, logits, *_ = full_runs["h64_gqa4_tied"]
    cache = shard_cache(init_cache(model.config, 2, CACHE_SLOTS, jnp.float32), mesh)
    assert isinstance(cache.k.sharding, NamedSharding)
    prefill_logits, _, _ = cached_forward(model, ids[:, :PREFILL], cache, np.zeros(2, np.int32))
    np.testing.assert_allclose(np.asarray(prefill_logits), np.asarray(logits[:, :PREFILL]), atol=1e-4, rtol=0)


def test_verify_then_write_cache_equals_extend(full_runs):
    """A chain verified against the cache and written back with write_cache leaves the same cache
    (and the same logits) as appending it with extend; the oracle is the plain forward."""
    model, seq, full_logits, _, _ = full_runs["h64_gqa4_tied"]
    cfg = model.config
    graphdef, state = nnx.split(model)
    prefix, t = np.array([20, 13], np.int32), 6

    @jax.jit
    def both(state, cache_a, cache_b, ids):
        m = nnx.merge(graphdef, state)
        chain = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (2, t, t))
        positions = jnp.asarray(prefix)[:, None] + jnp.arange(t)[None, :]
        h_v, _, new = m.verify(ids, positions, chain, cache_a, prefix)
        written = write_cache(cache_a, prefix, new)
        h_e, _, extended = m.extend(ids, cache_b, prefix)
        return m.lm_logits(h_v), m.lm_logits(h_e), written, extended

    cache = init_cache(cfg, 2, CACHE_SLOTS, jnp.float32)
    _, _, cache = cached_forward(model, seq[:, :24], cache, np.zeros(2, np.int32))
    ids = np.stack([seq[b, prefix[b]:prefix[b] + t] for b in range(2)])
    copy = jax.tree.map(jnp.copy, cache)
    logits_v, logits_e, written, extended = both(state, cache, copy, jnp.asarray(ids))
    for b in range(2):
        want = np.asarray(full_logits)[b, prefix[b]:prefix[b] + t]
        np.testing.assert_allclose(np.asarray(logits_v[b]), want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.asarray(logits_e[b]), want, atol=1e-4, rtol=0)
        end = prefix[b] + t
        np.testing.assert_allclose(np.asarray(written.k[:, b, :end]), np.asarray(extended.k[:, b, :end]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(written.v[:, b, :end]), np.asarray(extended.v[:, b, :end]), atol=1e-5)
