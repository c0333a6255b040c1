"""Forced acceptance (`bench e2e --force-tau`, dart_jax/bench/forced.py).

Oracles: the truncated geometric mean in closed form; the n-gram search's own (Numba) tree
encoder for the NumPy re-encoder; a NumPy walk of greedy acceptance over edited trees; a
plain-Python restatement of the device loop's edit (`forced_device.force_trees`); plain greedy decoding
by full forwards of the target without a cache (no engine, no KV cache) for the outputs.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dart_jax import bench
from dart_jax.bench import cli
from dart_jax.bench.forced import (DepthSequence, Forcing, acceptance_rate, calibrate, draw_depth, encode_tree,
                                   force_tree, parse_taus, reference_outputs, step_split)
from dart_jax.decoding.batcher import Batcher
from dart_jax.decoding.driver import Driver
from dart_jax.bench.forced_device import force_trees
from dart_jax.ngram import TreeSettings
from dart_jax.decoding.settings import GenerationSettings


def truncated_geometric_mean(alpha: float, dmax: int) -> float:
    """1 + E[min(G, dmax)], G = successes before the first failure: 1 + α(1 - α^dmax)/(1 - α)."""
    return 1.0 + (dmax if alpha == 1.0 else alpha * (1 - alpha ** dmax) / (1 - alpha))


@pytest.mark.parametrize("tau,dmax", [(1.0, 7), (2.0, 7), (3.61, 7), (5.0, 7), (3.0, 3), (8.0, 7)])
def test_depth_law_has_the_asked_mean(tau, dmax):
    alpha = acceptance_rate(tau, dmax)
    assert truncated_geometric_mean(alpha, dmax) == pytest.approx(tau, abs=1e-6)
    grid = np.array([draw_depth(u, alpha, dmax) for u in (np.arange(20000) + 0.5) / 20000])
    assert grid.min() >= 0 and grid.max() <= dmax
    assert grid.mean() + 1 == pytest.approx(tau, abs=1e-3)  # the law's mean over evenly spread quantiles
    for k in range(1, dmax + 1):  # P(D >= k) = α^k
        assert (grid >= k).mean() == pytest.approx(alpha ** k, abs=1e-3)
    for n in (30, 300):  # a run's mean is close to τ already after a few dozen steps
        seq = DepthSequence(alpha, dmax, seed=1)
        draws = [seq() for _ in range(n)]
        assert np.mean(draws) + 1 == pytest.approx(tau, abs=6.0 / n)  # random draws: ± 1.4/√n (1 sd)


def test_unreachable_tau_is_refused_with_the_range():
    with pytest.raises(ValueError, match=r"out of reach.*\[1, 8\]"):
        acceptance_rate(9.5, 7)
    with pytest.raises(ValueError, match="--force-tau"):
        parse_taus("2,x")
    assert parse_taus("2, 3,3.61") == [2.0, 3.0, 3.61]


def searched_trees(count: int, keep: int = 20, rows: int = 6, k: int = 6, vocab: int = 12, seed: int = 0):
    """Real DART trees: the n-gram-free search on random candidates (a small vocabulary, so that
    paths share tokens and the edit meets existing matches)."""
    rng = np.random.default_rng(seed)
    settings = TreeSettings(keep=keep, beam_width=5, topk=k, ngram_weight=0.0)
    ids = np.stack([np.stack([rng.choice(vocab, k, replace=False) for _ in range(rows)]) for _ in range(count)])
    probs = rng.dirichlet(np.ones(k), size=(count, rows)).astype(np.float32)
    preceding = rng.integers(0, vocab, (count, 3))
    tree = settings.search(ids, probs, preceding, np.full(count, 3), None, eos_id=None)
    return tree, rows


def test_encoder_reproduces_the_search_encoding():
    tree, rows = searched_trees(30)
    for b in range(30):
        n = int(tree.num_nodes[b])
        ours = encode_tree(tree.tokens[b, :n], tree.parents[b, :n], tree.tokens.shape[1], rows)
        for name in ("tokens", "positions", "parents", "mask", "retrieve", "num_nodes", "num_leaves"):
            np.testing.assert_array_equal(ours[name], np.asarray(getattr(tree, name)[b]), err_msg=name)


def greedy_walk(tree: dict, reference: list[int]) -> int:
    """Nodes greedy acceptance takes when the target's argmax after the root's path of length i is
    reference[i] (and matches nothing off that path): follow each leaf row while tokens match."""
    best = 0
    for row in tree["retrieve"]:
        nodes = [int(j) for j in row if j >= 0]
        run = 0
        for i, node in enumerate(nodes[1:]):
            if i < len(reference) and tree["tokens"][node] == reference[i]:
                run += 1
            else:
                break
        best = max(best, run)
    return best


def check_well_formed(tree: dict, n: int) -> None:
    parents, positions, mask = tree["parents"], tree["positions"], tree["mask"]
    assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, n)) and all(parents[n:] == -1)
    assert all(positions[i] == positions[parents[i]] + 1 for i in range(1, n))
    assert all(positions[i] <= positions[i + 1] for i in range(n - 1))
    for i in range(n):  # mask row = the node and its ancestors
        anc, j = {i}, i
        while parents[j] >= 0:
            j = parents[j]
            anc.add(j)
        assert set(np.flatnonzero(mask[i])) == anc
    for i in range(1, n):  # siblings are distinct
        sib = [j for j in range(1, n) if parents[j] == parents[i] and j != i]
        assert all(tree["tokens"][j] != tree["tokens"][i] for j in sib)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_edited_trees_accept_exactly_the_drawn_depth(seed):
    tree, rows = searched_trees(40, seed=seed)
    rng = np.random.default_rng(seed)
    slots = tree.tokens.shape[1]
    for b in range(40):
        n = int(tree.num_nodes[b])
        depth = int(rng.integers(0, rows + 1))
        reference = rng.integers(0, 12, rows + 1).tolist()  # small vocabulary: often already in the tree
        out, placed = force_tree(tree.tokens[b], tree.parents[b], n, reference[:depth], reference[depth], slots=slots,
                                 depth=rows)
        assert placed == depth
        assert int(out["num_nodes"]) == n  # the same tree size
        assert out["tokens"][0] == tree.tokens[b, 0]  # the same root
        check_well_formed(out, n)
        assert greedy_walk(out, reference) == depth


# ---------------------------------------------------------------------------------- on a model
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from dart_jax.api.model import DartModel
    from dart_jax.bench.tiny import build_random_assets
    from dart_jax.decoding.engine import Engine

    paths = build_random_assets(tmp_path_factory.mktemp("forced"), layers=3, hidden=32, seed=0)
    model = DartModel.from_pretrained(paths["base"], paths["dart"], paths["ngram"], keep=8)
    e = model.engine
    # no EOS, so that every generation runs its whole budget (a random model often says EOS early)
    engine = Engine(e.target, e.drafter, e.trie, eos_ids=[], tree_eos_id=None, tree=e.tree, shapes=e.shapes)
    return model, engine


def plain_greedy(target, prompt: np.ndarray, new: int, width: int = 128) -> list[int]:
    """Greedy decoding by a full forward of the whole sequence per token (no cache): the ids are
    padded to `width` after the end, which a causal forward does not see."""
    graphdef, state = nnx.split(target)
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids))
    ids = list(map(int, prompt))
    out = []
    for _ in range(new):
        padded = np.zeros((1, width), np.int32)
        padded[0, :len(ids)] = ids
        logits = np.asarray(forward(state, jnp.asarray(padded)))[0, len(ids) - 1]
        out.append(int(np.argmax(logits)))
        ids.append(out[-1])
    return out


def record_steps(engine, monkeypatch):
    """Spy on the engine's step: the packed tree's shape and its real nodes per row, per call."""
    from dart_jax.decoding.layout import tree_layout

    seen, step = [], engine._step

    def spy(state, tree, *args, n, depth, **kw):
        parents = tree_layout(n, depth).unpack(np.asarray(tree))["parents"]
        seen.append((np.asarray(tree).shape, (parents >= 0).sum(axis=1) + 1))
        return step(state, tree, *args, n=n, depth=depth, **kw)

    monkeypatch.setattr(engine, "_step", spy)
    return seen


def two_prompts(model, engine, new: int = 40):
    """(settings of `new` greedy tokens, two prompts, their references: plain greedy decoding a tree
    depth and one past `new`)."""
    settings = GenerationSettings(max_new_tokens=new, max_length=128, temperature=0.0)
    prompts = [np.asarray(model.encode(p, False)) for p in ("def f(x):", "Hi there")]
    return settings, prompts, [plain_greedy(engine.target, p, new + engine.depth + 1) for p in prompts]


def forced_pool(engine, prompts, settings, references, tau, seed=3):
    """A pool forced to `tau` (`Forcing`, the pool's edit) over `prompts`, stepped by the driver → (the
    forcing, the requests)."""
    forcing = Forcing(engine, tau=tau, seed=seed)
    pool = engine.batcher(len(prompts), settings.max_length, edit=forcing)
    handles = [forcing.submit(pool, p, settings, r) for p, r in zip(prompts, references)]
    for _ in Driver(pool).run():
        pass
    pool.close()
    return forcing, handles


def test_forced_run_outputs_plain_greedy_at_the_asked_tau(tiny, monkeypatch):
    model, engine = tiny
    new = 40
    settings, prompts, references = two_prompts(model, engine, new)

    normal = record_steps(engine, monkeypatch)
    pool = Batcher(engine, 2, 128)
    handles = [pool.submit(p, settings) for p in prompts]
    for _ in Driver(pool).run():
        pass
    pool.close()
    assert [list(h.token_ids) for h in handles] == [r[:new] for r in references]
    normal_steps = list(normal)

    for tau, batch in ((3.0, 2), (2.0, 1)):
        normal.clear()
        forcing, handles = forced_pool(engine, prompts[:batch], settings, references[:batch], tau)
        # the output is plain greedy decoding's, token for token
        assert [list(h.token_ids) for h in handles] == [r[:new] for r in references[:batch]]
        lengths = [n for h in handles for n in h.stats.accept_lengths]
        # every step accepted exactly what was drawn (nothing more by chance, nothing less) ...
        assert forcing.unforced_steps == 0 and forcing.capped_steps == 0
        assert sorted(lengths) == sorted(forcing.drawn)
        # ... and over the run the mean is the asked τ (13-20 steps a sequence, the last one cut by the budget)
        assert abs(np.mean(lengths) - tau) < 0.15 * tau, (tau, lengths)
        # the same tree size as a normal DART step: the same packed shape, keep + 1 real nodes
        assert normal and all(shape[1:] == normal_steps[0][0][1:] for shape, _ in normal)  # [rows, packed]
        # (a slot whose sequence has finished gets a root-only tree: 1 node)
        for steps in (normal, normal_steps):
            assert all(nodes.max() == engine.tree.keep + 1 and set(nodes) <= {1, engine.tree.keep + 1}
                       for _, nodes in steps)


def a_wrong_reference(model, engine, new: int):
    """(settings of `new` greedy tokens, a prompt, its true reference, the same with token 10 wrong)."""
    settings = GenerationSettings(max_new_tokens=new, max_length=128, temperature=0.0)
    prompt = np.asarray(model.encode("x = 1", False))
    truth = plain_greedy(engine.target, prompt, new + engine.depth + 1)
    return settings, prompt, truth, truth[:10] + [(truth[10] + 1) % 200] + truth[11:]


def test_calibration_repairs_a_reference_that_dart_leaves(tiny):
    """A wrong token in the reference stands for a near-tie that DART's verify breaks otherwise
    (bf16 on a GPU): calibration must end with the reference DART follows, here the true one."""
    model, engine = tiny
    new = 24
    settings, prompt, truth, wrong = a_wrong_reference(model, engine, new)
    refs, runs, resyncs = calibrate(engine, [prompt], settings, [wrong], tau=4.0, seed=0)
    assert (runs, resyncs) == (2, 1)
    assert refs[0][:new] == truth[:new]


@pytest.mark.extended
def test_forced_tau_on_the_command_line(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "code", "prompt": "def f(x):"}) + "\n")
    base = ["e2e", "--random", "--random-layers", "3", "--random-hidden", "32", "--max-new-tokens", "12",
            "--max-length", "96", "--keep", "4", "--no-chat", "--reps", "1", "--warmup", "0", "--prompts", str(prompts),
            "--no-progress"]
    assert bench.main([*base, "--force-tau", "1,3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [(r["tau_asked"], r["batch"]) for r in rows] == [(1.0, 1), (3.0, 1)]
    for r in rows:
        assert r["same_output"] is True
        assert r["tau"] == pytest.approx(r["tau_drawn"])  # forced exactly
        assert r["speedup"] == pytest.approx(r["dart_tok_s"] / r["ar_tok_s"])
        # a step's wall time split on the host: the device call, DART's own search (the forcing out)
        # and the rest; the steps' times fit in the run's time less the forcing (one rep: that run's)
        assert r["device_call_ms"] > 0 and r["search_ms"] > 0 and r["host_other_ms"] >= -0.01
        assert r["step_ms"] == pytest.approx(r["device_call_ms"] + r["search_ms"] + r["host_other_ms"])
        assert r["step_ms"] * r["steps"] <= 1e3 * r["new_tokens"] / r["dart_tok_s"]
    assert rows[0]["tau"] == 1.0  # τ = 1: no draft token is ever accepted
    assert out["config"]["force_tau"] == [1.0, 3.0]
    assert bench.main([*base, "--force-tau", "40"]) == 2
    assert "out of reach" in capsys.readouterr().err
    # forced in the device loop: the search and the edit are in the device call
    assert bench.main([*base, "--force-tau", "3", "--device-steps", "4", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert r["same_output"] is True and r["tau"] == pytest.approx(r["tau_drawn"]) and r["unforced_steps"] == 0
    assert r["search_ms"] == 0 and r["force_ms_per_step"] == 0 and r["device_call_ms"] > 0
    assert r["step_ms"] == pytest.approx(r["device_call_ms"] + r["host_other_ms"])
    assert bench.main([*base, "--force-tau", "3", "--device-steps", "2", "--force-batches", "2", "--overlap"]) == 2
    assert "--device-steps" in capsys.readouterr().err  # no host search to overlap
    assert bench.main([*base, "--force-tau", "3", "--overlap"]) == 2  # no pool of 2 rows to split
    assert "--overlap splits a pool of 2 or more rows" in capsys.readouterr().err


def test_the_step_split_of_a_pool_counts_each_call_once():
    """Two requests moved by the same device calls, one done in 6 steps and one in 10: each call's
    time is in both requests' device time, and the pool took 10 steps (a device loop's call runs
    its longest request's steps)."""
    def handle(steps):
        return SimpleNamespace(stats=SimpleNamespace(steps=steps, device_s=1.0, tree_s=0.0, prefill_s=0.1))

    split = step_split(SimpleNamespace(force_s=0.0), [handle(6), handle(10)], wall=1.3)
    assert split["step_ms"] == pytest.approx(120.0)  # (1.3 - 0.1) s over 10 steps
    assert split["device_call_ms"] == pytest.approx(100.0)  # 1.0 s of calls over 10 steps
    assert split["search_ms"] == 0 and split["host_other_ms"] == pytest.approx(20.0)


