"""DART head checkpoints in the reference layout (docs/spec.md §1): config, tensor names, checks, writing.

A head folder (or hub id) holds `config.json` and `model.safetensors` with PyTorch names:
Linear weights are [out, in] (the model's kernels are [in, out]). The token embedding is the
target's; a checkpoint that also carries `embed_tokens.weight` is accepted and the tensor
ignored. Everything is checked against the config and the target before any array is built.
Building the module from these arrays is `dart_jax.models.checkpoints`' work.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from .configs import freeze, read_config, thaw
from .hub import resolve
from .qwen3 import check_rope_scaling, rope_kind
from .safetensors_io import SINGLE_NAME, read_tensors, weight_files, write_tensors

CONFIG_NAME = "config.json"
IGNORED = ("embed_tokens.weight",)
SAVE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "relu")
HEAD_ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")
_HEAD_ROPE_NEEDS = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",)}


_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "draft_length", "draft_vocab_size")


@dataclasses.dataclass(frozen=True)
class DartHeadConfig:
    """The head's config.json (Llama-style fields plus draft_length / draft_vocab_size).

    Hashable, so it can sit in a GraphDef or be a static jit argument. `rope_scaling` is kept as
    sorted (key, value) pairs; `rope_scaling_dict` gives it back as a dict. Fields we do not use
    are kept in `extra` (key, JSON text) so that `to_hf` writes them back unchanged.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_length: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    target_hidden_size: int | None = None
    extra: tuple = ()

    @property
    def num_rows(self) -> int:
        return self.draft_length + 1

    @property
    def fc_in(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return thaw(self.rope_scaling)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "DartHeadConfig":
        missing = [k for k in _REQUIRED if cfg.get(k) is None]
        if missing:
            raise ValueError(f"DART head config.json lacks {missing}; a DART head config needs {list(_REQUIRED)} "
                             "(Llama-style fields plus draft_length and draft_vocab_size).")
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}.")
        act = cfg.get("hidden_act", "silu")
        if act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {act!r} is not supported; supported: {sorted(ACTIVATIONS)}.")
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None and isinstance(cfg.get("rope_parameters"), Mapping):
            # transformers >= 5 writes rope_theta (and the scaling kind) inside rope_parameters
            params = dict(cfg["rope_parameters"])
            rope_theta = params.pop("rope_theta", None)
            if rope_scaling is None and params.get("rope_type", "default") != "default":
                rope_scaling = params
        # torch_dtype / dtype describe a saved file, not the head; save_dart_head writes its own
        known = {f.name for f in dataclasses.fields(cls)} | {"rope_parameters", "torch_dtype", "dtype"}
        config = cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            vocab_size=int(cfg["vocab_size"]),
            draft_length=int(cfg["draft_length"]),
            draft_vocab_size=int(cfg["draft_vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=None if rope_scaling is None else freeze(rope_scaling),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            hidden_act=act,
            target_hidden_size=None if cfg.get("target_hidden_size") is None else int(cfg["target_hidden_size"]),
            extra=tuple(sorted((k, json.dumps(v)) for k, v in cfg.items() if k not in known)),
        )
        if config.draft_length < 1:
            raise ValueError(f"draft_length must be >= 1, got {config.draft_length}.")
        check_rope_scaling(config.rope_scaling_dict, HEAD_ROPE_KINDS, "DART head config", _HEAD_ROPE_NEEDS)
        return config

    def rope_arguments(self) -> tuple[float, dict | None, dict]:
        """(theta, scaling, keyword arguments) of the project's RoPE function
        (`dart_jax.models.layers.rope_inv_freq`) that give the tables the reference head builds
        from this config (docs/spec.md §3): plain and 'llama3' RoPE use rope_theta, 'llama3'
        without its three keys falls back to plain RoPE, and 'linear', 'dynamic' and 'yarn' are
        built over base 10000 whatever rope_theta says; 'dynamic' is evaluated once for a table of
        max_position_embeddings + 20 positions, and 'yarn' always truncates its correction range,
        defaults its original length to 4096 and takes its scale as an mscale ratio."""
        scaling = self.rope_scaling_dict
        kind = rope_kind(scaling)
        if kind == "default":
            return self.rope_theta, None, {}
        if kind == "llama3":
            if any(scaling.get(k) is None for k in ("low_freq_factor", "high_freq_factor",
                                                     "original_max_position_embeddings")):
                return self.rope_theta, None, {}
            return self.rope_theta, {**scaling, "factor": scaling.get("factor") or 1.0}, {}
        if kind == "dynamic":
            return 10000.0, scaling, {"dynamic_length": self.max_position_embeddings + 20,
                                      "max_position_embeddings": self.max_position_embeddings}
        if kind == "yarn":
            scaling = {k: v for k, v in scaling.items() if k != "attention_factor"}
            scaling.update(truncate=True, original_max_position_embeddings=scaling.get(
                "original_max_position_embeddings") or 4096)
            return 10000.0, scaling, {"yarn_mscale_ratio": True}
        return 10000.0, scaling, {}

    def to_hf(self) -> dict:
        out = {k: json.loads(v) for k, v in self.extra}
        out.setdefault("architectures", ["LlamaForCausalLMDart"])
        out.setdefault("model_type", "llama")
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name == "rope_scaling":
                value = self.rope_scaling_dict
            if f.name == "target_hidden_size" and value is None:
                continue
            out[f.name] = value
        return out


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


def read_head(path_or_id: str | os.PathLike, target_config: Any | None = None) -> tuple[Path, DartHeadConfig, dict]:
    """(folder, config, tensors) of a head checkpoint, checked against its config and, when
    given, against the config of the target it drafts for."""
    folder = head_folder(path_or_id)
    config = read_head_config(folder)
    if target_config is not None:
        check_fits_target(config, target_config)
    tensors = read_tensors(folder)
    check_tensors(config, tensors, f"DART head {path_or_id!s} ({', '.join(p.name for p in weight_files(folder))})")
    if target_config is not None:
        check_fits_target(config, target_config, tensors["d2t"])
    elif problems := _d2t_problems(tensors["d2t"], config.vocab_size):
        raise ValueError(f"DART head {path_or_id!s}: " + "; ".join(problems) + ". The checkpoint's vocabulary mapping is broken.")
    return folder, config, tensors


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
                         + ". Pick the head published for this base model (see docs/spec.md §1 / DartModel's pairs table).")


