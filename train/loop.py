"""The training loop: frozen target as teacher, optax AdamW, orbax checkpoints, export.

Run layout under `--out`:
  run.json      the settings that fix the data order and the model (checked on resume)
  data.npz      the encoded (and optionally regenerated) samples
  vocab.npz     the draft vocabulary (`used` target ids)
  ckpt/<step>/  orbax checkpoints of (params, optimizer state) after `step` micro-batches
  head/         the exported head (reference layout: `save_dart_head`, or `eagle3.save_eagle3_head`)
  taps/         the target's taps cache (`--taps cache`, train/taps.py; `--taps-dir` puts it elsewhere)
  profile.json  what `--profile N` measured (train/profile.py)
A micro-step index fixes the data position: epoch = step // batches_per_epoch, batch = the rest.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from dart_jax.convert.dart_head import DartHeadConfig
from dart_jax.files import atomic_path
from dart_jax.models.head import TRAINABLE, DartHead
from dart_jax.models.multihost import is_writer

from .data import Dataset, batch_samples, batches_per_epoch, make_batch
from .forward import shifted_ids, train_draft_hidden
from .loss import annealed_kl_projected, expected_length, row_accuracy
from .settings import TrainSettings
from .vocab import mapped_columns, used_from_d2t, vocab_from_used


def head_config_for(target_config, draft_length: int, draft_vocab: int, rope_theta: float) -> DartHeadConfig:
    """Head sizes follow the target (as the published heads do): hidden, heads, head_dim, MLP width."""
    c = target_config
    return DartHeadConfig(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, vocab_size=c.vocab_size,
        draft_length=draft_length, draft_vocab_size=draft_vocab, rms_norm_eps=c.rms_norm_eps, rope_theta=rope_theta,
        max_position_embeddings=c.max_position_embeddings, target_hidden_size=c.hidden_size)


def set_vocab(head: DartHead, used: np.ndarray) -> None:
    d2t, t2d = vocab_from_used(used, head.config.vocab_size)
    head.d2t.set_value(jnp.asarray(d2t.astype(np.int32)))
    head.t2d.set_value(jnp.asarray(t2d))


def make_optimizer(s: TrainSettings, total_updates: int) -> optax.GradientTransformation:
    """AdamW β=(0.9, 0.999), linear warm-up then cosine to 0, clip at `s.clip`, accumulate `grad_accum`."""
    total_updates = max(total_updates, 1)
    warmup = s.warmup_steps if s.warmup_steps is not None else max(1, total_updates // 50)
    warmup = min(warmup, total_updates)
    schedule = optax.warmup_cosine_decay_schedule(0.0, s.lr, warmup, max(total_updates, warmup + 1), end_value=0.0)
    inner = optax.chain(optax.clip_by_global_norm(s.clip),
                        optax.adamw(schedule, b1=0.9, b2=0.999, weight_decay=s.weight_decay))
    return optax.MultiSteps(inner, every_k_schedule=s.grad_accum)


def teacher_logits(target, hidden_rows: jax.Array, used: jax.Array) -> jax.Array:
    """The target's logits restricted to the draft vocabulary: hidden [..., H] → [..., Vd] (fp32)."""
    h = hidden_rows.astype(target.dtype)
    if target.lm_head is None:
        w = jnp.take(target.embed_tokens.embedding[...], used, axis=0).astype(target.dtype)  # [Vd,H]
        return jnp.einsum("...h,vh->...v", h, w, preferred_element_type=jnp.float32)
    w = jnp.take(target.lm_head.kernel[...], used, axis=1).astype(target.dtype)  # [H,Vd]
    return jnp.einsum("...h,hv->...v", h, w, preferred_element_type=jnp.float32)


