"""Training building blocks against plain NumPy restatements and the inference head."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dart_jax.convert.dart_head import DartHeadConfig
from dart_jax.models.head import DartHead
from dart_jax.train.forward import shifted_ids, train_draft_logits
from dart_jax.train.loss import annealed_kl, annealed_kl_projected, expected_length, first_argmax, row_accuracy
from dart_jax.train.masks import packed_attention_mask, packed_positions, query_index, sample_anchors
from dart_jax.train.vocab import build_draft_vocab, used_from_d2t


def numpy_mask(t, anchors, m):
    """docs/spec.md §7 block mask by loops over (query, key) pairs of one sequence."""
    k = len(anchors)
    n = t + k * m
    mask = np.zeros((n, n), bool)
    for q in range(n):
        for key in range(n):
            if q < t:
                mask[q, key] = key < t and key <= q
            else:
                block, slot = divmod(q - t, m)
                if key < t:
                    mask[q, key] = key <= anchors[block]
                else:
                    kb, ks = divmod(key - t, m)
                    mask[q, key] = kb == block and ks <= slot
    return mask


def test_block_mask_and_positions_match_loops():
    t, m = 9, 3
    anchors = np.array([[0, 4, 7], [2, 2, 5]], np.int32)
    @jax.jit
    def layout(a):
        rows = query_index(t, a, m)
        return (packed_attention_mask(t, a, m), packed_positions(t, a, m), rows,
                packed_attention_mask(t, a, m, rows.reshape(a.shape[0], -1)))

    full, pos, rows, sub = map(np.asarray, layout(jnp.asarray(anchors)))
    for b in range(2):
        ref = numpy_mask(t, anchors[b], m)
        np.testing.assert_array_equal(full[b], ref)
        np.testing.assert_array_equal(sub[b], ref[rows[b].reshape(-1)])
        expect_pos = list(range(t)) + [a + s for a in anchors[b] for s in range(1, m + 1)]
        np.testing.assert_array_equal(pos[b], expect_pos)
        for j, a in enumerate(anchors[b]):
            assert rows[b, j, 0] == a and list(rows[b, j, 1:]) == [t + j * m + s for s in range(m)]


def test_sample_anchors_only_where_first_row_has_a_target():
    mask = np.array([0, 0, 0, 1, 1, 0, 1, 1, 0, 0], bool)
    rng = np.random.default_rng(0)
    anchors, valid = sample_anchors(mask, 9, 8, rng)
    assert sorted(anchors[valid]) == [a for a in range(7) if mask[a + 2]]
    anchors, valid = sample_anchors(mask, 9, 2, rng)
    assert valid.all() and all(mask[a + 2] for a in anchors) and anchors[0] < anchors[1]


def test_annealed_kl_matches_numpy():
    rng = np.random.default_rng(1)
    b, k, d, v, gamma = 2, 3, 4, 7, 0.6
    p = rng.normal(size=(b, k, d, v)).astype(np.float32)
    q = 2 * rng.normal(size=(b, k, d, v)).astype(np.float32)
    valid = rng.random((b, k, d)) > 0.3
    valid[0, 0, 0] = True
    loss, sums = jax.jit(annealed_kl, static_argnums=3)(jnp.asarray(p), jnp.asarray(q), jnp.asarray(valid), gamma)
    total, anchors = 0.0, 0
    kl_rows, correct, count = np.zeros(d), np.zeros(d), np.zeros(d)
    for i in range(b):
        for j in range(k):
            anchors += valid[i, j, 0]
            for r in range(d):
                if not valid[i, j, r]:
                    continue
                qs = np.exp(q[i, j, r] - q[i, j, r].max()); qs /= qs.sum()
                ps = np.exp(p[i, j, r] - p[i, j, r].max()); ps /= ps.sum()
                kl = float(np.sum(qs * (np.log(qs) - np.log(ps))))
                total += gamma ** r * kl
                kl_rows[r] += kl
                correct[r] += np.argmax(p[i, j, r]) == np.argmax(q[i, j, r])
                count[r] += 1
    np.testing.assert_allclose(float(loss), total / anchors, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sums["kl"]), kl_rows, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(sums["correct"]), correct)
    np.testing.assert_array_equal(np.asarray(sums["count"]), count)
    alpha = row_accuracy(correct, count)
    tau = 1.0 + sum(np.prod(alpha[: r + 1]) for r in range(d))
    assert expected_length(alpha) == pytest.approx(tau)


def numpy_projected_loss(h, w, t, valid, gamma):
    """float64: the annealed KL of the draft logits h @ w against teacher logits t, and its
    gradients in h and w from d loss / d logits = γ^r (softmax(h @ w) − softmax(t)) / anchors."""
    z = h @ w
    p = np.exp(z - z.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    q = np.exp(t - t.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
    kl = np.sum(q * (np.log(q) - np.log(p)), -1)
    weight = valid * gamma ** np.arange(valid.shape[-1]) / max(valid[..., 0].sum(), 1)
    dz = weight[..., None] * (p - q)
    flat_h, flat_dz = h.reshape(-1, h.shape[-1]), dz.reshape(-1, dz.shape[-1])
    return float(np.sum(kl * weight)), kl, dz @ w.T, flat_h.T @ flat_dz


def test_projected_kl_matches_numpy_loss_gradients_and_argmax():
    rng = np.random.default_rng(2)
    b, k, d, hidden, v, gamma = 2, 3, 4, 5, 9, 0.6
    h = rng.normal(size=(b, k, d, hidden))
    w = rng.normal(size=(hidden, v)) * 0.5
    t = 2 * rng.normal(size=(b, k, d, v))
    t[0, 0, 1] = np.round(t[0, 0, 1])  # ties: the first maximum counts, as np.argmax takes it
    t[0, 0, 1, [2, 6]] = t[0, 0, 1].max() + 1
    valid = rng.random((b, k, d)) > 0.3
    valid[0, 0, :] = True
    loss_np, kl_np, dh_np, dw_np = numpy_projected_loss(h, w, t, valid, gamma)
    # the NumPy gradient is itself checked by central differences on a few entries
    eps = 1e-6
    for idx in [(0, 0, 0, 0), (1, 2, 3, 4), (0, 1, 2, 3)]:
        up, down = h.copy(), h.copy()
        up[idx] += eps
        down[idx] -= eps
        num = (numpy_projected_loss(up, w, t, valid, gamma)[0] - numpy_projected_loss(down, w, t, valid, gamma)[0]) / (2 * eps)
        assert num == pytest.approx(dh_np[idx], rel=1e-5, abs=1e-9)
    f32 = [jnp.asarray(x, jnp.float32) for x in (h, w, t)]
    grad = jax.jit(jax.value_and_grad(lambda hh, ww: annealed_kl_projected(hh, ww, f32[2], jnp.asarray(valid), gamma),
                                      argnums=(0, 1), has_aux=True))
    (loss, sums), (dh, dw) = grad(f32[0], f32[1])
    np.testing.assert_allclose(float(loss), loss_np, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(sums["kl"]), np.sum(kl_np * valid, (0, 1)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(dh), dh_np, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dw), dw_np, rtol=1e-4, atol=1e-6)
    z = h @ w
    correct = (np.argmax(z.astype(np.float32), -1) == np.argmax(t.astype(np.float32), -1)) * valid
    np.testing.assert_array_equal(np.asarray(sums["correct"]), correct.sum((0, 1)))
    np.testing.assert_array_equal(np.asarray(sums["count"]), valid.sum((0, 1)))
    np.testing.assert_array_equal(np.asarray(first_argmax(f32[2])), np.argmax(t.astype(np.float32), -1))
    assert int(first_argmax(f32[2])[0, 0, 1]) == 2


def test_draft_vocab_most_frequent_sorted_by_id():
    samples = [(np.array([5, 1, 1, 9, 9, 9, 3]), np.array([0, 1, 1, 1, 1, 1, 0], bool)),
               (np.array([7, 7, 2]), np.array([1, 1, 1], bool))]
    used, d2t, t2d = build_draft_vocab(samples, 12, 3)
    # counts on the mask: 9→3, 1→2, 7→2, 2→1 (5 and 3 are off the mask)
    np.testing.assert_array_equal(used, [1, 7, 9])
    np.testing.assert_array_equal(d2t, [1 - 0, 7 - 1, 9 - 2])
    np.testing.assert_array_equal(np.flatnonzero(t2d), used)
    np.testing.assert_array_equal(used_from_d2t(d2t), used)
    used, _, _ = build_draft_vocab(samples, 12, 6)  # fewer distinct targets: smallest unseen ids fill in
    np.testing.assert_array_equal(used, [0, 1, 2, 3, 7, 9])
    with pytest.raises(ValueError, match="--draft-vocab"):
        build_draft_vocab(samples, 12, 13)


class Embed(nnx.Module):
    """Stands in for the target's embedding module (the head only reads `.embedding`)."""

    def __init__(self, table):
        self.embedding = nnx.Param(jnp.asarray(table))


