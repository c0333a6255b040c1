"""dart_jax.decoding.sampling.vocab_argmax against NumPy's argmax (the oracle): first index on
ties, the first NaN where there is one, any leading shape."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dart_jax.decoding.sampling import vocab_argmax


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
