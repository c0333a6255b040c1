"""`python -m dart_jax.train --method eagle3` on a tiny target, against independent oracles: a
float64 NumPy restatement of the training-time-test loss (EAGLE's traineagle3 recipe), a random
head on held-out prompts (a trained one must draft better), plain greedy decoding (the exported
head, loaded like a published one, must not change it) and an uninterrupted run (a run killed
with SIGKILL resumes to the same bytes)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from dart_jax.bench.tiny import make_tiny_llama, make_tiny_tokenizer
from dart_jax.decoding.autoregressive import AutoregressiveDecoder
from dart_jax.decoding.driver import decode
from dart_jax.decoding.eagle3 import Eagle3Drafter, draft
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.models.checkpoints import load_eagle3_head, load_target
from dart_jax.models.head import HeadCache
from dart_jax.ngram import TreeSettings
from dart_jax.train.__main__ import differences, main
from dart_jax.train.data import load_tokenizer
from dart_jax.train.eagle3 import eagle3_loss, eagle3_tensors, new_eagle3_head, ttt_logits
from dart_jax.train.loop import set_vocab

from own_process import in_own_process


REPO = Path(__file__).resolve().parents[1]
VOCAB, EOS = 128, 2
COMMON = ["--method", "eagle3", "--draft-vocab", "64", "--max-length", "48", "--no-progress"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_eagle3") / "base"
    # a tiny Llama-family target (SmolLM2's family) whose greedy replies vary: wide weights and a
    # sharper final norm (peaked next-token distributions to learn)
    make_tiny_llama(folder, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, seed=1, std=0.2)
    make_tiny_tokenizer(folder, vocab_size=VOCAB)
    weights = load_file(folder / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] * 4
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def target(base):
    return load_target(base, dtype=jnp.float32)


def questions(n, seed):
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list("abcdefgh"), 6)) for _ in range(n)]


def write_data(path, n, seed):
    rng = np.random.default_rng(seed + 100)
    with open(path, "w") as f:
        for q in questions(n, seed):
            a = "".join(rng.choice(list("abcdefgh "), 20))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    return path


# ------------------------------------------------------------------------------------------------
# float64 NumPy restatement of the training-time test


class NumpyHead:
    """The head's layer from its checkpoint tensors (PyTorch [out, in] weights)."""

    def __init__(self, tensors, config, embedding):
        self.t = {k: np.asarray(v, np.float64) for k, v in tensors.items() if k not in ("d2t", "t2d")}
        self.c, self.emb = config, np.asarray(embedding, np.float64)
        d = config.head_dim
        self.inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))

    def rms(self, x, name):
        return self.t[name] * x / np.sqrt((x * x).mean(-1, keepdims=True) + self.c.rms_norm_eps)

    def rope(self, x, pos):  # x [T, heads, D]
        f = pos[:, None] * self.inv[None]
        cos, sin = np.cos(np.concatenate([f, f], -1))[:, None], np.sin(np.concatenate([f, f], -1))[:, None]
        half = x.shape[-1] // 2
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    def qkv(self, ids, hidden, pos):
        c, t = self.c, self.t
        x = np.concatenate([self.rms(self.emb[ids], "midlayer.input_layernorm.weight"),
                            self.rms(hidden, "midlayer.hidden_norm.weight")], -1)
        n, d = len(ids), c.head_dim
        q = self.rope((x @ t["midlayer.self_attn.q_proj.weight"].T).reshape(n, c.num_attention_heads, d), pos)
        k = self.rope((x @ t["midlayer.self_attn.k_proj.weight"].T).reshape(n, c.num_key_value_heads, d), pos)
        v = (x @ t["midlayer.self_attn.v_proj.weight"].T).reshape(n, c.num_key_value_heads, d)
        return q, k, v

    def attend(self, q, keys, values):  # q [heads, D], keys/values [S, KVH, D]
        rep = self.c.num_attention_heads // self.c.num_key_value_heads
        kk, vv = np.repeat(keys, rep, axis=1), np.repeat(values, rep, axis=1)
        s = np.einsum("hd,shd->hs", q, kk) / np.sqrt(self.c.head_dim)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hs,shd->hd", p, vv).reshape(-1)

    def finish(self, hidden, attn):
        t = self.t
        h = hidden + attn @ t["midlayer.self_attn.o_proj.weight"].T
        m = self.rms(h, "midlayer.post_attention_layernorm.weight")
        g, u = m @ t["midlayer.mlp.gate_proj.weight"].T, m @ t["midlayer.mlp.up_proj.weight"].T
        return h + (g / (1 + np.exp(-g)) * u) @ t["midlayer.mlp.down_proj.weight"].T

    def logits(self, h):
        return self.rms(h, "norm.weight") @ self.t["lm_head.weight"].T


