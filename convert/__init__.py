"""Checkpoint reading and writing (safetensors; no torch at run time): configs, tensor names and
their checks, hub resolution. A leaf of the project: it imports nothing else of dart_jax.

`load_qwen3`, `load_dart_head` and `save_dart_head` build or take modules, which live above this
package in `dart_jax.models`; they are public under this package's name (the documented API),
so they are handed on lazily from `dart_jax.models.checkpoints` — the one place where a name of
a higher layer is reachable from here (tests/test_layers.py allows exactly this).
"""
from __future__ import annotations

import importlib

from .dart_head import DartHeadConfig, export_dart_head, read_head, write_dart_head
from .hub import resolve
from .gguf import gguf_folder, gguf_to_folder
from .qwen3 import Qwen3Config, load_qwen3_config
from .target import load_target_config, target_folder

__all__ = ["load_target", "load_qwen3", "load_dart_head", "load_target_config", "gguf_folder", "gguf_to_folder", "save_dart_head", "Qwen3Config", "DartHeadConfig", "load_qwen3_config",
           "read_head", "write_dart_head", "export_dart_head", "resolve"]
_MODULE_LOADERS = ("load_target", "load_qwen3", "load_dart_head", "save_dart_head")


def __getattr__(name):
    if name in _MODULE_LOADERS:
        return getattr(importlib.import_module("dart_jax.models.checkpoints"), name)
    raise AttributeError(f"module 'dart_jax.convert' has no attribute {name!r}")
