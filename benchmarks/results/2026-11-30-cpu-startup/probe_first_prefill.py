import time
import numpy as np, jax
from dart_jax import DartModel
import dart_jax.decoding.batcher as B
m = DartModel.demo()
orig = B.Batcher._admit
log = []
def admit(self, free):
    eng = self.engine
    p0 = eng.prefill
    def prefill(*a, **k):
        t = time.perf_counter(); r = p0(*a, **k); t1 = time.perf_counter()
        jax.block_until_ready(r); t2 = time.perf_counter()
        log.append(("prefill call", t1 - t, "run", t2 - t1)); return r
    eng.prefill = prefill
    try: return orig(self, free)
    finally: del eng.prefill
B.Batcher._admit = admit
ids = m.encode("Write a Python function that checks whether a string is a palindrome.")
for i in range(3):
    it = m.stream(ids, max_new_tokens=4); t = time.perf_counter(); next(it); print("token0", round(time.perf_counter() - t, 3), log); log.clear(); list(it)
