"""Training EAGLE-3 heads (`--method eagle3`): training-time test over unrolled draft steps.

The published recipe (EAGLE's `traineagle3`, SpecForge), in our words. Row p of a sequence pairs
a hidden state with the embedding of the token at p + 1 + k at step k = 0 … K−1:
- step 0: the hidden state is `fc` of the target's three taps at p (`Eagle3Head.project`);
  step k > 0: the head's own output at p of step k − 1 (the features it feeds itself when it
  drafts, `dart_jax.decoding.eagle3.grow_tree`).
- RoPE position p + k (the drafter's: a node at depth k sits k positions after its root row).
- Row p of step k attends to the step-0 keys of rows 0 … p (the real prefix) and to the keys of
  steps 1 … k at row p itself (its own chain of drafted ancestors, the diagonal), as a tree
  node sees the committed cache and its ancestors.
- Its draft distribution (over the draft vocabulary) learns the target's next-token
  distribution at position p + 1 + k, restricted to the draft vocabulary and renormalised: the
  token at p + 2 + k. Rows count where that token is an assistant token (the loss mask) and the
  target's own argmax lies in the draft vocabulary (the reference's position mask).
- Loss: Σ_k γ^k · KL(q ‖ p) summed over the counted rows, divided by the counted rows of step
  0; γ = 0.8 by default. (The reference minimises the cross-entropy; the KL differs from it by
  the teacher's entropy, a constant: the same gradients, and 0 for a perfect draft.)

The loop, optimizer, checkpoints and data are the DART trainer's (`loop.Trainer` takes this loss).
"""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dart_jax.convert.eagle3 import Eagle3Config, tensor_table, write_eagle3_head
from dart_jax.models.eagle3 import Eagle3Head
from dart_jax.models.layers import attention

from .loop import batch_states, teacher_logits
from .loss import first_argmax, projected_kl


def eagle3_config_for(target_config, draft_vocab: int, rope_theta: float) -> Eagle3Config:
    """A new head's sizes follow the target (as the published heads do)."""
    c = target_config
    return Eagle3Config(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, vocab_size=c.vocab_size,
        draft_vocab_size=draft_vocab, rms_norm_eps=c.rms_norm_eps, rope_theta=rope_theta,
        max_position_embeddings=c.max_position_embeddings, target_hidden_size=c.hidden_size)


def new_eagle3_head(target, draft_vocab: int, rope_theta: float, seed: int) -> Eagle3Head:
    config = eagle3_config_for(target.config, draft_vocab, rope_theta)
    return Eagle3Head(config, target.embed_tokens, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed))


def shift_left(x: jax.Array, s: int, fill=0) -> jax.Array:
    """x [B, T, ...] → y with y[:, p] = x[:, p + s], `fill` past the end."""
    pad = jnp.full((x.shape[0], s, *x.shape[2:]), fill, x.dtype)
    return jnp.concatenate([x[:, s:], pad], axis=1)


def ttt_attention(q, k0, v0, causal, diag_k, diag_v, scale: float) -> jax.Array:
    """Attention of step k's queries q [B,T,Hq,D] over the step-0 keys k0/v0 [B,T,KVH,D] where
    `causal` [B,T,T], and over the keys of steps 1..k at each query's own row, diag_k/diag_v
    [B,J,T,KVH,D] (J = k), with one softmax."""
    b, t, hq, d = q.shape
    hkv = k0.shape[2]
    qg = q.reshape(b, t, hkv, hq // hkv, d)
    prefix = jnp.einsum("btkgd,bskd->bkgts", qg, k0, preferred_element_type=jnp.float32) * scale  # [B,KVH,G,T,T]
    prefix = jnp.where(causal[:, None, None], prefix, jnp.finfo(jnp.float32).min)
    own = jnp.einsum("btkgd,bjtkd->bkgtj", qg, diag_k, preferred_element_type=jnp.float32) * scale  # [B,KVH,G,T,J]
    # every row sees at least its own step-0 key, so the masked scores get no weight
    probs = jax.nn.softmax(jnp.concatenate([prefix, own], axis=-1), axis=-1).astype(q.dtype)
    out = (jnp.einsum("bkgts,bskd->btkgd", probs[..., :t], v0, preferred_element_type=jnp.float32)
           + jnp.einsum("bkgtj,bjtkd->btkgd", probs[..., t:], diag_v, preferred_element_type=jnp.float32))
    return out.astype(q.dtype).reshape(b, t, hq, d)


def ttt_step(head: Eagle3Head, k: int, hidden: jax.Array, ids: jax.Array, first, own):
    """Step k of the training-time test over all rows: hidden [B,T,H] (fc of the taps at k = 0,
    else step k−1's output), ids [B,T] the sequence, `first` the step-0 (keys, values) [B,T,KVH,D]
    (None at k = 0), `own` those of steps 1..k−1 stacked [B,k−1,T,KVH,D] (None below k = 2)
    → (output [B,T,H], this step's (keys, values))."""
    b, t = ids.shape
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    held = {}

    def attend(q, key, value):
        held["kv"] = key, value
        if k == 0:
            return attention(q, key, value, causal, head.scale)
        dk, dv = key[:, None], value[:, None]
        if own is not None:
            dk, dv = jnp.concatenate([own[0], dk], axis=1), jnp.concatenate([own[1], dv], axis=1)
        return ttt_attention(q, *first, causal, dk, dv, head.scale)

    with jax.named_scope(f"ttt_step{k}"):
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32) + k, (b, t))
        out = head.layer(head.embed(shift_left(ids, k + 1)), hidden, positions, attend)
    return out, held["kv"]


