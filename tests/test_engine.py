"""The speculative engine against independent oracles: transformers' greedy generate, our own
autoregressive decoding, the exact target distribution, and a plain-Python restatement of the
reference's tree rejection sampling (docs/spec.md §4)."""
from __future__ import annotations

import collections
import contextlib
import struct
from types import SimpleNamespace

import jax
import jax.extend
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.api.model import DartModel, load_trie, published_base
from dart_jax.bench.tiny import make_tiny_qwen3, make_tiny_setup
from dart_jax.errors import InputError
from dart_jax.decoding.autoregressive import AutoregressiveDecoder
from dart_jax.decoding.batcher import Batcher
from dart_jax.decoding.drafter import DartDrafter
from dart_jax.decoding.driver import Driver, decode, decode_together, pool_for
from dart_jax.decoding.engine import Engine
from dart_jax.decoding import autoregressive as programs_module
from dart_jax.decoding import sampling as sampling_module
from dart_jax.decoding.sampling import SamplingParams, process_logits, sample_accept
from dart_jax.decoding.requests import Stats
from dart_jax.decoding.settings import GenerationSettings, ShapeSettings
from dart_jax.ngram import TreeSettings, Trie

VOCAB = 32
EOS = 2
# three lengths in one prompt bucket; min_bucket 64 also covers the chat-formatted prompts of the
# character-level tokenizer, so that one prefill shape serves every test (compiling is what is slow)
PROMPTS = [[5, 9, 14, 3, 27], list(range(3, 20)), [7, 7, 21, 30, 11, 4, 8, 19, 25]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp("engine")
    base, head, trie = make_tiny_setup(folder, vocab_size=VOCAB, draft_length=3, shuffle_d2t=True,
                                       num_hidden_layers=4, seed=2)
    # a fixed tree size: these tests pin the engine's behaviour step by step (keep="auto" has its own below)
    model = DartModel.from_pretrained(base, head, trie, min_bucket=64, keep=60)
    hf = Qwen3ForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    return SimpleNamespace(base=base, head=head, trie_path=trie, model=model, hf=hf, folder=folder)


def hf_generate(tiny, prompt, max_new_tokens, eos=EOS):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = tiny.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine_for(tiny, trie=None, *, eos=(EOS,), adaptive=False, **tree):
    return Engine(tiny.model.target, DartDrafter(tiny.model.head), trie if trie is not None else tiny.model.engine.trie,
                  eos_ids=eos, tree_eos_id=EOS, tree=TreeSettings(**tree), shapes=ShapeSettings(min_bucket=64),
                  adaptive=adaptive)


def dart_steps(engine, plain=False):
    """One sequence decoded alone through the pool driver (`driver.decode`), as (prompt, settings,
    stats=) → (new ids, accepted length) per step: the speculative path the tests hold against
    the oracles (with `plain`, plain decoding: `ar_steps`; transformers)."""
    def steps(prompt, settings, stats=None):
        for event in decode(engine, prompt, settings, stats, plain=plain):
            yield event.ids, event.accepted
    return steps


def ar_steps(engine):
    """`dart_steps` of plain decoding (a `PlainBatcher` of the engine's baseline decoder): the oracle."""
    return dart_steps(engine, plain=True)


def decode_rows(engine, prompts, settings, stats):
    """B prompts decoded together in one pool (`driver.pool_for`) stepped by the driver: per step,
    each sequence's (new ids, accepted length), ([], 0) for one that did not move; a device call
    that moved a sequence by several steps gives one row per step."""
    pool = pool_for(engine, len(prompts), max(s.max_length for s in settings))
    try:
        for prompt, s, st in zip(prompts, settings, stats):
            pool.submit(prompt, s, st)
        for step in Driver(pool).run():
            moves = {}
            for event in step.events:
                moves.setdefault(event.request.index, []).append((event.ids, event.accepted))
            for t in range(max(map(len, moves.values()), default=1)):
                yield [moves[i][t] if t < len(moves.get(i, ())) else ([], 0) for i in range(len(prompts))]
    finally:
        pool.close()


def run(steps_fn, prompt, **kwargs):
    stats = Stats()
    ids, counts = [], []
    for kept, accepted in steps_fn(prompt, GenerationSettings(**kwargs), stats=stats):
        ids.extend(kept)
        counts.append(accepted)
    assert ids == stats.token_ids
    return ids, counts[1:], stats


@contextlib.contextmanager
def compilations():
    """The XLA compilations that happen inside the block (a list that fills as they happen),
    executables loaded from the persistent compilation cache (tests/conftest.py) included."""
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    def cache_hit(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            compiles.append("loaded from the persistent cache")

    jax.monitoring.register_event_duration_secs_listener(listener)
    jax.monitoring.register_event_listener(cache_hit)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        jax.monitoring.unregister_event_listener(cache_hit)


def cheating_trie(tiny, n=40):
    """A trie of the target's own greedy continuations: the search then proposes the right tokens."""
    return Trie.build([p + hf_generate(tiny, p, n, eos=None) for p in PROMPTS], order=3)


@pytest.mark.parametrize("keep,topk,rows", [
    (60, 25, None),
    (1, 25, None),
    # each other (keep, top-k, rows) compiles a new step, which takes a while on a loaded CPU
    pytest.param(8, 8, 2, marks=pytest.mark.slow),
    pytest.param(20, 32, 3, marks=pytest.mark.slow),
])
def test_greedy_equals_autoregressive_and_transformers(tiny, keep, topk, rows):
    engine = engine_for(tiny, keep=keep, topk=topk, draft_rows=rows)
    for prompt in PROMPTS:
        expected = hf_generate(tiny, prompt, 20)
        dart, counts, stats = run(dart_steps(engine), prompt, max_new_tokens=20)
        ar, _, _ = run(ar_steps(engine), prompt, max_new_tokens=20)
        assert dart == ar == expected
        assert all(1 <= c <= (rows or 4) + 1 for c in counts)
        assert stats.steps == len(counts) and stats.new_tokens == len(dart)


@pytest.mark.extended
def test_fused_projections_keep_greedy_decoding_exact(tiny):
    """With the GPU's fused layout (forced here), DART (with a trie that makes long accepted runs,
    so trees of many nodes commit several keys a step) and plain decoding give transformers' tokens."""
    model = DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, min_bucket=64, keep=60,
                                      fused_projections=True)
    assert model.target.fused_projections
    engine = Engine(model.target, DartDrafter(model.head), cheating_trie(tiny), eos_ids=(EOS,), tree_eos_id=EOS,
                    tree=TreeSettings(keep=60), shapes=ShapeSettings(min_bucket=64))
    for prompt in PROMPTS:
        expected = hf_generate(tiny, prompt, 24)
        dart, counts, _ = run(dart_steps(engine), prompt, max_new_tokens=24)
        ar, _, _ = run(ar_steps(engine), prompt, max_new_tokens=24)
        assert dart == ar == expected
        assert max(counts) > 2  # runs of accepted draft tokens were verified
    # a mesh would copy the fused kernels whole onto every device: refused, naming the fix
    with pytest.raises(InputError, match="fused.*load the target with the mesh"):
        Engine(model.target, DartDrafter(model.head), eos_ids=(EOS,), tree_eos_id=EOS, mesh="model=1")


def test_big_trees_compile_with_their_own_xla_options_and_stay_exact(tiny, monkeypatch):
    """A GPU compiles the verification of a big tree with other GEMMs (qwen3.verify_compiler_options):
    here the rule is forced on the CPU with a GPU option every XLA accepts. A step whose tree has
    32 rows or more runs an executable compiled with it, a smaller one XLA's defaults, and greedy
    decoding stays transformers' either way. A bad verify_gemms stops the engine at once."""
    off = {"xla_gpu_enable_triton_gemm": False}
    asked, made = [], []
    real_jitted = programs_module.jitted  # the one factory every ProgramSpec builds with

    def rule(rows, choice):
        asked.append((rows, choice))
        return dict(off) if rows >= 32 else None

    def spy(fn, *args, **kwargs):
        made.append(kwargs.get("compiler_options"))
        return real_jitted(fn, *args, **kwargs)

    monkeypatch.setattr(programs_module, "verify_compiler_options", rule)
    monkeypatch.setattr(programs_module, "jitted", spy)
    # the options every program of a backend gets (on a CPU, test_backend's) are not this rule's
    monkeypatch.setattr(programs_module, "program_compiler_options", lambda: None)
    for keep, options, gemms in ((60, off, "auto"), (8, None, "xla")):
        engine = Engine(tiny.model.target, DartDrafter(tiny.model.head), cheating_trie(tiny), eos_ids=(EOS,),
                        tree_eos_id=EOS, tree=TreeSettings(keep=keep), shapes=ShapeSettings(min_bucket=64),
                        verify_gemms=gemms)
        made.clear()
        for prompt in PROMPTS[:2]:
            dart, counts, _ = run(dart_steps(engine), prompt, max_new_tokens=16)
            assert dart == hf_generate(tiny, prompt, 16)
        assert (keep + 1, gemms) in asked  # the rule asked with the engine's choice
        assert made == [options]  # the step, made once with its options (the prefill keeps XLA's)
    with pytest.raises(InputError, match="verify_gemms \\(--verify-gemms\\) must be one of auto, xla, cublas"):
        Engine(tiny.model.target, DartDrafter(tiny.model.head), eos_ids=(EOS,), tree_eos_id=EOS, verify_gemms="fast")


@pytest.mark.extended
def test_steps_in_a_device_loop_equal_the_hosts_steps(tiny):
    """device_steps: several steps per device call, the trees searched on the device. Against the
    host's one step per call (whose trees the device search reproduces): the same tokens, accepted
    lengths and events, greedy (transformers' tokens) and sampled (the same keys, the same draws),
    with long accepted runs (a trie of the target's own continuations), an EOS inside a run, budgets
    that end inside a run, and a batch whose sequences stop at different calls."""
    trie = cheating_trie(tiny)
    host = engine_for(tiny, trie, keep=60)
    device = Engine(tiny.model.target, DartDrafter(tiny.model.head), trie, eos_ids=(EOS,), tree_eos_id=EOS,
                    tree=TreeSettings(keep=60), shapes=ShapeSettings(min_bucket=64), device_steps=3)
    for prompt in PROMPTS:
        expected = hf_generate(tiny, prompt, 23)
        for kwargs in ({"max_new_tokens": 23}, {"max_new_tokens": 19, "temperature": 0.8, "seed": 5}):
            ran = [run(dart_steps(e), prompt, **kwargs) for e in (host, device)]
            assert ran[0][0] == ran[1][0] and ran[0][1] == ran[1][1]  # tokens, accepted lengths
            if "temperature" not in kwargs:
                assert ran[1][0] == expected and max(ran[1][1]) > 2
    # an EOS that the target emits inside an accepted run ends the sequence there, EOS kept
    greedy = hf_generate(tiny, PROMPTS[0], 30, eos=None)
    stop = greedy[9]
    with_eos = [Engine(tiny.model.target, DartDrafter(tiny.model.head), trie, eos_ids=(stop,), tree_eos_id=EOS,
                       tree=TreeSettings(keep=60), shapes=ShapeSettings(min_bucket=64), device_steps=s) for s in (0, 4)]
    ran = [run(dart_steps(e), PROMPTS[0], max_new_tokens=30) for e in with_eos]
    assert ran[0][0] == ran[1][0] == greedy[:greedy.index(stop) + 1]
    # a batch: each sequence as the host's pool decodes it
    settings = [GenerationSettings(max_new_tokens=n) for n in (7, 25, 16)]
    results = []
    for e in (host, device):
        stats = [Stats() for _ in settings]
        outs = [[] for _ in settings]
        for rows in decode_rows(e, PROMPTS[:3], settings, stats):
            for i, (kept, _) in enumerate(rows):
                outs[i] += kept
        results.append((outs, [s.accept_lengths for s in stats]))
    assert results[0] == results[1]
    assert [len(o) for o in results[1][0]] == [7, 25, 16]


@pytest.mark.extended
def test_a_device_loop_attends_over_every_slot_its_steps_reach(tiny, monkeypatch):
    """Attention windows as small as they go (8 slots, not 256): the window of a device call must
    cover all of its steps' slots, else the tokens go wrong; and a max_length reached inside a call
    ends the sequence there, as the host's steps do."""
    from dart_jax.decoding import autoregressive
    monkeypatch.setattr(autoregressive, "_MIN_WINDOW", 8)
    trie = cheating_trie(tiny)
    device = Engine(tiny.model.target, DartDrafter(tiny.model.head), trie, eos_ids=(EOS,), tree_eos_id=EOS,
                    tree=TreeSettings(keep=60), shapes=ShapeSettings(min_bucket=64), device_steps=4)
    prompt = PROMPTS[1]
    dart, counts, _ = run(dart_steps(device), prompt, max_new_tokens=30)
    assert dart == hf_generate(tiny, prompt, 30) and max(counts) > 2
    host = engine_for(tiny, trie, keep=60)
    cut = [run(dart_steps(e), prompt, max_new_tokens=30, max_length=len(prompt) + 13)[:2] for e in (host, device)]
    assert cut[0] == cut[1] and len(cut[1][0]) == 13


def test_device_steps_are_refused_where_they_cannot_run(tiny):
    for bad in (-1, 4097, 10**9):
        with pytest.raises(InputError, match=r"device_steps must be an integer in \[0, 4096\]"):
            Engine(tiny.model.target, DartDrafter(tiny.model.head), eos_ids=(EOS,), tree_eos_id=EOS, device_steps=bad)
    with pytest.raises(InputError, match='pass keep=N / --keep N \\(not "auto"\\)'):
        Engine(tiny.model.target, DartDrafter(tiny.model.head), eos_ids=(EOS,), tree_eos_id=EOS, adaptive=True,
               device_steps=2)
    device = Engine(tiny.model.target, DartDrafter(tiny.model.head), eos_ids=(EOS,), tree_eos_id=EOS,
                    tree=TreeSettings(keep=8), device_steps=2)
    with pytest.raises(InputError, match="overlap.*device_steps"):
        device.batcher(2, 128, overlap=True)
    with pytest.raises(InputError, match="needs the DART drafter"):
        Engine(tiny.model.target, SimpleNamespace(), eos_ids=(EOS,), tree_eos_id=EOS, device_steps=2)


def test_long_accepted_runs_eos_and_limits_inside_a_run(tiny):
    trie = cheating_trie(tiny)
    engine = engine_for(tiny, trie)
    prompt = PROMPTS[2]
    full, counts, _ = run(dart_steps(engine), prompt, max_new_tokens=30)
    assert full == hf_generate(tiny, prompt, 30)
    assert max(counts) >= 3, f"the cheating trie should give long accepted runs, got {counts}"

    # spans of output indices produced by each step; the last index of a span is the bonus token
    starts = np.cumsum([1] + counts)[:-1]
    # (the last step's span may be cut by max_new_tokens)
    inside = [j for s, c in zip(starts, counts) for j in range(s, min(s + c - 1, len(full)))
              if full[j] not in full[:j]]
    assert inside, f"no token first appears inside an accepted run: {full} {counts}"
    j = inside[0]
    eos_engine = engine_for(tiny, trie, eos=(full[j],))
    stopped, _, _ = run(dart_steps(eos_engine), prompt, max_new_tokens=30)
    assert stopped == full[: j + 1] == hf_generate(tiny, prompt, 30, eos=full[j])
    # the baseline's device loop stops on EOS inside a chunk of tokens too
    assert run(ar_steps(eos_engine), prompt, max_new_tokens=30)[0] == stopped

    s, c = next((s, c) for s, c in zip(starts, counts) if c >= 3)
    cut, _, _ = run(dart_steps(engine), prompt, max_new_tokens=int(s) + 1)
    assert cut == full[: s + 1] == hf_generate(tiny, prompt, int(s) + 1)
    by_length, _, _ = run(dart_steps(engine), prompt, max_length=len(prompt) + int(s) + 2)
    assert by_length == full[: s + 2]


def test_no_compilation_after_warmup(tiny):
    engine = engine_for(tiny, cheating_trie(tiny))
    other = engine_for(tiny)  # another Engine over the same modules shares the executables
    run(dart_steps(engine), PROMPTS[0], max_new_tokens=12)
    run(dart_steps(engine), PROMPTS[0], max_new_tokens=12, temperature=1.0, seed=1)
    run(ar_steps(engine), PROMPTS[0], max_new_tokens=4)
    with compilations() as compiles:
        seen_counts = set()
        for prompt in PROMPTS[1:]:
            for eng in (engine, other):
                _, counts, _ = run(dart_steps(eng), prompt, max_new_tokens=17)
                seen_counts.update(counts)
            run(dart_steps(engine), prompt, max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=5, seed=3)
            run(ar_steps(engine), prompt, max_new_tokens=5)
    assert len(seen_counts) > 1
    assert compiles == []


def test_prompts_of_new_lengths_compile_nothing_in_a_warm_process(tiny):
    """A prompt is prefilled in chunks of one shape: once a first prompt was answered (and a first
    pair of prompts together), prompts of lengths never seen before, alone or side by side, compile
    nothing while their attention windows are warm, and each answer is transformers' greedy one."""
    engine = engine_for(tiny)
    run(dart_steps(engine), PROMPTS[0], max_new_tokens=12)
    run(ar_steps(engine), PROMPTS[0], max_new_tokens=12)
    # the second row stops first, so that the pool steps its two rows, then its first row alone
    settings = [GenerationSettings(max_new_tokens=12), GenerationSettings(max_new_tokens=4)]
    for plain in (False, True):
        pool_engine = engine if not plain else engine.baseline
        list(decode_rows(pool_engine, PROMPTS[:2], settings, [Stats(), Stats()]))
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, VOCAB, n)] for n in (70, 133, 190, 29, 101)]
    expected = [hf_generate(tiny, p, 12) for p in prompts[:4]] + [hf_generate(tiny, prompts[4], 4)]
    with compilations() as compiles:
        for prompt, want in zip(prompts[:3], expected):
            assert run(dart_steps(engine), prompt, max_new_tokens=12)[0] == want
            assert run(ar_steps(engine), prompt, max_new_tokens=12)[0] == want
        for pool_engine in (engine, engine.baseline):
            out = [[], []]
            for rows in decode_rows(pool_engine, prompts[3:], settings, [Stats(), Stats()]):
                for i, (kept, _) in enumerate(rows):
                    out[i].extend(kept)
            assert out == expected[3:]
    assert compiles == []


