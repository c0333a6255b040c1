"""DART draft head against a NumPy restatement of docs/spec.md §3, and its checkpoint round trips.

The oracle below recomputes every call from scratch over the whole committed history in
float64; the head's weights come from a checkpoint the test writes itself in the reference
layout (docs/spec.md §1), so the loader's name/transpose table is checked by the same comparison.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from dart_jax.bench.tiny import make_tiny_qwen3
from dart_jax.models.checkpoints import load_dart_head, save_dart_head
from dart_jax.convert.dart_head import DartHeadConfig
from dart_jax.models.head import HeadCache, TRAINABLE, init_head_cache

H, I, HEADS, KV, HD, V, VD, M = 32, 48, 4, 2, 12, 100, 40, 3
D = M + 1


# ---------------------------------------------------------------- a target stand-in
class _Embed(nnx.Module):
    def __init__(self, table):
        self.embedding = nnx.Param(jnp.asarray(table))


class _TargetConfig:
    def __init__(self, hidden_size, vocab_size):
        self.hidden_size, self.vocab_size = hidden_size, vocab_size


class _Target:
    """What load_dart_head reads from the Qwen3 module: `.config` and `.embed_tokens`."""

    def __init__(self, table):
        self.embed_tokens = _Embed(table)
        self.config = _TargetConfig(table.shape[1], table.shape[0])


# ---------------------------------------------------------------- a reference-layout checkpoint
def head_config_dict(**over):
    cfg = dict(architectures=["LlamaForCausalLMDart"], model_type="llama", hidden_size=H, intermediate_size=I,
               num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, rms_norm_eps=1e-6,
               rope_theta=10000.0, rope_scaling=None, vocab_size=V, max_position_embeddings=64,
               draft_length=M, draft_vocab_size=VD, hidden_act="silu", bos_token_id=1)
    cfg.update(over)
    return cfg


def random_tensors(seed=0, *, hidden=H, vocab=V, draft_vocab=VD):
    rng = np.random.default_rng(seed)

    def lin(out, inp):
        return (rng.standard_normal((out, inp)) * 1.5 / np.sqrt(inp)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    used = np.sort(rng.choice(vocab, draft_vocab, replace=False))
    t2d = np.zeros(vocab, bool)
    t2d[used] = True
    return {
        "fc.weight": lin(hidden, 3 * hidden),
        "midlayer.mask_rep": rng.standard_normal(2 * hidden).astype(np.float32),
        "midlayer.hidden_norm.weight": norm(hidden),
        "midlayer.input_layernorm.weight": norm(hidden),
        "midlayer.post_attention_layernorm.weight": norm(hidden),
        "midlayer.self_attn.q_proj.weight": lin(HEADS * HD, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": lin(KV * HD, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": lin(KV * HD, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": lin(hidden, HEADS * HD),
        "midlayer.mlp.gate_proj.weight": lin(I, hidden),
        "midlayer.mlp.up_proj.weight": lin(I, hidden),
        "midlayer.mlp.down_proj.weight": lin(hidden, I),
        "norm.weight": norm(hidden),
        "lm_head.weight": lin(draft_vocab, hidden),
        "d2t": (used - np.arange(draft_vocab)).astype(np.int64),
        "t2d": t2d,
    }


def write_head(folder, tensors, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def embedding_table(seed=1):
    return np.random.default_rng(seed).standard_normal((V, H)).astype(np.float32)


# ---------------------------------------------------------------- the NumPy oracle (docs/spec.md §3)
def np_rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_inv_freq(kind, factor=2.0, theta=10000.0, max_pos=64):
    exps = np.arange(0, HD, 2) / HD
    if kind == "none":
        return 1.0 / theta ** exps
    if kind == "linear":  # the reference scales positions by 1/factor with base 10000
        return 1.0 / 10000.0 ** exps / factor
    if kind == "dynamic":  # NTK base the reference fixes for a table of max_pos + 20 positions
        length = max_pos + 20
        base = 10000.0 * (factor * length / max_pos - (factor - 1)) ** (HD / (HD - 2))
        return 1.0 / base ** exps
    raise AssertionError(kind)


def np_rope(x, positions, inv_freq):
    ang = positions[:, None] * inv_freq[None, :]                   # [T, D/2]
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]                   # x [T, heads, D]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def oracle(w, emb, taps, ids, inv_freq):
    """Draft logits [d, Vd] for one sequence whose whole history is taps [n, 3H], ids [n]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n = len(ids)
    g = taps @ w["fc.weight"].T
    x = np.concatenate([np_rms(emb[ids], w["midlayer.input_layernorm.weight"]),
                        np_rms(g, w["midlayer.hidden_norm.weight"])], axis=-1)
    x = np.concatenate([x, np.tile(w["midlayer.mask_rep"], (M, 1))])
    res = np.concatenate([g, np.tile(w["midlayer.mask_rep"][:H], (M, 1))])
    t = n + M
    pos = np.arange(t, dtype=np.float64)
    q = np_rope((x @ w["midlayer.self_attn.q_proj.weight"].T).reshape(t, HEADS, HD), pos, inv_freq)
    k = np_rope((x @ w["midlayer.self_attn.k_proj.weight"].T).reshape(t, KV, HD), pos, inv_freq)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).reshape(t, KV, HD)
    out = np.zeros((t, HEADS, HD))
    causal = np.tril(np.ones((t, t), bool))
    for h in range(HEADS):
        kv = h // (HEADS // KV)
        s = q[:, h] @ k[:, kv].T / np.sqrt(HD)
        s = np.where(causal, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
    hid = (res + out.reshape(t, -1) @ w["midlayer.self_attn.o_proj.weight"].T)[-D:]
    z = np_rms(hid, w["midlayer.post_attention_layernorm.weight"])
    gate = z @ w["midlayer.mlp.gate_proj.weight"].T
    hid = hid + ((gate / (1 + np.exp(-gate))) * (z @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
    hid = np_rms(np_rms(hid, w["norm.weight"]), w["norm.weight"])
    return hid @ w["lm_head.weight"].T


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tensors = random_tensors()
    folder = write_head(tmp_path_factory.mktemp("head"), tensors, head_config_dict())
    table = embedding_table()
    target = _Target(table)
    head = load_dart_head(folder, target, dtype=jnp.float32)
    return tensors, table, target, head, folder


def run(head, taps, ids):
    """One jitted no-cache call (eager op-by-op dispatch is far slower on CPU)."""
    graphdef, state = nnx.split(head)
    fn = jax.jit(lambda state, taps, ids: nnx.merge(graphdef, state)(taps, ids))
    return fn(state, jnp.asarray(taps, jnp.float32), jnp.asarray(ids, jnp.int32))


def assert_close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- forward against the oracle
def test_no_cache_call_matches_oracle(setup):
    tensors, table, _, head, _ = setup
    rng = np.random.default_rng(2)
    taps = rng.standard_normal((2, 7, 3 * H)).astype(np.float32)
    ids = rng.integers(0, V, (2, 7)).astype(np.int32)
    logits = run(head, taps, ids)
    assert logits.shape == (2, D, VD)
    for b in range(2):
        assert_close(logits[b], oracle(tensors, table, taps[b].astype(np.float64), ids[b], np_inv_freq("none")))


def make_step(head):
    graphdef, state = nnx.split(head)
    traces = []

    @jax.jit
    def step(state, taps, ids, cache, cache_len, n_real):
        traces.append(1)
        return nnx.merge(graphdef, state).extend(taps, ids, cache, cache_len, n_real)

    return (lambda *args: step(state, *args)), traces


def test_cached_calls_with_cut_back_match_oracle(setup):
    """Prompt call with padding, then follow-ups of 1 … d real rows; the caller advances
    cache_len by n_real only (the mask slots are dropped). Each call must equal the oracle
    run from scratch on the committed rows + the new rows. n_real changes must not retrace."""
    tensors, table, _, head, _ = setup
    rng = np.random.default_rng(3)
    prompt_n = np.array([5, 3])
    n_first, n_step = 6, D + 1
    cache = init_head_cache(head.config, 2, 48, jnp.float32)
    assert isinstance(cache, HeadCache) and cache.k.shape == (2, 48, KV, HD)
    cache_len = np.zeros(2, np.int32)
    hist_taps = [np.zeros((0, 3 * H)) for _ in range(2)]
    hist_ids = [np.zeros(0, np.int64) for _ in range(2)]
    first, first_traces = make_step(head)
    step, traces = make_step(head)
    schedule = [prompt_n, np.array([1, 4]), np.array([4, 1]), np.array([2, 3]), np.array([3, 2]), np.array([5, 5])]
    for call, n_real in enumerate(schedule):
        n = n_first if call == 0 else n_step
        taps = rng.standard_normal((2, n, 3 * H)).astype(np.float32)
        ids = rng.integers(0, V, (2, n)).astype(np.int32)
        fn = first if call == 0 else step
        logits, cache = fn(jnp.asarray(taps), jnp.asarray(ids), cache, jnp.asarray(cache_len), jnp.asarray(n_real, jnp.int32))
        for b in range(2):
            hist_taps[b] = np.concatenate([hist_taps[b], taps[b, : n_real[b]]])
            hist_ids[b] = np.concatenate([hist_ids[b], ids[b, : n_real[b]]])
            assert_close(logits[b], oracle(tensors, table, hist_taps[b], hist_ids[b], np_inv_freq("none")))
        cache_len = cache_len + n_real
    assert len(first_traces) == 1 and len(traces) == 1, (len(first_traces), len(traces))


@pytest.mark.parametrize("kind,scaling,theta", [
    ("none", None, 1e6),
    ("linear", {"type": "linear", "factor": 2.0}, 1e6),
    ("dynamic", {"type": "dynamic", "factor": 2.0}, 10000.0),
])
def test_rope_kinds_match_reference_semantics(tmp_path, kind, scaling, theta):
    tensors = random_tensors(seed=4)
    folder = write_head(tmp_path / kind, tensors, head_config_dict(rope_scaling=scaling, rope_theta=theta))
    table = embedding_table()
    head = load_dart_head(folder, _Target(table), dtype=jnp.float32)
    rng = np.random.default_rng(5)
    taps = rng.standard_normal((1, 9, 3 * H))
    ids = rng.integers(0, V, (1, 9))
    logits = run(head, taps, ids)
    assert_close(logits[0], oracle(tensors, table, taps[0], ids[0], np_inv_freq(kind, theta=theta)))


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
     "mscale": 1, "mscale_all_dim": 0},
])
def test_llama3_and_yarn_rope_agree_with_the_target_tables(scaling):
    """With base 10000 (what the reference head's yarn uses) the head's tables equal the shared
    HF-style tables of dart_jax.layers, an implementation written separately."""
    from dart_jax.models.head import head_rope
    from dart_jax.models.layers import rope_inv_freq

    config = DartHeadConfig.from_hf(head_config_dict(rope_scaling=scaling, rope_theta=10000.0))
    inv, scale = head_rope(config)
    want_inv, want_scale = rope_inv_freq(HD, 10000.0, scaling)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-6)
    assert scale == pytest.approx(want_scale)
    assert not np.allclose(inv, head_rope(DartHeadConfig.from_hf(head_config_dict()))[0])


