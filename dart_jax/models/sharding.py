"""Placing parameters and caches on a device Mesh from their logical axis names.

Every parameter carries `logical_axes` metadata (see `layers.param`), every cache its axes
(`qwen3.CACHE_AXES`, `HeadCache.axes`); a rules table maps each logical axis to a mesh axis (or
None = replicated): tensor parallelism over `model` (attention heads, KV heads, MLP width,
vocabulary), expert parallelism over `model` too (a Qwen3-MoE layer's experts: each device holds
E / model experts whole and computes them for every row, and the sum over the experts is one
all-reduce, where the dense MLP's sum over its sharded width has its own), data parallelism over
`data` (the batch slots). Mesh axes that the mesh lacks, and
dimensions that do not divide evenly over their mesh axis, fall back to replication, so one table
serves a 1-device CPU run and a multi-device mesh alike; `check_fits` turns a model whose head
counts or vocabulary the mesh does not divide into an InputError before anything is read.

Multi-host: call `jax.distributed.initialize()` in every process before `make_mesh`; the mesh
then spans the devices of all hosts, and `place` reads on each host only the slices of the
tensors that its own devices hold.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.errors import InputError

from .qwen3 import CACHE_AXES

MESH_AXES = ("data", "model")

DEFAULT_RULES: Mapping[str, str | None] = {
    "batch": "data",
    "seq": None,
    "heads": "model",
    "kv_heads": "model",
    "head_dim": None,
    "embed": None,
    "mlp": "model",
    "experts": "model",
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


def put(x, sharding: jax.sharding.Sharding):
    """`jax.device_put(x, sharding)`, also when the sharding spans the devices of several processes
    and `x` is an array on this process's devices: JAX moves only host values (every process
    passing the same one) or arrays already spread over the processes onto such a sharding."""
    if isinstance(x, jax.Array) and x.is_fully_addressable and not sharding.is_fully_addressable:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = jax.device_put(np.asarray(jax.random.key_data(x)), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        x = np.asarray(x)
    return jax.device_put(x, sharding)


def shard_module(module: nnx.Module, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES) -> nnx.Module:
    """Move every parameter of `module` (in place) to its NamedSharding on `mesh`; returns the module."""
    for _, var in nnx.iter_graph(module):
        if isinstance(var, nnx.Variable):
            axes = var.get_metadata().get("logical_axes")
            value = var[...]
            if axes is None:
                axes = (None,) * value.ndim
            var.set_value(put(value, named_sharding(axes, value.shape, mesh, rules)))
    return module


def shard_cache(cache, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES):
    """Place a cache (`qwen3.KVCache` [layers, batch, seq, kv_heads, head_dim], or one with `axes`) on `mesh`."""
    axes = cache_axes(cache)
    return jax.tree.map(lambda a: put(a, named_sharding(axes, a.shape, mesh, rules)), cache)


def make_mesh(spec: "str | Mesh | None", *, option: str = "mesh") -> Mesh | None:
    """A Mesh from a spec such as "model=4" or "data=2,model=4" (always both axes `data` and
    `model`, an axis not named of size 1, over the first data×model devices), a Mesh (returned as
    it is), or None. A bad spec, or one that needs more devices than there are, is an InputError
    naming `option`."""
    if spec is None or isinstance(spec, Mesh):
        return spec
    sizes: dict[str, int] = {}
    for part in str(spec).replace(" ", "").split(","):
        name, eq, value = part.partition("=")
        if not eq or name not in MESH_AXES or name in sizes or not value.isdigit() or int(value) < 1:
            raise InputError(f"{option} {spec!r}: expected comma-separated axis=size pairs over the axes "
                             f"{', '.join(MESH_AXES)} (each once, sizes >= 1), e.g. 'model=4' or 'data=2,model=4'.")
        sizes[name] = int(value)
    names = MESH_AXES
    shape = tuple(sizes.get(a, 1) for a in names)
    devices = jax.devices()
    if math.prod(shape) > len(devices):
        raise InputError(f"{option} {spec!r} needs {math.prod(shape)} devices but there are {len(devices)} "
                         f"({devices[0].platform}); use a smaller mesh.")
    return Mesh(np.asarray(devices[:math.prod(shape)]).reshape(shape), names)


def check_fits(mesh: Mesh | None, sizes: Mapping[str, Sequence[tuple[str, int]]], *, option: str = "mesh",
               rules: Mapping[str, str | None] = DEFAULT_RULES) -> None:
    """An InputError naming `option` unless each size is a multiple of its mesh axis; `sizes` maps
    a logical axis to (what, size) pairs, e.g. {"heads": [("num_attention_heads", 40)]}."""
    if mesh is None:
        return
    for logical, entries in sizes.items():
        axis = rules.get(logical)
        if axis is None or axis not in mesh.shape:
            continue
        for what, n in entries:
            if n % mesh.shape[axis]:
                raise InputError(f"{option}: the mesh axis {axis!r} has {mesh.shape[axis]} devices, which does not "
                                 f"divide {what} = {n} (sharded over {axis!r}); use a mesh whose {axis} size divides "
                                 f"{n}.")


def model_sizes(target_config, head_config=None) -> dict[str, list[tuple[str, int]]]:
    """What `check_fits` checks of a target (a Qwen3Config) and its draft head (any config with
    head counts, e.g. DartHeadConfig)."""
    c = target_config
    sparse = [c.sparse_layer(i) for i in range(c.num_hidden_layers)]
    sizes: dict[str, list[tuple[str, int]]] = {
        "heads": [("num_attention_heads", c.num_attention_heads)],
        "kv_heads": [("num_key_value_heads", c.num_key_value_heads)],
        "mlp": [("intermediate_size", c.intermediate_size)] if not all(sparse) else [],
        "vocab": [("vocab_size", c.vocab_size)],
    }
    if any(sparse):
        sizes["experts"] = [("num_experts", c.num_experts)]
    if head_config is not None:
        sizes["heads"].append(("the draft head's num_attention_heads", head_config.num_attention_heads))
        sizes["kv_heads"].append(("the draft head's num_key_value_heads", head_config.num_key_value_heads))
        sizes["mlp"].append(("the draft head's intermediate_size", head_config.intermediate_size))
        sizes["vocab"].append(("the draft head's draft_vocab_size", head_config.draft_vocab_size))
    return sizes


def cache_axes(array_or_cache) -> tuple[str, ...]:
    """Logical axes of a cache's arrays: its `axes` (HeadCache), else the target's CACHE_AXES."""
    return getattr(array_or_cache, "axes", CACHE_AXES)


def sharded_caches(make: Callable[[], tuple], mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES) -> tuple:
    """The tuple of caches (target KVCache, drafter HeadCache, ...) that `make()` builds, built on
    `mesh` by their axes: each device allocates only its shard."""
    shapes = jax.eval_shape(make)
    shardings = tuple(jax.tree.map(lambda a, c=c: named_sharding(cache_axes(c), a.shape, mesh, rules), c)
                      for c in shapes)
    return jax.jit(make, out_shardings=shardings)()


def constrain_cache(cache, mesh: Mesh | None, rules: Mapping[str, str | None] = DEFAULT_RULES):
    """Inside a jitted function: `cache` pinned to its sharding on `mesh` (None: as it is), so that a
    donated cache comes back with the sharding it went in with (no gather, no recompilation)."""
    if mesh is None:
        return cache
    axes = cache_axes(cache)
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, named_sharding(axes, a.shape, mesh, rules)),
                        cache)


def place(shape: Sequence[int], axes: Sequence[str | None], mesh: Mesh, read: Callable[[tuple], np.ndarray],
          rules: Mapping[str, str | None] = DEFAULT_RULES) -> jax.Array:
    """An array of `shape` laid out on `mesh` by its logical `axes`, built shard by shard:
    `read(index)` (a tuple of slices) returns the NumPy block of one shard. Each distinct block is
    read once (replicas share it), and only for the devices of this process: host memory holds
    at most one array's blocks at a time, and no device ever holds more than its shard."""
    sharding = named_sharding(axes, shape, mesh, rules)
    blocks: dict[tuple, np.ndarray] = {}

    def block(index):
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in blocks:
            blocks[key] = read(tuple(index))
        return blocks[key]

    return jax.make_array_from_callback(tuple(shape), sharding, block)


def constrain_replicated(tree, mesh: Mesh | None):
    """Inside a jitted function: every array of `tree` pinned to a full copy on each device of
    `mesh` (None: as it is); small per-sequence state (lengths, PRNG keys) that goes back in."""
    if mesh is None:
        return tree
    everywhere = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, everywhere), tree)


def inputs_on_mesh(fn: Callable, mesh: Mesh | None) -> Callable:
    """`fn` (a jitted function whose first argument, the model state, was placed when loaded) with
    each later array argument that is not on `mesh` yet (made on the host, or on one device) put
    there as a full copy per device. An executable is compiled for the shardings of its inputs:
    without this, a step fed host-made lengths and keys and then its own outputs would compile
    twice. `fn` itself without a mesh."""
    if mesh is None:
        return fn
    everywhere = NamedSharding(mesh, PartitionSpec())

    def onto_mesh(x):
        if isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and not (
                isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh)):
            return put(x, everywhere)
        return x

    @functools.wraps(fn)
    def run(state, *args, **kwargs):
        return fn(state, *jax.tree.map(onto_mesh, args), **{k: jax.tree.map(onto_mesh, v) for k, v in kwargs.items()})

    return run
