"""Programs kept exported beside the persistent compilation cache, so that a new process skips
Python's tracing and lowering of the decoding programs.

JAX's persistent cache keeps what XLA compiled, but a new process still traces each program from
Python and lowers it to StableHLO before it can look the executable up: seconds per program for a
model's prefill and steps. `jit` jits a program so that the first time it is traced for a
signature, in any process, it is exported (`jax.export`: its StableHLO, serialized) into the
store, and every later trace, in this process or another, reads it back and calls it
(as `Exported.call` does, `_call_p`) instead of tracing the model: one primitive to trace, a module to parse.

The key of a stored program covers everything that shapes it: the function (module and name),
a hash of the sources of dart_jax and dart_jax.ngram (an edited checkout never reads an old
program), the ModelDef (the module's GraphDef and state structure), every static argument, the
argument structure and avals (shape, dtype, weak type, sharding), the jit options (donation,
XLA compiler options and the rest), the versions of jax, jaxlib, flax and the serialization, the
backend and its device kind, and the JAX settings that change a trace (x64, matmul precision,
PRNG, partitioner, dtype promotion). A program whose key cannot be told from its arguments is
traced as before and not stored: one whose function or static argument (a drafter class, a
`TreeEdit`) is defined outside dart_jax, whose source the hash does not cover, or is a value with
no stable text. So is a program over a Mesh (an argument sharded over several devices: an exported program holds its
device count and shardings), and one that `jax.export` refuses (e.g. a custom call without a
compatibility guarantee).

The file holds what `Exported.serialize` writes (the StableHLO, the avals and the argument and
output structures), after a header of this project's and a checksum. The output structure is JAX's
serialization of it: tuples, lists, dicts, None and the node types `_NODES` registers (the pool's
state, the caches, the sampling parameters), each under its name, with static fields of plain
values written as JSON; reading a file constructs only those. A program whose output holds
anything else is traced in every process.

The store is the folder `exported/` inside the persistent compilation cache's folder (JAX reads
only its own `*-cache` files there), on wherever that cache is on, off with it: the one opt-out is
JAX's switch (`JAX_ENABLE_COMPILATION_CACHE=false`, the command lines' `--no-compile-cache`).
Each file is written atomically (`dart_jax.files.atomic_path`): one without the header, or whose
checksum or contents do not hold, is treated as absent and written again. A stored program
is always called as read back from its bytes, also by the process that exported it, so that both
lower the same module and JAX's persistent cache finds the executable the first one compiled.

It is called through two of JAX's private functions (`_call_p` says why); a JAX without them
keeps the store off (one line in the log of `dart_jax.decoding.exported`) and traces as before.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import warnings
from pathlib import Path
from typing import Callable

import jax
import jax.extend.core
import jaxlib
from jax.interpreters import mlir

try:  # a JAX that moved it keeps the store off (`_call_primitive`)
    from jax._src.export import _export as _private
except ImportError:
    _private = None

import dart_jax
import dart_jax.ngram
from dart_jax.errors import parse_json
from dart_jax.files import atomic_path
from dart_jax.models.head import HeadCache
from dart_jax.models.qwen3 import KVCache

from .sampling import SamplingParams
from .state import PoolState

FOLDER = "exported"
_SUFFIX = ".jaxexp"
# each file: this header, the sha256 of the rest, then the bytes of `Exported.serialize`
_HEADER = b"dart_jax exported program 1\n"
_CHECK = hashlib.sha256().digest_size
log = logging.getLogger(__name__)


def _call_primitive(private):
    """The primitive that calls an exported program inside a trace, made of two functions of
    `private` (JAX's private module of `jax.export`), or None where it lacks them (the store is
    then off).

    JAX's own call of an exported program (`Exported.call`) makes every output of the jitted
    function committed to its device (pxla counts the call's output memory spaces as transfers),
    where the traced program leaves outputs made from uncommitted inputs uncommitted; fed back,
    they would compile every program a second time for their new placement (and the server's
    warm-up would miss it). The same abstract evaluation and lowering under a primitive of its own
    leave them as the traced program does."""
    names = ("_call_exported_abstract_eval", "_call_exported_lowering")
    missing = [name for name in names if not callable(getattr(private, name, None))]
    if missing:
        log.info("exported programs are not kept: JAX %s lacks %s (jax._src.export._export), which calls them; "
                 "every process traces its programs", jax.__version__, " and ".join(missing))
        return None
    call = jax.extend.core.Primitive("dart_jax_exported_call")
    call.multiple_results = True
    call.def_effectful_abstract_eval(getattr(private, names[0]))
    mlir.register_lowering(call, getattr(private, names[1]))
    return call


_call_p = _call_primitive(_private)


# The node types of ours a program's output may hold, registered with JAX's serialization under
# their names: a stored output structure names only these (and JAX's own tuples, lists, dicts and
# None), so reading one constructs nothing else. Their static fields (SamplingParams.all_greedy)
# are written as a JSON list of plain values.
_NODES = (PoolState, SamplingParams, KVCache, HeadCache)
_PLAIN = (type(None), bool, int, float, str)


def _static_bytes(aux) -> bytes:
    if not (isinstance(aux, tuple) and all(isinstance(value, _PLAIN) for value in aux)):
        raise ValueError(f"a static field of no plain value ({aux!r}) is not stored")
    return json.dumps(list(aux)).encode()


def _static_values(data: bytes) -> tuple:
    values = parse_json(data, "a stored program's output structure", "a JSON list of plain values")
    if not (isinstance(values, list) and all(isinstance(value, _PLAIN) for value in values)):
        raise ValueError("a stored program's static fields are not a list of plain values")
    return tuple(values)


for _node in _NODES:
    jax.export.register_pytree_node_serialization(_node, serialized_name=f"{_node.__module__}.{_node.__qualname__}",
                                                  serialize_auxdata=_static_bytes,
                                                  deserialize_auxdata=_static_values)


class _Unkeyed(Exception):
    """A value that says nothing stable about the program it shapes (module docstring)."""


def folder() -> Path | None:
    """The store's folder, None while the persistent compilation cache is off."""
    cache = jax.config.jax_compilation_cache_dir
    return Path(cache) / FOLDER if cache and jax.config.jax_enable_compilation_cache else None


def source_hash(packages) -> str:
    """sha256 of the Python sources of `packages`, (name, folder) pairs: every file's path and bytes."""
    digest = hashlib.sha256()
    for name, root in packages:
        root = Path(root)
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _sources() -> str:
    """The hash of dart_jax's and dart_jax.ngram's sources (the code that builds programs), once a process."""
    return source_hash([(package.__name__, Path(package.__file__).parent) for package in (dart_jax, dart_jax.ngram)])


# the JAX settings that change what a trace gives (its dtypes, precisions, random bits, shardings)
_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl", "jax_threefry_partitionable",
             "jax_use_shardy_partitioner", "jax_numpy_dtype_promotion")