def test_unsupported_rope_kind_is_named():
    with pytest.raises(ValueError, match="mrope"):
        DartHeadConfig.from_hf(head_config_dict(rope_scaling={"type": "mrope", "mrope_section": [2, 2, 2]}))


def test_d2t_maps_draft_ids_to_target_ids(setup):
    tensors, _, _, head, _ = setup
    used = np.flatnonzero(tensors["t2d"])
    draft = np.arange(VD)
    np.testing.assert_array_equal(np.asarray(head.to_target(jnp.asarray(draft))), used[draft])
    assert head.d2t[...].dtype == jnp.int32 and head.num_rows == D


def test_trainable_filter_leaves_out_embedding_and_buffers(setup):
    _, _, target, head, _ = setup
    paths = {tuple(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(head, TRAINABLE))}
    assert ("fc", "kernel") in paths and ("midlayer", "mask_rep") in paths
    assert not any(p[0] in ("embed_tokens", "d2t", "t2d") for p in paths)
    assert head.embed_tokens is target.embed_tokens


# ---------------------------------------------------------------- save / load
def test_save_load_round_trip_fp32_exact(setup, tmp_path):
    tensors, _, target, head, _ = setup
    save_dart_head(tmp_path / "out", head.config, head)
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(tensors)
    for name, array in tensors.items():
        assert back[name].dtype == array.dtype, name
        np.testing.assert_array_equal(back[name], array, err_msg=name)
    reloaded = load_dart_head(tmp_path / "out", target, dtype=jnp.float32)
    assert reloaded.config == head.config
    save_dart_head(tmp_path / "again", reloaded.config, nnx.state(reloaded))
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    for name in tensors:
        np.testing.assert_array_equal(again[name], back[name], err_msg=name)


