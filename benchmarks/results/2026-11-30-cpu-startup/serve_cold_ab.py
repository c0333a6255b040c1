import sys, json, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import cold_start
scratch = Path(tempfile.mkdtemp(prefix="serve_cold_"))
trees = [("before", Path("/tmp/s8/t_3c300a8")), ("after", Path("/tmp/s8/t_8133f3d"))]
out = {}
for n, (name, tree) in enumerate(trees):
    xdg, numba = cold_start.fresh_caches(scratch, n)
    r = cold_start.serve_ready(tree, xdg, numba, "full", 130)
    print(name, "cold: /v1/models after", round(r["ready_s"], 1) if r["ready_s"] else None, "s; load", r.get("load_ready"), flush=True)
    out[name] = r
json.dump(out, open("/tmp/s8/serve_cold.json", "w"), indent=1, default=str)
