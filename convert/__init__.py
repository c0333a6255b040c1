"""Checkpoint reading and writing (safetensors; no torch at run time)."""
from __future__ import annotations

__all__ = ["load_qwen3", "load_dart_head", "save_dart_head"]


def __getattr__(name):
    if name == "load_qwen3":
        from .qwen3 import load_qwen3

        return load_qwen3
    if name in ("load_dart_head", "save_dart_head"):
        from . import dart_head

        return getattr(dart_head, name)
    raise AttributeError(name)
