"""GGUF files (llama.cpp's format) as Hugging Face checkpoint folders: Llama-family bases only.

A `.gguf` file holds the weights (often quantized), the model's hyper-parameters and its
tokenizer (vocabulary, merges, special ids, chat template) as metadata. `gguf_to_folder` turns
one into the folder layout the rest of the project reads — config.json, model.safetensors
(float32: the dequantized weights), tokenizer.json, tokenizer_config.json,
generation_config.json — and `gguf_folder` keeps that folder in a cache, built once per file.
The `gguf` package reads the file and dequantizes every quantization it knows (Q4_0, Q4_1, Q8_0,
K-quants, F16, ...); the tokenizer is rebuilt with `tokenizers` from the metadata. What the
conversion relies on (docs/spec.md §8):
- llama.cpp stores tensors under its own names (`blk.N.attn_q.weight`, ...) and, for Llama,
  stores q_proj/k_proj with the rows of each head interleaved for its RoPE layout: the inverse
  permutation is applied here, so the folder holds the HF layout.
- a file without `output.weight` ties the LM head to the token embedding.
- the pre-tokenizer is named by `tokenizer.ggml.pre`; the supported ones are listed in
  `PRE_TOKENIZERS`.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm.auto import tqdm

# a dependency of the project, but only GGUF files need it: an image without it (the GPU campaign's)
# still imports dart_jax.convert, and `_reader` says what to install when a .gguf file is asked for
try:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize
except ImportError as _missing:  # tests/test_llama.py blocks the import to check this
    GGUFReader = dequantize = None
    _GGUF_IMPORT_ERROR: ImportError | None = _missing
else:
    _GGUF_IMPORT_ERROR = None

from dart_jax.errors import FileFormatError, InputError, MissingFileError, parse_json
from dart_jax.files import cache_root, file_sha256

from .files import atomic_folder
from .qwen3 import save_qwen3

# llama.cpp tensor names → HF names ({n}: the layer)
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
# the GPT-2-style regex that byte-level BPE tokenizers split words with
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre → how words are split before BPE (llama.cpp's pre-tokenizer types)
PRE_TOKENIZERS = ("default", "gpt2", "smollm", "llama-bpe", "llama3")
FORMAT_VERSION = 2  # of the converted folder: a change rebuilds cached conversions (2: with checksums)
MANIFEST = "gguf_source.json"  # written last: the source file, and each file's size and SHA-256
OWNED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
         "chat_template.jinja", MANIFEST)
REBUILD = "python -m dart_jax.convert gguf"  # the command that converts a GGUF file into a folder


def _reader(path: Path):
    if not path.is_file():
        raise MissingFileError(f"GGUF file {path} not found; pass the path of a .gguf file.")
    if GGUFReader is None:
        raise ImportError(f"reading {path} needs the `gguf` package, which this Python lacks "
                          f"({_GGUF_IMPORT_ERROR}); install it: pip install gguf") from _GGUF_IMPORT_ERROR
    try:
        return _CheckedReader(str(path), "r")
    except FileFormatError:
        raise
    except (ValueError, KeyError, IndexError, OSError, AssertionError) as e:
        raise FileFormatError(path, f"is not a readable GGUF file ({str(e)[:200]}); download it again.") from e


def check_extents(spans: list[tuple[int, int, str]], size: int, path: Path) -> None:
    """Every tensor's data ((start, end, name) byte spans) inside the file of `size` bytes and apart
    from every other's: GGUFReader maps the bytes the header names, so a damaged offset would let
    two tensors share data, or read past the end."""
    spans = sorted(spans)
    for (start, end, name), following in zip(spans, [*spans[1:], None]):
        if end > size:
            raise FileFormatError(path, f"tensor {name!r} runs to byte {end}, past the file's end at {size}; the "
                                        "file is truncated or damaged: download it again.")
        if following is not None and following[0] < end:
            raise FileFormatError(path, f"tensors {name!r} and {following[2]!r} share the bytes from {following[0]} "
                                        "on; the file is damaged: download it again.")


if GGUFReader is not None:
    class _CheckedReader(GGUFReader):
        """GGUFReader that checks the tensors' extents (`check_extents`) before it maps them."""

        def _build_tensors(self, start_offs: int, fields) -> None:
            spans = []
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type[0]))]
                start = int(start_offs + offset[0])
                spans.append((start, start + int(np.prod(dims, dtype=np.int64)) * type_size // block,
                              bytes(name).decode("utf-8", "replace")))
            check_extents(spans, len(self.data), Path(self.data.filename))
            super()._build_tensors(start_offs, fields)


