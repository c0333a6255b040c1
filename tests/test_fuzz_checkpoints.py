"""Fuzzing the checkpoint loaders: a clear error or the right model, never anything else.

Random truncations and byte flips of small safetensors files, and random values (wrong types,
out of range, missing) for config.json fields of a tiny Qwen3 base and DART head. Property:
`load_qwen3` / `load_dart_head` either raise one of the project's user errors (a ValueError or
FileNotFoundError subclass from dart_jax.errors) whose message names the file, or return a model
that is right: its weights equal what an independent reading of the (mutated) file gives, its
config what docs/spec.md and transformers' defaults say the mutated values mean, and its logits
equal those of the unmodified checkpoint whenever the change was harmless. Any other exception
fails the test, and so does a load that takes longer than the deadline.

The oracles are written here from the file-format and config specifications, not taken from
the code under test: a small safetensors reader (header length, JSON header, dtype table,
offsets that tile the data) and a table of what each config value must give.

The default run is short (`FAST`); `pytest -m slow` runs the same properties with many more
examples.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_jax.bench.tiny import make_tiny_head, make_tiny_qwen3
from dart_jax.convert.configs import freeze
from dart_jax.convert.dart_head import tensor_table as head_table
from dart_jax.convert.qwen3 import tensor_table as qwen3_table
from dart_jax.errors import FileFormatError, InputError, MissingFileError
from dart_jax.models.checkpoints import load_dart_head, load_qwen3

SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)
HEAD_SIZES = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48)
COMMON = dict(database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST = settings(max_examples=20, deadline=30000, derandomize=True, **COMMON)
SLOW = settings(max_examples=2000, deadline=20000, **COMMON)
USER_ERRORS = (InputError, FileFormatError, MissingFileError)
ABSENT = "<absent>"


# ---------------------------------------------------------------- the checkpoints and their originals
class Tiny:
    """The unmodified base and head, loaded once, with their logits."""

    def __init__(self, root: Path):
        self.base = make_tiny_qwen3(root / "base", **SIZES, seed=21)
        self.head = make_tiny_head(root / "head", self.base, draft_vocab_size=40, draft_length=3, seed=22,
                                   **HEAD_SIZES)
        self.base_config = json.loads((self.base / "config.json").read_text())
        self.head_config = json.loads((self.head / "config.json").read_text())
        self.target = load_qwen3(self.base, dtype=jnp.float32)
        self.head_module = load_dart_head(self.head, self.target, dtype=jnp.float32)
        self.base_graph, base_state = nnx.split(self.target)
        self.head_graph, head_state = nnx.split(self.head_module)
        self.ids = jnp.asarray(np.random.default_rng(0).integers(0, 64, (1, 7)), jnp.int32)
        self.taps = jnp.asarray(np.random.default_rng(1).standard_normal((1, 7, 96)), jnp.float32)
        self.base_logits = self.base_forward(base_state)
        self.head_logits = self.head_forward(head_state)
        self.base_tensors = parse_safetensors((self.base / "model.safetensors").read_bytes())
        self.head_tensors = parse_safetensors((self.head / "model.safetensors").read_bytes())

    def base_forward(self, state):
        """Logits of the original architecture with these weights."""
        return np.asarray(_base_fn(self.base_graph)(state, self.ids))

    def head_forward(self, state):
        return np.asarray(_head_fn(self.head_graph)(state, self.taps, self.ids))


_JITS: dict = {}


def _base_fn(graph):
    if ("base", graph) not in _JITS:
        _JITS[("base", graph)] = jax.jit(lambda state, ids: nnx.merge(graph, state)(ids))
    return _JITS[("base", graph)]


def _head_fn(graph):
    if ("head", graph) not in _JITS:
        _JITS[("head", graph)] = jax.jit(lambda state, taps, ids: nnx.merge(graph, state)(taps, ids))
    return _JITS[("head", graph)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Tiny(tmp_path_factory.mktemp("fuzz"))


# ---------------------------------------------------------------- an independent safetensors reader
class Invalid(Exception):
    """The bytes are not a valid safetensors file by the format's specification."""


