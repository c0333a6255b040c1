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
import re
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from dart_jax.errors import FileFormatError, InputError

from .configs import (check_float, check_int, check_object, check_str, config_from_file, freeze, json_type,
                      read_config, required, thaw)
from .files import atomic_folder, check_apart
from .hub import resolve
from .qwen3 import check_rope_scaling, rope_kind
from .safetensors_io import (FLOAT_DTYPES, SINGLE_NAME, check_weight, read_tensors, tensor_index, write_tensors)

CONFIG_NAME = "config.json"
IGNORED = ("embed_tokens.weight",)
BUFFERS = ("d2t", "t2d")
SAVE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "relu")
HEAD_ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")
_HEAD_ROPE_NEEDS = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",)}
# the head drafts draft_length + 1 rows per step (the published heads: 7); far more is a broken
# config, and would only ask the tree search and the head cache for memory
MAX_DRAFT_LENGTH = 256
_WHAT = "DART head config"


_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "draft_length", "draft_vocab_size")
_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
          "draft_vocab_size")


def check_layer_fields(config, what: str) -> None:
    """Check and normalise, in place, the Llama-style fields a draft head's config shares (the DART
    head's and EAGLE-3's: sizes, draft vocabulary, head grouping, norms, RoPE, activation); an
    InputError names `what` and the field."""
    def put(name, value):
        object.__setattr__(config, name, value)

    for name in _SIZES:
        put(name, check_int(what, name, getattr(config, name)))
    if config.draft_vocab_size > config.vocab_size:
        raise InputError(f"{what}: draft_vocab_size {config.draft_vocab_size} exceeds vocab_size {config.vocab_size}; "
                         "the draft vocabulary is a subset of the target's.")
    if config.num_attention_heads % config.num_key_value_heads:
        raise InputError(f"{what}: num_attention_heads={config.num_attention_heads} is not a multiple of "
                         f"num_key_value_heads={config.num_key_value_heads}.")
    if config.head_dim % 2:
        raise InputError(f"{what}: head_dim must be even for RoPE, got {config.head_dim}.")
    put("rms_norm_eps", check_float(what, "rms_norm_eps", config.rms_norm_eps))
    put("rope_theta", check_float(what, "rope_theta", config.rope_theta))
    put("max_position_embeddings", check_int(what, "max_position_embeddings", config.max_position_embeddings))
    put("hidden_act", check_str(what, "hidden_act", config.hidden_act, ACTIVATIONS))
    if config.target_hidden_size is not None:
        put("target_hidden_size", check_int(what, "target_hidden_size", config.target_hidden_size))
    if config.rope_scaling is not None and not isinstance(config.rope_scaling, tuple):
        raise InputError(f"{what}: rope_scaling must be given frozen, as sorted (key, value) pairs "
                         f"(convert.configs.freeze), got {json_type(config.rope_scaling)}.")


