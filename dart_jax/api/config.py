"""`DecodeConfig`: every loading setting of a model in one frozen object, and the one place where
a setting is declared: its field here gives the Python keyword (`DartModel.from_pretrained(...,
beam_width=10)`), the command-line flag (`--beam-width 10`, built from the field by
`add_config_flags`) and the group it belongs to (tree, shapes, chat, backend, eagle3).

A field left at None takes the default that depends on where the model runs or what it is (the
backend's tree size and loop, `models.backend.defaults_for`; the demo's CPU trees); the others
have their value. `api.settings.resolve` turns a config into the objects the engines take
(`TreeSettings`, `ShapeSettings`, `ChatSettings`, `BackendDefaults`, the EAGLE-3 tree).

This module is light (argparse, dataclasses and `dart_jax.errors` only): the command lines build
their flags from it before jax loads."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
from typing import Any

from dart_jax.errors import InputError, check_bool, check_int, check_number, check_text, check_type

ATTENTION_CHOICES = ("xla", "cudnn", "pallas")  # `dart_jax.models.qwen3.ATTENTION_KERNELS`
VERIFY_GEMMS_CHOICES = ("auto", "xla", "cublas")  # `dart_jax.models.qwen3.VERIFY_GEMMS`
MAX_DEVICE_STEPS = 4096  # `dart_jax.models.backend.MAX_DEVICE_STEPS`
SWITCH = {"auto": None, "on": True, "off": False}  # an on/off flag whose "auto" is the backend's choice
GROUPS = ("tree", "shapes", "chat", "backend", "eagle3")
# the settings objects whose fields a DecodeConfig holds (`build(tree=...)`), by class name: this light
# module does not import them (ngram's TreeSettings, decoding's ShapeSettings, api.settings' ChatSettings)
_SETTINGS_CLASSES = {"tree": "TreeSettings", "shapes": "ShapeSettings", "chat": "ChatSettings"}


def tree_size(text: str) -> int | str:
    """--keep: 'auto' or an integer (its range is checked with the other tree settings)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None


