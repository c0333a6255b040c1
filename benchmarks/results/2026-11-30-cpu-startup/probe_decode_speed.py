import time, statistics as st
from dart_jax import DartModel
m = DartModel.demo(keep=7); m.compile_notice = None
prompts = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain the difference between a list and a tuple in Python.",
           "Write a short poem about autumn leaves."]
N = 96
for p in prompts:
    m.generate(p, max_new_tokens=N); m.generate_ar(p, max_new_tokens=N)
rows = {"ar_tok_ms": [], "ar_prefill_ms": [], "dart_step_ms": [], "dart_prefill_ms": []}
for rep in range(3):
    for p in prompts:
        a = m.generate(p, max_new_tokens=N).stats; b = m.generate_ar(p, max_new_tokens=N).stats
        rows["dart_step_ms"].append((a["total_s"] - a["prefill_s"]) / a["steps"] * 1e3)
        rows["dart_prefill_ms"].append(a["prefill_s"] * 1e3)
        rows["ar_tok_ms"].append((b["total_s"] - b["prefill_s"]) / (b["new_tokens"] - 1) * 1e3)
        rows["ar_prefill_ms"].append(b["prefill_s"] * 1e3)
print(" ".join(f"{k} {st.median(v):.2f}" for k, v in rows.items()))