def _field(reader, path: Path, key: str, default: Any = ..., kind: type | tuple | None = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise FileFormatError(path, f"has no metadata field {key!r}, which a Llama GGUF file needs; the file is "
                                        "incomplete or not a Llama-family model.")
        return default
    try:
        value = field.contents()
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise FileFormatError(path, f"metadata field {key!r} cannot be read ({e}).") from e
    if kind is not None and not isinstance(value, kind) or isinstance(value, bool) and kind in (int, (int, float)):
        raise FileFormatError(path, f"metadata field {key!r} is {type(value).__name__} {str(value)[:40]!r}, expected "
                                    f"{getattr(kind, '__name__', kind)}.")
    return value


def read_config(reader, path: Path) -> dict[str, Any]:
    """The HF Llama config.json dict of a GGUF file's metadata."""
    arch = _field(reader, path, "general.architecture", kind=str)
    if arch != "llama":
        raise InputError(f"{path}: GGUF architecture {arch!r} is not supported; dart_jax reads Llama-family GGUF "
                         "files (general.architecture 'llama', e.g. SmolLM2, Llama 2/3). For Qwen3 use the HF "
                         "checkpoint (config.json + safetensors).")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise InputError(f"{path}: this GGUF file carries per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 "
                         "scaled RoPE), which the metadata does not describe as a rope_scaling; use the HF checkpoint.")
    tokens = _field(reader, path, "tokenizer.ggml.tokens", kind=list)
    heads = _field(reader, path, "llama.attention.head_count", kind=int)
    hidden = _field(reader, path, "llama.embedding_length", kind=int)
    if heads <= 0 or hidden <= 0 or hidden % heads:
        raise FileFormatError(path, f"llama.embedding_length {hidden} is not a multiple of "
                                    f"llama.attention.head_count {heads}.")
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": _field(reader, path, "llama.vocab_size", len(tokens), kind=int),
        "hidden_size": hidden,
        "intermediate_size": _field(reader, path, "llama.feed_forward_length", kind=int),
        "num_hidden_layers": _field(reader, path, "llama.block_count", kind=int),
        "num_attention_heads": heads,
        "num_key_value_heads": _field(reader, path, "llama.attention.head_count_kv", heads, kind=int),
        "head_dim": _field(reader, path, "llama.rope.dimension_count", hidden // heads, kind=int),
        "rms_norm_eps": float(_field(reader, path, "llama.attention.layer_norm_rms_epsilon", kind=(int, float))),
        "rope_theta": float(_field(reader, path, "llama.rope.freq_base", 10000.0, kind=(int, float))),
        "max_position_embeddings": _field(reader, path, "llama.context_length", 2048, kind=int),
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    for key, name in (("llama.block_count", "num_hidden_layers"), ("llama.feed_forward_length", "intermediate_size"),
                      ("llama.attention.head_count_kv", "num_key_value_heads"),
                      ("llama.rope.dimension_count", "head_dim"), ("llama.vocab_size", "vocab_size")):
        if cfg[name] <= 0:
            raise FileFormatError(path, f"metadata {key} = {cfg[name]}; it must be a positive number. The file is "
                                        "damaged: download it again.")
    if heads % cfg["num_key_value_heads"]:
        raise FileFormatError(path, f"llama.attention.head_count {heads} is not a multiple of "
                                    f"llama.attention.head_count_kv {cfg['num_key_value_heads']}.")
    scaling = _field(reader, path, "llama.rope.scaling.type", None, kind=str)
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise InputError(f"{path}: GGUF RoPE scaling {scaling!r} is not supported (only 'linear').")
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(_field(reader, path, "llama.rope.scaling.factor", kind=(int, float)))}
    for key, name in (("tokenizer.ggml.bos_token_id", "bos_token_id"), ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                      ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        value = _field(reader, path, key, None, kind=int)
        if value is not None:
            if not 0 <= value < cfg["vocab_size"]:
                raise FileFormatError(path, f"metadata {key} = {value} lies outside the vocabulary of "
                                            f"{cfg['vocab_size']} tokens.")
            cfg[name] = value
    return cfg


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q_proj / k_proj rows ([heads·D, in], or a bias [heads·D]):
    within each head it stores the rows as (D/2 pairs, 2) where HF has (2 halves, D/2)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(name: str) -> str | None:
    """The HF name of a llama.cpp tensor name (None for one that has none)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}"
    return None


def read_tensors(reader, path: Path, cfg: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array in the HF layout) for every tensor of the file, dequantized."""
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise FileFormatError(path, f"holds tensor {tensor.name!r}, which a Llama checkpoint does not have; "
                                        "the file is not a plain Llama-family model.")
        try:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except (NotImplementedError, ValueError) as e:
            raise FileFormatError(path, f"tensor {tensor.name!r} of type {tensor.tensor_type.name} cannot be "
                                        f"dequantized ({e}).") from e
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        if array.size != int(np.prod(shape)):
            raise FileFormatError(path, f"tensor {tensor.name!r} holds {array.size} values for shape {shape}.")
        array = array.reshape(shape)
        if not np.isfinite(array).all():
            raise FileFormatError(path, f"tensor {tensor.name!r} holds NaN or infinite values; the file is damaged.")
        if ".self_attn.q_proj." in name:
            array = unpermute_rope(array, cfg["num_attention_heads"])
        elif ".self_attn.k_proj." in name:
            array = unpermute_rope(array, cfg["num_key_value_heads"])
        yield name, np.ascontiguousarray(array)


def build_tokenizer(reader, path: Path):
    """(tokenizers.Tokenizer, tokenizer_config dict) from a GGUF file's `tokenizer.*` metadata
    (byte-level BPE, `tokenizer.ggml.model` 'gpt2')."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, Regex

    model = _field(reader, path, "tokenizer.ggml.model", kind=str)
    if model != "gpt2":
        raise InputError(f"{path}: tokenizer model {model!r} is not supported; dart_jax rebuilds byte-level BPE "
                         "tokenizers (tokenizer.ggml.model 'gpt2', as SmolLM2 and Llama 3 use).")
    tokens = _field(reader, path, "tokenizer.ggml.tokens", kind=list)
    merges = _field(reader, path, "tokenizer.ggml.merges", kind=list)
    types = _field(reader, path, "tokenizer.ggml.token_type", [1] * len(tokens), kind=list)
    if len(types) != len(tokens) or not all(isinstance(t, str) for t in tokens):
        raise FileFormatError(path, "tokenizer.ggml.tokens and tokenizer.ggml.token_type disagree (lengths "
                                    f"{len(tokens)} and {len(types)}).")
    pairs = []
    for m in merges:
        if not isinstance(m, str) or m.count(" ") < 1:
            raise FileFormatError(path, f"tokenizer.ggml.merges holds {str(m)[:40]!r}, not 'left right'.")
        pairs.append(tuple(m.split(" ", 1)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    for left, right in pairs:  # the tokenizers library refuses these with a bare Exception
        unknown = next((t for t in (left, right, left + right) if t not in vocab), None)
        if unknown is not None:
            raise FileFormatError(path, f"tokenizer.ggml.merges holds {left + ' ' + right!r}, whose token "
                                        f"{unknown!r} is not in tokenizer.ggml.tokens; the file is damaged: "
                                        "download it again.")
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    pre = _field(reader, path, "tokenizer.ggml.pre", "default", kind=str)
    if pre not in PRE_TOKENIZERS:
        raise InputError(f"{path}: pre-tokenizer {pre!r} is not supported; supported: {', '.join(PRE_TOKENIZERS)}.")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("llama-bpe", "llama3"):
        split = [pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")]
    else:
        split = [pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated")]
        if pre == "smollm":  # digits one by one, then the GPT-2 split
            split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence([*split, byte_level])
    tk.decoder = decoders.ByteLevel()
    specials = [tok for tok, kind in zip(tokens, types) if kind in (3, 4)]  # control and user-defined tokens
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token(key: str) -> str | None:
        i = _field(reader, path, key, None, kind=int)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    add_bos = bool(_field(reader, path, "tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                          special_tokens=[(bos, vocab[bos])])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "unk_token": token("tokenizer.ggml.unknown_token_id"),
              "pad_token": token("tokenizer.ggml.padding_token_id"), "add_bos_token": add_bos,
              "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": _field(reader, path, "llama.context_length", 2048, kind=int)}
    template = _field(reader, path, "tokenizer.chat_template", None, kind=str)
    if template:
        config["chat_template"] = template
    return tk, {k: v for k, v in config.items() if v is not None}


def gguf_to_folder(gguf_path: str | os.PathLike, out: str | os.PathLike, *, progress: bool = True) -> Path:
    """Write the HF checkpoint folder of a Llama GGUF file to `out` (atomically: a failure leaves
    nothing behind). Returns `out`."""
    path = Path(os.path.expanduser(str(gguf_path)))
    reader = _reader(path)
    cfg = read_config(reader, path)
    tk, tok_config = build_tokenizer(reader, path)
    tensors = {}
    bar = tqdm(total=len(reader.tensors), desc=f"dequantizing {path.name}", unit="tensor", disable=not progress)
    with bar:
        for name, array in read_tensors(reader, path, cfg):
            tensors[name] = array
            bar.update()
    if cfg["tie_word_embeddings"]:
        tensors.pop("lm_head.weight", None)
    try:
        with atomic_folder(out, OWNED, what="converted GGUF folder") as scratch:
            save_qwen3(scratch, cfg, tensors)
            tk.save(str(scratch / "tokenizer.json"))
            (scratch / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
            generation = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
            (scratch / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
            files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                     for p in sorted(scratch.iterdir()) if p.is_file()}
            (scratch / MANIFEST).write_text(json.dumps(
                {"file": str(path.resolve()), "size": path.stat().st_size, "format": FORMAT_VERSION, "files": files},
                indent=2) + "\n")
    except InputError as e:
        raise FileFormatError(path, f"does not convert to a valid checkpoint: {e}") from e
    return Path(out)


def gguf_folder(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None, *,
                weights_later: bool = False) -> Path:
    """The converted HF folder of a GGUF file, built on first use under `cache_dir` (default
    `cache_root()/gguf`) and reused while the file keeps its path, size and modification time.
    `weights_later`: as for `checked_conversion`."""
    path = Path(os.path.expanduser(str(gguf_path))).resolve()
    if not path.is_file():
        raise MissingFileError(f"GGUF file {path} not found; pass the path of a .gguf file.")
    st = path.stat()
    key = hashlib.sha1(f"{path}:{st.st_size}:{st.st_mtime_ns}:{FORMAT_VERSION}".encode()).hexdigest()[:16]
    out = Path(cache_dir or cache_root() / "gguf") / f"{path.stem}-{key}"
    if not (out / MANIFEST).is_file():
        gguf_to_folder(path, out)
        return out
    return checked_conversion(out, path, weights_later=weights_later)


def _manifest(folder: Path) -> dict | str:
    """The manifest of a converted folder, or why it cannot be read."""
    try:
        manifest = parse_json((folder / MANIFEST).read_bytes(), folder / MANIFEST, "a conversion manifest")
    except (OSError, InputError) as e:
        return f"its {MANIFEST} cannot be read ({str(e)[-120:]})"
    return manifest if isinstance(manifest, dict) else f"its {MANIFEST} is not a JSON object"


# folder → its files' (name, inode, size, mtime_ns) when this process last found them intact; one
# loading resolves the same folder several times (the config, the tokenizer, the weights), and a
# file is hashed again only after a write (its mtime moves). A file written less than a second
# before it was hashed is not remembered: a coarse file clock could give a later write its mtime.
_INTACT: dict[Path, tuple] = {}
# folder → (its files' signature, when the check started, the problem of its weights or None): the
# weights being hashed beside the loading (`conversion_problem(..., weights_later=True)`)
_PENDING: dict[Path, tuple[tuple, int, Future]] = {}
_HASHING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dart_jax-checksums")  # its thread starts at a submit


def _signature(folder: Path, names) -> tuple:
    return tuple((name, st.st_ino, st.st_size, st.st_mtime_ns)
                 for name in sorted(names) for st in [(folder / name).stat()])


def is_weights(name: str) -> bool:
    """A converted folder's weight files (the large ones: hashed beside the loading when asked)."""
    return name.endswith(".safetensors")


def _hash_problem(folder: Path, files: dict) -> str | None:
    for name, entry in files.items():
        if file_sha256(folder / name) != entry.get("sha256"):
            return f"{name}'s SHA-256 differs from the one recorded when it was written"
    return None


def _hash_later(folder: Path, files: dict) -> Future:
    """`_hash_problem` on a thread of its own (hashing and reading leave the GIL: it runs beside the
    loader's Python work)."""
    return _HASHING.submit(_hash_problem, folder, files)


def _remember(key: Path, signature: tuple, started: int) -> None:
    if all(mtime < started - 10**9 for *_, mtime in signature):
        _INTACT[key] = signature


def conversion_problem(folder: Path, *, weights_later: bool = False) -> str | None:
    """What is wrong with a converted folder's files against the sizes and SHA-256 its manifest
    recorded when it was written (None: every file as written).

    `weights_later`: the small files are hashed now, the weights (`is_weights`) on a thread while
    the caller goes on, as long as it reads only the small files; a later call without it (the
    weights' loader: `target_folder`) waits for that hash and answers for the weights too."""
    manifest = _manifest(folder)
    if isinstance(manifest, str):
        return manifest
    files = manifest.get("files")
    if manifest.get("format") != FORMAT_VERSION or not isinstance(files, dict) or not files:
        return f"its {MANIFEST} has no checksums of this format (written by another version of dart_jax)"
    key = folder.resolve()
    started = time.time_ns()
    for name, entry in files.items():
        file = folder / name
        if not isinstance(entry, dict) or not file.is_file():
            return f"{name} is missing"
    signature = _signature(folder, files)
    if _INTACT.get(key) == signature:
        return None
    pending = _PENDING.pop(key, None)
    if pending is not None and pending[0] == signature:  # nothing written since: the small files stand
        if weights_later:
            _PENDING[key] = pending
            return None
        problem = pending[2].result()
        if problem is None:
            _remember(key, signature, pending[1])
        return problem
    for name, entry in files.items():
        file = folder / name
        if file.stat().st_size != entry.get("size"):
            return f"{name} has {file.stat().st_size} bytes, {entry.get('size')} when written"
    later = {name: entry for name, entry in files.items() if weights_later and is_weights(name)}
    problem = _hash_problem(folder, {name: entry for name, entry in files.items() if name not in later})
    if problem is not None:
        return problem
    if later:
        _PENDING[key] = (signature, started, _hash_later(folder, later))
        return None
    _remember(key, signature, started)
    return None


def checked_conversion(folder: str | os.PathLike, source: Path | None = None, *,
                       weights_later: bool = False) -> Path:
    """`folder`, a converted GGUF folder, once its files match the checksums of its manifest. A
    damaged folder is rebuilt from its GGUF file (`source`, or the one the manifest names) with a
    one-line notice; without that file it is a FileFormatError naming the command that rebuilds it.
    `weights_later`: the weights' checksums are compared on a thread while the caller reads the
    small files; the weights' loader (a later call without it) waits for them (`conversion_problem`)."""
    folder = Path(folder)
    problem = conversion_problem(folder, weights_later=weights_later)
    if problem is None:
        return folder
    if source is None:
        manifest = _manifest(folder)
        named = manifest.get("file") if isinstance(manifest, dict) else None
        source = Path(named) if isinstance(named, str) else None
    if source is None or not source.is_file():
        raise FileFormatError(folder, f"this GGUF conversion is damaged ({problem}) and the GGUF file it was made "
                                      f"from{f' ({source})' if source else ''} is gone; rebuild it from the .gguf "
                                      f"file: {REBUILD} FILE.gguf {folder} (or pass the .gguf file itself).")
    print(f"dart_jax: the converted cache {folder} is damaged ({problem}); rebuilding it from {source}.",
          file=sys.stderr)
    gguf_to_folder(source, folder)
    return folder


def is_gguf(path_or_id: str | os.PathLike) -> bool:
    """Whether a checkpoint name is a GGUF file (by its suffix, or by the magic bytes of a file)."""
    path = Path(os.path.expanduser(str(path_or_id)))
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"
