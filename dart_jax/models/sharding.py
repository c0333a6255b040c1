"""Placing parameters and caches on a device Mesh from their logical axis names.

Every parameter carries `logical_axes` metadata (see `layers.param`); a rules table maps each
logical axis to a mesh axis (or None = replicated). Mesh axes that the mesh lacks, and dimensions
that do not divide evenly over their mesh axis, fall back to replication, so one table serves a
1-device CPU run and a multi-device mesh alike.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .qwen3 import CACHE_AXES

DEFAULT_RULES: Mapping[str, str | None] = {
    "batch": "data",
    "seq": None,
    "heads": "model",
    "kv_heads": "model",
    "head_dim": None,
    "embed": None,
    "mlp": "model",
    "vocab": "model",
    "layers": None,
}


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, str | None] = DEFAULT_RULES) -> PartitionSpec:
    """The PartitionSpec for an array of `shape` whose dimensions are named `axes`."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match the array shape {tuple(shape)}.")
    spec, used = [], set()
    for name, dim in zip(axes, shape):
        mesh_axis = rules.get(name) if name is not None else None
        if (mesh_axis is None or mesh_axis not in mesh.shape or mesh_axis in used
                or dim % mesh.shape[mesh_axis] != 0):
            spec.append(None)
        else:
            spec.append(mesh_axis)
            used.add(mesh_axis)
    return PartitionSpec(*spec)


def named_sharding(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                   rules: Mapping[str, str | None] = DEFAULT_RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def shard_module(module: nnx.Module, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES) -> nnx.Module:
    """Move every parameter of `module` (in place) to its NamedSharding on `mesh`; returns the module."""
    for _, var in nnx.iter_graph(module):
        if isinstance(var, nnx.Variable):
            axes = var.get_metadata().get("logical_axes")
            value = var[...]
            if axes is None:
                axes = (None,) * value.ndim
            var.set_value(jax.device_put(value, named_sharding(axes, value.shape, mesh, rules)))
    return module


def shard_cache(cache, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES):
    """Place a `qwen3.KVCache` ([layers, batch, seq, kv_heads, head_dim]) on `mesh`."""
    return jax.tree.map(lambda a: jax.device_put(a, named_sharding(CACHE_AXES, a.shape, mesh, rules)), cache)
