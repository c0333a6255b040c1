"""Forced acceptance inside the device loop (`dart_jax.bench.forced`, with `--device-steps`).

The engine's device loop offers one hook, `device_tree.TreeEdit`: a change to each searched tree
before its verify, with a state carried from step to step. `DeviceForcing` is the forcing as such
an edit: `force_trees` makes each still-forced row's tree hold its reference's next D tokens as a
chain (D drawn per row and step on the host), and after the commit a row whose tokens leave its
reference stops being forced. Its outputs per row: `drawn` (D + 1 of each forced step, 0 for
another), `unforced` (steps taken unforced) and `capped` (steps whose D was cut short).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dart_jax.decoding.device_tree import LoopStep, TreeEdit
from dart_jax.decoding.layout import Field

__all__ = ["DeviceForcing", "force_trees"]


def force_trees(tree: dict, reference, done, want) -> tuple[dict, jax.Array, jax.Array]:
    """Searched trees (the `tree_layout` fields, [m, ...]) edited so that greedy acceptance takes
    exactly D nodes and the bonus where the target follows `reference` (`bench.forced` in the
    device loop). The chain is the row's deepest leaf path (its first retrieve row with the most
    nodes), made D nodes long: where it is shorter, the last nodes off it (the highest indices: a
    set that holds every child of its nodes, as nodes come by depth) move below its end, one after
    the other; then its nodes at depths 1..D take reference[done .. done + D - 1], and a sibling of
    a chain node with that node's token, or a child of the chain's end with reference[done + D]
    (the block), another token. D = `want` capped by the tree's real nodes and by what is left of
    the reference (int32[m, R], -1 padded). The tree keeps its node count and real nodes (no node
    moves where the path is deep enough); the retrieve rows of the moved nodes' old paths go (the
    chain's row holds those nodes now). Moved nodes leave the search's order (a parent may then come
    after its child) and ancestors of moved leaves may lie on no retrieve row: the verify, greedy
    acceptance and the commit do not depend on either, sampled acceptance would (its sibling ranks),
    so these trees are for greedy acceptance only, as forcing is. → (the trees, D [m], capped [m]:
    D < want)."""
    tokens, positions, parents, mask, retrieve = (tree[name] for name in ("tokens", "positions", "parents", "mask",
                                                                          "retrieve"))
    m, n = tokens.shape
    width = retrieve.shape[2]
    index, rows, at = jnp.arange(n), jnp.arange(m)[:, None], jnp.arange(width)
    lengths = (retrieve >= 0).sum(axis=2)  # [m, leaves]: nodes on each leaf's path, root included
    best = jnp.argmax(lengths, axis=1)
    chain = retrieve[jnp.arange(m), best]  # [m, depth + 1]: node at each depth of the deepest path, -1 past it
    deep = jnp.maximum(lengths.max(axis=1) - 1, 0)
    free = (parents >= 0) & ~jnp.any(index[None, :, None] == chain[:, None, :], axis=2)  # real, off the path
    left = jnp.maximum((reference >= 0).sum(axis=1) - done, 0)
    placed = jnp.minimum(jnp.minimum(want, deep + free.sum(axis=1)), left)
    moves = jnp.maximum(placed - deep, 0)
    later = jnp.cumsum(free[:, ::-1], axis=1)[:, ::-1] - free  # free nodes of higher index
    moved = free & (later < moves[:, None])
    positions = jnp.where(moved, (deep + moves)[:, None] - later, positions)
    placing = moved[:, None, :] & (positions[:, None, :] == at[None, :, None])  # [m, depth + 1, n]
    chain = jnp.where(placing.any(axis=2), jnp.argmax(placing, axis=2), chain)
    parents = jnp.where(moved, chain[rows, jnp.maximum(positions - 1, 0)], parents)
    is_chain = index[None, None, :] == chain[:, :, None]  # [m, depth + 1, n]
    chain_depth = jnp.where(is_chain.any(axis=1), jnp.argmax(is_chain, axis=1), width)  # [m, n]
    mask = jnp.where(moved[:, :, None], chain_depth[:, None, :] <= positions[:, :, None], mask)
    through = jnp.any(moved[rows[:, :, None], jnp.maximum(retrieve, 0)] & (retrieve >= 0), axis=2)  # [m, leaves]
    retrieve = jnp.where(through[:, :, None], -1, retrieve).at[jnp.arange(m), best].set(chain)

    def ref(i):  # reference[i], -1 past its end
        return jnp.where(i < reference.shape[1],
                         jnp.take_along_axis(reference, jnp.clip(i, 0, reference.shape[1] - 1), axis=1), -1)

    depth = jnp.clip(positions, 1, width - 1)  # (the root and padding: masked by `within`)
    within = (positions >= 1) & (positions <= placed[:, None])
    chain_token = ref(done[:, None] + depth - 1)  # [m, n]: the chain's token at each node's depth
    on_chain = within & (chain[rows, depth] == index[None, :])
    sibling = within & ~on_chain & (parents == chain[rows, depth - 1]) & (tokens == chain_token)
    end = jnp.take_along_axis(chain, placed[:, None], axis=1)  # [m, 1]: the chain's last node
    blocked = (parents >= 0) & (parents == end) & (tokens == ref(done[:, None] + placed[:, None]))
    other = jnp.where(tokens > 0, tokens - 1, 1)  # any token but this one
    tokens = jnp.where(on_chain, chain_token, jnp.where(sibling | blocked, other, tokens))
    return ({"tokens": tokens, "positions": positions, "parents": parents, "mask": mask, "retrieve": retrieve},
            placed, placed < want)


def _rows_where(on, new, old):
    """`new` where the row flag `on` [m] is set, else `old` (any trailing shape)."""
    return jnp.where(on.reshape(on.shape + (1,) * (new.ndim - 1)), new, old)


@dataclasses.dataclass(frozen=True)
class DeviceForcing(TreeEdit):
    """Forced acceptance as the device loop's tree edit. Inputs: `reference` int32[m,R] (each row's
    greedy continuation from its first token, -1 padded), `done` int32[m] (its tokens committed
    before this call), `depths` int32[m,steps] (the chain length asked at each step) and `forced`
    bool[m] (rows that still follow their reference)."""

    def start(self, inputs, m: int, steps: int) -> dict:
        return {"forced": inputs["forced"], "drawn": jnp.zeros((m, steps), jnp.int32),
                "unforced": jnp.zeros((m,), jnp.int32), "capped": jnp.zeros((m,), jnp.int32)}

    def before_verify(self, tree: dict, state: dict, inputs, step: LoopStep) -> tuple[dict, dict]:
        on = state["forced"] & step.active
        edited, placed, capped = force_trees(tree, inputs["reference"], inputs["done"] + step.n_out,
                                             inputs["depths"][:, step.i])
        tree = jax.tree.map(lambda new, old: _rows_where(on, new, old), edited, tree)
        return tree, {"forced": state["forced"],
                      "drawn": state["drawn"].at[:, step.i].set(jnp.where(on, placed + 1, 0)),
                      "unforced": state["unforced"] + (step.active & ~state["forced"]),
                      "capped": state["capped"] + (on & capped)}

    def after_commit(self, state: dict, inputs, step: LoopStep) -> dict:
        reference = inputs["reference"]
        j = jnp.arange(step.follow.shape[1])[None, :]
        at = inputs["done"][:, None] + step.n_out[:, None] + j  # the committed tokens' places in the reference
        ref = jnp.take_along_axis(reference, jnp.minimum(at, reference.shape[1] - 1), axis=1)
        follows = jnp.all((j >= step.emitted[:, None]) | ((at < reference.shape[1]) & (step.follow == ref)), axis=1)
        return dict(state, forced=state["forced"] & follows)

    def fields(self, steps: int) -> tuple[Field, ...]:
        return (Field("drawn", (steps,)), Field("unforced", ()), Field("capped", ()))

    def outputs(self, state: dict) -> dict:
        return {name: state[name] for name in ("drawn", "unforced", "capped")}