def vocab_matmuls(jaxpr, widths: set[int], pick) -> int:
    """The matmuls whose output spans a vocabulary (an LM head: an axis of one of the `widths`) that
    a run of `jaxpr` computes when each conditional takes the branch that `pick` (min or max) picks
    by that count; a loop's body counts once."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            count += bool(widths & set(eqn.outvars[0].aval.shape))
        elif eqn.primitive.name == "cond":
            count += pick(vocab_matmuls(branch.jaxpr, widths, pick) for branch in eqn.params["branches"])
        else:
            count += sum(vocab_matmuls(sub, widths, pick) for sub in jax.extend.core.jaxprs_in_params(eqn.params))
    return count


def prefill_lm_heads(engine, widths: set[int]) -> dict[str, tuple[int, int]]:
    """(fewest, most) LM-head matmuls that a call of the engine's prefill and of its baseline's
    (plain decoding's) can compute, over two rows of a 3-chunk prompt, by the branches their
    conditionals take."""
    pool = engine.batcher(2, 256)
    c = engine.shapes.chunk
    ids, lengths, start = jnp.zeros((2, c + 1), jnp.int32), jnp.full((2,), 3 * c, jnp.int32), jnp.zeros(2, jnp.int32)
    # each program's own trace (a top-level jit: one compiled with XLA options cannot be nested)
    dart = engine._prefill.trace(engine._state, ids, lengths, start, pool.state, rows=pool.depth, k=pool.k,
                                 nodes=engine.n_nodes, window=256).jaxpr
    d = engine.baseline
    plain = d.prefill.trace(d.state, ids[:, :c], lengths, start, jnp.zeros(2, jnp.int32), pool.state, window=256).jaxpr
    pool.close()
    return {name: (vocab_matmuls(j.jaxpr, widths, min), vocab_matmuls(j.jaxpr, widths, max))
            for name, j in (("engine", dart), ("baseline", plain))}


def test_a_prefill_chunk_that_no_prompt_ends_in_computes_no_lm_head(tmp_path):
    """What only a prompt's last chunk needs (the target's LM head and sampling, the draft head's
    proposal) runs under a conditional: a chunk where no row's prompt ends takes a branch without
    any LM head, the last chunk one with the target's and the draft head's (vocabularies of 97 and
    53 ids, widths no other matmul has)."""
    base, head, trie = make_tiny_setup(tmp_path, vocab_size=97, draft_vocab_size=53, num_hidden_layers=3)
    model = DartModel.from_pretrained(base, head, trie, min_bucket=32, keep=8)
    assert prefill_lm_heads(model.engine, {97, 53}) == {"engine": (0, 2), "baseline": (0, 1)}


# ------------------------------------------------------------------------------------------------
# sampling


def test_process_logits_matches_transformers_warpers():
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    rng = np.random.default_rng(0)
    logits = (2 * rng.standard_normal((4, 40))).astype(np.float32)
    for temperature, top_p, top_k in [(0.7, 0.9, 5), (1.0, 1.0, 0), (1.3, 0.5, 0), (0.5, 1.0, 3), (2.0, 0.95, 30)]:
        scores = torch.tensor(logits)
        # the reference's order: temperature, then top-p, then top-k
        if temperature != 1.0:
            scores = TemperatureLogitsWarper(temperature)(None, scores)
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)
        if top_k > 0:
            scores = TopKLogitsWarper(top_k)(None, scores)
        expected = torch.softmax(scores, dim=-1).numpy()
        got = np.asarray(process_logits(jnp.asarray(logits), SamplingParams.make(temperature, top_p, top_k)))
        np.testing.assert_allclose(got, expected, atol=1e-6)
        np.testing.assert_array_equal(got > 0, expected > 0)


def exact_tree_outcomes(probs, tokens, kids):
    """Plain restatement of the reference's walk: distribution over (accepted tokens…, bonus)."""
    out = collections.defaultdict(float)

    def walk(node, prefix, weight):
        p = probs[node] / probs[node].sum()
        seen = set()
        for child in kids.get(node, []):
            x = tokens[child]
            if x in seen:
                continue
            seen.add(x)
            if p[x] > 0:
                walk(child, prefix + (x,), weight * p[x])
            weight *= 1 - p[x]
            if weight <= 0:
                return
            p = p.copy()
            p[x] = 0
            p = p / p.sum()
        for b in np.flatnonzero(p > 0):
            out[prefix + (-1, int(b))] += weight * p[b]

    walk(0, (), 1.0)
    return out