@dataclasses.dataclass(frozen=True)
class DartHeadConfig:
    """The head's config.json (Llama-style fields plus draft_length / draft_vocab_size).

    Hashable, so it can sit in a GraphDef or be a static jit argument. `rope_scaling` is kept as
    sorted (key, value) pairs; `rope_scaling_dict` gives it back as a dict. Fields we do not use
    are kept in `extra` (key, JSON text) so that `to_hf` writes them back unchanged. Checked on
    construction (types, ranges, finiteness: an InputError naming the field) and normalised to
    plain Python values.
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

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        check_layer_fields(self, _WHAT)
        put("draft_length", check_int(_WHAT, "draft_length", self.draft_length, maximum=MAX_DRAFT_LENGTH,
                                      hint=" (the head drafts draft_length + 1 rows per step; the published heads use 7)"))
        if not isinstance(self.extra, tuple):
            raise InputError(f"{_WHAT}: extra must be a tuple of (key, JSON text) pairs, got {json_type(self.extra)}.")
        scaling = self.rope_scaling_dict
        check_rope_scaling(scaling, HEAD_ROPE_KINDS, _WHAT, _HEAD_ROPE_NEEDS)
        if rope_kind(scaling) == "dynamic" and self.head_dim <= 2:
            raise InputError(f"{_WHAT}: dynamic RoPE needs head_dim > 2, got {self.head_dim}.")

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
        """From a head's config.json dict. Null stands for "not set" in num_key_value_heads,
        head_dim (both default as in transformers), rope_scaling, rope_parameters and
        target_hidden_size; elsewhere it is an error like any other wrong type."""
        if not isinstance(cfg, Mapping):
            raise InputError(f"{_WHAT}: expected a JSON object, got {json_type(cfg)}.")
        required(cfg, _REQUIRED, _WHAT + " (Llama-style fields plus draft_length and draft_vocab_size)")
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads")
        head_dim = cfg.get("head_dim")
        if head_dim is None:  # as transformers: hidden_size // num_attention_heads
            hidden = check_int(_WHAT, "hidden_size", cfg["hidden_size"])
            head_dim = hidden // check_int(_WHAT, "num_attention_heads", heads)
            if head_dim < 1:
                raise InputError(f"{_WHAT}: head_dim is absent, and hidden_size // num_attention_heads = "
                                 f"{hidden} // {heads} = 0; set head_dim or correct the sizes.")
        rope_scaling = check_object(_WHAT, "rope_scaling", cfg.get("rope_scaling")) or None  # {}: none
        params = check_object(_WHAT, "rope_parameters", cfg.get("rope_parameters")) or {}
        # transformers >= 5 writes rope_theta (and the scaling kind) inside rope_parameters
        params = dict(params)
        nested_theta = params.pop("rope_theta", None)
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:
            rope_theta = nested_theta if nested_theta is not None else 10000.0
        if rope_scaling is None and params:
            if not isinstance(params.get("rope_type", "default"), str):
                raise InputError(f"{_WHAT}: `rope_parameters.rope_type` must be a string naming the RoPE kind, got "
                                 f"{json_type(params['rope_type'])}.")
            if params.get("rope_type", "default") != "default":
                check_rope_scaling(params, HEAD_ROPE_KINDS, _WHAT, _HEAD_ROPE_NEEDS, name="rope_parameters")
                rope_scaling = params
        elif rope_scaling is not None:
            check_rope_scaling(rope_scaling, HEAD_ROPE_KINDS, _WHAT, _HEAD_ROPE_NEEDS)
        # torch_dtype / dtype describe a saved file, not the head; save_dart_head writes its own
        known = {f.name for f in dataclasses.fields(cls)} | {"rope_parameters", "torch_dtype", "dtype"}
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            draft_length=cfg["draft_length"],
            draft_vocab_size=cfg["draft_vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=None if rope_scaling is None else freeze(rope_scaling),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            hidden_act=cfg.get("hidden_act", "silu"),
            target_hidden_size=cfg.get("target_hidden_size"),
            extra=tuple(sorted((k, json.dumps(v)) for k, v in cfg.items() if k not in known)),
        )

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
    """The `DartHeadConfig` of a head folder; a bad value is a FileFormatError naming its config.json."""
    raw = read_config(folder, "a DART head folder holds config.json and model.safetensors")
    return config_from_file(Path(folder) / CONFIG_NAME, lambda: DartHeadConfig.from_hf(raw))


def read_head(path_or_id: str | os.PathLike, target_config: Any | None = None) -> tuple[Path, DartHeadConfig, dict]:
    """(folder, config, tensors) of a head checkpoint, checked (`check_head`) against its config
    and, when given, against the config of the target it drafts for."""
    folder = head_folder(path_or_id)
    config = read_head_config(folder)
    if target_config is not None:
        check_fits_target(config, target_config, where=f"DART head {folder}")
    files = tensor_files(folder)
    check_names(config, files, folder)  # from the headers, before any value is read
    tensors = read_tensors(folder)
    check_head(folder, config, tensors, target_config, files=files)
    return folder, config, tensors


def tensor_files(folder: Path) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Name → (file, shape, dtype name) of a head's tensors, from the safetensors headers."""
    return tensor_index(folder)


