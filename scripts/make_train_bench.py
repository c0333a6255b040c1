"""A base and data for timing `python -m dart_jax.train` at the SmolLM2-135M shape without its weights.

Writes FOLDER/base (a random Llama of SmolLM2-135M's shape: 30 layers, hidden 576, MLP 1536,
9 heads of 64 over 3 KV heads, vocabulary 49 152, tied embeddings; a character-level tokenizer)
and FOLDER/data.jsonl (N conversations of about 340 tokens, the demo's mean). The weights are
random, so only the timings mean something; the commands that use it are in benchmarks/RESULTS.md.

    python scripts/make_train_bench.py /tmp/train_bench --conversations 24
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from dart_jax.bench.tiny import make_tiny_llama, make_tiny_tokenizer

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
               max_position_embeddings=8192, tie_word_embeddings=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    base = args.folder / "base"
    make_tiny_llama(base, **SMOLLM2, seed=args.seed)
    make_tiny_tokenizer(base, vocab_size=SMOLLM2["vocab_size"])
    rng = np.random.default_rng(args.seed)
    letters = list("abcdefghijklmnopqrstuvwxyz     ")
    with open(args.folder / "data.jsonl", "w") as f:
        for _ in range(args.conversations):
            question = "".join(rng.choice(letters, int(rng.integers(40, 80))))
            answer = "".join(rng.choice(letters, int(rng.integers(220, 300))))
            f.write(json.dumps({"messages": [{"role": "user", "content": question},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    print(f"wrote {base} and {args.folder / 'data.jsonl'}")


if __name__ == "__main__":
    main()
