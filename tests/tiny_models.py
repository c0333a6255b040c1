"""Tiny random checkpoints written with transformers, laid out like hub snapshots."""
from __future__ import annotations

from pathlib import Path


def make_tiny_qwen3(folder, *, vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                    rope_theta=10000.0, max_position_embeddings=2048, seed=0, dtype="float32",
                    max_shard_size=None, **extra) -> Path:
    """Write a random HF Qwen3 (config.json + safetensors) to `folder` and return it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, head_dim=head_dim, tie_word_embeddings=tie_word_embeddings,
        rope_theta=rope_theta, max_position_embeddings=max_position_embeddings, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, **extra,
    )
    model = Qwen3ForCausalLM(config).eval()
    # random init of HF leaves tiny weights; widen them so that the logits are not flat
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    model = model.to(getattr(torch, dtype))
    folder = Path(folder)
    kwargs = {"safe_serialization": True}
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(folder, **kwargs)
    return folder


TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def make_tiny_tokenizer(folder, *, vocab_size=256) -> Path:
    """A character-level tokenizer of exactly `vocab_size` ids with a Qwen-style chat template.

    Ids 0, 1, 2 are <|endoftext|> (pad), <|im_start|> and <|im_end|> (EOS), as in make_tiny_qwen3's
    config; then printable ASCII characters; the rest are filler tokens <t{i}>.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    names = list(TINY_SPECIALS) + chars[: vocab_size - len(TINY_SPECIALS)]
    names += [f"<t{i}>" for i in range(vocab_size - len(names))]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(TINY_SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    folder = Path(folder)
    fast.save_pretrained(folder)
    return folder


def make_tiny_head(folder, base_folder, *, draft_length=3, draft_vocab_size=None, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=96, std=0.1, shuffle_d2t=False,
                   seed=0) -> Path:
    """A random DART head (reference layout: config.json + model.safetensors) for the tiny target
    in `base_folder`. The draft vocabulary is a random set of `draft_vocab_size` target ids, sorted
    by id as EAGLE-3 does, or in random order with `shuffle_d2t` (so that d2t is not trivial even
    when the draft vocabulary is the whole vocabulary)."""
    import json

    import numpy as np

    from dart_jax.convert.dart_head import tensor_table
    from dart_jax.convert.safetensors_io import write_tensors
    from dart_jax.head import DartHeadConfig

    base = json.loads((Path(base_folder) / "config.json").read_text())
    vocab, hidden = int(base["vocab_size"]), int(base["hidden_size"])
    draft_vocab = int(draft_vocab_size or vocab)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": intermediate_size, "num_attention_heads": num_attention_heads,
           "num_key_value_heads": num_key_value_heads, "head_dim": head_dim, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "rope_scaling": None, "vocab_size": vocab, "max_position_embeddings": 2048,
           "hidden_act": "silu", "draft_length": draft_length, "draft_vocab_size": draft_vocab,
           "target_hidden_size": hidden}
    config = DartHeadConfig.from_hf(cfg)
    rng = np.random.default_rng(seed)
    used = rng.choice(vocab, draft_vocab, replace=False)
    if not shuffle_d2t:
        used = np.sort(used)
    tensors = {}
    for name, (_, shape, _) in tensor_table(config).items():
        if name == "d2t":
            tensors[name] = (used - np.arange(draft_vocab)).astype(np.int64)
        elif name == "t2d":
            tensors[name] = np.isin(np.arange(vocab), used)
        elif name.endswith("norm.weight"):
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tensors(folder / "model.safetensors", tensors)
    return folder


def make_tiny_setup(folder, *, vocab_size=256, draft_length=3, draft_vocab_size=None, shuffle_d2t=False,
                    trie_streams=20, stream_length=64, seed=0, **qwen_kwargs) -> tuple[Path, Path, Path]:
    """Tiny base (with tokenizer), head and a 3-gram trie of random token streams under `folder`;
    returns (base folder, head folder, trie file)."""
    import numpy as np

    from dart_jax.ngram import Trie

    folder = Path(folder)
    base = make_tiny_qwen3(folder / "base", vocab_size=vocab_size, seed=seed, **qwen_kwargs)
    make_tiny_tokenizer(base, vocab_size=vocab_size)
    head = make_tiny_head(folder / "head", base, draft_length=draft_length, draft_vocab_size=draft_vocab_size,
                          shuffle_d2t=shuffle_d2t, seed=seed)
    rng = np.random.default_rng(seed)
    streams = [rng.integers(3, vocab_size, stream_length) for _ in range(trie_streams)]
    trie = folder / "ngram.trie"
    Trie.build(streams, order=3).save(trie)
    return base, head, trie
