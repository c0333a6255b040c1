"""A measured try (issue 41 item 4): a learned correction of a DART head's row r ≥ 1 conditioned on
the token before the one it predicts, as DSpark adds to DFlash's parallel blocks.

A DART head drafts its d rows in one pass, so row r knows the prefix up to the anchor and nothing
of the r tokens its tree path has chosen since. The correction adds a low-rank bias to row r's
draft logits from the previous token v (on a tree path: the parent node's token):

    logits_r += (E[v] @ P) @ Q_r          E: the target's embedding [V, H] (frozen)
                                          P [H, rank], Q [d, rank, Vd] (Q starts at zero)

Only P and Q are trained, with the head frozen, on the annealed KL of `train.loss` against the
same teacher (the target restricted to the head's draft vocabulary), teacher-forced: v is the
true token, which is what the path holds wherever the tree's draft was accepted. It reads a
training run's encoded data and taps cache (`python -m dart_jax.train ... --taps cache`), trains
on the first `--train-batches` batches of its epoch 0 and measures on the last `--eval-batches`
(other conversations), printing per-row α (draft argmax == teacher argmax) and the chain τ of
`train.loss.expected_length`, with and without the correction. This is the upper end of what the
correction can give: to use it, the tree search would have to score each node's children by its
own token, which no part of dart_jax does.

    python benchmarks/prev_token_correction.py --run out/smollm2/run4 --head dart_jax/demo/smollm2/head \\
        --base ~/.cache/dart_jax/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dart_jax.convert.target import target_folder
from dart_jax.models.checkpoints import load_dart_head, load_target
from dart_jax.train.data import Dataset, batches_per_epoch, load_tokenizer
from dart_jax.train.loop import batch_rows, load_batch
from dart_jax.train.loss import annealed_kl, expected_length, row_accuracy
from dart_jax.train.settings import TrainSettings
from dart_jax.train.taps import MANIFEST, TapsCache
from dart_jax.train.vocab import used_from_d2t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a training run folder with data.npz, run.json and taps/")
    p.add_argument("--head", required=True, help="the DART head to correct (frozen)")
    p.add_argument("--base", required=True, help="the target (the run's --base)")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--train-batches", type=int, default=400)
    p.add_argument("--eval-batches", type=int, default=100)
    p.add_argument("--output", type=Path, help="write the figures as JSON here")
    args = p.parse_args()

    recorded = json.loads((args.run / "run.json").read_text())["settings"]
    settings = TrainSettings(**recorded)
    target = load_target(args.base, dtype=jnp.float32)
    head = load_dart_head(args.head, target, dtype=jnp.float32)
    tok = load_tokenizer(target_folder(args.base))
    pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else 0
    data = Dataset.load(args.run / "data.npz")
    taps = TapsCache(args.run / "taps", json.loads((args.run / "taps" / MANIFEST).read_text()), out_dtype=np.float32)
    per_epoch = batches_per_epoch(len(data), settings.batch_size)
    if args.train_batches + args.eval_batches > per_epoch:
        raise SystemExit(f"the run has {per_epoch} batches an epoch: --train-batches + --eval-batches must fit")
    used = jnp.asarray(used_from_d2t(np.asarray(head.d2t.get_value())), jnp.int32)
    d, vd, h = head.config.num_rows, head.config.draft_vocab_size, head.config.hidden_size
    embedding = target.embed_tokens.embedding[...]

    @jax.jit
    def frozen(batch):
        """(draft logits, teacher logits, row validity, previous tokens) of a batch, as the trainer's loss reads them."""
        hidden, teacher, valid, goal = batch_rows(head, target, batch, used)
        draft = head.lm_head(hidden)
        ids = batch["ids"]
        prev = jnp.take_along_axis(ids, (goal - 1).reshape(ids.shape[0], -1), axis=1).reshape(goal.shape)
        return draft, teacher, valid, prev

    def corrected(params, draft, prev):
        low = embedding[prev] @ params["p"]                                   # [B,K,d,rank]
        bias = jnp.einsum("bkdr,drv->bkdv", low, params["q"])
        return draft + bias * (jnp.arange(d) >= 1)[:, None]                   # row 0 already reads its previous token

    params = {"p": jax.random.normal(jax.random.key(0), (h, args.rank)) / np.sqrt(h),
              "q": jnp.zeros((d, args.rank, vd))}
    optimizer = optax.adam(args.lr)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, draft, teacher, valid, prev):
        loss, grads = jax.value_and_grad(lambda q: annealed_kl(corrected(q, draft, prev), teacher, valid,
                                                               settings.gamma)[0])(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    def leading(logits, teacher, valid):
        """Per anchor whose row 0 counts: how many rows in a row from row 0 match the teacher's argmax
        (a greedy chain draft's accepted tokens; the data are the target's own greedy answers)."""
        hit = (jnp.argmax(logits, axis=-1) == jnp.argmax(teacher, axis=-1)) & valid
        return jnp.sum(jnp.cumprod(hit, axis=-1), axis=-1), valid[..., 0]

    def evaluate(params, draft, teacher, valid, prev):
        fixed = corrected(params, draft, prev)
        return ((annealed_kl(draft, teacher, valid, settings.gamma), leading(draft, teacher, valid)),
                (annealed_kl(fixed, teacher, valid, settings.gamma), leading(fixed, teacher, valid)))

    metrics = jax.jit(evaluate)

    start = time.time()
    for n in range(args.train_batches):
        batch, _ = load_batch(data, settings, n, pad_id, taps)
        params, state, loss = step(params, state, *frozen(batch))
        if n % 50 == 0 or n == args.train_batches - 1:
            print(f"train batch {n}: loss {float(loss):.4f} ({time.time() - start:.0f} s)", flush=True)
    sums = {"head": None, "corrected": None}
    losses = {"head": [], "corrected": []}
    runs = {"head": [], "corrected": []}
    for n in range(per_epoch - args.eval_batches, per_epoch):
        batch, _ = load_batch(data, settings, n, pad_id, taps)
        for name, ((loss, s), (lead, counted)) in zip(("head", "corrected"), metrics(params, *frozen(batch))):
            losses[name].append(float(loss))
            runs[name] += np.asarray(lead)[np.asarray(counted)].tolist()
            s = {k: np.asarray(v, np.float64) for k, v in s.items()}
            sums[name] = s if sums[name] is None else {k: sums[name][k] + s[k] for k in s}
    out = {"rank": args.rank, "train_batches": args.train_batches, "eval_batches": args.eval_batches}
    for name in ("head", "corrected"):
        alpha = row_accuracy(sums[name]["correct"], sums[name]["count"])
        out[name] = {"loss": float(np.mean(losses[name])), "alpha": [round(float(a), 4) for a in alpha],
                     "tau_chain": expected_length(alpha), "tau_greedy_chain": 1.0 + float(np.mean(runs[name])),
                     "anchors": len(runs[name])}
        print(f"{name:9s} loss {out[name]['loss']:.4f}  α {' '.join(f'{a:.3f}' for a in alpha)}  "
              f"chain τ {out[name]['tau_chain']:.3f}  greedy chain τ {out[name]['tau_greedy_chain']:.3f} "
              f"({len(runs[name])} anchors)")
    if args.output:
        args.output.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
