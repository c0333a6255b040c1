"""The Pallas attention kernel (`dart_jax.models.pallas_attention`, attention "pallas"), in Pallas'
interpret mode on this CPU: alone against a plain NumPy restatement of masked grouped-query
attention; inside Qwen3's cached forwards against transformers; and greedy DART with it against
plain greedy decoding with XLA's attention."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.api.model import DartModel
from dart_jax.bench.tiny import make_tiny_qwen3, make_tiny_setup
from dart_jax.errors import InputError
from dart_jax.models import qwen3 as qwen3_module
from dart_jax.models.checkpoints import load_qwen3
from dart_jax.models.pallas_attention import attention_rows, tree_attention
from dart_jax.models.qwen3 import check_attention, init_cache


def masked_gqa_attention(q, k_cache, v_cache, cache_lens, k_new, v_new, mask, scale):
    """The oracle, in float64: query head h of token j (KV head h // G) attends to cache slots
    s < cache_lens[b, j] and to new token i where mask[b, j, i], one softmax over both; a query
    that sees nothing gives zeros."""
    b, t, hq, d = q.shape
    s, hkv = k_cache.shape[1], k_cache.shape[2]
    out = np.zeros((b, t, hq, d))
    for bi in range(b):
        for j in range(t):
            sees_cache = np.arange(s) < cache_lens[bi, j]
            sees_new = np.zeros(0, bool) if mask is None else mask[bi, j]
            for h in range(hq):
                kv = h // (hq // hkv)
                keys, values = k_cache[bi, sees_cache, kv], v_cache[bi, sees_cache, kv]
                if mask is not None:
                    keys = np.concatenate([keys, k_new[bi, sees_new, kv]])
                    values = np.concatenate([values, v_new[bi, sees_new, kv]])
                if not len(keys):
                    continue
                scores = keys.astype(np.float64) @ q[bi, j, h].astype(np.float64) * scale
                weights = np.exp(scores - scores.max())
                out[bi, j, h] = weights @ values / weights.sum()
    return out


def random_tree(rng, n):
    """An ancestor mask [n, n] (a node sees itself and its ancestors) of a random tree whose node
    i's parent is one of nodes 0..i-1, and each node's depth."""
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    mask = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    return mask, mask.sum(1) - 1


# (q heads, KV heads, head dim, window slots S, cache lengths per sequence, the tree: chain or branching)
CASES = {
    "gqa1_chain_from_0": (2, 2, 16, 64, (0, 0), "chain"),
    "gqa2_tree_later": (4, 2, 16, 128, (100, 37), "tree"),  # two slot blocks: the online softmax rescales
    "gqa4_tree_padded_sides": (8, 2, 12, 40, (40, 3), "tree"),  # D and S padded to the kernel's sides
    "mqa_chain_later": (4, 1, 8, 96, (0, 90), "chain"),
    "gqa3_tree_full_window": (6, 2, 16, 64, (64, 64), "tree"),  # a ratio that is not a power of two
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_masked_gqa_attention(name):
    hq, hkv, d, s, lens, shape = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    b, t, layers, layer = 2, 7, 3, 1
    if shape == "chain":
        mask = np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t))
    else:
        mask = np.stack([random_tree(rng, t)[0] for _ in range(b)])
        assert mask.sum(-1).max() < t, "the trees should branch"
    q = rng.standard_normal((b, t, hq, d), dtype=np.float32)
    k_cache, v_cache = (rng.standard_normal((layers, b, s, hkv, d), dtype=np.float32) for _ in range(2))
    k_new, v_new = (rng.standard_normal((b, t, hkv, d), dtype=np.float32) for _ in range(2))
    cache_lens = np.repeat(np.asarray(lens, np.int32)[:, None], t, axis=1)
    scale = d ** -0.5
    rows = attention_rows(jnp.asarray(cache_lens), jnp.asarray(mask), hq // hkv)
    got = tree_attention(jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache), rows, jnp.asarray(k_new),
                         jnp.asarray(v_new), scale=scale, layer=layer)
    assert got.shape == q.shape and got.dtype == jnp.float32
    want = masked_gqa_attention(q, k_cache[layer], v_cache[layer], cache_lens, k_new, v_new, mask, scale)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def test_kernel_without_tree_nodes_is_causal_over_the_cache():
    """`extend`'s use: no tree nodes, token j sees the slots up to its own (lengths growing by one
    a row); a row whose length is 0 sees nothing and gives zeros."""
    rng = np.random.default_rng(7)
    b, t, hq, hkv, d, s = 2, 5, 4, 2, 16, 64
    q = rng.standard_normal((b, t, hq, d), dtype=np.float32)
    k_cache, v_cache = (rng.standard_normal((1, b, s, hkv, d), dtype=np.float32) for _ in range(2))
    cache_lens = np.array([[10], [0]], np.int32) + np.array([[1, 2, 3, 4, 5], [0, 0, 1, 2, 3]], np.int32)
    rows = attention_rows(jnp.asarray(cache_lens), None, hq // hkv)
    got = np.asarray(tree_attention(jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache), rows, scale=0.3))
    want = masked_gqa_attention(q, k_cache[0], v_cache[0], cache_lens, None, None, None, 0.3)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert not got[1, :2].any()


@pytest.mark.parametrize("backend, platform, call", [("gpu", "cuda", "__gpu$xla.gpu.triton"),
                                                     ("tpu", "tpu", "tpu_custom_call")])
def test_kernel_lowers_for_triton_and_mosaic(backend, platform, call):
    """The same source lowered on this CPU for a GPU (Triton) and a TPU (Mosaic), at the Qwen3-8B
    attention shape in bfloat16: a 61-node tree's verify, a prefill and a decoding step. (The
    backends' own compilers run on their devices only; this is what Pallas checks before them:
    block shapes, power-of-two tensors for Triton, (8, 128) tiles for Mosaic.)"""
    b, hq, hkv, d, s, layers = 1, 32, 8, 128, 256, 2
    kv = jax.ShapeDtypeStruct((layers, b, s, hkv, d), jnp.bfloat16)
    for t, tree in ((61, True), (64, False), (1, False)):
        q = jax.ShapeDtypeStruct((b, t, hq, d), jnp.bfloat16)
        new = jax.ShapeDtypeStruct((b, t, hkv, d), jnp.bfloat16)

        def forward(q, k_cache, v_cache, lens, mask, k_new, v_new):
            rows = attention_rows(lens, mask if tree else None, hq // hkv)
            return tree_attention(q, k_cache, v_cache, rows, *((k_new, v_new) if tree else ()), scale=d ** -0.5,
                                  layer=1, backend=backend)

        lowered = jax.jit(forward).trace(q, kv, kv, jax.ShapeDtypeStruct((b, t), jnp.int32),
                                         jax.ShapeDtypeStruct((b, t, t), jnp.bool_), new, new)
        text = lowered.lower(lowering_platforms=(platform,)).as_text()
        assert text.count(f"custom_call @{call}(") == 1, (t, tree)


def hf_logits(folder, ids):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids))).logits.numpy()


@pytest.mark.extended
def test_qwen3_cached_forwards_with_pallas_match_transformers(tmp_path, monkeypatch):
    """attention "pallas": a cached prefill, a decoding step, and a branching tree verified against
    the cache (one sequence 12 tokens in, the other none: a verify without a prefill) give
    transformers' logits: for the tree, of each root-to-node path after its sequence's prefix."""
    calls = []
    real = qwen3_module.tree_attention
    monkeypatch.setattr(qwen3_module, "tree_attention", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    folder = make_tiny_qwen3(tmp_path / "q", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, seed=3)
    model = load_qwen3(folder, dtype=jnp.float32)
    model.use_attention("pallas")
    cfg = model.config
    rng = np.random.default_rng(11)
    prefill, n = 12, 6
    ids = rng.integers(3, cfg.vocab_size, (2, prefill + 1)).astype(np.int32)
    ref = hf_logits(folder, ids)
    cache = init_cache(cfg, 2, 32, jnp.float32)
    hidden, _, cache = model.extend(jnp.asarray(ids[:, :prefill]), cache, jnp.zeros(2, jnp.int32))
    np.testing.assert_allclose(np.asarray(model.lm_logits(hidden)), ref[:, :prefill], atol=1e-4, rtol=0)
    hidden, _, _ = model.extend(jnp.asarray(ids[:, prefill:]), cache, jnp.full(2, prefill, jnp.int32))
    np.testing.assert_allclose(np.asarray(model.lm_logits(hidden))[:, 0], ref[:, prefill], atol=1e-4, rtol=0)
    assert calls == [(2, prefill, 4, 8)] * 3 + [(2, 1, 4, 8)] * 3  # every layer through the kernel

    trees = [random_tree(rng, n) for _ in range(2)]
    tokens = rng.integers(3, cfg.vocab_size, (2, n)).astype(np.int32)
    prefix_lens = np.array([prefill, 0], np.int32)
    positions = prefix_lens[:, None] + np.stack([depth for _, depth in trees])
    hidden, _, _ = model.verify(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(np.stack([m for m, _ in trees])),
                                cache, jnp.asarray(prefix_lens))
    got = np.asarray(model.lm_logits(hidden))
    paths = np.zeros((2 * n, prefill + n), np.int32)  # right padding: a causal forward's path end is unchanged
    ends = []
    for b, (mask, _) in enumerate(trees):
        for i in range(n):
            seq = np.concatenate([ids[b, :prefix_lens[b]], tokens[b, mask[i]]])
            paths[b * n + i, :len(seq)] = seq
            ends.append(len(seq) - 1)
    want = hf_logits(folder, paths)[np.arange(2 * n), ends]
    np.testing.assert_allclose(got.reshape(2 * n, -1), want, atol=1e-4, rtol=0)


def test_greedy_dart_with_pallas_equals_plain_decoding(tmp_path, monkeypatch):
    """DartModel.from_pretrained(attention="pallas"): greedy DART, its verify and its own plain
    decoding through the kernel, gives the tokens of plain greedy decoding with XLA's attention."""
    calls = []
    real = qwen3_module.tree_attention
    monkeypatch.setattr(qwen3_module, "tree_attention", lambda *a, **k: calls.append(a[0].shape[1]) or real(*a, **k))
    base, head, trie = make_tiny_setup(tmp_path, vocab_size=200, draft_length=3, num_hidden_layers=3, seed=4)
    plain = DartModel.from_pretrained(base, head, trie, min_bucket=64, keep=8)
    model = DartModel.from_pretrained(base, head, trie, min_bucket=64, keep=8, attention="pallas")
    assert model.target.attention_kernel == "pallas" and plain.target.attention_kernel == "xla"
    for prompt in ([5, 6, 7, 8, 9], [30, 31, 32]):
        want = plain.generate_ar(prompt, max_new_tokens=16, chat=False).token_ids
        assert model.generate(prompt, max_new_tokens=16, chat=False).token_ids == want and len(want) == 16
    # (recorded where a program is traced: its prefill of the 64-token bucket and its 9-node verify)
    assert {64, 9} <= set(calls), "the prefill or the tree's verify did not go through the kernel"


def test_pallas_attention_is_checked():
    """The kernel runs on any backend and dtype, on one device: over a mesh it is refused with the fix."""
    assert check_attention("pallas", jnp.float32) == "pallas"
    with pytest.raises(InputError, match=r"attention \"pallas\" \(--attention\) runs on one device, not over a mesh"):
        check_attention("pallas", jnp.bfloat16, mesh=object())