def _where(folder: Path, files: Mapping[str, Any] | None, name: str | None = None) -> Path:
    """The file to name in an error: the one holding `name`, the only weight file, or the folder."""
    if files:
        if name is not None and name in files:
            return Path(files[name][0])
        distinct = {Path(entry[0]) for entry in files.values()}
        if len(distinct) == 1:
            return distinct.pop()
    return Path(folder)


def check_names(config: DartHeadConfig, files: Mapping[str, tuple[Path, tuple[int, ...], str]], folder: Path) -> None:
    """Names, shapes and dtypes of a head's tensors (from the headers) against its config."""
    problems = _table_problems(config, {name: (shape, dtype) for name, (_, shape, dtype) in files.items()})
    if problems:
        raise FileFormatError(_where(folder, files), _mismatch(config, problems))


def _mismatch(config: DartHeadConfig, problems: list[str]) -> str:
    return (f"the DART head does not match its config.json (hidden_size={config.hidden_size}, draft_vocab_size="
            f"{config.draft_vocab_size}, vocab_size={config.vocab_size}): " + "; ".join(problems)
            + ". Is this a DART head checkpoint saved by the reference or save_dart_head?")


def _table_problems(config: DartHeadConfig, found: Mapping[str, tuple[tuple[int, ...], str]]) -> list[str]:
    """What is wrong with tensors of these (shape, dtype) — dtype as NumPy or safetensors names it."""
    return table_problems(tensor_table(config), found, IGNORED)


def table_problems(table: Mapping[str, tuple], found: Mapping[str, tuple[tuple[int, ...], Any]],
                   optional=()) -> list[str]:
    """What is wrong with tensors of these (shape, dtype) against a head's tensor table (name →
    (key, shape, ...)): missing or unexpected names (`optional` ones may be there), shapes, and
    dtypes (the d2t/t2d maps integer or bool, every other tensor a float)."""
    problems = []
    missing = sorted(set(table) - set(found))
    unexpected = sorted(set(found) - set(table) - set(optional))
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected}")
    for name, (_, shape, _) in table.items():
        if name not in found:
            continue
        got, dtype = found[name]
        if tuple(got) != shape:
            problems.append(f"{name} has shape {tuple(got)}, the config implies {shape}")
        kind = _dtype_kind(dtype)
        if name == "d2t" and kind != "int":
            problems.append(f"d2t must hold integers (int64), found {dtype}")
        elif name == "t2d" and kind not in ("bool", "int"):
            problems.append(f"t2d must be bool, found {dtype}")
        elif name not in BUFFERS and kind != "float":
            problems.append(f"{name} must be a float tensor ({', '.join(FLOAT_DTYPES)}), found {dtype}")
    return problems


def _dtype_kind(dtype: Any) -> str:
    """'float', 'int', 'bool' or 'other' for a NumPy dtype or a safetensors dtype name."""
    name = str(dtype)
    if name in FLOAT_DTYPES or name in ("float16", "bfloat16", "float32", "float64"):
        return "float"
    if name == "BOOL" or name == "bool":
        return "bool"
    if re.fullmatch(r"[IU](8|16|32|64)|u?int(8|16|32|64)", name):
        return "int"
    return "other"


def check_tensors(config: DartHeadConfig, tensors: dict[str, np.ndarray], where: str | os.PathLike) -> None:
    """Names, shapes and dtypes of a head checkpoint's arrays against its config (a
    FileFormatError naming `where` and listing all problems)."""
    problems = _table_problems(config, {name: (tuple(a.shape), a.dtype) for name, a in tensors.items()})
    if problems:
        raise FileFormatError(where, _mismatch(config, problems))


