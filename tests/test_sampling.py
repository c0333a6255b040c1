"""dart_jax.decoding.sampling: vocab_argmax against NumPy's argmax (the oracle): first index on
ties, the first NaN where there is one, any leading shape; the greedy-or-sampling branch chosen on
the host (`SamplingParams.all_greedy`) against NumPy's argmax and against the device's branch."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.decoding import sampling
from dart_jax.decoding.sampling import SamplingParams, accept_trees, sample_tokens, vocab_argmax


def test_vocab_argmax_is_numpy_argmax_with_ties_and_nans():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 1000)).astype(np.float32)
    x[0, 0, [10, 500, 999]] = 50.0  # a three-way tie: the first wins
    x[1, 1, [7, 3]] = np.nan  # NaN counts as the largest, the first one
    x[2, 2] = -np.inf
    x[2, 2, 998] = np.inf
    x[3, 0] = 1.0  # all equal
    x = np.concatenate([x, rng.integers(-3, 3, (4, 3, 1000)).astype(np.float32)], axis=1)  # many ties
    got = np.asarray(vocab_argmax(jnp.asarray(x)))
    assert got.dtype == np.int32 and got.shape == x.shape[:-1]
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(vocab_argmax(jnp.asarray(x[0, 0]))), np.argmax(x[0, 0]))


def _has_cond(jaxpr) -> bool:
    """Whether a jaxpr (nested ones included: they print inside it) holds a `lax.cond`."""
    return " cond[" in str(jaxpr)


def test_host_branch_matches_the_device_branch_and_compiles_no_cond(monkeypatch):
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.standard_normal((3, 50)).astype(np.float32) * 3)
    keys = jax.random.split(jax.random.key(0), 3)
    greedy_rows = SamplingParams.rows([(0.0, 1.0, 0)] * 3)
    mixed_rows = SamplingParams.rows([(0.0, 1.0, 0), (0.8, 0.9, 20), (1.0, 1.0, 0)])
    assert greedy_rows.all_greedy is None and mixed_rows.all_greedy is None  # on a CPU: decided on the device
    monkeypatch.setattr(sampling, "host_branch", lambda: True)  # as on an accelerator
    assert SamplingParams.rows([(0.0, 1.0, 0)] * 3).all_greedy is True
    assert SamplingParams.rows([(0.0, 1.0, 0), (0.8, 0.9, 20)]).all_greedy is False
    static_greedy = dataclasses.replace(greedy_rows, all_greedy=True)
    static_mixed = dataclasses.replace(mixed_rows, all_greedy=False)

    np.testing.assert_array_equal(np.asarray(sample_tokens(keys, logits, static_greedy)), np.argmax(logits, axis=-1))
    np.testing.assert_array_equal(np.asarray(sample_tokens(keys, logits, static_mixed)),
                                  np.asarray(sample_tokens(keys, logits, mixed_rows)))
    assert np.asarray(sample_tokens(keys, logits, static_mixed))[0] == np.argmax(logits[0])  # a greedy row stays so

    # acceptance of 3 chain trees root -> 1 -> 2 over a 50-token vocabulary
    tokens = jnp.asarray(np.tile([5, 7, 9], (3, 1)).astype(np.int32))
    parents = jnp.asarray(np.tile([-1, 0, 1], (3, 1)).astype(np.int32))
    retrieve = jnp.asarray(np.tile([[0, 1, 2]], (3, 1, 1)).astype(np.int32))
    tree_logits = jnp.asarray(rng.standard_normal((3, 3, 50)).astype(np.float32))
    tree_logits = tree_logits.at[0, 0, 7].set(9.0)  # row 0: the argmax at the root is node 1's token
    got = accept_trees(keys, tree_logits, static_greedy, tokens, parents, retrieve)
    argmax = np.argmax(np.asarray(tree_logits), axis=-1)
    for b in range(3):  # the greedy oracle: walk the chain while the token is the argmax at its parent
        count, node = 1, 0
        while node < 2 and int(tokens[b, node + 1]) == argmax[b, node]:
            count, node = count + 1, node + 1
        assert int(got.count[b]) == count and int(got.bonus[b]) == argmax[b, node]
    for a, b in zip(accept_trees(keys, tree_logits, static_mixed, tokens, parents, retrieve),
                    accept_trees(keys, tree_logits, mixed_rows, tokens, parents, retrieve)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def fn(params):
        return jax.make_jaxpr(lambda lg: accept_trees(keys, lg, params, tokens, parents, retrieve))(tree_logits)

    assert _has_cond(fn(greedy_rows))  # decided on the device: a branch
    assert not _has_cond(fn(static_greedy)) and not _has_cond(fn(static_mixed))
    assert " sort[" in str(fn(static_mixed)) and " sort[" not in str(fn(static_greedy))  # no sampling work at all
    assert not _has_cond(jax.make_jaxpr(lambda lg: sample_tokens(keys, lg, static_greedy))(logits))


def _np_probs(logits: np.ndarray, temperature: float, top_p: float, top_k: int) -> np.ndarray:
    """The sampling pipeline restated in NumPy (docs/spec.md §4): temperature, then top-p (drop
    the tokens whose ascending cumulative probability is <= 1 - top_p, never the most likely),
    then top-k (drop those below the k-th largest surviving logit), then softmax."""
    x = logits.astype(np.float64) / temperature
    if top_p < 1.0:
        order = np.argsort(x, kind="stable")
        p = np.exp(x[order] - x.max())
        cum = np.cumsum(p / p.sum())
        drop = cum <= 1.0 - top_p
        drop[-1] = False
        x[order[drop]] = -np.inf
    if top_k > 0:
        kth = np.sort(x)[-top_k]
        x[x < kth] = -np.inf
    e = np.exp(x - x.max())
    return e / e.sum()


def _sorts(item) -> bool:
    """Whether a jaxpr or an equation sorts, nested jaxprs included (they print inside it)."""
    return " sort[" in str(item)


def test_rows_without_filters_skip_the_vocabulary_sort_on_a_cpu():
    """Sampling rows with top_p 1 and top_k 0 (the defaults) need no sort of the vocabulary: on a CPU
    the sort sits in the one branch of a `lax.cond` that runs where some row filters. Oracle: the
    NumPy restatement of the pipeline, row by row, for a batch without filters and a batch where one
    row filters; and the program's own structure (its sort inside the branch only)."""
    assert not sampling.host_branch()  # these tests run on a CPU
    rng = np.random.default_rng(3)
    logits = (2 * rng.standard_normal((3, 200))).astype(np.float32)
    for rows in ([(0.7, 1.0, 0), (1.0, 1.0, 0), (1.6, 1.0, 0)],  # no row filters: the branch without the sort
                 [(0.7, 1.0, 0), (1.3, 0.6, 0), (0.9, 1.0, 7)]):  # two rows filter: every row through the filters
        got = np.asarray(sampling.process_logits(jnp.asarray(logits), SamplingParams.rows(rows)))
        for row, (t, p, k) in enumerate(rows):
            want = _np_probs(logits[row], t, p, k)
            np.testing.assert_allclose(got[row], want, atol=1e-6)
            np.testing.assert_array_equal(got[row] > 0, want > 0)
    jaxpr = jax.make_jaxpr(sampling.process_logits)(jnp.asarray(logits), SamplingParams.rows([(0.7, 1.0, 0)] * 3))
    conds = [eqn for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "cond"]
    assert len(conds) == 1 and not any(_sorts(eqn) for eqn in jaxpr.jaxpr.eqns if eqn not in conds)
    assert sorted(_sorts(branch) for branch in conds[0].params["branches"]) == [False, True]


