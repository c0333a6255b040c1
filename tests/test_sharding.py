"""Sharded inference on a Mesh of 8 forced CPU devices, against the single-device run.

The checks run in ONE subprocess (XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set
before jax is imported; this test process stays on one device), on a tiny model from
`make_tiny_setup`: each check there compares a sharded result with the same computation on a
single device (its own independent run) and records its name when it passed, in order; the
tests here read that record, so the first failing test names the check that failed and shows
its traceback. The training check (slow: two training runs) runs `python -m dart_jax.train`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r'''
    import json, os, sys, time
    import numpy as np
    import jax, jax.numpy as jnp
    if os.environ.get("DART_JAX_TEST_XLA_CACHE"):  # the test run's persistent cache (tests/conftest.py)
        jax.config.update("jax_compilation_cache_dir", os.environ["DART_JAX_TEST_XLA_CACHE"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    from flax import nnx
    from dart_jax.api.model import DartModel
    from dart_jax.bench.tiny import make_tiny_setup
    from dart_jax.errors import InputError
    from dart_jax.models.checkpoints import load_qwen3
    from dart_jax.models.sharding import make_mesh

    assert len(jax.devices()) == 8, jax.devices()
    t0 = time.perf_counter()
    base, head, trie = make_tiny_setup(sys.argv[1], vocab_size=64, draft_length=3, seed=3, num_hidden_layers=3,
                                       std=0.2, tie_word_embeddings=False)
    results = {}

    def done(name):
        global t0
        results[name] = round(time.perf_counter() - t0, 2)
        print(name, results[name], flush=True)
        t0 = time.perf_counter()

    def spec_of(array):
        spec = tuple(array.sharding.spec)
        return spec + (None,) * (array.ndim - len(spec))

    def shard_bytes(array):
        return max(s.data.nbytes for s in array.addressable_shards)

    # a mesh that does not divide the heads is an InputError naming the option, before any read
    for call in (lambda: load_qwen3(base, mesh="model=4"),
                 lambda: DartModel.from_pretrained(base, head, trie, mesh="model=4", keep=8)):
        try:
            call()
        except InputError as e:
            assert "mesh" in str(e) and "num_key_value_heads = 2" in str(e), e
        else:
            raise AssertionError("model=4 over 2 KV heads was accepted")
    import contextlib, io
    from dart_jax.api.generate import main as generate_main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = generate_main(["--base", str(base), "--ckpt", str(head), "--ngram", str(trie), "--mesh", "model=4",
                              "--no-compile-cache", "--keep", "8"])
    assert code == 2 and "error: mesh (--mesh): " in err.getvalue() and "Traceback" not in err.getvalue(), err.getvalue()
    for spec in ("model=16", "model=two", "tensor=2", "model=2,model=2"):
        try:
            make_mesh(spec)
        except InputError as e:
            assert "mesh" in str(e), e
        else:
            raise AssertionError(f"{spec} was accepted")
    done("errors")

    # forward, fp32: single device vs model=2 and data=2,model=2 (within 1e-5)
    single = load_qwen3(base, dtype="float32")
    model = DartModel.from_pretrained(base, head, trie, mesh="data=2,model=2", keep=8, dtype="float32")
    forward = nnx.jit(lambda m, x: m(x, return_taps=True))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)), jnp.int32)
    want_logits, want_taps = (np.asarray(a) for a in forward(single, ids))
    for target in (load_qwen3(base, dtype="float32", mesh="model=2"), model.target):
        mesh = target.embed_tokens.embedding.get_value().sharding.mesh
        q = target.layers[0].self_attn.q_proj.kernel.get_value()
        assert spec_of(q) == (None, "model") and shard_bytes(q) * 2 == q.nbytes, q.sharding
        emb = target.embed_tokens.embedding.get_value()
        assert spec_of(emb) == ("model", None) and shard_bytes(emb) * 2 == emb.nbytes, emb.sharding
        batch = jax.device_put(ids, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
            "data" if "data" in mesh.shape else None)))
        logits, taps = forward(target, batch)
        assert len(logits.sharding.device_set) == mesh.size
        np.testing.assert_allclose(np.asarray(logits), want_logits, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(taps), want_taps, atol=1e-5, rtol=1e-5)
    done("forward")

    # DART greedy on data=2,model=2, batch 2, against greedy decoding of the single-device target
    prompts, gen = ["hello there", "abc abc abc"], dict(max_new_tokens=10, max_length=48, batch_size=2, chat=False)
    results_ = model.generate(prompts, **gen)
    got = [r.token_ids for r in results_]
    # warm: the same generation again compiles nothing (the caches come back with their shardings)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    again = [r.token_ids for r in model.generate(prompts, **gen)]
    assert again == got and compiles == [], (again, got, compiles)
    eos = set(model.engine.eos_ids)
    logits_at = jax.jit(lambda x: single(x))
    want = []
    for r in results_:
        seq, new = list(r.prompt_ids), []
        while len(new) < 10 and not (new and new[-1] in eos):
            padded = np.zeros((1, 32), np.int32)
            padded[0, :len(seq)] = seq
            new.append(int(np.argmax(np.asarray(logits_at(jnp.asarray(padded)))[0, len(seq) - 1])))
            seq.append(new[-1])
        want.append(new)
    assert got == want, (got, want)
    assert len({t for row in want for t in row}) > 2, want  # a test of something: not one repeated token
    done("generate")

    # plain decoding's pool on the same mesh: the same greedy tokens; warm, it compiles nothing
    plain = [r.token_ids for r in model.generate(prompts, method="ar", **gen)]
    compiles.clear()
    again = [r.token_ids for r in model.generate(prompts, method="ar", **gen)]
    assert plain == want and again == want and compiles == [], (plain, again, want, compiles)
    done("plain")

    # the head's params and both caches are sharded, each device holding a fraction
    kernel = model.head.midlayer.self_attn.q_proj.kernel.get_value()
    assert spec_of(kernel) == (None, "model") and shard_bytes(kernel) * 2 == kernel.nbytes, kernel.sharding
    held = model.engine.pool._held
    assert held is not None, "the pool kept no caches"
    cache, draft_cache = held[2]
    for array, spec in ((cache.k, (None, "data", None, "model", None)), (draft_cache.k, ("data", None, "model", None))):
        assert spec_of(array) == spec, (array.shape, array.sharding)
        assert shard_bytes(array) * 4 == array.nbytes, (shard_bytes(array), array.nbytes)
    done("placement")
    print("RESULTS " + json.dumps(results))
''')


pytestmark = pytest.mark.xdist_group("sharding")  # one worker runs the one subprocess


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path_factory.mktemp("sharding"))], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    return proc, json.loads(lines[-1].removeprefix("RESULTS ")) if lines else {}


@pytest.mark.parametrize("check", ["errors", "forward", "generate", "plain", "placement"])
def test_sharded_matches_single_device(sharded_run, check):
    proc, results = sharded_run
    assert check in results, f"check {check!r} did not pass:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.slow  # two short training runs, about 35 s
def test_training_with_the_target_sharded_over_model_matches_one_device(tmp_path):
    """`python -m dart_jax.train --mesh data=2,model=2` (the batch over 2 devices, the frozen target
    over 2 more) trains the same head as one device."""
    import numpy as np
    from safetensors.numpy import load_file

    from dart_jax.bench.tiny import make_tiny_head, make_tiny_qwen3, make_tiny_tokenizer

    base = make_tiny_qwen3(tmp_path / "base", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    make_tiny_tokenizer(base, vocab_size=128)
    rng = np.random.default_rng(2)
    with open(tmp_path / "d.jsonl", "w") as f:
        for _ in range(4):
            q, a = "".join(rng.choice(list("abcdefgh"), 6)), "".join(rng.choice(list("abcdefgh "), 24))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    init = make_tiny_head(tmp_path / "init", base, draft_length=3, draft_vocab_size=64, head_dim=8)
    args = ["--base", str(base), "--data", str(tmp_path / "d.jsonl"), "--draft-length", "3", "--max-length", "48",
            "--anchors-per-seq", "8", "--no-progress", "--batch-size", "2", "--epochs", "1", "--lr", "5e-3",
            "--init-head", str(init)]
    code = ("import jax; jax.config.update('jax_default_matmul_precision', 'highest'); import sys; "
            "from dart_jax.train.__main__ import main; main(sys.argv[1:])")
    for name, devices, extra in (("one", 1, []), ("mesh", 4, ["--mesh", "data=2,model=2"])):
        env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}",
                   JAX_PLATFORMS="cpu")
        subprocess.run([sys.executable, "-c", code, *args, *extra, "--out", str(tmp_path / name)], check=True, env=env,
                       capture_output=True)
    one = load_file(tmp_path / "one" / "head" / "model.safetensors")
    sharded = load_file(tmp_path / "mesh" / "head" / "model.safetensors")
    for name in one:
        np.testing.assert_allclose(sharded[name], one[name], rtol=1e-4, atol=1e-5, err_msg=name)