def numpy_ttt(head: NumpyHead, taps, ids, steps):
    """Step k, row p: hidden = fc(taps[p]) at k = 0, else step k-1's output at p; the embedding
    of ids[p+1+k] (0 past the end); RoPE position p+k; it attends to the step-0 keys of rows
    0..p and to the keys of steps 1..k at row p."""
    t = len(ids)
    hidden = taps @ head.t["fc.weight"].T
    padded = np.concatenate([ids, np.zeros(steps + 1, ids.dtype)])
    first, own, out = None, [], []
    for k in range(steps):
        q, key, value = head.qkv(padded[k + 1:k + 1 + t], hidden, np.arange(t, dtype=np.float64) + k)
        if k == 0:
            first = key, value
        else:
            own.append((key, value))
        attn = np.stack([head.attend(q[p], np.concatenate([first[0][:p + 1]] + [kv[0][p:p + 1] for kv in own]),
                                     np.concatenate([first[1][:p + 1]] + [kv[1][p:p + 1] for kv in own]))
                         for p in range(t)])
        hidden = head.finish(hidden, attn)
        out.append(head.logits(hidden))
    return out


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def numpy_loss(draft_logits, target_logits, used, loss_mask, gamma):
    """Σ_k γ^k Σ_rows KL(q ‖ p) / (rows of step 0): row p of step k learns the target's distribution
    at p+1+k restricted to the draft vocabulary; it counts when p+2+k is on the loss mask and the
    target's argmax at p+1+k is a draft token."""
    t = len(loss_mask)
    in_draft = np.isin(np.argmax(target_logits, -1), used)
    log_q = log_softmax(target_logits[:, used])
    kl, count, correct = [], [], []
    for k, logits in enumerate(draft_logits):
        rows = [p for p in range(t - 2 - k) if loss_mask[p + 2 + k] and in_draft[p + 1 + k]]
        lq, lp = log_q[[p + 1 + k for p in rows]], log_softmax(logits[rows])
        kl.append(float(np.sum(np.exp(lq) * (lq - lp))))
        count.append(len(rows))
        correct.append(int(np.sum(np.argmax(lq, -1) == np.argmax(lp, -1))))
    return kl, count, correct


def test_loss_equals_numpy_restatement(target):
    steps, gamma, t = 4, 0.8, 14
    rng = np.random.default_rng(0)
    used = np.sort(rng.choice(VOCAB, 48, replace=False))
    head = new_eagle3_head(target, len(used), 10000.0, seed=3)
    set_vocab(head, used)
    # wider weights than the init's, so that every step's output differs from the last
    for _, var in nnx_params(head):
        var.set_value(var.get_value() + 0.3 * jnp.asarray(rng.standard_normal(var.get_value().shape), jnp.float32))
    ids = rng.integers(3, VOCAB, (2, t)).astype(np.int32)
    loss_mask = rng.random((2, t)) < 0.7
    batch = {"ids": jnp.asarray(ids), "loss_mask": jnp.asarray(loss_mask)}
    loss, sums = jax.jit(lambda h, tg, b, u: eagle3_loss(h, tg, b, u, gamma=gamma, steps=steps))(
        head, target, batch, jnp.asarray(used, jnp.int32))
    hidden, taps = target.forward_hidden(jnp.asarray(ids), return_taps=True)
    logits = np.asarray(target.lm_logits(hidden), np.float64)
    taps = np.asarray(taps, np.float64)
    got_steps = [np.asarray(x) for x in ttt_logits(head, jnp.asarray(taps, jnp.float32), jnp.asarray(ids), steps)]
    ref = NumpyHead(eagle3_tensors(head), head.config, target.embed_tokens.embedding.get_value())
    # step 0 is the head's own forward over the target's rows
    np.testing.assert_allclose(got_steps[0], np.asarray(head(jnp.asarray(taps, jnp.float32),
                                                             jnp.asarray(np.roll(ids, -1, 1)).at[:, -1].set(0))),
                               atol=1e-5, rtol=1e-5)
    kl, count, correct = np.zeros(steps), np.zeros(steps), np.zeros(steps)
    for b in range(2):
        want = numpy_ttt(ref, taps[b], ids[b], steps)
        for k in range(steps):
            np.testing.assert_allclose(got_steps[k][b], want[k], atol=1e-4, rtol=1e-4, err_msg=f"step {k}")
        kl_b, count_b, correct_b = numpy_loss(want, logits[b], used, loss_mask[b], gamma)
        kl, count, correct = kl + kl_b, count + count_b, correct + correct_b
    assert count[0] > 5 and count[-1] > 0
    np.testing.assert_array_equal(np.asarray(sums["count"]), count)
    np.testing.assert_array_equal(np.asarray(sums["correct"]), correct)
    np.testing.assert_allclose(np.asarray(sums["kl"]), kl, rtol=1e-4)
    np.testing.assert_allclose(float(loss), np.sum(gamma ** np.arange(steps) * kl) / count[0], rtol=1e-4)


