"""Target checkpoints in the Hugging Face layout (Qwen3, and Llama-family bases): the config, the
tensor names and their checks.

`Qwen3Config` is what a checkpoint's config.json says, frozen (it is static under jit); a Llama
config (`model_type` "llama", `from_hf_llama`) is the same decoder without Qwen3's per-head q/k
norms, with optional q/k/v/o biases (`attention_bias`); a Qwen3-MoE config (`model_type`
"qwen3_moe", `from_hf_qwen3_moe`) is Qwen3's decoder whose sparse layers route each token to a few
experts (`sparse_layer`, docs/spec.md §2.2). The
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

from dart_jax.errors import FileFormatError, InputError, MissingFileError

from .configs import (MAX_LAYERS, MAX_SIZE, check_bool, check_float, check_int, check_object, check_str,
                      config_from_file, freeze, json_type, read_config, required, thaw)
from .hub import resolve
from .safetensors_io import FLOAT_DTYPES, tensor_index, write_checkpoint_tensors

ALLOW_PATTERNS = ("*.json", "*.safetensors")
TARGET_ROPE_KINDS = ("default", "linear", "llama3", "yarn")
TARGET_TYPES = ("qwen3", "llama", "qwen3_moe")  # the `model_type`s a target config may name
_FAMILY = {"qwen3": "Qwen3", "llama": "Llama", "qwen3_moe": "Qwen3-MoE"}
# the keys each scaled RoPE kind needs (HF fills original_max_position_embeddings from the config)
_ROPE_NEEDS = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor", "original_max_position_embeddings"),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def rope_kind(scaling: Mapping[str, Any] | None) -> str:
    """The RoPE kind a rope_scaling dict names ('default' for none)."""
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default"))


# the numeric keys a scaling dict may hold, and what each must be when present (not null)
_ROPE_FLOATS = ("factor", "beta_fast", "beta_slow", "attention_factor", "low_freq_factor", "high_freq_factor")
_ROPE_NONNEGATIVE = ("mscale", "mscale_all_dim")


def check_rope_scaling(scaling: Mapping[str, Any] | None, supported: tuple[str, ...], what: str,
                       needs: Mapping[str, tuple[str, ...]] = _ROPE_NEEDS, *, name: str = "rope_scaling") -> None:
    """An InputError naming the problem when `scaling` (a dict or None; `name` is its field in
    config.json) is of an unsupported kind, lacks a key its kind needs, or holds a value the
    RoPE tables cannot be built from (a factor <= 0, NaN, a string, ...)."""
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise InputError(f"{what}: `{name}` must be a JSON object (or null), got {json_type(scaling)}.")
    for key in ("rope_type", "type"):
        if key in scaling and not isinstance(scaling[key], str):
            raise InputError(f"{what}: `{name}.{key}` must be a string naming the RoPE kind, got "
                             f"{json_type(scaling[key])}.")
    kind = rope_kind(scaling)
    if kind not in supported:
        raise InputError(f"{what}: unsupported {name} type {kind!r}; supported: {', '.join(supported)}.")
    missing = [k for k in needs.get(kind, ()) if scaling.get(k) is None]
    if missing:
        hf = (" (transformers fills 'original_max_position_embeddings' from the config's max_position_embeddings)"
              if "original_max_position_embeddings" in missing else "")
        raise InputError(f"{what}: {kind} {name} needs {missing}{hf}; add them to `{name}`.")
    if kind == "default":
        return
    for key in _ROPE_FLOATS:
        if scaling.get(key) is not None:
            check_float(what, f"{name}.{key}", scaling[key])
    for key in _ROPE_NONNEGATIVE:
        if scaling.get(key) is not None and check_float(what, f"{name}.{key}", scaling[key], positive=False) < 0:
            raise InputError(f"{what}: `{name}.{key}` must be >= 0, got {json_type(scaling[key])}.")
    if scaling.get("original_max_position_embeddings") is not None:
        check_int(what, f"{name}.original_max_position_embeddings", scaling["original_max_position_embeddings"])
    if scaling.get("truncate") is not None:
        check_bool(what, f"{name}.truncate", scaling["truncate"])


_SCALED_ROPE_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                     "mscale", "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor")
_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim")
_WHAT = "Qwen3 config"
_MOE_SIZES = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """A Qwen3 config.json, checked on construction (types, ranges, finiteness; an InputError
    naming the field otherwise) and normalised to plain Python values."""

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
    max_position_embeddings: int = 32768
    eos_token_ids: tuple[int, ...] = ()
    # "qwen3" and "qwen3_moe": per-head RMSNorm on q and k before RoPE; "llama": none
    model_type: str = "qwen3"
    attention_bias: bool = False
    # "qwen3_moe" only (0 / defaults otherwise): the sparse layers' experts (`sparse_layer`)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        what = f"{_FAMILY.get(self.model_type, 'Qwen3')} config"

        for name in _SIZES:
            put(name, check_int(what, name, getattr(self, name),
                                maximum=MAX_LAYERS if name == "num_hidden_layers" else MAX_SIZE))
        if self.num_attention_heads % self.num_key_value_heads:
            raise InputError(f"{what}: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention.")
        if self.head_dim % 2:
            raise InputError(f"{what}: head_dim must be even for RoPE, got {self.head_dim}.")
        if self.num_hidden_layers < 3:
            raise InputError(f"{what}: DART taps layers 2, L//2 and L-3, so num_hidden_layers must be >= 3, "
                             f"got {self.num_hidden_layers}.")
        put("rms_norm_eps", check_float(what, "rms_norm_eps", self.rms_norm_eps))
        put("rope_theta", check_float(what, "rope_theta", self.rope_theta))
        put("tie_word_embeddings", check_bool(what, "tie_word_embeddings", self.tie_word_embeddings))
        put("max_position_embeddings", check_int(what, "max_position_embeddings", self.max_position_embeddings))
        check_str(what, "model_type", self.model_type, TARGET_TYPES)
        put("attention_bias", check_bool(what, "attention_bias", self.attention_bias))
        self._check_experts(what, put)
        eos = self.eos_token_ids
        if not isinstance(eos, (tuple, list)):
            raise InputError(f"{what}: eos_token_ids must be a tuple of token ids, got {json_type(eos)}.")
        put("eos_token_ids", tuple(check_int(what, "eos_token_id", e, minimum=0, maximum=self.vocab_size - 1,
                                             hint=f" (an EOS id must lie inside the vocabulary of {self.vocab_size})")
                                   for e in eos))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, tuple):
            raise InputError(f"{what}: rope_scaling must be given frozen, as sorted (key, value) pairs "
                             f"(convert.configs.freeze), got {json_type(self.rope_scaling)}.")
        scaling = self.rope_scaling_dict
        check_rope_scaling(scaling, TARGET_ROPE_KINDS, what)
        if rope_kind(scaling) == "yarn" and self.rope_theta == 1.0:
            raise InputError(f"{what}: yarn RoPE divides by ln(rope_theta), so rope_theta must not be 1.")

    def _check_experts(self, what: str, put) -> None:
        """The MoE fields: set and in range for "qwen3_moe", at their defaults for the dense families."""
        if self.model_type != "qwen3_moe":
            if (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, self.norm_topk_prob,
                    self.decoder_sparse_step, tuple(self.mlp_only_layers)) != (0, 0, 0, False, 1, ()):
                raise InputError(f"{what}: the expert fields (num_experts, ...) belong to a Qwen3-MoE config; use "
                                 "model_type \"qwen3_moe\" for a mixture-of-experts model.")
            return
        for name in _MOE_SIZES:
            put(name, check_int(what, name, getattr(self, name)))
        put("num_experts_per_tok", check_int(what, "num_experts_per_tok", self.num_experts_per_tok,
                                             maximum=self.num_experts,
                                             hint=f" (a token is routed to at most all {self.num_experts} experts)"))
        put("norm_topk_prob", check_bool(what, "norm_topk_prob", self.norm_topk_prob))
        put("decoder_sparse_step", check_int(what, "decoder_sparse_step", self.decoder_sparse_step))
        layers = self.mlp_only_layers
        if not isinstance(layers, (tuple, list)):
            raise InputError(f"{what}: mlp_only_layers must be a list of layer indices, got {json_type(layers)}.")
        put("mlp_only_layers", tuple(sorted({check_int(what, "mlp_only_layers[]", i, minimum=0,
                                                       maximum=self.num_hidden_layers - 1,
                                                       hint=f" (a layer of the {self.num_hidden_layers})")
                                             for i in layers})))
        if not any(self.sparse_layer(i) for i in range(self.num_hidden_layers)):
            raise InputError(f"{what}: no layer is sparse (decoder_sparse_step {self.decoder_sparse_step}, "
                             f"mlp_only_layers {list(self.mlp_only_layers)}); a model without experts is a dense "
                             "Qwen3: use model_type \"qwen3\".")

    def sparse_layer(self, i: int) -> bool:
        """Whether layer `i` runs the experts (a sparse MoE block) rather than the dense MLP, as
        transformers' Qwen3MoeDecoderLayer decides: not among `mlp_only_layers` and (i + 1) a multiple
        of `decoder_sparse_step`."""
        return self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    @property
    def qk_norm(self) -> bool:
        """Whether attention normalises q and k per head before RoPE (Qwen3 and Qwen3-MoE do, Llama does not)."""
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def tap_layers(self) -> tuple[int, int, int]:
        n = self.num_hidden_layers
        return (2, n // 2, n - 3)

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return thaw(self.rope_scaling)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "Qwen3Config":
        """Build from a HF Qwen3 `config.json` dict (transformers 4 or 5 layout). Absent optional
        fields take the defaults of transformers' Qwen3Config (head_dim 128, num_key_value_heads
        32, max_position_embeddings 32768, rms_norm_eps 1e-6, rope_theta 10000). Null stands for
        "not set" only where transformers gives it that meaning (num_key_value_heads: as many as
        heads; rope_theta, rope_scaling, rope_parameters, eos_token_id, layer_types,
        use_sliding_window); elsewhere a null is an error like any other wrong type."""
        return cls._from_hf(cfg, "qwen3")

    @classmethod
    def from_hf_llama(cls, cfg: Mapping[str, Any]) -> "Qwen3Config":
        """Build from a HF Llama `config.json` dict (LlamaForCausalLM: SmolLM2, Llama 2/3, ...).
        Absent fields take transformers' LlamaConfig defaults (head_dim hidden_size // heads,
        num_key_value_heads = heads, max_position_embeddings 2048, rms_norm_eps 1e-6); Llama 3's
        `rope_type: llama3` scaling and `attention_bias` (q/k/v/o biases) are supported,
        `mlp_bias` and `pretraining_tp` other than 1 are not."""
        return cls._from_hf(cfg, "llama")

    @classmethod
    def from_hf_qwen3_moe(cls, cfg: Mapping[str, Any]) -> "Qwen3Config":
        """Build from a HF Qwen3-MoE `config.json` dict (Qwen3MoeForCausalLM: Qwen3-30B-A3B,
        Qwen3-235B-A22B). The expert fields num_experts, num_experts_per_tok and
        moe_intermediate_size are required; absent others take transformers' Qwen3MoeConfig defaults
        (num_key_value_heads 4, head_dim hidden_size // heads, norm_topk_prob false,
        decoder_sparse_step 1, mlp_only_layers none), the rest as `from_hf`. Training-only fields
        (router_aux_loss_coef, output_router_logits) are ignored."""
        return cls._from_hf(cfg, "qwen3_moe")

    @classmethod
    def _from_hf(cls, cfg: Mapping[str, Any], family: str) -> "Qwen3Config":
        what = f"{_FAMILY[family]} config"
        if not isinstance(cfg, Mapping):
            raise InputError(f"{what}: expected a JSON object, got {json_type(cfg)}.")
        model_type = cfg.get("model_type", family)
        if model_type != family:
            raise InputError(f"expected a {_FAMILY[family]} config (model_type {family!r}), got model_type "
                             f"{json_type(model_type)}.")
        if family == "qwen3_moe" and cfg.get("num_local_experts") is not None:
            # transformers 5 writes num_experts under this name; the published configs use num_experts
            if cfg.get("num_experts", cfg["num_local_experts"]) != cfg["num_local_experts"]:
                raise InputError(f"{what}: num_experts ({json_type(cfg['num_experts'])}) and num_local_experts "
                                 f"({json_type(cfg['num_local_experts'])}) disagree; keep one of them.")
            cfg = {**cfg, "num_experts": cfg["num_local_experts"]}
        required(cfg, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
                 + (_MOE_SIZES if family == "qwen3_moe" else ()), what)
        if cfg.get("hidden_act", "silu") != "silu":
            raise InputError(f"{what}: only hidden_act 'silu' is supported, got {json_type(cfg['hidden_act'])}.")
        bias = check_bool(what, "attention_bias", cfg.get("attention_bias", False))
        if bias and family != "llama":
            raise InputError(f"{what}: attention_bias=true is not supported (standard Qwen3 has no q/k/v biases).")
        if family == "llama":
            if check_bool(what, "mlp_bias", cfg.get("mlp_bias", False)):
                raise InputError(f"{what}: mlp_bias=true is not supported (Llama-family bases have no MLP biases).")
            if cfg.get("pretraining_tp", 1) not in (1, None):
                raise InputError(f"{what}: pretraining_tp must be 1 (the weights are stored whole), got "
                                 f"{json_type(cfg['pretraining_tp'])}.")
        sliding = cfg.get("use_sliding_window")
        layer_types = cfg.get("layer_types")
        if layer_types is not None and (not isinstance(layer_types, list)
                                        or not all(isinstance(t, str) for t in layer_types)):
            raise InputError(f"{what}: `layer_types` must be a list of strings (or null), got {json_type(layer_types)}.")
        if layer_types is not None and len(layer_types) != cfg["num_hidden_layers"]:
            raise InputError(f"{what}: layer_types lists {len(layer_types)} layers but num_hidden_layers is "
                             f"{cfg['num_hidden_layers']}; make them agree (or remove layer_types).")
        if (sliding is not None and check_bool(what, "use_sliding_window", sliding)) or any(
                t != "full_attention" for t in layer_types or ()):
            raise InputError(f"{what}: sliding-window attention layers are not supported; "
                             "set use_sliding_window=false (standard Qwen3 and Llama use full attention).")
        heads = cfg["num_attention_heads"]
        if family == "qwen3":
            # absent fields take the defaults of transformers' Qwen3Config (head_dim 128, not
            # hidden_size // heads as in Llama; 32 kv heads, null meaning "as many as heads")
            max_pos = cfg.get("max_position_embeddings", 32768)
            kv_heads = cfg.get("num_key_value_heads", 32)
            head_dim = cfg.get("head_dim", 128)
        elif family == "qwen3_moe":  # transformers' Qwen3MoeConfig: 4 kv heads, head_dim hidden_size // heads
            max_pos = cfg.get("max_position_embeddings", 32768)
            kv_heads = cfg.get("num_key_value_heads", 4)
            head_dim = cfg.get("head_dim")
        else:
            max_pos = cfg.get("max_position_embeddings", 2048)
            kv_heads = cfg.get("num_key_value_heads")
            head_dim = cfg.get("head_dim")
        if head_dim is None and family != "qwen3":
            head_dim = (check_int(what, "hidden_size", cfg["hidden_size"])
                        // check_int(what, "num_attention_heads", heads))

        # transformers 5 keeps rope_theta and the scaling inside rope_parameters; older configs keep
        # rope_theta at the top level and the scaling in rope_scaling
        rope_params = check_object(what, "rope_parameters", cfg.get("rope_parameters")) or {}
        top_scaling = check_object(what, "rope_scaling", cfg.get("rope_scaling"))
        theta = cfg.get("rope_theta")  # null: not set, as transformers 5 leaves it when rope_parameters holds it
        if theta is None:
            theta = rope_params.get("rope_theta", 10000.0)
        source = "rope_scaling" if top_scaling else "rope_parameters"
        scaling = top_scaling or rope_params
        kind = rope_kind(scaling)
        if kind == "default":
            rope_scaling = None
        else:
            scaling = {k: v for k, v in scaling.items() if k in _SCALED_ROPE_KEYS}
            scaling["rope_type"] = kind
            if kind in ("yarn", "llama3"):
                scaling.setdefault("original_max_position_embeddings",
                                   cfg.get("original_max_position_embeddings", max_pos))
                check_int(what, f"{source}.original_max_position_embeddings",
                          scaling["original_max_position_embeddings"])
            if kind == "yarn" and scaling.get("factor") is None:
                scaling["factor"] = check_int(what, "max_position_embeddings", max_pos) / scaling[
                    "original_max_position_embeddings"]
            check_rope_scaling(scaling, TARGET_ROPE_KINDS, what, name=source)
            rope_scaling = freeze(scaling)

        eos = cfg.get("eos_token_id")
        moe = {}
        if family == "qwen3_moe":
            only = cfg.get("mlp_only_layers")  # null: none, as in transformers
            moe = dict(num_experts=cfg["num_experts"], num_experts_per_tok=cfg["num_experts_per_tok"],
                       moe_intermediate_size=cfg["moe_intermediate_size"],
                       norm_topk_prob=cfg.get("norm_topk_prob", False),
                       decoder_sparse_step=cfg.get("decoder_sparse_step", 1),
                       mlp_only_layers=() if only is None else only)
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            max_position_embeddings=max_pos,
            eos_token_ids=() if eos is None else tuple(eos) if isinstance(eos, list) else (eos,),
            model_type=family,
            attention_bias=bias,
            **moe,
        )


def target_config_from_hf(cfg: Mapping[str, Any]) -> Qwen3Config:
    """The config of any supported target family, by its `model_type` ("qwen3" when absent)."""
    model_type = cfg.get("model_type", "qwen3") if isinstance(cfg, Mapping) else "qwen3"
    if model_type == "llama":
        return Qwen3Config.from_hf_llama(cfg)
    if model_type == "qwen3_moe":
        return Qwen3Config.from_hf_qwen3_moe(cfg)
    if model_type != "qwen3":
        raise InputError(f"unsupported target model_type {json_type(model_type)}: supported are {list(TARGET_TYPES)} "
                         "(Qwen3, Qwen3-MoE, and Llama-family bases such as SmolLM2 and Llama 3).")
    return Qwen3Config.from_hf(cfg)


def tensor_table(config: Qwen3Config) -> dict[str, tuple[tuple[str | int, ...], tuple[int, ...], bool]]:
    """Checkpoint name → (parameter path in the model, shape in the file, transposed on load).

    PyTorch Linear weights are [out, in]; the model's kernels are [in, out]. A path that ends in
    an integer e names row e of a stacked parameter: a sparse layer's experts are stored one
    tensor per expert (`mlp.experts.{e}.gate_proj.weight`, ...) and held as one [E, ...] tensor per
    projection."""
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
            if c.attention_bias:
                table[p + f"self_attn.{name}.bias"] = ((*layer, "self_attn", name, "bias"), shape[:1], False)
        if c.qk_norm:
            for norm in ("q_norm", "k_norm"):
                table[p + f"self_attn.{norm}.weight"] = ((*layer, "self_attn", norm, "weight"), (d,), False)
        if c.sparse_layer(n):
            e, m = c.num_experts, c.moe_intermediate_size
            table[p + "mlp.gate.weight"] = ((*layer, "mlp", "gate", "kernel"), (e, h), True)
            for x in range(e):
                for name, shape in (("gate_proj", (m, h)), ("up_proj", (m, h)), ("down_proj", (h, m))):
                    table[p + f"mlp.experts.{x}.{name}.weight"] = ((*layer, "mlp", name, x), shape, True)
            continue
        for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            table[p + f"mlp.{name}.weight"] = ((*layer, "mlp", name, "kernel"), shape, True)
    return table


def checkpoint_folder(path_or_id: str | os.PathLike) -> Path:
    """The local folder of a Qwen3 checkpoint given as a folder or a hub id."""
    folder = resolve(path_or_id, ALLOW_PATTERNS, what="Qwen3 checkpoint")
    if not folder.is_dir():
        raise MissingFileError(f"Qwen3 checkpoint {str(path_or_id)!r} resolved to {folder}, which is not a folder; "
                                "pass the folder that holds config.json and the *.safetensors files.")
    return folder


def load_qwen3_config(path_or_id: str | os.PathLike) -> Qwen3Config:
    """The `Qwen3Config` of a checkpoint folder or hub id (reads only config.json); a bad value
    is a FileFormatError naming config.json and the field."""
    folder = checkpoint_folder(path_or_id)
    cfg = read_config(folder, "a HF Qwen3 checkpoint folder needs config.json next to its model.safetensors")
    return config_from_file(folder / "config.json", lambda: Qwen3Config.from_hf(cfg))


def check_checkpoint(folder: Path, config: Qwen3Config) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Every tensor of the checkpoint against the config, from the headers alone; returns the
    index name → (file, shape, dtype name). A FileFormatError lists missing and unexpected names,
    or names the first tensor whose shape the config does not imply or whose dtype is not a float."""
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
        raise FileFormatError(folder, f"the checkpoint does not match its {config.model_type} config{hint}: missing tensors "
                                      f"{missing[:10]}{' ...' if len(missing) > 10 else ''}, unexpected tensors "
                                      f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}. Use the "
                                      "config.json that came with these weights.")
    for name, (_, shape, _) in table.items():
        file, found, dtype = index[name]
        if found != shape:
            raise FileFormatError(file, f"tensor {name!r} has shape {found}, expected {shape} from config.json; "
                                        "the checkpoint and its config disagree.")
        if dtype not in FLOAT_DTYPES:
            raise FileFormatError(file, f"tensor {name!r} has dtype {dtype}; a weight must be a float tensor "
                                        f"({', '.join(FLOAT_DTYPES)}). The checkpoint is broken.")
    return index


