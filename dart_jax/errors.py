"""User errors and the one error boundary of every command.

A user error is a bad file, config, argument or request: its message names the thing (the file,
the field, the flag), what was expected, and what to do. The Python API raises the classes below
(`ValueError` / `FileNotFoundError` subclasses, so `except ValueError` keeps working); every
command line tool runs its body through `cli_boundary`, which turns any user error into one
`error: …` line and exit code 2. Anything else is a bug in dart_jax and keeps its traceback.
The commands' help formatter (`DefaultsHelpFormatter`) is here too, beside that boundary.

This module is a leaf that every layer may import; it imports nothing of dart_jax, nor jax.
"""
from __future__ import annotations

import argparse
import errno
import json
import numbers
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable


class InputError(ValueError):
    """A user's input (argument, config value, request) is wrong."""


class FileFormatError(InputError):
    """A file is not what it should be (truncated, corrupted, wrong format); the message names it."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        super().__init__(f"{path}: {problem}")


class MissingFileError(FileNotFoundError):
    """A file or folder the user named does not exist."""


class ResourceError(InputError):
    """The request needs more memory (or other resources) than there is; the message says how much
    and which option to change."""


def check_text(text: str, what: str) -> str:
    """`text` itself when it is valid Unicode (it encodes as UTF-8, as every tokenizer needs); an
    InputError naming `what` when it holds a lone surrogate: a JSON escape such as "\\ud800", or a
    byte that was not UTF-8 in a command line argument (Python keeps those as U+DC80..U+DCFF)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        found = (f"the byte 0x{code - 0xDC00:02x} (not UTF-8)" if 0xDC80 <= code <= 0xDCFF
                 else f"a lone surrogate U+{code:04X}")
        raise InputError(f"{what} is not valid Unicode text: {found} at character {e.start}; "
                         "pass UTF-8 text (a surrogate needs its pair).") from None
    return text


# The type checks of arguments: a value of another type is refused where it comes in, never converted
# (int(2.9) truncates, int("3") parses, bool("no") is True) nor left to fail deep inside the work.
def check_type(value, name: str, types: type | tuple[type, ...], takes: str):
    """`value` when it is an instance of `types`, else an InputError naming the argument `name`,
    what it takes (`takes`, in words: "a list or None") and what it got."""
    if not isinstance(value, types):
        raise InputError(f"{name} must be {takes}, got {type(value).__name__} {value!r:.40}.")
    return value


def check_bool(value, name: str) -> bool:
    """True or False; anything else (a string such as "no", 0 or 1) is an InputError naming `name`."""
    return check_type(value, name, bool, "True or False")


def check_int(value, name: str, low: int | None = None) -> int:
    """`value` as an int when it is an integer (NumPy's too) of at least `low`; a bool, a float
    (2.9 is not truncated) or a string ("3") is an InputError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}.")
    if low is not None and value < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value}.")
    return int(value)


def check_number(value, name: str) -> float:
    """`value` as a float when it is a real number (NumPy's too), not a bool or a string; the range
    check that follows refuses NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InputError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}.")
    return float(value)


def not_utf8(path, e: UnicodeDecodeError, where: str = "") -> "FileFormatError":
    """The error for a file that is not UTF-8 text (binary, or another encoding), naming the file."""
    bad = e.object[e.start:e.start + 1].hex() if isinstance(e.object, (bytes, bytearray)) else "?"
    return FileFormatError(path, f"not UTF-8 text (byte 0x{bad}{where}); save it as UTF-8 or pass a text file.")


