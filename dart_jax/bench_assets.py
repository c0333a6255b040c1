"""A tiny random model set for timing runs when no checkpoint is at hand.

Writes, into one folder: `base/` (a HF Qwen3 checkpoint with random weights and a byte-level
tokenizer with a Qwen-style chat template), `head/` (a DART head in the reference layout with
random weights) and `ngram.trie` (a trie over random Zipf-distributed text). The head is not
trained, so it rarely agrees with the target: τ stays near 1 and only the timings mean anything.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dart_jax.bench_util import zipf_tokens
from dart_jax.convert.safetensors_io import write_tensors

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokenizer(folder: Path):
    """256 byte tokens plus the specials: any text encodes, no training needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


class _Weights:
    """Random tensors: norms near 1, matrices with std min(0.08, 1/sqrt(hidden)) — wide enough that
    a tiny model's logits are not flat, small enough that a wide one does not blow up."""

    def __init__(self, rng: np.random.Generator, hidden: int, dtype):
        self.rng, self.std, self.dtype = rng, min(0.08, hidden ** -0.5), dtype

    def __call__(self, shape: tuple[int, ...], *, norm: bool = False) -> np.ndarray:
        x = self.rng.standard_normal(shape, dtype=np.float32)
        return ((1.0 + 0.1 * x) if norm else self.std * x).astype(self.dtype)


def build_random_assets(folder: str | Path, *, layers: int = 4, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                        shape: dict | None = None, draft_length: int = 7, trie_tokens: int = 20_000,
                        seed: int = 0) -> dict[str, Path]:
    """Write a random target, head and trie under `folder`; return their paths (base, dart, ngram).

    `shape` (HF config fields, e.g. `bench_shapes.KNOWN_SHAPES["Qwen3-8B"]`) overrides hidden,
    heads and the other widths, keeps `layers` as the depth, and stores bfloat16 like the
    published checkpoints; without it the target is a small float32 one.
    """
    import ml_dtypes

    if layers < 3:
        raise ValueError(f"the random target needs >= 3 layers (DART taps layers 2, L//2, L-3), got {layers}")
    if shape:
        hidden, heads = int(shape["hidden_size"]), int(shape["num_attention_heads"])
        kv_heads = int(shape.get("num_key_value_heads") or heads)
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads}), and heads of kv_heads ({kv_heads})")
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    base, head = folder / "base", folder / "head"
    base.mkdir(parents=True, exist_ok=True)
    head.mkdir(parents=True, exist_ok=True)

    tok = _byte_tokenizer(base)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    if shape:
        # the byte tokenizer uses the first ids only; the rest of the vocabulary is there for the compute shape
        vocab, inter = int(shape["vocab_size"]), int(shape["intermediate_size"])
        head_dim, tied = int(shape.get("head_dim") or hidden // heads), bool(shape.get("tie_word_embeddings"))
        dtype, dtype_name = ml_dtypes.bfloat16, "bfloat16"
    else:
        vocab, inter, head_dim, tied = ((len(tok) + 63) // 64) * 64, 2 * hidden, hidden // heads, True
        dtype, dtype_name = np.float32, "float32"
    _weights = _Weights(rng, hidden, dtype)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 4096, "tie_word_embeddings": tied, "hidden_act": "silu",
           "attention_bias": False, "eos_token_id": eos, "pad_token_id": tok.pad_token_id, "torch_dtype": dtype_name}
    (base / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos], "do_sample": False}) + "\n")
    q, kv = heads * head_dim, kv_heads * head_dim
    tensors = {"model.embed_tokens.weight": _weights((vocab, hidden)), "model.norm.weight": _weights((hidden,), norm=True)}
    if not tied:
        tensors["lm_head.weight"] = _weights((vocab, hidden))
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, dims in (("self_attn.q_proj", (q, hidden)), ("self_attn.k_proj", (kv, hidden)),
                            ("self_attn.v_proj", (kv, hidden)), ("self_attn.o_proj", (hidden, q)),
                            ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                            ("mlp.down_proj", (hidden, inter))):
            tensors[p + name + ".weight"] = _weights(dims)
        for name, dim in (("self_attn.q_norm", head_dim), ("self_attn.k_norm", head_dim),
                          ("input_layernorm", hidden), ("post_attention_layernorm", hidden)):
            tensors[p + name + ".weight"] = _weights((dim,), norm=True)
    write_tensors(base / "model.safetensors", tensors)

    # the head: same width as the target; draft vocabulary = the first 32000 ids at most (the
    # published heads use 32000), so d2t = 0 and t2d marks those ids
    draft_vocab = min(vocab, 32000)
    hcfg = {"architectures": ["LlamaForCausalLMDart"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
            "vocab_size": vocab, "max_position_embeddings": 4096, "hidden_act": "silu", "num_hidden_layers": 1,
            "draft_length": draft_length, "draft_vocab_size": draft_vocab, "target_hidden_size": hidden}
    (head / "config.json").write_text(json.dumps(hcfg, indent=2) + "\n")
    htensors = {"fc.weight": _weights((hidden, 3 * hidden)), "midlayer.mask_rep": _weights((2 * hidden,)),
                "norm.weight": _weights((hidden,), norm=True), "lm_head.weight": _weights((draft_vocab, hidden)),
                "d2t": np.zeros(draft_vocab, np.int64), "t2d": np.arange(vocab) < draft_vocab}
    for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        htensors[f"midlayer.{name}.weight"] = _weights((hidden,), norm=True)
    for name, dims in (("q_proj", (q, 2 * hidden)), ("k_proj", (kv, 2 * hidden)), ("v_proj", (kv, 2 * hidden)),
                        ("o_proj", (hidden, q))):
        htensors[f"midlayer.self_attn.{name}.weight"] = _weights(dims)
    for name, dims in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
        htensors[f"midlayer.mlp.{name}.weight"] = _weights(dims)
    write_tensors(head / "model.safetensors", htensors)

    from dart_jax.ngram import Trie

    stream = zipf_tokens(rng, trie_tokens, len(tok))
    trie_path = folder / "ngram.trie"
    Trie.build([stream[i:i + 256] for i in range(0, len(stream), 256)], order=3).save(trie_path)
    return {"base": base, "dart": head, "ngram": trie_path}
