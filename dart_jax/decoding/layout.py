"""What crosses between host and device in a step, declared once.

A `Layout` names int32 / float32 / bool fields with per-sequence shapes and packs them into one
int32 array [B, size] (floats bit-cast, booleans as 0/1), so each direction of a step is a
single transfer. The same declaration packs and unpacks with NumPy (host) or jax.numpy (device).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

_DTYPES = ("int32", "float32", "bool")


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    shape: tuple[int, ...]
    dtype: str = "int32"

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"field {self.name}: dtype must be one of {_DTYPES}, got {self.dtype!r}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Layout:
    fields: tuple[Field, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.fields)

    def pack(self, arrays: Mapping[str, object]) -> object:
        """Arrays [B, *shape] per field (all NumPy, or all JAX) → int32 [B, size] of the same kind."""
        names = {f.name for f in self.fields}
        if set(arrays) != names:
            raise ValueError(f"layout fields {sorted(names)} but got arrays {sorted(arrays)}")
        host = all(isinstance(a, np.ndarray) for a in arrays.values())
        xp = np if host else jnp
        parts = []
        for f in self.fields:
            a = xp.asarray(arrays[f.name])
            b = a.shape[0]
            if tuple(a.shape[1:]) != f.shape:
                raise ValueError(f"field {f.name}: expected shape [B, {', '.join(map(str, f.shape))}], got {a.shape}")
            if f.dtype == "float32":
                a = a.astype(np.float32).view(np.int32) if host else jax.lax.bitcast_convert_type(
                    a.astype(jnp.float32), jnp.int32)
            parts.append(a.astype(xp.int32).reshape(b, f.size))
        return xp.concatenate(parts, axis=1)

    def unpack(self, packed) -> dict[str, object]:
        """int32 [B, size] (NumPy or JAX) → arrays [B, *shape] per field, in each field's dtype."""
        host = isinstance(packed, np.ndarray)
        b, out, at = packed.shape[0], {}, 0
        for f in self.fields:
            a = packed[:, at:at + f.size].reshape(b, *f.shape)
            at += f.size
            if f.dtype == "float32":
                a = a.view(np.float32) if host else jax.lax.bitcast_convert_type(a, jnp.float32)
            elif f.dtype == "bool":
                a = a > 0
            out[f.name] = a
        return out


def tree_layout(nodes: int, depth: int) -> Layout:
    """A draft tree of `nodes` slots (root included) and leaf paths of `depth` + 1 nodes, host → device."""
    return Layout((Field("tokens", (nodes,)), Field("positions", (nodes,)), Field("parents", (nodes,)),
                   Field("mask", (nodes, nodes), "bool"), Field("retrieve", (nodes - 1, depth + 1))))


def prefill_layout(proposal: tuple[Field, ...]) -> Layout:
    """What the prefill returns: the first token and the drafter's proposal."""
    return Layout((Field("first", ()),) + proposal)


def step_layout(depth: int, proposal: tuple[Field, ...]) -> Layout:
    """What a step returns: accepted nodes (root included) `count`, the tokens of the accepted path
    (entries past `count` are junk), the bonus token, and the drafter's next proposal."""
    return Layout((Field("count", ()), Field("path_tokens", (depth + 1,)), Field("bonus", ())) + proposal)


def plain_layout(chunk: int, proposal: tuple[Field, ...]) -> Layout:
    """What a plain chunk (no tree) sends to the host: the tokens it decoded per sequence (count of
    them real, -1 after) and the drafter's proposal after them."""
    return Layout((Field("count", ()), Field("tokens", (chunk,))) + proposal)


def device_steps_layout(steps: int, depth: int, preceding: int, proposal: tuple[Field, ...], *,
                        extra: tuple[Field, ...] = ()) -> Layout:
    """What a device loop of up to `steps` speculative steps returns per sequence: `n_out` tokens
    committed (`out`, -1 after), the accepted length of each step (`counts`, 0 for a step it did not
    take), and the next call's start: the preceding ids (the first `preceding_len`) and the
    drafter's proposal; then `extra` (a `device_tree.TreeEdit`'s fields)."""
    return Layout((Field("n_out", ()), Field("out", (steps * (depth + 1),)), Field("counts", (steps,)),
                   Field("preceding", (preceding,)), Field("preceding_len", ())) + proposal + extra)
