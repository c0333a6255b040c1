"""Does a step's host call pay for every weight array it takes, and can a model's layers be
stacked into one array per kind of weight without slowing its matmuls?

    python benchmarks/layer_layout_probe.py [--shape Qwen3-8B] [--layers 36] [--rows 1,61] [--output FILE]
    python benchmarks/layer_layout_probe.py --tiny        # seconds on a CPU (figures meaningless)

The engine passes the target's weights as one array per weight and layer (8 a layer with fused
projections: about 300 arguments at Qwen3-8B's 36 layers), and on an H200 a host call of a decode
step cost 1.5 ms more than a token of the device loop (benchmarks/RESULTS.md, 2026-11-26). This
probe tells whether the arguments are that cost, and what stacking them would cost the device, on
a stand-in for the target's pass: per layer an RMS norm, the fused q/k/v projection, the o
projection of its first `hidden` columns, another norm, the fused gate/up projection and the
down projection (the step's weight traffic without attention and its small ops), with weights
drawn on the device (bf16; float32 on a CPU), in three layouts:

  separate   one array per weight and layer, the layers unrolled (the engine's layout today)
  stacked    one [L, ...] array per kind of weight, the layers unrolled, layer i reading w[i]
  scanned    the stacked arrays through `lax.scan` (one loop body)

Each layout is timed at each of `--rows` (query rows: 1 is a plain token, 61 a keep-60 tree),
compiled with the XLA options the engine gives a verify of that many rows
(`qwen3.verify_compiler_options`); `pass` rows time a call that only takes a layout's arrays
(and reads one element): the host cost of passing them. `weights_tb_s` is the weights' bytes
over the median time; `max_abs_diff` how far a forward's output is from the separate layout's
(the same computation: zero up to the order of float additions). JSON (`--output`): {"config",
"rows": [{layout, kind, rows, arrays, median_ms, min_ms, max_ms, weights_tb_s, max_abs_diff}]}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.bench.shapes import KNOWN_SHAPES, TINY_SHAPE
from dart_jax.bench.util import summary_ms, time_calls
from dart_jax.models.qwen3 import verify_compiler_options

KINDS = ("norm1", "qkv", "o", "norm2", "gate_up", "down")


def weight_shapes(fields: dict) -> dict[str, tuple[int, int] | tuple[int]]:
    h, i = fields["hidden_size"], fields["intermediate_size"]
    d = fields.get("head_dim") or h // fields["num_attention_heads"]
    qkv = (fields["num_attention_heads"] + 2 * fields["num_key_value_heads"]) * d
    return {"norm1": (h,), "qkv": (h, qkv), "o": (h, h), "norm2": (h,), "gate_up": (h, 2 * i), "down": (i, h)}


def draw_layers(shapes: dict, layers: int, dtype, seed: int = 0) -> list[dict[str, jax.Array]]:
    """Per layer, one array per kind, drawn on the device a layer at a time."""
    @jax.jit
    def one(key):
        keys = jax.random.split(key, len(KINDS))
        return {k: (jnp.ones(s, dtype) if k.startswith("norm") else
                    (jax.random.normal(kk, s, jnp.float32) * 0.02).astype(dtype))
                for k, kk, s in zip(KINDS, keys, (shapes[k] for k in KINDS))}
    return [one(jax.random.fold_in(jax.random.key(seed), layer)) for layer in range(layers)]


def _mm(x, w):
    return jnp.einsum("ti,io->to", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _norm(x, w):
    v = x.astype(jnp.float32)
    return (v * jax.lax.rsqrt(jnp.mean(v * v, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype) * w


def layer(x, w: dict):
    h = x.shape[-1]
    x = x + _mm(_mm(_norm(x, w["norm1"]), w["qkv"])[:, :h], w["o"])
    g, u = jnp.split(_mm(_norm(x, w["norm2"]), w["gate_up"]), 2, axis=-1)
    return x + _mm(jax.nn.silu(g) * u, w["down"])


def forward_separate(x, per_layer):
    for w in per_layer:
        x = layer(x, w)
    return x


def forward_stacked(x, stacked):
    for i in range(stacked["qkv"].shape[0]):
        x = layer(x, {k: v[i] for k, v in stacked.items()})
    return x


def forward_scanned(x, stacked):
    return jax.lax.scan(lambda x, w: (layer(x, w), None), x, stacked)[0]


def run(fields: dict, layers: int, rows: list[int], dtype, reps: int, warmup: int) -> dict:
    shapes = weight_shapes(fields)
    per_layer = draw_layers(shapes, layers, dtype)
    stacked = {k: jnp.stack([w[k] for w in per_layer]) for k in KINDS}
    jax.block_until_ready(stacked)
    nbytes = sum(int(np.prod(s)) for s in shapes.values()) * layers * jnp.dtype(dtype).itemsize
    layouts = {"separate": (forward_separate, per_layer), "stacked": (forward_stacked, stacked),
               "scanned": (forward_scanned, stacked)}
    out = []

    def record(layout, kind, n_rows, arrays, seconds):
        t = summary_ms(seconds)
        out.append({"layout": layout, "kind": kind, "rows": n_rows, "arrays": arrays, **t,
                    "weights_tb_s": nbytes / (t["median_ms"] / 1e3) / 1e12 if kind == "forward" else None})
        print(f"{layout:>9} {kind:>7} rows {n_rows:>3} arrays {arrays:>4}: {t['median_ms']:.3f} ms", flush=True)

    for name, arrays in (("separate", per_layer), ("stacked", stacked)):
        touch = jax.jit(lambda ws: jax.tree.leaves(ws)[0].ravel()[0], keep_unused=True)
        record(name, "pass", 0, len(jax.tree.leaves(arrays)),
               time_calls(lambda: touch(arrays), reps=reps, warmup=warmup))
    for n_rows in rows:
        x = jax.random.normal(jax.random.key(1), (n_rows, fields["hidden_size"]), jnp.float32).astype(dtype)
        options = verify_compiler_options(n_rows)
        first = None
        for name, (fn, arrays) in layouts.items():
            jitted = jax.jit(fn, compiler_options=options)
            result = np.asarray(jitted(x, arrays), np.float32)
            first = result if first is None else first
            record(name, "forward", n_rows, len(jax.tree.leaves(arrays)),
                   time_calls(lambda: jitted(x, arrays), reps=reps, warmup=warmup))
            # the same computation in every layout (up to the order of float additions)
            out[-1]["max_abs_diff"] = float(np.max(np.abs(result - first)))
    return {"config": {"fields": fields, "layers": layers, "dtype": jnp.dtype(dtype).name, "weight_bytes": nbytes,
                       "reps": reps, "warmup": warmup, "backend": jax.default_backend(),
                       "device": jax.devices()[0].device_kind},
            "rows": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="Qwen3-8B", choices=sorted(KNOWN_SHAPES), help="widths (default Qwen3-8B)")
    ap.add_argument("--layers", type=int, help="layers (default: the shape's)")
    ap.add_argument("--rows", default="1,61", help="query rows, comma-separated (default 1,61)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per figure (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    ap.add_argument("--tiny", action="store_true", help="the tiny widths, 6 layers: a check on a CPU")
    ap.add_argument("--output", type=Path, help="write the JSON here")
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows takes comma-separated integers, got {args.rows!r}")
    if not rows or min(rows) < 1 or (args.layers is not None and args.layers < 1):
        ap.error("--rows and --layers must be >= 1")
    fields = TINY_SHAPE if args.tiny else KNOWN_SHAPES[args.shape]
    layers = args.layers or (6 if args.tiny else fields["num_hidden_layers"])
    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    result = run(fields, layers, rows, dtype, args.reps, args.warmup)
    result["config"]["shape"] = "tiny" if args.tiny else args.shape
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
