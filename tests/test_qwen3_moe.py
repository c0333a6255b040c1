"""Qwen3-MoE targets against transformers' Qwen3MoeForCausalLM as the oracle: tiny random models
written by transformers itself (save_pretrained, safetensors, also in shards), loaded through our
loader; logits and taps, the cached forwards (prefill, one-token steps, a tree verification),
greedy DART, the loader's checks, and the checkpoint's tensors on a mesh of fake CPU devices."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from dart_jax import DartModel
from dart_jax.bench.tiny import make_tiny_eagle3, make_tiny_head, make_tiny_tokenizer
from dart_jax.convert import load_target, load_target_config
from dart_jax.convert.qwen3 import Qwen3Config, target_config_from_hf
from dart_jax.errors import FileFormatError, InputError
from dart_jax.ngram import Trie

from own_process import in_own_process

REPO = Path(__file__).resolve().parents[1]
VOCAB = 128

# expert counts, top-k, dense layers among the sparse ones, renormalised top-k weights or not
VARIANTS = {
    "e4k2": dict(num_experts=4, num_experts_per_tok=2),
    "e8k3_norm_mlp_only": dict(num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, mlp_only_layers=[1, 3]),
    "e6k1_every_second": dict(num_experts=6, num_experts_per_tok=1, decoder_sparse_step=2),
    "e5k5_norm_shards": dict(num_experts=5, num_experts_per_tok=5, norm_topk_prob=True),
}


def write_hf_moe(folder: Path, seed: int, *, layers: int = 5, shard: str | None = None, **moe) -> Path:
    """A random Qwen3MoeForCausalLM saved by transformers. Weights of std 0.2 (the router's 0.5,
    so that tokens route to different experts), norms near 1, final norm sharpened so that greedy
    decoding is not a near tie."""
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2, **moe)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((4.0 if name == "model.norm.weight" else 1.0) * (1 + 0.1 * torch.randn_like(p)))
            else:
                p.copy_((0.5 if name.endswith("mlp.gate.weight") else 0.2) * torch.randn_like(p))
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, safe_serialization=True, **kw)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: write_hf_moe(root / name, seed, shard="40KB" if "shards" in name else None, **moe)
            for seed, (name, moe) in enumerate(VARIANTS.items())}


def hf_model(folder) -> Qwen3MoeForCausalLM:
    return Qwen3MoeForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


# jitted (one program per call shape, not one per operation) and kept as the test writes them
forward = nnx.jit(lambda model, ids: model(ids, return_taps=True))
extend = nnx.jit(lambda model, ids, cache, cache_len: model.extend(ids, cache, cache_len)[::2])
verify = nnx.jit(lambda model, *args: model.verify(*args)[::2])
logits_of = nnx.jit(lambda model, hidden: model.lm_logits(hidden))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_and_taps_match_transformers(folders, variant):
    folder = folders[variant]
    config = load_target_config(folder)
    moe = VARIANTS[variant]
    assert config.model_type == "qwen3_moe" and config.qk_norm and config.num_experts == moe["num_experts"]
    if "shards" in variant:
        assert len(list(folder.glob("*.safetensors"))) > 1
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 11))
    ref = hf_model(folder)
    with torch.no_grad():
        out = ref(torch.tensor(ids), output_hidden_states=True)
        # the oracle routes the tokens to several experts, so a wrong choice of experts shows
        layer = ref.model.layers[next(i for i in range(config.num_hidden_layers) if config.sparse_layer(i))]
        x = layer.post_attention_layernorm(out.hidden_states[0])
        chosen = torch.topk(layer.mlp.gate(x.reshape(-1, 32))[0], moe["num_experts_per_tok"]).indices
    assert len(set(chosen.reshape(-1).tolist())) > moe["num_experts_per_tok"] or moe["num_experts_per_tok"] == moe[
        "num_experts"]
    layers = config.num_hidden_layers
    expected_taps = np.concatenate([out.hidden_states[i].numpy() for i in (2, layers // 2, layers - 3)], axis=-1)
    # the checkpoint's layout, and for one variant the fused one (gate and up of every expert in one tensor)
    for fused in (False, True) if variant == "e8k3_norm_mlp_only" else (False,):
        ours = load_target(folder, dtype=jnp.float32, fused_projections=fused)
        assert ours.fused_projections == fused
        logits, taps = forward(ours, jnp.asarray(ids))
        np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.asarray(taps), expected_taps, atol=1e-4, rtol=0)
        # one row: each row's experts gathered instead of every expert computed
        one, _ = forward(ours, jnp.asarray(ids[:1, :1]))
        np.testing.assert_allclose(np.asarray(one)[0, 0], out.logits.numpy()[0, 0], atol=1e-4, rtol=0)


def test_cached_prefill_steps_and_tree_verify_match_transformers(folders):
    from dart_jax.models.qwen3 import init_cache, write_cache

    folder = folders["e8k3_norm_mlp_only"]
    ours, ref = load_target(folder, dtype=jnp.float32), hf_model(folder)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, VOCAB, (2, 9))
    steps = rng.integers(0, VOCAB, (2, 2))

    def hf_last(ids):
        with torch.no_grad():
            return ref(torch.tensor(ids)).logits.numpy()[:, -1]

    cache = init_cache(ours.config, 2, 64, jnp.float32)
    hidden, cache = extend(ours, jnp.asarray(prompt), cache, jnp.zeros((2,), jnp.int32))  # 18 rows: every expert
    with torch.no_grad():
        full = ref(torch.tensor(prompt)).logits.numpy()
    np.testing.assert_allclose(np.asarray(logits_of(ours, hidden)), full, atol=1e-4, rtol=0)
    seq, length = prompt, 9
    for j in range(steps.shape[1]):  # 2 rows x top-3 < 8 experts: each row's experts gathered
        hidden, cache = extend(ours, jnp.asarray(steps[:, j:j + 1]), cache, jnp.full((2,), length, jnp.int32))
        seq, length = np.concatenate([seq, steps[:, j:j + 1]], axis=1), length + 1
        np.testing.assert_allclose(np.asarray(logits_of(ours, hidden))[:, 0], hf_last(seq), atol=1e-4, rtol=0)

    # a tree of 6 nodes under the committed sequence: node j sees its ancestors and itself
    parents = [-1, 0, 0, 1, 1, 2]
    depth = [0, 1, 1, 2, 2, 2]
    mask = np.zeros((6, 6), bool)
    for j in range(6):
        i = j
        while i >= 0:
            mask[j, i], i = True, parents[i]
    tokens = rng.integers(0, VOCAB, (2, 6))
    positions = length + np.asarray(depth)[None].repeat(2, 0)
    hidden, new = verify(ours, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask[None].repeat(2, 0)),
                         cache, jnp.full((2,), length, jnp.int32))
    logits = np.asarray(logits_of(ours, hidden))
    for j in range(6):
        path = [i for i in range(6) if mask[j, i]]  # ancestors in order of depth: parents precede children
        np.testing.assert_allclose(logits[:, j], hf_last(np.concatenate([seq, tokens[:, path]], axis=1)),
                                   atol=1e-4, rtol=0, err_msg=f"node {j}")
    # the kept path's keys/values written, the next step continues from it as transformers does
    kept = [0, 2, 5]
    cache = write_cache(cache, jnp.full((2,), length, jnp.int32),
                        jax.tree.map(lambda a: a[:, :, np.asarray(kept)], new))
    seq, length = np.concatenate([seq, tokens[:, kept]], axis=1), length + 3
    nxt = rng.integers(0, VOCAB, (2, 1))
    hidden, _ = extend(ours, jnp.asarray(nxt), cache, jnp.full((2,), length, jnp.int32))
    np.testing.assert_allclose(np.asarray(logits_of(ours, hidden))[:, 0], hf_last(np.concatenate([seq, nxt], axis=1)),
                               atol=1e-4, rtol=0)


PROMPT = [5, 17, 40, 9, 33]


@pytest.fixture(scope="module")
def moe_set(tmp_path_factory):
    """A DartModel on a tiny MoE target with a random DART head, a random EAGLE-3 head and a trie
    of the target's own greedy continuation of PROMPT (so that drafts are accepted), and
    transformers' model of the same folder."""
    root = tmp_path_factory.mktemp("moe_set")
    base = write_hf_moe(root / "base", seed=12, num_experts=4, num_experts_per_tok=2)
    make_tiny_tokenizer(base, vocab_size=VOCAB)
    head = make_tiny_head(root / "head", base, seed=12, head_dim=8)
    eagle3 = make_tiny_eagle3(root / "eagle3", base, seed=12, head_dim=8)
    ref = hf_model(base)
    with torch.no_grad():
        greedy = ref.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0].tolist()
    trie = root / "ngram.trie"
    Trie.build([greedy], order=3).save(trie)
    model = DartModel.from_pretrained(base, head, trie, keep=12, eagle3=eagle3, eagle3_total_token=13, dtype="float32")
    return model, ref


