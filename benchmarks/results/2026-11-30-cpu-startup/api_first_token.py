import time
t0 = time.perf_counter()
from dart_jax import DartModel
m = DartModel.demo()
t1 = time.perf_counter()
for piece in m.stream("Write a haiku about the sea.", max_new_tokens=16):
    t2 = time.perf_counter()
    break
print(f"loaded {t1-t0:.1f} s, first token {t2-t0:.1f} s")
