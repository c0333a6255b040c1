"""The trainer tests' tiny target: one shape for every train test file, so that an xdist worker
running several of them reuses the compiled programs."""
from safetensors.numpy import load_file, save_file

from dart_jax.bench.tiny import make_tiny_qwen3, make_tiny_tokenizer


def make_train_base(folder, *, sharp: bool = False):
    """A 4-layer Qwen3 of width 32 over a 128-token character tokenizer in `folder`; `sharp`
    scales the final norm by 8, giving the random target peaked next-token distributions."""
    make_tiny_qwen3(folder, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    make_tiny_tokenizer(folder, vocab_size=128)
    if sharp:
        weights = load_file(folder / "model.safetensors")
        weights["model.norm.weight"] = weights["model.norm.weight"] * 8
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder
