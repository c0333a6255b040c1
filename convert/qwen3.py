"""Qwen3 checkpoints in the Hugging Face layout: the config, the tensor names and their checks.

`Qwen3Config` is what a checkpoint's config.json says, frozen (it is static under jit). The
tensor table maps every checkpoint name to the parameter it fills (a path of attribute names in
the model built by `dart_jax.models`) and the shape the config implies, so that a checkpoint is
checked whole, from the safetensors headers alone, before any weight is read.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

from .configs import freeze, read_config, thaw
from .hub import resolve
from .safetensors_io import tensor_index, write_checkpoint_tensors

ALLOW_PATTERNS = ("*.json", "*.safetensors")
TARGET_ROPE_KINDS = ("default", "linear", "llama3", "yarn")
# the keys each scaled RoPE kind needs (HF fills original_max_position_embeddings from the config)
_ROPE_NEEDS = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor", "original_max_position_embeddings"),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def rope_kind(scaling: Mapping[str, Any] | None) -> str:
    """The RoPE kind a rope_scaling dict names ('default' for none)."""
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default"))


def check_rope_scaling(scaling: Mapping[str, Any] | None, supported: tuple[str, ...], what: str,
                       needs: Mapping[str, tuple[str, ...]] = _ROPE_NEEDS) -> None:
    """A ValueError naming the problem when `scaling` is of an unsupported kind or lacks a key."""
    kind = rope_kind(scaling)
    if kind not in supported:
        raise ValueError(f"{what}: unsupported rope_scaling type {kind!r}; supported: {', '.join(supported)}.")
    missing = [k for k in needs.get(kind, ()) if scaling.get(k) is None]
    if missing:
        raise ValueError(f"{what}: {kind} rope_scaling needs {missing} (HF fills 'original_max_position_embeddings' "
                         "from the config's max_position_embeddings); add them to the scaling dict.")


_SCALED_ROPE_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                     "mscale", "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # (key, value) pairs so that the config stays hashable (it is static under jit); None = plain RoPE
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"Qwen3 config: {name} must be a positive integer, got {getattr(self, name)!r}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"Qwen3 config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention.")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3 config: head_dim must be even for RoPE, got {self.head_dim}.")
        if self.num_hidden_layers < 3:
            raise ValueError(f"Qwen3 config: DART taps layers 2, L//2 and L-3, so num_hidden_layers must be >= 3, "
                             f"got {self.num_hidden_layers}.")
        check_rope_scaling(self.rope_scaling_dict, TARGET_ROPE_KINDS, "Qwen3 config")

    @property
    def tap_layers(self) -> tuple[int, int, int]:
        n = self.num_hidden_layers
        return (2, n // 2, n - 3)

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return thaw(self.rope_scaling)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "Qwen3Config":
        """Build from a HF Qwen3 `config.json` dict (transformers 4 or 5 layout)."""
        model_type = cfg.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise ValueError(f"expected a Qwen3 config (model_type 'qwen3'), got model_type {model_type!r}.")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ValueError(f"Qwen3 config.json lacks required field(s) {missing}.")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3 config: only hidden_act 'silu' is supported, got {cfg['hidden_act']!r}.")
        if cfg.get("attention_bias", False):
            raise ValueError("Qwen3 config: attention_bias=true is not supported (standard Qwen3 has no q/k/v biases).")
        if cfg.get("use_sliding_window", False) or any(t != "full_attention" for t in cfg.get("layer_types") or ()):
            raise ValueError("Qwen3 config: sliding-window attention layers are not supported; "
                             "set use_sliding_window=false (standard Qwen3 uses full attention).")
        heads = int(cfg["num_attention_heads"])
        max_pos = int(cfg.get("max_position_embeddings", 40960))

        # transformers 5 keeps rope_theta and the scaling inside rope_parameters; older configs keep
        # rope_theta at the top level and the scaling in rope_scaling
        rope_params = dict(cfg.get("rope_parameters") or {})
        theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = dict(cfg.get("rope_scaling") or {}) or rope_params
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            rope_scaling = None
        else:
            scaling = {k: v for k, v in scaling.items() if k in _SCALED_ROPE_KEYS}
            scaling["rope_type"] = kind
            if kind in ("yarn", "llama3"):
                scaling.setdefault("original_max_position_embeddings",
                                   cfg.get("original_max_position_embeddings", max_pos))
            if kind == "yarn" and scaling.get("factor") is None:
                scaling["factor"] = max_pos / scaling["original_max_position_embeddings"]
            rope_scaling = freeze(scaling)

        eos = cfg.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=max_pos,
            eos_token_ids=eos_ids,
        )


def tensor_table(config: Qwen3Config) -> dict[str, tuple[tuple[str | int, ...], tuple[int, ...], bool]]:
    """Checkpoint name → (parameter path in the model, shape in the file, transposed on load).

    PyTorch Linear weights are [out, in]; the model's kernels are [in, out]."""
    c = config
    h, i, d, v = c.hidden_size, c.intermediate_size, c.head_dim, c.vocab_size
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    table = {"model.embed_tokens.weight": (("embed_tokens", "embedding"), (v, h), False),
             "model.norm.weight": (("norm", "weight"), (h,), False)}
    if not c.tie_word_embeddings:
        table["lm_head.weight"] = (("lm_head", "kernel"), (v, h), True)
    for n in range(c.num_hidden_layers):
        layer = ("layers", n)
        p = f"model.layers.{n}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            table[p + norm + ".weight"] = ((*layer, norm, "weight"), (h,), False)
        for name, shape in (("q_proj", (q, h)), ("k_proj", (kv, h)), ("v_proj", (kv, h)), ("o_proj", (h, q))):
            table[p + f"self_attn.{name}.weight"] = ((*layer, "self_attn", name, "kernel"), shape, True)
        for norm in ("q_norm", "k_norm"):
            table[p + f"self_attn.{norm}.weight"] = ((*layer, "self_attn", norm, "weight"), (d,), False)
        for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            table[p + f"mlp.{name}.weight"] = ((*layer, "mlp", name, "kernel"), shape, True)
    return table


