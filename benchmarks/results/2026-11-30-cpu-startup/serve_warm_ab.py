import sys, json, os, statistics
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import cold_start
xdg = Path.home() / ".cache"
trees = {"base": Path("/tmp/s8/t_3c300a8"), "new": Path("/tmp/s8/t_8133f3d")}
numba = {k: Path(f"/tmp/s8/numba_{k}") for k in trees}
for p in numba.values(): p.mkdir(exist_ok=True)
order = [("new", True), ("base", True), ("new", False), ("base", False), ("new", False), ("base", False)]
TIMEOUT = {True: 1500, False: 600}
out = {}
for name, priming in order:
    r = cold_start.serve_ready(trees[name], xdg, numba[name], "full", TIMEOUT[priming], requests=not priming)
    r["priming"] = priming
    print(name, "priming" if priming else "", "ready", r["ready_s"], "warm", r["warm_s"], "load", r.get("load_ready"),
          [(q["method"], q["stream"], q["temperature"], q["wall_s"], q["compile_s"]) for q in r.get("first_requests", [])], flush=True)
    out.setdefault(name, []).append(r)
json.dump(out, open("/tmp/s8/serve_ab.json", "w"), indent=1, default=str)
