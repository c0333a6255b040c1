"""EAGLE-3 as the engine's second drafter, against independent oracles: a float64 NumPy
restatement of the published head's forward, a plain-Python restatement of the reference's tree
construction (EAGLE's `topK_genrate`), greedy decoding of the target, and the exact target
distribution under sampling (docs/spec.md §9)."""
from __future__ import annotations

import collections
import json
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from dart_jax.bench.tiny import make_tiny_qwen3, make_tiny_tokenizer
from dart_jax.decoding.driver import Driver, decode
from dart_jax.decoding.eagle3 import Eagle3Drafter, draft
from dart_jax.decoding.engine import Engine
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.errors import FileFormatError
from dart_jax.models.checkpoints import load_eagle3_head, load_qwen3
from dart_jax.models.head import HeadCache
from dart_jax.ngram import TreeSettings
from test_engine import prefill_lm_heads

# one xdist worker for the file: the engine tests share the compiled prefill and step
pytestmark = pytest.mark.xdist_group("eagle3")

VOCAB, DRAFT_VOCAB, HIDDEN, EOS = 32, 24, 64, 2
PROMPTS = [[5, 9, 14, 3, 27], list(range(3, 20)), [7, 7, 21, 30, 11, 4, 8, 19, 25]]


def write_eagle3(folder: Path, *, hidden=HIDDEN, target_hidden=HIDDEN, vocab=VOCAB, draft_vocab=DRAFT_VOCAB,
                 heads=4, kv_heads=2, head_dim=16, inter=96, own_embedding=False, seed=0, drop=(), reshape=None,
                 std=0.25) -> Path:
    """A random EAGLE-3 head in the published layout (LlamaForCausalLMEagle3 config.json +
    model.safetensors with PyTorch [out, in] weights, d2t int64 offsets, t2d bool)."""
    rng = np.random.default_rng(seed)
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"fc.weight": (hidden, 3 * target_hidden), "norm.weight": (hidden,), "lm_head.weight": (draft_vocab, hidden),
              "midlayer.hidden_norm.weight": (hidden,), "midlayer.input_layernorm.weight": (hidden,),
              "midlayer.post_attention_layernorm.weight": (hidden,),
              "midlayer.self_attn.q_proj.weight": (q, 2 * hidden), "midlayer.self_attn.k_proj.weight": (kv, 2 * hidden),
              "midlayer.self_attn.v_proj.weight": (kv, 2 * hidden), "midlayer.self_attn.o_proj.weight": (hidden, q),
              "midlayer.mlp.gate_proj.weight": (inter, hidden), "midlayer.mlp.up_proj.weight": (inter, hidden),
              "midlayer.mlp.down_proj.weight": (hidden, inter)}
    if own_embedding:
        shapes["embed_tokens.weight"] = (vocab, hidden)
    tensors = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32)
        tensors[name] = 1 + 0.1 * x if name.endswith("norm.weight") else std * x
    used = rng.permutation(np.sort(rng.choice(vocab, draft_vocab, replace=False)))
    tensors["d2t"] = (used - np.arange(draft_vocab)).astype(np.int64)
    tensors["t2d"] = np.isin(np.arange(vocab), used)
    for name in drop:
        tensors.pop(name)
    for name, shape in (reshape or {}).items():
        tensors[name] = np.zeros(shape, np.float32)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "rope_scaling": None, "max_position_embeddings": 2048, "hidden_act": "silu", "vocab_size": vocab,
              "draft_vocab_size": draft_vocab, "pretraining_tp": 1, "torch_dtype": "float32"}
    if target_hidden != hidden:
        config["target_hidden_size"] = target_hidden
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


# ------------------------------------------------------------------------------------------------
# float64 NumPy restatement of the reference head (EAGLE's cnets.py: Model.forward + midlayer)