def checkpoint_folder(path_or_id: str | os.PathLike) -> Path:
    """The local folder of a Qwen3 checkpoint given as a folder or a hub id."""
    folder = resolve(path_or_id, ALLOW_PATTERNS, what="Qwen3 checkpoint")
    if not folder.is_dir():
        raise FileNotFoundError(f"Qwen3 checkpoint {str(path_or_id)!r} resolved to {folder}, which is not a folder; "
                                "pass the folder that holds config.json and the *.safetensors files.")
    return folder


def load_qwen3_config(path_or_id: str | os.PathLike) -> Qwen3Config:
    """The `Qwen3Config` of a checkpoint folder or hub id (reads only config.json)."""
    folder = checkpoint_folder(path_or_id)
    cfg = read_config(folder, "a HF Qwen3 checkpoint folder needs config.json next to its model.safetensors")
    return Qwen3Config.from_hf(cfg)


def check_checkpoint(folder: Path, config: Qwen3Config) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Every tensor of the checkpoint against the config, from the headers alone; returns the
    index name → (file, shape). A ValueError lists missing and unexpected names, or the first
    tensor whose shape the config does not imply."""
    index = tensor_index(folder)
    table = tensor_table(config)
    missing = sorted(set(table) - set(index))
    unexpected = sorted(set(index) - set(table))
    if missing or unexpected:
        hint = ""
        if "lm_head.weight" in missing and config.tie_word_embeddings is False:
            hint = " (config.json says tie_word_embeddings=false, so lm_head.weight is required)"
        if "lm_head.weight" in unexpected:
            hint = " (config.json says tie_word_embeddings=true but the checkpoint has lm_head.weight)"
        raise ValueError(f"checkpoint {folder} does not match its Qwen3 config{hint}: missing tensors "
                         f"{missing[:10]}{' ...' if len(missing) > 10 else ''}, unexpected tensors "
                         f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}.")
    for name, (_, shape, _) in table.items():
        if index[name][1] != shape:
            raise ValueError(f"tensor {name!r} in {index[name][0].name} has shape {index[name][1]}, expected "
                             f"{shape} from config.json; the checkpoint and its config disagree.")
    return index


def save_qwen3(folder: str | os.PathLike, config_dict: Mapping[str, Any], tensors: Mapping[str, Any], *,
               max_shard_size_bytes: int | None = None) -> Path:
    """Write a checkpoint in the Hugging Face layout: `config.json` (`config_dict` as given) and
    the tensors, named as `tensor_table` names them (the table the loader reads with), in one
    `model.safetensors` or, with `max_shard_size_bytes`, in shards with their index. Tensors are
    NumPy arrays in the checkpoint's layout ([out, in] weights) and dtype (bf16 as
    ml_dtypes.bfloat16). Names and shapes are checked against the config before anything is
    written."""
    config = Qwen3Config.from_hf(config_dict)
    table = tensor_table(config)
    missing = sorted(set(table) - set(tensors))
    unexpected = sorted(set(tensors) - set(table))
    if missing or unexpected:
        raise ValueError(f"the tensors do not match the Qwen3 config: missing {missing[:10]}"
                         f"{' ...' if len(missing) > 10 else ''}, unexpected {unexpected[:10]}"
                         f"{' ...' if len(unexpected) > 10 else ''}; pass exactly the names of tensor_table(config).")
    for name, (_, shape, _) in table.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(tensors[name].shape)}, the config implies {shape}.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config_dict), indent=2) + "\n")
    write_checkpoint_tensors(folder, {name: tensors[name] for name in table}, max_shard_size_bytes)
    return folder
