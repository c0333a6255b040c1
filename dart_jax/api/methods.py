"""The decoding methods, one record each: the one list that the Python API, the command lines, the
HTTP schema, the scheduler, the chat UI and the benchmarks read.

    dart     DART: the DART head's logits and the n-gram trie grow a draft tree per step
    eagle3   EAGLE-3: its head grows the tree on the device (loaded with eagle3=PATH / --eagle3)
    ar       plain autoregressive decoding of the target (no drafter): every speedup's baseline

A record says what a method is called (`name`, `label`), whether it drafts, which loading option
brings its drafter (`head_option`; None: always there), how its draft tree size is set
(`tree_option`, and whether a request may choose it: `tree_per_request`), how to reach its
engine on a loaded `DartModel`, and its columns in `python -m dart_jax.bench e2e`. Adding a method
is one `register(Method(...))` here plus its drafter (dart_jax/decoding) and its checkpoint files
(dart_jax/convert, dart_jax/models/checkpoints).

The draft tree size is one number everywhere: nodes besides the root (`keep`); the reference's
names for it (`remain_total` of `dart_generate`, EAGLE-3's `total_token` = size + 1) are
translated where they come in, and every path checks it with `check_tree_size`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from dart_jax.errors import InputError

TREE_SIZE_RANGE = (1, 256)  # the tree sizes a server request may ask for (nodes besides the root)


@dataclasses.dataclass(frozen=True)
class Method:
    """One decoding method."""

    name: str  # generate(method=...), --method, the HTTP body's "method"
    label: str  # in the chat UI, the printed tables
    description: str  # one line for --help and GET /v1/models
    drafts: bool  # False: plain decoding of the target (one token per target call, no tree)
    engine: Callable[[Any], Any]  # a DartModel → the Engine that decodes this method, or None when not loaded
    head_option: str | None = None  # the loading option (from_pretrained / CLI flag) its drafter needs; None: none
    head_what: str | None = None  # that drafter in words ("an EAGLE-3 head"), for the error when it is missing
    tree_option: str | None = None  # the loading option that sets its tree size (None: no tree)
    tree_per_request: bool = False  # whether a request may choose its tree size (a server pool per size)
    bench_prefix: str | None = None  # its columns in bench e2e rows: "<prefix>_tok_s", ... (None: the name)

    def loaded(self, model) -> bool:
        """Whether `model` can decode with this method (its drafter is loaded)."""
        return self.engine(model) is not None

    def engine_of(self, model, asked: str | None = None):
        """`model`'s engine for this method, or an InputError saying how to load its drafter
        (`asked`: how the user named the method, e.g. "--method eagle3"; default "method 'NAME'")."""
        engine = self.engine(model)
        if engine is None:
            asked = asked or f"method {self.name!r}"
            flag = "--" + str(self.head_option).replace("_", "-")
            raise InputError(f"{asked} needs {self.head_what or 'its drafter'}: load the model with "
                             f"DartModel.from_pretrained(..., {self.head_option}=PATH) / add {flag} PATH "
                             "(hub id or folder).")
        return engine

    def pool(self, model, slots: int, max_length: int, tree_size: int | None = None):
        """A pool of `slots` sequences decoding with this method (continuous batching): a `Batcher`
        (with `tree_size` nodes when the method takes one per request, a fixed size then) or, for
        plain decoding, a `PlainBatcher`."""
        engine = self.engine_of(model)
        if not self.drafts:
            return engine.batcher(slots, max_length, plain=True)
        if self.tree_per_request and tree_size is not None and tree_size != engine.tree.keep:
            engine = engine.with_tree(dataclasses.replace(engine.tree, keep=int(tree_size)), adaptive=False)
        return engine.batcher(slots, max_length)

    def tree_size(self, model, requested: int | None = None) -> int | None:
        """The tree size a request of this method decodes with: `requested` (checked) when the
        method takes one per request, else its engine's fixed size; None for plain decoding."""
        if not self.drafts:
            return None
        engine = self.engine_of(model)
        if self.tree_per_request and requested is not None:
            check_tree_size(requested, engine.tree, engine.drafter.max_depth, option="tree_size")
            return int(requested)
        return engine.tree.keep

    @property
    def column(self) -> str:
        return self.bench_prefix or self.name


_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method (its name must be new); returns it."""
    if method.name in _REGISTRY:
        raise ValueError(f"a decoding method named {method.name!r} exists already.")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (tests that add one for a while)."""
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every method's name, in the order they were registered."""
    return tuple(_REGISTRY)


def all_methods() -> tuple[Method, ...]:
    return tuple(_REGISTRY.values())


def get(name: str) -> Method:
    """The method of that name, or an InputError listing the methods there are."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"method must be one of {list(names())}, got {name!r}.") from None


def loaded(model) -> list[Method]:
    """The methods `model` can decode with (its drafters loaded)."""
    return [m for m in _REGISTRY.values() if m.loaded(model)]


def baseline() -> Method:
    """The plain-decoding method, against which every speedup is measured."""
    return next(m for m in _REGISTRY.values() if not m.drafts)


# ---------------------------------------------------------------------- the tree size: one check
def max_tree_nodes(tree, rows: int) -> int:
    """The most nodes the tree search can produce (docs/spec.md §5.4: every extension enters the
    pool; row 0 extends the empty beam by `topk` candidates, each later row its beam of at most
    `beam_width` entries by `topk`)."""
    beam, total = 1, 0
    for _ in range(tree.rows_used(rows)):
        entries = beam * tree.topk
        total += entries
        beam = min(tree.beam_width, entries)
    return total


def check_tree_size(size, tree, rows: int, option: str = "keep (--keep)") -> int:
    """A draft tree size (nodes besides the root) that is a positive integer the tree search over
    `rows` draft rows under `tree`'s topk and beam_width can fill, or an InputError naming
    `option` (its name and flag: "keep (--keep)", "remain_total", a request's "tree_size") and the
    largest size allowed: a larger tree is only padding, and the verify step's memory grows with
    it. The one check of every path that takes a tree size (from_pretrained, dart_generate, the
    server's requests)."""
    name = option.split()[0]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"{option}: the draft tree size must be a positive integer (nodes besides the root), "
                         f"got {size!r}.")
    most = max_tree_nodes(tree, rows)
    if size > most:
        raise InputError(f"{option}: draft tree size {size} is more than the tree search can fill: with "
                         f"{tree.rows_used(rows)} draft rows, topk {tree.topk} and beam_width {tree.beam_width} it "
                         f"produces at most {most} nodes; pass {name} <= {most} (the default is 60).")
    return size


register(Method("dart", "DART", "DART: the DART head's logits and the n-gram trie grow a draft tree per step",
                drafts=True, engine=lambda model: model.engine, tree_option="keep", tree_per_request=True))
register(Method("eagle3", "EAGLE-3", "EAGLE-3: its head grows the draft tree on the device (needs --eagle3)",
                drafts=True, engine=lambda model: getattr(model, "eagle3_engine", None), head_option="eagle3",
                head_what="an EAGLE-3 head", tree_option="eagle3_total_token"))
register(Method("ar", "Plain", "plain autoregressive decoding of the target (no drafter): the baseline",
                drafts=False, engine=lambda model: model.engine))
