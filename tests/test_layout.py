"""The step's transfer layout: packed on the device and unpacked on the host by one declaration."""
from __future__ import annotations

import struct

import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.layout import Field, Layout, step_layout, tree_layout


def float_bits(x: float) -> int:
    """The int32 whose bits are the float32 `x` (the oracle for the bit cast)."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def test_pack_is_the_fields_in_order_and_unpack_inverts_it():
    rng = np.random.default_rng(0)
    depth, k, b = 3, 4, 2
    layout = step_layout(depth, DartDrafter.proposal_fields(depth, k))
    assert [f.name for f in layout.fields] == ["count", "path_tokens", "bonus", "cand_ids", "cand_probs"]
    arrays = {"count": rng.integers(1, depth + 2, b).astype(np.int32),
              "path_tokens": rng.integers(0, 1000, (b, depth + 1)).astype(np.int32),
              "bonus": rng.integers(0, 1000, b).astype(np.int32),
              "cand_ids": rng.integers(0, 1000, (b, depth, k)).astype(np.int32),
              "cand_probs": rng.random((b, depth, k)).astype(np.float32)}
    device = np.asarray(layout.pack({name: jnp.asarray(a) for name, a in arrays.items()}))
    host = layout.pack(arrays)
    assert device.dtype == np.int32 and device.shape == (b, layout.size) == (b, 1 + (depth + 1) + 1 + 2 * depth * k)
    np.testing.assert_array_equal(device, host)
    for row in range(b):
        want = ([int(arrays["count"][row])] + arrays["path_tokens"][row].tolist() + [int(arrays["bonus"][row])]
                + arrays["cand_ids"][row].ravel().tolist()
                + [float_bits(float(p)) for p in arrays["cand_probs"][row].ravel()])
        assert device[row].tolist() == want
    out = layout.unpack(device)
    for name, a in arrays.items():
        assert out[name].dtype == a.dtype and out[name].shape == a.shape
        np.testing.assert_array_equal(out[name], a)
    on_device = layout.unpack(jnp.asarray(device))
    np.testing.assert_array_equal(np.asarray(on_device["cand_probs"]), arrays["cand_probs"])


def test_tree_layout_round_trips_booleans_and_rejects_wrong_shapes():
    n, depth = 5, 2
    layout = tree_layout(n, depth)
    mask = np.tril(np.ones((1, n, n), bool))
    arrays = {"tokens": np.arange(n, dtype=np.int32)[None], "positions": np.zeros((1, n), np.int32),
              "parents": np.full((1, n), -1, np.int32), "mask": mask,
              "retrieve": np.full((1, n - 1, depth + 1), -1, np.int32)}
    packed = layout.pack(arrays)
    assert packed.shape == (1, 3 * n + n * n + (n - 1) * (depth + 1))
    back = layout.unpack(packed)
    assert back["mask"].dtype == np.bool_
    np.testing.assert_array_equal(back["mask"], mask)
    with pytest.raises(ValueError, match="retrieve"):
        layout.pack({**arrays, "retrieve": np.zeros((1, n, depth + 1), np.int32)})
    with pytest.raises(ValueError, match="fields"):
        layout.pack({"tokens": arrays["tokens"]})
    with pytest.raises(ValueError, match="dtype"):
        Layout((Field("x", (2,), "float64"),))
