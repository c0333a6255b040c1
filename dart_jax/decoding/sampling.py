"""Token sampling and tree acceptance (docs/spec.md §4 step 3), as pure jittable functions.

The logits pipeline follows the reference's `prepare_logits_processor`: temperature, then top-p,
then top-k (in that order, which differs from transformers' default), then softmax. The three
settings, and the choice between greedy decoding and sampling, are traced arrays — scalars, or
one value per sequence [B] — so switching between them never recompiles. When every sequence of
a batch is greedy a `lax.cond` skips the sampling work. On an accelerator that branch is decided
on the host instead (`SamplingParams.all_greedy`, static): XLA's GPU runtime reads a conditional's
predicate back to the host and waits for the device at that point of every step, which idles the
device while the host launches the rest of the step; a pool whose mix of greedy and sampled
requests changes then compiles its second variant once.

Acceptance works on one tree at a time (vmap over the batch):
- greedy: for every root-to-leaf row of `retrieve`, count the successive tokens that equal the
  target's argmax at their parent; the first row with the longest run wins.
- sampling: walk down from the root; among the distinct children of the current node, in the
  order of their first leaf row, accept child x with probability p(x); on rejection set p(x) = 0,
  renormalise and try the next child. When no child is accepted, or a leaf is reached, the bonus
  token is drawn from the current (possibly renormalised) p. This keeps the target distribution.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

GREEDY_TEMPERATURE = 1e-5  # at or below this the reference decodes greedily


@functools.partial(jax.tree_util.register_dataclass, data_fields=["greedy", "temperature", "top_p", "top_k"],
                   meta_fields=["all_greedy"])
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Traced sampling settings, scalars or one per sequence [B]. top_p = 1 and top_k = 0 disable
    those filters. `all_greedy` (static, part of the compiled signature): True when every
    sequence is greedy, False when one samples, None to decide on the device (`lax.cond`)."""

    greedy: jax.Array  # bool: argmax decoding, the other fields unused
    temperature: jax.Array  # float32
    top_p: jax.Array  # float32
    top_k: jax.Array  # int32
    all_greedy: bool | None = None

    @classmethod
    def make(cls, temperature: float, top_p: float = 1.0, top_k: int = 0) -> "SamplingParams":
        return cls.rows([(temperature, top_p, top_k)], scalar=True)

    @classmethod
    def rows(cls, settings, *, scalar: bool = False) -> "SamplingParams":
        """Per-sequence params [B] from (temperature, top_p, top_k) triples (a scalar set for one
        triple with `scalar`); the greedy-or-sampling branch static on an accelerator
        (`host_branch`), decided on the device on a CPU."""
        t = np.array([float(x[0]) for x in settings], np.float32)
        greedy = t <= GREEDY_TEMPERATURE
        fields = (greedy, np.maximum(t, GREEDY_TEMPERATURE), np.array([float(x[1]) for x in settings], np.float32),
                  np.array([int(x[2]) for x in settings], np.int32))
        if scalar:
            fields = tuple(f[0] for f in fields)
        return cls(*(to_device(f) for f in fields), all_greedy=bool(greedy.all()) if host_branch() else None)


def to_device(array) -> jax.Array:
    """A host array (NumPy, or a NumPy scalar) on the default device, as `jnp.asarray` gives it (the
    same dtype, canonicalized, and placement), moved without a program: `jnp.asarray` compiles a
    small one per shape and dtype (`lax.stage`), which a process's first calls would wait for."""
    return jax.device_put(np.asarray(array))


def row_keys(seeds: Sequence[int]) -> jax.Array:
    """PRNG keys [B], row b's `jax.random.key(seeds[b])`, made on the host and moved once: eager
    `jax.random.key`, `split` and `stack` each compile a small program. Threefry's key of a seed
    is its two 32-bit words (the high one 0 without 64-bit mode, where a seed is cut to 32 bits);
    another PRNG implementation takes JAX's own path."""
    if jax.config.jax_default_prng_impl != "threefry2x32":
        return jnp.stack([jax.random.key(int(seed)) for seed in seeds])
    words = np.asarray([int(seed) % 2**64 for seed in seeds], np.uint64)
    high = words >> np.uint64(32) if jax.config.jax_enable_x64 else np.zeros_like(words)
    data = np.stack([high, words & np.uint64(0xFFFFFFFF)], axis=-1).astype(np.uint32).reshape(len(words), 2)
    return jax.random.wrap_key_data(to_device(data))


def host_branch() -> bool:
    """Whether the greedy-or-sampling branch is chosen on the host (static): on an accelerator,
    where a device-side branch costs a host round trip in the middle of a step; not on a CPU,
    where it costs nothing and a static one would cost a second compilation."""
    return jax.default_backend() != "cpu"


def is_greedy(temperature: float) -> bool:
    return temperature <= GREEDY_TEMPERATURE