_DTYPES = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
           "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
           "U64": np.uint64, "BOOL": np.bool_}


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise Invalid("duplicate key")
    return dict(pairs)


def parse_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """name → array of a safetensors file: an 8-byte little-endian header length, a UTF-8 JSON
    object (optional string-to-string `__metadata__`; per tensor exactly dtype, shape,
    data_offsets), then the data, which the tensors' byte ranges tile exactly."""
    if len(data) < 8:
        raise Invalid("no header length")
    n = int.from_bytes(data[:8], "little")
    if n < 2 or 8 + n > len(data):
        raise Invalid("header length")
    try:
        text = data[8:8 + n].decode("utf-8")
        if not text.startswith("{"):
            raise Invalid("header start")
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise Invalid(str(e)) from e
    if not isinstance(header, dict):
        raise Invalid("header type")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise Invalid("metadata")
    buffer = data[8 + n:]
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise Invalid("entry")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _DTYPES or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
            raise Invalid("entry fields")
        if not all(type(d) is int and d >= 0 for d in shape + offsets):
            raise Invalid("entry numbers")
        begin, end = offsets
        if end < begin or end - begin != math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize:
            raise Invalid("size")
        spans.append((begin, end, name, dtype, shape))
    spans.sort()
    position = 0
    for begin, end, *_ in spans:
        if begin != position:
            raise Invalid("gap or overlap")
        position = end
    if position != len(buffer):
        raise Invalid("data not covered")
    return {name: np.frombuffer(buffer[b:e], _DTYPES[dtype]).reshape(shape) for b, e, name, dtype, shape in spans}


def _is_float(array: np.ndarray) -> bool:
    return array.dtype in (np.float16, np.float32, np.float64) or array.dtype == ml_dtypes.bfloat16


def _finite(array: np.ndarray) -> bool:
    return bool(np.isfinite(array.astype(np.float64)).all())


def _expected_weights(parsed: dict[str, np.ndarray] | None, original: dict[str, np.ndarray],
                      buffers: tuple[str, ...] = ()) -> str:
    """'error' or 'load' for weights `parsed` from a mutated file (None: not a valid file):
    names, shapes must be the original's; weights floats, finite (also as float32); buffers
    (the head's d2t/t2d) unchanged, since any change to them breaks the one-to-one mapping."""
    if parsed is None or set(parsed) != set(original):
        return "error"
    for name, array in parsed.items():
        if array.shape != original[name].shape:
            return "error"
        if name in buffers:  # the same values, as integers (d2t) or booleans (t2d; 0/1 integers too)
            kinds = "iu" if name == "d2t" else "biu"
            if array.dtype.kind not in kinds or not np.array_equal(array, original[name]):
                return "error"
            if array.dtype.kind == "b" and array.view(np.uint8).max(initial=0) > 1:  # a bool byte not 0/1
                return "error"
        elif not _is_float(array) or not _finite(array) or not _finite(array.astype(np.float32)):
            return "error"
    return "load"


# ---------------------------------------------------------------- running a load
def _user_error(error: BaseException, file: Path) -> None:
    """A user error of the project naming `file` (or its folder); anything else is re-raised."""
    if not isinstance(error, USER_ERRORS) or not isinstance(error, (ValueError, FileNotFoundError)):
        raise error
    message = str(error)
    assert str(file) in message or str(file.parent) in message, message


def _variable(module, path):
    obj = module
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    return np.asarray(obj[...])


def _check_weights(module, table, parsed):
    for name, (path, _, transpose) in table.items():
        want = parsed[name]
        if name == "d2t":
            want = want.astype(np.int32)
        elif name != "t2d":
            want = want.astype(np.float32)
        np.testing.assert_array_equal(_variable(module, path), want.T if transpose else want, err_msg=name)


