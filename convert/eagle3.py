"""EAGLE-3 head checkpoints in the published layout (docs/spec.md §9): config, tensor names, checks.

A head folder (or hub id, e.g. `AngelSlim/Qwen3-4B_eagle3`) holds `config.json` (Llama-style,
`LlamaForCausalLMEagle3`) and `model.safetensors` with PyTorch names: `fc.weight` over the
target's three taps, one decoder layer `midlayer.*` whose attention reads 2H features, `norm`,
`lm_head` over the draft vocabulary, and the draft → target map `d2t` / `t2d` (optional when the
draft vocabulary is the target's). A tensor `embed_tokens.weight` is the head's own embedding
(the reference loads it over the target's); without it the target's embedding is shared.
Everything is checked against the config and the target before any array is built; building the
module is `dart_jax.models.checkpoints.load_eagle3_head`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from dart_jax.errors import FileFormatError, InputError

from .configs import (check_int, check_object, config_from_file, freeze, json_type, read_config, required,
                      thaw)
from .dart_head import BUFFERS, check_layer_fields, table_problems, vocabulary_problems
from .hub import resolve
from .qwen3 import check_rope_scaling, rope_kind
from .files import atomic_folder
from .safetensors_io import SINGLE_NAME, check_weight, read_tensors, tensor_index, write_tensors

CONFIG_NAME = "config.json"
EMBEDDING = "embed_tokens.weight"
# the reference (EAGLE's cnets.py) builds plain RoPE over rope_theta, or linear scaling over base 10000
EAGLE3_ROPE_KINDS = ("default", "linear")
_WHAT = "EAGLE-3 head config"
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 head's config.json. Hashable (it sits in a GraphDef); unused fields are kept in
    `extra` as (key, JSON text). Checked on construction (an InputError naming the field)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    target_hidden_size: int | None = None
    extra: tuple = ()

    def __post_init__(self):
        check_layer_fields(self, _WHAT)
        check_rope_scaling(self.rope_scaling_dict, EAGLE3_ROPE_KINDS, _WHAT, {"linear": ("factor",)})

    @property
    def fc_in(self) -> int:
        return 3 * (self.target_hidden_size or self.hidden_size)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return thaw(self.rope_scaling)

    def rope_arguments(self) -> tuple[float, dict | None]:
        """(theta, scaling) of `dart_jax.models.layers.rope_inv_freq` giving the reference's tables:
        plain RoPE over rope_theta; linear scaling over base 10000 (the reference passes no base)."""
        scaling = self.rope_scaling_dict
        if rope_kind(scaling) == "default":
            return self.rope_theta, None
        return 10000.0, scaling

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "Eagle3Config":
        """From a head's config.json dict (null num_key_value_heads / head_dim / draft_vocab_size /
        target_hidden_size / rope_scaling mean "not set", as in transformers)."""
        if not isinstance(cfg, Mapping):
            raise InputError(f"{_WHAT}: expected a JSON object, got {json_type(cfg)}.")
        required(cfg, _REQUIRED, _WHAT + " (Llama-style fields)")
        layers = cfg.get("num_hidden_layers")
        if layers is not None and layers != 1:
            raise InputError(f"{_WHAT}: an EAGLE-3 head has one decoder layer, but `num_hidden_layers` is "
                             f"{json_type(layers)}; is this an EAGLE-3 head?")
        heads = check_int(_WHAT, "num_attention_heads", cfg["num_attention_heads"])
        head_dim = cfg.get("head_dim")
        if head_dim is None:
            head_dim = check_int(_WHAT, "hidden_size", cfg["hidden_size"]) // heads
            if head_dim < 1:
                raise InputError(f"{_WHAT}: head_dim is absent and hidden_size // num_attention_heads is 0.")
        kv_heads = cfg.get("num_key_value_heads")
        draft_vocab = cfg.get("draft_vocab_size")
        rope_scaling = check_object(_WHAT, "rope_scaling", cfg.get("rope_scaling")) or None
        if rope_scaling is not None and rope_kind(rope_scaling) not in EAGLE3_ROPE_KINDS:
            raise InputError(f"{_WHAT}: unsupported rope_scaling type {rope_kind(rope_scaling)!r}; the EAGLE-3 "
                             f"reference supports {', '.join(EAGLE3_ROPE_KINDS)}.")
        known = {f.name for f in dataclasses.fields(cls)} | {"torch_dtype", "dtype"}
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            draft_vocab_size=cfg["vocab_size"] if draft_vocab is None else draft_vocab,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta") if cfg.get("rope_theta") is not None else 10000.0,
            rope_scaling=None if rope_scaling is None else freeze(rope_scaling),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            hidden_act=cfg.get("hidden_act", "silu"),
            target_hidden_size=cfg.get("target_hidden_size"),
            extra=tuple(sorted((k, json.dumps(v)) for k, v in cfg.items() if k not in known)),
        )

    def to_hf(self) -> dict:
        out = {k: json.loads(v) for k, v in self.extra}
        out.setdefault("architectures", ["LlamaForCausalLMEagle3"])
        out.setdefault("model_type", "llama")
        out.setdefault("num_hidden_layers", 1)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name == "target_hidden_size" and value is None):
                continue
            out[f.name] = self.rope_scaling_dict if f.name == "rope_scaling" else value
        return out


def tensor_table(config: Eagle3Config, *, own_embedding: bool = False
                 ) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]:
    """Checkpoint name → (path in the module, checkpoint shape, transposed on load). `d2t`/`t2d`
    are listed when the draft vocabulary is smaller than the target's; `embed_tokens.weight`
    with `own_embedding`."""
    h, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    table = {
        "fc.weight": (("fc", "kernel"), (h, config.fc_in), True),
        "norm.weight": (("norm", "weight"), (h,), False),
        "lm_head.weight": (("lm_head", "kernel"), (config.draft_vocab_size, h), True),
    }
    if config.draft_vocab_size != config.vocab_size:
        table["d2t"] = (("d2t",), (config.draft_vocab_size,), False)
        table["t2d"] = (("t2d",), (config.vocab_size,), False)
    if own_embedding:
        table[EMBEDDING] = (("embed_tokens", "embedding"), (config.vocab_size, h), False)
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        table[f"midlayer.{norm}.weight"] = (("midlayer", norm, "weight"), (h,), False)
    for name, shape in (("q_proj", (q, 2 * h)), ("k_proj", (kv, 2 * h)), ("v_proj", (kv, 2 * h)), ("o_proj", (h, q))):
        table[f"midlayer.self_attn.{name}.weight"] = (("midlayer", "self_attn", name, "kernel"), shape, True)
    for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
        table[f"midlayer.mlp.{name}.weight"] = (("midlayer", "mlp", name, "kernel"), shape, True)
    return table


def eagle3_folder(path_or_id: str | os.PathLike) -> Path:
    """The local folder of a head given as a folder, a file in it, or a hub id."""
    folder = resolve(path_or_id, allow_patterns=[CONFIG_NAME, "*.safetensors", "*.json"], what="EAGLE-3 head")
    return folder.parent if folder.is_file() else folder


def read_eagle3_config(folder: Path) -> Eagle3Config:
    """The `Eagle3Config` of a head folder; a bad value is a FileFormatError naming its config.json."""
    raw = read_config(folder, "an EAGLE-3 head folder holds config.json and model.safetensors")
    return config_from_file(Path(folder) / CONFIG_NAME, lambda: Eagle3Config.from_hf(raw))


def check_fits_target(config: Eagle3Config, target_config: Any, *, own_embedding: bool = False,
                      where: str = "this EAGLE-3 head") -> None:
    """The head against the target it drafts for (an InputError naming each mismatch)."""
    problems = []
    th, tv = int(target_config.hidden_size), int(target_config.vocab_size)
    if config.fc_in != 3 * th:
        problems.append(f"the head's fc reads 3×{config.fc_in // 3} tap features but the target's taps have 3×{th}")
    if config.vocab_size != tv:
        problems.append(f"head vocab_size {config.vocab_size} != target vocab_size {tv}")
    if not own_embedding and config.hidden_size != th:
        problems.append(f"head hidden_size {config.hidden_size} != target hidden_size {th}, and the head has no "
                        f"{EMBEDDING} of its own to embed tokens with")
    if problems:
        raise InputError(f"{where} does not fit the target: " + "; ".join(problems)
                         + ". Pick the EAGLE-3 head published for this base model.")


def _problems(config: Eagle3Config, found: Mapping[str, tuple[tuple[int, ...], Any]]) -> list[str]:
    optional = BUFFERS if config.draft_vocab_size == config.vocab_size else ()
    return table_problems(tensor_table(config, own_embedding=EMBEDDING in found), found, optional)


def _where(files: Mapping[str, tuple[Path, tuple[int, ...], str]], folder: Path, name: str | None = None) -> Path:
    if name is not None and name in files:
        return Path(files[name][0])
    distinct = {Path(entry[0]) for entry in files.values()}
    return distinct.pop() if len(distinct) == 1 else Path(folder)


def read_eagle3(path_or_id: str | os.PathLike, target_config: Any | None = None
                ) -> tuple[Path, Eagle3Config, dict[str, np.ndarray]]:
    """(folder, config, tensors) of an EAGLE-3 head, checked: config values; tensor names, shapes
    and dtypes from the headers before any value is read; finite weights; a one-to-one `d2t` with
    a matching `t2d`; the fit to the target when its config is given. Each problem is an error
    naming the file."""
    folder = eagle3_folder(path_or_id)
    config = read_eagle3_config(folder)
    files = tensor_index(folder)
    own = EMBEDDING in files
    if target_config is not None:
        check_fits_target(config, target_config, own_embedding=own, where=f"EAGLE-3 head {folder}")
    problems = _problems(config, {name: (shape, dtype) for name, (_, shape, dtype) in files.items()})
    if problems:
        raise FileFormatError(_where(files, folder), (
            f"the EAGLE-3 head does not match its config.json (hidden_size={config.hidden_size}, draft_vocab_size="
            f"{config.draft_vocab_size}, vocab_size={config.vocab_size}): " + "; ".join(problems)
            + ". Is this an EAGLE-3 head in the published layout (fc, midlayer.*, norm, lm_head, d2t, t2d)?"))
    tensors = read_tensors(folder)
    for name, array in tensors.items():
        if name not in BUFFERS:
            check_weight(array, name, _where(files, folder, name))
    if config.draft_vocab_size != config.vocab_size:
        bad = vocabulary_problems(tensors["d2t"], tensors["t2d"], config.vocab_size)
        if bad:
            raise FileFormatError(_where(files, folder, "d2t"), "the EAGLE-3 head's vocabulary mapping is broken: "
                                  + "; ".join(bad) + ". Use an intact copy of the head.")
    return folder, config, tensors


def write_eagle3_head(folder: str | os.PathLike, config: Eagle3Config, tensors: Mapping[str, np.ndarray], *,
                      make_parents: bool = True) -> Path:
    """Write `config.json` + `model.safetensors` in the published layout from named arrays in the
    checkpoint's own layout ([out, in] weights; d2t stored int64, t2d bool, floats float32),
    atomically (see `convert.files.atomic_folder`)."""
    own = EMBEDDING in tensors
    out = {}
    for name, (_, shape, _) in tensor_table(config, own_embedding=own).items():
        if name not in tensors:
            raise InputError(f"no tensor {name!r} to write; an EAGLE-3 head needs {sorted(tensor_table(config))}.")
        array = np.asarray(tensors[name])
        array = array.astype(np.int64 if name == "d2t" else np.bool_ if name == "t2d" else np.float32)
        if tuple(array.shape) != shape:
            raise InputError(f"{name}: the arrays give shape {tuple(array.shape)}, the config implies {shape}.")
        out[name] = array
    hf = config.to_hf()
    hf["torch_dtype"] = "float32"
    with atomic_folder(folder, (CONFIG_NAME, SINGLE_NAME), make_parents=make_parents, what="EAGLE-3 head folder") as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(hf, indent=2) + "\n")
        write_tensors(tmp / SINGLE_NAME, out)
    return Path(folder)