@functools.cache
def _versions() -> str:
    device = jax.devices()[0]
    return repr((jax.__version__, jaxlib.__version__, importlib.metadata.version("flax"),
                 jax.export.maximum_supported_calling_convention_version, device.platform, device.device_kind))


def _named(obj) -> str:
    """A function's or class's module and name: only dart_jax's own, whose source `_sources` covers."""
    module, name = getattr(obj, "__module__", None) or "", getattr(obj, "__qualname__", "")
    if not (module == "dart_jax" or module.startswith("dart_jax.")) or "<" in name:
        raise _Unkeyed
    return f"{module}:{name}"


def _token(value) -> str:
    """Stable text of a static value (same value, same text, in every process)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{_named(type(value))}.{value.name}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({','.join(map(_token, value))})"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_token(k)}:{_token(v)}" for k, v in sorted(value.items(), key=repr)) + "}"
    if isinstance(value, type) or inspect.isfunction(value):
        return _named(value)
    if dataclasses.is_dataclass(value):
        fields = ",".join(f"{f.name}={_token(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{_named(type(value))}({fields})"
    raise _Unkeyed


@functools.lru_cache(maxsize=16)
def _model_token(model) -> str:
    """A ModelDef's GraphDef and state structure, in words (flax's and JAX's reprs: no addresses)."""
    text = repr(model.graph) + str(model.tree)
    if " at 0x" in text:
        raise _Unkeyed
    return hashlib.sha256(text.encode()).hexdigest()


