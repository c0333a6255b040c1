"""Modules from checkpoints and back: `load_qwen3`, `load_dart_head`, `save_dart_head`, `load_eagle3_head`.

`dart_jax.convert` reads and checks the files (names, shapes, configs) and hands over named
arrays; this module builds the modules abstractly (`nnx.eval_shape`) and fills them parameter by
parameter along the converter's tensor tables, so peak memory is the model plus one tensor.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from dart_jax.convert import dart_head as head_format
from dart_jax.convert import eagle3 as eagle3_format
from dart_jax.convert import qwen3 as qwen3_format
from dart_jax.convert.target import load_target_config, target_folder
from dart_jax.convert.dart_head import DartHeadConfig
from dart_jax.convert.safetensors_io import cast_weight, open_safetensors, read_slice, read_tensor, tensor_index
from dart_jax.errors import FileFormatError, InputError

from .eagle3 import Eagle3Head, eagle3_rope
from .head import DartHead, head_rope
from .layers import rope_inv_freq
from .qwen3 import Qwen3, default_dtype, use_backend_layout
from .sharding import DEFAULT_RULES, check_fits, make_mesh, model_sizes, named_sharding, place


def _variable(module: nnx.Module, path: tuple) -> nnx.Variable:
    """The variable at an attribute path such as ("layers", 3, "mlp", "up_proj", "kernel")."""
    obj = module
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    return obj


def _check_rope(inv_freq: np.ndarray, scale: float, config_file: Path) -> None:
    """RoPE tables that a config's values make non-finite (rope_theta near 0 or huge, extreme
    factors) are the config's problem: a FileFormatError naming it."""
    if not (np.isfinite(inv_freq).all() and np.isfinite(scale)):
        raise FileFormatError(config_file, "rope_theta / rope_scaling give non-finite RoPE frequencies "
                                           f"(first values {inv_freq[:3].tolist()}, scale {scale}); use the "
                                           "checkpoint's original RoPE settings.")


def _put(var: nnx.Variable, array: np.ndarray, mesh, rules) -> jax.Array:
    """A host array as the value of `var`: on the default device, or straight onto its shards.
    Host arrays go over by `jax.device_put` throughout the loaders: `jnp.asarray` of a NumPy array
    compiles (or loads from the cache) a small XLA program per shape and dtype (`lax.stage`),
    each before the first token; `device_put` is a plain transfer."""
    if mesh is None:
        return jax.device_put(array)
    axes = var.get_metadata().get("logical_axes") or (None,) * array.ndim
    return jax.device_put(array, named_sharding(axes, array.shape, mesh, rules))


def load_qwen3(path_or_id: str | os.PathLike, dtype=None, mesh: jax.sharding.Mesh | str | None = None,
               rules=DEFAULT_RULES, *, fused_projections: bool | None = None,
               untied_lm_head: bool | None = None) -> Qwen3:
    """A `Qwen3` with the weights of a HF Qwen3 checkpoint (local folder or hub id).

    Parameters are stored in `dtype` (default: `default_dtype()`), which is also the compute dtype.
    With a `mesh` (a Mesh or a spec such as "model=4", see `sharding.make_mesh`), each parameter
    is read slice by slice straight onto its shards (the NamedSharding its logical axes give
    under `rules`): no device and no host buffer holds more than one whole tensor; a mesh that
    does not divide the head counts, MLP width or vocabulary is an InputError before any read.
    Everything about the files is checked before the model is built (config values, tensor
    names, shapes, float dtypes, from the headers) and each weight as it is read (finite values,
    also after conversion to `dtype`); a problem is a FileFormatError naming the file.
    On one device the model is laid out for the backend (`qwen3.use_backend_layout`):
    `fused_projections` and `untied_lm_head`, None for the backend's default (`backend.defaults_for`).
    """
    folder = qwen3_format.checkpoint_folder(path_or_id)
    return _load_target(folder, qwen3_format.load_qwen3_config(folder), dtype, mesh, rules,
                        fused_projections, untied_lm_head)


def load_target(path_or_id: str | os.PathLike, dtype=None, mesh: jax.sharding.Mesh | str | None = None,
                rules=DEFAULT_RULES, *, fused_projections: bool | None = None,
                untied_lm_head: bool | None = None) -> Qwen3:
    """The target module of any supported family (Qwen3, or a Llama-family base such as SmolLM2)
    from a HF folder, a hub id or a Llama `.gguf` file (dequantized to float32 and converted once
    into the cache, `dart_jax.convert.gguf`); otherwise as `load_qwen3`."""
    folder = target_folder(path_or_id)
    return _load_target(folder, load_target_config(folder), dtype, mesh, rules, fused_projections, untied_lm_head)


