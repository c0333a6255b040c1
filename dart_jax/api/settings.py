"""The options of `DartModel.from_pretrained`: the settings groups filled by field name, the
tree size ("auto" or an integer, checked by `dart_jax.api.methods.check_tree_size`), and the
reference's argument names. Re-exported by `dart_jax.api.model`."""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from dart_jax.decoding.settings import ShapeSettings
from dart_jax.errors import InputError, check_bool, check_int, check_text, check_type
from dart_jax.models.backend import BackendDefaults, defaults_for
from dart_jax.ngram import TreeSettings

from . import methods as _methods


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """How string prompts are formatted: an optional system message, and Qwen3's thinking switch."""

    system_prompt: str | None = None
    enable_thinking: bool = False

    def __post_init__(self):
        if check_type(self.system_prompt, "system_prompt", (str, type(None)), "a string or None") is not None:
            check_text(self.system_prompt, "system_prompt")
        check_bool(self.enable_thinking, "enable_thinking")


# the option groups that `from_pretrained(**opts)` fills by field name
_OPTION_GROUPS = {"tree": TreeSettings, "shapes": ShapeSettings, "chat": ChatSettings}


def check_groups(**given) -> None:
    """Each settings object given (`tree`, `shapes`, `chat`: None or an object of its group's
    class), else an InputError naming it; a dict's fields go by name in the options instead."""
    for group, value in given.items():
        cls = _OPTION_GROUPS[group].__name__
        check_type(value, group, (_OPTION_GROUPS[group], type(None)),
                   f"a {cls} or None (or its fields by name: from_pretrained(..., **{group}) for a dict)")


def adaptive_keep(opts: dict[str, Any], tree: TreeSettings | None) -> tuple[dict[str, Any], bool]:
    """`keep="auto"` (the default unless a `tree` object or an integer keep is given): the tree
    size is chosen per step among a few sizes up to `max_keep` (default 60, the reference's size)
    by measured speed (dart_jax.decoding.adaptive). → (options with keep an integer, adaptive)."""
    opts = dict(opts)
    keep = opts.pop("keep", "auto" if tree is None else tree.keep)
    max_keep = opts.pop("max_keep", None)
    if isinstance(keep, str) and keep.strip().lower() == "auto":
        opts["keep"] = (check_int(max_keep, "max_keep") if max_keep is not None
                        else tree.keep if tree is not None else TreeSettings().keep)
        return opts, True
    if max_keep is not None:
        raise ValueError("max_keep only applies with keep='auto'.")
    if isinstance(keep, str):
        raise ValueError(f"keep must be an integer tree size or 'auto', got {keep!r}.")
    opts["keep"] = keep
    return opts, False


def backend_options(opts: dict[str, Any], tree: TreeSettings | None, mesh, **given) -> tuple[dict[str, Any], BackendDefaults]:
    """The backend choices of a model (`models.backend.defaults_for` this backend, overridden by
    every option in `given` that is not None) → (`opts` with the default tree size filled in when
    neither keep, max_keep nor a `tree` object gives one, those choices). The device loop needs a
    fixed tree size on one device: where "auto" or a mesh applies, its default is the host loop."""
    for name in ("fused_projections", "untied_lm_head"):
        if given.get(name) is not None:
            check_bool(given[name], name)
    choices = defaults_for().override(**given)
    if mesh is not None and given.get("fused_projections"):
        raise InputError("fused_projections (--fused-projections on) lays a model out for one device, a mesh keeps "
                         "the checkpoint's layout: drop one of them.")
    opts = dict(opts)
    if tree is None and "keep" not in opts and "max_keep" not in opts:
        opts["keep"] = choices.keep
    keep = opts.get("keep", tree.keep if tree is not None else None)
    auto = isinstance(keep, str) and keep.strip().lower() == "auto"
    if given.get("device_steps") is None and (auto or mesh is not None):
        choices = dataclasses.replace(choices, device_steps=0)
    return opts, choices


def split_options(opts: dict[str, Any], **given) -> dict[str, Any]:
    """Keyword options → one settings object per group (`tree`, `shapes`, `chat`), starting from
    the objects in `given`; an option that no group has is an error naming the valid ones."""
    fields = {f.name: group for group, cls in _OPTION_GROUPS.items() for f in dataclasses.fields(cls)}
    unknown = sorted(set(opts) - set(fields))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; valid: {sorted(fields)}.")
    out = {}
    for group, cls in _OPTION_GROUPS.items():
        base = given.get(group) or cls()
        mine = {k: v for k, v in opts.items() if fields[k] == group}
        out[group] = dataclasses.replace(base, **mine) if mine else base
    return out


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
