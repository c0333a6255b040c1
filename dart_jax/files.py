"""Atomic output, one implementation for every writer: a file or a folder is written under a
scratch name beside its destination and renamed into place (`os.replace` / `os.rename`) only when
complete, so a reader never sees a partial output (docs/spec.md §6.2).

- `atomic_path(path)`: one file (a trie). The temporary file, and a writer's `scratch_dir`, are
  named ``.dart-jax-trie-<host>-<pid>-<random>[.tmp]``.
- `atomic_folder(dest, owned)`: a folder (a converted head or checkpoint). The scratch folder is
  ``.NAME.partial-<pid>-<random>``; a replaced folder is first moved to ``.NAME.old-<pid>-<random>``.

A run removes its own scratch in a ``finally`` on any error; what a killed run left (a ``kill -9``
or a power cut runs no ``finally``) the next run in the same folder removes, once the process
named in it is gone (`clean_stale`, `clean_leftovers`: one scan, `_dead_entries`).

Like `dart_jax.errors`, a leaf under every layer (ngram and convert both write through it): it
imports nothing of dart_jax but the errors, nor jax.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Iterable, Iterator

from dart_jax.errors import InputError, MissingFileError

PREFIX = ".dart-jax-trie-"  # atomic_path's temporary files and scratch_dir's folders


def cache_root() -> Path:
    """dart_jax's cache folder, the one place it is resolved: $XDG_CACHE_HOME/dart_jax, or
    ~/.cache/dart_jax when XDG_CACHE_HOME is unset or empty (the XDG convention)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dart_jax"


def compile_cache_dir() -> Path:
    """Where compiled programs are kept by default (JAX's persistent compilation cache,
    `models.backend.use_compile_cache`): the cache folder's xla/."""
    return cache_root() / "xla"


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (a checksum to compare with a recorded one), read in blocks of up
    to 64 MiB: reading and hashing leave the GIL, and a hash on a thread beside Python work waits
    for the GIL again at every block, so the blocks are few. (Not a memory map: a
    file cut short while mapped would end the process with SIGBUS.)"""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        buffer = bytearray(max(1, min(os.fstat(f.fileno()).st_size, 1 << 26)))
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


# -- leftovers of killed writers -------------------------------------------------------------------
def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or an odd pid): leave its files alone
    return True


def _dead_entries(folder: str | os.PathLike, pattern: re.Pattern) -> Iterator[tuple[re.Match, os.DirEntry]]:
    """(match, entry) of the entries of `folder` whose whole name matches `pattern` (its group
    'pid' the writer's process id) and whose writer is gone."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and not _alive(int(match.group("pid"))):
            yield match, entry


def _remove(path: str | os.PathLike) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


# -- one file: atomic_path, scratch_dir --------------------------------------------------------------
def _host() -> str:
    # only characters that cannot be confused with the separators of the name
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:40] or "host"


def stale_entries(folder: str) -> list[str]:
    """Temporary files and scratch folders of `atomic_path`/`scratch_dir` in `folder` left by dead
    processes of this host (another host's are left alone: its pids are not ours to test)."""
    if os.name != "posix":
        return []
    pattern = re.compile(re.escape(PREFIX + _host()) + r"-(?P<pid>\d+)-[0-9a-f]+(\.tmp)?")
    return [entry.path for _, entry in _dead_entries(folder, pattern)]


def clean_stale(folder: str) -> None:
    """Remove what `stale_entries` finds (best effort: another run may be removing it too)."""
    for path in stale_entries(folder):
        _remove(path)