def target_states(target, ids: jax.Array, dtype=None) -> jax.Array:
    """The target's frozen forward over ids [B,T]: its three taps and its final hidden state side by
    side, [B,T,3H+H] (what the head and the teacher read; what a taps cache stores), in `dtype`."""
    hidden, taps = target.forward_hidden(ids, return_taps=True)  # [B,T,H], [B,T,3H]
    states = jax.lax.stop_gradient(jnp.concatenate([taps, hidden], axis=-1))
    return states if dtype is None else states.astype(dtype)


def batch_states(target, batch: dict) -> tuple[jax.Array, jax.Array]:
    """(hidden [B,T,H], taps [B,T,3H]) of a batch: read from its "states" when a taps cache (or a
    separate call of `target_states`) supplied them, else the target's forward runs here."""
    states = batch["states"] if "states" in batch else target_states(target, batch["ids"])
    states = states.astype(target.dtype)
    h = target.config.hidden_size
    return states[..., 3 * h:], states[..., :3 * h]


def batch_loss(head: DartHead, target, batch: dict, used: jax.Array, gamma: float):
    """Loss and metric sums of one batch; the target supplies the taps (or the batch holds them) and
    the teacher. The draft logits are never differentiated as such: `annealed_kl_projected` takes
    the LM head's input and kernel and writes out its backward."""
    hidden, teacher, row_valid, _ = batch_rows(head, target, batch, used)
    return annealed_kl_projected(hidden, head.lm_head.kernel[...], teacher, row_valid, gamma, head.lm_head.dtype)


def batch_rows(head: DartHead, target, batch: dict, used: jax.Array):
    """What the loss compares for one batch: (the hidden states [B,K,d,H] the head's LM head turns
    into the draft logits, teacher logits [B,K,d,Vd], which rows count [B,K,d], the position each
    row predicts [B,K,d])."""
    ids, anchors = batch["ids"], batch["anchors"]
    b, t = ids.shape
    d = head.config.num_rows
    hidden, taps = batch_states(target, batch)  # [B,T,H], [B,T,3H]
    # row r of anchor a predicts the token at a+2+r from the target's distribution at a+1+r
    goal = anchors[..., None] + 2 + jnp.arange(d)  # [B,K,d]
    inside = goal < t
    goal = jnp.minimum(goal, t - 1)
    on_mask = jnp.take_along_axis(batch["loss_mask"], goal.reshape(b, -1), axis=1).reshape(goal.shape)
    row_valid = batch["anchor_valid"][..., None] & inside & on_mask
    rows = jnp.take_along_axis(hidden, (goal - 1).reshape(b, -1, 1), axis=1)  # [B,K·d,H]
    teacher = teacher_logits(target, rows, used).reshape(*goal.shape, -1)  # [B,K,d,Vd]
    return train_draft_hidden(head, taps, shifted_ids(ids), anchors), teacher, row_valid, goal


