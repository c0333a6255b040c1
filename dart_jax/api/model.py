"""`DartModel`: checkpoints → a ready DART engine with a tokenizer (the public Python API)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from transformers import AutoTokenizer

from dart_jax.convert.dart_head import check_fits_target, head_folder, read_head_config
from dart_jax.convert.hub import resolve
from dart_jax.convert.qwen3 import load_qwen3_config
from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.batcher import Batcher, pool_slots
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.errors import InputError
from dart_jax.models.checkpoints import load_dart_head, load_qwen3
from dart_jax.ngram import TreeSettings, Trie
from dart_jax.ngram._format import MAGIC

# docs/spec.md §1: the published DART heads and the base model each was trained for
PUBLISHED_PAIRS = {
    "fvliang/qwen1.7b-dart": "Qwen/Qwen3-1.7B",
    "fvliang/qwen4b-dart": "Qwen/Qwen3-4B",
    "fvliang/qwen8b-dart": "Qwen/Qwen3-8B",
    "fvliang/qwen14b-dart": "Qwen/Qwen3-14B",
    "fvliang/qwen32b-dart": "Qwen/Qwen3-32B",
}
DEFAULT_NGRAM = "fvliang/dart-qwen3-ngram"
BASE_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model")


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """How string prompts are formatted: an optional system message, and Qwen3's thinking switch."""

    system_prompt: str | None = None
    enable_thinking: bool = False


# the option groups that `from_pretrained(**opts)` fills by field name
_OPTION_GROUPS = {"tree": TreeSettings, "shapes": ShapeSettings, "chat": ChatSettings}


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
    token_ids: list[int]  # generated ids only; a final EOS is included when generation stopped on it
    text: str
    accept_lengths: list[int]  # per speculative step, k+1 (the bonus token counted)
    stats: dict[str, Any]
    prompt_ids: list[int]
    finish_reason: str = "length"  # "eos" when generation stopped on an EOS id, else "length"


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
    """A `Trie` from a file, a folder holding small.trie/full.trie, or a hub id. A reference
    (C++) `.trie` is converted once to our format and cached next to it (or under `cache_dir`,
    default ~/.cache/dart_jax, when that folder is read-only)."""
    path = _trie_file(ngram, small)
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
    if magic == MAGIC:
        return Trie.load(path)
    converted = _converted_path(path, cache_dir)
    if converted.is_file() and converted.stat().st_mtime >= path.stat().st_mtime:
        return Trie.load(converted)
    converted.parent.mkdir(parents=True, exist_ok=True)
    return Trie.from_reference(path, out=converted, progress=True)