def check_head(folder: Path, config: DartHeadConfig, tensors: Mapping[str, np.ndarray], target_config: Any | None = None,
               *, files: Mapping[str, tuple[Path, tuple[int, ...], str]] | None = None) -> None:
    """Everything loading checks of a head's values: names, shapes, dtypes, finite weights, and a
    vocabulary mapping that is one-to-one and consistent (d2t inside the vocabulary, no two
    draft ids on one target id, t2d marking exactly the ids d2t reaches); against the target
    when its config is given. Each problem is a FileFormatError naming the head's file."""
    check_tensors(config, tensors, _where(folder, files))
    for name, array in tensors.items():
        if name not in BUFFERS and name not in IGNORED:
            check_weight(array, name, _where(folder, files, name))
    if target_config is not None:
        check_fits_target(config, target_config, where=f"DART head {folder}")
    vocab = config.vocab_size if target_config is None else int(target_config.vocab_size)
    problems = vocabulary_problems(tensors["d2t"], tensors["t2d"], vocab)
    if problems:
        raise FileFormatError(_where(folder, files, "d2t"), "the DART head's vocabulary mapping is broken: "
                              + "; ".join(problems) + ". The head is corrupted or was not saved by a DART trainer; "
                              "use an intact copy.")


def check_fits_target(config: DartHeadConfig, target_config: Any, d2t: np.ndarray | None = None, *,
                      where: str = "this DART head") -> None:
    """The head against the target it will draft for (an InputError naming each mismatch)."""
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
        raise InputError(f"{where} does not fit the target: " + "; ".join(problems)
                         + ". Pick the head published for this base model (see docs/spec.md §1 / DartModel's pairs table).")


def _d2t_problems(d2t: np.ndarray, vocab: int) -> list[str]:
    mapped = np.arange(d2t.shape[0], dtype=np.int64) + d2t.astype(np.int64)
    bad = np.flatnonzero((mapped < 0) | (mapped >= vocab))
    if not bad.size:
        return []
    return [f"d2t maps {bad.size} draft ids outside the target vocabulary [0, {vocab}) "
            f"(first: draft id {bad[0]} → {mapped[bad[0]]})"]


def vocabulary_problems(d2t: np.ndarray, t2d: np.ndarray, vocab: int) -> list[str]:
    """What is wrong with a head's draft → target mapping (`d2t` [Vd] offsets, `t2d` [V] marks)
    over a target vocabulary of `vocab` ids: ids outside it, two draft ids on one target id, a
    t2d that does not mark exactly the target ids d2t reaches."""
    d2t, t2d = np.asarray(d2t), np.asarray(t2d)
    if d2t.dtype.kind not in "iu" or t2d.dtype.kind not in "biu":
        return [f"d2t must hold integers and t2d booleans, found {d2t.dtype} and {t2d.dtype}"]
    if d2t.dtype.kind == "u" and d2t.size and int(d2t.max()) > vocab:
        return [f"d2t holds the offset {int(d2t.max())}, beyond the target vocabulary of {vocab}"]
    problems = _d2t_problems(d2t, vocab)
    if problems:
        return problems
    mapped = np.arange(d2t.shape[0], dtype=np.int64) + d2t.astype(np.int64)
    order = np.argsort(mapped, kind="stable")
    same = np.flatnonzero(mapped[order][1:] == mapped[order][:-1])
    if same.size:
        a, b = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        problems.append(f"d2t maps draft ids {a} and {b} to the same target id {int(mapped[a])} "
                        f"({same.size} such collision(s)); each draft id needs its own target id")
    raw = t2d.view(np.uint8) if t2d.dtype.kind == "b" else t2d
    if raw.size and not np.isin(raw, (0, 1)).all():  # a bool byte other than 0/1 is a corrupted file too
        problems.append(f"t2d must hold only true/false (0/1), found the value {int(raw[~np.isin(raw, (0, 1))][0])}")
    elif t2d.shape == (vocab,):
        want = np.zeros(vocab, bool)
        want[mapped] = True
        differ = np.flatnonzero(want != t2d.astype(bool))
        if differ.size:
            v = int(differ[0])
            problems.append(f"t2d disagrees with d2t on {differ.size} target id(s) (first: target id {v} is "
                            f"{'marked' if t2d[v] else 'not marked'} in t2d but d2t {'does not reach' if t2d[v] else 'reaches'} it)")
    else:
        problems.append(f"t2d has shape {tuple(t2d.shape)}, expected ({vocab},)")
    return problems


