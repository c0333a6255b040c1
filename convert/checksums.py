"""What can be checked of a checkpoint's bytes, and the hash check where a reference exists.

Every load checks the structure: safetensors headers (names, shapes, dtypes, offsets against the
file size), tensor tables against config.json, and for a DART head finite weights and a
consistent d2t/t2d. None of that sees a flipped bit inside a weight's value: safetensors files
carry no checksum. A file's SHA-256 can be compared with a reference where one exists: a file
from the Hugging Face cache is a link to a blob named by its hash (SHA-256 for LFS files such as
weights, the git blob SHA-1 for small files), so it is checked offline; a shard index's
`metadata.total_size` is compared with the tensor bytes the headers declare. Elsewhere the hash
is printed, to compare with the one on the hub's file page.
"""
from __future__ import annotations

import hashlib
import os
import re
import struct
from pathlib import Path

from dart_jax.convert.configs import read_json_object
from dart_jax.errors import FileFormatError, parse_json

CAN = ("structure: safetensors headers (names, shapes, dtypes, offsets against the file size), tensors "
       "against config.json, head weights finite, d2t/t2d consistent")
CANNOT = ("the values: a changed byte inside a weight passes every structural check (safetensors has no "
          "checksum); --hash compares each file's SHA-256 with the hub's where a reference exists")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def file_hash(path: Path, algorithm: str = "sha256", *, git_blob: bool = False, chunk: int = 1 << 24) -> str:
    """The file's hex digest, read in chunks (`git_blob`: git's blob hash, "blob SIZE\\0" + bytes)."""
    h = hashlib.new(algorithm)
    if git_blob:
        h.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hub_blob_hash(path: Path) -> str | None:
    """The hash a Hugging Face cache file is stored under (its blob's name), or None when the
    file is not a link into a cache's blobs folder."""
    if not path.is_symlink():
        return None
    target = Path(os.path.realpath(path))
    if target.parent.name == "blobs" and _HEX.fullmatch(target.name):
        return target.name
    return None


def _declared_data_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = parse_json(f.read(n), path, "a safetensors header; the file is damaged: download it again.")
    return max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)


def check_files(folder: Path, patterns=("*.safetensors", "*.gguf", "*.json")) -> list[str]:
    """One line per file of `folder` matching `patterns`: size, SHA-256 and the verdict. Raises a
    FileFormatError naming the first file whose hash (or the shard index's total size) disagrees."""
    lines, bad = [], None
    files = sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    for path in files:
        digest = file_hash(path)
        blob = hub_blob_hash(path)
        if blob is None:
            verdict = "no reference here: compare with the SHA-256 on the hub's file page"
        else:
            got = digest if len(blob) == 64 else file_hash(path, "sha1", git_blob=True)
            verdict = "matches the hub's hash" if got == blob else "DIFFERS from the hub's hash"
            if got != blob and bad is None:
                bad = FileFormatError(path, f"its hash {got[:16]}… differs from the hub's {blob[:16]}…: the file is "
                                            "damaged; delete it from the cache and download it again.")
        lines.append(f"    {path.name:40s} {path.stat().st_size:>14,d} B  sha256 {digest}  {verdict}")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        content = read_json_object(index, "a safetensors index")
        total = content.get("metadata", {}).get("total_size")
        shards = sorted(set(content.get("weight_map", {}).values()))
        if isinstance(total, int) and all((folder / s).is_file() for s in shards):
            declared = sum(_declared_data_bytes(folder / s) for s in shards)
            lines.append(f"    index total_size {total:,d} B, shards declare {declared:,d} B")
            if declared != total and bad is None:
                bad = FileFormatError(index, f"total_size {total} but the shards' headers declare {declared} bytes "
                                             "of tensors: a shard is damaged or from another revision; download "
                                             "the checkpoint again.")
    if bad is not None:
        print("\n".join(lines))
        raise bad
    return lines
