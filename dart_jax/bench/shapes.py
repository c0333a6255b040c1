"""`shapes` mode: the target's verify step for several tree budgets against a 1-token decode step
(one host call per token) and against a token of plain decoding's device loop (the honest baseline).

The cost of a speculative step is one target pass over the root plus `budget` tree nodes; this
mode measures it on a given Qwen3 shape with random weights, so no checkpoint is needed.
Attention is dense over the static shapes, so the timing does not depend on the tree's mask.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.bench.util import progress, summary_ms, time_calls
from dart_jax.convert.configs import read_json_object
from dart_jax.convert.qwen3 import target_config_from_hf
from dart_jax.decoding.autoregressive import AutoregressiveDecoder, attention_window, split_flat
from dart_jax.decoding.engine import verify_tree
from dart_jax.decoding.sampling import vocab_argmax
from dart_jax.decoding.settings import GenerationSettings
from dart_jax.decoding.state import PoolState
from dart_jax.models.qwen3 import (Qwen3, check_attention, check_verify_gemms, init_cache, use_backend_layout,
                                   verify_compiler_options)
from dart_jax.models.sharding import check_fits, make_mesh, model_sizes, shard_module, sharded_caches

_QWEN3_COMMON = {"vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "max_position_embeddings": 40960, "head_dim": 128, "num_key_value_heads": 8,
                 "hidden_act": "silu", "model_type": "qwen3", "attention_bias": False}

# the published Qwen3 dense checkpoints' config.json fields that set the compute shape
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "Qwen3-1.7B": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "Qwen3-4B": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": True},
    "Qwen3-8B": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": False},
    "Qwen3-14B": {"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40,
                  "num_attention_heads": 40, "tie_word_embeddings": False},
    "Qwen3-32B": {"hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "tie_word_embeddings": False},
}
KNOWN_SHAPES = {name: {**_QWEN3_COMMON, **fields} for name, fields in KNOWN_SHAPES.items()}
# the published Qwen3-MoE checkpoint's fields (docs/spec.md §2.2): 48 layers, every one sparse;
# apart from KNOWN_SHAPES, whose dense shapes the end-to-end benchmark's random models also take
MOE_SHAPES: dict[str, dict[str, Any]] = {}
MOE_SHAPES["Qwen3-30B-A3B"] = {
    **_QWEN3_COMMON, "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "tie_word_embeddings": False,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": []}

# small enough to compile and run in seconds on a CPU
TINY_SHAPE = {**_QWEN3_COMMON, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 4096, "tie_word_embeddings": True}


def shape_fields(*, model: str | None = None, config_path: str | None = None, tiny: bool = False,
                 layers: int | None = None, vocab: int | None = None) -> tuple[str, dict[str, Any]]:
    """(a label, HF config.json fields) for the shape to benchmark."""
    if sum(bool(x) for x in (model, config_path, tiny)) > 1:
        raise ValueError("pass only one of --model, --config and --tiny")
    if config_path:
        path = Path(config_path)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; pass a Qwen3 config.json or its folder")
        fields, label = read_json_object(path, "a Qwen3 config.json"), str(path)
    elif tiny:
        fields, label = dict(TINY_SHAPE), "tiny"
    else:
        name = model or "Qwen3-8B"
        known = {**KNOWN_SHAPES, **MOE_SHAPES}
        if name not in known:
            raise ValueError(f"unknown model shape {name!r}; known: {', '.join(known)} (or pass --config/--tiny)")
        fields, label = dict(known[name]), name
    if layers is not None:
        if layers < 3:
            raise ValueError(f"--layers must be >= 3 (the taps read layers 2, L//2 and L-3), got {layers}")
        fields["num_hidden_layers"] = layers
        label += f" ({layers} layers)"
    if vocab is not None:
        if vocab < 2:
            raise ValueError(f"--vocab must be >= 2, got {vocab}")
        fields["vocab_size"] = vocab
        label += f" (vocab {vocab})"
    return label, fields


def param_count(f: dict[str, Any]) -> int:
    config = target_config_from_hf(f)
    h, i, L, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    d = config.head_dim
    qo = 2 * h * config.num_attention_heads * d
    kv = 2 * h * config.num_key_value_heads * d
    sparse = sum(config.sparse_layer(n) for n in range(L))
    experts = config.num_experts * (3 * h * config.moe_intermediate_size) + h * config.num_experts  # and the router
    mlps = (L - sparse) * 3 * h * i + sparse * experts
    return L * (qo + kv + 2 * h + 2 * d) + mlps + v * h * (1 if config.tie_word_embeddings else 2) + h


def _check_memory(fields: dict[str, Any], itemsize: int, cache_bytes: int, devices: int = 1) -> None:
    """Refuse shapes that cannot fit before allocating them, with the flags that make them fit
    (spread over `devices` devices of a mesh: about an equal share on each)."""
    need = (param_count(fields) * itemsize + cache_bytes) / devices
    device = jax.devices()[0]
    limit = None
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        limit = int(stats["bytes_limit"])
    elif device.platform == "cpu" and hasattr(os, "sysconf"):
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if limit and need > 0.85 * limit:
        raise ValueError(f"this shape needs about {need / 2**30:.1f} GiB for weights and cache but the device has "
                         f"{limit / 2**30:.1f} GiB; cut it with --layers N, --vocab N or --context N, or use --tiny")


def run_shapes(*, model: str | None = None, config_path: str | None = None, tiny: bool = False,
               layers: int | None = None, vocab: int | None = None, budgets=(1, 8, 16, 32, 60), context: int = 512,
               batch: int = 1, dtype: str | None = None, reps: int = 10, warmup: int = 2, seed: int = 0,
               show_progress: bool = True, mesh=None, verify_gemms: str = "auto",
               attention: str = "xla") -> dict[str, Any]:
    """Median time of a verify step (root + `budget` nodes) per budget, and of a 1-token decode step;
    with `mesh` (a spec such as "model=4" or a Mesh) the weights and the cache are sharded over it;
    each verify is compiled as an engine with `verify_gemms` compiles its step; the target attends
    as `attention` says (`Qwen3.use_attention`), decoding included."""
    if context < 1 or batch < 1:
        raise ValueError(f"--context and --batch must be >= 1, got {context} and {batch}")
    gemms = check_verify_gemms(verify_gemms)
    label, fields = shape_fields(model=model, config_path=config_path, tiny=tiny, layers=layers, vocab=vocab)
    dtype = dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    jdtype = jnp.dtype(dtype)
    check_attention(attention, jdtype, mesh)
    config = target_config_from_hf(fields)
    mesh = make_mesh(mesh, option="--mesh")
    check_fits(mesh, model_sizes(config), option="--mesh")
    max_len = context + max(max(budgets) + 1, AutoregressiveDecoder.chunk)
    kv_heads, head_dim = fields["num_key_value_heads"], fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    cache_bytes = 2 * fields["num_hidden_layers"] * batch * max_len * kv_heads * head_dim * jdtype.itemsize
    _check_memory(fields, jdtype.itemsize, cache_bytes, mesh.size if mesh is not None else 1)

    bar = progress(1 + (4 + len(budgets)) * (reps + warmup), "shapes", show_progress)
    target = Qwen3(config, dtype=jdtype, param_dtype=jdtype, rngs=nnx.Rngs(seed))
    if mesh is not None:
        shard_module(target, mesh)
    else:
        use_backend_layout(target)  # as the loaders do, so the figures are the engine's
    target.use_attention(attention)
    decoder = AutoregressiveDecoder(target)
    model, state = split_flat(target)  # called as the engine calls its step: the state as a flat tuple
    bar.update()

    def verify(state, tree, cache, cache_len):
        # the engine's verification; the argmax keeps the lm_head in the timing as acceptance reads it
        logits, taps, tree_kv = verify_tree(model.merge(state), tree, cache, cache_len)
        return vocab_argmax(logits), taps, tree_kv

    rng = np.random.default_rng(seed)
    lengths = np.full((batch,), context, np.int32)
    cache_len = jnp.asarray(lengths)
    if mesh is None:
        cache = init_cache(config, batch, max_len, jdtype)
    else:
        cache = sharded_caches(lambda: (init_cache(config, batch, max_len, jdtype),), mesh)[0]
    params, keys = GenerationSettings.sampling_rows([GenerationSettings(seed=seed)] * batch)
    # the pool's state as the decoder's programs take it (donated: each call's next one is kept here)
    holder = {"state": PoolState(cache, None, jnp.asarray(lengths), keys, params)}
    window = attention_window(context + 1, max_len)

    def at_context():
        # every call decodes at `context`: the lengths the last call advanced are set back (from the host)
        return holder["state"].replace(cache_len=jnp.asarray(lengths))

    def decode_call():
        token = jnp.asarray(rng.integers(0, fields["vocab_size"], size=(batch,)), jnp.int32)
        out, holder["state"] = decoder.decode(decoder.state, token, at_context(), window=window)
        return out

    chunk = AutoregressiveDecoder.chunk
    remaining = jnp.full((batch,), chunk, jnp.int32)
    no_eos = jnp.full((1,), -1, jnp.int32)  # never sampled: every loop runs all `chunk` steps
    loop_window = attention_window(context + chunk, max_len)

    def plain_call():
        # plain decoding as the honest baseline runs it: `chunk` tokens in one device loop
        token = jnp.asarray(rng.integers(0, fields["vocab_size"], size=(batch,)), jnp.int32)
        out, _, _, holder["state"] = decoder.decode_chunk(decoder.state, token, at_context(), remaining, no_eos,
                                                          window=loop_window, chunk=chunk)
        return out

    def verify_call(tokens, options):
        ids = jnp.asarray(rng.integers(0, fields["vocab_size"], size=(batch, tokens)), jnp.int32)
        # ancestors-or-self of a chain: any tree of this size costs the same with dense attention
        tree = {"tokens": ids, "positions": jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32), (batch, tokens)),
                "mask": jnp.broadcast_to(jnp.tril(jnp.ones((tokens, tokens), bool)), (batch, tokens, tokens))}
        run = jax.jit(verify, compiler_options=options)  # as the engine compiles a step of these rows
        return lambda: run(state, tree, holder["state"].cache, cache_len)

    def timed(call):
        return summary_ms(time_calls(call, reps=reps, warmup=warmup, tick=bar.update))

    # what a host call costs besides its device work: a call of one tiny array, and a call that
    # takes every weight array (and the cache) as the step does and reads one element
    small = jnp.zeros((batch,), jnp.int32)
    empty = jax.jit(lambda x: x + 1)
    weights = jax.jit(lambda state, cache: state[0].ravel()[0], keep_unused=True)
    calls = {"empty": timed(lambda: empty(small)), "weights": timed(lambda: weights(state, holder["state"].cache))}
    base = timed(decode_call)
    loop = {key: v / chunk for key, v in timed(plain_call).items()}  # per token
    rows = [{"kind": "decode", "name": "", "budget": 0, "tokens": 1, **base, "ratio_to_decode": 1.0,
             "ratio_to_plain": base["median_ms"] / loop["median_ms"]},
            {"kind": "plain", "name": "", "budget": 0, "tokens": 1, **loop, "ratio_to_decode": loop["median_ms"] / base["median_ms"],
             "ratio_to_plain": 1.0}]
    rows += [{"kind": "call", "name": name, "budget": 0, "tokens": 0, **t, "ratio_to_decode": t["median_ms"] / base["median_ms"],
              "ratio_to_plain": t["median_ms"] / loop["median_ms"]} for name, t in calls.items()]
    for budget in budgets:
        options = verify_compiler_options(batch * (budget + 1), choice=gemms)
        t = timed(verify_call(budget + 1, options))
        rows.append({"kind": "verify", "name": "", "budget": budget, "tokens": budget + 1, **t,
                     "gemms": "cublas" if options else "xla",
                     "ratio_to_decode": t["median_ms"] / base["median_ms"],
                     "ratio_to_plain": t["median_ms"] / loop["median_ms"]})
    bar.close()
    config_out = {"shape": label, "fields": fields, "params": param_count(fields), "dtype": dtype,
                  "context": context, "batch": batch, "reps": reps, "warmup": warmup, "seed": seed,
                  "verify_gemms": gemms, "attention": attention, "mesh": None if mesh is None else dict(mesh.shape),
                  "backend": jax.default_backend()}
    verify_rows = [r for r in rows if r["kind"] == "verify"]
    summary = {"decode_ms": base["median_ms"], "plain_token_ms": loop["median_ms"],
               "call_ms": {name: t["median_ms"] for name, t in calls.items()},
               "verify_ms": {str(r["budget"]): r["median_ms"] for r in verify_rows},
               "ratio_to_decode": {str(r["budget"]): r["ratio_to_decode"] for r in verify_rows},
               "ratio_to_plain": {str(r["budget"]): r["ratio_to_plain"] for r in verify_rows}}
    return {"mode": "shapes", "config": config_out, "rows": rows, "summary": summary}
