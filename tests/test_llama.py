"""Llama-family targets: HF Llama folders and GGUF files, against transformers as the oracle
(LlamaForCausalLM on the same folder, and transformers' own GGUF reader on the same file)."""
from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, LlamaForCausalLM

from dart_jax import DartModel
from dart_jax.bench.tiny import make_tiny_head, make_tiny_llama, make_tiny_tokenizer
from dart_jax.convert import gguf_to_folder, load_target, load_target_config
from dart_jax.convert.qwen3 import Qwen3Config
from dart_jax.errors import FileFormatError, InputError
from dart_jax.ngram import Trie

from gguf_writer import write_gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")
TEXT = ("The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"
        "In 2024, 365 days; it's 12.5% more. Ünïcödé text and émojis 🙂 too. " * 8)
STRINGS = ["hello world", "def f(x):\n    return x * 2\n", "  two  spaces", "numbers 1234567 and 3.14",
           "it's don't we'll", "tabs\tand\nnewlines\n\n", "Ünïcödé 🙂", "<|im_start|>user\nhi<|im_end|>", "",
           "a" * 50, "MiXeD CaSe 99 bottles", "x=[1,2,3];print(x)"]


def logits_hf(folder, ids, **kw) -> np.ndarray:
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw).eval()
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def bpe_tokenizer(path) -> Tokenizer:
    """A byte-level BPE of a few hundred tokens with the chat specials first (ids 0, 1, 2)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    tok.save(str(path))
    return tok


VARIANTS = {
    "plain": {},
    "bias": {"attention_bias": True},
    "llama3_rope_untied": {"tie_word_embeddings": False, "max_position_embeddings": 512,
                           "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                               "rope_theta": 50000.0}},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_llama_logits_and_taps_match_transformers(tmp_path, variant):
    folder = make_tiny_llama(tmp_path / "llama", seed=3, **VARIANTS[variant])
    config = load_target_config(folder)
    assert config.model_type == "llama" and not config.qk_norm
    ids = np.random.default_rng(0).integers(0, 256, (2, 70))  # past the llama3 variant's original 64 positions
    ours = load_target(folder, dtype=jnp.float32)
    logits, taps = ours(jnp.asarray(ids), return_taps=True)
    ref = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        out = ref(torch.tensor(ids), output_hidden_states=True)
    np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), atol=1e-4, rtol=0)
    layers = config.num_hidden_layers
    expected = np.concatenate([out.hidden_states[i].numpy() for i in (2, layers // 2, layers - 3)], axis=-1)
    np.testing.assert_allclose(np.asarray(taps), expected, atol=1e-4, rtol=0)


def test_llama_with_biases_fused_matches_transformers(tmp_path):
    """The fused q/k/v kernel (a GPU's default layout, forced here) carries the attention biases too."""
    folder = make_tiny_llama(tmp_path / "llama", seed=4, attention_bias=True)
    ours = load_target(folder, dtype=jnp.float32, fused_projections=True)
    assert ours.fused_projections and ours.layers[0].self_attn.qkv_proj.bias is not None
    ids = np.random.default_rng(2).integers(0, 256, (2, 33))
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), logits_hf(folder, ids), atol=1e-4, rtol=0)


def test_qwen3_loader_refuses_a_llama_and_the_general_one_names_unknown_families(tmp_path):
    folder = make_tiny_llama(tmp_path / "llama")
    from dart_jax.models.checkpoints import load_qwen3

    with pytest.raises(ValueError, match="model_type"):
        load_qwen3(folder)
    cfg = json.loads((folder / "config.json").read_text())
    with pytest.raises(InputError, match="mistral"):
        from dart_jax.convert.qwen3 import target_config_from_hf
        target_config_from_hf({**cfg, "model_type": "mistral"})
    with pytest.raises(InputError, match="mlp_bias"):
        Qwen3Config.from_hf_llama({**cfg, "mlp_bias": True})


def make_gguf(tmp_path, quant: str, **kw):
    hf = make_tiny_llama(tmp_path / "hf", seed=5, vocab_size=384, **kw)
    tok = bpe_tokenizer(tmp_path / "tokenizer.json")
    gguf = write_gguf(tmp_path / f"tiny-{quant}.gguf", hf, tmp_path / "tokenizer.json", quant=quant, pre="gpt2",
                      chat_template=TEMPLATE, eos=2)
    return hf, tok, gguf