def number_type(kind: type, low: float, high: float, *, low_open: bool = False, says: str = ""):
    """An argparse type: a `kind` (int or float) in [low, high] ((low, high] with `low_open`), else
    an argparse error naming the range, so that a bad value is refused before jax loads (the
    settings' own checks state the same rules)."""
    def parse(text: str):
        value = kind(text)  # a ValueError is argparse's "invalid int value: 'x'"
        if not ((low < value) if low_open else (low <= value)) or not value <= high:  # NaN fails too
            shown = (lambda v: str(int(v))) if kind is int else (lambda v: f"{v:g}")
            bounds = f"{'(' if low_open else '['}{shown(low)}, {shown(high)}]"
            raise argparse.ArgumentTypeError(f"must lie in {bounds}{says}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


device_steps = number_type(int, 0, MAX_DEVICE_STEPS, says=" (0: a host call per step)")  # --device-steps


def _setting(group: str, default: Any, flag: str, help: str, *, aliases: tuple[str, ...] = (),
             **argparse_kwargs) -> Any:
    """A DecodeConfig field: its group, its flag (and older spellings), and the flag's argparse
    arguments besides the default (the field's)."""
    return dataclasses.field(default=default, metadata={"group": group, "flags": (flag, *aliases), "help": help,
                                                        "argparse": argparse_kwargs})


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How a model drafts, verifies and lays out its work (checked on construction; the ranges that
    depend on the head, such as the largest tree its search can fill, when the model loads).
    `DecodeConfig.build(config, **names)` makes one of keyword names; `fields_of(group)` lists a group."""

    # tree: the draft tree and its search (docs/spec.md §5)
    keep: int | str | None = _setting(
        "tree", None, "--keep",
        "draft tree size (nodes besides the root), at most what the tree search can fill (draft rows x beam width x "
        "candidates); 'auto' picks among a few sizes up to --max-keep per step, plain decoding included, by expected "
        "tokens per second on this device (default: the backend's, see --device-info: 60 on a GPU or TPU, 'auto' on "
        "a CPU, where the SmolLM2 demo, when neither --keep nor --max-keep is given, chooses per sequence among plain "
        "decoding and trees of up to 7 nodes)", type=tree_size)
    max_keep: int | None = _setting(
        "tree", None, "--max-keep",
        "the largest tree 'auto' may use, at most what the tree search can fill, as for --keep (default: 60, the "
        "reference's size)", type=int)
    beam_width: int = _setting("tree", 20, "--beam-width", "beam entries kept per draft row by the tree search",
                               type=int)
    topk: int = _setting("tree", 25, "--topk", "draft candidates per row for the tree search (--tree-topk: the old "
                                               "spelling)", aliases=("--tree-topk",), type=int)
    draft_rows: int | None = _setting("tree", None, "--draft-rows",
                                      "head rows (the draft depth d) the tree search reads (default: all)", type=int)
    ngram_weight: float = _setting("tree", 0.5, "--ngram-weight",
                                   "weight of the n-gram term in the tree search's scores (0: the head's alone)",
                                   type=float)
    # shapes: what compiles (the prefill's chunk and cache sizes)
    min_bucket: int = _setting("shapes", 32, "--min-bucket",
                               "prompts are prefilled in chunks of this many tokens (one program for every prompt "
                               "length)", type=int)
    cache_multiple: int = _setting("shapes", 256, "--cache-multiple",
                                   "caches are rounded up to a multiple of this many positions", type=int)
    # chat: how string prompts are formatted
    system_prompt: str | None = _setting("chat", None, "--system",
                                         "a system message before each string prompt", metavar="TEXT")
    enable_thinking: bool = _setting("chat", False, "--thinking",
                                     "let Qwen3 think (enable_thinking=True in the chat template; the thinking is "
                                     "reported apart from the answer); an error for templates without that switch",
                                     action="store_true")
    # backend: None is the backend's choice (models.backend.defaults_for; --device-info shows them)
    device_steps: int | None = _setting(
        "backend", None, "--device-steps",
        "run N DART steps per device call, the draft trees searched on the device (the same trees; for "
        "accelerators: slower on a CPU); needs a fixed --keep; 0: one device call a step, the host searching "
        "(default: the backend's, see --device-info: 32 on a GPU or TPU with a fixed tree on one device, else 0; at "
        f"most {MAX_DEVICE_STEPS})", type=device_steps, metavar="N")
    verify_gemms: str | None = _setting(
        "backend", None, "--verify-gemms",
        "GEMMs a GPU compiles the tree verification with: auto (cuBLAS for trees of 32 rows or more, XLA's own below "
        "and for plain decoding), xla (XLA's everywhere) or cublas (every tree); other devices ignore it (default: "
        "the backend's, auto)", choices=VERIFY_GEMMS_CHOICES)
    attention: str | None = _setting(
        "backend", None, "--attention",
        "how the target attends over its cache, plain decoding included: xla, cudnn (cuDNN's fused attention "
        "kernel; a bfloat16 model on an NVIDIA GPU) or pallas (our Pallas kernel: Triton on a GPU, Mosaic on a TPU, "
        "slow interpret mode on a CPU) (default: the backend's, xla)", choices=ATTENTION_CHOICES)
    fused_projections: bool | None = _setting(
        "backend", None, "--fused-projections",
        "each layer's q/k/v and gate/up kernels fused into one matmul each (one device only): on, off, or auto (the "
        "backend's, see --device-info: on for a GPU or TPU, off on a CPU)", choices=tuple(SWITCH), switch=True)
    untied_lm_head: bool | None = _setting(
        "backend", None, "--untied-lm-head",
        "a tied embedding copied into an [H, V] LM head: on, off, or auto (the backend's, see --device-info: on for "
        "a CPU)", choices=tuple(SWITCH), switch=True)
    # eagle3: the EAGLE-3 tree (with an EAGLE-3 head; None: the reference's 60, 7, 10, or the demo's)
    eagle3_total_token: int | None = _setting("eagle3", None, "--eagle3-total-token",
                                              "EAGLE-3 tree size, root included; the SmolLM2 demo's shipped EAGLE-3 "
                                              "head on a CPU: 8 (default: 60)", type=int)
    eagle3_depth: int | None = _setting("eagle3", None, "--eagle3-depth",
                                        "EAGLE-3 draft steps per tree; the demo on a CPU: 2 (default: 7)", type=int)
    eagle3_top_k: int | None = _setting("eagle3", None, "--eagle3-top-k",
                                        "EAGLE-3 children per expanded node; the demo on a CPU: 8 (default: 10)",
                                        type=int)

    def __post_init__(self):
        if isinstance(self.keep, str):
            if self.keep.strip().lower() != "auto":
                raise InputError(f"keep must be an integer tree size or 'auto', got {self.keep!r}.")
            object.__setattr__(self, "keep", "auto")
        elif self.keep is not None:
            check_int(self.keep, "keep", low=1)
        for name in ("max_keep", "draft_rows"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name, low=1)
        for name in self.fields_of("eagle3"):  # their ranges where a head takes them (api.settings.resolve)
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name)
        if self.max_keep is not None and self.keep not in (None, "auto"):
            raise InputError(f"max_keep only applies with keep='auto' (keep={self.keep} is a fixed size); drop one.")
        for name in ("beam_width", "topk", "min_bucket", "cache_multiple"):
            check_int(getattr(self, name), name, low=1)
        weight = check_number(self.ngram_weight, "ngram_weight")
        if not weight >= 0 or weight == float("inf"):  # NaN fails too
            raise InputError(f"ngram_weight must be a finite number >= 0, got {self.ngram_weight!r}.")
        if self.system_prompt is not None:
            check_text(check_type(self.system_prompt, "system_prompt", str, "a string or None"), "system_prompt")
        check_bool(self.enable_thinking, "enable_thinking")
        if self.device_steps is not None and not (isinstance(self.device_steps, int)
                                                  and not isinstance(self.device_steps, bool)
                                                  and 0 <= self.device_steps <= MAX_DEVICE_STEPS):
            raise InputError(f"device_steps (--device-steps) must be an integer in [0, {MAX_DEVICE_STEPS}] (0: a host "
                             f"call per step), got {self.device_steps!r}.")
        for name, choices in (("verify_gemms", VERIFY_GEMMS_CHOICES), ("attention", ATTENTION_CHOICES)):
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise InputError(f"{name} must be one of {', '.join(choices)} (or None: the backend's), got {value!r}.")
        for name in ("fused_projections", "untied_lm_head"):
            if getattr(self, name) is not None:
                check_bool(getattr(self, name), name)

    @staticmethod
    def fields_of(group: str) -> tuple[str, ...]:
        """The names of a group's fields ("tree", "shapes", "chat", "backend", "eagle3")."""
        return tuple(f.name for f in dataclasses.fields(DecodeConfig) if f.metadata["group"] == group)

    def group(self, group: str) -> dict[str, Any]:
        """A group's fields and their values."""
        return {name: getattr(self, name) for name in self.fields_of(group)}

    @property
    def eagle3_given(self) -> tuple[str, ...]:
        """The EAGLE-3 tree fields given (not None)."""
        return tuple(name for name, value in self.group("eagle3").items() if value is not None)

    @classmethod
    def build(cls, config: "DecodeConfig | None" = None, **names) -> "DecodeConfig":
        """`config` (default: all defaults) with the fields given by keyword put in. Settings objects
        with a `keep` and fields named like the config's (`tree=TreeSettings(...)`, `shapes=`,
        `chat=`) give their fields too; a tree object fixes the tree size to its `keep` unless keep
        is given ("auto" then takes it as max_keep). A misspelt or unknown name is an InputError
        naming the nearest valid one."""
        config = check_type(config, "config", (cls, type(None)), "a DecodeConfig or None") or cls()
        valid = [f.name for f in dataclasses.fields(cls)]
        objects = {group: names.pop(group) for group in ("tree", "shapes", "chat") if names.get(group) is not None}
        for group in ("tree", "shapes", "chat"):
            names.pop(group, None)
        unknown = [name for name in names if name not in valid]
        if unknown:
            raise InputError(unknown_message(unknown[0], [*valid, "tree", "shapes", "chat", "config"]))
        given = {}
        for group, settings in objects.items():
            cls = _SETTINGS_CLASSES[group]
            if type(settings).__name__ != cls or not dataclasses.is_dataclass(settings):
                check_type(settings, group, (), f"a {cls} or None (or its fields by name: from_pretrained(..., "
                                                f"**{group}) for a dict)")
            fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
            if group == "tree":
                fields.pop("keep")
                if names.get("keep") is None and config.keep is None:
                    given["keep"] = settings.keep
                elif str(names.get("keep", config.keep)).lower() == "auto" and names.get("max_keep") is None:
                    given["max_keep"] = settings.keep
            given.update(fields)
        given.update(names)
        return dataclasses.replace(config, **given) if given else config

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "DecodeConfig":
        """The config that `add_config_flags`' parsed flags give (a flag absent from `args`: its default)."""
        values = {}
        for f in dataclasses.fields(cls):
            if not hasattr(args, f.name):
                continue
            value = getattr(args, f.name)
            values[f.name] = SWITCH[value] if f.metadata["argparse"].get("switch") else value
        return cls(**values)


def unknown_message(name: str, valid: list[str], what: str = "option") -> str:
    """'unknown option NAME; did you mean NEAREST? valid: …' (the nearest by spelling, when one is close)."""
    near = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"unknown {what} {name!r}{hint} Valid: {', '.join(sorted(valid))}."


def add_config_flags(group, names: tuple[str, ...] | None = None, *, fixed: dict[str, Any] | None = None) -> None:
    """One flag per DecodeConfig field (those in `names`; None: all) on an argparse parser or group;
    its dest is the field's name. `fixed` gives some flags another default (the benchmarks fix the
    backend's choices, so that their figures do not follow the machine)."""
    fixed = fixed or {}
    for f in dataclasses.fields(DecodeConfig):
        if names is not None and f.name not in names:
            continue
        kwargs = {k: v for k, v in f.metadata["argparse"].items() if k != "switch"}
        default = fixed.get(f.name, "auto" if f.metadata["argparse"].get("switch") else f.default)
        help_text = f.metadata["help"]
        if f.name in fixed:
            help_text = help_text.split(" (default: the backend's")[0] + f" (default {default})"
        group.add_argument(*f.metadata["flags"], dest=f.name, default=default, help=help_text, **kwargs)

