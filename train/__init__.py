"""Training DART (docs/spec.md §7) and EAGLE-3 draft heads with optax and orbax-checkpoint.

`python -m dart_jax.train --base BASE --data FILE.jsonl --out DIR` (see `--help`):
- data.py        JSONL conversations → chat template → ids + assistant loss mask; batches, anchors
- regenerate.py  optional regeneration of the assistant turns by the target (greedy or sampled)
- vocab.py       the draft vocabulary (d2t, t2d) from the training targets
- masks.py       layout of the packed sequence: real positions + one block of m mask slots per anchor
- forward.py     the head's training forward (many anchors in one pass, reusing DartHead's parameters)
- loss.py        annealed KL over the d rows, per-row accuracy α and the chain estimate of τ
- eagle3.py      `--method eagle3`: training-time test over unrolled draft steps, its loss, export
- loop.py        teacher (frozen target), AdamW + warm-up/cosine + clipping + accumulation, data parallel
- checkpoint.py  orbax checkpoints, keep-last-N, resume
"""