def save_qwen3(folder: str | os.PathLike, config_dict: Mapping[str, Any], tensors: Mapping[str, Any], *,
               max_shard_size_bytes: int | None = None) -> Path:
    """Write a checkpoint in the Hugging Face layout: `config.json` (`config_dict` as given) and
    the tensors, named as `tensor_table` names them (the table the loader reads with), in one
    `model.safetensors` or, with `max_shard_size_bytes`, in shards with their index. Tensors are
    NumPy arrays in the checkpoint's layout ([out, in] weights) and dtype (bf16 as
    ml_dtypes.bfloat16). Names and shapes are checked against the config before anything is
    written."""
    config = target_config_from_hf(config_dict)
    table = tensor_table(config)
    missing = sorted(set(table) - set(tensors))
    unexpected = sorted(set(tensors) - set(table))
    if missing or unexpected:
        raise InputError(f"the tensors do not match the {config.model_type} config: missing {missing[:10]}"
                         f"{' ...' if len(missing) > 10 else ''}, unexpected {unexpected[:10]}"
                         f"{' ...' if len(unexpected) > 10 else ''}; pass exactly the names of tensor_table(config).")
    for name, (_, shape, _) in table.items():
        if tuple(tensors[name].shape) != shape:
            raise InputError(f"tensor {name!r} has shape {tuple(tensors[name].shape)}, the config implies {shape}.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config_dict), indent=2) + "\n")
    write_checkpoint_tensors(folder, {name: tensors[name] for name in table}, max_shard_size_bytes)
    return folder