def test_greedy_dart_and_eagle3_equal_plain_decoding_and_transformers(moe_set):
    model, ref = moe_set
    for prompt in ("hello there", PROMPT):
        dart = model.generate(prompt, max_new_tokens=24)
        plain = model.generate_ar(prompt, max_new_tokens=24)
        assert list(dart.token_ids) == list(plain.token_ids)
        assert list(model.generate(prompt, max_new_tokens=24, method="eagle3").token_ids) == list(plain.token_ids)
        ids = model.encode(prompt)
        with torch.no_grad():
            out = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=0)
        assert list(dart.token_ids) == out[0, len(ids):].tolist()
        assert len(dart.token_ids) > 1


def test_sampling_keeps_the_target_distribution(moe_set):
    """Sampled DART on an MoE target: the first two tokens' law is transformers' (temperature,
    then top-k), by a chi-square test at the 0.1 % level, with drafts accepted often."""
    model, ref = moe_set
    prompt, temperature, top_k, n = PROMPT, 1.3, 3, 200

    def law(seq):  # transformers' warpers: temperature, then top-k
        with torch.no_grad():
            scores = ref(torch.tensor([seq])).logits[0, -1] / temperature
        kept = torch.topk(scores, top_k)
        return dict(zip(kept.indices.tolist(), torch.softmax(kept.values, -1).tolist()))

    exact = {(a, b): pa * pb for a, pa in law(prompt).items() for b, pb in law(prompt + [a]).items()}
    counts, accepted = {}, 0
    for seed in range(n):
        out = model.generate(prompt, max_new_tokens=2, temperature=temperature, top_k=top_k, seed=seed)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += sum(a - 1 for a in out.accept_lengths)
    assert accepted > n // 4, "the test needs drafts to be accepted to exercise the rejection sampling"
    assert set(counts) <= set(exact), set(counts) - set(exact)
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    df = len(exact) - 1
    assert stat < df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3, (stat, counts, exact)