def _load_target(folder: Path, config, dtype, mesh, rules, fused_projections, untied_lm_head) -> Qwen3:
    mesh = make_mesh(mesh)
    check_fits(mesh, model_sizes(config), rules=rules)
    # a bad RoPE fails before any read
    with np.errstate(all="ignore"):
        tables = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling_dict)
    _check_rope(*tables, folder / "config.json")
    index = qwen3_format.check_checkpoint(folder, config)
    table = qwen3_format.tensor_table(config)
    dtype = jnp.dtype(dtype or default_dtype())
    # rngs=None: every value is replaced from the checkpoint, and tracing a random initializer per
    # parameter (its key split and counter update) costs more than the abstract build itself
    model = nnx.eval_shape(lambda: Qwen3(config, dtype=dtype, param_dtype=dtype, rngs=None))

    by_file: dict[Path, list[str]] = {}
    stacked: dict[tuple, list[str]] = {}  # a stacked parameter's path → its rows' names, row by row
    for name in table:
        path = table[name][0]
        if isinstance(path[-1], int):
            stacked.setdefault(path[:-1], []).append(name)
        else:
            by_file.setdefault(index[name][0], []).append(name)
    with tqdm(total=len(table), desc=f"loading {folder.name}", unit="tensor", leave=False) as bar:
        for f, names in by_file.items():
            with open_safetensors(f) as fh:
                for name in names:
                    path, _, transpose = table[name]
                    var = _variable(model, path)
                    if mesh is None:
                        arr = cast_weight(read_tensor(fh, f, name), dtype, name, f)
                        var.set_value(jax.device_put(np.ascontiguousarray(arr.T) if transpose else arr))
                    else:
                        var.set_value(_place_tensor(fh, f, name, transpose, var, dtype, mesh, rules))
                    bar.update()
        if stacked:
            with contextlib.ExitStack() as files:  # a layer's experts may lie in several shards
                handles = {f: files.enter_context(open_safetensors(f))
                           for f in sorted({index[n][0] for names in stacked.values() for n in names})}
                for path, names in stacked.items():
                    var = _variable(model, path)
                    var.set_value(_stacked_tensor(handles, index, names, table[names[0]][2], var, dtype, mesh, rules))
                    bar.update(len(names))
    return model if mesh is not None else use_backend_layout(model, fused_projections, untied_lm_head)


def _stacked_tensor(handles, index, names: list[str], transpose: bool, var: nnx.Variable, dtype, mesh,
                    rules) -> jax.Array:
    """The stacked parameter `var` [R, ...] whose row r is the tensor `names[r]` (a sparse layer's
    experts), on the default device or on its shards, each block read as slices of its rows' files."""

    def read(block: tuple) -> np.ndarray:
        rows = []
        for name in names[block[0]]:
            f = index[name][0]
            part = read_slice(handles[f], f, name, block[:0:-1] if transpose else block[1:])  # [out, in] in the file
            part = cast_weight(part, dtype, name, f)
            rows.append(part.T if transpose else part)
        return np.stack(rows)

    shape = var.get_value().shape
    if mesh is None:
        return jax.device_put(read(tuple(slice(None) for _ in shape)))
    return place(shape, var.get_metadata()["logical_axes"], mesh, read, rules)


def _place_tensor(fh, f: Path, name: str, transpose: bool, var: nnx.Variable, dtype, mesh, rules) -> jax.Array:
    """Tensor `name` of an open file on the shards of `var`, each shard read as a slice of the file
    (a transposed weight [out, in] is read at the transposed index)."""

    def read(index: tuple) -> np.ndarray:
        block = cast_weight(read_slice(fh, f, name, index[::-1] if transpose else index), dtype, name, f)
        return np.ascontiguousarray(block.T) if transpose else block

    return place(var.get_value().shape, var.get_metadata()["logical_axes"], mesh, read, rules)


def load_dart_head(path_or_id: str | os.PathLike, target, dtype=None, mesh: jax.sharding.Mesh | str | None = None,
                   rules=DEFAULT_RULES) -> DartHead:
    """A DartHead for `target` (a Qwen3 module: its `.config` and shared `.embed_tokens`).

    `dtype` sets both the parameter and the compute dtype; None takes the target's compute dtype
    (`target.dtype`, else the dtype of its embedding). The head is checked as
    `dart_jax.convert.dart_head.read_head` does (config, names, shapes, dtypes, finite weights,
    a one-to-one d2t with a matching t2d, the fit to the target); a problem is a FileFormatError
    naming the head's file. With a `mesh`, each parameter goes straight onto its shards (the head,
    one layer, is read whole first: its checks need whole tensors); a mesh that does not divide
    its head counts, MLP width or draft vocabulary is an InputError before any read.
    """
    mesh = make_mesh(mesh)
    if mesh is not None:
        check_fits(mesh, model_sizes(target.config, head_format.read_head_config(head_format.head_folder(path_or_id))),
                   rules=rules)
    folder, config, tensors = head_format.read_head(path_or_id, target.config)
    with np.errstate(all="ignore"):
        tables = head_rope(config)
    _check_rope(*tables, folder / head_format.CONFIG_NAME)
    if dtype is None:
        dtype = getattr(target, "dtype", None) or target.embed_tokens.embedding.get_value().dtype
    head = nnx.eval_shape(lambda: DartHead(config, target.embed_tokens, dtype=dtype, param_dtype=dtype, rngs=None))
    head.embed_tokens = target.embed_tokens
    return _fill_head(head, head_format.tensor_table(config), tensors, head_format.tensor_files(folder), dtype,
                      mesh, rules)