def test_tree_rejection_sampling_matches_exact_enumeration():
    v = 6
    tokens = np.array([0, 1, 2, 1, 3, 4, 1], np.int32)  # node 3 repeats its sibling node 1's token
    parents = np.array([-1, 0, 0, 0, 1, 1, 2], np.int32)
    # leaf rows in the order the walk visits siblings: root's children 2, 1, 3; node 1's children 5, 4
    retrieve = np.array([[0, 2, 6], [0, 1, 5], [0, 1, 4], [0, 3, -1], [-1, -1, -1], [-1, -1, -1]], np.int32)
    kids = {0: [2, 1, 3], 1: [5, 4], 2: [6]}
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(v), size=7).astype(np.float32)
    probs[1, 4] = 0.0  # a child the target can never produce
    probs[2, 1] = 0.9  # a child that is accepted most of the time
    probs /= probs.sum(axis=1, keepdims=True)

    n = 20000
    keys = jax.random.split(jax.random.key(0), n)
    sample = jax.jit(jax.vmap(sample_accept, in_axes=(0, None, None, None, None)))
    path, count, bonus = jax.device_get(sample(keys, jnp.asarray(probs), jnp.asarray(tokens), jnp.asarray(parents),
                                               jnp.asarray(retrieve)))
    empirical = collections.Counter(
        tuple(int(t) for t in tokens[path[i, 1:count[i]]]) + (-1, int(bonus[i])) for i in range(n))
    exact = exact_tree_outcomes(probs.astype(np.float64), tokens, kids)
    assert set(empirical) <= set(exact), set(empirical) - set(exact)
    tv = 0.5 * sum(abs(empirical[k] / n - exact.get(k, 0.0)) for k in set(exact) | set(empirical))
    assert tv < 0.03, tv
    # losslessness in its simplest form: the first generated token follows the root's distribution
    first = collections.Counter(k[0] if k[0] != -1 else k[1] for k in empirical.elements())
    assert max(abs(first[x] / n - probs[0, x]) for x in range(v)) < 0.015