def _eos_ids(tokenizer, base_folder: Path, config_eos: Sequence[int]) -> list[int]:
    ids = set(int(e) for e in config_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = base_folder / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return sorted(ids)


class DartModel:
    """DART speculative decoding of a Qwen3 target with a DART head and an n-gram trie."""

    def __init__(self, target, head, tokenizer, trie=None, *, eos_ids: Sequence[int],
                 tree: TreeSettings = TreeSettings(), shapes: ShapeSettings = ShapeSettings(),
                 chat: ChatSettings = ChatSettings(), mesh=None):
        self.tokenizer = tokenizer
        self.chat_settings = chat
        tree_eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos_ids, default=None)
        self.engine = Engine(target, DartDrafter(head), trie, eos_ids=eos_ids, tree_eos_id=tree_eos, tree=tree,
                             shapes=shapes, mesh=mesh)

    @property
    def target(self):
        return self.engine.target

    @property
    def head(self):
        return self.engine.drafter.module

    @classmethod
    def from_pretrained(cls, base, dart, ngram=None, *, small_ngram: bool = False, dtype=None, mesh=None,
                        tree: TreeSettings | None = None, shapes: ShapeSettings | None = None,
                        chat: ChatSettings | None = None, trie_cache_dir: str | os.PathLike | None = None,
                        **opts) -> "DartModel":
        """Load base (Qwen3), DART head and n-gram trie (hub ids or local paths).

        base=None resolves the base of a published head. ngram=None takes DEFAULT_NGRAM;
        ngram=False (or "none") searches with the head's logits only. `small_ngram` picks
        small.trie instead of full.trie inside an n-gram folder or repository. `trie_cache_dir`
        holds converted reference tries when the trie's own folder is read-only.
        Settings come as objects (`tree`, `shapes`, `chat`) or as their fields by name in `opts`:
        keep, beam_width, topk, draft_rows, ngram_weight (TreeSettings); min_bucket,
        cache_multiple (ShapeSettings); system_prompt, enable_thinking (ChatSettings).
        """
        groups = split_options(opts, tree=tree, shapes=shapes, chat=chat)
        if dart is None:
            raise ValueError("a DART head is required (dart=hub id or folder).")
        if not Path(os.path.expanduser(str(dart))).exists() and not re.fullmatch(r"[\w.-]+/[\w.-]+", str(dart)):
            raise FileNotFoundError(f"DART head {str(dart)!r}: no such folder, and not a hub id of the form 'owner/name'.")
        if base is None:
            base = published_base(dart)
        head_dir = head_folder(dart)
        base_folder = resolve(base, BASE_PATTERNS, what="base model")
        head_config = read_head_config(head_dir)
        target_config = load_qwen3_config(base_folder)
        check_fits_target(head_config, target_config, where=f"the DART head {head_dir}")
        groups["tree"].check_fits(head_config.num_rows, head_config.draft_vocab_size)

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
        target = load_qwen3(base_folder, dtype=dtype, mesh=mesh)
        head = load_dart_head(head_dir, target, dtype=dtype)
        return cls(target, head, tokenizer, trie, eos_ids=_eos_ids(tokenizer, base_folder, target_config.eos_token_ids),
                   mesh=mesh, **groups)

    # ------------------------------------------------------------------ prompts and text
    def encode(self, prompt: str | Sequence[int] | Sequence[Mapping], chat: bool = True) -> list[int]:
        """Token ids of a prompt: a string is chat-formatted when `chat` (as the user turn, after the
        system prompt if one is set); a `messages` list of {role, content} dicts always goes through
        the chat template; token ids are used as is."""
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
            prompt = self.tokenizer.apply_chat_template(items, tokenize=False, add_generation_prompt=True,
                                                        enable_thinking=self.chat_settings.enable_thinking)
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ generation
    def _result(self, ids: list[int], out: list[int], stats: Stats) -> GenerationResult:
        return GenerationResult(out, self.decode(out), list(stats.accept_lengths), stats.as_dict(), ids,
                                _finish_reason(out, self.engine.eos_ids))

    def _run(self, steps_fn, prompt, chat: bool, settings: GenerationSettings) -> GenerationResult:
        ids = self.encode(prompt, chat)
        stats = Stats()
        out = []
        for kept, _ in steps_fn(ids, settings, stats=stats):
            out.extend(kept)
        return self._result(ids, out, stats)

    def generate(self, prompt, *, max_new_tokens: int = 512, max_length: int = 2048, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, chat: bool = True,
                 settings: GenerationSettings | Sequence[GenerationSettings] | None = None,
                 batch_size: int = 8) -> GenerationResult | list[GenerationResult]:
        """DART decoding; greedy when temperature is 0, else lossless sampling.

        `prompt` is a string, token ids or a messages list; a list of those is decoded in batches
        of up to `batch_size` sequences and gives a list of results in input order. A `settings`
        object (or one per prompt of a batch), when given, replaces the six keyword settings.
        """
        if is_batch(prompt):
            return self._generate_batch(list(prompt), chat, settings, batch_size,
                                        GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed))
        settings = settings or GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed)
        return self._run(self.engine.generate_steps, prompt, chat, settings)

    def batcher(self, slots: int = 8, max_length: int = 2048) -> Batcher:
        """A pool of `slots` sequences over this model (continuous batching): `submit(ids, settings)`
        queues a request and returns its handle (`.token_ids`, `.done`, `.finish_reason`, `.stats`),
        `step()` admits waiting requests or advances the running ones and returns what moved,
        `run()` steps until all are done; `close()` hands the caches back. Token ids come from
        `encode`."""
        return Batcher(self.engine, slots, max_length)

    def _generate_batch(self, prompts: list, chat: bool, settings, batch_size: int,
                        default: GenerationSettings) -> list[GenerationResult]:
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
                ids.append(self.encode(prompt, chat))
            except (ValueError, TypeError) as e:
                raise ValueError(f"prompt {i} of the batch: {e}") from None
        batcher = self.batcher(slots, max(s.max_length for s in settings))
        try:
            requests = []
            for i, (prompt_ids, s) in enumerate(zip(ids, settings)):
                try:
                    requests.append(batcher.submit(prompt_ids, s))
                except ValueError as e:
                    raise ValueError(f"prompt {i} of the batch: {e}") from None
            batcher.run()
        finally:
            batcher.close()
        results = [self._result(list(p), list(r.token_ids), r.stats) for p, r in zip(ids, requests)]
        return results

    def generate_ar(self, prompt: str | Sequence[int], *, max_new_tokens: int = 512, max_length: int = 2048,
                    temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                    chat: bool = True, settings: GenerationSettings | None = None) -> GenerationResult:
        """Plain autoregressive decoding of the target (the baseline), same arguments."""
        settings = settings or GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed)
        return self._run(self.engine.generate_ar_steps, prompt, chat, settings)

    def stream(self, prompt: str | Sequence[int], *, max_new_tokens: int = 512, max_length: int = 2048,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0, chat: bool = True,
               stats: Stats | None = None, settings: GenerationSettings | None = None) -> Iterator[tuple[str, int]]:
        """Yields (new text, accepted length of the step) once per step (0 for the prefill's token).
        Text is held back while it ends in an incomplete character."""
        settings = settings or GenerationSettings(max_new_tokens, max_length, temperature, top_p, top_k, seed)
        ids = self.encode(prompt, chat)
        out: list[int] = []
        shown = ""
        for kept, accepted in self.engine.generate_steps(ids, settings, stats=stats):
            out.extend(kept)
            text = self.decode(out)
            if text.endswith("\ufffd"):
                yield "", accepted
                continue
            piece, shown = text[len(shown):] if text.startswith(shown) else text, text
            yield piece, accepted
