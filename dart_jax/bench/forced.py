"""Forced acceptance: the end-to-end speedup of DART at a chosen τ, without trained weights.

Random weights give honest step costs but τ ≈ 1, so `bench e2e` on them cannot show the speedup a
trained head would give. `bench e2e --force-tau T` reproduces a chosen acceptance instead:

1. each prompt is first decoded greedily by plain autoregressive decoding of the same target
   (`driver.decode_together(..., plain=True)`), a few tokens past --max-new-tokens: the *reference*;
2. DART then runs as usual (same pool, same drafter call, same n-gram tree search, same tree size,
   same verify step, same acceptance on the device, the pool stepped by the driver), except that
   after the tree search each tree is edited on the host (`Forcing`, the pool's `DraftEdit`) so
   that it holds the reference's next D tokens as a path from the root, and NOT the (D+1)-th
   token below that path. Greedy acceptance then accepts exactly D nodes and the bonus token: the
   step's accepted length is D + 1.

D is drawn per sequence and step as D = min(G, Dmax), where G counts the successes before the
first failure of independent trials of probability α (a geometric law: each further draft token
accepted with probability α, the textbook model of speculative decoding), and Dmax is the tree's
depth (the drafter's rows). α is solved so that E[D] + 1 = T exactly, so the mean accepted length
per step (the project's τ, tokens per step including the bonus) is T; T must lie in [1, Dmax + 1].
The draws take the law's quantiles along a golden-ratio sequence (`DepthSequence`), so that a run
of a few dozen steps already has a mean close to T.
D is also capped by the nodes of the tree and by what is left of the reference (only at its end).

The tree keeps its node count and encoding: where the path needs a node the tree lacks, the
deepest node that is not on the path (a leaf) moves there; other nodes only change tokens. So the
verify sees the same shapes and the same number of real nodes as a DART step. The host edit is
timed and taken out of DART's wall time (`force_ms` reports it); what remains is DART's own step.

With `--device-steps N` (the trees searched on the device, N steps per device call) the edit runs
on the device too, inside the loop between each step's search and its verify
(`forced_device.DeviceForcing`, the engine's `TreeEdit` hook, `Forcing.device`): the host hands
each call the rows' references, their tokens so far and N depths per row drawn from the same
`DepthSequence` (a row that stops early leaves its last draws unused). It differs from the host's
edit in the chain it takes: the tree's deepest leaf path (its first, on ties) rather than a walk
down matching or best-ranked children, made D nodes long where it is shorter by moving the last
nodes off it (the highest indices: with each node they hold its children) below its end, one under
the other. No node moves where that path is deep enough (the tiny random set's keep-60 trees are
mostly 3 levels deep, so most draws past D = 3 move some), and a tree with too few real nodes caps
D (`capped_steps`). The edit is part of the device call's time (`force_ms` and `search_ms` are 0:
the search is in the device call too); the host's share, the draws and the reference rows, stays in
DART's time. A row whose committed tokens leave its reference is unforced from the loop's next step
on.

Greedy only (the acceptance is forced through the target's argmax). In bfloat16 DART's tree
verify (many query rows) may break a near-tie of the argmax otherwise than plain decoding (one
row): then DART's output leaves the reference, and a sequence that left it is no longer forced.
A Gaussian LM head over a large vocabulary has near-ties everywhere (the top two of Qwen3's
151 936 logits lie ~0.15 σ apart, and bf16 moves logits by ~0.015 σ: ~4 % of the tokens flip
between bf16 and fp32). So the random sets have a *peaked* LM head (`bench.tiny`: 16 hot rows, a
seed's printable byte tokens, never EOS, scaled ×8): the argmax is a hot token (99.8 %) with a
median margin of ~2.4 σ, as a trained model's confident token, which removes the ties against the
rest of the vocabulary; the ties left are those among the hot tokens, about 2.5 times fewer (on a
CPU in bf16, Qwen3's vocabulary, 8 layers: bf16-vs-fp32 flips 4.0 % → 1.7 %; a forced run at
τ 3.61 of 4 prompts: 20 → 3 repairs, 13 → 0 unforced steps, τ measured 3.30 → 3.62). A larger
scale would not remove the ties among the hot tokens: the LM head reads a random hidden state
linearly, so a hot logit's bf16 error grows with the scale as its margin does. Those few are the
calibration's: before the timed runs, `calibrate` reruns the forced generation (the same draws each
run) and, where the output left its reference, makes DART's output up to that token, followed by
plain greedy decoding from there, the new reference, until DART agrees with every reference
(`resynced` counts the repairs, `same_output` then compares with plain decoding from the prompt, and
`unforced_steps` counts the steps of the timed run that could not be forced).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from dart_jax.bench.e2e import open_model, tree_label
from dart_jax.bench.util import check_reps, median, progress
from dart_jax.bench.forced_device import DeviceForcing
from dart_jax.decoding.batcher import Batcher, DraftEdit
from dart_jax.decoding.driver import Driver, decode_together

__all__ = ["DepthSequence", "Forcing", "acceptance_rate", "force_tree", "encode_tree", "parse_taus", "run_forced"]


# ------------------------------------------------------------------------------ the depth law
def expected_depth(alpha: float, max_depth: int) -> float:
    """E[min(G, max_depth)] for G geometric with success probability alpha: sum of alpha^k, k = 1..max_depth."""
    return float(sum(alpha ** k for k in range(1, max_depth + 1)))


def acceptance_rate(tau: float, max_depth: int) -> float:
    """The α for which E[min(G, max_depth)] + 1 = tau (bisection; monotone in α)."""
    if not 1.0 <= tau <= max_depth + 1:
        raise ValueError(f"--force-tau {tau:g} is out of reach: with trees {max_depth} levels deep the mean accepted "
                         f"length lies in [1, {max_depth + 1}]; pass a τ in that range")
    if tau >= max_depth + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_depth(mid, max_depth) + 1 < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def draw_depth(u: float, alpha: float, max_depth: int) -> int:
    """min(G, max_depth) at the quantile u in [0, 1): the number of k in 1..max_depth with u < α^k
    (P(D >= k) = α^k for u uniform)."""
    depth = 0
    while depth < max_depth and u < alpha ** (depth + 1):
        depth += 1
    return depth


GOLDEN = (5 ** 0.5 - 1) / 2


class DepthSequence:
    """Depths with the law of `draw_depth`, drawn at the quantiles u_i = frac(u_0 + i·φ) (φ the
    golden ratio's fractional part, u_0 from `seed`): a low-discrepancy sequence, so that the mean
    over the n steps of a run is within O(1/n) of the law's mean instead of O(1/√n)."""

    def __init__(self, alpha: float, max_depth: int, seed: int = 0):
        self.alpha, self.max_depth = alpha, max_depth
        self.u = float(np.random.default_rng(seed).random())

    def __call__(self) -> int:
        self.u = (self.u + GOLDEN) % 1.0
        return draw_depth(self.u, self.alpha, self.max_depth)


def parse_taus(text: str) -> list[float]:
    """'2,3,3.61' → [2.0, 3.0, 3.61]; a ValueError naming the option otherwise."""
    try:
        taus = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--force-tau expects comma-separated numbers such as '2,3,3.61,5', got {text!r}") from None
    if not taus or min(taus) < 1.0:
        raise ValueError(f"--force-tau expects mean accepted lengths >= 1 (1 = no draft token accepted), got {text!r}")
    return taus


# ------------------------------------------------------------------------------ tree editing
def encode_tree(tokens: np.ndarray, parents: np.ndarray, slots: int, depth: int) -> dict[str, np.ndarray]:
    """A tree given by its real nodes (tokens, parents; node 0 the root, any order otherwise) in the
    search's encoding (`dart_jax.ngram.DraftTree`): nodes sorted by depth (ties by the given
    order), padded to `slots` node slots; mask = ancestors and self; retrieve = one row per leaf in
    lexicographic order of the token paths (ties by node index), padded with -1 to depth + 1."""
    n = len(tokens)
    level = np.full(n, -1, np.int64)
    level[0] = 0
    for start in range(n):  # depth of each node by walking up (n is small: ~60)
        chain, j = [], start
        while level[j] < 0:
            chain.append(j)
            j = parents[j]
        for i in reversed(chain):
            level[i] = level[parents[i]] + 1
    order = sorted(range(n), key=lambda i: (level[i], i))
    new = np.empty(n, np.int64)
    new[order] = np.arange(n)
    out_tokens = np.zeros(slots, np.int32)
    out_positions = np.zeros(slots, np.int32)
    out_parents = np.full(slots, -1, np.int32)
    out_tokens[:n] = np.asarray(tokens)[order]
    out_positions[:n] = level[order]
    for i in range(1, n):
        out_parents[new[i]] = new[parents[i]]
    mask = np.eye(slots, dtype=bool)
    for i in range(1, n):
        j = out_parents[i]
        mask[i] |= mask[j]  # parents come first: their rows are final
    has_child = np.zeros(n, bool)
    has_child[out_parents[1:n]] = True
    leaves = [i for i in range(1, n) if not has_child[i]] or ([0] if n == 1 else [])
    paths = []
    for leaf in leaves:
        path, j = [], leaf
        while j >= 0:
            path.append(j)
            j = out_parents[j]
        paths.append(path[::-1])
    paths.sort(key=lambda p: ([int(out_tokens[j]) for j in p[1:]], p[-1]))
    retrieve = np.full((slots - 1, depth + 1), -1, np.int32)
    for r, path in enumerate(paths):
        retrieve[r, :len(path)] = path
    return {"tokens": out_tokens, "positions": out_positions, "parents": out_parents, "mask": mask,
            "retrieve": retrieve, "num_nodes": np.int32(n), "num_leaves": np.int32(len(paths))}


def _fresh_token(taken: set[int], avoid: int) -> int:
    t = 0
    while t in taken or t == avoid:
        t += 1
    return t


def force_tree(tokens: np.ndarray, parents: np.ndarray, num_nodes: int, path: Sequence[int], block: int | None,
               *, slots: int, depth: int) -> tuple[dict[str, np.ndarray], int]:
    """One searched tree (its first `num_nodes` real nodes) edited to hold `path` (the target's next
    tokens) as a chain from the root, with no child of the chain's end carrying `block` (the token
    after the path; None: nothing to block). Returns (the tree in the search's encoding, the length
    of the chain actually placed: `len(path)` unless the tree has too few nodes)."""
    n = int(num_nodes)
    tok = [int(t) for t in tokens[:n]]
    par = [int(p) for p in parents[:n]]
    on_chain = [False] * n
    on_chain[0] = True
    cur, placed = 0, 0

    def children(node):
        return [j for j in range(1, n) if par[j] == node]

    for g in path:
        kids = children(cur)
        match = [j for j in kids if tok[j] == g]
        if match:
            nxt = match[0]
        elif kids:
            nxt = kids[0]  # the best-ranked child takes the token (its subtree stays below it)
            tok[nxt] = g
        else:  # a leaf on the chain: move the deepest node off the chain (a leaf) under it
            free = [j for j in range(n - 1, 0, -1) if not on_chain[j] and not children(j)]
            if not free:
                break
            nxt = free[0]
            par[nxt], tok[nxt] = cur, g
        for j in children(cur):  # siblings never repeat the chain's token
            if j != nxt and tok[j] == g:
                tok[j] = _fresh_token({tok[k] for k in children(cur)}, g)
        on_chain[nxt] = True
        cur, placed = nxt, placed + 1
    if block is not None and placed == len(path):
        for j in children(cur):
            if tok[j] == block:
                tok[j] = _fresh_token({tok[k] for k in children(cur)}, block)
    return encode_tree(np.asarray(tok), np.asarray(par), slots, depth), placed


class Forcing(DraftEdit):
    """Acceptance forced to a mean length `tau` (module docstring) as a pool's `DraftEdit`: open the
    pool with `engine.batcher(slots, max_length, edit=forcing)`, submit each request with
    `forcing.submit(pool, ids, settings, reference)`, where `reference` is its greedy continuation
    (plain decoding's tokens, the prefill's first token first), and step the pool as any other (the
    driver). On an engine with `device_steps` the trees are edited in the device loop (`device`:
    `DeviceForcing`), and `force_s` stays 0."""

    def __init__(self, engine, *, tau: float, seed: int = 0):
        if engine.adaptive:
            raise ValueError("--force-tau needs a fixed tree size (keep=auto may skip the tree): pass --keep N")
        self.max_depth = engine.depth
        self.alpha = acceptance_rate(tau, self.max_depth)
        self.depths = DepthSequence(self.alpha, self.max_depth, seed)
        self.references: dict[int, np.ndarray] = {}
        self.force_s = 0.0
        self.drawn: list[int] = []  # D + 1 of every forced step (what the accepted length must be)
        self.unforced_steps = 0
        self.capped_steps = 0  # steps whose chain the tree or the reference's end cut short
        self.device = DeviceForcing() if engine.device_steps else None

    def submit(self, pool, prompt_ids, settings, reference: Sequence[int], stats=None):
        """`pool.submit`, the request forced onto `reference`."""
        if settings.temperature > 0:
            raise ValueError("--force-tau forces greedy acceptance: use --temperature 0")
        request = pool.submit(prompt_ids, settings, stats)
        self.references[request.index] = np.asarray(reference, np.int64)
        return request

    def _reference(self, request) -> np.ndarray | None:
        """The request's reference while its output so far follows it, else None (no longer forced)."""
        ref = self.references.get(request.index)
        done = len(request.token_ids)  # the root is token done - 1 of the reference
        if ref is None or done > ref.size or np.any(ref[:done] != np.asarray(request.token_ids)):
            return None
        return ref

    def searched(self, pool, trees: dict[str, np.ndarray], rows: list[int], start: int) -> None:
        """Each busy row's tree, as DART's search made it, edited (`force_tree`)."""
        t0 = time.perf_counter()
        for slot in rows:
            request = pool.busy[slot]
            ref = self._reference(request)
            if ref is None:
                self.unforced_steps += 1
                continue
            done = len(request.token_ids)
            want = self.depths()
            path = ref[done:done + want]
            block = int(ref[done + len(path)]) if done + len(path) < ref.size else None
            i = slot - start  # its row in the trees
            num_nodes = 1 + int((trees["parents"][i] >= 0).sum())  # real nodes come first
            tree, placed = force_tree(trees["tokens"][i], trees["parents"][i], num_nodes, path.tolist(), block,
                                      slots=trees["tokens"].shape[1], depth=pool.depth)
            if placed < want:
                self.capped_steps += 1
            self.drawn.append(placed + 1)
            for name in trees:
                trees[name][i] = tree[name]
        self.force_s += time.perf_counter() - t0

    def device_inputs(self, pool, rows: list[int], m: int, steps: int) -> dict:
        """`DeviceForcing`'s inputs: each forced row's reference, tokens so far and `steps` depths
        drawn now (those of steps a row does not take go unused)."""
        # a fixed reference width (no new compilation per request): a row reads its reference up to
        # the token after its last chain, at most max_length + depth
        width = pool.max_length + pool.depth + 1
        reference = np.full((m, width), -1, np.int32)
        done, depths, forced = np.zeros(m, np.int32), np.zeros((m, steps), np.int32), np.zeros(m, bool)
        for slot in rows:
            request = pool.busy[slot]
            done[slot] = len(request.token_ids)
            ref = self._reference(request)
            if ref is not None:
                ref = ref[:width]
                reference[slot, :ref.size], forced[slot] = ref, True
                depths[slot] = [self.depths() for _ in range(steps)]
        return {"reference": jnp.asarray(reference), "done": jnp.asarray(done), "depths": jnp.asarray(depths),
                "forced": jnp.asarray(forced)}

    def device_answer(self, pool, rows: list[int], out: dict) -> None:
        for slot in rows:
            self.drawn.extend(int(d) for d in out["drawn"][slot] if d > 0)
        self.unforced_steps += int(out["unforced"][rows].sum())
        self.capped_steps += int(out["capped"][rows].sum())


# ------------------------------------------------------------------------------ the bench
def reference_outputs(engine, prompts: list[np.ndarray], settings) -> list[list[int]]:
    """Plain greedy decoding of each prompt (the target's own continuation), a tree depth plus one
    tokens past max_new_tokens so that no forced path is cut by the reference's end."""
    longer = dataclasses.replace(settings, max_new_tokens=settings.max_new_tokens + engine.depth + 1)
    return decode_together(engine, prompts, [longer] * len(prompts), plain=True)


def first_mismatch(output: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where `output` leaves `reference` (None: a prefix of it)."""
    for i, t in enumerate(output):
        if i >= len(reference) or t != reference[i]:
            return i
    return None


def forced_run(engine, prompts, settings, references, *, tau: float, seed: int,
               overlap: bool = False) -> tuple[Batcher, list, float]:
    """One forced generation of `prompts` in a pool of len(prompts) slots (`overlap`: the pool
    overlaps half the rows' tree search with the other half's verify), stepped by the driver →
    (pool, requests, wall s); the pool's `edit` is its `Forcing`."""
    forcing = Forcing(engine, tau=tau, seed=seed)
    pool = engine.batcher(len(prompts), settings.max_length, overlap=overlap, edit=forcing)
    try:
        t0 = time.perf_counter()
        handles = [forcing.submit(pool, p, settings, r) for p, r in zip(prompts, references)]
        for _ in Driver(pool).run():
            pass
        wall = time.perf_counter() - t0
    finally:
        pool.close()
    return pool, handles, wall


def calibrate(engine, prompts, settings, references, *, tau: float, seed: int, passes: int = 6):
    """References DART's forced run agrees with: where DART's output leaves a reference (a near-tie
    its tree verify breaks otherwise than plain decoding, as bf16 on an accelerator does), the
    reference becomes DART's output up to and including that token, then plain greedy decoding
    from there; rerun (the same draws, so the same trees up to that point) until no output leaves
    its reference, at most `passes` runs. → (references, runs made, resynchronised positions)."""
    references = [list(r) for r in references]
    resyncs = 0
    for run in range(1, passes + 1):
        _, handles, _ = forced_run(engine, prompts, settings, references, tau=tau, seed=seed)
        moved = False
        for i, h in enumerate(handles):
            at = first_mismatch(list(h.token_ids), references[i])
            if at is None:
                continue
            prefix = [int(t) for t in h.token_ids[:at + 1]]
            rest = dataclasses.replace(settings, max_new_tokens=max(len(references[i]) - len(prefix), 1))
            tail = decode_together(engine, [np.concatenate([np.asarray(prompts[i]), prefix]).astype(np.int32)],
                                   [rest], plain=True)[0] if prefix[-1] not in engine.eos_ids else []
            references[i] = prefix + [int(t) for t in tail]
            resyncs, moved = resyncs + 1, True
        if not moved:
            return references, run, resyncs
    return references, passes, resyncs


def overlapped(engine, prompts, settings, references, *, tau: float, seed: int, reps: int, warmup: int,
               rate: float, ar_rate: float, ar_out: list, bar) -> dict[str, Any]:
    """The forced runs again through an overlapped pool (`run_forced`'s `overlap`): its row fields."""
    rates, last = [], None
    for rep in range(warmup + reps):  # the first `warmup` runs compile the half-steps
        pool, handles, wall = forced_run(engine, prompts, settings, references, tau=tau, seed=seed, overlap=True)
        if rep >= warmup:
            rates.append(sum(len(h.token_ids) for h in handles) / (wall - pool.edit.force_s))
        last = (pool, handles)
        bar.update()
    pool, handles = last
    lengths = [n for h in handles for n in h.stats.accept_lengths]
    o, halves = median(rates), max(pool.overlap_stats["half_steps"], 1)
    return {"overlap_tok_s": o, "overlap_speedup": o / ar_rate, "overlap_gain": o / rate,
            "overlap_tau": float(np.mean(lengths)) if lengths else float("nan"),
            "overlap_same_output": [list(h.token_ids) for h in handles] == ar_out,
            "overlap_unforced_steps": pool.edit.unforced_steps, "overlap_half_steps": pool.overlap_stats["half_steps"],
            "overlap_search_ms_per_half_step": 1e3 * pool.overlap_stats["search_s"] / halves,
            "overlap_wait_ms_per_half_step": 1e3 * pool.overlap_stats["wait_s"] / halves}


def run_forced(models, work, *, taus: Sequence[float], batches: Sequence[int] = (1,), reps: int = 1,
               warmup: int = 1, seed: int = 0, show_progress: bool = True, overlap: bool = False,
               on_rows: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """For each forced τ and batch size B: tokens/s of DART with forced acceptance (a pool of B
    slots over B prompts, host forcing time taken out) and of batched plain decoding on the same
    prompts, the speedup, τ measured, and whether both outputs agree. Medians over `reps`.
    `overlap`: at B >= 2 the same runs again through a pool that overlaps half the rows' tree search
    with the other half's verify (`Batcher(overlap=True)`); the row adds `overlap_tok_s`,
    `overlap_speedup` (over plain decoding), `overlap_gain` (over the default pool), its own
    `overlap_same_output` and `overlap_tau`, and the pool's host search and wait per half-step.
    `on_rows`: called with the result so far after each row (a run cut short keeps its rows)."""
    check_reps(reps, warmup)
    if work.temperature > 0:
        raise ValueError("--force-tau forces greedy acceptance: use --temperature 0")
    if overlap and models.device_steps:
        raise ValueError("--overlap searches half the rows' trees on the host while the device verifies the other "
                         "half; with --device-steps the trees are searched on the device: use one or the other")
    items, settings = work.items(), work.settings(seed)
    if min(batches) < 1:
        raise ValueError(f"--batches must be >= 1, got {list(batches)}")
    rows = []
    with open_model(models, seed) as (model, source):
        engine = model.engine
        if engine.adaptive:
            engine = engine.with_tree(engine.tree, adaptive=False)  # the largest size, every step
        for tau in taus:
            acceptance_rate(tau, engine.depth)  # refuse an unreachable τ before anything runs
        config = {"model": source, "num_prompts": len(items), **work.config(seed), "keep": tree_label(engine),
                  "tree_depth": engine.depth, "force_tau": list(taus), "batches": list(batches), "overlap": overlap,
                  "reps": reps, "warmup": warmup, "depth_law": "D = min(Geometric(alpha), tree depth), E[D] + 1 = tau",
                  "device_steps": engine.device_steps, "verify_gemms": engine.verify_gemms,
                  "attention": engine.target.attention_kernel}
        ids = [model.encode(item["prompt"], work.chat) for item in items]
        runs_per_tau = sum(1 + (overlap and b > 1) for b in batches)
        bar = progress((len(batches) + len(taus) * runs_per_tau) * (reps + warmup), "forced", show_progress)
        for b in batches:
            prompts = [ids[i % len(ids)] for i in range(b)]
            plain_refs = reference_outputs(engine, prompts, settings)
            ar_rates, ar_out = [], None
            for rep in range(warmup + reps):
                t0 = time.perf_counter()
                ar_out = decode_together(engine, prompts, [settings] * b, plain=True)
                if rep >= warmup:
                    ar_rates.append(sum(map(len, ar_out)) / (time.perf_counter() - t0))
                bar.update()
            for tau in taus:
                # the calibration runs are the warm-up (they compile); every run draws the same depths
                refs, runs, resyncs = calibrate(engine, prompts, settings, plain_refs, tau=tau, seed=seed)
                rates, raw_rates, last = [], [], None
                for rep in range(max(warmup - runs, 0) + reps):
                    pool, handles, wall = forced_run(engine, prompts, settings, refs, tau=tau, seed=seed)
                    tokens = sum(len(h.token_ids) for h in handles)
                    if rep >= warmup - runs:
                        rates.append(tokens / (wall - pool.edit.force_s))
                        raw_rates.append(tokens / wall)
                    last = (pool, handles, wall)
                    bar.update()
                pool, handles, wall = last
                forcing = pool.edit
                lengths = [n for h in handles for n in h.stats.accept_lengths]
                split = step_split(forcing, handles, wall)
                steps = sum(h.stats.steps for h in handles)
                rate, ar_rate = median(rates), median(ar_rates)
                rows.append({"tau_asked": tau, "batch": b, "tau": float(np.mean(lengths)) if lengths else float("nan"),
                             "tau_drawn": float(np.mean(forcing.drawn)) if forcing.drawn else float("nan"),
                             "alpha": forcing.alpha, "steps": steps,
                             "new_tokens": sum(len(h.token_ids) for h in handles),
                             "dart_tok_s": rate, "dart_tok_s_with_forcing": median(raw_rates), "ar_tok_s": ar_rate,
                             "speedup": rate / ar_rate, "force_ms_per_step": 1e3 * forcing.force_s / max(steps, 1),
                             **split, "unforced_steps": forcing.unforced_steps, "capped_steps": forcing.capped_steps,
                             "calibration_runs": runs, "resynced": resyncs,
                             "same_output": [list(h.token_ids) for h in handles] == ar_out,
                             **(overlapped(engine, prompts, settings, refs, tau=tau, seed=seed, reps=reps,
                                           warmup=warmup, rate=rate, ar_rate=ar_rate, ar_out=ar_out, bar=bar)
                                if overlap and b > 1 else {})})
                if on_rows is not None:
                    on_rows(forced_result(rows, config))
        bar.close()
    return forced_result(rows, config)


def step_split(forcing: Forcing, handles, wall: float) -> dict[str, float]:
    """Where a pool step's wall time went in a forced run (host clocks, no profiler), ms per step:
    `step_ms` (the run's wall time less the prefill and the forcing, over the pool's steps),
    `device_call_ms` (the step's device call until its packed answer is on the host: dispatch,
    device work, sync), `search_ms` (DART's tree search and packing, the forcing left out) and
    `host_other_ms` (the rest: bookkeeping between steps). Every request joins at the start, and a
    device call's time (and a step's search) counts in each request that it moves: the longest
    request's totals are the pool's, over its steps, the pool's steps (a call of the device loop
    runs as many steps as its longest request takes: a shorter one's share would count them all)."""
    steps = max((h.stats.steps for h in handles), default=0)
    if not steps:
        return {}
    per_step = lambda key: max(getattr(h.stats, key) for h in handles) / steps  # noqa: E731
    prefill = max(h.stats.prefill_s for h in handles)
    step = (wall - prefill - forcing.force_s) / steps
    call, search = per_step("device_s"), per_step("tree_s") - forcing.force_s / steps
    return {"step_ms": 1e3 * step, "device_call_ms": 1e3 * call, "search_ms": 1e3 * search,
            "host_other_ms": 1e3 * (step - call - search)}


def forced_result(rows: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    """`run_forced`'s result dict from its rows and config."""
    key = lambda r: f"tau={r['tau_asked']:g},batch={r['batch']}"  # noqa: E731
    summary = {"speedup": {key(r): r["speedup"] for r in rows},
               **({"overlap_gain": {key(r): r["overlap_gain"] for r in rows if "overlap_gain" in r}}
                  if config["overlap"] else {}),
               "tau_measured": {key(r): r["tau"] for r in rows},
               "all_same_output": all(r["same_output"] for r in rows)}
    return {"mode": "e2e", "config": config, "rows": list(rows), "summary": summary}
