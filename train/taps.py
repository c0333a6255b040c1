"""The target's taps computed once: a cache of its frozen forward over every training sequence.

The head reads the target only through its three taps and its final hidden state (the teacher's
logits are that state times the LM head's draft-vocabulary rows); neither depends on the head,
so a first pass stores them (`train.loop.target_states`, [T, 3H+H] per sequence) and every epoch
reads them instead of running the target (`--taps cache`). Layout of the cache folder:

  manifest.json       version, dtype, row width, the target's identity, the data's sha256, and the
                      shards: samples [first, first + count), their tokens, and the sha256 of a
                      finished shard (null until it is written)
  shard-00000.bin     the rows of its samples one after the other, raw little-endian in `dtype`,
                      read through a memory map

A shard is written under a scratch name and renamed when complete (`dart_jax.files.atomic_path`),
then the manifest records its checksum (also atomically), so a run killed at any moment (kill -9)
leaves finished shards, at most one shard file not yet recorded (recomputed: it cannot be
checked) and a scratch file the next run removes. Opening a cache checks every finished shard's
size and sha256: a damaged one is rebuilt, the others are reused. A manifest of another target,
other data, dtype or shard plan is not reused: its shards are deleted and the cache rebuilt.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from dart_jax.errors import FileFormatError, InputError, ResourceError, read_json
from dart_jax.files import PREFIX, atomic_path, file_sha256

from .data import Dataset, pad_length
from .loop import target_states

VERSION = 1
MANIFEST = "manifest.json"
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
MODES = ("auto", "cache", "online")
_SHARD = re.compile(r"shard-\d{5}\.bin")
# the share of the free disk space a cache may take when --taps auto decides
AUTO_DISK_SHARE = 0.5


def state_width(target_config) -> int:
    """Values per token: the three taps and the final hidden state."""
    return 4 * target_config.hidden_size


def cache_bytes(data: Dataset, width: int, dtype: str) -> int:
    return sum(len(x) for x in data.ids) * width * np.dtype(DTYPES[dtype]).itemsize


def target_identity(target, base: str) -> dict:
    """What the taps depend on: the base as named, the compute dtype, the config, and a sha256 of a
    strided sample of every weight (a few thousand values each, read from the devices), so a cache
    made from other weights under the same name is not reused."""
    digest = hashlib.sha256()
    for path, leaf in sorted(nnx.to_flat_state(nnx.state(target, nnx.Param)), key=lambda kv: str(kv[0])):
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        flat = value.reshape(-1)
        sample = np.asarray(flat[::max(1, flat.size // 4096)], np.float32)
        digest.update(str(path).encode() + sample.tobytes())
    config = target.config
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else vars(config)
    return {"base": str(base), "dtype": str(np.dtype(target.dtype)), "weights_sha256": digest.hexdigest(),
            "config": json.loads(json.dumps(fields, default=str))}


def plan_shards(data: Dataset, row_bytes: int, shard_bytes: int) -> list[dict]:
    """Consecutive samples grouped into shards of at most `shard_bytes` (at least one sample each)."""
    shards, first, tokens = [], 0, 0
    for i, x in enumerate(data.ids):
        if i > first and (tokens + len(x)) * row_bytes > shard_bytes:
            shards.append({"first": first, "count": i - first, "tokens": tokens})
            first, tokens = i, 0
        tokens += len(x)
    shards.append({"first": first, "count": len(data) - first, "tokens": tokens})
    for n, shard in enumerate(shards):
        shard["file"] = f"shard-{n:05d}.bin"
    return shards


def choose_mode(mode: str, data: Dataset, width: int, dtype: str, folder: Path, epochs: int) -> tuple[str, str]:
    """(the mode to run, why): `auto` caches when there is more than one epoch, one process, and
    the cache takes at most AUTO_DISK_SHARE of the free space of the disk it goes to."""
    need = cache_bytes(data, width, dtype)
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    size = f"{need / 2**30:.2f} GiB of taps ({dtype}), {free / 2**30:.1f} GiB free"
    if mode == "online":
        return "online", "--taps online"
    if jax.process_count() > 1:
        if mode == "cache":
            raise InputError("--taps cache runs in one process; pass --taps online for a run over several processes.")
        return "online", "several processes: the target runs every step (--taps online)"
    if mode == "cache":
        if need > free:
            raise ResourceError(f"--taps cache needs {size} at {folder}; free space there, pass another "
                                "--taps-dir, --taps-dtype bfloat16, or --taps online.")
        return "cache", f"--taps cache: {size}"
    if epochs < 2:
        return "online", "one epoch: a cache would be read only once (--taps cache to build it anyway)"
    if need > AUTO_DISK_SHARE * free:
        return "online", f"the cache would not fit comfortably ({size}); the target runs every step"
    return "cache", f"caching the target's taps: {size}"


class TapsCache:
    """A finished cache: its shards memory-mapped, rows fetched per sample and returned in
    `out_dtype` (default the stored dtype). Rows are widened on the host, not in the jitted step:
    XLA:CPU moves a bfloat16 → float32 conversion into the head's matmuls, which then run in
    bfloat16, its slow path."""

    def __init__(self, folder: Path, manifest: dict, out_dtype=None):
        self.folder, self.manifest = folder, manifest
        self.width, self.dtype = manifest["width"], DTYPES[manifest["dtype"]]
        self.out_dtype = np.dtype(out_dtype or self.dtype)
        self.maps, self.where = [], {}
        for n, shard in enumerate(manifest["shards"]):
            rows = np.memmap(folder / shard["file"], dtype=np.uint16 if self.dtype is ml_dtypes.bfloat16 else self.dtype,
                             mode="r", shape=(shard["tokens"], self.width))
            self.maps.append(rows.view(self.dtype) if self.dtype is ml_dtypes.bfloat16 else rows)
            offset = 0
            for i, length in zip(range(shard["first"], shard["first"] + shard["count"]), shard["lengths"]):
                self.where[i] = (n, offset, length)
                offset += length

    def states(self, samples: np.ndarray, batch_size: int, t: int) -> np.ndarray:
        """[batch_size, t, width] in `out_dtype`: the rows of `samples` (row order), zeros past each
        sample's end and in rows beyond len(samples) (positions the loss never reads)."""
        out = np.zeros((batch_size, t, self.width), self.out_dtype)
        for row, i in enumerate(samples):
            n, offset, length = self.where[int(i)]
            out[row, :length] = self.maps[n][offset:offset + length]
        return out


