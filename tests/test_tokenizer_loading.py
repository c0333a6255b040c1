"""A damaged tokenizer.json (the tokenizers library raises a bare Exception) is one clear
FileFormatError naming the file, wherever a tokenizer is loaded: the Python API, training, the
n-gram builder (issue 42)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dart_jax.bench.tiny import CHAT_TEMPLATE, EOS, PAD, make_byte_tokenizer, make_tiny_tokenizer
from dart_jax.errors import FileFormatError, MissingFileError, load_tokenizer_folder

DEMO = Path(__file__).resolve().parents[1] / "dart_jax" / "demo"
DAMAGES = {"truncated": lambda text: text[: len(text) // 2],
           "wrong structure": lambda text: json.dumps({"model": {"type": "BPE", "vocab": 5}}),
           "no model": lambda text: json.dumps({"added_tokens": []}),
           "deep": lambda text: "[" * 100000 + "]" * 100000,
           "zeroed": lambda text: "\0" * len(text)}


@pytest.fixture(params=list(DAMAGES))
def damaged_base(tmp_path, request):
    base = tmp_path / "base"
    shutil.copytree(DEMO / "base", base)
    path = base / "tokenizer.json"
    path.write_text(DAMAGES[request.param](path.read_text()))
    return base


def test_the_intact_tokenizer_loads(tmp_path):
    tok = load_tokenizer_folder(DEMO / "base")
    assert tok.decode(tok.encode("hello", add_special_tokens=False)) == "hello"


def test_the_loader_names_the_damaged_file(damaged_base):
    with pytest.raises(FileFormatError, match=r"tokenizer\.json: .*restore it"):
        load_tokenizer_folder(damaged_base)


def test_a_folder_without_tokenizer_files(tmp_path):
    with pytest.raises(MissingFileError, match="no usable tokenizer"):
        load_tokenizer_folder(tmp_path)


def test_the_api_names_it(damaged_base):
    from dart_jax import DartModel

    with pytest.raises(FileFormatError, match=r"tokenizer\.json"):
        DartModel.from_pretrained(damaged_base, DEMO / "head", DEMO / "ngram.trie", dtype="float32")


def test_training_names_it(damaged_base):
    from dart_jax.train.data import load_tokenizer

    with pytest.raises(FileFormatError, match=r"tokenizer\.json"):
        load_tokenizer(damaged_base)


def test_the_ngram_builder_names_it_in_one_error_line(damaged_base, tmp_path):
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "hello world"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "dart_jax.ngram", "build", str(text), "--tokenizer", str(damaged_base),
                           "--out", str(tmp_path / "t.trie")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "tokenizer.json" in lines[0], done.stderr


# texts that reach the byte-level pre-tokenizers' corners: spaces, newlines, digits, contractions,
# non-ASCII letters, and the chat tokens inside plain text
TEXTS = ["hello", "Hello, world!  Two  spaces\nand a newline\r\n", "it's 2026: 12345 + 67",
         "Grüße, café, naïve — ünïcödé", "<|im_start|>user\nhi<|im_end|>", " leading and trailing ", ""]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}]


def _model_config(folder: Path, model_type: str) -> Path:
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 1000}))
    return folder


def _qwen2_tokenizer(folder: Path) -> Path:
    """A Qwen-style tokenizer folder as real Qwen3 checkpoints ship it (tokenizer_class
    Qwen2Tokenizer, whose own __init__ rebuilds the byte-level BPE from vocab and merges): merges
    trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TEXTS * 3 + ["the quick brown fox jumps over the lazy dog"] * 5,
                            trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                special_tokens=[PAD, "<|im_start|>", EOS]))
    spec = json.loads(bpe.to_str())["model"]
    tok = Qwen2Tokenizer(vocab=spec["vocab"], merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                                      for m in spec["merges"]], eos_token=EOS, pad_token=PAD)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return folder


def _pretrained_fast(folder: Path) -> Path:
    """A Llama 3 / SmolLM2-style folder: tokenizer_class PreTrainedTokenizerFast (what the GGUF
    converter writes too) over a byte-level tokenizer."""
    make_byte_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


FOLDERS = {"demo (TokenizersBackend, qwen3)": lambda tmp: DEMO / "base",
           "character-level, llama": lambda tmp: _model_config(make_tiny_tokenizer(tmp), "llama"),
           "byte-level, qwen3_moe": lambda tmp: _model_config(make_byte_tokenizer(tmp) and tmp, "qwen3_moe"),
           "PreTrainedTokenizerFast, llama": lambda tmp: _model_config(_pretrained_fast(tmp), "llama"),
           "PreTrainedTokenizerFast, qwen3": lambda tmp: _model_config(_pretrained_fast(tmp), "qwen3"),
           "Qwen2Tokenizer, qwen3": lambda tmp: _model_config(_qwen2_tokenizer(tmp), "qwen3")}


@pytest.mark.parametrize("kind", list(FOLDERS))
def test_the_tokenizer_is_autotokenizers(tmp_path, kind):
    """The loader's tokenizer is the one AutoTokenizer builds (the oracle) from the same folder: its
    class, settings, vocabulary, special tokens, chat template and every encoding and decoding."""
    from transformers import AutoTokenizer

    folder = FOLDERS[kind](tmp_path)
    tok, ref = load_tokenizer_folder(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(tok) is type(ref)
    assert tok.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert tok.init_kwargs == ref.init_kwargs and tok.get_vocab() == ref.get_vocab() and len(tok) == len(ref)
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id, tok.all_special_tokens, tok.chat_template) == \
        (ref.eos_token_id, ref.pad_token_id, ref.bos_token_id, ref.all_special_tokens, ref.chat_template)
    for text in TEXTS:
        for special in (False, True):
            ids = tok(text, add_special_tokens=special)["input_ids"]
            assert ids == ref(text, add_special_tokens=special)["input_ids"], (text, special)
            assert tok.decode(ids, skip_special_tokens=special) == ref.decode(ids, skip_special_tokens=special)
    if ref.chat_template:
        assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
            ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def test_a_known_family_skips_the_auto_machinery():
    """The demo's tokenizer loads without transformers' Auto modules (which import every family's
    config, and torch where installed): the loader's point, checked in a fresh process."""
    code = ("import sys; from dart_jax.errors import load_tokenizer_folder; load_tokenizer_folder(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.startswith('transformers.models.auto')))")
    done = subprocess.run([sys.executable, "-c", code, str(DEMO / "base")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_another_family_goes_through_autotokenizer(tmp_path):
    """A family the loader's table does not know is AutoTokenizer's to decide (here the hub class of
    a Qwen2 model, which AutoTokenizer replaces by its registered class)."""
    from transformers import AutoTokenizer

    folder = _model_config(_pretrained_fast(tmp_path), "qwen2")
    tok, ref = load_tokenizer_folder(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(tok) is type(ref) and type(ref).__name__ == "Qwen2Tokenizer"