def reference_problems(config: DartHeadConfig, target_config: Any | None = None) -> list[str]:
    """What would stop the PyTorch reference (fvliang/DART) from loading or running this head over
    that target although dart_jax runs it (docs/spec.md §1, "Exporting a head"): its config class
    accepts `rope_scaling` only as null or exactly {"type": "linear" or "dynamic", "factor": a
    float > 1}, and its target hands the head the hidden states of the *distinct* layers among
    2, L//2 and L-3, which are three only when L >= 7. Empty when the reference takes it as is."""
    problems = []
    scaling = config.rope_scaling_dict
    if scaling is not None and not (set(scaling) == {"type", "factor"} and scaling["type"] in ("linear", "dynamic")
                                    and isinstance(scaling["factor"], float) and scaling["factor"] > 1):
        problems.append(f"the reference's head config refuses rope_scaling {scaling} (it takes null or "
                        "{\"type\": \"linear\" or \"dynamic\", \"factor\": a float > 1}, nothing else)")
    if target_config is not None and len(set(target_config.tap_layers)) < 3:
        layers = target_config.num_hidden_layers
        problems.append(f"the base has {layers} layers, so its tap layers {target_config.tap_layers} coincide and the "
                        "reference would hand the head fewer than 3 hidden states (it needs num_hidden_layers >= 7)")
    return problems


def reference_layout(name: str, array: np.ndarray, dtype: str) -> np.ndarray:
    """The dtype the reference stores a tensor in: d2t int64, t2d bool, floats as `dtype`."""
    if dtype not in SAVE_DTYPES:
        raise InputError(f"dtype must be one of {sorted(SAVE_DTYPES)}, got {dtype!r}.")
    if name == "d2t":
        return array.astype(np.int64)
    if name == "t2d":
        return array.astype(np.bool_)
    return array.astype(SAVE_DTYPES[dtype])


def write_dart_head(folder: str | os.PathLike, config: DartHeadConfig, tensors: Mapping[str, np.ndarray],
                    dtype: str = "float32", *, make_parents: bool = True) -> Path:
    """Write `config.json` + `model.safetensors` in the reference layout from named arrays in
    the checkpoint's own layout ([out, in] weights), floats as `dtype` ('float32' or 'bfloat16').

    Atomic: both files are written into a scratch folder beside `folder`, which is renamed to
    `folder` when complete (replacing a previous head there), so a killed writer leaves the
    previous head or none, never a partial one. `folder` may not be a file, nor a folder holding
    other files; its parent folders are created with `make_parents`, else must exist."""
    out = {}
    for name, (_, shape, _) in tensor_table(config).items():
        if name not in tensors:
            raise InputError(f"no tensor {name!r} to write; a DART head needs {sorted(tensor_table(config))}.")
        array = reference_layout(name, np.asarray(tensors[name]), dtype)
        if tuple(array.shape) != shape:
            raise InputError(f"{name}: the arrays give shape {tuple(array.shape)}, the config implies {shape}.")
        out[name] = array
    hf = config.to_hf()
    hf["torch_dtype"] = dtype
    text = json.dumps(hf, indent=2) + "\n"
    with atomic_folder(folder, (CONFIG_NAME, SINGLE_NAME), make_parents=make_parents, what="DART head folder") as tmp:
        (tmp / CONFIG_NAME).write_text(text)
        write_tensors(tmp / SINGLE_NAME, out)
    return Path(folder)


def export_dart_head(src: str | os.PathLike, dest: str | os.PathLike, dtype: str = "float32",
                     target_config: Any | None = None) -> Path:
    """Re-save a head checkpoint in the reference layout with floats as `dtype` (no model is
    built). Checks it as loading does; against `target_config` when one is given. `dest` is
    written atomically (`write_dart_head`); its parent folder must exist."""
    if dtype not in SAVE_DTYPES:
        raise InputError(f"dtype must be one of {sorted(SAVE_DTYPES)}, got {dtype!r}.")
    check_apart(dest, [("head", src)], "export folder")
    _, config, tensors = read_head(src, target_config)
    return write_dart_head(dest, config, tensors, dtype, make_parents=False)