def test_row_keys_are_jax_keys_of_the_seeds_and_moves_compile_nothing():
    """`row_keys` gives each seed's `jax.random.key` (JAX's own function the oracle, over the
    range of seeds a request may bring) and, like `to_device`, compiles no program: eager
    `jax.random.key`, `jnp.stack` and `jnp.asarray` each compile one per shape in this JAX."""
    from test_engine import compilations

    seeds = [0, 1, 5, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 7, 2**62 + 3, 2**63 - 1]
    expected = np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])
    host = np.arange(11, dtype=np.int64).reshape(1, 11)
    with compilations() as compiled:
        keys = sampling.row_keys(seeds)
        moved = sampling.to_device(host)
        params = SamplingParams.rows([(0.7, 0.9, 5), (0.0, 1.0, 0), (1.3, 0.5, 0)])
    assert compiled == []
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(keys)), expected)
    assert keys.dtype == jax.random.key(0).dtype and keys.shape == (len(seeds),)
    reference = jnp.asarray(host)
    assert moved.aval == reference.aval and not moved.committed
    np.testing.assert_array_equal(np.asarray(moved), np.asarray(reference))
    assert [np.asarray(f).tolist() for f in (params.greedy, params.top_k)] == [[False, True, False], [5, 0, 0]]
    np.testing.assert_allclose(np.asarray(params.top_p), [0.9, 1.0, 0.5])