def test_loader_names_what_does_not_match(tmp_path, folders):
    cfg = json.loads((folders["e4k2"] / "config.json").read_text())
    assert target_config_from_hf(cfg).num_experts == 4  # transformers 5 writes num_local_experts
    published = {k: v for k, v in cfg.items() if k != "num_local_experts"} | {"num_experts": 4}
    assert target_config_from_hf(published) == target_config_from_hf(cfg)
    for bad, message in (({"num_experts": 8}, "num_experts .8. and num_local_experts .4. disagree"),
                         ({"num_experts_per_tok": 5}, "num_experts_per_tok.*at most all 4 experts"),
                         ({"mlp_only_layers": [0, 7]}, "mlp_only_layers.*a layer of the 5"),
                         ({"mlp_only_layers": [0, 1, 2, 3, 4]}, "no layer is sparse"),
                         ({"moe_intermediate_size": None}, "moe_intermediate_size")):
        with pytest.raises(InputError, match=message):
            target_config_from_hf({**cfg, **bad})
    with pytest.raises(InputError, match="qwen3_moe"):
        Qwen3Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=3, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=4, num_experts=4)

    weights = load_file(folders["e4k2"] / "model.safetensors")
    for name, change in (("model.layers.3.mlp.experts.2.up_proj.weight", None),
                         ("model.layers.1.mlp.experts.0.down_proj.weight", lambda w: w[:, :-1])):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        changed = {k: v for k, v in weights.items() if k != name}
        if change is not None:
            changed[name] = np.ascontiguousarray(change(weights[name]))
        save_file(changed, folder / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(FileFormatError, match=name.replace(".", r"\.")):
            load_target(folder)


SHARDED = textwrap.dedent(r'''
    import sys
    import numpy as np
    import jax, jax.numpy as jnp
    jax.config.update("jax_default_matmul_precision", "highest")
    from dart_jax.convert import load_target
    from dart_jax.errors import InputError
    assert len(jax.devices()) == 4, jax.devices()
    folder, bad = sys.argv[1], sys.argv[2]
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 11)))
    whole = load_target(folder, dtype=jnp.float32)
    sharded = load_target(folder, dtype=jnp.float32, mesh="data=2,model=2")
    experts = sharded.layers[0].mlp.gate_proj.get_value()
    assert tuple(experts.sharding.spec)[:1] == ("model",), experts.sharding.spec
    assert max(s.data.shape[0] for s in experts.addressable_shards) == experts.shape[0] // 2
    # every expert over every row, and (one row) each row's experts gathered from their shards
    for rows in (ids, ids[:1, :1]):
        np.testing.assert_allclose(np.asarray(sharded(rows)), np.asarray(whole(rows)), atol=1e-4, rtol=0)
    try:
        load_target(bad, mesh="model=4")
    except InputError as e:
        assert "num_experts = 6" in str(e), e
    else:
        raise AssertionError("a mesh that does not divide the experts was accepted")
    print("SHARDED OK")
''')


@pytest.mark.extended
def test_experts_shard_over_the_model_axis_and_match_one_device(folders, tmp_path):
    bad = tmp_path / "kv4"
    cfg = json.loads((folders["e6k1_every_second"] / "config.json").read_text())
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 4, "num_key_value_heads": 4}))
    env = {k: v for k, v in os.environ.items() if k != "DART_JAX_TEST_XLA_CACHE"}
    env.update(JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4")
    done = subprocess.run([sys.executable, "-c", SHARDED, str(folders["e8k3_norm_mlp_only"]), str(bad)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "SHARDED OK" in done.stdout, done.stdout[-3000:] + done.stderr[-5000:]


def _train_on_moe(tmp_path, epochs: int):
    """`train --base` on a Qwen3-MoE folder (regenerating the replies with the target): its metrics,
    and for each regenerated sample greedy DART and plain decoding of the prompt (16 tokens)."""
    from dart_jax.train.__main__ import main
    from dart_jax.train.data import load_tokenizer

    base = write_hf_moe(tmp_path / "base", seed=5, layers=4, num_experts=4, num_experts_per_tok=2)
    make_tiny_tokenizer(base, vocab_size=VOCAB)
    rng = np.random.default_rng(5)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": "".join(rng.choice(list("abcdefgh"), 6))},
        {"role": "assistant", "content": "x"}]}) + "\n" for _ in range(2)))
    out = tmp_path / "run"
    main(["--base", str(base), "--data", str(data), "--out", str(out), "--draft-length", "3", "--draft-vocab", "64",
          "--max-length", "48", "--anchors-per-seq", "8", "--no-progress", "--batch-size", "2", "--epochs", str(epochs),
          "--lr", "2e-2", "--save-every", "1000", "--log-every", "50", "--regenerate", "--regen-max-new", "16"])
    metrics = json.loads((out / "metrics.json").read_text())
    model = DartModel.from_pretrained(str(base), str(out / "head"), ngram=False, keep=30, dtype="float32")
    tok = load_tokenizer(base)
    runs = []
    for line in (out / "regenerated.jsonl").read_text().splitlines():
        messages = json.loads(line)["messages"]
        prompt = tok(tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
        runs.append((model.generate(prompt, max_new_tokens=16), model.generate_ar(prompt, max_new_tokens=16)))
    return metrics, runs


@pytest.mark.extended
def test_train_a_dart_head_on_an_moe_target(request, tmp_path):
    """`train --base` runs on a Qwen3-MoE target (its taps, its regenerated replies) and exports a
    head that decodes losslessly over it (a few epochs: that the head learns is the slow test's)."""
    if in_own_process(request):
        return
    metrics, runs = _train_on_moe(tmp_path, epochs=3)
    assert metrics["step"] == 3 and np.isfinite(metrics["loss"]) and runs  # 2 samples, batch 2: a step an epoch
    for spec, ar in runs:
        assert list(spec.token_ids) == list(ar.token_ids)


@pytest.mark.slow
def test_a_dart_head_trained_on_an_moe_target_learns_its_replies(request, tmp_path):
    """Trained long enough, the head predicts the MoE target's replies from its taps: greedy DART
    stays exact and accepts its drafts."""
    if in_own_process(request):
        return
    metrics, runs = _train_on_moe(tmp_path, epochs=150)
    assert metrics["alpha"][0] > 0.8, metrics
    for spec, ar in runs:
        assert list(spec.token_ids) == list(ar.token_ids)
        assert np.mean(spec.accept_lengths) > 1.5, spec.accept_lengths


def test_bench_shapes_counts_an_moe_shape_parameters(folders):
    from dart_jax.bench.shapes import MOE_SHAPES, param_count

    folder = folders["e8k3_norm_mlp_only"]
    assert param_count(json.loads((folder / "config.json").read_text())) == sum(
        p.numel() for p in hf_model(folder).parameters())
    fields = MOE_SHAPES["Qwen3-30B-A3B"]
    embedding = 2 * fields["vocab_size"] * fields["hidden_size"]  # untied
    # the model card's totals: 30.5 B, 29.9 B without the embeddings
    assert round(param_count(fields) / 1e9, 1) == 30.5 and round((param_count(fields) - embedding) / 1e9, 1) == 29.9
