"""Reading a checkpoint's config.json, checking its values, and turning JSON values into hashable ones.

Model configs are frozen dataclasses that sit in a GraphDef or serve as static jit arguments,
so every nested JSON value they keep (rope_scaling, unknown fields) must be hashable.

The checks are strict about types, since a wrong type is a broken file, not a value to guess
at: an integer field takes a JSON integer only (not `"64"`, not `true`, not `7.5` or `7.0`), a
float field a finite JSON number (integers included, booleans not), a flag `true`/`false`. A
problem is an `InputError` naming the field, what was expected and what came; `config_from_file`
turns it into a `FileFormatError` that also names the file.
"""
from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from dart_jax.errors import FileFormatError, InputError, MissingFileError, parse_json

T = TypeVar("T")
# sizes index int32 arrays; a value past these bounds is a corrupted file, not a model
MAX_SIZE = 2**31 - 1
MAX_LAYERS = 1024


def read_config(folder: Path, what: str) -> dict:
    """The JSON object in `folder`/config.json; `what` says what such a folder holds, for the error."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise MissingFileError(f"no config.json in {folder}: {what} "
                                f"(found: {sorted(p.name for p in Path(folder).iterdir())[:20]}).")
    return read_json_object(path, "the checkpoint's config")


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in the file `path` (a FileFormatError naming it when it is anything else)."""
    path = Path(path)
    if not path.is_file():
        raise FileFormatError(path, f"is not a file; expected {what} as a JSON object.")
    raw = parse_json(path.read_bytes(), path, f"{what}. The file is corrupted or truncated: download it again.")
    if not isinstance(raw, dict):
        raise FileFormatError(path, f"expected {what} as a JSON object, got {json_type(raw)}.")
    return raw


def config_from_file(path: Path, build: Callable[[], T]) -> T:
    """`build()` with any InputError about a config value reported as a problem of the file `path`."""
    try:
        return build()
    except FileFormatError:
        raise
    except InputError as e:
        raise FileFormatError(path, f"{e} Correct the value in this file (or use the checkpoint's original "
                                    "config.json).") from e


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


# ---------------------------------------------------------------- value checks
def json_type(value: Any) -> str:
    """A value as the error messages show it: its JSON text (shortened) and, when that could
    mislead, its JSON type."""
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return f"{text} (a boolean)"
    if isinstance(value, str):
        return f"{text} (a string)"
    if isinstance(value, Mapping):
        return f"{text} (an object)"
    if isinstance(value, (list, tuple)):
        return f"{text} (a list)"
    return text


def is_int(value: Any) -> bool:
    """An integer that is not a boolean (Python or NumPy)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """An integer or a float that is not a boolean (NaN and infinities included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_int(what: str, name: str, value: Any, *, minimum: int = 1, maximum: int = MAX_SIZE,
              hint: str = "") -> int:
    """`value` as an int when it is an integer in [minimum, maximum] (an InputError otherwise)."""
    if not is_int(value) or not minimum <= int(value) <= maximum:
        bounds = f">= {minimum} (and < 2^31)" if maximum == MAX_SIZE else f"in [{minimum}, {maximum}]"
        raise InputError(f"{what}: `{name}` must be an integer {bounds}, got {json_type(value)}{hint}.")
    return int(value)


def check_float(what: str, name: str, value: Any, *, positive: bool = True, hint: str = "") -> float:
    """`value` as a float when it is a finite number (> 0 with `positive`; an InputError otherwise)."""
    ok = is_number(value) and math.isfinite(float(value)) and (not positive or float(value) > 0)
    if not ok:
        raise InputError(f"{what}: `{name}` must be a finite number{' > 0' if positive else ''}, got "
                         f"{json_type(value)}{hint}.")
    return float(value)


def check_bool(what: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{what}: `{name}` must be true or false, got {json_type(value)}.")
    return bool(value)


def check_str(what: str, name: str, value: Any, allowed: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or (allowed is not None and value not in allowed):
        expected = "a string" if allowed is None else f"one of {list(allowed)}"
        raise InputError(f"{what}: `{name}` must be {expected}, got {json_type(value)}.")
    return value


def check_object(what: str, name: str, value: Any) -> dict | None:
    """A JSON object (as a dict) or null (None); an InputError for anything else."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InputError(f"{what}: `{name}` must be a JSON object (or null), got {json_type(value)}.")
    return dict(value)


def required(cfg: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    """An InputError listing the keys that are absent or null."""
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        nulls = [k for k in missing if k in cfg]
        detail = f" ({', '.join(nulls)} {'is' if len(nulls) == 1 else 'are'} null)" if nulls else ""
        raise InputError(f"{what}: the required field(s) {missing} are missing{detail}; a config of this kind needs "
                         f"{list(keys)}, each an integer >= 1.")