class Trainer:
    """Holds the frozen target, the head's split state and the jitted step."""

    def __init__(self, target, head: DartHead, settings: TrainSettings, total_updates: int, mesh: Mesh,
                 loss_fn: Callable | None = None):
        """`loss_fn(head, target, batch, used)` → (loss, per-row metric sums `kl`, `correct`,
        `count`) of one batch; default the DART loss `batch_loss` with `settings.gamma`."""
        self.settings, self.mesh, self.head_config = settings, mesh, head.config
        self.used = jnp.asarray(np.asarray(head.d2t.get_value()) + np.arange(head.config.draft_vocab_size), jnp.int32)
        self.head_graph, params, self.head_rest = nnx.split(head, TRAINABLE, ...)
        target_graph, self.target_state = nnx.split(target)
        replicated = NamedSharding(mesh, PartitionSpec())
        self.params = jax.device_put(params, replicated)
        self.optimizer = make_optimizer(settings, total_updates)
        self.opt_state = jax.device_put(self.optimizer.init(self.params), replicated)
        self.batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
        if loss_fn is None:
            loss_fn = functools.partial(batch_loss, gamma=settings.gamma)
        used = self.used
        head_graph, head_rest, optimizer = self.head_graph, self.head_rest, self.optimizer

        def loss_of(params, target_state, batch):
            head = nnx.merge(head_graph, params, head_rest)
            return loss_fn(head, nnx.merge(target_graph, target_state), batch, used)

        grads_of = jax.value_and_grad(loss_of, has_aux=True)

        def update(params, opt_state, grads):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        def step(params, opt_state, target_state, batch):
            (loss, sums), grads = grads_of(params, target_state, batch)
            return *update(params, opt_state, grads), loss, sums

        self._step = jax.jit(step, donate_argnums=(0, 1))
        # the step's three parts, jitted apart for the profile (train/profile.py)
        self.states = jax.jit(lambda target_state, ids: target_states(nnx.merge(target_graph, target_state), ids))
        self.grads = jax.jit(grads_of)
        self.update = jax.jit(update, donate_argnums=(0, 1))

    def put(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """The batch on the devices, split over the mesh's data axis."""
        return {k: jax.device_put(v, self.batch_sharding) for k, v in batch.items()}

    def step(self, batch: dict[str, np.ndarray]):
        batch = self.put(batch)
        self.params, self.opt_state, loss, sums = self._step(self.params, self.opt_state, self.target_state, batch)
        return loss, sums

    def train_state(self):
        return {"params": self.params, "opt_state": self.opt_state}

    def load_train_state(self, state) -> None:
        replicated = NamedSharding(self.mesh, PartitionSpec())
        self.params = jax.device_put(state["params"], replicated)
        self.opt_state = jax.device_put(state["opt_state"], replicated)

    def head(self) -> DartHead:
        return nnx.merge(self.head_graph, self.params, self.head_rest)


def data_mesh() -> Mesh:
    """All devices on one 'data' axis (one device works too; several processes: all of theirs)."""
    return Mesh(np.asarray(jax.devices()), ("data",))


def train_loop(trainer: Trainer, data: Dataset, settings: TrainSettings, checkpoints, *, start_step: int,
               end_step: int | None = None, save_every: int, log_every: int = 50, pad_id: int,
               progress: bool = True, log=print, metrics_file: Path | None = None, taps=None) -> dict:
    """Run micro-steps start_step … end_step (default: all epochs), checkpointing every `save_every`
    and at the end. Metrics are averaged over windows of `log_every` micro-steps and logged as JSON
    lines (with the window's real tokens per second, checkpoint saves included); returns those of
    the last window, which also go to `metrics_file` (atomically) with every checkpoint, so that a
    resumed run finds the figures of the state it resumes from. `taps` (a `train.taps.TapsCache`)
    supplies the target's taps instead of its forward."""
    per_epoch = batches_per_epoch(len(data), settings.batch_size)
    total = settings.epochs * per_epoch
    end_step = total if end_step is None else end_step
    window = {"loss": [], "kl": 0.0, "correct": 0.0, "count": 0.0}
    bar = tqdm(total=end_step, initial=start_step, desc="train", disable=not progress, dynamic_ncols=True)
    metrics = {}
    tokens, started = 0, time.perf_counter()
    for step in range(start_step, end_step):
        batch, n_tokens = load_batch(data, settings, step, pad_id, taps)
        loss, sums = trainer.step(batch)
        tokens += n_tokens
        window["loss"].append(float(loss))
        for key in ("kl", "correct", "count"):
            window[key] = window[key] + np.asarray(sums[key], np.float64)
        alpha = row_accuracy(window["correct"], window["count"])
        metrics = {"step": step + 1, "epoch": step // per_epoch, "loss": float(np.mean(window["loss"])),
                   "alpha": [round(float(a), 4) for a in alpha], "tau_chain": expected_length(alpha),
                   "kl": [round(float(x), 4) for x in window["kl"] / np.maximum(window["count"], 1.0)]}
        bar.set_postfix(loss=f"{metrics['loss']:.4f}", a1=f"{alpha[0]:.3f}", tau=f"{metrics['tau_chain']:.2f}")
        bar.update(1)
        done = step + 1
        if checkpoints is not None and (done % save_every == 0 or done == end_step):
            checkpoints.save(done, trainer.train_state())
            if metrics_file is not None:
                write_json_atomic(metrics_file, metrics)
        if done % log_every == 0 or done == end_step:
            now = time.perf_counter()
            log(json.dumps({**metrics, "tokens_per_s": round(tokens / (now - started), 1)}))
            window = {"loss": [], "kl": 0.0, "correct": 0.0, "count": 0.0}
            tokens, started = 0, now
    bar.close()
    return metrics


def load_batch(data: Dataset, settings: TrainSettings, step: int, pad_id: int, taps=None) \
        -> tuple[dict[str, np.ndarray], int]:
    """(micro-step `step`'s batch (`data.make_batch`), with its "states" read from the taps cache
    when there is one; the number of its real tokens, padding left out)."""
    epoch, index = divmod(step, batches_per_epoch(len(data), settings.batch_size))
    batch = make_batch(data, epoch, index, batch_size=settings.batch_size, anchors=settings.anchors_per_seq,
                       max_length=settings.max_length, seed=settings.seed, pad_id=pad_id)
    samples = batch_samples(len(data), epoch, index, settings.batch_size, settings.seed)
    if taps is not None:
        batch["states"] = taps.states(samples, settings.batch_size, batch["ids"].shape[1])
    return batch, int(sum(len(data.ids[i]) for i in samples))


def write_json_atomic(path: Path, obj) -> None:
    if not is_writer():  # several processes (multi-host): process 0 writes the run's files
        return
    with atomic_path(os.path.abspath(path)) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=2) + "\n")


