"""Tiny random checkpoints for tests, benchmarks and the demo script: a Qwen3 target, its
tokenizer, a DART head and an n-gram trie, each written through the project's own writers
(`save_qwen3`, `write_dart_head`, `Trie.save`), so that what reads them is what reads a real
checkpoint.

Random weights are wider than transformers' init (norms 1 + 0.1·N(0, 1), matrices N(0, std)) so
that a tiny model's logits are not flat. The head is not trained: it rarely agrees with the
target, so τ stays near 1 and only timings mean anything with these models.

The benchmarks' random sets (`build_random_assets`) also have a *peaked* LM head: the rows of
HOT_TOKENS ids (`hot_token_ids`: printable characters of the byte tokenizer, drawn from the seed,
never a special id such as EOS) are scaled by HOT_SCALE, in the LM head, or in the embedding when
it is the LM head (tied). A Gaussian LM head over a large vocabulary has near-ties everywhere (the
top two of 151 936 logits lie ~0.15 σ apart), which bfloat16 breaks differently in a tree verify
and in plain decoding; with the peaked head the argmax is a hot token with a median margin of
~2.4 σ, as a trained model's confident next token, and only the ties among the hot tokens are
left (`bench.forced`'s module docstring has the figures). Shapes, dtypes and costs are unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from dart_jax.bench.util import zipf_tokens
from dart_jax.convert.dart_head import DartHeadConfig, tensor_table as head_tensor_table, write_dart_head
from dart_jax.convert.eagle3 import Eagle3Config, tensor_table as eagle3_tensor_table, write_eagle3_head
from dart_jax.convert.qwen3 import save_qwen3, target_config_from_hf, tensor_table as qwen3_tensor_table
from dart_jax.ngram import Trie

# the special tokens of Qwen's chat format; the first three are ids 0, 1, 2 of the character-level
# tokenizer (pad, turn start, turn end = EOS), as the tiny configs' token ids say
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
PAD, TURN_START, EOS = SPECIALS[:3]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}

# the peaked LM head of the benchmarks' random sets: HOT_TOKENS rows scaled by HOT_SCALE
HOT_TOKENS = 16
HOT_SCALE = 8.0
# the byte tokenizer's first ids are the printable ASCII characters '!'..'~' (none special)
PRINTABLE_IDS = 94


def hot_token_ids(vocab_size: int, seed: int) -> np.ndarray:
    """The ids of the peaked LM head (module docstring), sorted: HOT_TOKENS distinct ids among
    the byte tokenizer's printable characters (ids below PRINTABLE_IDS: never pad, EOS or another
    special id, so that a generation does not stop at once), drawn from `seed`."""
    return np.sort(np.random.default_rng(seed + 3).choice(min(vocab_size, PRINTABLE_IDS), HOT_TOKENS, replace=False))


def lm_head_name(tied: bool) -> str:
    """The checkpoint tensor that holds the target's LM head: the embedding when tied."""
    return "model.embed_tokens.weight" if tied else "lm_head.weight"