def test_unrolled_steps_are_what_the_drafter_computes(target):
    """Drafting a greedy chain (top-1, the engine's EAGLE-3 draft) after n committed rows picks,
    at each depth, the argmax of the training-time-test step of the same depth at row n−1 when the
    sequence continues with that chain: training sees what drafting computes."""
    depth, n = 4, 9
    rng = np.random.default_rng(1)
    used = np.sort(rng.choice(VOCAB, 48, replace=False))
    head = new_eagle3_head(target, len(used), 10000.0, seed=6)
    set_vocab(head, used)
    for _, var in nnx_params(head):  # wide weights: a chain of distinct tokens
        var.set_value(var.get_value() + 1.0 * jnp.asarray(rng.standard_normal(var.get_value().shape), jnp.float32))
    prompt = rng.integers(3, VOCAB, n + 1).astype(np.int32)  # n committed rows, then the root token
    _, taps = target.forward_hidden(jnp.asarray(prompt[None, :n]), return_taps=True)
    cache = HeadCache(k=jnp.zeros((1, 32, 2, 8)), v=jnp.zeros((1, 32, 2, 8)))
    tree, _ = jax.jit(draft, static_argnames=("rows", "k", "nodes"))(
        head, taps, jnp.asarray(prompt[None, 1:]), cache, jnp.zeros(1, jnp.int32), jnp.full(1, n, jnp.int32),
        rows=depth + 1, k=1, nodes=depth + 2)
    chain = np.asarray(tree["tokens"])[0, 1:]  # the drafted tokens after the root, depth 1 … depth + 1
    assert (np.asarray(tree["positions"])[0] == np.arange(depth + 2)).all()
    seq = np.concatenate([prompt, chain])[None]
    _, taps = target.forward_hidden(jnp.asarray(seq), return_taps=True)
    steps = ttt_logits(head, taps, jnp.asarray(seq), depth + 1)
    picked = [int(used[np.argmax(np.asarray(step)[0, n - 1])]) for step in steps]
    assert picked == chain.tolist()
    assert len(set(chain.tolist())) > 1  # a chain that is not one token repeated


def nnx_params(head):
    """The head's trainable parameters (the target's embedding left out), with their paths."""
    return [(path, var) for path, var in nnx.iter_graph(head)
            if isinstance(var, nnx.Param) and "embed_tokens" not in [str(p) for p in path]]


# ------------------------------------------------------------------------------------------------
# a trained head: held-out acceptance, export, greedy decoding