def save_npz_atomic(path: Path, **arrays) -> None:
    if not is_writer():
        return
    with atomic_path(os.path.abspath(path)) as tmp, open(tmp, "wb") as f:  # a file object: savez adds no ".npz"
        np.savez(f, **arrays)


def output_rows(target) -> np.ndarray:
    """The target's output rows [V, H] (its LM head, or the tied embedding), as the teacher reads them."""
    if target.lm_head is None:
        return np.asarray(target.embed_tokens.embedding[...], np.float32)
    return np.asarray(target.lm_head.kernel[...], np.float32).T


def widened_head(init: DartHead, target, used: np.ndarray) -> DartHead:
    """`init` with the larger draft vocabulary `used` (sorted target ids, a superset of init's):
    its layers as they are, its LM-head columns kept for its own ids, and for the new ids columns
    mapped from the target's output rows (`vocab.mapped_columns`), so that training starts from
    the head it continues rather than from random columns."""
    old = used_from_d2t(np.asarray(init.d2t.get_value()))
    used = np.asarray(used, np.int64)
    if not np.isin(old, used).all():
        raise ValueError("the grown draft vocabulary must hold every id of the head it grows")
    config = dataclasses.replace(init.config, draft_vocab_size=len(used))
    head = DartHead(config, target.embed_tokens, dtype=init.dtype, param_dtype=init.lm_head.kernel[...].dtype,
                    rngs=nnx.Rngs(0))
    head.fc, head.midlayer, head.norm = init.fc, init.midlayer, init.norm
    kernel_old = np.asarray(init.lm_head.kernel[...], np.float32)
    new = np.setdiff1d(used, old)
    kernel = np.zeros((kernel_old.shape[0], len(used)), np.float32)
    kernel[:, np.searchsorted(used, old)] = kernel_old
    kernel[:, np.searchsorted(used, new)] = mapped_columns(kernel_old, output_rows(target), old, new)
    head.lm_head.kernel.set_value(jnp.asarray(kernel, head.lm_head.kernel[...].dtype))
    set_vocab(head, used)
    return head