def _d2t_problems(d2t: np.ndarray, vocab: int) -> list[str]:
    mapped = np.arange(d2t.shape[0], dtype=np.int64) + d2t.astype(np.int64)
    bad = np.flatnonzero((mapped < 0) | (mapped >= vocab))
    if not bad.size:
        return []
    return [f"d2t maps {bad.size} draft ids outside the target vocabulary [0, {vocab}) "
            f"(first: draft id {bad[0]} → {mapped[bad[0]]})"]


def reference_layout(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """The dtype the reference stores a tensor in: d2t int64, t2d bool, floats as `dtype`."""
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(SAVE_DTYPES)}, got {dtype!r}.")
    if name == "d2t":
        return array.astype(np.int64)
    if name == "t2d":
        return array.astype(np.bool_)
    return array.astype(SAVE_DTYPES[dtype])


def write_dart_head(folder: str | os.PathLike, config: DartHeadConfig, tensors: Mapping[str, np.ndarray],
                    dtype: str = "float32") -> Path:
    """Write `config.json` + `model.safetensors` in the reference layout from named arrays in
    the checkpoint's own layout ([out, in] weights), floats as `dtype` ('float32' or 'bfloat16')."""
    out = {}
    for name, (_, shape, _) in tensor_table(config).items():
        if name not in tensors:
            raise ValueError(f"no tensor {name!r} to write; a DART head needs {sorted(tensor_table(config))}.")
        array = reference_layout(name, np.asarray(tensors[name]), dtype)
        if tuple(array.shape) != shape:
            raise ValueError(f"{name}: the arrays give shape {tuple(array.shape)}, the config implies {shape}.")
        out[name] = array
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = config.to_hf()
    hf["torch_dtype"] = dtype
    (folder / CONFIG_NAME).write_text(json.dumps(hf, indent=2) + "\n")
    write_tensors(folder / SINGLE_NAME, out)
    return folder


def export_dart_head(src: str | os.PathLike, dest: str | os.PathLike, dtype: str = "float32",
                     target_config: Any | None = None) -> Path:
    """Re-save a head checkpoint in the reference layout with floats as `dtype` (no model is
    built). Checks it as loading does; against `target_config` when one is given."""
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(SAVE_DTYPES)}, got {dtype!r}.")
    _, config, tensors = read_head(src, target_config)
    return write_dart_head(dest, config, tensors, dtype)