def _mutate_bytes(data: bytes, draw) -> bytes:
    """A truncation, a few random byte flips (anywhere, or in the header), or a NaN/±Inf float32
    written over an aligned value of the data (random flips rarely make one)."""
    kind = draw(st.sampled_from(["truncate", "flip", "flip header", "flip", "non-finite"]))
    if kind == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    header = 8 + int.from_bytes(data[:8], "little")
    if kind == "non-finite":
        at = header + 4 * draw(st.integers(0, (len(data) - header) // 4 - 1))
        value = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        return data[:at] + np.float32(value).tobytes() + data[at + 4:]
    hi = header - 1 if kind == "flip header" else len(data) - 1
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        out[draw(st.integers(0, hi))] ^= draw(st.integers(1, 255))
    return bytes(out)


def _safetensors_property(tiny: Tiny, data, which: str) -> None:
    src = tiny.base if which == "base" else tiny.head
    original = tiny.base_tensors if which == "base" else tiny.head_tensors
    mutated = _mutate_bytes((src / "model.safetensors").read_bytes(), data.draw)
    try:
        parsed = parse_safetensors(mutated)
    except Invalid:
        parsed = None
    expected = _expected_weights(parsed, original, ("d2t", "t2d") if which == "head" else ())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / which
        shutil.copytree(src, folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(mutated)
        try:
            if which == "base":
                module = load_qwen3(folder, dtype=jnp.float32)
            else:
                module = load_dart_head(folder, tiny.target, dtype=jnp.float32)
        except Exception as error:  # noqa: BLE001 - sorted by _user_error
            _user_error(error, weights)
            assert expected == "error", f"a valid mutation was refused: {error}"
            return
    assert expected == "load", "a broken file loaded"
    table = qwen3_table(module.config) if which == "base" else head_table(module.config)
    _check_weights(module, table, parsed)
    if all(parsed[n].tobytes() == original[n].tobytes() for n in original):  # harmless: the same values
        state = nnx.split(module)[1]
        logits = tiny.base_forward(state) if which == "base" else tiny.head_forward(state)
        np.testing.assert_array_equal(logits, tiny.base_logits if which == "base" else tiny.head_logits)


@FAST
@given(data=st.data())
def test_fuzz_base_safetensors(tiny, data):
    _safetensors_property(tiny, data, "base")


@FAST
@given(data=st.data())
def test_fuzz_head_safetensors(tiny, data):
    _safetensors_property(tiny, data, "head")


# ---------------------------------------------------------------- config values
def _number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _positive(v: Any) -> bool:
    return _number(v) and v > 0


def _rope_theta_ok(v: Any, head_dim: int = 16) -> bool:
    """A RoPE base whose frequencies theta^(-2j/D), j < D/2, are finite in float32 (docs/spec.md §2-§3)."""
    if not _positive(v):
        return False
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(float(v) ** (-(head_dim - 2) / head_dim))))


def _int_in(v: Any, low: int, high: int = 2**31 - 1) -> bool:
    return type(v) is int and low <= v <= high


def _absent(v: Any) -> bool:
    return v is ABSENT


VALUES = st.one_of(
    st.just(ABSENT), st.none(), st.booleans(),
    st.integers(-3, 70), st.sampled_from([0, 1, 2, 3, 16, 32, 40, 48, 64, 2048, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-6, 1e-5, 10000.0, 1.0, 16.0, 64.0, -1.0, 0.0]),
    st.sampled_from(["", "64", "16", "silu", "swish", "gelu", "qwen3", "llama", "default", "linear", "yarn",
                     "full_attention", "1e-6", "true", "null"]),
    st.lists(st.integers(-1, 70), max_size=3),
    st.lists(st.sampled_from(["full_attention", "sliding_attention"]), max_size=4),
    st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "rope_theta"]),
                    st.one_of(st.none(), st.sampled_from(["default", "linear", "yarn", "dynamic", "llama3", "mrope"]),
                              st.floats(-1, 1e5), st.integers(-1, 3)), max_size=3),
)

