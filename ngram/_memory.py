"""Memory and disk needs checked before the trie code allocates: a ResourceError that names the
size and the option to change, instead of an out-of-memory kill or a full disk half-way."""
from __future__ import annotations

import os
import shutil

from dart_jax.errors import ResourceError


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(need: int, what: str, advice: str) -> None:
    """ResourceError when `need` bytes exceed the memory available now."""
    avail = available_memory()
    if avail is not None and need > avail:
        raise ResourceError(f"{what} needs about {need / 2**30:.2f} GiB of memory but {avail / 2**30:.2f} GiB "
                            f"is available; {advice}.")


def check_disk(need: int, folder: str, what: str) -> None:
    """ResourceError when `need` bytes exceed the free space of `folder`'s file system."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need > free:
        raise ResourceError(f"{what} needs about {need / 2**30:.2f} GiB of disk in {folder!r} but "
                            f"{free / 2**30:.2f} GiB is free; free some space or write the output elsewhere.")
