"""Read and write DART head checkpoints in the reference layout (SPEC §1).

A head folder (or hub id) holds `config.json` and `model.safetensors` with PyTorch names:
Linear weights are [out, in] and are transposed to our [in, out] kernels. The token embedding
is the target's; a checkpoint that also carries `embed_tokens.weight` is accepted and the tensor
ignored. Everything is checked against the target before any array is built.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from dart_jax.head import DartHead, DartHeadConfig

from .hub import resolve
from .safetensors_io import SINGLE_NAME, read_config, read_tensors, weight_files, write_tensors

CONFIG_NAME = "config.json"
IGNORED = ("embed_tokens.weight",)
_SAVE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def tensor_table(config: DartHeadConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]:
    """Checkpoint name → (path in the module, checkpoint shape, transposed on load)."""
    h, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    table = {
        "fc.weight": (("fc", "kernel"), (h, config.fc_in), True),
        "midlayer.mask_rep": (("midlayer", "mask_rep"), (2 * h,), False),
        "norm.weight": (("norm", "weight"), (h,), False),
        "lm_head.weight": (("lm_head", "kernel"), (config.draft_vocab_size, h), True),
        "d2t": (("d2t",), (config.draft_vocab_size,), False),
        "t2d": (("t2d",), (config.vocab_size,), False),
    }
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        table[f"midlayer.{norm}.weight"] = (("midlayer", norm, "weight"), (h,), False)
    for name, shape in (("q_proj", (q, 2 * h)), ("k_proj", (kv, 2 * h)), ("v_proj", (kv, 2 * h)), ("o_proj", (h, q))):
        table[f"midlayer.self_attn.{name}.weight"] = (("midlayer", "self_attn", name, "kernel"), shape, True)
    for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
        table[f"midlayer.mlp.{name}.weight"] = (("midlayer", "mlp", name, "kernel"), shape, True)
    return table


def head_folder(path_or_id: str | os.PathLike) -> Path:
    """The local folder of a head given as a folder, a file in it, or a hub id."""
    folder = resolve(path_or_id, allow_patterns=[CONFIG_NAME, "*.safetensors"], what="DART head")
    return folder.parent if folder.is_file() else folder


def read_head_config(folder: Path) -> DartHeadConfig:
    raw = read_config(folder, "a DART head folder holds config.json and model.safetensors")
    return DartHeadConfig.from_hf(raw)


def check_tensors(config: DartHeadConfig, tensors: dict[str, np.ndarray], where: str) -> None:
    """Names, shapes and dtypes of a head checkpoint against its config (ValueError listing all problems)."""
    table = tensor_table(config)
    problems = []
    missing = sorted(set(table) - set(tensors))
    unexpected = sorted(set(tensors) - set(table) - set(IGNORED))
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    for name, (_, shape, _) in table.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            problems.append(f"{name} has shape {tuple(tensors[name].shape)}, the config implies {shape}")
    if "d2t" in tensors and not np.issubdtype(tensors["d2t"].dtype, np.integer):
        problems.append(f"d2t must hold integers, found {tensors['d2t'].dtype}")
    if "t2d" in tensors and not (tensors["t2d"].dtype == np.bool_ or np.issubdtype(tensors["t2d"].dtype, np.integer)):
        problems.append(f"t2d must be bool, found {tensors['t2d'].dtype}")
    if problems:
        raise ValueError(f"{where} does not match its config.json (hidden_size={config.hidden_size}, "
                         f"draft_vocab_size={config.draft_vocab_size}, vocab_size={config.vocab_size}): "
                         + "; ".join(problems) + ". Is this a DART head checkpoint saved by the reference or save_dart_head?")


def check_fits_target(config: DartHeadConfig, target_config: Any, d2t: np.ndarray | None = None) -> None:
    """The head against the target it will draft for (ValueError naming each mismatch)."""
    problems = []
    th, tv = int(target_config.hidden_size), int(target_config.vocab_size)
    if config.hidden_size != th:
        problems.append(f"head hidden_size {config.hidden_size} != target hidden_size {th} "
                        "(the head embeds tokens with the target's embedding)")
    if config.fc_in != 3 * th:
        problems.append(f"the head's fc reads 3×{config.fc_in // 3} tap features but the target's taps have 3×{th}")
    if config.vocab_size != tv:
        problems.append(f"head vocab_size {config.vocab_size} != target vocab_size {tv}")
    if config.draft_vocab_size > config.vocab_size:
        problems.append(f"draft_vocab_size {config.draft_vocab_size} exceeds vocab_size {config.vocab_size}")
    if d2t is not None:
        problems += _d2t_problems(d2t, tv)
    if problems:
        raise ValueError("this DART head does not fit the target: " + "; ".join(problems)
                         + ". Pick the head published for this base model (see SPEC §1 / DartModel's pairs table).")


def _d2t_problems(d2t: np.ndarray, vocab: int) -> list[str]:
    mapped = np.arange(d2t.shape[0], dtype=np.int64) + d2t.astype(np.int64)
    bad = np.flatnonzero((mapped < 0) | (mapped >= vocab))
    if not bad.size:
        return []
    return [f"d2t maps {bad.size} draft ids outside the target vocabulary [0, {vocab}) "
            f"(first: draft id {bad[0]} → {mapped[bad[0]]})"]


def load_dart_head(path_or_id: str | os.PathLike, target, dtype=None) -> DartHead:
    """A DartHead for `target` (a Qwen3 module: its `.config` and shared `.embed_tokens`).

    `dtype` sets both the parameter and the compute dtype; None takes the target's compute dtype
    (`target.dtype`, else the dtype of its embedding).
    """
    folder = head_folder(path_or_id)
    config = read_head_config(folder)
    check_fits_target(config, target.config)
    tensors = read_tensors(folder)
    check_tensors(config, tensors, f"DART head {path_or_id!s} ({', '.join(p.name for p in weight_files(folder))})")
    check_fits_target(config, target.config, tensors["d2t"])
    if dtype is None:
        dtype = getattr(target, "dtype", None) or target.embed_tokens.embedding.get_value().dtype
    head = nnx.eval_shape(lambda: DartHead(config, target.embed_tokens, dtype=dtype, param_dtype=dtype, rngs=None))
    head.embed_tokens = target.embed_tokens
    _assign(head, config, tensors, dtype)
    return head


def _assign(head: DartHead, config: DartHeadConfig, tensors: dict[str, np.ndarray], dtype) -> None:
    for name, (path, _, transpose) in tensor_table(config).items():
        obj = head
        for part in path[:-1]:
            obj = getattr(obj, part)
        array = np.asarray(tensors[name])
        if name == "d2t":
            value = jnp.asarray(array.astype(np.int32))
        elif name == "t2d":
            value = jnp.asarray(array.astype(np.bool_))
        else:
            value = jnp.asarray((array.T if transpose else array), dtype=dtype)
        getattr(obj, path[-1]).set_value(value)


def head_tensors(config: DartHeadConfig, params, dtype: str = "float32") -> dict[str, np.ndarray]:
    """The checkpoint tensors (PyTorch layout) of a head module or of its nnx.State."""
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_SAVE_DTYPES)}, got {dtype!r}.")
    state = nnx.state(params) if isinstance(params, nnx.Module) else params
    flat = {tuple(str(p) for p in path): var for path, var in nnx.to_flat_state(state)}
    out = {}
    for name, (path, shape, transpose) in tensor_table(config).items():
        if path not in flat:
            raise ValueError(f"params has no {'.'.join(path)} (for {name}); pass the DartHead itself or nnx.state(head), "
                             "which includes the Buffer variables d2t and t2d.")
        array = np.asarray(_value(flat[path]))
        array = _reference_layout(name, array.T if transpose else array, dtype)
        if tuple(array.shape) != shape:
            raise ValueError(f"{name}: params give shape {tuple(array.shape)}, the config implies {shape}.")
        out[name] = array
    return out


def _reference_layout(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """The dtype the reference stores a tensor in: d2t int64, t2d bool, floats as `dtype`."""
    if name == "d2t":
        return array.astype(np.int64)
    if name == "t2d":
        return array.astype(np.bool_)
    return array.astype(_SAVE_DTYPES[dtype])


def _value(var) -> Any:
    return var.get_value() if isinstance(var, nnx.Variable) else var


def save_dart_head(folder: str | os.PathLike, config: DartHeadConfig, params, dtype: str = "float32") -> Path:
    """Write `config.json` + `model.safetensors` in the reference layout (floats as `dtype`,
    'float32' or 'bfloat16'; d2t int64; t2d bool). `params` is the DartHead or nnx.state(head)."""
    return _write(Path(folder), config, head_tensors(config, params, dtype), dtype)


def _write(folder: Path, config: DartHeadConfig, tensors: dict[str, np.ndarray], dtype: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    hf = config.to_hf()
    hf["torch_dtype"] = dtype
    (folder / CONFIG_NAME).write_text(json.dumps(hf, indent=2) + "\n")
    write_tensors(folder / SINGLE_NAME, tensors)
    return folder


def export_dart_head(src: str | os.PathLike, dest: str | os.PathLike, dtype: str = "float32",
                     target_config: Any | None = None) -> Path:
    """Re-save a head checkpoint in the reference layout with floats as `dtype` (no model is
    built). Checks it as `load_dart_head` does; against `target_config` when one is given."""
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_SAVE_DTYPES)}, got {dtype!r}.")
    folder = head_folder(src)
    config = read_head_config(folder)
    tensors = read_tensors(folder)
    check_tensors(config, tensors, f"DART head {src!s}")
    if target_config is not None:
        check_fits_target(config, target_config, tensors["d2t"])
    elif problems := _d2t_problems(tensors["d2t"], config.vocab_size):
        raise ValueError(f"DART head {src!s}: " + "; ".join(problems) + ". The checkpoint's vocabulary mapping is broken.")
    out = {name: _reference_layout(name, np.asarray(tensors[name]), dtype) for name in tensor_table(config)}
    return _write(Path(dest), config, out, dtype)

