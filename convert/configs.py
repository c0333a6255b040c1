"""Reading a checkpoint's config.json, and turning JSON values into hashable ones.

Model configs are frozen dataclasses that sit in a GraphDef or serve as static jit arguments,
so every nested JSON value they keep (rope_scaling, unknown fields) must be hashable.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping


def read_config(folder: Path, what: str) -> dict:
    """The JSON object in `folder`/config.json; `what` says what such a folder holds, for the error."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json in {folder}: {what} "
                                f"(found: {sorted(p.name for p in Path(folder).iterdir())[:20]}).")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}.")
    return raw


def freeze(value: Any) -> Any:
    """A JSON value as a hashable equivalent: objects become sorted (key, value) tuples, lists tuples."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(pairs: tuple | None) -> dict | None:
    """The dict of a frozen JSON object (one level), or None."""
    return None if pairs is None else dict(pairs)