# Deeper than any file or request the project reads needs (a chat template's tool schema is a few
# levels), low enough that no code walking a parsed value recursively reaches Python's recursion limit.
MAX_JSON_DEPTH = 64


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def _depth_exceeds(text: str, limit: int) -> bool:
    """Whether valid JSON `text` nests its arrays and objects more than `limit` deep, read off the
    text: its brackets outside strings, each pass taking away the innermost pairs, so that a value
    `limit` deep is gone after `limit` passes. A walk over the parsed value visits every item in
    Python (a tokenizer.json's whole vocabulary and merges); these passes run in the regex engine."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(limit):
        if not brackets:
            return False
        brackets = _INNERMOST.sub("", brackets)
    return bool(brackets)


def parse_json(text: str | bytes, where, expected: str) -> Any:
    """The JSON value in `text` (a file's content or one line of it; `where` names it, e.g.
    ``path:3``), nested at most MAX_JSON_DEPTH levels. Anything else, deep nesting included, is a
    FileFormatError naming `where`, the problem and `expected` (what the value should be and how to
    fix it). The one JSON parser of every file and input the project reads."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise not_utf8(where, e) from None
    try:
        value = json.loads(text)
        deep = _depth_exceeds(text, MAX_JSON_DEPTH)
    except RecursionError:
        deep = True
    except ValueError as e:  # JSONDecodeError, an integer of too many digits
        raise FileFormatError(where, f"not valid JSON ({str(e)[:200]}); expected {expected}") from None
    if deep:
        raise FileFormatError(where, f"JSON nested more than {MAX_JSON_DEPTH} levels deep; expected {expected}")
    return value


