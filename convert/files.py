"""Writing a folder atomically: into a scratch folder beside it, renamed into place when complete.

A reader (or a killed writer's next run) never sees a half-written folder under the final
name: until the rename it sees the previous folder (or none), afterwards the new one whole.
Scratch folders are named `.NAME.partial-PID-TOKEN`; a replaced folder is first moved to
`.NAME.old-PID-TOKEN`. The next write to the same destination removes what a killed writer
left behind, and moves an old folder back when the kill fell between the two renames.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from dart_jax.errors import InputError, MissingFileError


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process
    return True


def _leftovers(parent: Path, name: str) -> Iterator[tuple[str, Path]]:
    """(kind, path) of the scratch and old folders a dead writer left for `name` in `parent`."""
    pattern = re.compile(rf"\.{re.escape(name)}\.(partial|old)-(\d+)-[0-9a-f]+")
    for entry in parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and not _pid_alive(int(match.group(2))):
            yield match.group(1), entry


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
    """Remove what a killed writer of `dest` left; put an old folder back when `dest` is missing
    (the kill fell between moving the old folder away and moving the new one in)."""
    for kind, entry in sorted(_leftovers(dest.parent, dest.name)):
        if kind == "old" and not dest.exists():
            os.rename(entry, dest)
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
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
