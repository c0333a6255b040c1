"""The tiny-checkpoint builder (dart_jax.bench.tiny) writes what transformers reads whole: no
missing, unexpected or misshapen tensors, single-file or sharded, float32 or bfloat16. The parity
tests rely on this, since transformers only warns about such keys."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from dart_jax.bench.tiny import CHAT_TEMPLATE, make_tiny_head, make_tiny_qwen3, make_tiny_setup
from dart_jax.convert.dart_head import read_head
from dart_jax.convert.qwen3 import load_qwen3_config, save_qwen3
from dart_jax.convert.safetensors_io import read_tensors, write_tensors

SMALL = dict(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8)


def hf_load(folder):
    model, info = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    return model, info


def assert_loads_whole(folder):
    """transformers finds every tensor it expects and nothing else, and holds exactly our values."""
    model, info = hf_load(folder)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"], info["error_msgs"]) == (
        set(), set(), set(), [])
    state = model.state_dict()
    for name, array in read_tensors(folder).items():
        np.testing.assert_array_equal(state[name].numpy(), np.asarray(array, np.float32), err_msg=name)
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_transformers_loads_every_tensor(tmp_path, tied):
    folder = make_tiny_qwen3(tmp_path / "single", tie_word_embeddings=tied, **SMALL)
    model = assert_loads_whole(folder)
    assert model.config.tie_word_embeddings is tied
    assert ("lm_head.weight" in read_tensors(folder)) is not tied


def test_transformers_loads_a_sharded_bfloat16_checkpoint(tmp_path):
    folder = make_tiny_qwen3(tmp_path / "sharded", tie_word_embeddings=False, dtype="bfloat16",
                             max_shard_size_bytes=2_000, **SMALL)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(shards) > 2 and sorted(set(index["weight_map"].values())) == shards
    tensors = read_tensors(folder)
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tensors.values())
    assert all(a.dtype == ml_dtypes.bfloat16 for a in tensors.values())
    # a shard is over the limit only when it holds a single tensor that is
    for shard in shards:
        held = [a for n, a in tensors.items() if index["weight_map"][n] == shard]
        assert sum(a.nbytes for a in held) <= 2_000 or len(held) == 1
    assert_loads_whole(folder)


def test_the_loading_check_sees_a_missing_tensor(tmp_path):
    """The assertion above is not vacuous: transformers does report a tensor the file lacks."""
    folder = make_tiny_qwen3(tmp_path / "gap", **SMALL)
    tensors = read_tensors(folder)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    write_tensors(folder / "model.safetensors", tensors)
    _, info = hf_load(folder)
    assert info["missing_keys"] == {"model.layers.1.mlp.up_proj.weight"}


def test_save_qwen3_refuses_tensors_that_do_not_match_the_config(tmp_path):
    folder = make_tiny_qwen3(tmp_path / "ok", **SMALL)
    config = json.loads((folder / "config.json").read_text())
    tensors = read_tensors(folder)
    with pytest.raises(ValueError, match=r"missing \['model\.norm\.weight'\]"):
        save_qwen3(tmp_path / "a", config, {k: v for k, v in tensors.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match=r"unexpected \['lm_head\.weight'\]"):
        save_qwen3(tmp_path / "b", config, {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]})
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*shape \(15,\).*\(16,\)"):
        save_qwen3(tmp_path / "c", config, {**tensors, "model.norm.weight": tensors["model.norm.weight"][:-1]})
    assert not any((tmp_path / name).exists() for name in "abc")


def test_setup_tokenizer_head_and_trie(tmp_path):
    base, head, trie = make_tiny_setup(tmp_path, vocab_size=SMALL["vocab_size"], shuffle_d2t=True,
                                       **{k: v for k, v in SMALL.items() if k != "vocab_size"})
    tok = AutoTokenizer.from_pretrained(base)
    assert [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert (tok.eos_token_id, tok.pad_token_id, len(tok), tok.chat_template) == (2, 0, 40, CHAT_TEMPLATE)
    _, config, tensors = read_head(head, load_qwen3_config(base))
    assert config.draft_vocab_size == 40 and sorted(np.arange(40) + tensors["d2t"]) == list(range(40))
    assert not np.array_equal(tensors["d2t"], np.zeros(40))
    subset = make_tiny_head(tmp_path / "subset", base, draft_vocab_size=10, seed=3)
    _, _, sub = read_head(subset)
    used = np.arange(10) + sub["d2t"]
    assert np.all(np.diff(used) > 0) and np.array_equal(np.flatnonzero(sub["t2d"]), used)
    assert trie.is_file()