def read_json(path, expected: str) -> Any:
    """`parse_json` of the file `path`: a MissingFileError when it is not there, a FileFormatError
    naming it when it is not UTF-8 JSON of at most MAX_JSON_DEPTH levels."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path} not found; expected {expected}")
    return parse_json(path.read_bytes(), path, expected)


# the tokenizer's small JSON files that transformers parses in Python (tokenizer.json is read by the tokenizers library)
TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


# (tokenizer_config.json's tokenizer_class, config.json's model_type) → the class transformers 5's
# AutoTokenizer builds for a local folder without remote code (its choice read off
# models/auto/tokenization_auto.py: the hub's class where the family registers no other or is not
# marked as declaring a wrong one, and TokenizersBackend for PreTrainedTokenizerFast)
_TOKENIZER_CLASSES = {**{(name, family): "TokenizersBackend" for name in ("TokenizersBackend", "PreTrainedTokenizerFast")
                         for family in ("qwen3", "qwen3_moe", "llama")},
                      **{(name, family): "Qwen2Tokenizer" for name in ("Qwen2Tokenizer", "Qwen2TokenizerFast")
                         for family in ("qwen3", "qwen3_moe")}}


def _tokenizer_class(folder: Path, tokenizer_config: Any) -> type | None:
    """The class AutoTokenizer would build for `folder` when `_TOKENIZER_CLASSES` knows it, imported
    alone: AutoTokenizer's own machinery imports every family's config module (and torch where it is
    installed), seconds before a tokenizer it then builds with a plain `from_pretrained` of that
    class. None otherwise (another transformers major, remote code, another class or family):
    AutoTokenizer decides."""
    import transformers

    if not transformers.__version__.startswith("5.") or not isinstance(tokenizer_config, dict) \
            or "auto_map" in tokenizer_config or not (folder / "config.json").is_file():
        return None
    config = read_json(folder / "config.json", "the model's config.json; restore it from the model's repository.")
    name = _TOKENIZER_CLASSES.get((tokenizer_config.get("tokenizer_class"),
                                   config.get("model_type") if isinstance(config, dict) else None))
    return None if name is None else getattr(transformers, name)


def load_tokenizer_folder(folder) -> Any:
    """transformers' AutoTokenizer of a tokenizer folder, the one loader of every command (never
    remote code); the tokenizer classes of the supported families come by their own import
    (`_tokenizer_class`). Its JSON files go through `read_json` first (transformers' own parser
    recurses: deep nesting would be a RecursionError there); a tokenizer.json that is not a
    tokenizer (the tokenizers library raises a bare Exception, transformers a KeyError or
    TypeError) is a FileFormatError naming the file; a folder without usable tokenizer files is a
    MissingFileError."""
    folder = Path(folder)
    restore = "restore it from the model's repository."
    configs = {name: read_json(folder / name, f"a tokenizer's JSON file; {restore}")
               for name in TOKENIZER_JSON if (folder / name).is_file()}
    tokenizer_json = folder / "tokenizer.json"
    if tokenizer_json.is_file():
        content = read_json(tokenizer_json, f"a tokenizers JSON file; {restore}")
        if not isinstance(content, dict) or not isinstance(content.get("model"), dict) \
                or not isinstance(content.get("added_tokens", []), list):
            raise FileFormatError(tokenizer_json, f"not a tokenizer (an object with a 'model' object and an "
                                                  f"'added_tokens' list); the file is damaged: {restore}")
    try:
        known = _tokenizer_class(folder, configs.get("tokenizer_config.json"))
        if known is not None:
            return known.from_pretrained(str(folder))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the tokenizers library's errors are bare Exceptions
        if type(e) is not Exception and not isinstance(e, (KeyError, TypeError, AttributeError, IndexError, ValueError,
                                                           OSError)):
            raise
        if tokenizer_json.is_file():
            raise FileFormatError(tokenizer_json, f"the tokenizer cannot be built from it ({type(e).__name__}: "
                                                  f"{str(e)[:200]}); the file is damaged: {restore}") from None
        raise MissingFileError(f"no usable tokenizer in {folder} ({str(e)[:200]}); it needs the HF tokenizer "
                               "files (tokenizer.json, tokenizer_config.json).") from e


# OSErrors that are the user's to fix: a path that is a folder, not a folder, missing, taken, not writable, full
_USER_OS_ERRORS = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.ENOSPC,
                   errno.EROFS, errno.ENAMETOOLONG, errno.ENOTEMPTY, errno.EADDRINUSE, errno.EADDRNOTAVAIL}


def _platform_message(e: BaseException) -> str | None:
    """The message for JAX failing to start a backend that JAX_PLATFORMS names (its build not
    installed, no such device, a misspelt name): a RuntimeError from JAX's backend setup, or an
    AssertionError there when no backend at all came up; None for anything else."""
    platforms = os.environ.get("JAX_PLATFORMS")
    if not platforms or not isinstance(e, (RuntimeError, AssertionError)):
        return None
    frame = e.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    in_setup = frame is not None and frame.tb_frame.f_code.co_filename.replace("\\", "/").endswith("jax/_src/xla_bridge.py")
    if not in_setup and not str(e).startswith("Unable to initialize backend"):
        return None
    reason = str(e).split(" (set JAX_PLATFORMS")[0].strip() or "none of the backends it names is installed"
    return (f"JAX_PLATFORMS={platforms}: JAX cannot start that backend here ({reason[:300]}). Install JAX's build for "
            "it (pip install '.[cuda]' for NVIDIA GPUs, '.[tpu]' for TPUs) on a machine that has the device, or unset "
            "JAX_PLATFORMS so that JAX picks the devices there are.")


def user_error_message(e: BaseException) -> str | None:
    """The message to show for a user error, or None when `e` is a bug (keep its traceback)."""
    if isinstance(e, (ValueError, FileNotFoundError)):
        return str(e)
    platform = _platform_message(e)
    if platform is not None:
        return platform
    if isinstance(e, OSError) and e.errno in _USER_OS_ERRORS:
        where = f"{e.filename}: " if e.filename and str(e.filename) not in str(e.strerror or "") else ""
        fix = "; free some space there or write to another disk" if e.errno == errno.ENOSPC else ""
        return f"{where}{e.strerror or e}{fix}"
    if isinstance(e, MemoryError):
        return "out of host memory; use smaller sizes (max length, batch size, trie order, chunk size)."
    # an accelerator (or XLA on the CPU) out of memory, without importing jax here
    if type(e).__name__ == "XlaRuntimeError" and "RESOURCE_EXHAUSTED" in str(e):
        first = str(e).strip().splitlines()[0][:300]
        return f"out of device memory ({first}); use smaller sizes (max length, batch size, tree size)."
    return None


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default after its text, except where the text states the
    default itself or there is none to show (None: the option was not given)."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def cli_boundary(body: Callable[[], int | None], *, prog: str = "dart_jax") -> int:
    """Run a command's body: 0 (or what it returns) on success, 2 with one `error:` line on a user
    error, 130 on Ctrl-C; a bug propagates with its traceback."""
    try:
        code = body()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - sorted into user errors and bugs just below
        message = user_error_message(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0 if code is None else int(code)