def _carry_keys(k: int, first, own, kv):
    """The (first, own) key sets after step k produced `kv`."""
    if k == 0:
        return kv, None
    step = (kv[0][:, None], kv[1][:, None])
    return first, step if own is None else (jnp.concatenate([own[0], step[0]], 1), jnp.concatenate([own[1], step[1]], 1))


def ttt_logits(head: Eagle3Head, taps: jax.Array, ids: jax.Array, steps: int) -> list[jax.Array]:
    """Draft logits [B,T,Vd] of each of `steps` unrolled steps (see the module's docstring):
    taps [B,T,3Ht] of the target, ids [B,T] the sequence. Step k's row p predicts the token at
    p + 2 + k."""
    hidden, first, own, out = head.project(taps), None, None, []
    for k in range(steps):
        hidden, kv = ttt_step(head, k, hidden, ids, first, own)
        first, own = _carry_keys(k, first, own, kv)
        out.append(head.logits(hidden))
    return out


def eagle3_loss(head: Eagle3Head, target, batch: dict, used: jax.Array, *, gamma: float, steps: int):
    """Loss and metric sums of one batch (the shape of `loss.annealed_kl`'s: per-step arrays [K]
    `kl`, `correct` (draft argmax == teacher argmax), `count` (counted rows)).

    Each step is rematerialised in the backward pass (`jax.checkpoint`): only its inputs are kept,
    not its [B,T,Vd] logits nor its [T,T] attention, so memory does not grow with the steps' size."""
    ids, loss_mask = batch["ids"], batch["loss_mask"]
    hidden, taps = batch_states(target, batch)  # [B,T,H], [B,T,3Ht]
    teacher = teacher_logits(target, hidden, used)  # [B,T,Vd]: row p = the distribution of token p+1
    in_draft = jnp.zeros(target.config.vocab_size, bool).at[used].set(True)
    drafts_top = in_draft[jnp.argmax(target.lm_logits(hidden), axis=-1)]  # [B,T]
    log_q_all = jax.nn.log_softmax(teacher, axis=-1)

    def step(k, hidden, first, own):
        out, kv = ttt_step(head, k, hidden, ids, first, own)
        log_q = shift_left(log_q_all, k + 1)
        valid = shift_left(loss_mask, k + 2, False) & shift_left(drafts_top, k + 1, False)  # [B,T]
        # KL(q ‖ softmax(head.logits(out))) per row, the LM head's backward written out (train.loss)
        normed = head.norm(out)
        row_kl, top = projected_kl(normed.reshape(-1, normed.shape[-1]), head.lm_head.kernel[...],
                                   log_q.reshape(-1, log_q.shape[-1]), head.lm_head.dtype)
        row_kl, top = row_kl.reshape(valid.shape), top.reshape(valid.shape)  # [B,T]
        w = valid.astype(jnp.float32)
        hits = (top == first_argmax(log_q)) * w
        return out, kv, (jnp.sum(row_kl * w), jnp.sum(hits), jnp.sum(w))

    step = jax.checkpoint(step, static_argnums=(0,))
    hidden, first, own, terms = head.project(taps), None, None, []
    for k in range(steps):
        hidden, kv, sums = step(k, hidden, first, own)
        first, own = _carry_keys(k, first, own, kv)
        terms.append(sums)
    kl, correct, count = (jnp.stack(x) for x in zip(*terms))
    weights = gamma ** jnp.arange(steps, dtype=jnp.float32)
    loss = jnp.sum(weights * kl) / jnp.maximum(count[0], 1.0)
    return loss, {"kl": kl, "correct": correct, "count": count}


def eagle3_tensors(head: Eagle3Head) -> dict[str, np.ndarray]:
    """The checkpoint tensors ([out, in] weights, as stored) of an Eagle3Head, by the tensor table
    `load_eagle3_head` reads."""
    flat = {tuple(str(p) for p in path): var for path, var in nnx.to_flat_state(nnx.state(head))}
    out = {}
    for name, (path, _, transpose) in tensor_table(head.config).items():
        var = flat[path]
        array = np.asarray(var.get_value() if isinstance(var, nnx.Variable) else var)
        out[name] = array.T if transpose else array
    return out


def save_eagle3_head(folder: str | Path, head: Eagle3Head) -> Path:
    """Write the head in the published layout (float32; d2t int64, t2d bool) and return the folder."""
    write_eagle3_head(folder, head.config, eagle3_tensors(head))
    return Path(folder)

