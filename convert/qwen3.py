"""Load a Hugging Face Qwen3 checkpoint (safetensors) into `dart_jax.qwen3.Qwen3`, without torch.

Every checkpoint tensor is mapped by name to one parameter and its shape checked before any
weight is read. The module is built abstractly (`nnx.eval_shape`) and filled tensor by tensor,
so peak memory is the model plus one tensor.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from tqdm.auto import tqdm

from ..qwen3 import Qwen3, Qwen3Config, default_dtype
from ..sharding import DEFAULT_RULES, named_sharding
from .hub import resolve
from .safetensors_io import read_config, weight_files

ALLOW_PATTERNS = ("*.json", "*.safetensors")


def _checkpoint_folder(path_or_id: str | os.PathLike) -> Path:
    folder = resolve(path_or_id, ALLOW_PATTERNS, what="Qwen3 checkpoint")
    if not folder.is_dir():
        raise FileNotFoundError(f"Qwen3 checkpoint {str(path_or_id)!r} resolved to {folder}, which is not a folder; "
                                "pass the folder that holds config.json and the *.safetensors files.")
    return folder


def load_qwen3_config(path_or_id: str | os.PathLike) -> Qwen3Config:
    """The `Qwen3Config` of a checkpoint folder or hub id (reads only config.json)."""
    folder = _checkpoint_folder(path_or_id)
    cfg = read_config(folder, "a HF Qwen3 checkpoint folder needs config.json next to its model.safetensors")
    return Qwen3Config.from_hf(cfg)


def _targets(model: Qwen3) -> dict[str, tuple[nnx.Variable, bool]]:
    """HF tensor name → (our parameter, whether the PyTorch [out, in] weight must be transposed)."""
    out = {"model.embed_tokens.weight": (model.embed_tokens.embedding, False),
           "model.norm.weight": (model.norm.weight, False)}
    if model.lm_head is not None:
        out["lm_head.weight"] = (model.lm_head.kernel, True)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        att, mlp = layer.self_attn, layer.mlp
        out.update({
            p + "input_layernorm.weight": (layer.input_layernorm.weight, False),
            p + "post_attention_layernorm.weight": (layer.post_attention_layernorm.weight, False),
            p + "self_attn.q_proj.weight": (att.q_proj.kernel, True),
            p + "self_attn.k_proj.weight": (att.k_proj.kernel, True),
            p + "self_attn.v_proj.weight": (att.v_proj.kernel, True),
            p + "self_attn.o_proj.weight": (att.o_proj.kernel, True),
            p + "self_attn.q_norm.weight": (att.q_norm.weight, False),
            p + "self_attn.k_norm.weight": (att.k_norm.weight, False),
            p + "mlp.gate_proj.weight": (mlp.gate_proj.kernel, True),
            p + "mlp.up_proj.weight": (mlp.up_proj.kernel, True),
            p + "mlp.down_proj.weight": (mlp.down_proj.kernel, True),
        })
    return out


def _tensor_index(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Name → (file, shape) over all weight files, read from the headers only."""
    index: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for f in weight_files(folder):
        with safe_open(str(f), framework="numpy") as fh:
            for key in fh.keys():
                if key in index:
                    raise ValueError(f"tensor {key!r} appears in both {index[key][0].name} and {f.name}.")
                index[key] = (f, tuple(fh.get_slice(key).get_shape()))
    return index


def load_qwen3(path_or_id: str | os.PathLike, dtype=None, mesh: jax.sharding.Mesh | None = None,
               rules=DEFAULT_RULES) -> Qwen3:
    """A `Qwen3` with the weights of a HF Qwen3 checkpoint (local folder or hub id).

    Parameters are stored in `dtype` (default: `default_dtype()`), which is also the compute dtype.
    With a `mesh`, each parameter is placed with the NamedSharding its logical axes give under `rules`.
    """
    folder = _checkpoint_folder(path_or_id)
    config = load_qwen3_config(folder)
    index = _tensor_index(folder)
    dtype = jnp.dtype(dtype or default_dtype())

    model = nnx.eval_shape(lambda: Qwen3(config, dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(0)))
    targets = _targets(model)
    missing = sorted(set(targets) - set(index))
    unexpected = sorted(set(index) - set(targets))
    if missing or unexpected:
        hint = ""
        if "lm_head.weight" in missing and config.tie_word_embeddings is False:
            hint = " (config.json says tie_word_embeddings=false, so lm_head.weight is required)"
        if "lm_head.weight" in unexpected:
            hint = " (config.json says tie_word_embeddings=true but the checkpoint has lm_head.weight)"
        raise ValueError(f"checkpoint {folder} does not match its Qwen3 config{hint}: missing tensors "
                         f"{missing[:10]}{' ...' if len(missing) > 10 else ''}, unexpected tensors "
                         f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}.")
    for name, (var, transpose) in targets.items():
        want = tuple(var.shape)
        have = index[name][1][::-1] if transpose else index[name][1]
        if have != want:
            expected_file = want[::-1] if transpose else want
            raise ValueError(f"tensor {name!r} in {index[name][0].name} has shape {index[name][1]}, expected "
                             f"{expected_file} from config.json; the checkpoint and its config disagree.")

    place: Callable[[np.ndarray, nnx.Variable], jax.Array]
    if mesh is None:
        def place(arr, var):
            return jnp.asarray(arr)
    else:
        def place(arr, var):
            return jax.device_put(arr, named_sharding(var.get_metadata()["logical_axes"], arr.shape, mesh, rules))

    by_file: dict[Path, list[str]] = {}
    for name in targets:
        by_file.setdefault(index[name][0], []).append(name)
    with tqdm(total=len(targets), desc=f"loading {folder.name}", unit="tensor", leave=False) as bar:
        for f, names in by_file.items():
            with safe_open(str(f), framework="numpy") as fh:
                for name in names:
                    var, transpose = targets[name]
                    arr = fh.get_tensor(name)
                    if not np.issubdtype(arr.dtype, np.floating) and arr.dtype.name != "bfloat16":
                        raise ValueError(f"tensor {name!r} in {f.name} has dtype {arr.dtype}; expected a float tensor.")
                    arr = arr.astype(dtype, copy=False)
                    var.set_value(place(np.ascontiguousarray(arr.T) if transpose else arr, var))
                    bar.update()
    return model