def exact_first_tokens(tiny, prompt, length, temperature, top_p, top_k):
    """P(first `length` generated tokens) from the transformers model with the reference's warpers."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    def probs(seq):
        with torch.no_grad():
            scores = tiny.hf(torch.tensor([seq])).logits[:, -1].float()
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


def test_sampling_keeps_the_target_distribution(tiny):
    prompt, temperature, top_p, top_k = PROMPTS[0], 1.3, 0.95, 3
    exact = exact_first_tokens(tiny, prompt, 3, temperature, top_p, top_k)
    engine = engine_for(tiny, cheating_trie(tiny))
    n = 240
    samples = {"dart": collections.Counter(), "ar": collections.Counter()}
    accepted_drafts = 0
    for seed in range(n):
        kw = dict(max_new_tokens=3, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        ids, counts, _ = run(dart_steps(engine), prompt, **kw)
        samples["dart"][tuple(ids)] += 1
        accepted_drafts += sum(c - 1 for c in counts)
        ar, _, _ = run(ar_steps(engine), prompt, **kw)
        samples["ar"][tuple(ar)] += 1
    assert accepted_drafts > n // 2, "the test needs drafts to be accepted to exercise the rejection sampling"
    for name, counter in samples.items():
        assert set(counter) <= set(exact), (name, set(counter) - set(exact))
        stat, df = chi_square(counter, exact, n)
        assert stat < chi_square_critical(df), (name, stat, df)
    # DART against AR directly: the two-sample homogeneity statistic is twice DART's against the pool
    pooled = {k: (samples["dart"][k] + samples["ar"][k]) / (2 * n) for k in exact}
    stat, df = chi_square(samples["dart"], pooled, n)
    assert 2 * stat < chi_square_critical(df), (2 * stat, df)


def test_seed_makes_sampling_reproducible(tiny):
    kw = dict(max_new_tokens=12, temperature=1.0, chat=False)
    a = tiny.model.generate(PROMPTS[1], seed=7, **kw)
    b = tiny.model.generate(PROMPTS[1], seed=7, **kw)
    assert a.token_ids == b.token_ids and a.accept_lengths == b.accept_lengths


# ------------------------------------------------------------------------------------------------
# API


def test_generate_stream_and_text(tiny):
    model = tiny.model
    result = model.generate("hi there", max_new_tokens=10)
    prompt_ids = model.tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}], tokenize=False,
                                                     add_generation_prompt=True, enable_thinking=False)
    assert result.prompt_ids == model.tokenizer(prompt_ids, add_special_tokens=False)["input_ids"]
    assert result.token_ids == hf_generate(tiny, result.prompt_ids, 10)
    assert result.text == model.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    # τ: the tokens kept per step (all but the prefill's first come from the steps; max_new_tokens cut the last)
    assert result.stats["tau"] == pytest.approx((len(result.token_ids) - 1) / len(result.accept_lengths))
    for key in ("tokens_per_s", "device_s", "tree_s", "host_s", "prefill_s"):
        assert result.stats[key] >= 0
    pieces = list(model.stream("hi there", max_new_tokens=10))
    assert "".join(p for p, _ in pieces) == result.text
    assert [a for _, a in pieces][1:] == result.accept_lengths
    ar = model.generate_ar("hi there", max_new_tokens=10)
    assert ar.token_ids == result.token_ids


def test_bad_inputs_raise_before_compiling(tiny, tmp_path):
    model = tiny.model
    cases = [
        (dict(prompt=list(range(3, 30)), max_length=20), "max_length"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(prompt=[3, VOCAB + 5]), "vocabulary"),
        (dict(prompt=[]), "empty"),
    ]
    with compilations() as compiles:
        for kwargs, word in cases:
            prompt = kwargs.pop("prompt", [3, 4, 5])
            for fn in (model.generate, model.generate_ar):
                with pytest.raises(ValueError, match=word):
                    fn(prompt, chat=False, **kwargs)
    assert compiles == []

    other_base = make_tiny_qwen3(tmp_path / "wide", vocab_size=VOCAB, hidden_size=32, num_attention_heads=2,
                                 num_key_value_heads=1, num_hidden_layers=3)
    with pytest.raises(ValueError, match="does not fit"):
        DartModel.from_pretrained(other_base, tiny.head, tiny.trie_path)
    with pytest.raises(FileNotFoundError, match="nobody/no-such-base"):
        DartModel.from_pretrained("nobody/no-such-base", tiny.head, tiny.trie_path)
    with pytest.raises(FileNotFoundError):
        DartModel.from_pretrained(tiny.base, tmp_path / "missing_head", tiny.trie_path)
    with pytest.raises(FileNotFoundError, match="small.trie"):
        DartModel.from_pretrained(tiny.base, tiny.head, tmp_path, small_ngram=True)
    with pytest.raises(ValueError, match="unknown option"):
        DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, tree_size=3)
    with pytest.raises(ValueError, match="keep"):
        DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, keep=0)
    with pytest.raises(ValueError, match="draft_rows"):
        DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, draft_rows=9)
    with pytest.raises(ValueError, match="base"):
        DartModel.from_pretrained(None, tiny.head, tiny.trie_path)
    assert published_base("fvliang/qwen8b-dart") == "Qwen/Qwen3-8B"
    assert published_base("/x/models--fvliang--qwen4b-dart/snapshots/abc") == "Qwen/Qwen3-4B"


def write_reference_trie(path, trie: Trie):
    """docs/spec.md §6 writer: records in node order, children in reverse order (any order is allowed)."""
    token, freq, child_start = trie.arrays()
    parent = np.zeros(len(token), np.int64)
    for i in range(len(token)):
        parent[child_start[i]:child_start[i + 1]] = i
    with open(path, "wb") as f:
        f.write(struct.pack("<QQ", trie.order, len(token)))
        for i in range(len(token)):
            kids = list(range(child_start[i], child_start[i + 1]))[::-1]
            f.write(struct.pack("<iQiQ", int(token[i]), int(parent[i]), int(freq[i]), len(kids)))
            for c in kids:
                f.write(struct.pack("<iQ", int(token[c]), c))


def test_reference_trie_is_converted_once_and_cached(tmp_path):
    trie = Trie.build([[3, 4, 5, 3, 4, 6], [4, 5, 3]], order=3)
    folder = tmp_path / "ngram"
    folder.mkdir()
    write_reference_trie(folder / "small.trie", trie)
    loaded = load_trie(folder, small=True)
    cached = folder / "small.trie.dart_jax"
    assert cached.is_file()
    for a, b in zip(loaded.arrays(), trie.arrays()):
        np.testing.assert_array_equal(a, b)
    stamp = cached.stat().st_mtime_ns
    again = load_trie(folder / "small.trie")
    assert cached.stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(again.probability([3, 4], [5, 6])[0], trie.probability([3, 4], [5, 6])[0])


def test_prompts_pad_to_whole_chunks():
    assert [ShapeSettings().padded(n) for n in (1, 5, 32, 33, 64, 65)] == [32, 32, 32, 64, 64, 96]


@pytest.mark.extended
def test_generation_across_attention_windows(tiny):
    """Steps attend over a power-of-two window of the cache (>= 256 slots) that grows with the
    sequence: a generation whose window doubles on the way (a 236-token prompt and 40 new tokens:
    from 256 slots to 512) must still be the target's greedy output, by DART and by the baseline."""
    engine = engine_for(tiny, eos=())
    rng = np.random.default_rng(11)
    prompt = [int(t) for t in rng.integers(3, VOCAB, 236)]
    expected = hf_generate(tiny, prompt, 40, eos=None)
    dart, _, _ = run(dart_steps(engine), prompt, max_new_tokens=40, max_length=1024)
    ar, _, _ = run(ar_steps(engine), prompt, max_new_tokens=40, max_length=1024)
    assert dart == ar == expected


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_batch_dimension_decodes_each_sequence_as_alone(tiny):
    """The host loop already runs B sequences (batched decoding is switched on elsewhere): two
    prompts of different lengths decoded together give each one's own greedy output, each within
    its own budget (max_length leaves the longer prompt less room) and with its own stats."""
    engine = engine_for(tiny)
    prompts = [np.asarray(PROMPTS[0], np.int32), np.asarray(PROMPTS[1], np.int32)]
    kw = dict(max_new_tokens=18, max_length=len(PROMPTS[1]) + 6)
    alone = [run(ar_steps(engine), p.tolist(), **kw)[0] for p in prompts]
    assert [len(a) for a in alone] == [18, 6] or any(a and a[-1] == EOS for a in alone)
    stats = [Stats(), Stats()]
    out = [[], []]
    for rows in decode_rows(engine, prompts, [GenerationSettings(**kw)] * 2, stats):
        for i, (kept, _) in enumerate(rows):
            out[i].extend(kept)
    assert out == alone
    assert [s.token_ids for s in stats] == alone and all(s.steps >= 1 for s in stats)


