"""A target checkpoint of any supported family, wherever it is: a HF folder, a hub id, or a Llama
`.gguf` file (converted once into the cache by `convert.gguf`)."""
from __future__ import annotations

import os
from pathlib import Path

from .configs import config_from_file, read_config
from .gguf import MANIFEST, checked_conversion, gguf_folder, is_gguf
from .qwen3 import Qwen3Config, checkpoint_folder, target_config_from_hf


def target_folder(path_or_id: str | os.PathLike, *, weights_later: bool = False) -> Path:
    """The local HF folder of a target of any supported family: a folder, a hub id, or a Llama
    `.gguf` file (converted once into the cache, `convert.gguf.gguf_folder`). A folder converted
    from a GGUF file is checked against its checksums first (`convert.gguf.checked_conversion`;
    `weights_later`: its weights' on a thread, waited for when a call without it loads them)."""
    if is_gguf(path_or_id):
        return gguf_folder(path_or_id, weights_later=weights_later)
    return converted_checked(checkpoint_folder(path_or_id), weights_later=weights_later)


def converted_checked(folder: Path, *, weights_later: bool = False) -> Path:
    """`folder` itself; when it is a GGUF conversion (it holds the manifest), once its files match
    their checksums (a damaged one rebuilt, or refused: `convert.gguf.checked_conversion`)."""
    if (folder / MANIFEST).is_file():
        return checked_conversion(folder, weights_later=weights_later)
    return folder


def load_target_config(path_or_id: str | os.PathLike) -> Qwen3Config:
    """The config of a target folder, hub id or GGUF file, Qwen3 or Llama by its `model_type`."""
    folder = target_folder(path_or_id, weights_later=True)  # the config only: the weights' checksums may wait
    cfg = read_config(folder, "a HF checkpoint folder needs config.json next to its model.safetensors")
    return config_from_file(folder / "config.json", lambda: target_config_from_hf(cfg))
