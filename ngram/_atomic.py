"""Atomic output files and self-cleaning scratch space for trie writers (docs/spec.md §6.2).

A trie is written under a temporary name in its output folder and renamed over the final name
(`os.replace`) only when complete, so a reader never sees a partial file. Temporary files and
conversion scratch folders are named ``.dart-jax-trie-<host>-<pid>-<random>``: a run removes
them in a ``finally`` on any error, and the next run in the same folder removes those whose
process on this host is gone (a ``kill -9`` or a power cut runs no ``finally``).
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator

from dart_jax.errors import InputError, MissingFileError

PREFIX = ".dart-jax-trie-"


def _host() -> str:
    # only characters that cannot be confused with the separators of the name
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:40] or "host"


def _pattern() -> re.Pattern:
    return re.compile(re.escape(PREFIX + _host()) + r"-(\d+)-[0-9a-f]+(\.tmp)?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or an odd pid): leave its files alone
    return True


def stale_entries(folder: str) -> list[str]:
    """Temporary files and scratch folders in `folder` left by dead processes of this host."""
    if os.name != "posix":
        return []
    pattern = _pattern()
    found = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        m = pattern.match(entry.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            found.append(entry.path)
    return found


def clean_stale(folder: str) -> None:
    """Remove what `stale_entries` finds (best effort: another run may be removing it too)."""
    for path in stale_entries(folder):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)


def _new_name(folder: str, suffix: str = "") -> str:
    return os.path.join(folder, f"{PREFIX}{_host()}-{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def check_output(path, what: str = "output") -> str:
    """The absolute output path, after checking that it is not a folder and that its folder exists."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        raise InputError(f"{what} {path!r} is a folder; pass a file name (e.g. {os.path.join(path, 'ngram.trie')!r}).")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise InputError(f"{what} {path!r}: {folder!r} is not a folder; pass a path inside a folder.")
        raise MissingFileError(f"{what} {path!r}: the folder {folder!r} does not exist; create it first.")
    return path


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary file name next to `path` (a checked, absolute output path); on success
    rename it to `path`, on any error remove it."""
    folder = os.path.dirname(path)
    clean_stale(folder)
    tmp = _new_name(folder, ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


@contextlib.contextmanager
def scratch_dir(folder: str) -> Iterator[str]:
    """A fresh scratch folder inside `folder`, removed at the end whatever happens (and by the next
    run when this process is killed)."""
    clean_stale(folder)
    path = _new_name(folder)
    os.mkdir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