# rope_scaling dicts whose meaning the spec fixes (docs/spec.md §1-§3), with the frozen value the
# loader must keep (None: an error)
BASE_SCALINGS = [
    ({"type": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),
    ({"rope_type": "linear"}, None),
    ({"rope_type": "linear", "factor": 0}, None),
    ({"rope_type": "yarn", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}),
    ({"rope_type": "yarn"}, {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048}),
    ({"rope_type": "dynamic", "factor": 2.0}, None),
    ({"rope_type": "llama3", "factor": 8.0}, None),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 2048}),
    ({"rope_type": "default", "factor": "x"}, "default"),
    ({}, "default"),
]
HEAD_SCALINGS = [
    ({"type": "linear", "factor": 2.0}, {"type": "linear", "factor": 2.0}),
    ({"type": "linear"}, None),
    ({"rope_type": "dynamic", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}),
    ({"rope_type": "dynamic", "factor": 0}, None),
    ({"rope_type": "yarn", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0}),
    ({"rope_type": "llama3", "factor": 8.0}, {"rope_type": "llama3", "factor": 8.0}),
    ({"type": "mrope"}, None),
    ({}, "default"),
]


def _expected_base(key: str, v: Any) -> dict | None:
    """What setting config.json's `key` (a dotted path into rope_parameters) to `v` must give
    for the tiny base: None for an error, else the Qwen3Config fields that change."""
    if key in ("architectures", "pad_token_id", "bos_token_id", "torch_dtype", "unknown_field",
               "original_max_position_embeddings", "rope_parameters.factor"):
        return {}
    if key == "model_type":
        return {} if v == "qwen3" and type(v) is str or _absent(v) else None
    if key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        return {} if type(v) is int and v == SIZES[key] else None  # any other value: wrong shapes
    if key == "num_key_value_heads":  # absent: 32 (transformers' default), null: = heads (2)
        return {} if type(v) is int and v == 1 else None
    if key == "head_dim":  # absent: 128 (transformers' Qwen3 default)
        return {} if type(v) is int and v == 16 else None
    if key == "hidden_act":
        return {} if _absent(v) or v == "silu" and type(v) is str else None
    if key == "rms_norm_eps":
        return {} if _absent(v) else {"rms_norm_eps": float(v)} if _positive(v) else None
    if key in ("rope_theta", "rope_parameters.rope_theta"):
        if _absent(v) or (v is None and key == "rope_theta"):
            return {}
        return {"rope_theta": float(v)} if _rope_theta_ok(v) else None
    if key == "max_position_embeddings":
        return {"max_position_embeddings": 32768} if _absent(v) else (
            {"max_position_embeddings": v} if _int_in(v, 1) else None)
    if key == "tie_word_embeddings":
        return {} if v is True else None  # absent = false: lm_head.weight missing
    if key == "attention_bias":
        return {} if _absent(v) or v is False else None
    if key == "eos_token_id":
        if _absent(v) or v is None:
            return {"eos_token_ids": ()}
        if _int_in(v, 0, 63):
            return {"eos_token_ids": (v,)}
        if type(v) is list and all(_int_in(e, 0, 63) for e in v):
            return {"eos_token_ids": tuple(v)}
        return None
    if key == "layer_types":
        if _absent(v) or v is None or (type(v) is list and all(t == "full_attention" and type(t) is str for t in v)):
            return {}
        return None
    if key == "use_sliding_window":
        return {} if _absent(v) or v is None or v is False else None
    if key == "rope_parameters":
        return {} if _absent(v) or v is None or v == {} else ("dict" if isinstance(v, dict) else None)
    if key == "rope_parameters.rope_type":
        if _absent(v) or (type(v) is str and v == "default"):
            return {}
        if type(v) is str and v == "yarn":
            return {"rope_scaling": freeze({"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 2048})}
        return None
    raise AssertionError(key)


BASE_KEYS = ["architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_parameters",
             "rope_parameters.rope_theta", "rope_parameters.rope_type", "rope_parameters.factor",
             "max_position_embeddings", "tie_word_embeddings", "attention_bias", "pad_token_id", "bos_token_id",
             "eos_token_id", "torch_dtype", "rope_theta", "layer_types", "use_sliding_window",
             "original_max_position_embeddings", "unknown_field"]


def _set(config: dict, key: str, value: Any) -> dict:
    config = json.loads(json.dumps(config))
    *parents, last = key.split(".")
    node = config
    for p in parents:
        node = node[p]
    if value is ABSENT:
        node.pop(last, None)
    else:
        node[last] = value
    return config


def _load_config_case(tiny: Tiny, which: str, config: dict):
    """(module, None) or (None, error) for the tiny checkpoint `which` with this config.json."""
    src = tiny.base if which == "base" else tiny.head
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / which
        shutil.copytree(src, folder)
        (folder / "config.json").write_text(json.dumps(config))
        try:
            if which == "base":
                return load_qwen3(folder, dtype=jnp.float32), None
            return load_dart_head(folder, tiny.target, dtype=jnp.float32), None
        except Exception as error:  # noqa: BLE001 - sorted by _user_error
            _user_error(error, folder / "config.json")
            return None, error


def _base_config_property(tiny: Tiny, data) -> None:
    key = data.draw(st.sampled_from(BASE_KEYS + ["rope_scaling"]))
    if key == "rope_scaling":
        v, frozen = data.draw(st.sampled_from(BASE_SCALINGS + [(ABSENT, "default"), (None, "default"), ([2.0], None),
                                                                ("linear", None)]))
        expected = None if frozen is None else {} if frozen == "default" else {"rope_scaling": freeze(frozen)}
    else:
        v = data.draw(VALUES)
        expected = _expected_base(key, v)
    config = _set(tiny.base_config, key, v)
    module, error = _load_config_case(tiny, "base", config)
    if expected == "dict":  # a random rope_parameters object: a clear error or a load, both fine here
        return
    assert (module is None) == (expected is None), f"{key}={v!r}: expected {expected}, got {error!r}"
    if module is None:
        return
    want = dataclasses.replace(tiny.target.config, **expected)
    assert module.config == want
    state = nnx.split(module)[1]
    _check_weights(module, qwen3_table(module.config), tiny.base_tensors)
    if not {"rms_norm_eps", "rope_theta", "rope_scaling"} & set(expected):  # the computation is the same
        np.testing.assert_array_equal(tiny.base_forward(state), tiny.base_logits)


HEAD_KEYS = ["architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "draft_length", "draft_vocab_size",
             "rms_norm_eps", "rope_theta", "max_position_embeddings", "hidden_act", "target_hidden_size", "torch_dtype",
             "unknown_field"]
HEAD_SIZE_VALUES = {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2, "vocab_size": 64,
                    "draft_vocab_size": 40}


def _expected_head(key: str, v: Any) -> dict | None:
    """What setting the tiny head's config.json `key` to `v` must give (docs/spec.md §1): None
    for an error, else the DartHeadConfig fields that change (`extra` aside)."""
    if key in ("architectures", "model_type", "num_hidden_layers", "torch_dtype", "unknown_field"):
        return {}
    if key in HEAD_SIZE_VALUES:
        return {} if type(v) is int and v == HEAD_SIZE_VALUES[key] else None
    if key == "num_key_value_heads":  # absent or null: = heads (2), which the k/v shapes refuse
        return {} if type(v) is int and v == 1 else None
    if key == "head_dim":  # absent or null: hidden_size // heads = 16
        return {} if _absent(v) or v is None or (type(v) is int and v == 16) else None
    if key == "draft_length":  # no tensor depends on it
        return {"draft_length": v} if _int_in(v, 1, 256) else None
    if key == "rms_norm_eps":
        return {} if _absent(v) else {"rms_norm_eps": float(v)} if _positive(v) else None
    if key == "rope_theta":
        return {} if _absent(v) or v is None else {"rope_theta": float(v)} if _rope_theta_ok(v) else None
    if key == "max_position_embeddings":
        return {} if _absent(v) else {"max_position_embeddings": v} if _int_in(v, 1) else None
    if key == "hidden_act":
        if _absent(v):
            return {}
        ok = type(v) is str and v in ("silu", "swish", "gelu", "gelu_pytorch_tanh", "relu")
        return {"hidden_act": v} if ok else None
    if key == "target_hidden_size":
        if _absent(v) or v is None:
            return {"target_hidden_size": None}
        return {} if type(v) is int and v == 32 else None
    raise AssertionError(key)


def _head_config_property(tiny: Tiny, data) -> None:
    key = data.draw(st.sampled_from(HEAD_KEYS + ["rope_scaling"]))
    if key == "rope_scaling":
        v, frozen = data.draw(st.sampled_from(HEAD_SCALINGS + [(ABSENT, "default"), (None, "default"), ([1], None),
                                                                ("linear", None)]))
        expected = None if frozen is None else {} if frozen == "default" else {"rope_scaling": freeze(frozen)}
    else:
        v = data.draw(VALUES)
        expected = _expected_head(key, v)
    config = _set(tiny.head_config, key, v)
    module, error = _load_config_case(tiny, "head", config)
    assert (module is None) == (expected is None), f"{key}={v!r}: expected {expected}, got {error!r}"
    if module is None:
        return
    want = dataclasses.replace(tiny.head_module.config, **expected, extra=module.config.extra)
    assert module.config == want
    if key == "unknown_field" and v is not ABSENT:  # kept, to be written back on export
        assert json.dumps(module.config.to_hf()["unknown_field"]) == json.dumps(v)
    _check_weights(module, head_table(module.config), tiny.head_tensors)
    if not {"rms_norm_eps", "rope_theta", "rope_scaling", "hidden_act", "draft_length"} & set(expected):
        np.testing.assert_array_equal(tiny.head_forward(nnx.split(module)[1]), tiny.head_logits)


@FAST
@given(data=st.data())
def test_fuzz_base_config_values(tiny, data):
    _base_config_property(tiny, data)


@FAST
@given(data=st.data())
def test_fuzz_head_config_values(tiny, data):
    _head_config_property(tiny, data)


def _config_bytes_property(tiny: Tiny, data) -> None:
    """A config.json cut short: a clear error unless what is left is the same JSON object."""
    which = data.draw(st.sampled_from(["base", "head"]))
    src = tiny.base if which == "base" else tiny.head
    text = (src / "config.json").read_bytes()
    cut = text[:data.draw(st.integers(0, len(text) - 1))]
    try:
        same = json.loads(cut) == json.loads(text)
    except ValueError:
        same = False
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / which
        shutil.copytree(src, folder)
        (folder / "config.json").write_bytes(cut)
        try:
            load_qwen3(folder, dtype=jnp.float32) if which == "base" else load_dart_head(folder, tiny.target)
        except Exception as error:  # noqa: BLE001 - sorted by _user_error
            _user_error(error, folder / "config.json")
            assert not same
            return
    assert same


@FAST
@given(data=st.data())
def test_fuzz_config_truncation(tiny, data):
    _config_bytes_property(tiny, data)


# ---------------------------------------------------------------- the long run
@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_fuzz_long_base_safetensors(tiny, data):
    _safetensors_property(tiny, data, "base")


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_fuzz_long_head_safetensors(tiny, data):
    _safetensors_property(tiny, data, "head")


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_fuzz_long_config_values(tiny, data):
    if data.draw(st.booleans()):
        _base_config_property(tiny, data)
    else:
        _head_config_property(tiny, data)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_fuzz_long_config_truncation(tiny, data):
    _config_bytes_property(tiny, data)