def per_row(x: jax.Array, ndim: int) -> jax.Array:
    """A scalar or per-sequence [B] value shaped to broadcast against an array of `ndim` axes."""
    x = jnp.asarray(x)
    return x.reshape(x.shape + (1,) * (ndim - x.ndim))


def process_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Probabilities [..., V] (float32) after temperature → top-p → top-k → softmax; per-sequence
    params apply along the leading axis of `logits` [B, ..., V].

    top-p removes the tokens whose ascending cumulative probability is <= 1 - top_p (the most
    likely token always survives); top-k then removes the tokens whose filtered logit is below the
    k-th largest (ties kept), as transformers' warpers do.

    Both filters sort the vocabulary, which costs a CPU more than the rest of sampling together (a
    tree step sorts one row per node). Where no row filters (top_p 1 and top_k 0 everywhere, the
    defaults), the probabilities are the softmax of the tempered logits alone: on a CPU a
    `lax.cond` then skips the sort; on an accelerator, where a device-side branch waits on the host
    (`host_branch`), the filters always run, and leave those rows unchanged.
    """
    nd = logits.ndim
    x = logits.astype(jnp.float32) / per_row(params.temperature, nd)
    if host_branch():
        return jax.nn.softmax(_filtered(x, params), axis=-1)
    filters = jnp.any((jnp.asarray(params.top_p) < 1.0) | (jnp.asarray(params.top_k) > 0))
    return jax.nn.softmax(jax.lax.cond(filters, lambda x: _filtered(x, params), lambda x: x, x), axis=-1)


def _filtered(x: jax.Array, params: SamplingParams) -> jax.Array:
    """Tempered logits `x` [B, ..., V] with the tokens that top-p, then top-k, remove at -inf
    (`process_logits`)."""
    nd = x.ndim
    top_p, top_k = per_row(params.top_p, nd), per_row(params.top_k, nd)
    vocab = x.shape[-1]
    order = jnp.argsort(x, axis=-1)  # ascending
    asc = jnp.take_along_axis(x, order, axis=-1)
    cum = jnp.cumsum(jax.nn.softmax(asc, axis=-1), axis=-1)
    drop_sorted = (cum <= 1.0 - top_p) & (top_p < 1.0)
    drop_sorted = drop_sorted.at[..., -1].set(False)
    drop = jnp.zeros_like(drop_sorted)
    drop = jnp.put_along_axis(drop, order, drop_sorted, axis=-1, inplace=False)
    x = jnp.where(drop, -jnp.inf, x)
    # The k-th largest surviving logit: the ascending order is unchanged by the top-p mask.
    asc_filtered = jnp.where(drop_sorted, -jnp.inf, asc)
    at = jnp.broadcast_to(vocab - jnp.clip(top_k, 1, vocab), asc.shape[:-1] + (1,))
    kth = jnp.take_along_axis(asc_filtered, at, axis=-1)
    return jnp.where((top_k > 0) & (x < kth), -jnp.inf, x)


def vocab_argmax(logits: jax.Array) -> jax.Array:
    """int32 index of the largest logit along the last axis, the first one on ties and the first
    NaN where there is one: what `jnp.argmax` gives. Written as a max, then the smallest index that
    holds it, because XLA:CPU runs `jnp.argmax`'s (value, index) reduction over a vocabulary-wide
    row several times slower than these two plain reductions (benchmarks/RESULTS.md)."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    hit = (logits == top) | jnp.isnan(logits)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(hit, index, logits.shape[-1]), axis=-1)


