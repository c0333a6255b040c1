"""Read and write safetensors checkpoints as NumPy arrays (no torch).

bf16 tensors come back as ``ml_dtypes.bfloat16`` arrays; sharded checkpoints are read through
``model.safetensors.index.json``.

Int8 weights (docs/spec.md §1.1): a 2-D tensor `X` stored as int8 beside a float tensor
`X_scale` of shape [rows, 1] in the same file (one scale per output row, symmetric, as
compressed-tensors' "int-quantized" channel format stores it) reads as the float tensor q · scale in the scale's
dtype; `tensor_index` and `read_tensors` show only that float view, so a head's checks and
loaders see an ordinary float checkpoint. `quantize_rows` makes such a pair.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from dart_jax.errors import FileFormatError, InputError, MissingFileError

from .configs import json_type, read_json_object

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# the float kinds a weight may be stored in (safetensors' names); integer or bool weights are an error
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_NUMPY_FLOATS = ("float16", "bfloat16", "float32", "float64")
SCALE_SUFFIX = "_scale"  # int8 weight X + its per-row scales X_scale


def quantize_rows(array: np.ndarray, scale_dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """A 2-D float weight as (int8 values [rows, cols], scales [rows, 1] in `scale_dtype`):
    symmetric, one scale per row (its largest magnitude / 127), rounded to nearest; a row of
    zeros gets scale 1. `dequantize_rows` inverts it within half a scale step per value."""
    w = np.asarray(array, dtype=np.float32)
    if w.ndim != 2:
        raise InputError(f"int8 storage takes 2-D weights, got shape {w.shape}.")
    peak = np.max(np.abs(w), axis=1, keepdims=True)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(scale_dtype)
    q = np.clip(np.rint(w / scale.astype(np.float32)), -127, 127).astype(np.int8)
    return q, scale


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8 values [rows, cols] times per-row scales [rows, 1], in the scales' dtype."""
    return (q.astype(np.float32) * scale.astype(np.float32)).astype(scale.dtype)


def _int8_pairs(entries: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, str]:
    """weight name → its scale's name, for each int8 2-D tensor stored with a [rows, 1] float scale."""
    pairs = {}
    for name, (shape, dtype) in entries.items():
        scale = entries.get(name + SCALE_SUFFIX)
        if dtype == "I8" and len(shape) == 2 and scale is not None and scale[1] in FLOAT_DTYPES \
                and tuple(scale[0]) == (shape[0], 1):
            pairs[name] = name + SCALE_SUFFIX
    return pairs


def _index_files(index: Path, folder: Path) -> dict[str, str]:
    """The weight_map (tensor name → shard file name) of a safetensors index, checked."""
    raw = read_json_object(index, "a safetensors index (a JSON object with a 'weight_map')")
    weight_map = raw.get("weight_map")
    if not isinstance(weight_map, dict):
        raise FileFormatError(index, f"`weight_map` must be a JSON object mapping tensor names to shard files, got "
                                     f"{json_type(weight_map)}; the index is broken: download it again.")
    for name, file in weight_map.items():
        if not isinstance(file, str) or not file or Path(file).name != file or file in (".", ".."):
            raise FileFormatError(index, f"`weight_map` maps {name!r} to {json_type(file)}; expected the file name "
                                         f"of a shard in {folder}. The index is broken: download it again.")
    return weight_map


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, in a stable order."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.exists():
        files = sorted(set(_index_files(index, folder).values()))
        missing = [f for f in files if not (folder / f).exists()]
        if missing:
            raise MissingFileError(f"{index} names shard(s) that are not in {folder}: {missing}; "
                                   "download the whole checkpoint.")
        return [folder / f for f in files]
    if (folder / SINGLE_NAME).exists():
        return [folder / SINGLE_NAME]
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    if found:
        return [folder / f for f in found]
    raise MissingFileError(
        f"no weights in {folder}: expected {SINGLE_NAME} or {INDEX_NAME} with its shards "
        f"(found: {sorted(p.name for p in folder.iterdir())[:20]})."
    )


