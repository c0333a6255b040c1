"""`python -m dart_jax.convert export` of a head over a Llama-family base: the written files read
back with safetensors and json alone (every tensor's name, shape, dtype and value against the
source head's files, docs/spec.md §1), then loaded by the project's own loader."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from dart_jax.bench.tiny import make_tiny_head, make_tiny_llama
from dart_jax.convert.__main__ import main

H, V, DV, I, HEADS, KV, HD, M = 64, 256, 40, 96, 4, 2, 16, 3
# docs/spec.md §1's table, restated: name -> [out, in] shape in the file
EXPECTED = {
    "fc.weight": (H, 3 * H), "midlayer.mask_rep": (2 * H,), "midlayer.hidden_norm.weight": (H,),
    "midlayer.input_layernorm.weight": (H,), "midlayer.post_attention_layernorm.weight": (H,),
    "midlayer.self_attn.q_proj.weight": (HEADS * HD, 2 * H), "midlayer.self_attn.k_proj.weight": (KV * HD, 2 * H),
    "midlayer.self_attn.v_proj.weight": (KV * HD, 2 * H), "midlayer.self_attn.o_proj.weight": (H, HEADS * HD),
    "midlayer.mlp.gate_proj.weight": (I, H), "midlayer.mlp.up_proj.weight": (I, H), "midlayer.mlp.down_proj.weight": (H, I),
    "norm.weight": (H,), "lm_head.weight": (DV, H), "d2t": (DV,), "t2d": (V,),
}


def _read(folder):
    """{name: (safetensors dtype name, numpy array)} of a folder's model.safetensors."""
    out = {}
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        for name in f.keys():
            out[name] = f.get_slice(name).get_dtype(), f.get_tensor(name)
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_export")
    base = make_tiny_llama(root / "base", seed=11, num_hidden_layers=8, hidden_size=H, vocab_size=V,
                           tie_word_embeddings=False,
                           rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    head = make_tiny_head(root / "head", base, draft_length=M, draft_vocab_size=DV, shuffle_d2t=True, seed=5,
                          num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, intermediate_size=I)
    return root, base, head


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_over_a_llama_base_reads_back_exactly(llama, dtype, capsys):
    root, base, head = llama
    out = root / f"out_{dtype}"
    assert main(["export", str(head), str(out), "--base", str(base), "--dtype", dtype]) == 0
    assert capsys.readouterr().err == ""  # 8 layers, no rope_scaling: nothing the reference refuses
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]

    source, written = _read(head), _read(out)
    assert set(written) == set(EXPECTED) == set(source)
    float_name = {"float32": "F32", "bfloat16": "BF16"}[dtype]
    for name, shape in EXPECTED.items():
        kind, array = written[name]
        assert array.shape == shape, name
        assert kind == {"d2t": "I64", "t2d": "BOOL"}.get(name, float_name), name
        want = source[name][1]
        if name not in ("d2t", "t2d"):
            want = want.astype(np.float32).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
        np.testing.assert_array_equal(array, want, err_msg=name)
    d2t, t2d = written["d2t"][1], written["t2d"][1]
    targets = np.arange(DV) + d2t
    assert len(set(targets.tolist())) == DV and t2d.sum() == DV and t2d[targets].all()

    config = json.loads((out / "config.json").read_text())
    src = json.loads((head / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "torch_dtype"} == {k: v for k, v in src.items() if k != "torch_dtype"}
    assert config["torch_dtype"] == dtype
    # what the reference's head reads from config.json, against the Llama base it drafts for
    base_cfg = json.loads((base / "config.json").read_text())
    assert config["hidden_size"] == config["target_hidden_size"] == base_cfg["hidden_size"]
    assert config["vocab_size"] == base_cfg["vocab_size"] and config["draft_vocab_size"] == DV
    assert config["draft_length"] == M and config["rope_scaling"] is None

    from dart_jax.convert import load_dart_head, load_target

    target = load_target(base)
    assert target.config.model_type == "llama"
    loaded = load_dart_head(out, target)
    np.testing.assert_array_equal(np.asarray(loaded.d2t.value), d2t)
    np.testing.assert_array_equal(np.asarray(loaded.fc.kernel.value, np.float32),
                                  written["fc.weight"][1].astype(np.float32).T)


def test_inspect_and_export_warn_what_the_reference_would_not_take(llama, tmp_path, capsys):
    root, _, head = llama
    short = make_tiny_llama(tmp_path / "short", num_hidden_layers=6, hidden_size=H, vocab_size=V)
    assert main(["inspect", str(head), "--base", str(short)]) == 0
    assert "reference would not take it" in capsys.readouterr().out
    assert main(["export", str(head), str(tmp_path / "out"), "--base", str(short)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "6 layers" in err and "(2, 3, 3)" in err

    config = json.loads((head / "config.json").read_text())
    scaled = tmp_path / "scaled"
    scaled.mkdir()
    (scaled / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    (scaled / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    assert main(["export", str(scaled), str(tmp_path / "out2")]) == 0
    assert "rope_scaling" in capsys.readouterr().err
    (scaled / "config.json").write_text(json.dumps({**config, "rope_scaling": {"type": "linear", "factor": 2.0}}))
    assert main(["export", str(scaled), str(tmp_path / "out3")]) == 0
    assert capsys.readouterr().err == ""