def split_rows(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-sequence keys [B] → (the next keys, keys to use now), each [B]."""
    pairs = jax.vmap(jax.random.split)(keys)
    return pairs[:, 0], pairs[:, 1]


def sample_tokens(keys: jax.Array, logits: jax.Array, params: SamplingParams) -> jax.Array:
    """One token per sequence of `logits` [B, V] with per-sequence keys [B] and params [B]: the
    argmax for greedy sequences, else a draw."""
    greedy = vocab_argmax(logits)

    def mixed(logits):
        probs = process_logits(logits, params)
        drawn = jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(keys, probs).astype(jnp.int32)
        return jnp.where(params.greedy, greedy, drawn)

    return branch(params, lambda logits: greedy, mixed, logits)


def branch(params: SamplingParams, if_greedy, otherwise, operand):
    """`if_greedy(operand)` when every sequence is greedy, else `otherwise(operand)`: chosen at trace
    time where `params.all_greedy` says (the other branch is not compiled), else by `lax.cond`."""
    if params.all_greedy is None:
        return jax.lax.cond(jnp.all(params.greedy), if_greedy, otherwise, operand)
    return (if_greedy if params.all_greedy else otherwise)(operand)


class Acceptance(NamedTuple):
    """Result for one tree: accepted node ids `path` [D+1] (path[0] = root, entries past `count`
    are 0), `count` = accepted nodes including the root (k+1), `bonus` = the next root token."""

    path: jax.Array
    count: jax.Array
    bonus: jax.Array


def greedy_accept(logits: jax.Array, tokens: jax.Array, retrieve: jax.Array) -> Acceptance:
    """Greedy acceptance for one tree: logits [N, V], tokens int32[N], retrieve int32[R, D+1] (-1 padded)."""
    target = vocab_argmax(logits)  # [N]
    valid = retrieve >= 0
    nodes = jnp.where(valid, retrieve, 0)
    path_tokens = jnp.where(valid, tokens[nodes], -1)  # [R, D+1]
    match = path_tokens[:, 1:] == target[nodes[:, :-1]]  # token i+1 equals the argmax at node i
    run = jnp.cumprod(match.astype(jnp.int32), axis=1).sum(axis=1)  # [R]
    best = jnp.argmax(run)
    k = run[best]
    steps = jnp.arange(retrieve.shape[1])
    path = jnp.where(steps <= k, nodes[best], 0).at[0].set(0)
    return Acceptance(path.astype(jnp.int32), (k + 1).astype(jnp.int32), target[path[k]])


def sibling_rank(retrieve: jax.Array, num_nodes: int) -> jax.Array:
    """For each node, the index of the first leaf row of `retrieve` [R, D+1] that contains it
    (the order in which the reference visits siblings); R for nodes in no row."""
    rows = retrieve.shape[0]
    hit = (retrieve[:, :, None] == jnp.arange(num_nodes)[None, None, :]).any(axis=1)  # [R, N]
    return jnp.where(hit.any(axis=0), jnp.argmax(hit, axis=0), rows).astype(jnp.int32)


def sample_accept(key: jax.Array, probs: jax.Array, tokens: jax.Array, parents: jax.Array,
                  retrieve: jax.Array) -> Acceptance:
    """Lossless multi-candidate rejection sampling down one tree.

    probs [N, V]: processed target probabilities at every node; tokens int32[N]; parents int32[N]
    (-1 for the root and padding); retrieve int32[R, D+1] fixes the sibling order.
    """
    n_nodes = tokens.shape[0]
    depth = retrieve.shape[1] - 1
    rank = sibling_rank(retrieve, n_nodes)
    node_ids = jnp.arange(n_nodes)
    # siblings have distinct ranks (a leaf row holds one node per depth), so "j is tried before i"
    # is rank[j] < rank[i]; no sort needed
    before = rank[None, :] < rank[:, None]  # before[i, j]
    same_token = tokens[None, :] == tokens[:, None]
    level_key, bonus_key = jax.random.split(key)
    uniforms = jax.random.uniform(level_key, (depth, n_nodes))  # one draw per (level, sibling)

    def children(node):
        """Children of `node` that are tried: a repeated token is skipped, as the reference does."""
        is_child = (parents == node) & (node_ids > 0)
        repeated = (before & same_token & is_child[None, :]).any(axis=1)
        return is_child & ~repeated

    def level(step, state):
        node, done, path, count = state
        child = children(node)
        p = jnp.where(child, probs[node, tokens], 0.0)  # [N]
        tried = jnp.where(before, p[None, :], 0.0).sum(axis=1)  # mass of the siblings tried before i
        left = jnp.maximum(1.0 - tried, 0.0)
        ratio = jnp.where((p > 0) & (left - p <= 1e-6), 1.0, p / jnp.maximum(left, 1e-30))
        take = child & (uniforms[step] < ratio)
        accepted = take.any() & ~done
        nxt = jnp.argmin(jnp.where(take, rank, retrieve.shape[0] + 1))
        node = jnp.where(accepted, nxt, node)
        path = path.at[step + 1].set(jnp.where(accepted, nxt, 0))
        return node, done | ~accepted, path, count + accepted.astype(jnp.int32)

    init = (jnp.int32(0), jnp.bool_(False), jnp.zeros(depth + 1, jnp.int32), jnp.int32(1))
    node, _, path, count = jax.lax.fori_loop(0, depth, level, init)
    # Every child of the last node was rejected (or it has none): draw from what is left.
    rejected = jnp.zeros(probs.shape[-1], bool).at[tokens].max(children(node))
    rest = jnp.where(rejected, 0.0, probs[node])
    bonus = jax.random.categorical(bonus_key, jnp.log(rest / jnp.maximum(rest.sum(), 1e-30)))
    return Acceptance(path, count, bonus.astype(jnp.int32))


def accept_trees(keys: jax.Array, logits: jax.Array, params: SamplingParams, tokens: jax.Array,
                 parents: jax.Array, retrieve: jax.Array) -> Acceptance:
    """Acceptance of B trees (logits [B,N,V]) with per-sequence keys and params: greedy
    sequences by `greedy_accept`, the others by `sample_accept`."""
    greedy = jax.vmap(greedy_accept)(logits, tokens, retrieve)

    def mixed(logits):
        sampled = jax.vmap(sample_accept)(keys, process_logits(logits, params), tokens, parents, retrieve)
        return Acceptance(*(jnp.where(per_row(params.greedy, g.ndim), g, s) for g, s in zip(greedy, sampled)))

    return branch(params, lambda logits: greedy, mixed, logits)