def _key(fn, model, static: tuple, named_static: dict, leaves, in_tree, jit_kwargs: dict) -> str:
    avals = [(str(leaf.aval), repr(leaf.aval.sharding.spec)) for leaf in leaves]
    settings = [str(getattr(jax.config, name)) for name in _SETTINGS]
    text = repr((_versions(), settings, _sources(), _named(fn), _model_token(model), _token(static),
                 _token(named_static), str(in_tree), avals, _token(jit_kwargs)))
    return hashlib.sha256(text.encode()).hexdigest()


def _read(path: Path):
    """The Exported stored at `path`, or None: absent, of another format, damaged or unreadable."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    body = data[len(_HEADER) + _CHECK:]
    if not data.startswith(_HEADER) or hashlib.sha256(body).digest() != data[len(_HEADER):len(_HEADER) + _CHECK]:
        return None
    try:
        return jax.export.deserialize(bytearray(body))
    except Exception:  # whatever a damaged file makes JAX's reader raise: absent, written again
        return None


def _write(path: Path, blob: bytes) -> None:
    """Store a program (best effort: a folder that cannot be written costs the next process a trace)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(str(path)) as scratch:
            Path(scratch).write_bytes(_HEADER + hashlib.sha256(blob).digest() + blob)
    except OSError as e:
        warnings.warn(f"exported program not kept in {path.parent} ({e.strerror or e}): the next process traces it "
                      "again. Make the compilation cache's folder writable, or turn the cache off with "
                      "JAX_ENABLE_COMPILATION_CACHE=false.", stacklevel=3)


def jit(fn: Callable, model, static: tuple = (), **jit_kwargs):
    """`jax.jit(functools.partial(fn, model, *static), **jit_kwargs)`, its traces read from the store
    and written to it (module docstring). The jitted function keeps the bound function's name,
    signature, donation and options: JAX's caches, compile counters and `lower` see the same program."""
    bound = functools.partial(fn, model, *static)
    signature = inspect.signature(bound)
    named = jit_kwargs.get("static_argnames") or ()
    statics = {named} if isinstance(named, str) else set(named)

    def program(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        named_static = {k: v for k, v in arguments.items() if k in statics}
        dynamic = {k: v for k, v in arguments.items() if k not in statics}
        leaves, in_tree = jax.tree.flatten(dynamic)
        where = folder() if _call_p is not None else None
        # a Python value among the traced arguments (a function of **kwargs), or an array on a Mesh: traced as before
        if where is None or not all(hasattr(leaf, "aval") and leaf.aval.sharding.mesh.empty for leaf in leaves):
            return bound(*args, **kwargs)
        try:
            path = where / (_key(fn, model, static, named_static, leaves, in_tree, jit_kwargs) + _SUFFIX)
        except _Unkeyed:
            return bound(*args, **kwargs)
        found = _read(path)
        if found is None:
            found = _export(bound, signature, named_static, leaves, in_tree, path)
        if found is None:
            return bound(*args, **kwargs)
        return found.out_tree.unflatten(_call_p.bind(*leaves, exported=found))

    functools.update_wrapper(program, fn)
    # the signature JAX reads argument names (static, donated) from; `__wrapped__` stays `fn`, whose
    # code JAX names the program's source by (through the partial it would print the whole model)
    program.__signature__ = signature
    return jax.jit(program, **jit_kwargs)


def _export(bound, signature, named_static: dict, leaves, in_tree, path: Path):
    """Trace `bound` for these arguments, export and store it: the Exported read back from its
    bytes, or None where `jax.export` refuses it or its output holds a node type `_NODES` does not
    name (the caller traces it as before)."""
    traced = []

    def flat(*flat_leaves):  # arrays in: an exported signature holds no Python classes of the inputs
        dynamic = jax.tree.unflatten(in_tree, flat_leaves)
        call = signature.bind_partial(**dynamic, **named_static)
        out = bound(*call.args, **call.kwargs)
        traced.append(True)
        return out

    flat.__name__ = flat.__qualname__ = bound.func.__name__
    specs = [jax.ShapeDtypeStruct(leaf.aval.shape, leaf.aval.dtype, weak_type=leaf.aval.weak_type)
             for leaf in leaves]
    try:
        blob = jax.export.export(jax.jit(flat))(*specs).serialize()
    except (ValueError, NotImplementedError, TypeError) as e:
        if not traced:  # the function's own error, raised again by the caller's trace
            return None
        warnings.warn(f"{bound.func.__name__} is traced in every process: jax.export refused it ({e})", stacklevel=4)
        return None
    _write(path, blob)
    return jax.export.deserialize(blob)