@pytest.fixture(scope="module")
def trained(base, target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3_run")
    data = write_data(folder / "d.jsonl", 96, seed=0)
    out = folder / "run"
    main(["--base", str(base), "--data", str(data), "--out", str(out), *COMMON, "--ttt-steps", "3",
          "--batch-size", "4", "--epochs", "15", "--lr", "2e-2", "--warmup-steps", "2", "--save-every", "1000",
          "--log-every", "40", "--regenerate", "--regen-max-new", "24"])
    return SimpleNamespace(out=out, metrics=json.loads((out / "metrics.json").read_text()))


def plain_answer(decoder, prompt, n=24):
    """Plain greedy decoding of `prompt` by `decoder` (an AutoregressiveDecoder) through the pool driver."""
    return [t for event in decode(decoder, prompt, GenerationSettings(max_new_tokens=n)) for t in event.ids]


def held_out(base, target, head, prompts, decoder):
    """τ of greedy EAGLE-3 decoding (depth 3, 15 nodes) on `prompts`, checking each output against
    plain greedy decoding."""
    engine = Engine(target, Eagle3Drafter(head, depth=3), None, eos_ids=(EOS,), tree_eos_id=EOS,
                    tree=TreeSettings(keep=15, topk=4), shapes=ShapeSettings(min_bucket=64))
    counts = []
    for prompt in prompts:
        plain = plain_answer(decoder, prompt)
        got, accepted = [], []
        for kept, count in ((e.ids, e.accepted) for e in decode(engine, prompt, GenerationSettings(max_new_tokens=24), Stats())):
            got.extend(kept)
            accepted.append(count)
        assert got == plain
        counts += accepted[1:]  # the first is the prefill's token
    return float(np.mean(counts))


@pytest.mark.extended
def test_trained_head_loads_decodes_losslessly_and_beats_a_random_one(request):
    if in_own_process(request):
        return
    base, target, trained = (request.getfixturevalue(n) for n in ("base", "target", "trained"))
    assert trained.metrics["step"] == 360 and len(trained.metrics["alpha"]) == 3
    head = load_eagle3_head(trained.out / "head", target)  # where a published head loads
    config = json.loads((trained.out / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
    with np.load(trained.out / "vocab.npz") as f:
        used = f["used"]
    np.testing.assert_array_equal(np.asarray(head.d2t.get_value()) + np.arange(64), used)
    random_head = new_eagle3_head(target, 64, 10000.0, seed=5)
    set_vocab(random_head, used)

    tok = load_tokenizer(base)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for q in questions(4, seed=7)]  # not in the training data
    decoder = AutoregressiveDecoder(target, ShapeSettings(min_bucket=64), eos_ids=(EOS,))
    tau_trained = held_out(base, target, head, prompts, decoder)
    tau_random = held_out(base, target, random_head, prompts, decoder)
    assert tau_trained > tau_random + 0.2, (tau_trained, tau_random)

    # and the loss on those held-out replies
    seqs = [p + plain_answer(decoder, p) for p in prompts]
    width = max(map(len, seqs))
    ids = np.zeros((len(seqs), width), np.int32)
    mask = np.zeros((len(seqs), width), bool)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, :len(s)] = s
        mask[i, len(p):len(s)] = True
    batch = {"ids": jnp.asarray(ids), "loss_mask": jnp.asarray(mask)}
    loss = jax.jit(lambda h, b: eagle3_loss(h, target, b, jnp.asarray(used, jnp.int32), gamma=0.8, steps=3)[0])
    assert float(loss(head, batch)) < 0.8 * float(loss(random_head, batch))


# ------------------------------------------------------------------------------------------------
# kill -9 and resume


@pytest.mark.extended
def test_killed_run_resumes_to_the_uninterrupted_result(request):
    if in_own_process(request):
        return
    base, tmp_path, capsys = (request.getfixturevalue(n) for n in ("base", "tmp_path", "capsys"))
    data = write_data(tmp_path / "d.jsonl", 12, seed=1)
    args = ["--base", str(base), "--data", str(data), *COMMON, "--ttt-steps", "2", "--batch-size", "2",
            "--grad-accum", "2", "--epochs", "2", "--lr", "5e-3", "--save-every", "1"]
    main([*args, "--out", str(tmp_path / "a")])
    b = tmp_path / "b"
    run = subprocess.Popen([sys.executable, "-m", "dart_jax.train", *args, "--out", str(b)], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        deadline = time.monotonic() + 120
        # 12 micro-steps: kill once the third checkpoint is complete (mid-accumulation)
        while time.monotonic() < deadline and run.poll() is None:
            if any(p.name.isdigit() and int(p.name) >= 3 for p in (b / "ckpt").glob("*")):
                break
            time.sleep(0.02)
        assert run.poll() is None, run.stderr.read().decode()[-2000:]
        os.kill(run.pid, signal.SIGKILL)
    finally:
        run.kill()
        run.wait()
    assert not (b / "head").exists()
    capsys.readouterr()
    main([*args, "--out", str(b)])
    resumed = capsys.readouterr().err
    assert "resuming from micro-step" in resumed and "of 12" in resumed, resumed
    want, got = load_file(tmp_path / "a" / "head" / "model.safetensors"), load_file(b / "head" / "model.safetensors")
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_run_recorded_before_the_method_flag_resumes_as_dart():
    now = {"settings": {"lr": 1e-3, "method": "dart", "ttt_steps": 7, "gamma": 0.6}, "base": "b", "data": "d",
           "data_sha256": "0" * 64}
    before = {"settings": {"lr": 1e-3, "gamma": 0.6}, "base": "b", "data": "d", "data_sha256": "0" * 64}
    assert differences(before, now) == []  # before: the run.json of a trainer without --method
    assert differences(before, {**now, "settings": {**now["settings"], "method": "eagle3"}}) == ["--method dart → eagle3"]
