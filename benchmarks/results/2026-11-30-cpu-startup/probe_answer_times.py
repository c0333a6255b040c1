import time, sys, os, json
from dart_jax import DartModel
m = DartModel.demo(keep=7, compile_notice=None) if False else DartModel.demo(keep=7)
m.compile_notice = None
prompts = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain the difference between a list and a tuple in Python.",
           "Write a short poem about autumn leaves."]
N = 96
for p in prompts:  # warm: every window compiled
    m.generate(p, max_new_tokens=N); m.generate_ar(p, max_new_tokens=N)
res = {"dart": [], "ar": []}
for rep in range(3):
    for p in prompts:
        t = time.perf_counter(); a = m.generate(p, max_new_tokens=N); res["dart"].append(time.perf_counter() - t)
        t = time.perf_counter(); b = m.generate_ar(p, max_new_tokens=N); res["ar"].append(time.perf_counter() - t)
        assert list(a.token_ids) == list(b.token_ids)
d, a = sum(res["dart"]), sum(res["ar"])
print(f"dart {d:.2f}s ar {a:.2f}s ratio {a/d:.3f}")