def head_tensors(config: DartHeadConfig, params) -> dict[str, np.ndarray]:
    """The checkpoint tensors ([out, in] weights, as stored) of a head module or of its nnx.State."""
    state = nnx.state(params) if isinstance(params, nnx.Module) else params
    flat = {tuple(str(p) for p in path): var for path, var in nnx.to_flat_state(state)}
    out = {}
    for name, (path, _, transpose) in head_format.tensor_table(config).items():
        if path not in flat:
            raise ValueError(f"params has no {'.'.join(path)} (for {name}); pass the DartHead itself or nnx.state(head), "
                             "which includes the Buffer variables d2t and t2d.")
        array = np.asarray(_value(flat[path]))
        out[name] = array.T if transpose else array
    return out


def _value(var) -> Any:
    return var.get_value() if isinstance(var, nnx.Variable) else var


def save_dart_head(folder: str | os.PathLike, config: DartHeadConfig, params, dtype: str = "float32") -> Path:
    """Write `config.json` + `model.safetensors` in the reference layout (floats as `dtype`,
    'float32' or 'bfloat16'; d2t int64; t2d bool). `params` is the DartHead or nnx.state(head)."""
    if dtype not in head_format.SAVE_DTYPES:
        raise InputError(f"dtype must be one of {sorted(head_format.SAVE_DTYPES)}, got {dtype!r}.")
    return head_format.write_dart_head(folder, config, head_tensors(config, params), dtype)


def load_eagle3_head(path_or_id: str | os.PathLike, target, dtype=None, mesh: jax.sharding.Mesh | str | None = None,
                     rules=DEFAULT_RULES) -> Eagle3Head:
    """An EAGLE-3 head (published layout: hub id or folder) for `target` (a Qwen3 module: its
    `.config` and, unless the checkpoint has an embedding of its own, its shared `.embed_tokens`).
    With a `mesh`, each parameter goes onto its shards as `load_dart_head` places them.

    `dtype` sets the parameter and compute dtype; None takes the target's. Checked as
    `dart_jax.convert.eagle3.read_eagle3` does; a problem is an error naming the head's file."""
    mesh = make_mesh(mesh)
    folder, config, tensors = eagle3_format.read_eagle3(path_or_id, target.config)
    if mesh is not None:
        check_fits(mesh, model_sizes(target.config, config), rules=rules)
    with np.errstate(all="ignore"):
        tables = eagle3_rope(config)
    _check_rope(*tables, folder / eagle3_format.CONFIG_NAME)
    if dtype is None:
        dtype = getattr(target, "dtype", None) or target.embed_tokens.embedding.get_value().dtype
    own = eagle3_format.EMBEDDING in tensors
    head = nnx.eval_shape(lambda: Eagle3Head(config, None if own else target.embed_tokens, dtype=dtype,
                                             param_dtype=dtype, rngs=None))
    if not own:
        head.embed_tokens = target.embed_tokens
    head.d2t.set_value(jax.device_put(np.zeros((config.draft_vocab_size,), np.int32)))
    head.t2d.set_value(jax.device_put(np.ones((config.vocab_size,), np.bool_)))
    return _fill_head(head, eagle3_format.tensor_table(config, own_embedding=own), tensors, tensor_index(folder),
                      dtype, mesh, rules)


def _fill_head(head, table, tensors, weights, dtype, mesh, rules):
    """`head` (abstract) with its parameters set from the checked `tensors` along a tensor table
    (name → parameter path, file shape, transposed); `weights` maps a name to its file, for errors.
    d2t / t2d keep their integer / boolean types; weights are cast to `dtype`."""
    for name, (path, _, transpose) in table.items():
        array = np.asarray(tensors[name])
        if name == "d2t":
            array = array.astype(np.int32)
        elif name == "t2d":
            array = array.astype(np.bool_)
        else:
            array = cast_weight(array, jnp.dtype(dtype), name, weights[name][0])
            array = np.ascontiguousarray(array.T) if transpose else array
        var = _variable(head, path)
        var.set_value(_put(var, array, mesh, rules))
    return head
