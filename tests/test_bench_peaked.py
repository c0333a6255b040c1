"""The peaked LM head of the benchmarks' random sets (`bench.tiny`'s module docstring).

Oracle: plain NumPy over the saved weights. A batch of random final hidden states (RMS-normalised
Gaussians times the final norm's weight, what the LM head sees) goes through the LM head; the
argmax must be a hot token with a margin (top-1 minus top-2 logit) of a good part of the logit
spread. A Gaussian head over 151 936 ids (the plain law) gives a median margin of ~0.15 σ and a
hot argmax almost never, so each check fails without the peaked rows. The device-drawn set
(`bench.e2e.random_model`) must scale the same rows by the same factor.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from dart_jax.bench.e2e import random_model
from dart_jax.bench.shapes import TINY_SHAPE
from dart_jax.bench.tiny import HOT_SCALE, HOT_TOKENS, build_random_assets, hot_token_ids, lm_head_name
from dart_jax.convert.safetensors_io import read_tensors

# the real vocabulary (where the plain law's near-ties are many) at a width that writes in a blink
WIDE_VOCAB = {**TINY_SHAPE, "vocab_size": 151936, "hidden_size": 32, "intermediate_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": False}


def lm_head_of(base) -> tuple[np.ndarray, np.ndarray, dict]:
    """(LM head [V, H] as float32, final norm weight, config.json) of a written random target."""
    config = json.loads((base / "config.json").read_text())
    name = lm_head_name(bool(config["tie_word_embeddings"]))
    tensors = read_tensors(base, [name, "model.norm.weight"])
    return tensors[name].astype(np.float32), tensors["model.norm.weight"].astype(np.float32), config


def margins(head: np.ndarray, norm: np.ndarray, rows: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(argmax, (top-1 − top-2) / logit std) for `rows` random final hidden states."""
    x = np.random.default_rng(seed).standard_normal((rows, head.shape[1])).astype(np.float32)
    h = norm * x / np.sqrt((x * x).mean(axis=1, keepdims=True))
    logits = h @ head.T
    top2 = np.sort(logits, axis=1)[:, -2:]
    return logits.argmax(axis=1), (top2[:, 1] - top2[:, 0]) / logits.std(axis=1)


@pytest.mark.parametrize("shape", [None, WIDE_VOCAB], ids=["small-tied", "wide-vocab-untied"])
def test_the_random_targets_argmax_has_a_wide_margin(tmp_path, shape):
    paths = build_random_assets(tmp_path, layers=3, hidden=32, shape=shape, seed=5)
    head, norm, config = lm_head_of(paths["base"])
    vocab = int(config["vocab_size"])
    hot = hot_token_ids(vocab, 5)
    assert len(set(hot.tolist())) == HOT_TOKENS
    # never a special id: EOS (generation would stop at once), pad, or any id past the byte tokens
    eos = json.loads((paths["base"] / "generation_config.json").read_text())["eos_token_id"]
    assert not set(hot.tolist()) & {*eos, config["pad_token_id"]} and hot.max() < 256
    # the hot rows are HOT_SCALE times the others (the same law otherwise)
    cold = np.delete(head, hot, axis=0)
    assert head[hot].std() / cold.std() == pytest.approx(HOT_SCALE, rel=0.1)
    top, margin = margins(head, norm)
    assert np.isin(top, hot).mean() >= 0.98
    assert np.median(margin) >= 1.0  # the plain law: ~0.15 at this vocabulary
    assert np.percentile(margin, 10) >= 0.1
    # another seed, other hot ids
    assert set(hot_token_ids(vocab, 6).tolist()) != set(hot.tolist())


def test_the_device_drawn_set_peaks_the_same_rows(tmp_path):
    paths = build_random_assets(tmp_path, layers=3, shape=TINY_SHAPE, seed=2, weights=False)
    model = random_model(paths, 2, keep=4)
    target = model.engine.target
    # [H, V] on every backend here: the LM head, or the CPU's untied copy of the embedding
    kernel = np.asarray(target.lm_head.kernel.get_value()).astype(np.float32) if target.lm_head is not None else \
        np.asarray(target.embed_tokens.embedding.get_value()).astype(np.float32).T
    hot = hot_token_ids(TINY_SHAPE["vocab_size"], 2)
    cold = np.delete(kernel, hot, axis=1)
    assert kernel[:, hot].std() / cold.std() == pytest.approx(HOT_SCALE, rel=0.15)
    norm = np.asarray(target.norm.weight.get_value()).astype(np.float32)
    top, margin = margins(kernel.T, norm)
    assert np.isin(top, hot).mean() >= 0.98 and np.median(margin) >= 1.0
