"""Int8 copies of draft heads (docs/spec.md §1.1): each 2-D float weight stored as int8 values
with one float32 scale per output row (`safetensors_io.quantize_rows`), everything else
(norms, d2t, t2d) as it was. About half the size of a bf16 head; loading dequantizes
transparently (`safetensors_io.read_tensors`), so the loaders and their checks are unchanged.
The demo heads ship this way to keep the package small; on an accelerator the weights are
dequantized once at load time, so drafting speed is that of the dtype the head is loaded in."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from dart_jax.errors import FileFormatError

from . import dart_head, eagle3
from .configs import read_json_object
from .files import atomic_folder, check_apart
from .safetensors_io import SCALE_SUFFIX, SINGLE_NAME, quantize_rows, write_tensors

CONFIG_NAME = "config.json"


def head_kind(folder: Path) -> str:
    """'dart' or 'eagle3': which loader a head folder is for (its config.json's architectures)."""
    raw = read_json_object(Path(folder) / CONFIG_NAME, "a draft head's config")
    names = " ".join(str(a) for a in raw.get("architectures") or [])
    if "Dart" in names or "draft_length" in raw:
        return "dart"
    if "Eagle3" in names or "eagle3" in names.lower() or "draft_vocab_size" in raw:
        return "eagle3"
    raise FileFormatError(Path(folder) / CONFIG_NAME, "is neither a DART head's nor an EAGLE-3 head's config "
                                                      "(architectures); pass a draft head folder.")


def _check(folder: Path, kind: str) -> dict[str, np.ndarray]:
    """The head's tensors (float view), checked as its loader checks them."""
    return (dart_head.read_head if kind == "dart" else eagle3.read_eagle3)(folder)[2]


def write_int8_head(src: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Write an int8 copy of the draft head folder `src` (DART or EAGLE-3) into `dest`; both are
    checked as their loader checks them. Returns `dest`."""
    src = Path(os.path.expanduser(str(src)))
    check_apart(dest, [("head", src)], "int8 head folder")
    kind = head_kind(src)
    tensors = {}
    for name, array in _check(src, kind).items():
        if array.ndim == 2 and array.dtype.name in ("float16", "bfloat16", "float32", "float64"):
            tensors[name], tensors[name + SCALE_SUFFIX] = quantize_rows(array)
        else:
            tensors[name] = np.asarray(array)
    config = read_json_object(src / CONFIG_NAME, "a draft head's config")
    with atomic_folder(dest, (CONFIG_NAME, SINGLE_NAME), what="int8 head folder") as tmp:
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        write_tensors(tmp / SINGLE_NAME, tensors)
        _check(tmp, kind)
    return Path(dest)