def random_tensors(shapes: Mapping[str, tuple[int, ...]], rng: np.random.Generator, std: float,
                   dtype: str = "float32", hot_rows: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Norm weights 1 + 0.1·N(0, 1), every other tensor N(0, std), as `dtype`; the rows
    `hot_rows[name]` of a tensor `name` are multiplied by HOT_SCALE (the peaked LM head)."""
    out = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape, dtype=np.float32)
        x = (1.0 + 0.1 * x) if name.endswith("norm.weight") else std * x
        if hot_rows and name in hot_rows:
            x[np.asarray(hot_rows[name])] *= HOT_SCALE
        out[name] = x.astype(DTYPES[dtype])
    return out


def make_tiny_qwen3(folder, *, vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                    rope_theta=10000.0, max_position_embeddings=2048, seed=0, dtype="float32", std=0.08,
                    max_shard_size_bytes=None, weights: bool = True, hot_ids=None, **extra) -> Path:
    """Write a random HF Qwen3 (config.json + safetensors, sharded with `max_shard_size_bytes`)
    to `folder` and return it. Token ids: pad 0, bos 1, eos 2 (the character-level tokenizer's
    specials). `extra` adds or overrides config.json fields; RoPE goes into `rope_parameters`
    (transformers 5's layout), which `extra` may give (its rope_theta defaults to `rope_theta`).
    `hot_ids`: the LM head's rows (the embedding's when tied) scaled by HOT_SCALE (the peaked
    head of the module docstring); default none.
    `weights=False`: config.json alone (the weights are made in memory, `bench.e2e.random_model`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    rope = dict(extra.pop("rope_parameters", None) or {"rope_type": "default"})
    rope.setdefault("rope_theta", rope_theta)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
              "hidden_size": hidden_size, "intermediate_size": intermediate_size,
              "num_hidden_layers": num_hidden_layers, "num_attention_heads": num_attention_heads,
              "num_key_value_heads": num_key_value_heads, "head_dim": head_dim, "hidden_act": "silu",
              "rms_norm_eps": 1e-6, "rope_parameters": rope, "max_position_embeddings": max_position_embeddings,
              "tie_word_embeddings": tie_word_embeddings, "attention_bias": False, "pad_token_id": 0,
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": dtype, **extra}
    table = qwen3_tensor_table(target_config_from_hf(config))
    if not weights:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return folder
    hot_rows = None if hot_ids is None else {lm_head_name(tie_word_embeddings): np.asarray(hot_ids)}
    tensors = random_tensors({name: shape for name, (_, shape, _) in table.items()}, np.random.default_rng(seed),
                             std, dtype, hot_rows)
    return save_qwen3(folder, config, tensors, max_shard_size_bytes=max_shard_size_bytes)


def make_tiny_llama(folder, *, head_dim=16, **kw) -> Path:
    """A random HF Llama (LlamaForCausalLM layout: no q/k norms; `attention_bias=True` adds
    q/k/v/o biases; `rope_parameters` may be Llama 3's llama3 scaling), otherwise as make_tiny_qwen3."""
    return make_tiny_qwen3(folder, head_dim=head_dim, **{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                         "mlp_bias": False, **kw})


def save_chat_tokenizer(tok: Tokenizer, folder):
    """Wrap a `tokenizers.Tokenizer` holding SPECIALS' chat tokens for transformers (EOS
    <|im_end|>, pad <|endoftext|>, no BOS or UNK, the shared chat template), save it to `folder`
    and return it."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None,
                                   unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def make_tiny_tokenizer(folder, *, vocab_size=256) -> Path:
    """A character-level tokenizer of exactly `vocab_size` ids with the chat template.

    Ids 0, 1, 2 are <|endoftext|> (pad, and what unknown characters become), <|im_start|> and
    <|im_end|> (EOS), as in make_tiny_qwen3's config; then printable ASCII characters and the
    newline; the rest are filler tokens <t{i}>.
    """
    specials = [PAD, TURN_START, EOS]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    names = specials + chars[: vocab_size - len(specials)]
    names += [f"<t{i}>" for i in range(vocab_size - len(names))]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    save_chat_tokenizer(tok, folder)
    return Path(folder)


def make_byte_tokenizer(folder):
    """256 byte tokens then SPECIALS: any text encodes, no training needed. Returns the
    transformers tokenizer."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return save_chat_tokenizer(tok, folder)


def make_tiny_head(folder, base_folder, *, draft_length=3, draft_vocab_size=None, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=96, std=0.1, shuffle_d2t=False,
                   first_ids=False, dtype="float32", seed=0, weights: bool = True) -> Path:
    """A random DART head (reference layout, written by `write_dart_head`) for the target in
    `base_folder`, of the target's width and vocabulary.

    The draft vocabulary holds `draft_vocab_size` target ids (default: all): a random set, or the
    first ids with `first_ids` (what a frequency-ordered vocabulary gives), sorted by id as
    EAGLE-3 does, or in random order with `shuffle_d2t` (so that d2t is not trivial even when the
    draft vocabulary is the whole vocabulary). `weights=False`: config.json alone."""
    base = json.loads((Path(base_folder) / "config.json").read_text())
    vocab, hidden = int(base["vocab_size"]), int(base["hidden_size"])
    draft_vocab = int(draft_vocab_size or vocab)
    config = DartHeadConfig.from_hf({
        "architectures": ["LlamaForCausalLMDart"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": intermediate_size, "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads, "head_dim": head_dim, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "vocab_size": vocab,
        "max_position_embeddings": int(base.get("max_position_embeddings", 2048)), "hidden_act": "silu",
        "num_hidden_layers": 1, "draft_length": draft_length, "draft_vocab_size": draft_vocab,
        "target_hidden_size": hidden})
    if not weights:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        hf = config.to_hf()
        hf["torch_dtype"] = dtype
        (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        return folder
    rng = np.random.default_rng(seed)
    used = np.arange(draft_vocab) if first_ids else np.sort(rng.choice(vocab, draft_vocab, replace=False))
    if shuffle_d2t:
        used = rng.permutation(used)
    shapes = {name: shape for name, (_, shape, _) in head_tensor_table(config).items() if name not in ("d2t", "t2d")}
    tensors = random_tensors(shapes, rng, std)
    tensors["d2t"] = used - np.arange(draft_vocab)
    tensors["t2d"] = np.isin(np.arange(vocab), used)
    return write_dart_head(folder, config, tensors, dtype)


def make_tiny_eagle3(folder, base_folder, *, draft_vocab_size=None, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=96, std=0.1, seed=0) -> Path:
    """A random EAGLE-3 head (published layout, written by `write_eagle3_head`) for the target in
    `base_folder`, of the target's width, sharing its embedding; the draft vocabulary holds the
    first `draft_vocab_size` target ids (default: all). Untrained: τ stays near 1."""
    base = json.loads((Path(base_folder) / "config.json").read_text())
    vocab, hidden = int(base["vocab_size"]), int(base["hidden_size"])
    draft_vocab = int(draft_vocab_size or vocab)
    config = Eagle3Config.from_hf({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": intermediate_size, "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads, "head_dim": head_dim, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
        "max_position_embeddings": int(base.get("max_position_embeddings", 2048)), "hidden_act": "silu"})
    shapes = {name: shape for name, (_, shape, _) in eagle3_tensor_table(config).items() if name not in ("d2t", "t2d")}
    tensors = random_tensors(shapes, np.random.default_rng(seed), std)
    if draft_vocab != vocab:
        tensors["d2t"] = np.zeros(draft_vocab, np.int64)
        tensors["t2d"] = np.arange(vocab) < draft_vocab
    return write_eagle3_head(folder, config, tensors)


def make_tiny_setup(folder, *, vocab_size=256, draft_length=3, draft_vocab_size=None, shuffle_d2t=False,
                    trie_streams=20, stream_length=64, seed=0, **qwen_kwargs) -> tuple[Path, Path, Path]:
    """Tiny base (with the character-level tokenizer), head and a 3-gram trie of random token
    streams under `folder`; returns (base folder, head folder, trie file)."""
    folder = Path(folder)
    base = make_tiny_qwen3(folder / "base", vocab_size=vocab_size, seed=seed, **qwen_kwargs)
    make_tiny_tokenizer(base, vocab_size=vocab_size)
    head = make_tiny_head(folder / "head", base, draft_length=draft_length, draft_vocab_size=draft_vocab_size,
                          shuffle_d2t=shuffle_d2t, seed=seed)
    rng = np.random.default_rng(seed)
    trie = folder / "ngram.trie"
    Trie.build([rng.integers(3, vocab_size, stream_length) for _ in range(trie_streams)], order=3).save(trie)
    return base, head, trie


def random_std(hidden: int) -> float:
    """The std of the random sets' matrices: 1/sqrt(hidden) at most, wide enough that a tiny model's
    logits are not flat, small enough that a wide one does not blow up."""
    return min(0.08, hidden ** -0.5)


def build_random_assets(folder, *, layers: int = 4, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                        shape: Mapping[str, Any] | None = None, draft_length: int = 7, trie_tokens: int = 20_000,
                        seed: int = 0, weights: bool = True) -> dict[str, Path]:
    """The benchmarks' random model set under `folder`: `base/` (a Qwen3 with the byte-level
    tokenizer), `head/` (a DART head of the target's widths) and `ngram.trie` (a trie over
    Zipf-distributed text); returns their paths (base, dart, ngram).

    `shape` (HF config fields, e.g. `bench.shapes.KNOWN_SHAPES["Qwen3-8B"]`) overrides hidden,
    heads and the other widths, keeps `layers` as the depth, and stores bfloat16 like the
    published checkpoints; without it the target is a small float32 one whose vocabulary is the
    tokenizer's, rounded up to a multiple of 64.

    The target's LM head is peaked (module docstring): the rows `hot_token_ids(vocab, seed)` of the
    LM head, or of the embedding when tied, are scaled by HOT_SCALE.

    `weights=False` writes every file but the weights (config.json files, tokenizer, trie): the
    benchmarks then draw the weights on the device (`bench.e2e.random_model`), which spares writing
    and reading gigabytes at real shapes (16 GB of bf16 for Qwen3-8B's 36 layers). Its `std` (the
    law of `random_tensors`) is `random_std(hidden)`; its hot rows are the same.
    """
    if layers < 3:
        raise ValueError(f"the random target needs >= 3 layers (DART taps layers 2, L//2, L-3), got {layers}")
    if shape:
        hidden, heads = int(shape["hidden_size"]), int(shape["num_attention_heads"])
        kv_heads = int(shape.get("num_key_value_heads") or heads)
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads}), and heads of kv_heads ({kv_heads})")
    folder = Path(folder)
    tok = make_byte_tokenizer(folder / "base")
    eos = tok.convert_tokens_to_ids(EOS)
    if shape:
        # the byte tokenizer uses the first ids only; the rest of the vocabulary is there for the compute shape
        vocab, inter = int(shape["vocab_size"]), int(shape["intermediate_size"])
        head_dim, tied = int(shape.get("head_dim") or hidden // heads), bool(shape.get("tie_word_embeddings"))
        dtype = "bfloat16"
    else:
        vocab, inter, head_dim, tied, dtype = ((len(tok) + 63) // 64) * 64, 2 * hidden, hidden // heads, True, "float32"
    std = random_std(hidden)
    base = make_tiny_qwen3(folder / "base", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                           head_dim=head_dim, tie_word_embeddings=tied, max_position_embeddings=4096, seed=seed,
                           dtype=dtype, std=std, eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=None,
                           weights=weights, hot_ids=hot_token_ids(vocab, seed))
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos], "do_sample": False}) + "\n")
    # the published heads draft over 32000 ids; the first ones hold every byte token
    head = make_tiny_head(folder / "head", base, draft_length=draft_length, draft_vocab_size=min(vocab, 32000),
                          num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                          intermediate_size=inter, std=std, first_ids=True, dtype=dtype, seed=seed + 1,
                          weights=weights)
    stream = zipf_tokens(np.random.default_rng(seed + 2), trie_tokens, len(tok))
    trie = folder / "ngram.trie"
    Trie.build([stream[i:i + 256] for i in range(0, len(stream), 256)], order=3).save(trie)
    return {"base": base, "dart": head, "ngram": trie}
