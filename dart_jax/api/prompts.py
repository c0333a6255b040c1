"""Prompt files: the one reader of JSONL prompt files (`python -m dart_jax.generate --prompts`,
`python -m dart_jax.bench e2e --prompts`) and the check of a messages list.

Every error names the file, and the line (`in.jsonl:3: ...`) where one line is at fault: a file
that is missing or not UTF-8, a line that is not JSON or not an object, a missing or empty
prompt, an unknown field, text that is not valid Unicode, a message with an unknown role.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from dart_jax.errors import InputError, MissingFileError, check_text, not_utf8, parse_json

ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: list) -> None:
    """A messages list as the chat template takes it: {"role", "content"} objects with a known role
    and valid Unicode text; the error names the message."""
    for i, m in enumerate(messages):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise InputError(f"message {i} needs string fields 'role' and 'content', got {m!r:.200}.")
        if m["role"] not in ROLES:
            raise InputError(f"message {i} has role {m['role']!r:.40}; use one of {', '.join(ROLES)}.")
        check_text(m["content"], f"the content of message {i}")


def _check_line(item, fields: Iterable[str] | None, messages: bool, token_ids: bool) -> None:
    if messages:
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise InputError("expected an object with exactly one of 'prompt' and 'messages'")
        prompt = item.get("prompt", item.get("messages"))
        if not prompt or not isinstance(prompt, (str, list)) or ("messages" in item and isinstance(prompt, str)):
            raise InputError("'prompt' must be non-empty text or token ids, 'messages' a non-empty list")
    else:
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if not (isinstance(prompt, str) or (token_ids and isinstance(prompt, list))) or not prompt:
            raise InputError("needs a non-empty string field \"prompt\"" + (" (or token ids)" if token_ids else ""))
    if fields is not None:
        known = ["prompt", *(["messages"] if messages else []), *fields]
        unknown = sorted(set(item) - set(known))
        if unknown:
            raise InputError(f"unknown field(s) {unknown}; known: {', '.join(known)}")
    if isinstance(prompt, str):
        check_text(prompt, "'prompt'")
    elif "messages" in item:
        check_messages(prompt)


def read_prompt_file(path: str | Path, *, fields: Iterable[str] | None = (), messages: bool = True,
                     token_ids: bool = True, what: str = "--prompts file") -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of a JSONL prompt file. A line is a JSON
    object with a 'prompt' (non-empty text or, with `token_ids`, a list of token ids) or, with
    `messages`, instead a 'messages' list (checked by `check_messages`); its other keys must be
    among `fields` (None: any, not looked at). A bad line is an InputError naming `path:line`; a
    file without prompts, missing, or not UTF-8 is an error naming `path` (`what` says which
    option gave it)."""
    path = Path(path)
    example = '{"prompt": ...} or {"messages": [...]}' if messages else '{"prompt": ...}'
    if not path.is_file():
        raise MissingFileError(f"{what} {path} not found; pass a JSONL file with one {example} object per line.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        item = parse_json(line, f"{path}:{n}", f"each line must be one JSON object, {example}")
        try:
            _check_line(item, fields, messages, token_ids)
        except InputError as e:
            raise InputError(f"{path}:{n}: {e}") from None
        items.append((n, item))
    if not items:
        raise InputError(f"{path} holds no prompts; each line must be one JSON object, {example}.")
    return items
