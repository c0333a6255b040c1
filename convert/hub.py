"""Resolve a checkpoint name (hub id or local folder/file) to a local path.

Hub ids go through huggingface_hub, which honours HF_HUB_OFFLINE and the local cache; a local
folder laid out like a hub snapshot is used as is.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from dart_jax.errors import MissingFileError


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve(name: str | os.PathLike, allow_patterns: Sequence[str] | None = None, *, what: str = "checkpoint") -> Path:
    """Return a local folder (or file) for `name`.

    `name` is a local folder or file, or a hub id such as ``fvliang/qwen8b-dart``.
    `allow_patterns` limits what is downloaded from the hub (e.g. ``["*.json", "*.safetensors"]``).
    """
    path = Path(os.path.expanduser(str(name)))
    try:
        if path.exists():
            return path
    except (ValueError, OSError):  # a NUL byte, a name too long: not a path that can exist
        pass
    name = str(name)
    if not _looks_like_repo_id(name) or "\0" in name:
        raise MissingFileError(
            f"{what} {name!r} is neither an existing local path nor a hub id of the form 'owner/name'; "
            "pass a folder that holds config.json and *.safetensors, or a Hugging Face repo id."
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(name, allow_patterns=list(allow_patterns) if allow_patterns else None,
                                      local_files_only=offline))
    except LocalEntryNotFoundError as e:
        raise MissingFileError(
            f"{what} {name!r} was not found in the local Hugging Face cache and the hub cannot be reached "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}). Download it once with "
            f"`hf download {name}` (huggingface_hub >= 0.34; older versions: `huggingface-cli download {name}`) on a "
            "machine with internet, or pass a local folder."
        ) from e
    except Exception as e:  # network errors, unknown repo, gated repo
        if type(e).__name__ in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
            raise MissingFileError(f"{what} {name!r}: no such repository on the Hugging Face hub ({e}).") from e
        raise