@contextlib.contextmanager
def open_safetensors(path: Path) -> Iterator:
    """`safe_open(path)` for NumPy, with an unreadable file reported as a FileFormatError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileFormatError(path, "is not a file; expected a safetensors weight file.")
    try:
        handle = safe_open(str(path), framework="numpy")
    except SafetensorError as e:
        raise FileFormatError(path, f"is not a readable safetensors file ({e}); it is truncated or corrupted: "
                                    "download it again.") from e
    with handle as fh:
        yield fh


def header_entry(fh, path: Path, name: str) -> tuple[tuple[int, ...], str]:
    """(shape, safetensors dtype name) of tensor `name` from the header alone."""
    try:
        view = fh.get_slice(name)
        return tuple(int(n) for n in view.get_shape()), str(view.get_dtype())
    except SafetensorError as e:
        raise FileFormatError(path, f"cannot read the header entry of tensor {name!r} ({e}); the file is "
                                    "corrupted: download it again.") from e


def read_tensor(fh, path: Path, name: str, *, weight: bool = True) -> np.ndarray:
    """Tensor `name` of an open file as a NumPy array. With `weight`, it must be a float tensor
    (FLOAT_DTYPES) whose values are all finite; a FileFormatError naming the tensor and the file
    otherwise."""
    try:
        array = fh.get_tensor(name)
    except (SafetensorError, TypeError, ValueError) as e:  # an unknown dtype, a tensor NumPy cannot hold
        raise FileFormatError(path, f"cannot read tensor {name!r} ({e}); the file is corrupted or stores a dtype "
                                    f"NumPy cannot hold: download it again.") from e
    if weight:
        check_weight(array, name, path)
    return array


def read_slice(fh, path: Path, name: str, index: tuple) -> np.ndarray:
    """The block `index` (a tuple of slices) of weight `name` of an open file, read from the file
    without the rest of the tensor; checked as `read_tensor` checks a weight."""
    try:
        array = np.asarray(fh.get_slice(name)[tuple(index)])
    except (SafetensorError, TypeError, ValueError) as e:
        raise FileFormatError(path, f"cannot read a slice of tensor {name!r} ({e}); the file is corrupted or stores "
                                    f"a dtype NumPy cannot hold: download it again.") from e
    check_weight(array, name, path)
    return array


def check_weight(array: np.ndarray, name: str, path: Path | str) -> None:
    """A FileFormatError naming `name` and `path` unless `array` holds floats, all finite."""
    if array.dtype.name not in _NUMPY_FLOATS:
        raise FileFormatError(path, f"tensor {name!r} has dtype {array.dtype}; a weight must be a float tensor "
                                    f"({', '.join(FLOAT_DTYPES)}). The checkpoint is broken or not a model of this kind.")
    bad = count_nonfinite(array)
    if bad:
        raise FileFormatError(path, f"tensor {name!r} holds {bad} non-finite value(s) (NaN or Inf) of {array.size}; "
                                    "the weights are corrupted (or the training that wrote them diverged). Use an "
                                    "intact checkpoint.")


def cast_weight(array: np.ndarray, dtype, name: str, path: Path | str) -> np.ndarray:
    """A (checked, finite) float weight as `dtype`; a FileFormatError naming the tensor when
    its values overflow that dtype's range."""
    with np.errstate(over="ignore"):
        cast = array.astype(dtype, copy=False)
    if cast is not array and cast.dtype != array.dtype and count_nonfinite(cast):
        raise FileFormatError(path, f"tensor {name!r} holds values beyond the range of {np.dtype(dtype).name} "
                                    f"(largest magnitude {float(np.max(np.abs(array.astype(np.float64)))):.3g}), the "
                                    "dtype it is loaded in; the checkpoint is broken.")
    return cast


def count_nonfinite(array: np.ndarray, block: int = 1 << 24) -> int:
    """How many values of a float array are NaN or ±Inf: one pass in blocks (so the scratch
    memory stays small), on the exponent bits for bfloat16 (whose NumPy ufuncs are slow)."""
    flat = array.reshape(-1)
    bad = 0
    for start in range(0, flat.size, block):
        part = flat[start:start + block]
        if part.dtype.name == "bfloat16":
            bad += int(np.count_nonzero((part.view(np.uint16) & 0x7F80) == 0x7F80))
        else:
            bad += int(part.size - np.count_nonzero(np.isfinite(part)))
    return bad


def read_tensors(folder: Path, names: Iterable[str] | None = None, *,
                 is_weight: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """All tensors (or only `names`) of a checkpoint folder as NumPy arrays. With `is_weight`,
    each tensor it names a weight must be a float tensor with finite values (`check_weight`)."""
    wanted = None if names is None else set(names)
    out: dict[str, np.ndarray] = {}
    for f in weight_files(folder):
        with open_safetensors(f) as fh:
            keys = list(fh.keys())
            pairs = _int8_pairs({key: header_entry(fh, f, key) for key in keys})
            scales = set(pairs.values())
            for key in keys:
                if key in scales or not (wanted is None or key in wanted):
                    continue
                if key in out:
                    raise FileFormatError(f, f"tensor {key!r} is stored in more than one file of {folder}.")
                if key in pairs:
                    scale = read_tensor(fh, f, pairs[key])  # a float weight: finite
                    out[key] = dequantize_rows(read_tensor(fh, f, key, weight=False), scale)
                    if is_weight is not None and is_weight(key):
                        check_weight(out[key], key, f)
                else:
                    out[key] = read_tensor(fh, f, key, weight=is_weight is not None and is_weight(key))
    return out


def write_tensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write one safetensors file (bf16 arrays as ml_dtypes.bfloat16). The library's I/O errors (a
    full disk, a folder not writable) become the OSError they are, which commands report as a user's."""
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
                  metadata=metadata or {"format": "pt"})
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from e


def tensor_index(folder: Path) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Name → (file, shape, safetensors dtype name) over all weight files of a checkpoint, read
    from the headers only. With an index file, each tensor must be in the shard it names."""
    folder = Path(folder)
    index: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    scales: set[str] = set()
    for f in weight_files(folder):
        with open_safetensors(f) as fh:
            entries = {key: header_entry(fh, f, key) for key in fh.keys()}
            pairs = _int8_pairs(entries)
            float_view = {key: entries.pop(scale)[1] for key, scale in pairs.items()}  # its scale's dtype
            scales.update(pairs.values())
            for key, (shape, dtype) in entries.items():
                if key in index:
                    raise FileFormatError(f, f"tensor {key!r} appears in both {index[key][0].name} and {f.name}; "
                                             "the checkpoint's shards overlap.")
                # an int8 weight shows as the float tensor it reads as
                index[key] = (f, shape, float_view.get(key, dtype))
    if (folder / INDEX_NAME).exists():
        for name, file in _index_files(folder / INDEX_NAME, folder).items():
            if name in scales:
                continue
            if name not in index or index[name][0].name != file:
                where = "in no shard" if name not in index else f"in {index[name][0].name}"
                raise FileFormatError(folder / INDEX_NAME, f"lists tensor {name!r} in {file}, but it is {where}; "
                                                           "the index and its shards disagree: download them again.")
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
        raise InputError(f"max_shard_size_bytes must be a positive number of bytes, got {max_shard_size_bytes}.")
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