def test_batch_with_own_settings_and_stops_equals_each_alone(tiny):
    """Prompts of very different lengths decoded together, each with its own max_new_tokens, one
    stopping on EOS in the middle of the batch: each sequence is its own autoregressive greedy
    output (the oracle runs each prompt alone)."""
    long_prompt = [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, 41)]
    prompts = [PROMPTS[2], PROMPTS[0], long_prompt, PROMPTS[1]]
    full, _, _ = run(ar_steps(engine_for(tiny)), PROMPTS[2], max_new_tokens=30)
    eos = full[len(full) // 2]
    engine = engine_for(tiny, cheating_trie(tiny), eos=(eos,))
    settings = [GenerationSettings(max_new_tokens=n) for n in (30, 4, 17, 25)]
    alone = [run(ar_steps(engine), p, max_new_tokens=s.max_new_tokens)[0] for p, s in zip(prompts, settings)]
    assert alone[0][-1] == eos and len(alone[0]) < 30, "the first sequence should stop on EOS"
    assert len(alone[1]) == 4
    stats = [Stats() for _ in prompts]
    out = [[] for _ in prompts]
    for rows in decode_rows(engine, [np.asarray(p, np.int32) for p in prompts], settings, stats):
        for o, (kept, _) in zip(out, rows):
            o.extend(kept)
    assert out == alone
    assert [s.token_ids for s in stats] == alone


@pytest.mark.extended
def test_sampling_keeps_the_target_distribution_beside_other_sequences(tiny):
    """The chi-square check of the single-sequence case, with each sampled sequence decoded in a
    batch beside other sampled sequences (other seeds) and a greedy one (which stays greedy)."""
    prompt, temperature, top_p, top_k = PROMPTS[0], 1.3, 0.95, 3
    exact = exact_first_tokens(tiny, prompt, 3, temperature, top_p, top_k)
    engine = engine_for(tiny, cheating_trie(tiny))
    greedy, _, _ = run(ar_steps(engine), PROMPTS[1], max_new_tokens=3)
    per_batch, batches = 15, 16
    counter = collections.Counter()
    for batch in range(batches):
        settings = [GenerationSettings(max_new_tokens=3, temperature=temperature, top_p=top_p, top_k=top_k,
                                       seed=batch * per_batch + i) for i in range(per_batch)]
        settings.append(GenerationSettings(max_new_tokens=3))
        prompts = [np.asarray(prompt, np.int32)] * per_batch + [np.asarray(PROMPTS[1], np.int32)]
        out = [[] for _ in prompts]
        for rows in decode_rows(engine, prompts, settings, [Stats() for _ in prompts]):
            for o, (kept, _) in zip(out, rows):
                o.extend(kept)
        assert out[-1] == greedy
        counter.update(tuple(o) for o in out[:-1])
    n = per_batch * batches
    assert set(counter) <= set(exact), set(counter) - set(exact)
    stat, df = chi_square(counter, exact, n)
    assert stat < chi_square_critical(df), (stat, df)


@pytest.mark.extended
def test_branch_decided_on_the_host_keeps_every_output(tiny, monkeypatch):
    """As on an accelerator (`sampling.host_branch`: the greedy-or-sampling choice static): a greedy
    batch is each prompt's plain greedy decoding (the oracle runs each alone), and a mixed batch
    samples exactly what the device-decided branch samples with the same seeds (that path is held
    to the exact distribution by the tests above), its greedy row still greedy."""
    engine = engine_for(tiny, cheating_trie(tiny))
    prompts = [np.asarray(p, np.int32) for p in PROMPTS[:3]]
    greedy = [GenerationSettings(max_new_tokens=12) for _ in prompts]
    mixed = [GenerationSettings(max_new_tokens=12, temperature=1.3, top_p=0.95, top_k=3, seed=s) for s in (4, 5)]
    mixed.append(GenerationSettings(max_new_tokens=12))

    def decode(settings):
        out = [[] for _ in prompts]
        for rows in decode_rows(engine, prompts, settings, [Stats() for _ in prompts]):
            for o, (kept, _) in zip(out, rows):
                o.extend(kept)
        return out

    on_device = decode(mixed)
    alone = [run(ar_steps(engine), p, max_new_tokens=12)[0] for p in PROMPTS[:3]]
    monkeypatch.setattr(sampling_module, "host_branch", lambda: True)
    assert decode(greedy) == alone
    on_host = decode(mixed)
    assert on_host == on_device and on_host[2] == alone[2]


def test_generate_a_list_of_prompts(tiny):
    model = tiny.model
    messages = [{"role": "user", "content": "hi there"}]
    prompts = ["hello", PROMPTS[1], messages, "a much longer question about many things at once?"]
    results = model.generate(prompts, max_new_tokens=9, batch_size=3)
    assert isinstance(results, list) and len(results) == len(prompts)
    for prompt, result in zip(prompts, results):
        alone = model.generate_ar(prompt, max_new_tokens=9)
        assert result.prompt_ids == alone.prompt_ids and result.token_ids == alone.token_ids
        assert result.finish_reason == ("eos" if alone.token_ids[-1] == EOS else "length")
    assert results[2].prompt_ids == model.encode("hi there")  # a messages list is chat-formatted
    single = model.generate(PROMPTS[1], max_new_tokens=9)  # one prompt keeps its return type
    assert not isinstance(single, list) and single.token_ids == results[1].token_ids
    with pytest.raises(ValueError, match="prompt 1 of the batch"):
        model.generate(["fine", [VOCAB + 5]], max_new_tokens=2)
    with pytest.raises(ValueError, match="empty"):
        model.generate([], max_new_tokens=2)
    with pytest.raises(ValueError, match="settings for"):
        model.generate(["a", "b"], settings=[GenerationSettings()])


def test_continuous_batching_requests_join_and_leave(tiny):
    """A pool of 2 slots and 5 requests of different lengths and limits, one stopping on EOS,
    one submitted while others run: each request gets its own greedy output (the oracle decodes
    it alone), a finished request frees its slot at once, and no step compiles anything new once
    the pool's shapes have been seen."""
    long_prompt = [int(t) for t in np.random.default_rng(6).integers(3, VOCAB, 33)]
    full, _, _ = run(ar_steps(engine_for(tiny)), PROMPTS[2], max_new_tokens=30)
    engine = engine_for(tiny, cheating_trie(tiny), eos=(full[len(full) // 2],))
    jobs = [(PROMPTS[2], 30), (PROMPTS[0], 3), (long_prompt, 14), (PROMPTS[1], 9), (PROMPTS[0], 20)]
    alone = [run(ar_steps(engine), p, max_new_tokens=n)[0] for p, n in jobs]
    assert len(alone[0]) < 30, "the first request should stop on EOS"

    def serve(late_after: int):
        pool = Batcher(engine, 2, 2048)
        try:
            handles = [pool.submit(p, GenerationSettings(max_new_tokens=n)) for p, n in jobs[:-1]]
            steps = 0
            while pool.active:
                moved = pool.step()
                assert len(moved) <= 2 and sum(r is not None for r in pool.busy) <= 2
                for request, _, _ in moved:
                    if request.done:
                        assert request not in pool.busy  # its slot is free at once
                steps += 1
                if steps == late_after:
                    handles.append(pool.submit(jobs[-1][0], GenerationSettings(max_new_tokens=jobs[-1][1])))
        finally:
            pool.close()
        return handles

    handles = serve(late_after=4)
    assert [h.token_ids for h in handles] == alone
    assert all(h.done and h.stats.new_tokens == len(h.token_ids) for h in handles)
    assert handles[0].finish_reason == "eos" and handles[1].finish_reason == "length"
    with compilations() as compiles:
        again = serve(late_after=2)
    assert [h.token_ids for h in again] == alone
    assert compiles == []


def test_cancelled_requests_free_their_slots_for_the_next(tiny):
    """A pool of 2 slots, 4 requests: one is cancelled while it runs, one while it waits. The
    cancelled ones stop at once ('cancelled', their tokens so far a prefix of their own greedy
    output); the others take the freed slot and still get exactly their own greedy output."""
    engine = engine_for(tiny)
    jobs = [(PROMPTS[0], 40), (PROMPTS[1], 12), (PROMPTS[2], 10), (PROMPTS[0], 8)]
    alone = [run(ar_steps(engine), p, max_new_tokens=n)[0] for p, n in jobs]
    pool = Batcher(engine, 2, 2048)
    try:
        handles = [pool.submit(p, GenerationSettings(max_new_tokens=n)) for p, n in jobs]
        pool.step()  # admits the first two
        pool.step()
        assert pool.cancel(handles[0]) and pool.cancel(handles[3])
        assert handles[0].slot is not None and pool.busy[handles[0].slot] is None  # its slot is free now
        assert handles[3] not in pool.waiting
        assert not pool.cancel(handles[0])  # already ended
        while pool.active:
            pool.step()
    finally:
        pool.close()
    assert handles[0].finish_reason == handles[3].finish_reason == "cancelled"
    assert 0 < len(handles[0].token_ids) < len(alone[0]) and alone[0][:len(handles[0].token_ids)] == handles[0].token_ids
    assert handles[3].token_ids == []
    assert [h.token_ids for h in handles[1:3]] == alone[1:3]
    assert handles[2].slot == handles[0].slot  # the waiting request took the cancelled one's slot


def test_plain_pool_requests_join_and_leave_and_sample_as_alone(tiny):
    """The plain-decoding pool: 2 slots, 5 requests of different lengths, greedy and sampled, one
    stopping on EOS, one cancelled, one submitted while others run. Each finished request's tokens
    equal plain decoding of it alone with the same settings (same seed: the same key sequence),
    and nothing compiles once the pool's shapes were seen."""
    long_prompt = [int(t) for t in np.random.default_rng(7).integers(3, VOCAB, 33)]
    full, _, _ = run(ar_steps(engine_for(tiny)), PROMPTS[2], max_new_tokens=30)
    engine = engine_for(tiny, eos=(full[len(full) // 2],))
    jobs = [(PROMPTS[2], GenerationSettings(max_new_tokens=30)),
            (PROMPTS[0], GenerationSettings(max_new_tokens=12, temperature=0.9, top_k=20, seed=5)),
            (long_prompt, GenerationSettings(max_new_tokens=14, temperature=1.0, top_p=0.8, seed=9)),
            (PROMPTS[1], GenerationSettings(max_new_tokens=9)), (PROMPTS[0], GenerationSettings(max_new_tokens=40))]
    alone = [[t for kept, _ in ar_steps(engine)(prompt, settings) for t in kept] for prompt, settings in jobs]
    assert len(alone[0]) < 30, "the first request should stop on EOS"

    def serve():
        pool = engine.batcher(2, 2048, plain=True)
        try:
            handles = [pool.submit(p, s) for p, s in jobs[:-1]]
            steps = 0
            while pool.active:
                for request, kept, accepted in pool.step():
                    assert accepted == (0 if kept == request.token_ids[:1] and len(request.token_ids) == 1 else 1)
                steps += 1
                if steps == 3:
                    handles.append(pool.submit(*jobs[-1]))
                if len(handles) == 5 and not handles[-1].done and len(handles[-1].token_ids) > 1:
                    # once it has run a step (the pool decodes a chunk of up to 32 tokens a step)
                    assert pool.cancel(handles[-1])
        finally:
            pool.close()
        return handles

    handles = serve()
    assert [h.token_ids for h in handles[:4]] == alone[:4]
    assert handles[0].finish_reason == "eos" and handles[3].finish_reason == "length"
    assert handles[4].finish_reason == "cancelled" and handles[4].token_ids == alone[4][:len(handles[4].token_ids)]
    assert all(set(h.stats.accept_lengths) <= {1} for h in handles)
    with compilations() as compiles:
        again = serve()
    assert [h.token_ids for h in again[:4]] == alone[:4]
    assert compiles == []


def test_pool_that_does_not_fit_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match=r"GiB of caches.*fewer slots"):
        Batcher(engine_for(tiny), 1 << 20, 2048)
    pool = Batcher(engine_for(tiny), 1, 64)
    try:
        with pytest.raises(ValueError, match="exceeds the pool's 64"):
            pool.submit(PROMPTS[0], GenerationSettings(max_length=128))
        with pytest.raises(ValueError, match="vocabulary"):
            pool.submit([VOCAB + 1], GenerationSettings(max_length=64))
    finally:
        pool.close()


def test_batched_autoregressive_decoding_equals_each_alone(tiny):
    engine = engine_for(tiny)
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    settings = [GenerationSettings(max_new_tokens=n) for n in (12, 3, 20)]
    alone = [run(ar_steps(engine), p, max_new_tokens=s.max_new_tokens)[0] for p, s in zip(prompts, settings)]
    assert decode_together(engine, prompts, settings, plain=True) == alone


def test_a_decoder_of_the_target_alone_decodes_as_the_engines_plain_pool(tiny):
    """What training runs (an `AutoregressiveDecoder` over a target without a head, its pool made
    by `pool_for`) gives the engine's plain decoding, greedy and sampled, alone and together."""
    engine = engine_for(tiny)
    decoder = AutoregressiveDecoder(tiny.model.target, ShapeSettings(min_bucket=64), eos_ids=(EOS,))
    prompts = [PROMPTS[2], PROMPTS[0]]
    settings = [GenerationSettings(max_new_tokens=20), GenerationSettings(max_new_tokens=9, temperature=0.9, seed=4)]
    want = decode_together(engine, prompts, settings, plain=True)
    assert decode_together(decoder, prompts, settings) == want
    assert [[t for e in decode(decoder, p, s) for t in e.ids] for p, s in zip(prompts, settings)] == want


def test_a_pool_on_a_longer_cache_set_keeps_a_running_rows_samples_when_another_joins(tiny):
    """A pool handed a longer cache set than it asked for (the engine keeps the last set) takes
    that set's length as its own: a prefill of a joining request leaves the running rows' keys
    alone, so a sampled request decodes as alone."""
    engine = engine_for(tiny, eos=())  # no EOS: the sampled request runs past the other's admission
    sampled = GenerationSettings(max_new_tokens=40, max_length=96, temperature=1.0, seed=6)
    alone = [t for e in decode(engine, PROMPTS[0], sampled, plain=True) for t in e.ids]
    # a DART pool of two slots leaves the engine its set of over 2048 positions
    decode_together(engine, [PROMPTS[1]] * 2, [GenerationSettings(max_new_tokens=2)] * 2)
    pool = engine.batcher(2, 96, plain=True)
    try:
        first = pool.submit(PROMPTS[0], sampled)
        pool.step()  # its prefill
        pool.step()  # a chunk
        pool.submit(PROMPTS[1], GenerationSettings(max_new_tokens=4, max_length=96))
        for _ in Driver(pool).run():
            pass
    finally:
        pool.close()
    assert pool.length >= 2048 and len(alone) == 40 and first.token_ids == alone


# ------------------------------------------------------------------------------------------------
# the adaptive tree budget (keep="auto"): the engine's mechanics under scripted choices


class ScriptedSizer:
    """Plays a fixed cycle of tree sizes (0: a chunk of plain decoding), whatever the timings."""

    adaptive = True

    def __init__(self, plan, pays=True):
        self.plan, self.calls, self.observed, self.pays = plan, 0, [], pays

    def drafting_pays(self, rows):
        return self.pays

    def row(self):
        return None

    def choose(self, rows, measure, live=()):
        size = self.plan[self.calls % len(self.plan)]
        self.calls += 1
        return size

    def observe(self, size, rows, accepted, seconds, per_row=()):
        self.observed.append((size, accepted))


def adaptive_engine(tiny, plan, trie=None, **kw):
    engine = engine_for(tiny, trie, adaptive=True, keep=11, **kw)
    assert engine.tree_sizes == (0, 3, 11)
    engine.sizer = ScriptedSizer(plan)
    return engine


def test_adaptive_sizes_and_plain_chunks_keep_the_greedy_output(tiny):
    trie = cheating_trie(tiny)
    for plan in ([0, 3, 11, 0], [11, 0]):
        engine = adaptive_engine(tiny, plan, trie)
        for prompt in PROMPTS:
            ids, _, stats = run(dart_steps(engine), prompt, max_new_tokens=40)
            assert ids == hf_generate(tiny, prompt, 40)
            assert {0, 11} <= set(stats.tree_sizes), stats.tree_sizes
            assert len(stats.tree_sizes) == len(stats.accept_lengths) == stats.steps
        sizes = [size for size, _ in engine.sizer.observed]
        plain = [accepted for size, accepted in engine.sizer.observed if size == 0]
        assert set(sizes) == set(plan) and max(plain) == engine.plain_chunk  # a full chunk in one call
    # a plain chunk stops on EOS and on max_new_tokens inside the chunk, as plain decoding does
    full = hf_generate(tiny, PROMPTS[1], 30, eos=None)
    stop = full[5]
    stopping = adaptive_engine(tiny, [0], trie, eos=(stop,))
    assert run(dart_steps(stopping), PROMPTS[1], max_new_tokens=30)[0] == hf_generate(tiny, PROMPTS[1], 30, eos=stop)
    assert run(dart_steps(adaptive_engine(tiny, [0, 3])), PROMPTS[2], max_new_tokens=7)[0] == \
        hf_generate(tiny, PROMPTS[2], 7)


def test_where_no_tree_can_pay_the_plain_decoder_runs_without_the_drafter(tiny):
    """keep="auto" on a device where the sizer finds that no tree could beat plain decoding: the
    engine decodes with its plain decoder (the drafter's prefill and steps never run), each
    sequence is still the target's greedy output within its own limits, and the stats count
    every token after the first as a plain one."""
    engine = engine_for(tiny, adaptive=True, keep=8)
    engine.sizer = ScriptedSizer([8], pays=False)

    def no_drafting(*args, **kwargs):
        raise AssertionError("the DART prefill ran although drafting cannot pay")

    engine._prefill = engine._step = engine._plain = no_drafting
    prompts, limits = [PROMPTS[2], PROMPTS[0], PROMPTS[1]], (30, 5, 21)
    stats = [Stats() for _ in prompts]
    outs = [[] for _ in prompts]
    for rows in decode_rows(engine, prompts, [GenerationSettings(max_new_tokens=n) for n in limits], stats):
        for out, (kept, _) in zip(outs, rows):
            out.extend(kept)
    assert outs == [hf_generate(tiny, p, n) for p, n in zip(prompts, limits)]
    for out, st in zip(outs, stats):
        assert st.token_ids == out and st.new_tokens == len(out)
        assert st.tree_sizes == [0] * (len(out) - 1) == [0] * len(st.accept_lengths)
    ids, counts, _ = run(dart_steps(engine), PROMPTS[1], max_new_tokens=9)
    assert ids == hf_generate(tiny, PROMPTS[1], 9) and set(counts) == {1}


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_adaptive_sizes_in_a_batch_decode_each_sequence_as_alone(tiny):
    engine = adaptive_engine(tiny, [0, 11, 0, 3], cheating_trie(tiny))
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    limits = (30, 5, 21)
    outs = [[] for _ in prompts]
    for rows in decode_rows(engine, prompts, [GenerationSettings(max_new_tokens=n) for n in limits],
                                    [Stats() for _ in prompts]):
        for out, (kept, _) in zip(outs, rows):
            out.extend(kept)
    assert outs == [hf_generate(tiny, p, n) for p, n in zip(prompts, limits)]


def test_plain_chunks_sample_what_the_baseline_samples(tiny):
    """Size 0 runs the baseline's token loop with the same keys: the same seed gives the same
    sample (the baseline's distribution is checked against the exact one above)."""
    engine = adaptive_engine(tiny, [0])
    for seed in range(4):
        kw = dict(max_new_tokens=24, temperature=1.1, top_p=0.9, seed=seed)
        assert run(dart_steps(engine), PROMPTS[0], **kw)[0] == run(ar_steps(engine), PROMPTS[0], **kw)[0]


def test_keep_auto_is_the_default_and_its_options(tiny):
    model = DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path)
    assert model.engine.adaptive and model.engine.tree_sizes == (0, 3, 15, 60)
    assert DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, keep="auto", max_keep=20).engine.tree_sizes \
        == (0, 3, 20)  # a 16-node tree is within 3x of a 21-node one (auto_sizes)
    fixed = DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, keep=16).engine
    assert not fixed.adaptive and fixed.tree_sizes == (16,)
    with pytest.raises(ValueError, match="max_keep"):
        DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, keep=16, max_keep=20)
    with pytest.raises(ValueError, match="auto"):
        DartModel.from_pretrained(tiny.base, tiny.head, tiny.trie_path, keep="big")


def test_adaptive_budget_compiles_nothing_after_its_first_generation(tiny):
    engine = engine_for(tiny, cheating_trie(tiny), adaptive=True, keep=11)
    engine.sizer.eager = True  # a warm-up: the first step times every size, each compiles once
    run(dart_steps(engine), PROMPTS[0], max_new_tokens=24)
    with compilations() as compiles:
        for prompt in PROMPTS:
            assert run(dart_steps(engine), prompt, max_new_tokens=24)[0] == hf_generate(tiny, prompt, 24)
    assert compiles == []
    assert engine.sizer.summary()["sizes_run"][1] == [0, 3, 11]


def test_keep_auto_runs_one_step_program_before_its_first_dart_step(tiny):
    """keep="auto" times nothing ahead (dart_jax.decoding.adaptive, "lazily timed"): before a new
    engine's first DART step the only device call besides the prefill is that step itself, of the
    size the priors favour (3 nodes here: 4 tokens at most for 1.5 plain tokens' time against
    5 for 2.5 with the head's 4 draft rows), so the first answer compiles one step program; the
    other programs come as the rule, the probes or the exploration pick them, and the output
    stays the target's greedy one."""
    engine = engine_for(tiny, adaptive=True, keep=11)
    assert engine.tree_sizes == (0, 3, 11) and engine.depth == 4 and not engine.sizer.eager
    calls, step, plain = [], engine.step, engine.plain

    def spy(name, call):
        def called(*args, **kwargs):
            calls.append((name, kwargs["n"] if name == "step" else kwargs["chunk"]))
            return call(*args, **kwargs)
        return called

    engine.step, engine.plain = spy("step", step), spy("plain", plain)
    events = decode(engine, PROMPTS[1], GenerationSettings(max_new_tokens=80))
    ids = next(events).ids + next(events).ids  # the prefill's token, then the first DART step's
    before = list(calls)
    ids += [t for event in events for t in event.ids]
    assert ids == hf_generate(tiny, PROMPTS[1], 80)
    assert before == [("step", 4)], before
    assert len(set(calls)) > 1, calls  # the answer went on to another program (plain chunks: poor drafts)