class RefHead:
    def __init__(self, folder: Path, embedding: np.ndarray | None):
        self.cfg = json.loads((folder / "config.json").read_text())
        self.t = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in
                  load_file(str(folder / "model.safetensors")).items()}
        self.emb = self.t.get("embed_tokens.weight", embedding)
        d = self.cfg["head_dim"]
        self.inv = 1.0 / (self.cfg["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))

    def rms(self, x, name):
        return self.t[name] * x / np.sqrt((x * x).mean(-1, keepdims=True) + self.cfg["rms_norm_eps"])

    def rope(self, x, pos):  # x [T, heads, D]
        f = pos[:, None] * self.inv[None]
        cos, sin = np.cos(np.concatenate([f, f], -1)), np.sin(np.concatenate([f, f], -1))
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    def fc(self, taps):
        return taps @ self.t["fc.weight"].T

    def rows(self, ids, hidden, pos, past_k, past_v, mask):
        """The layer over T rows (target ids of the next tokens, hidden [T,H]) after cached keys
        → (out [T,H], keys, values incl. these rows); mask [T, P+T]."""
        c, t = self.cfg, self.t
        heads, kvh, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        x = np.concatenate([self.rms(self.emb[ids], "midlayer.input_layernorm.weight"),
                            self.rms(hidden, "midlayer.hidden_norm.weight")], -1)
        q = self.rope((x @ t["midlayer.self_attn.q_proj.weight"].T).reshape(len(ids), heads, d), pos)
        k = self.rope((x @ t["midlayer.self_attn.k_proj.weight"].T).reshape(len(ids), kvh, d), pos)
        v = (x @ t["midlayer.self_attn.v_proj.weight"].T).reshape(len(ids), kvh, d)
        keys, values = np.concatenate([past_k, k]), np.concatenate([past_v, v])
        rep = heads // kvh
        kk, vv = np.repeat(keys, rep, axis=1), np.repeat(values, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, kk) / np.sqrt(d)
        s = np.where(mask[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out = np.einsum("hts,shd->thd", p, vv).reshape(len(ids), heads * d)
        h = hidden + out @ t["midlayer.self_attn.o_proj.weight"].T
        m = self.rms(h, "midlayer.post_attention_layernorm.weight")
        g, u = m @ t["midlayer.mlp.gate_proj.weight"].T, m @ t["midlayer.mlp.up_proj.weight"].T
        return h + (g / (1 + np.exp(-g)) * u) @ t["midlayer.mlp.down_proj.weight"].T, keys, values

    def logp(self, h):
        z = self.rms(h, "norm.weight") @ self.t["lm_head.weight"].T
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    def to_target(self, ids):
        return ids + self.t["d2t"][ids] if "d2t" in self.t else ids


def ref_tree(head: RefHead, taps, next_ids, total_token, depth, top_k):
    """EAGLE's topK_genrate in plain Python: the committed rows, `depth` draft steps over the
    growing tree, the best total_token - 1 nodes, then its mask, positions and retrieve rows
    (sorted as under sampling)."""
    n = len(next_ids)
    kvh, d = head.cfg["num_key_value_heads"], head.cfg["head_dim"]
    empty = np.zeros((0, kvh, d))
    h, keys, values = head.rows(next_ids, head.fc(taps), np.arange(n, dtype=np.float64), empty, empty,
                                np.tril(np.ones((n, n), bool)))
    last = h[-1]
    lp = head.logp(last)
    top = list(np.argsort(-lp, kind="stable")[:top_k])
    scores = lp[top]
    scores_list, parents_list, tokens_list = [scores], [np.array([0])], [head.to_target(np.array(top))]
    ids = head.to_target(np.array(top))
    hidden = np.repeat(last[None], top_k, 0)
    tree_mask = np.eye(top_k, dtype=bool)
    fed = np.arange(top_k)
    position = n
    for i in range(depth):
        mask = np.concatenate([np.ones((top_k, keys.shape[0] - tree_mask.shape[1] + top_k), bool), tree_mask], 1)
        out, keys, values = head.rows(ids, hidden, np.full(top_k, position, np.float64), keys, values, mask)
        position += 1
        bias = 1 + top_k ** 2 * max(0, i - 1) + (top_k if i > 0 else 0)
        parents_list.append(fed + bias)
        lp = head.logp(out)
        child = np.argsort(-lp, axis=1, kind="stable")[:, :top_k]
        cu = np.take_along_axis(lp, child, 1) + scores[:, None]
        fed = np.argsort(-cu.ravel(), kind="stable")[:top_k]
        scores = cu.ravel()[fed]
        parent_rows = fed // top_k
        hidden = out[parent_rows]
        ids = head.to_target(child.ravel()[fed])
        tokens_list.append(head.to_target(child))
        scores_list.append(cu)
        tree_mask = np.concatenate([tree_mask[parent_rows], np.eye(top_k, dtype=bool)], 1)
    all_scores = np.concatenate([s.ravel() for s in scores_list])
    all_tokens = np.concatenate([t.ravel() for t in tokens_list])
    total = total_token - 1
    chosen = np.sort(np.argsort(-all_scores, kind="stable")[:total])
    tokens = np.concatenate([[next_ids[-1]], all_tokens[chosen]])
    draft_parents = np.concatenate(parents_list)[chosen // top_k]
    mask_index = np.searchsorted(chosen, draft_parents - 1)
    mask_index[draft_parents == 0] = -1
    mask_index = mask_index + 1
    mask = np.eye(total + 1, dtype=bool)
    mask[:, 0] = True
    for i in range(total):
        mask[i + 1] |= mask[mask_index[i]]
    positions = mask.sum(1) - 1
    noleaf = set(mask_index.tolist())
    retrieve = []
    for i in range(total + 1):
        if i not in noleaf:
            path, cid = [], i
            for _ in range(positions[i] + 1):
                path.append(cid)
                cid = mask_index[cid - 1]
            retrieve.append(path[::-1])
    retrieve.sort(key=lambda row: row + [total + 5] * (depth + 2 - len(row)))
    # the margin between the last kept score and the first dropped one (a near-tie could flip)
    ranked = np.sort(all_scores)[::-1]
    return SimpleNamespace(tokens=tokens, parents=np.concatenate([[-1], mask_index]), positions=positions, mask=mask,
                           retrieve=retrieve, margin=ranked[total - 1] - ranked[total])


# ------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3")
    base = make_tiny_qwen3(folder / "base", vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=4, seed=2)
    make_tiny_tokenizer(base, vocab_size=VOCAB)
    head_dir = write_eagle3(folder / "eagle3")
    target = load_qwen3(base, dtype=jnp.float32)
    head = load_eagle3_head(head_dir, target)
    embedding = load_file(str(base / "model.safetensors"))["model.embed_tokens.weight"].astype(np.float64)
    return SimpleNamespace(folder=folder, base=base, head_dir=head_dir, target=target, head=head,
                           ref=RefHead(head_dir, embedding))


@jax.jit
def forward(head, taps, ids):
    return head(taps, ids)


def test_draft_logits_equal_numpy_restatement(tiny, tmp_path):
    rng = np.random.default_rng(1)
    n = 11
    taps = rng.standard_normal((2, n, 3 * HIDDEN)).astype(np.float32)
    ids = rng.integers(0, VOCAB, (2, n))
    got = np.asarray(forward(tiny.head, jnp.asarray(taps), jnp.asarray(ids)))
    for b in range(2):
        h, _, _ = tiny.ref.rows(ids[b], tiny.ref.fc(taps[b].astype(np.float64)), np.arange(n, dtype=np.float64),
                                np.zeros((0, 2, 16)), np.zeros((0, 2, 16)), np.tril(np.ones((n, n), bool)))
        z = tiny.ref.rms(h, "norm.weight") @ tiny.ref.t["lm_head.weight"].T
        np.testing.assert_allclose(got[b], z, atol=1e-5, rtol=1e-5)
    # a head with its own embedding and a width other than the target's (fc reads 3 x target width)
    own = write_eagle3(tmp_path / "own", hidden=48, head_dim=12, own_embedding=True, seed=5)
    head = load_eagle3_head(own, tiny.target)
    ref = RefHead(own, None)
    got = np.asarray(forward(head, jnp.asarray(taps[:1]), jnp.asarray(ids[:1])))[0]
    h, _, _ = ref.rows(ids[0], ref.fc(taps[0].astype(np.float64)), np.arange(n, dtype=np.float64),
                       np.zeros((0, 2, 12)), np.zeros((0, 2, 12)), np.tril(np.ones((n, n), bool)))
    np.testing.assert_allclose(got, ref.rms(h, "norm.weight") @ ref.t["lm_head.weight"].T, atol=1e-5, rtol=1e-5)


def check_tree(got: dict, b: int, want, nodes: int):
    np.testing.assert_array_equal(got["tokens"][b], want.tokens)
    np.testing.assert_array_equal(got["parents"][b], want.parents)
    np.testing.assert_array_equal(got["positions"][b], want.positions)
    np.testing.assert_array_equal(got["mask"][b], want.mask)
    leaves = int(got["num_leaves"][b])
    assert leaves == len(want.retrieve)
    rows = [[int(x) for x in row if x >= 0] for row in got["retrieve"][b][:leaves]]
    assert rows == want.retrieve
    assert (got["retrieve"][b][leaves:] == -1).all()


@pytest.mark.parametrize("total_token,depth,top_k", [(60, 7, 10), pytest.param(25, 3, 4, marks=pytest.mark.slow)])
def test_trees_equal_reference_construction(tiny, total_token, depth, top_k):
    """Two sequences of different lengths (the second padded), drafted in two calls: the prompt's
    rows (prefill) and then three more rows after them (a step's accepted rows, over the cache)."""
    rng = np.random.default_rng(total_token)
    n, split = 13, 10
    lengths = np.array([n, n - 4])
    taps = rng.standard_normal((2, n, 3 * HIDDEN)).astype(np.float32)
    ids = rng.integers(0, VOCAB, (2, n)).astype(np.int32)
    cache = HeadCache(k=jnp.zeros((2, 64, 2, 16)), v=jnp.zeros((2, 64, 2, 16)))
    run = jax.jit(draft, static_argnames=("rows", "k", "nodes"))
    kw = dict(rows=depth + 1, k=top_k, nodes=total_token)
    first = np.array([split, split - 4])
    _, cache = run(tiny.head, jnp.asarray(taps[:, :split]), jnp.asarray(ids[:, :split]), cache,
                   jnp.zeros(2, jnp.int32), jnp.asarray(first), **kw)
    # the step's rows padded to the prefill's shape (one compilation); rows past the third are junk
    later = rng.standard_normal((2, split, 3 * HIDDEN)).astype(np.float32), rng.integers(0, VOCAB, (2, split))
    for b in range(2):
        later[0][b, :3] = taps[b, first[b]:first[b] + 3]
        later[1][b, :3] = ids[b, first[b]:first[b] + 3]
    tree, _ = run(tiny.head, jnp.asarray(later[0]), jnp.asarray(later[1]), cache, jnp.asarray(first),
                  jnp.full(2, 3, jnp.int32), **kw)
    tree = jax.device_get(tree)
    for b in range(2):
        want = ref_tree(tiny.ref, taps[b, :lengths[b]].astype(np.float64), ids[b, :lengths[b]], total_token, depth,
                        top_k)
        assert want.margin > 1e-4, "a near-tie at the selection boundary: pick another seed"
        check_tree(tree, b, want, total_token)


# ------------------------------------------------------------------------------------------------
# the engine with EAGLE-3 drafts


@pytest.fixture(scope="module")
def engine(tiny):
    return Engine(tiny.target, Eagle3Drafter(tiny.head), None, eos_ids=(EOS,), tree_eos_id=EOS,
                  tree=TreeSettings(keep=59, topk=10), shapes=ShapeSettings(min_bucket=64))


def dart_steps(engine):
    """One sequence decoded alone through the pool driver: (prompt, settings, stats=) → (new ids,
    accepted length) per step."""
    return lambda prompt, settings, stats=None: ((e.ids, e.accepted) for e in decode(engine, prompt, settings, stats))


def run(steps_fn, prompt, **kwargs):
    stats = Stats()
    ids, counts = [], []
    for kept, accepted in steps_fn(prompt, GenerationSettings(**kwargs), stats=stats):
        ids.extend(kept)
        counts.append(accepted)
    return ids, counts[1:], stats


@pytest.fixture(scope="module")
def hf(tiny):
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()


def hf_greedy(hf, prompt, max_new_tokens):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=EOS, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# compiles the engine's prefill and step with the EAGLE-3 draft (the exactness check the default run keeps);
# the last prompt spans three prefill chunks, the first two of which draft nothing
def test_greedy_eagle3_equals_greedy_target(engine, hf):
    accepted = 0
    long_prompt = [int(t) for t in np.random.default_rng(3).integers(3, VOCAB, 150)]
    for prompt in PROMPTS + [long_prompt]:
        eagle, counts, stats = run(dart_steps(engine), prompt, max_new_tokens=24)
        assert eagle == hf_greedy(hf, prompt, 24)
        assert all(1 <= c <= 9 for c in counts) and stats.steps == len(counts)
        accepted += sum(c - 1 for c in counts)
    assert accepted > 0, "no draft token was ever accepted: the test would not exercise the tree"


def test_a_prefill_chunk_that_no_prompt_ends_in_drafts_nothing(tmp_path):
    """EAGLE-3's draft tree (its LM head over the draft vocabulary at the root and in the loop) and
    the target's LM head run only in a prompt's last chunk (vocabularies of 97 and 53 ids, widths
    no other matmul has): a chunk where no row's prompt ends takes a branch without any."""
    base = make_tiny_qwen3(tmp_path / "base", vocab_size=97, hidden_size=HIDDEN, num_hidden_layers=3)
    target = load_qwen3(base, dtype=jnp.float32)
    head = load_eagle3_head(write_eagle3(tmp_path / "eagle3", vocab=97, draft_vocab=53), target)
    engine = Engine(target, Eagle3Drafter(head, depth=2), None, eos_ids=(EOS,), tree_eos_id=EOS,
                    tree=TreeSettings(keep=7, topk=4), shapes=ShapeSettings(min_bucket=32))
    assert prefill_lm_heads(engine, {97, 53}) == {"engine": (0, 3), "baseline": (0, 1)}


def exact_first_tokens(hf, prompt, length, temperature, top_p, top_k):
    """P(first `length` generated tokens) from the transformers model with the reference's warpers."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    def probs(seq):
        with torch.no_grad():
            scores = hf(torch.tensor([seq])).logits[:, -1].float()
        scores = TopKLogitsWarper(top_k)(None, TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, scores)))
        return torch.softmax(scores, -1)[0].numpy().astype(np.float64)

    dist = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, w in dist.items():
            p = probs(prompt + list(seq))
            for t in np.flatnonzero(p > 0):
                nxt[seq + (int(t),)] = w * p[t]
        dist = nxt
    return dist


def chi_square(observed: dict, expected: dict, n: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom, outcomes expected fewer than 5 times pooled."""
    big = [k for k, p in expected.items() if n * p >= 5]
    obs = [observed.get(k, 0) for k in big] + [n - sum(observed.get(k, 0) for k in big)]
    exp = [n * expected[k] for k in big] + [n * (1 - sum(expected[k] for k in big))]
    return sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0), len(obs) - 1


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square(df) (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


@pytest.mark.slow  # 240 generations: ~20 s on a loaded 2-core CPU
def test_sampling_keeps_the_target_distribution(engine, hf):
    prompt, temperature, top_p, top_k = PROMPTS[0], 1.3, 0.95, 3
    exact = exact_first_tokens(hf, prompt, 3, temperature, top_p, top_k)
    n = 240
    counter = collections.Counter()
    accepted = 0
    for seed in range(n):
        ids, counts, _ = run(dart_steps(engine), prompt, max_new_tokens=3, temperature=temperature, top_p=top_p,
                             top_k=top_k, seed=seed)
        counter[tuple(ids)] += 1
        accepted += sum(c - 1 for c in counts)
    assert accepted > n // 2, "the test needs drafts to be accepted to exercise the rejection sampling"
    assert set(counter) <= set(exact), set(counter) - set(exact)
    stat, df = chi_square(counter, exact, n)
    assert stat < chi_square_critical(df), (stat, df)


# ------------------------------------------------------------------------------------------------
# loading errors


@pytest.mark.parametrize("change,expected", [
    (dict(drop=("norm.weight",)), "missing tensors ['norm.weight']"),
    (dict(reshape={"midlayer.self_attn.q_proj.weight": (64, 100)}),
     "midlayer.self_attn.q_proj.weight has shape (64, 100), the config implies (64, 128)"),
    (dict(reshape={"midlayer.extra.weight": (3,)}), "unexpected tensors ['midlayer.extra.weight']"),
    (dict(drop=("d2t",)), "missing tensors ['d2t']"),
])
def test_wrong_names_and_shapes_are_clear_errors(tiny, tmp_path, change, expected):
    folder = write_eagle3(tmp_path / "bad", **change)
    with pytest.raises(FileFormatError) as err:
        load_eagle3_head(folder, tiny.target)
    assert expected in str(err.value) and str(folder / "model.safetensors") in str(err.value)


def test_config_and_target_mismatches_are_clear_errors(tiny, tmp_path):
    folder = write_eagle3(tmp_path / "layers")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    with pytest.raises(FileFormatError, match="one decoder layer.*config.json"):
        load_eagle3_head(folder, tiny.target)
    other = write_eagle3(tmp_path / "other", vocab=40, target_hidden=32)
    with pytest.raises(ValueError, match="does not fit the target: the head's fc reads 3×32 .* vocab_size 40 != "):
        load_eagle3_head(other, tiny.target)
    broken = write_eagle3(tmp_path / "d2t")
    tensors = load_file(str(broken / "model.safetensors"))
    tensors["d2t"][1] = tensors["d2t"][0] - 1  # two draft ids on one target id
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(FileFormatError, match="vocabulary mapping is broken: d2t maps draft ids 0 and 1"):
        load_eagle3_head(broken, tiny.target)


@pytest.mark.slow  # compiles the engine (shares the executables of the greedy test when run after it)
def test_model_loads_both_drafters_over_one_target(tiny, hf):
    from dart_jax.api.model import DartModel
    from dart_jax.bench.tiny import make_tiny_head

    head = make_tiny_head(tiny.folder / "dart", tiny.base)
    model = DartModel.from_pretrained(tiny.base, head, False, eagle3=tiny.head_dir, min_bucket=64)
    assert model.eagle3_engine.target is model.engine.target  # one copy of the target's weights
    assert model.eagle3_engine.drafter.module.embed_tokens is model.engine.target.embed_tokens
    out = model.generate(PROMPTS[2], max_new_tokens=16, chat=False, method="eagle3")
    assert out.token_ids == hf_greedy(hf, PROMPTS[2], 16)
    with pytest.raises(ValueError, match="method must be one of"):
        model.generate(PROMPTS[2], max_new_tokens=4, chat=False, method="medusa")
    with pytest.raises(ValueError, match="total_token 800 needs at most"):
        DartModel.from_pretrained(tiny.base, head, False, eagle3=tiny.head_dir, eagle3_total_token=800)
    plain = DartModel.from_pretrained(tiny.base, head, False)
    with pytest.raises(ValueError, match="needs an EAGLE-3 head"):
        plain.generate(PROMPTS[2], max_new_tokens=4, chat=False, method="eagle3")

    # the server's scheduler offers the method with its own pool
    from dart_jax.serve.scheduler import Scheduler, thread_sink

    scheduler = Scheduler(model, slots=1).start()
    try:
        assert "eagle3" in scheduler.methods and "eagle3" not in Scheduler(plain, slots=1).methods
        q, sink = thread_sink()
        scheduler.submit(PROMPTS[2], GenerationSettings(max_new_tokens=16), sink, method="eagle3")
        ids = []
        while not (event := q.get(timeout=300)).done:
            ids += event.ids
        assert event.error is None and ids + event.ids == out.token_ids
    finally:
        scheduler.stop()


@pytest.mark.slow  # compiles a pool of 4 slots
def test_batched_eagle3_decodes_each_sequence_as_alone(engine, hf):
    from dart_jax.decoding.batcher import Batcher

    pool = Batcher(engine, 4, 2048)
    try:
        handles = [pool.submit(p, GenerationSettings(max_new_tokens=n)) for p, n in zip(PROMPTS * 2, (9, 20, 14, 5, 11, 3))]
        for _ in Driver(pool).run():
            pass
    finally:
        pool.close()
    for h, p in zip(handles, PROMPTS * 2):
        assert h.token_ids == hf_greedy(hf, p, h.settings.max_new_tokens)


@pytest.fixture(scope="module")
def dart_head(tiny):
    from dart_jax.bench.tiny import make_tiny_head

    return make_tiny_head(tiny.folder / "dart_cli", tiny.base)


@pytest.mark.slow  # compiles three decoders
def test_cli_compare_runs_each_method_on_the_same_prompt(tiny, dart_head, capsys):
    from dart_jax.api import generate

    code = generate.main(["--ckpt", str(dart_head), "--base", str(tiny.base), "--ngram", "none", "--eagle3",
                          str(tiny.head_dir), "--prompt", "hello", "--no-chat", "--max-new-tokens", "10", "--compare",
                          "--json", "--no-compile-cache"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["methods"]) == ["dart", "eagle3", "ar"]
    ar = report["methods"]["ar"]["token_ids"]
    for name, item in report["methods"].items():
        assert item["token_ids"] == ar and item["greedy_match"] is True, name
        assert item["speedup"] > 0
    code = generate.main(["--ckpt", str(dart_head), "--base", str(tiny.base), "--ngram", "none", "--eagle3",
                          str(tiny.head_dir), "--prompt", "hello", "--no-chat", "--max-new-tokens", "6",
                          "--method", "eagle3", "--no-compile-cache"])
    assert code == 0 and "[EAGLE3]" in capsys.readouterr().out


@pytest.mark.parametrize("flags,message", [
    (["--method", "eagle3"], "--method eagle3 needs an EAGLE-3 head"),
    (["--compare", "dart,eagle3"], "--compare with eagle3 needs an EAGLE-3 head"),
    (["--compare", "dart,medusa"], "--compare takes a comma list"),
])
def test_cli_method_errors(tiny, dart_head, capsys, flags, message):
    from dart_jax.api import generate

    code = generate.main(["--ckpt", str(dart_head), "--base", str(tiny.base), "--ngram", "none", "--prompt", "hello",
                          "--no-chat", "--no-compile-cache", *flags])
    assert code == 2 and message in capsys.readouterr().err
