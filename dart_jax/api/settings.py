"""The options of `DartModel.from_pretrained` made concrete: a `DecodeConfig` (api/config.py) with
the backend's defaults filled in (`resolve`), the tree size checked against the head (`fit_tree`,
`dart_jax.api.methods.check_tree_size`), and the reference's argument names. Re-exported by
`dart_jax.api.model`."""
from __future__ import annotations

import dataclasses
import warnings

from dart_jax.decoding.eagle3 import DEFAULT_DEPTH as EAGLE3_DEPTH
from dart_jax.decoding.settings import ShapeSettings
from dart_jax.errors import InputError, check_bool, check_int, check_text, check_type
from dart_jax.models.backend import BackendDefaults, defaults_for
from dart_jax.ngram import TreeSettings

from . import methods as _methods
from .config import DecodeConfig


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """How string prompts are formatted: an optional system message, and Qwen3's thinking switch."""

    system_prompt: str | None = None
    enable_thinking: bool = False

    def __post_init__(self):
        if check_type(self.system_prompt, "system_prompt", (str, type(None)), "a string or None") is not None:
            check_text(self.system_prompt, "system_prompt")
        check_bool(self.enable_thinking, "enable_thinking")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A `DecodeConfig` made concrete for one model: the objects its engines take."""

    tree: TreeSettings
    adaptive: bool  # keep="auto": the tree size is chosen per step up to tree.keep
    shapes: ShapeSettings
    chat: ChatSettings
    backend: BackendDefaults
    eagle3_tree: TreeSettings  # the EAGLE-3 tree: total_token - 1 nodes besides the root, top_k children
    eagle3_depth: int


def resolve(config: DecodeConfig, mesh, defaults: BackendDefaults | None = None) -> Resolved:
    """`config`'s fields left at None filled in: the backend's choices (`defaults`, default
    `models.backend.defaults_for` this backend), the tree size (keep None: the backend's; "auto"
    when only max_keep is given; "auto" takes max_keep, default 60, the reference's size, as its
    largest tree), the device loop off where "auto" or a mesh applies (it needs a fixed size on one
    device), the EAGLE-3 tree the reference's 60 nodes, 7 steps, top-10."""
    defaults = defaults or defaults_for()
    if mesh is not None and config.fused_projections:
        raise InputError("fused_projections (--fused-projections on) lays a model out for one device, a mesh keeps "
                         "the checkpoint's layout: drop one of them.")
    backend = defaults.override(**config.group("backend"))
    keep = config.keep if config.keep is not None else "auto" if config.max_keep is not None else backend.keep
    adaptive = keep == "auto"
    if config.max_keep is not None and not adaptive:
        raise InputError(f"max_keep only applies with keep='auto'; this backend's tree size is fixed ({keep}): pass "
                         "keep='auto' (--keep auto) too, or drop max_keep.")
    size = (config.max_keep or TreeSettings().keep) if adaptive else keep
    if config.device_steps is None and (adaptive or mesh is not None):
        backend = dataclasses.replace(backend, device_steps=0)
    search = {k: v for k, v in config.group("tree").items() if k not in ("keep", "max_keep")}
    total = 60 if config.eagle3_total_token is None else check_int(config.eagle3_total_token, "eagle3_total_token", low=2)
    depth = EAGLE3_DEPTH if config.eagle3_depth is None else check_int(config.eagle3_depth, "eagle3_depth", low=1)
    top_k = 10 if config.eagle3_top_k is None else check_int(config.eagle3_top_k, "eagle3_top_k", low=1)
    return Resolved(tree=TreeSettings(keep=size, **search), adaptive=adaptive, shapes=ShapeSettings(**config.group("shapes")),
                    chat=ChatSettings(**config.group("chat")), backend=backend,
                    eagle3_tree=TreeSettings(keep=total - 1, topk=top_k), eagle3_depth=depth)


# the reference's `DartModel.from_pretrained` argument names → ours
REFERENCE_NAMES = {"base_model_name_or_path": "base", "dart_model_name_or_path": "dart",
                   "ngram_model_name_or_path": "ngram", "is_small_ngram": "small_ngram", "torch_dtype": "dtype"}
# arguments the reference hands to transformers that have no meaning here (JAX places the arrays)
_IGNORED_REFERENCE_ARGS = ("device_map", "low_cpu_mem_usage")


def reference_names(opts: dict, base, dart, ngram, small_ngram, dtype) -> tuple:
    """Take the reference's argument names out of `opts` (in place) and return (base, dart, ngram,
    small_ngram, dtype); a value given under both names is an error."""
    ours = {"base": base, "dart": dart, "ngram": ngram, "small_ngram": check_bool(small_ngram, "small_ngram") or None,
            "dtype": dtype}
    for theirs, mine in REFERENCE_NAMES.items():
        if theirs not in opts:
            continue
        value = opts.pop(theirs)
        if ours[mine] is not None:
            raise InputError(f"both {mine}= and the reference's {theirs}= were given; pass one of them.")
        if mine == "dtype" and value is not None:
            value = str(value).removeprefix("torch.")
        if mine == "small_ngram":
            value = check_bool(value, theirs)
        ours[mine] = value
    for name in _IGNORED_REFERENCE_ARGS:
        if name in opts:
            opts.pop(name)
            warnings.warn(f"{name}= is ignored: JAX places the arrays itself (pass mesh= to shard them).", stacklevel=3)
    return ours["base"], ours["dart"], ours["ngram"], bool(ours["small_ngram"]), ours["dtype"]


def fit_tree(tree: TreeSettings, rows: int, draft_vocab: int, adaptive: bool) -> TreeSettings:
    """Tree settings checked against a DART head of `rows` rows over `draft_vocab` ids. With
    `adaptive` ("auto") the largest size is max_keep: at its default, the reference's size, it is
    capped at what the search can fill (a small head fills fewer nodes); a max_keep given is
    checked as a fixed keep is."""
    tree.check_fits(rows, draft_vocab)
    if adaptive and tree.keep == TreeSettings().keep:
        tree = dataclasses.replace(tree, keep=min(tree.keep, _methods.max_tree_nodes(tree, rows)))
    _methods.check_tree_size(tree.keep, tree, rows, "max_keep (--max-keep)" if adaptive else "keep (--keep)")
    return tree
