"""default auto (sizes 0,3,7) vs auto over (0,7) vs fixed 7, per prompt in turn, 20 held-out prompts."""
import json, sys, time, collections
import numpy as np
from dart_jax.api.model import DartModel
from dart_jax.decoding.adaptive import TreeSizer

def make(**kw):
    return DartModel.demo("smollm2", **kw)
variants = {"fixed7": make(keep=7), "auto": make()}
m = make(); m.engine.sizer.row_smoothing = 0.3; m.engine.sizer.plain_doubt = 0.0
variants["old"] = m
rows = [json.loads(l) for l in open("dart_jax/demo/smollm2/prompts_eval.jsonl")]
seen = collections.Counter(); picked = []
for r in rows:
    if seen[r["category"]] < 10:
        seen[r["category"]] += 1; picked.append(r)
kw = dict(max_new_tokens=128)
base = variants["auto"]
for name, mm in variants.items():
    mm.generate(picked[0]["prompt"], **kw); mm.generate(picked[1]["prompt"], **kw)
base.generate(picked[0]["prompt"], method="ar", **kw)
speed = collections.defaultdict(dict)
names = list(variants)
for i, r in enumerate(picked):
    t = time.perf_counter(); ar = base.generate(r["prompt"], method="ar", **kw); t_ar = time.perf_counter() - t
    order = names[i % 3:] + names[:i % 3]
    for name in order:
        t = time.perf_counter(); out = variants[name].generate(r["prompt"], **kw); dt = time.perf_counter() - t
        assert out.token_ids == ar.token_ids, (name, r["id"])
        speed[name][r["id"]] = t_ar / dt
    print(r["id"], " ".join(f"{n} {speed[n][r['id']]:.2f}" for n in names), flush=True)
for name in names:
    v = np.array(list(speed[name].values()))
    chat = np.median([s for k, s in speed[name].items() if k.startswith("chat")])
    code = np.median([s for k, s in speed[name].items() if k.startswith("code")])
    print(f"{name}: median {np.median(v):.3f} min {v.min():.3f} below0.95 {(v < 0.95).sum()} chat {chat:.2f} code {code:.2f}", flush=True)