def test_a_forced_run_keeps_its_rows_as_it_goes(tmp_path, monkeypatch):
    """--output FILE: after each row the rows so far go to FILE.partial (what a run killed by a time
    limit leaves), and the finished run writes FILE and removes FILE.partial."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "code", "prompt": "def f(x):"}) + "\n")
    out = tmp_path / "r.json"
    writes = []
    original = cli.write_text_atomic

    def spy(path, text):
        original(path, text)
        writes.append((Path(path).name, json.loads(Path(path).read_text())))

    monkeypatch.setattr(cli, "write_text_atomic", spy)
    assert bench.main(["e2e", "--random", "--random-layers", "3", "--random-hidden", "32", "--max-new-tokens", "8",
                       "--max-length", "96", "--keep", "4", "--no-chat", "--reps", "1", "--warmup", "0", "--prompts",
                       str(prompts), "--no-progress", "--force-tau", "1,3", "--output", str(out)]) == 0
    assert [name for name, _ in writes] == ["r.json.partial", "r.json.partial", "r.json"]
    assert [[r["tau_asked"] for r in d["rows"]] for _, d in writes] == [[1.0], [1.0, 3.0], [1.0, 3.0]]
    assert writes[0][1]["partial"] is True and "meta" in writes[0][1] and "partial" not in writes[-1][1]
    assert out.exists() and not (tmp_path / "r.json.partial").exists()


# ---------------------------------------------------------------------------------- in the device loop
def restated_device_edit(tree: dict, reference: list[int], done: int, want: int) -> tuple[dict, int]:
    """forced_device.force_trees for one tree, in plain Python: the first longest leaf row is the chain;
    where it is shorter than D, the highest-index nodes off it hang below its end in index order;
    then chain tokens, siblings with a chain token and children of the end with the block token."""
    tok, par, pos = (list(map(int, tree[k])) for k in ("tokens", "parents", "positions"))
    mask, retrieve = tree["mask"].copy(), tree["retrieve"].copy()
    leaf_rows = [[int(j) for j in r if j >= 0] for r in retrieve]
    best = max(range(len(leaf_rows)), key=lambda r: (len(leaf_rows[r]), -r))
    chain = leaf_rows[best]
    free = [j for j in range(1, len(tok)) if par[j] >= 0 and j not in chain]
    d = min(want, len(chain) - 1 + len(free), max(len(reference) - done, 0))
    moved = free[len(free) - max(d - (len(chain) - 1), 0):] if d > len(chain) - 1 else []
    for j in moved:
        par[j], pos[j] = chain[-1], pos[chain[-1]] + 1
        chain.append(j)
        mask[j] = False
        mask[j, chain] = True
    for r, row in enumerate(leaf_rows):
        if set(row) & set(moved):
            retrieve[r] = -1
    retrieve[best] = -1
    retrieve[best, :len(chain)] = chain
    other = lambda t: t - 1 if t > 0 else 1  # noqa: E731
    new = list(tok)
    for p in range(1, d + 1):
        g = reference[done + p - 1]
        new[chain[p]] = g
        for j in range(1, len(tok)):
            if par[j] == chain[p - 1] and j != chain[p] and tok[j] == g:
                new[j] = other(tok[j])
    if done + d < len(reference):
        for j in range(1, len(tok)):
            if par[j] == chain[d] and tok[j] == reference[done + d]:
                new[j] = other(tok[j])
    return {"tokens": np.array(new), "positions": np.array(pos), "parents": np.array(par), "mask": mask,
            "retrieve": retrieve}, d


def device_edit(trees: list[dict], references: list[list[int]], done: list[int], want: list[int], width: int = 24):
    names = ("tokens", "positions", "parents", "mask", "retrieve")
    reference = np.full((len(trees), width), -1, np.int32)
    for i, r in enumerate(references):
        reference[i, :len(r)] = r
    out, placed, capped = jax.jit(force_trees)({k: jnp.asarray(np.stack([t[k] for t in trees])) for k in names},
                                                jnp.asarray(reference), jnp.asarray(done, jnp.int32),
                                                jnp.asarray(want, jnp.int32))
    edited = [{k: np.asarray(out[k][i]) for k in names} for i in range(len(trees))]
    return edited, np.asarray(placed), np.asarray(capped)


def check_tree_shape(tree: dict, n: int) -> None:
    """A tree in any node order: each node one deeper than its parent, mask = ancestors and self,
    each retrieve row a path from the root."""
    parents, positions = tree["parents"], tree["positions"]
    for i in range(n):
        anc, j = {i}, i
        while parents[j] >= 0:
            assert positions[j] == positions[parents[j]] + 1
            j = parents[j]
            anc.add(j)
        assert j == 0 and set(np.flatnonzero(tree["mask"][i])) == anc
    for row in tree["retrieve"]:
        nodes = [int(j) for j in row if j >= 0]
        assert all(parents[b] == a for a, b in zip(nodes, nodes[1:])) and (not nodes or nodes[0] == 0)


def test_device_edit_equals_a_plain_python_restatement():
    depth, slots = 4, 9
    # hand-made trees (tokens, parents; node 0 the root): a deep path with a sibling and a child that
    # carry the chain's and the block's tokens; two equally deep paths (the first is the chain); a
    # shallow wide tree that needs nodes moved; the root alone
    made = [([9, 5, 3, 6, 3, 7, 4], [-1, 0, 0, 1, 1, 3, 5]),
            ([9, 1, 2, 3, 4], [-1, 0, 0, 1, 2]),
            ([9, 1, 2, 3, 4, 5, 6, 7, 8], [-1, 0, 0, 0, 1, 1, 2, 2, 3]),
            ([9], [-1])]
    trees = [encode_tree(np.array(t), np.array(p), slots, depth) for t, p in made]
    cases = [  # (tree, reference, done, want)
        (0, [9, 9, 5, 6, 7, 4, 1], 2, 2),  # the tree holds the chain 5 6; the child 7 of its end is blocked
        (0, [9, 3, 6, 7, 0], 1, 3),  # 5 → 3 on the chain, so its sibling 3 changes
        (0, [9, 5, 6, 7, 4], 1, 4),  # the tree holds the whole reference: nothing changes
        (0, [9, 5, 6], 1, 4),  # capped by the reference's end (nothing to block)
        (1, [9, 2, 4, 8], 1, 2),  # two rows as deep: the first (1 → 3) takes 2 4, the sibling 2 changes
        (2, [9, 1, 2, 3, 4, 0], 1, 4),  # 2 levels deep: nodes 7 and 8 move below the chain 1 → 4
        (2, [9, 2, 7, 3, 5], 1, 3),  # one node moves, and the sibling 2 of the chain's first node changes
        (3, [9, 4, 4], 1, 2),  # the root alone: D = 0 (capped)
        (0, [9, 5], 1, 0),  # D = 0: only the block (5, below the root) changes
    ]
    got, placed, capped = device_edit([trees[t] for t, *_ in cases], [r for _, r, _, _ in cases],
                                      [d for *_, d, _ in cases], [w for *_, w in cases])
    for (t, reference, done, want), edited, d, cap in zip(cases, got, placed, capped):
        expected, d_expected = restated_device_edit(trees[t], reference, done, want)
        assert d == d_expected and cap == (d < want), (t, reference)
        for name in expected:
            np.testing.assert_array_equal(edited[name], expected[name], err_msg=f"{name} {t} {reference}")
        n = len(made[t][0])
        check_tree_shape(edited, n)
        assert greedy_walk(edited, reference[done:]) == d  # exactly D accepted where the target follows it
    assert list(placed) == [2, 3, 4, 2, 2, 4, 3, 0, 0]


def test_device_edit_on_searched_trees():
    tree, rows = searched_trees(40, seed=4)
    rng = np.random.default_rng(4)
    trees = [{k: np.asarray(getattr(tree, k)[b]) for k in ("tokens", "positions", "parents", "mask", "retrieve")}
             for b in range(40)]
    references = [rng.integers(0, 12, rows + 3).tolist() for _ in range(40)]
    done = rng.integers(0, 4, 40).tolist()
    want = rng.integers(0, rows + 1, 40).tolist()
    got, placed, _ = device_edit(trees, references, done, want)
    for b in range(40):
        expected, d = restated_device_edit(trees[b], references[b], done[b], want[b])
        assert placed[b] == d == min(want[b], len(references[b]) - done[b])  # 20 nodes: never too few
        for name in expected:
            np.testing.assert_array_equal(got[b][name], expected[name], err_msg=name)
        check_tree_shape(got[b], int(tree.num_nodes[b]))
        assert greedy_walk(got[b], references[b][done[b]:]) == d


@pytest.fixture(scope="module")
def device(tiny):
    """The forced tests' engine with 4 steps per device call, the trees searched on the device."""
    from dart_jax.decoding.engine import Engine

    _, e = tiny
    return Engine(e.target, e.drafter, e.trie, eos_ids=[], tree_eos_id=None, tree=e.tree, shapes=e.shapes,
                  device_steps=4)


