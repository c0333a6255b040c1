import gc, time, sys, threading
mode = sys.argv[1]
T0 = time.perf_counter()
gcs = [0.0, 0]; _st = [0.0]
def _cb(phase, info):
    if phase == "start": _st[0] = time.perf_counter()
    else: gcs[0] += time.perf_counter() - _st[0]; gcs[1] += 1
gc.callbacks.append(_cb)
if mode != "base": gc.disable()
from dart_jax import DartModel
import dart_jax.decoding.compile_time as ct
if mode == "events":
    _lock = threading.Lock(); _n = [0, False]
    s0, d0 = ct._on_start, ct._on_duration
    def on_start(event, value, **kw):
        if event in ct._EVENTS and ct._state().depth == 0:
            with _lock:
                if _n[0] == 0: _n[1] = gc.isenabled(); gc.disable()
                _n[0] += 1
        s0(event, value, **kw)
    def on_dur(event, d, **kw):
        d0(event, d, **kw)
        if event in ct._EVENTS and ct._state().depth == 0:
            with _lock:
                _n[0] -= 1
                if _n[0] == 0 and _n[1]: gc.enable()
    ct._on_start, ct._on_duration = on_start, on_dur
    import jax
    jax.monitoring.register_scalar_listener(lambda *a, **k: ct._on_start(*a, **k))
    jax.monitoring.register_event_duration_secs_listener(lambda *a, **k: ct._on_duration(*a, **k))
t_imp = time.perf_counter() - T0
m = DartModel.demo()
if mode == "freeze": gc.freeze()
if mode == "cfreeze": gc.collect(); gc.freeze()
if mode in ("freeze", "cfreeze", "load", "events"): gc.enable()
t_load = time.perf_counter() - T0
it = m.stream("Write a Python function that checks whether a string is a palindrome.", max_new_tokens=16)
next(it); t0 = time.perf_counter() - T0; g0 = gcs[0]
next(it); t1 = time.perf_counter() - T0; g1 = gcs[0]
if mode == "first": gc.enable()
for _ in it: pass
t2 = time.perf_counter() - T0
print(f"{mode:7s} import {t_imp:.2f} load {t_load:.2f} token0 {t0:.2f} token1 {t1:.2f} all16 {t2:.2f} gc0 {g0:.3f} gc1 {g1:.3f} gcall {gcs[0]:.3f} n {gcs[1]}")