def test_save_load_round_trip_bf16_exact(setup, tmp_path):
    tensors, table, _, head, _ = setup
    save_dart_head(tmp_path / "bf16", head.config, head, dtype="bfloat16")
    back = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    for name, array in tensors.items():
        want = array if name in ("d2t", "t2d") else array.astype(ml_dtypes.bfloat16)
        assert back[name].dtype == want.dtype, name
        np.testing.assert_array_equal(back[name], want, err_msg=name)
    reloaded = load_dart_head(tmp_path / "bf16", _Target(table.astype(ml_dtypes.bfloat16)))
    assert reloaded.fc.kernel[...].dtype == jnp.bfloat16
    save_dart_head(tmp_path / "bf16b", reloaded.config, reloaded, dtype="bfloat16")
    again = load_file(str(tmp_path / "bf16b" / "model.safetensors"))
    for name in tensors:
        np.testing.assert_array_equal(again[name], back[name], err_msg=name)


def test_saved_head_is_in_the_reference_layout(setup, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as torch_load

    _, _, _, head, _ = setup
    save_dart_head(tmp_path / "ref", head.config, head)
    back = torch_load(str(tmp_path / "ref" / "model.safetensors"))
    assert back["d2t"].dtype == torch.int64 and back["t2d"].dtype == torch.bool
    assert tuple(back["midlayer.self_attn.q_proj.weight"].shape) == (HEADS * HD, 2 * H)
    cfg = json.loads((tmp_path / "ref" / "config.json").read_text())
    for key in ("hidden_size", "draft_length", "draft_vocab_size", "head_dim", "rope_theta", "bos_token_id"):
        assert cfg[key] == head_config_dict()[key], key


def test_checkpoint_with_embedding_is_accepted(tmp_path):
    tensors = random_tensors(seed=6)
    tensors["embed_tokens.weight"] = np.zeros((V, H), np.float32)
    write_head(tmp_path / "e", tensors, head_config_dict())
    head = load_dart_head(tmp_path / "e", _Target(embedding_table()), dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(head.fc.kernel[...]), tensors["fc.weight"].T)


def _bad(tmp_path, name, *, tensors=None, config=None, target=None):
    folder = write_head(tmp_path / name, tensors if tensors is not None else random_tensors(),
                        config if config is not None else head_config_dict())
    return load_dart_head(folder, target or _Target(embedding_table()), dtype=jnp.float32)


def test_bad_checkpoints_are_named(tmp_path):
    t = random_tensors()
    del t["midlayer.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing tensors \['midlayer.mlp.up_proj.weight'\]"):
        _bad(tmp_path, "missing", tensors=t)
    t = random_tensors()
    t["midlayer.extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="unexpected tensors"):
        _bad(tmp_path, "unexpected", tensors=t)
    t = random_tensors()
    t["midlayer.self_attn.k_proj.weight"] = t["midlayer.self_attn.k_proj.weight"].T.copy()
    with pytest.raises(ValueError, match="k_proj.weight has shape"):
        _bad(tmp_path, "misshaped", tensors=t)
    t = random_tensors()
    t["d2t"] = t["d2t"][:-1].copy()
    with pytest.raises(ValueError, match="d2t has shape"):
        _bad(tmp_path, "d2t_len", tensors=t)
    t = random_tensors()
    t["d2t"][-1] = V
    with pytest.raises(ValueError, match="d2t maps 1 draft ids outside"):
        _bad(tmp_path, "d2t_range", tensors=t)
    with pytest.raises(ValueError, match="vocab_size 100 != target vocab_size 120"):
        _bad(tmp_path, "vocab", target=_Target(np.zeros((120, H), np.float32)))
    with pytest.raises(ValueError, match="hidden_size 32 != target hidden_size 48"):
        _bad(tmp_path, "hidden", target=_Target(np.zeros((V, 48), np.float32)))
    with pytest.raises(ValueError, match="target_hidden_size|tap features"):
        _bad(tmp_path, "taps", config=head_config_dict(target_hidden_size=48))
    cfg = head_config_dict()
    del cfg["draft_length"]
    with pytest.raises(ValueError, match="draft_length"):
        _bad(tmp_path, "nodraft", config=cfg)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_dart_head(tmp_path / "empty", _Target(embedding_table()))


# ---------------------------------------------------------------- command line
def _base_config(folder, vocab=V, hidden=H):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=True)))
    return folder


