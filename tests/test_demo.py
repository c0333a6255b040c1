"""The shipped offline demo: its assets load, DART reproduces plain greedy decoding of the demo
target, and the trained head actually speeds up acceptance (τ well above 1)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import dart_jax

DEMO = Path(dart_jax.__file__).parent / "demo"


def test_demo_assets_are_shipped():
    for rel in ("base/config.json", "base/model.safetensors", "base/tokenizer.json", "head/config.json",
                "head/model.safetensors", "ngram.trie"):
        assert (DEMO / rel).is_file(), rel


def test_demo_cli_is_lossless_and_accepts_long_runs():
    env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "dart_jax.generate", "--compare-ar", "--json", "--no-warmup", "--max-new-tokens", "48",
         "--prompt", "How is a head trained?", "--keep", "16"],  # a fixed tree: every step drafts
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    # the AR baseline is the oracle: plain greedy decoding of the same target
    assert out["token_ids"] == out["ar"]["token_ids"]
    assert out["greedy_match"] is True
    assert len(out["token_ids"]) == 48 or out["token_ids"][-1] in (2, 0)
    assert out["stats"]["tau"] > 3.0, out["accept_lengths"]
