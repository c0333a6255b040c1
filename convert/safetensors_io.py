"""Read and write safetensors checkpoints as NumPy arrays (no torch).

bf16 tensors come back as ``ml_dtypes.bfloat16`` arrays; sharded checkpoints are read through
``model.safetensors.index.json``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, in a stable order."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index}: not a valid safetensors index (expected a JSON object with 'weight_map'): {e}") from e
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (folder / f).exists()]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) that are not in {folder}: {missing}; download the whole checkpoint.")
        return [folder / f for f in files]
    if (folder / SINGLE_NAME).exists():
        return [folder / SINGLE_NAME]
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    if found:
        return [folder / f for f in found]
    raise FileNotFoundError(
        f"no weights in {folder}: expected {SINGLE_NAME} or {INDEX_NAME} with its shards "
        f"(found: {sorted(p.name for p in folder.iterdir())[:20]})."
    )


def read_tensors(folder: Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """All tensors (or only `names`) of a checkpoint folder as NumPy arrays."""
    wanted = None if names is None else set(names)
    out: dict[str, np.ndarray] = {}
    for f in weight_files(folder):
        with safe_open(str(f), framework="numpy") as fh:
            for key in fh.keys():
                if wanted is None or key in wanted:
                    out[key] = fh.get_tensor(key)
    return out


def write_tensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write one safetensors file (bf16 arrays as ml_dtypes.bfloat16)."""
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=metadata or {"format": "pt"})


def tensor_index(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Name → (file, shape) over all weight files of a checkpoint, read from the headers only."""
    index: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for f in weight_files(folder):
        with safe_open(str(f), framework="numpy") as fh:
            for key in fh.keys():
                if key in index:
                    raise ValueError(f"tensor {key!r} appears in both {index[key][0].name} and {f.name}.")
                index[key] = (f, tuple(fh.get_slice(key).get_shape()))
    return index


def write_checkpoint_tensors(folder: Path, tensors: dict[str, np.ndarray],
                             max_shard_size_bytes: int | None = None) -> list[Path]:
    """Write the tensors of a checkpoint into `folder`: one `model.safetensors`, or, with
    `max_shard_size_bytes`, shards of at most that size (a larger tensor gets a shard of its own)
    named and indexed as transformers writes them. Returns the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if max_shard_size_bytes is None:
        write_tensors(folder / SINGLE_NAME, tensors)
        return [folder / SINGLE_NAME]
    if max_shard_size_bytes <= 0:
        raise ValueError(f"max_shard_size_bytes must be a positive number of bytes, got {max_shard_size_bytes}.")
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        nbytes = np.asarray(array).nbytes
        if shards[-1] and size + nbytes > max_shard_size_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += nbytes
    files, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        files.append(folder / f"model-{i:05d}-of-{len(shards):05d}.safetensors")
        write_tensors(files[-1], shard)
        weight_map.update(dict.fromkeys(shard, files[-1].name))
    total = int(sum(np.asarray(a).nbytes for a in tensors.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return files
