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


def read_config(folder: Path, what: str) -> dict:
    """The JSON object in `folder`/config.json; `what` says what such a folder holds, for the error."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json in {folder}: {what} "
                                f"(found: {sorted(p.name for p in Path(folder).iterdir())[:20]}).")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}.")
    return raw


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