def tiny_head(seed=0, vocab=96, hidden=32, draft_vocab=40, draft_length=3):
    """A DartHead over a random embedding, every parameter random (numpy, so no per-op compiles)."""
    rng = np.random.default_rng(seed)
    cfg = DartHeadConfig(hidden_size=hidden, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, vocab_size=vocab, draft_length=draft_length, draft_vocab_size=draft_vocab)
    head = DartHead(cfg, Embed(rng.normal(size=(vocab, hidden)).astype(np.float32)), rngs=None)
    for path, var in nnx.to_flat_state(nnx.state(head, nnx.Param)):
        shape = var.get_value().shape
        scale = 1.0 if len(shape) == 1 else 0.5
        var.set_value(jnp.asarray((1.0 if "norm" in path[-2] else 0.0) + scale * rng.normal(size=shape).astype(np.float32)))
    return head


def test_training_forward_equals_inference_head_at_every_anchor():
    head = tiny_head()
    rng = np.random.default_rng(0)
    b, t = 2, 11
    taps = jnp.asarray(rng.normal(size=(b, t, 96)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 96, size=(b, t)).astype(np.int32))
    nxt = shifted_ids(ids)
    anchors = jnp.asarray(np.array([[0, 4, 9, 4], [9, 9, 0, 4]], np.int32))
    graph, state = nnx.split(head)
    got = np.asarray(jax.jit(lambda st, *x: train_draft_logits(nnx.merge(graph, st), *x))(state, taps, nxt, anchors))
    assert got.shape == (b, 4, 4, 40)
    infer = jax.jit(lambda st, x, y: nnx.merge(graph, st)(x, y))
    for i in range(b):
        for j, a in enumerate(np.asarray(anchors[i])):
            ref = np.asarray(infer(state, taps[i:i + 1, : a + 1], nxt[i:i + 1, : a + 1]))[0]
            np.testing.assert_allclose(got[i, j], ref, rtol=2e-4, atol=2e-4)
