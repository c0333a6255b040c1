"""Write a Llama checkpoint as llama.cpp's converter would (a test helper, independent of
dart_jax.convert.gguf): its tensor names, its q/k row order, its metadata keys, a byte-level BPE
tokenizer as token/merge lists, and a chosen quantization per tensor."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.numpy import load_file

NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
         "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight"}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of q/k rows: per head, the two rotary halves interleaved pairwise."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, n, rest = name.split(".", 3)
    return f"blk.{n}.{NAMES[rest]}"


def write_gguf(path: Path, hf_folder: Path, tokenizer_json: Path, *, quant: str = "F32", pre: str = "smollm",
               chat_template: str | None = None, bos: int | None = None, eos: int = 2,
               add_bos: bool = False, head_count_kv: int | None = None, extra_merges: tuple[str, ...] = ()) -> Path:
    """`hf_folder` (config.json + model.safetensors of a Llama) and a byte-level BPE
    tokenizer.json as a GGUF file; weight matrices quantized as `quant` (F32, F16, Q8_0, Q4_1),
    norms kept in F32 as llama.cpp does. `head_count_kv` and `extra_merges` write damaged
    metadata (another head_count_kv than the weights', merges after the tokenizer's)."""
    cfg = json.loads((hf_folder / "config.json").read_text())
    tensors = load_file(str(hf_folder / "model.safetensors"))
    tok = json.loads(Path(tokenizer_json).read_text())
    w = GGUFWriter(str(path), "llama")
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv if head_count_kv is None else head_count_kv)
    w.add_rope_freq_base(float(cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = tok["model"]["vocab"]
    specials = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    tokens = [None] * cfg["vocab_size"]
    for text, i in {**vocab, **specials}.items():
        tokens[i] = text
    types = [3 if t in specials else 1 for t in tokens]
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], types[i] = f"[PAD{i}]", 5  # unused ids (the embedding is wider than the vocabulary)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges + list(extra_merges))
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    if chat_template:
        w.add_chat_template(chat_template)
    qtype = GGMLQuantizationType[quant]
    for name, array in tensors.items():
        array = np.asarray(array, np.float32)
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            array = llama_cpp_permute(array, heads)
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            array = llama_cpp_permute(array, kv)
        if array.ndim == 1 or qtype == GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), array)
        elif qtype == GGMLQuantizationType.F16:
            w.add_tensor(gguf_name(name), array.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), quantize(array, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
