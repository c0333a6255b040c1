"""Where the checkpoints come from: the published DART heads and their bases, hub and folder
resolution of n-gram tries (a reference .trie converted once and cached), and the EOS ids of a
base model. `DartModel.from_pretrained` reads these; `dart_jax.api.model` re-exports them."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

from dart_jax.convert.base_files import check_generation_eos
from dart_jax.convert.hub import resolve
from dart_jax.errors import read_json
from dart_jax.files import cache_root
from dart_jax.ngram import Trie, load_any, trie_format

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
    cache = Path(cache_dir) if cache_dir else cache_root()
    st = source.stat()
    digest = hashlib.sha1(f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache / f"{source.name}.{digest}.dart_jax"


def load_trie(ngram, *, small: bool = False, cache_dir: str | os.PathLike | None = None):
    """A `Trie` (or a `CompressedTrie`, for a compressed file) from a file, a folder holding
    small.trie/full.trie, or a hub id. A reference (C++) `.trie` is converted once to our format
    and cached next to it (or under `cache_dir`, default ~/.cache/dart_jax, when that folder is
    read-only)."""
    path = _trie_file(ngram, small)
    if trie_format(path) is not None:  # ours, CSR or compressed (docs/spec.md §6.3: the same answers)
        return load_any(path)
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
        eos = read_json(gen, "a JSON object").get("eos_token_id")
        if eos is not None:
            ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return sorted(ids)
