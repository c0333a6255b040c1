"""The speculative decoding loop (docs/spec.md §4), for any `Drafter`.

Device work is two jitted pure functions over the state of (target, drafter module), passed as
the flat tuple of its arrays (`split_flat`):
- `prefill`: a chunk of the prompt (of `ShapeSettings.chunk` tokens, the last one padded; one
  call per chunk) through the target and the drafter, and in the prompt's last chunk the first
  token and the drafter's first proposal (the chunks before it skip both: `when_final`);
- `step`: tree verification → acceptance → KV commit of the accepted path → the drafter's next
  proposal, in one call.
Both return what the host needs as ONE int32 array laid out by `layout` (one device→host copy
per step); the host answers with one packed tree (one host→device copy). The drafter turns its
proposal into trees on the CPU in between. Caches are donated and reused across generations;
every shape is static for a given (cache size, attention window), so after warm-up no generation
within the same attention windows compiles anything, whatever its prompt's length.

Every array keeps a batch dimension B, and the host state is per sequence (lengths, budgets,
stats); `driver.Driver` steps a pool of them (`Engine.batcher`), `driver.single` one sequence.

Attention window: a step attends over the first `window` cache slots only, a power of two (>= 256)
that covers the committed length plus what the step writes (`attention_window`); slots past the
committed ones are masked out anyway, so the result is the same while a step's cost follows the
sequence length instead of max_length.

Cache discipline: `cache_len` (int32[B]) counts the committed tokens in the target cache; the
drafter's cache holds one row per committed token too, so one length serves both. A step
verifies the tree against the cache without writing it there, then writes only the accepted
nodes' keys/values to slots `cache_len … cache_len+k`; the drafter writes its k+1 real rows (and
whatever it appends, e.g. DART's m mask slots) from `cache_len`, and advancing by k+1 drops the rest.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.errors import InputError
from dart_jax.models.backend import MAX_DEVICE_STEPS
from dart_jax.models.qwen3 import KVCache, Qwen3, check_verify_gemms, init_cache, write_cache
from dart_jax.models.sharding import make_mesh, shard_module, sharded_caches
from dart_jax.ngram import TreeSettings

from .adaptive import TreeSizer, auto_sizes
from .autoregressive import (AutoregressiveDecoder, CachePool, ModelDef, ProgramSpec, decode_pool, prefill_target,
                             split_flat, when_final)
from .batcher import Batcher, DraftEdit, PlainBatcher
from .drafter import DartDrafter, Drafter
from .device_tree import DeviceSearch, DeviceTrie, LoopStep, TreeEdit, search_trees
from .layout import device_steps_layout, plain_layout, prefill_layout, step_layout, tree_layout
from .requests import check_request
from .sampling import accept_trees, split_rows
from .settings import GenerationSettings, ShapeSettings
from .state import PoolState


class _Pair(nnx.Module):
    """Target and drafter module split together, so that a shared embedding is one array."""

    def __init__(self, target: Qwen3, drafter: nnx.Module):
        self.target = target
        self.drafter = drafter


def verify_tree(target: Qwen3, tree: dict, cache: KVCache, cache_len: jax.Array):
    """The target over a draft tree against the cache (read only): (logits [B,N,V], taps [B,N,3H],
    the tree's keys/values [L,B,N,KVH,D]). Nodes sit at positions cache_len + depth."""
    hidden, taps, tree_kv = target.verify(tree["tokens"], cache_len[:, None] + tree["positions"], tree["mask"],
                                          cache, cache_len, return_taps=True)
    return target.lm_logits(hidden), taps, tree_kv


def _prefill(model: ModelDef, drafter_cls, state, ids, prompt_len, start, pool: PoolState, *,
             rows: int, k: int, nodes: int, window: int):
    """A chunk of C = ids.shape[1] - 1 prompt tokens into the first m = ids.shape[0] rows of the
    pool, at slots `start` [m] …: ids int32[m,C+1] holds the chunk and then the token that follows
    it (the next chunk's first), prompt_len int32[m] the whole prompts' lengths; a prompt is
    prefilled by one call per chunk, so that every prompt length runs this one program. → (packed
    `prefill_layout` [m], the pool's state with the chunk in its caches). A row whose prompt ends in
    this chunk gets its first token (its key split) and the drafter's first proposal; the others'
    outputs are junk the host ignores. Where no row's prompt ends (`when_final`), neither is
    computed: the drafter only writes the chunk's keys and values (`Drafter.fill`). A row whose
    `start` is the cache length is left alone: its writes fall past the cache and are dropped, its
    key is kept. Rows past m are not computed at all. Target and drafter attend over (and write)
    the first `window` cache slots, which must hold the drafter's reach over C positions from
    `start`."""
    pair = model.merge(state)
    m, c = ids.shape[0], ids.shape[1] - 1
    with jax.named_scope("prefill_target"):
        first, n_real, last, taps, pool = prefill_target(pair.target, ids[:, :c], prompt_len, start, pool,
                                                         window=window, taps=True)
    with jax.named_scope("prefill_draft"):
        # position i carries the token that follows it: the chunk's next ids, the sampled token after the prompt
        shifted = jnp.where((jnp.arange(c)[None, :] == (n_real - 1)[:, None]) & last[:, None], first[:, None],
                            ids[:, 1:])
        draft_view = drafter_cls.cache_window(pool.draft_cache, window, m)
        fields = drafter_cls.proposal_fields(rows, k, nodes)
        proposal, draft_view = when_final(
            last, lambda: drafter_cls.prefill(pair.drafter, taps, shifted, draft_view, start, n_real, rows=rows, k=k,
                                              nodes=nodes),
            lambda: ({f.name: jnp.zeros((m, *f.shape), f.dtype) for f in fields},
                     drafter_cls.fill(pair.drafter, taps, shifted, draft_view, start)))
        draft_cache = drafter_cls.cache_put(pool.draft_cache, draft_view)
    packed = prefill_layout(fields).pack({"first": first, **proposal})
    return packed, pool.replace(draft_cache=draft_cache)


def _step(model: ModelDef, drafter_cls, state, tree, pool: PoolState, *, n: int, depth: int, k: int, window: int):
    """One speculative step for the first m = tree.shape[0] sequences of the pool: trees int32[m,·]
    packed by `tree_layout(n, depth)` → (packed `step_layout` [m], the pool's state with those rows
    advanced: caches, lengths, keys; rows past m are not computed). Attention reads only the
    first `window` cache slots, which must hold every slot the drafter writes."""
    return _step_body(model, drafter_cls, state, tree, None, pool, n=n, depth=depth, k=k, window=window)


def _step_rows(model: ModelDef, drafter_cls, state, tree, start, pool: PoolState, *, n: int, depth: int, k: int,
               window: int):
    """`_step` for the m = tree.shape[0] sequences from row `start` (a traced int32 scalar: one
    compiled step serves every block of m rows) instead of the first m: what `Batcher(overlap=True)`
    runs on each half of its busy rows while the host searches the other half's trees."""
    return _step_body(model, drafter_cls, state, tree, start, pool, n=n, depth=depth, k=k, window=window)


def _rows(x: jax.Array, start, m: int, axis: int = 0) -> jax.Array:
    """Rows start … start+m-1 of `x` along `axis`: the first m (a static slice) when `start` is None,
    else from the traced `start`."""
    if start is None:
        return jax.lax.slice_in_dim(x, 0, m, axis=axis)
    return jax.lax.dynamic_slice_in_dim(x, start, m, axis)


def _put_rows(x: jax.Array, part: jax.Array, start) -> jax.Array:
    """`x` with rows start … start+m-1 (the first m when `start` is None) replaced by `part` [m, ...]."""
    if start is None:
        return x.at[:part.shape[0]].set(part)
    return jax.lax.dynamic_update_slice_in_dim(x, part, start, 0)


def _step_body(model: ModelDef, drafter_cls, state, tree, start, pool: PoolState, *, n: int, depth: int, k: int,
               window: int):
    """`_step` (start None: the first m rows) or `_step_rows` (the m rows from the traced `start`)."""
    pair = model.merge(state)
    out, pool = _step_core(pair, drafter_cls, tree_layout(n, depth).unpack(tree), start, pool, n=n, depth=depth, k=k,
                           window=window)
    layout = step_layout(depth, drafter_cls.proposal_fields(depth, k, n))
    packed = layout.pack({"count": out["count"], "path_tokens": out["path_tokens"], "bonus": out["bonus"],
                          **out["proposal"]})
    return packed, pool


def _step_core(pair: _Pair, drafter_cls, tree: dict, start, pool: PoolState, *, n: int, depth: int, k: int,
               window: int):
    """One speculative step of m = tree["tokens"].shape[0] rows from `start` (None: the first m) on
    unpacked trees (the `tree_layout` fields) → ({count, path_tokens, bonus, follow: each row's
    committed tokens after the root (count of them: the accepted ones, then the bonus), proposal},
    the pool's state with those rows advanced)."""
    cache, draft_cache, cache_len, keys, params = (pool.cache, pool.draft_cache, pool.cache_len, pool.keys,
                                                   pool.params)
    tokens, parents, retrieve = tree["tokens"], tree["parents"], tree["retrieve"]
    m = tokens.shape[0]
    length = _rows(cache_len, start, m)
    with jax.named_scope("verify"):
        w = min(window, cache.k.shape[2])
        view = KVCache(k=_rows(cache.k[:, :, :w], start, m, 1), v=_rows(cache.v[:, :, :w], start, m, 1))
        # the tree's keys/values stay out of the cache: only the accepted path is written below
        logits, taps, tree_kv = verify_tree(pair.target, tree, view, length)
    with jax.named_scope("accept"):
        after, now = split_rows(_rows(keys, start, m))
        keys = _put_rows(keys, after, start)
        row_params = jax.tree.map(lambda x: _rows(x, start, m) if x.ndim else x, params)
        path, count, bonus = accept_trees(now, logits, row_params, tokens, parents, retrieve)
    with jax.named_scope("commit"):
        at = path[None, :, :, None, None]  # [1,m,D+1,1,1] over [L,m,N,KVH,D]
        accepted = KVCache(k=jnp.take_along_axis(tree_kv.k, at, axis=2), v=jnp.take_along_axis(tree_kv.v, at, axis=2))
        cache = write_cache(cache, length, accepted, first_row=start)  # rows 0..m-1 (or start..start+m-1)
    with jax.named_scope("draft"):
        path_tokens = jnp.take_along_axis(tokens, path, axis=1)  # [m,D+1]; entries past count are junk
        accepted_taps = jnp.take_along_axis(taps, path[..., None], axis=1)  # [m,D+1,3H]
        follow = jnp.concatenate([path_tokens[:, 1:], jnp.zeros((m, 1), jnp.int32)], axis=1)
        follow = jnp.where(jnp.arange(depth + 1)[None, :] == (count - 1)[:, None], bonus[:, None], follow)
        draft_w = (drafter_cls.cache_window(draft_cache, window, m) if start is None
                   else drafter_cls.cache_rows(draft_cache, window, start, m))
        proposal, draft_w = drafter_cls.extend(pair.drafter, accepted_taps, follow, draft_w, length, count,
                                               rows=depth, k=k, nodes=n)
        draft_cache = (drafter_cls.cache_put(draft_cache, draft_w) if start is None
                       else drafter_cls.cache_put_rows(draft_cache, draft_w, start))
    out = {"count": count, "path_tokens": path_tokens, "bonus": bonus, "follow": follow, "proposal": proposal}
    return out, PoolState(cache, draft_cache, _put_rows(cache_len, length + count, start), keys, params)


@dataclasses.dataclass(frozen=True)
class DeviceLoop:
    """The static settings of a device loop: at most `steps` steps a call, the trees searched with
    `search`, and `edit` (None: DART's own trees, and no op of an edit in the program), a change
    to each step's searched trees before their verify (`device_tree.TreeEdit`)."""

    steps: int
    search: DeviceSearch
    edit: TreeEdit | None = None


def _device_steps(model: ModelDef, drafter_cls, state, pending: dict, trie, pool: PoolState, inputs: dict, *, n: int,
                  depth: int, k: int, window: int, loop: DeviceLoop):
    """Up to `loop.steps` speculative steps of the first m rows in one device loop, the draft trees
    searched on the device (`device_tree.search_trees`: the host search's trees). `pending`: the
    drafter's last proposal (its fields), `preceding` [m,P] the ids fed to it (the first
    `preceding_len`; the last is the root). `inputs`: a row stops on an id of `eos` (kept) where
    `stops` [m] says so, and after `remaining` [m] tokens (the loop ends when every row has
    stopped); `edit`, what `loop.edit` is fed (None without one). → (packed `device_steps_layout`
    [m]: the tokens each row committed, its accepted length per step, and what the next call
    starts from, then the edit's fields; the pool's next state)."""
    pair = model.merge(state)
    steps, search, edit, edit_inputs = loop.steps, loop.search, loop.edit, inputs["edit"]
    preceding, stops, eos = pending["preceding"], inputs["stops"], inputs["eos"]
    proposal = {name: value for name, value in pending.items() if name not in ("preceding", "preceding_len")}
    m, width = preceding.shape[0], depth + 1
    rows = jnp.arange(m)[:, None]
    j = jnp.arange(width)[None, :]

    def body(c: dict) -> dict:
        c = dict(c)
        i, active = c["i"], c["remaining"] > 0
        with jax.named_scope("tree_search"):
            found = search_trees(c["proposal"]["cand_ids"], c["proposal"]["cand_probs"], c["preceding"], c["plen"],
                                 trie, search)
        tree = {"tokens": found.tokens, "positions": found.positions, "parents": found.parents, "mask": found.mask,
                "retrieve": found.retrieve}
        if edit is not None:
            with jax.named_scope("tree_edit"):
                tree, c["edit"] = edit.before_verify(tree, c["edit"], edit_inputs, LoopStep(i, active, c["n_out"]))
        res, stepped = _step_core(pair, drafter_cls, tree, None, c["pool"], n=n, depth=depth, k=k, window=window)
        count, follow = res["count"], res["follow"]  # follow[:, :count]: the step's committed tokens
        with jax.named_scope("stops"):
            is_eos = jnp.any(follow[..., None] == eos[None, None, :], axis=-1) & (j < count[:, None]) & stops[:, None]
            first_eos = jnp.min(jnp.where(is_eos, j, width), axis=1)
            emitted = jnp.where(active, jnp.minimum(jnp.minimum(count, first_eos + 1), c["remaining"]), 0)
            cols = jnp.where(j < emitted[:, None], c["n_out"][:, None] + j, c["out"].shape[1])  # past the end: dropped
            c["out"] = c["out"].at[rows, cols].set(follow, mode="drop")
            c["remaining"] = jnp.where(active & (first_eos >= emitted), c["remaining"] - emitted, 0)
            c["counts"] = c["counts"].at[:, i].set(jnp.where(active, count, 0))
            length = c["pool"].cache_len
            c["pool"] = stepped.replace(cache_len=length.at[:m].set(jnp.where(active, stepped.cache_len[:m], length[:m])))
            # the next search's preceding ids: the root, the accepted tokens and the bonus
            fed = jnp.concatenate([res["path_tokens"][:, :1], follow], axis=1)
            fed = jnp.pad(fed, ((0, 0), (0, c["preceding"].shape[1] - fed.shape[1])))
            c["preceding"] = jnp.where(active[:, None], fed, c["preceding"])
            c["plen"] = jnp.where(active, count + 1, c["plen"])
            c["proposal"] = jax.tree.map(
                lambda new, old: jnp.where(active.reshape((m,) + (1,) * (new.ndim - 1)), new, old),
                res["proposal"], c["proposal"])
        if edit is not None:
            with jax.named_scope("tree_edit"):
                c["edit"] = edit.after_commit(c["edit"], edit_inputs, LoopStep(i, active, c["n_out"], emitted, follow))
        c["n_out"] = c["n_out"] + emitted
        c["i"] = i + 1
        return c

    carry = {"i": jnp.int32(0), "proposal": proposal, "preceding": preceding, "plen": pending["preceding_len"],
             "pool": pool, "remaining": inputs["remaining"],
             "n_out": jnp.zeros((m,), jnp.int32), "out": jnp.full((m, steps * width), -1, jnp.int32),
             "counts": jnp.zeros((m, steps), jnp.int32),
             "edit": None if edit is None else edit.start(edit_inputs, m, steps)}
    c = jax.lax.while_loop(lambda c: (c["i"] < steps) & jnp.any(c["remaining"] > 0), body, carry)
    layout = device_steps_layout(steps, depth, preceding.shape[1], drafter_cls.proposal_fields(depth, k, n),
                                 extra=() if edit is None else edit.fields(steps))
    packed = layout.pack({"n_out": c["n_out"], "out": c["out"], "counts": c["counts"], "preceding": c["preceding"],
                          "preceding_len": c["plen"], **c["proposal"],
                          **({} if edit is None else edit.outputs(c["edit"]))})
    return packed, c["pool"]


def _plain(model: ModelDef, drafter_cls, state, token, pool: PoolState, remaining, eos, *, chunk: int, depth: int,
           k: int, window: int):
    """Up to `chunk` tokens of plain decoding for the first m = token.shape[0] sequences, then one
    drafter call over them, left out when every row has finished (what the tree size 0 of the
    adaptive budget runs: no tree, as fast as the baseline, and the drafter stays ready for the
    next speculative step). `token` [m] is each row's pending token (the last one, not yet in the
    cache: a tree's root); a row stops on an id of `eos` or after `remaining` [m] tokens. → packed
    `plain_layout` [m], the pool's next state). Its target's part is the baseline's own loop
    (`autoregressive.decode_pool`): the same keys, so the same samples."""
    pair = model.merge(state)
    m = token.shape[0]
    length = pool.cache_len[:m]
    with jax.named_scope("plain_target"):
        _, remaining, count, out, taps, pool = decode_pool(pair.target, token, pool, remaining, eos, window=window,
                                                           chunk=chunk, taps=True)
    with jax.named_scope("draft"):
        # fed at position i: the token decoded there, followed by out[:, i]; a row's count >= 1
        def draft(draft_w):
            return drafter_cls.extend(pair.drafter, taps, out, draft_w, length, jnp.maximum(count, 1), rows=depth, k=k)

        def skip(draft_w):  # every row has finished (EOS or budget): no draft will be read
            shapes = jax.eval_shape(draft, draft_w)[0]
            return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes), draft_w

        draft_w = drafter_cls.cache_window(pool.draft_cache, window, m)
        proposal, draft_w = jax.lax.cond(jnp.any(remaining > 0), draft, skip, draft_w)
        draft_cache = drafter_cls.cache_put(pool.draft_cache, draft_w)
    packed = plain_layout(chunk, drafter_cls.proposal_fields(depth, k)).pack({"count": count, "tokens": out,
                                                                               **proposal})
    return packed, pool.replace(draft_cache=draft_cache)


