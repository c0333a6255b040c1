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