@pytest.mark.extended
def test_forced_device_loop_outputs_plain_greedy_at_the_asked_tau(tiny, device):
    model, _ = tiny
    new = 40
    settings, prompts, references = two_prompts(model, device, new)
    compiles = []

    def compiled(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    def loaded(event, **kwargs):  # from the persistent compilation cache (tests/conftest.py)
        if event == "/jax/compilation_cache/cache_hits":
            compiles.append(event)

    for run, (tau, batch) in enumerate(((3.0, 2), (5.0, 1), (3.0, 2))):
        compiles.clear()
        if run == 2:
            jax.monitoring.register_event_duration_secs_listener(compiled)
            jax.monitoring.register_event_listener(loaded)
        try:
            forcing, handles = forced_pool(device, prompts[:batch], settings, references[:batch], tau)
        finally:
            if run == 2:
                jax.monitoring.unregister_event_duration_listener(compiled)
                jax.monitoring.unregister_event_listener(loaded)
        # the output is plain greedy decoding's, token for token
        assert [list(h.token_ids) for h in handles] == [r[:new] for r in references[:batch]]
        # every step accepted exactly what was drawn, the trees edited on the device ...
        assert forcing.unforced_steps == 0 and forcing.capped_steps == 0 and forcing.force_s == 0
        assert all(h.stats.tree_s == 0 for h in handles)  # no host search, no host edit
        lengths = [n for h in handles for n in h.stats.accept_lengths]
        assert (lengths if batch == 1 else sorted(lengths)) == (forcing.drawn if batch == 1 else sorted(forcing.drawn))
        # ... and over the run the mean is the asked τ
        assert abs(np.mean(lengths) - tau) < 0.15 * tau, (tau, lengths)
    assert compiles == []  # the same pool shapes again: nothing compiled (the forced loop takes arrays)


@pytest.mark.extended
def test_forced_device_loop_draws_the_law_over_a_long_run(tiny, device):
    model, _ = tiny
    new = 110
    settings = GenerationSettings(max_new_tokens=new, max_length=128, temperature=0.0)
    prompts = [np.asarray(model.encode("x = 1", False))]
    references = reference_outputs(device, prompts, settings)  # engine.baseline's greedy decoding
    for tau in (3.61, 6.0):
        forcing, (handle,) = forced_pool(device, prompts, settings, references, tau, seed=0)
        assert list(handle.token_ids) == references[0][:new]
        assert handle.stats.accept_lengths == forcing.drawn and forcing.unforced_steps == forcing.capped_steps == 0
        n = len(forcing.drawn)  # 18-30 steps: the drawn mean within O(1/n) of τ (low-discrepancy draws)
        assert np.mean(forcing.drawn) == pytest.approx(tau, abs=6.0 / n)


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_a_row_that_leaves_its_reference_on_the_device_is_no_longer_forced(tiny, device):
    """A wrong reference token (a near-tie that DART's verify breaks otherwise): the step that
    commits that position ends the row's forcing; its later steps are counted unforced, and the
    calibration repairs the reference as on the host."""
    model, _ = tiny
    new = 24
    settings, prompt, truth, wrong = a_wrong_reference(model, device, new)
    forcing, (handle,) = forced_pool(device, [prompt], settings, [wrong], 4.0)
    lengths = handle.stats.accept_lengths
    assert list(handle.token_ids) == truth[:new]  # greedy acceptance: the target's tokens whatever the tree
    k = len(forcing.drawn)
    assert forcing.unforced_steps == len(lengths) - k > 0 and lengths[:k - 1] == forcing.drawn[:k - 1]
    assert 1 + sum(lengths[:k - 1]) <= 10 < 1 + sum(lengths[:k])  # the k-th step committed position 10
    refs, runs, resyncs = calibrate(device, [prompt], settings, [wrong], tau=4.0, seed=0)
    assert (runs, resyncs) == (2, 1) and refs[0][:new] == truth[:new]