def _tree_rows(tree) -> int:
    """The sequences a step verifies: the packed trees' rows."""
    return tree.shape[0]


class Engine:
    """Speculative decoding of `target` with `drafter`; the drafter's trees are searched with `trie`
    (None: the drafter's scores alone) under `tree` settings. Its `baseline` (an
    `AutoregressiveDecoder`) decodes plainly over the same cache set: a `PlainBatcher`'s engine."""

    plain_chunk = 32  # tokens per call of the adaptive budget's size 0 (plain decoding)
    # its device programs (`ProgramSpec`: the function, its static arguments, how it is compiled), each
    # the attribute of its name; the methods below call them with the engine's state
    PROGRAMS = (ProgramSpec("_prefill", _prefill, ("rows", "k", "nodes", "window")),
                ProgramSpec("_step", _step, ("n", "depth", "k", "window"), verify=_tree_rows),
                ProgramSpec("_step_rows", _step_rows, ("n", "depth", "k", "window"), verify=_tree_rows),
                ProgramSpec("_plain", _plain, ("chunk", "depth", "k", "window")),
                # one device only (`device_steps` refuses a mesh); its first argument is the proposal
                ProgramSpec("_device_loop", _device_steps, ("n", "depth", "k", "window", "loop"),
                            verify=lambda pending: pending["preceding"].shape[0], on_mesh=False))

    def __init__(self, target: Qwen3, drafter: Drafter, trie=None, *, eos_ids: Sequence[int],
                 tree_eos_id: int | None, tree: TreeSettings = TreeSettings(), shapes: ShapeSettings = ShapeSettings(),
                 mesh=None, adaptive: bool = False, device_steps: int = 0, verify_gemms: str = "auto"):
        # device_steps > 0: speculative steps run that many at a time in one device loop, the trees
        # searched on the device (`_device_steps`); 0: one device call per step, the host searching
        if (isinstance(device_steps, bool) or not isinstance(device_steps, int)
                or not 0 <= device_steps <= MAX_DEVICE_STEPS):
            raise InputError(f"device_steps must be an integer in [0, {MAX_DEVICE_STEPS}] (0: a host call per step), "
                             f"got {device_steps!r}")
        if device_steps and not isinstance(drafter, DartDrafter):
            raise InputError("device_steps needs the DART drafter (its trees are searched on the device); "
                             f"this engine drafts with {type(drafter).__name__}: pass device_steps=0")
        self.target, self.drafter, self.trie, self.mesh = target, drafter, trie, make_mesh(mesh)
        if self.mesh is not None and target.fused_projections:
            raise InputError("the target's projections are fused (the one-device layout a GPU loads, "
                             "Qwen3.fuse_projections), which a mesh would copy whole onto every device: load the "
                             "target with the mesh (load_target(..., mesh=...) keeps the checkpoint's layout), or load "
                             "it with fused_projections=False (--fused-projections off).")
        if self.mesh is not None:  # loaders place the weights already (then this moves nothing)
            shard_module(target, self.mesh)
            shard_module(drafter.module, self.mesh)
        self.tree = drafter.check_tree(tree)
        self.shapes = shapes
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.tree_eos_id = tree_eos_id
        self.depth = tree.rows_used(drafter.max_depth)  # the draft rows a tree spans
        self.n_nodes = tree.keep + 1  # the biggest tree
        # keep="auto": each step picks among a few tree sizes up to tree.keep (dart_jax.decoding.adaptive)
        self.adaptive = bool(adaptive) and drafter.adaptive_tree
        # size 0: a chunk of plain decoding, chosen where drafting does not pay
        self.tree_sizes = (0,) + auto_sizes(tree.keep) if self.adaptive else (tree.keep,)
        self.sizer = TreeSizer(self.tree_sizes, plain_tokens=self.plain_chunk, depth=self.depth)
        self._tree_settings = {size: dataclasses.replace(self.tree, keep=size) for size in self.tree_sizes if size}
        model, self._state = split_flat(_Pair(target, drafter.module))
        # each program of PROGRAMS an attribute; the tree steps compiled with the XLA options of their
        # verification's size: verify_gemms says which GEMMs a GPU takes (qwen3.verify_compiler_options)
        self.verify_gemms = check_verify_gemms(verify_gemms)
        for program in self.PROGRAMS:
            setattr(self, program.name, program.build(model, type(drafter), mesh=self.mesh, gemms=self.verify_gemms))
        self.pool = CachePool(self._make_caches)
        self.baseline = AutoregressiveDecoder(target, shapes, self.pool, eos_ids=self.eos_ids)
        self.eos_row = self.baseline.eos_row  # the same EOS ids: one row on the device for both
        if device_steps and (self.mesh is not None or self.adaptive):
            raise InputError("device_steps (--device-steps) runs one fixed tree size on one device: pass keep=N / "
                             "--keep N (not \"auto\") and no mesh, or device_steps=0")
        self.device_steps = device_steps
        self._device_trie: list = []  # [DeviceTrie] once made; an engine from with_tree shares the list
        self._device_search = DeviceSearch(keep=self.tree.keep, beam_width=self.tree.beam_width,
                                           ngram_weight=self.tree.ngram_weight, eos_id=tree_eos_id)

    # ------------------------------------------------------------------ device calls (a pool's caches)
    def prefill(self, ids, prompt_len, start, pool: PoolState, *, rows: int, k: int, nodes: int, window: int):
        """A chunk of prompts into the first m = ids.shape[0] rows of a pool, from slots `start` (see
        `_prefill`): ids int32[m,C+1], prompt lengths [m], start [m], the pool's state (donated) →
        (packed `prefill_layout` [m], the next state)."""
        return self._prefill(self._state, ids, prompt_len, start, pool, rows=rows, k=k, nodes=nodes, window=window)

    def step(self, tree, pool: PoolState, *, n: int, depth: int, k: int, window: int):
        """One speculative step of the first m = tree.shape[0] rows (see `_step`): packed trees of
        `n` node slots, the pool's state (donated) → (packed `step_layout` [m], the next state)."""
        return self._step(self._state, tree, pool, n=n, depth=depth, k=k, window=window)

    def step_rows(self, tree, start: int, pool: PoolState, *, n: int, depth: int, k: int, window: int):
        """`step` for the m = tree.shape[0] rows from row `start` of the pool (see `_step_rows`; one
        compiled variant for every `start`) → the same as `step`."""
        return self._step_rows(self._state, tree, np.int32(start), pool, n=n, depth=depth, k=k, window=window)

    def device_trie(self) -> DeviceTrie | None:
        """The trie's arrays on the device (made at the first call; None without a trie)."""
        if not self._device_trie and self.trie is not None:
            trie = self.trie.to_csr() if hasattr(self.trie, "to_csr") else self.trie
            self._device_trie.append(DeviceTrie.from_trie(trie))
        return self._device_trie[0] if self._device_trie else None

    def steps_on_device(self, pending: dict, pool: PoolState, limits: dict, *, depth: int, k: int, window: int,
                        edit: TreeEdit | None = None, edit_inputs=None):
        """`device_steps` speculative steps of the first m rows in one device call (see
        `_device_steps`: `pending` the proposal's fields, `preceding` and `preceding_len` [m];
        `limits` `remaining` and `stops` [m]; `edit`: a change to every searched tree before its
        verify, another compiled loop, fed `edit_inputs`) → (packed `device_steps_layout` [m], the
        pool's next state)."""
        inputs = {**limits, "eos": self.eos_row, "edit": edit_inputs}
        loop = DeviceLoop(self.device_steps, self._device_search, edit)
        return self._device_loop(self._state, pending, self.device_trie(), pool, inputs, n=self.n_nodes, depth=depth,
                                 k=k, window=window, loop=loop)

    def plain(self, token, pool: PoolState, remaining, *, depth: int, k: int, window: int, chunk: int | None = None):
        """A chunk of plain decoding of the first m = token.shape[0] rows, then one drafter call over
        it (tree size 0, see `_plain`; `chunk` defaults to `plain_chunk`) → (packed `plain_layout`
        [m], the pool's next state)."""
        return self._plain(self._state, token, pool, remaining, self.eos_row,
                           chunk=self.plain_chunk if chunk is None else chunk, depth=depth, k=k, window=window)

    def batcher(self, slots: int, max_length: int = 2048, *, plain: bool = False,
                overlap: bool = False, edit: DraftEdit | None = None) -> "Batcher | PlainBatcher":
        """A continuous-batching pool of `slots` sequences on this engine: a `Batcher` (speculative
        steps; with `overlap` the host searches half the rows' trees while the device verifies the
        other half, see `Batcher`; `edit`: a change to every drafted tree, `DraftEdit`), or with
        `plain` a `PlainBatcher` over `baseline` (plain decoding of the target)."""
        if plain:
            if overlap or edit is not None:
                raise ValueError("overlap and edit apply to the speculative pool (a plain pool has no tree search)")
            return PlainBatcher(self.baseline, slots, max_length)
        return Batcher(self, slots, max_length, overlap=overlap, edit=edit)

    def with_tree(self, tree: TreeSettings, adaptive: bool | None = None) -> "Engine":
        """An engine over the same target, drafter and trie with other tree settings (another tree
        size is another compiled step; the weights are shared, not copied); `adaptive` (default:
        this engine's) chooses the size per step up to tree.keep."""
        engine = Engine(self.target, self.drafter, self.trie, eos_ids=sorted(self.eos_ids),
                        tree_eos_id=self.tree_eos_id, tree=tree, shapes=self.shapes, mesh=self.mesh,
                        adaptive=self.adaptive if adaptive is None else adaptive, device_steps=self.device_steps,
                        verify_gemms=self.verify_gemms)
        engine._device_trie = self._device_trie  # one copy of the trie on the device
        return engine

    def tree_settings(self, size: int) -> TreeSettings:
        """The tree settings of a step that uses a tree of `size` nodes besides the root."""
        return self._tree_settings[size]

    def check_request(self, prompt_ids, settings: GenerationSettings, *, warn: bool = True) -> np.ndarray:
        """The prompt as int32 ids, or an InputError naming what is wrong (`requests.check_request`)."""
        return check_request(self.target.config, prompt_ids, settings, warn=warn)

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    def cache_length(self, prompt_len: int, max_length: int) -> int:
        """Slots needed: the drafter's prefill of the last chunk writes reach(chunk) from its
        start, reach(the padded prompt) in all; a step at committed length S <= max_length-2 reads
        the tree's N nodes beside the cache and writes the drafter's reach(rows + 1) from S."""
        step = max(self.n_nodes, self.drafter.reach(self.depth + 1), self.drafter.reach(self.plain_chunk))
        need = max(self.drafter.reach(self.shapes.padded(prompt_len)), max_length + step)
        return self.shapes.cache_length(need)

    def new_caches(self, batch: int, length: int) -> tuple:
        """Zero caches (target, drafter) of `length` slots for `batch` sequences, not yet placed."""
        return (init_cache(self.target.config, batch, length, self.target.dtype),
                self.drafter.init_cache(batch, length, self.target.dtype))

    def _make_caches(self, batch: int, length: int) -> tuple:
        if self.mesh is None:
            return self.new_caches(batch, length)
        return sharded_caches(lambda: self.new_caches(batch, length), self.mesh)