def _check_folder(folder: Path) -> None:
    """Refuse a folder holding files the cache does not own (it deletes stale shards)."""
    foreign = sorted(p.name for p in folder.iterdir()
                     if p.name != MANIFEST and not _SHARD.fullmatch(p.name) and not p.name.startswith(PREFIX))
    if foreign:
        raise InputError(f"--taps-dir {folder} holds other files ({', '.join(foreign[:5])}); the cache deletes "
                         "what it does not reuse, so pass an empty folder or one made by the trainer.")


def _write_json(path: Path, obj) -> None:
    with atomic_path(str(path)) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=1) + "\n")


def _manifest_shaped(manifest) -> bool:
    """Whether a parsed manifest has the shape `build_cache` writes (an object whose shards are a
    list of objects), so that comparing it with a plan cannot fail; its values are compared there."""
    return (isinstance(manifest, dict) and isinstance(manifest.get("shards", []), list)
            and all(isinstance(shard, dict) for shard in manifest.get("shards", [])))


def _reusable(folder: Path, plan: dict, log: Callable[[str], None]) -> dict[str, str]:
    """{shard file: sha256} of the finished shards a previous pass left that this one can keep."""
    if not (folder / MANIFEST).exists():
        return {}
    try:
        old = read_json(folder / MANIFEST, "a taps cache manifest")
    except FileFormatError as e:
        old, damage = None, str(e)
    else:
        damage = None if _manifest_shaped(old) else f"{folder / MANIFEST}: not a taps cache manifest (wrong shape)"
    header = {k: v for k, v in plan.items() if k != "shards"}
    keep = {}
    if damage is not None:
        log(f"taps: {damage.splitlines()[0][:300]}; rebuilding the cache")
    elif {k: old.get(k) for k in header} == header and [{k: v for k, v in s.items() if k != "sha256"}
                                                        for s in old["shards"]] == plan["shards"]:
        for shard in old["shards"]:
            path = folder / shard["file"]
            if shard.get("sha256") is None:
                continue
            if not path.is_file() or path.stat().st_size != shard["tokens"] * plan["row_bytes"]:
                log(f"taps: {shard['file']} is missing or has the wrong size; rebuilding it")
            elif file_sha256(path) != shard["sha256"]:
                log(f"taps: {shard['file']} fails its sha256 checksum (damaged); rebuilding it")
            else:
                keep[shard["file"]] = shard["sha256"]
    else:
        changed = [k for k in header if old.get(k) != header[k]] or ["the shard plan"]
        log(f"taps: the cache in {folder} was made with other {', '.join(changed)}; rebuilding it")
    for path in folder.iterdir():
        if _SHARD.fullmatch(path.name) and path.name not in keep:
            path.unlink()
    return keep