def test_cli_inspect_and_export(setup, tmp_path, capsys):
    from dart_jax.convert.__main__ import main

    tensors, _, _, _, folder = setup
    assert main(["inspect", str(folder), "--base", str(_base_config(tmp_path / "base"))]) == 0
    out = capsys.readouterr().out
    assert "midlayer.self_attn.q_proj.weight" in out and "fits this base model" in out
    assert main(["export", str(folder), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    back = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    for name, array in tensors.items():
        want = array if name in ("d2t", "t2d") else array.astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(back[name], want, err_msg=name)
    assert main(["inspect", str(folder), "--base", str(_base_config(tmp_path / "other", vocab=120))]) == 2
    assert "vocab_size 100 != target vocab_size 120" in capsys.readouterr().err


def test_head_on_a_real_qwen3_target(tmp_path):
    """load_dart_head against the project's Qwen3 module: its shared embedding and its taps."""
    from dart_jax.convert import load_qwen3

    base = make_tiny_qwen3(tmp_path / "base", vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                           seed=9)
    target = load_qwen3(base, dtype=jnp.float32)
    tensors = random_tensors(seed=7)
    head = load_dart_head(write_head(tmp_path / "head", tensors, head_config_dict()), target)
    assert head.embed_tokens is target.embed_tokens
    ids = np.random.default_rng(8).integers(0, V, (1, 6))
    graphdef, state = nnx.split(target)
    _, taps = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids, return_taps=True))(state, jnp.asarray(ids, jnp.int32))
    logits = run(head, taps, ids)
    table = np.asarray(target.embed_tokens.embedding[...], np.float64)
    assert_close(logits[0], oracle(tensors, table, np.asarray(taps[0], np.float64), ids[0], np_inv_freq("none")))