def _new_name(folder: str, suffix: str = "") -> str:
    return os.path.join(folder, f"{PREFIX}{_host()}-{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def check_output(path, what: str = "output") -> str:
    """The absolute output path, after checking that it is not a folder and that its folder exists."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        raise InputError(f"{what} {path!r} is a folder; pass a file name (e.g. {os.path.join(path, 'ngram.trie')!r}).")
    check_regular(path, what)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise InputError(f"{what} {path!r}: {folder!r} is not a folder; pass a path inside a folder.")
        raise MissingFileError(f"{what} {path!r}: the folder {folder!r} does not exist; create it first.")
    return path


def check_regular(path, what: str = "output") -> None:
    """An InputError when `path` exists and is not a regular file (a named pipe, a device, a
    socket): the atomic rename that writes an output would replace it rather than write into it."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise InputError(f"{what} {os.fspath(path)!r} exists and is not a regular file (a named pipe, device or "
                         "socket), which writing would replace; pass the name of a file.")


def check_apart(output, inputs: Iterable[tuple[str, object]], what: str = "output", *,
                inside_ok: bool = False) -> None:
    """An InputError, before any work, when the output path `output` is one of `inputs` (the same
    file, also through a link), holds one, or lies inside one (unless `inside_ok`: a file written
    into a folder of inputs that the command reads by suffix): writing it would replace or change
    what is read. `inputs`: (a name for the message, e.g. the flag, or ""; a path) pairs; None and paths
    that do not exist here (hub ids) are skipped."""
    out = Path(os.path.realpath(os.path.expanduser(os.fspath(output))))
    for name, path in inputs:
        if path is None or not os.path.exists(os.path.expanduser(os.fspath(path))):
            continue
        real = Path(os.path.realpath(os.path.expanduser(os.fspath(path))))
        if out == real or out.exists() and os.path.samefile(out, real):
            relation = "is"
        elif real in out.parents and not inside_ok:
            relation = "lies inside"
        elif out in real.parents:
            relation = "holds"
        else:
            continue
        raise InputError(f"{what} {os.fspath(output)!r} {relation} the input {name + ' ' if name else ''}"
                         f"{os.fspath(path)!r}: writing it would overwrite or change what is read. Pass an output "
                         "path apart from the inputs.")


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
    except OSError as e:
        if not e.filename or str(e.filename) == tmp:  # a full disk met at a flush names no file: name the output
            e.filename = path
        raise
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


# -- one folder: atomic_folder -----------------------------------------------------------------------
def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _open_permissions(folder: Path) -> None:
    """Give the files written into `folder` the permissions of any new file (0666 less the umask):
    some writers (safetensors) create theirs 0600, which other users of a shared model folder
    could not read."""
    mode = 0o666 & ~_umask()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def clean_leftovers(dest: Path) -> None:
    """Remove what killed writers left beside `dest`, of any folder of its parent (the next export
    may have another name); put an old folder back when its folder is missing (the kill fell
    between moving the old folder away and moving the new one in)."""
    parent = Path(dest).parent
    pattern = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<pid>\d+)-[0-9a-f]+")
    found = sorted((match.group("kind"), match.group("name"), Path(entry.path))
                   for match, entry in _dead_entries(parent, pattern) if entry.is_dir(follow_symlinks=False))
    for kind, name, entry in found:
        if kind == "old" and not (parent / name).exists():
            os.rename(entry, parent / name)
        else:
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(dest: str | os.PathLike, owned: Iterable[str], *, make_parents: bool = True,
                  what: str = "output folder") -> Iterator[Path]:
    """Yield an empty scratch folder beside `dest`; when the block ends without an exception it
    becomes `dest` (replacing an existing `dest` that holds only files named in `owned`),
    otherwise it is removed. `dest` that is a file, or a folder holding other files, or (without
    `make_parents`) a missing parent folder, is an error before anything is written."""
    dest = Path(os.path.abspath(os.path.expanduser(str(dest))))
    parent, owned = dest.parent, set(owned)
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise InputError(f"{what} {dest} exists and is not a folder; pass the path of a folder to write "
                             f"({', '.join(sorted(owned))} go into it).")
        foreign = sorted(p.name for p in dest.iterdir() if p.name not in owned)
        if foreign:
            raise InputError(f"{what} {dest} already holds other files ({', '.join(foreign[:5])}"
                             f"{' ...' if len(foreign) > 5 else ''}); it would be replaced whole, so pass a new or empty "
                             f"folder, or one that holds only {', '.join(sorted(owned))}.")
    if not parent.is_dir():
        if parent.exists() or any(p.exists() and not p.is_dir() for p in parent.parents):
            raise InputError(f"cannot create {what} {dest}: a part of the path {parent} is a file, not a folder.")
        if not make_parents:
            raise MissingFileError(f"cannot create {what} {dest}: the folder {parent} does not exist; create it "
                                   "first or pick another path.")
        parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(dest)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    scratch = parent / f".{dest.name}.partial-{token}"
    os.mkdir(scratch)
    try:
        yield scratch
        _open_permissions(scratch)
        if dest.exists() or dest.is_symlink():
            old = parent / f".{dest.name}.old-{token}"
            os.rename(dest, old)
            os.rename(scratch, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(scratch, dest)
    except BaseException as e:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(e, OSError) and str(e.filename or "").startswith(str(scratch)):  # name what the user asked for
            e.filename = str(dest) + str(e.filename)[len(str(scratch)):]
        raise