def build_cache(folder: Path, data: Dataset, target, identity: dict, *, dtype: str, batch_size: int, max_length: int,
                mesh: Mesh, pad_id: int, shard_bytes: int, progress: bool = True,
                log: Callable[[str], None] = print) -> TapsCache:
    """Compute the taps of every sample (batches of `batch_size` consecutive samples, padded like
    the training batches) into `folder`, reusing the finished shards of an interrupted or earlier
    pass with the same plan; returns the finished cache, its rows read in the target's dtype."""
    folder.mkdir(parents=True, exist_ok=True)
    _check_folder(folder)
    width = state_width(target.config)
    row_bytes = width * np.dtype(DTYPES[dtype]).itemsize
    shards = plan_shards(data, row_bytes, shard_bytes)
    for shard in shards:
        shard["lengths"] = [len(data.ids[i]) for i in range(shard["first"], shard["first"] + shard["count"])]
    plan = {"version": VERSION, "dtype": dtype, "width": width, "row_bytes": row_bytes, "target": identity,
            "data_sha256": data.digest(), "shards": shards}
    done = _reusable(folder, plan, log)
    manifest = {**plan, "shards": [{**s, "sha256": done.get(s["file"])} for s in shards]}
    _write_json(folder / MANIFEST, manifest)
    todo = [s for s in manifest["shards"] if s["sha256"] is None]
    if len(todo) < len(shards):
        log(f"taps: reusing {len(shards) - len(todo)} of {len(shards)} finished shards in {folder}")
    graph, state = nnx.split(target)
    forward = jax.jit(lambda state, ids: target_states(nnx.merge(graph, state), ids, jnp.dtype(DTYPES[dtype])))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    bar = tqdm(total=sum(s["tokens"] for s in todo), desc="taps", unit="tok", disable=not progress)
    for shard in todo:
        digest = hashlib.sha256()
        with atomic_path(str(folder / shard["file"])) as tmp, open(tmp, "wb") as f:
            for start in range(shard["first"], shard["first"] + shard["count"], batch_size):
                samples = range(start, min(start + batch_size, shard["first"] + shard["count"]))
                t = pad_length(max(len(data.ids[i]) for i in samples), max_length)
                ids = np.full((batch_size, t), pad_id, np.int32)
                for row, i in enumerate(samples):
                    ids[row, :len(data.ids[i])] = data.ids[i]
                states = np.asarray(forward(state, jax.device_put(ids, sharding)))
                for row, i in enumerate(samples):
                    block = np.ascontiguousarray(states[row, :len(data.ids[i])]).tobytes()
                    digest.update(block)
                    f.write(block)
                    bar.update(len(data.ids[i]))
        shard["sha256"] = digest.hexdigest()
        _write_json(folder / MANIFEST, manifest)
    bar.close()
    return TapsCache(folder, manifest, np.dtype(target.dtype))
