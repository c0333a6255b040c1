import time, numpy as np
from dart_jax.convert import gguf
from dart_jax import DartModel
real = gguf.is_weights
res = {"later": [], "now": []}
for i in range(8):
    for mode in (("later", "now") if i % 2 else ("now", "later")):
        gguf._INTACT.clear(); gguf._PENDING.clear()
        gguf.is_weights = real if mode == "later" else (lambda name: False)
        t = time.perf_counter(); DartModel.demo(); res[mode].append(time.perf_counter() - t)
for k, v in res.items():
    print(k, round(float(np.median(v)), 3), [round(x, 2) for x in v])