@pytest.mark.parametrize("quant", ["F32", "F16", "Q8_0", "Q4_1"])
def test_gguf_target_matches_transformers_reader(tmp_path, quant):
    _, _, gguf = make_gguf(tmp_path, quant)
    ids = np.random.default_rng(1).integers(0, 384, (1, 40))
    ours = np.asarray(load_target(gguf, dtype=jnp.float32)(jnp.asarray(ids)))
    # transformers' own GGUF reader (dequantization and q/k order undone independently of ours)
    np.testing.assert_allclose(ours, logits_hf(gguf.parent, ids, gguf_file=gguf.name), atol=1e-4, rtol=0)


def test_lossless_gguf_gives_the_original_model(tmp_path):
    """F32 tensors, q/k/v/o biases (which transformers' GGUF reader drops): the original logits."""
    hf, _, gguf = make_gguf(tmp_path, "F32", attention_bias=True)
    ids = np.random.default_rng(2).integers(0, 384, (1, 40))
    ours = np.asarray(load_target(gguf, dtype=jnp.float32)(jnp.asarray(ids)))
    np.testing.assert_allclose(ours, logits_hf(hf, ids), atol=1e-4, rtol=0)


def test_gguf_tokenizer_and_chat_template_match_transformers(tmp_path):
    _, tok, gguf = make_gguf(tmp_path, "F32")
    folder = gguf_to_folder(gguf, tmp_path / "converted", progress=False)
    ours = AutoTokenizer.from_pretrained(str(folder))
    theirs = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for text in STRINGS:
        assert ours(text, add_special_tokens=False)["input_ids"] == tok.encode(text).ids, text
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
        assert ours.decode(tok.encode(text).ids) == text
    chat = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n")
    assert ours.eos_token == "<|im_end|>" and json.loads((folder / "generation_config.json").read_text())[
        "eos_token_id"] == 2


def test_damaged_or_foreign_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(FileFormatError, match="bad.gguf"):
        load_target(bad)
    _, _, gguf = make_gguf(tmp_path, "F32")
    data = bytearray(gguf.read_bytes())
    data[-64:] = b"\xff" * 64  # NaN bytes inside the last tensor
    nan = tmp_path / "nan.gguf"
    nan.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match="NaN|infinite"):
        gguf_to_folder(nan, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_target(tmp_path / "missing.gguf")


def test_without_the_gguf_package_the_converters_import_and_a_gguf_file_names_the_fix(tmp_path):
    """An image without `gguf` (the GPU campaign's) still imports the package and its converters;
    only asking for a .gguf file fails, with the install command."""
    _, _, gguf = make_gguf(tmp_path, "F32")
    code = ("import sys; sys.modules['gguf'] = None; sys.modules['gguf.quants'] = None\n"
            "import dart_jax.convert as c, dart_jax.bench.tiny, dart_jax.api.model\n"
            "try:\n    c.gguf_to_folder(sys.argv[1], sys.argv[2], progress=False)\n"
            "except ImportError as e:\n    print('ERR', e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(gguf), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ERR" in done.stdout and "pip install gguf" in done.stdout and "tiny-F32.gguf" in done.stdout, done.stdout
    assert not (tmp_path / "out").exists()


def test_dart_on_a_llama_target_is_greedy_exact(tmp_path):
    """The engine, head and tree search work unchanged on a Llama base: greedy DART output equals
    plain greedy decoding of the target."""
    base = make_tiny_llama(tmp_path / "base", seed=7, attention_bias=True)
    make_tiny_tokenizer(base)
    head = make_tiny_head(tmp_path / "head", base, seed=7)
    rng = np.random.default_rng(7)
    trie = tmp_path / "ngram.trie"
    Trie.build([rng.integers(3, 256, 64) for _ in range(20)], order=3).save(trie)
    model = DartModel.from_pretrained(base, head, trie, keep=12, dtype="float32")
    for prompt in ("hello there", "abc abc abc"):
        dart = model.generate(prompt, max_new_tokens=24)
        plain = model.generate_ar(prompt, max_new_tokens=24)
        assert dart.token_ids == plain.token_ids


def test_gguf_conversion_is_cached_per_file_version(tmp_path):
    import os

    from dart_jax.convert import gguf_folder

    _, _, gguf = make_gguf(tmp_path, "F32")
    first = gguf_folder(gguf, cache_dir=tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert gguf_folder(gguf, cache_dir=tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a changed file gets a new conversion
    assert gguf_folder(gguf, cache_dir=tmp_path / "cache") != first
