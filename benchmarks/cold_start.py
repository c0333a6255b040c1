"""Cold start of `python -m dart_jax.generate` on the SmolLM2 demo: seconds from process start to
the first DART token, with the caches cold (a fresh persistent XLA compilation cache and a fresh
Numba cache) and then warm (the same run again over the caches the cold one filled).

    python benchmarks/cold_start.py [--runs 2] [--warm 1] [--tree DIR ...] [--max-new-tokens 16] [--compare-ar]
    python benchmarks/cold_start.py --serve quick|full [--requests] [--tree DIR ...]   # the server's time to ready

Each run is a new Python process (this file with --child) that times the command's own path
(`dart_jax.api.generate.run`, warm-up included, exactly as the CLI runs it): the imports, the
model loaded, the first piece of the streamed DART answer, and the compilation before it split by
program (XLA: tracing, lowering and compiling or loading from the cache, per jitted function;
Numba: per kernel and signature). Several `--tree` folders (checkouts of dart_jax, e.g. the code
before and after a change) are run in turn, alternating, so that a busy machine's load falls on
each alike; the report gives medians per tree and mode, and the ratios to the first tree.

The cold caches: XDG_CACHE_HOME points to a new temporary folder (the CLI's XLA cache lives under
it) that links back to the demo's cached base model, and NUMBA_CACHE_DIR to an empty folder.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(argv: list[str]) -> None:
    """In the measured process: run the CLI's path, print one JSON line of timings."""
    start = float(os.environ["COLD_START_T0"])  # the parent's clock just before the process began
    compiles: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(name: str, seconds: float, program: bool = True) -> None:
        compiles[name] = compiles.get(name, 0.0) + seconds
        counts[name] = counts.get(name, 0) + program

    from numba.core import event as numba_event

    class Numba(numba_event.Listener):
        """Each kernel's own seconds (those of the kernels it compiles inside it left out)."""
        stack: list = []

        def on_start(self, event):
            self.stack.append([time.perf_counter(), 0.0])

        def on_end(self, event):
            begun, inner = self.stack.pop()
            spent = time.perf_counter() - begun
            if self.stack:
                self.stack[-1][1] += spent
            add(f"numba {event.data['dispatcher'].py_func.__name__}", spent - inner)

    numba_event.register("numba:compile", Numba())
    import jax

    def on_duration(event: str, seconds: float, **kwargs) -> None:
        if event.startswith("/jax/core/compile/") and event.endswith("_duration") and "fun_name" in kwargs:
            name = str(kwargs["fun_name"]).removeprefix("jit_")
            add(f"xla {name}", seconds, program="mlir" in event)  # a program is lowered once

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    t_jax = time.time()
    import dart_jax.api.generate as generate
    from dart_jax.api.options import parse_args
    t_import = time.time()
    marks = {}
    load = generate.load_model

    def timed_load(args):
        model = load(args)
        marks["loaded"] = time.time()
        marks["compile_at_load"] = dict(compiles)
        return model

    generate.load_model = timed_load

    class Out:
        text = ""

        def write(self, piece: str) -> None:
            if piece.startswith("[prompt] "):  # the command's header before the wait: not the answer
                self.text += piece
                return
            if piece and "first" not in marks:
                marks["first"] = time.time()
                usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread's, compilations included
                marks["cpu"] = usage.ru_utime + usage.ru_stime
                marks["compile_before_first"] = dict(compiles)
            self.text += piece

        def flush(self) -> None:
            pass

    generate.run(parse_args(argv), out=Out())
    first = marks["compile_before_first"]
    print(json.dumps({"import_jax_s": t_jax - start, "import_s": t_import - start, "loaded_s": marks["loaded"] - start,
                      "first_token_s": marks["first"] - start, "cpu_s": marks["cpu"],
                      "compile_s": {k: round(v, 3) for k, v in sorted(first.items(), key=lambda kv: -kv[1])},
                      "programs": {k: counts[k] for k in first},
                      "compile_total_s": sum(first.values()),
                      "compile_at_load_s": {k: round(v, 3) for k, v in marks["compile_at_load"].items() if v >= 0.05}}))


def run_once(tree: Path, xdg: Path, numba: Path, cli: list[str]) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg), NUMBA_CACHE_DIR=str(numba),
               PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["COLD_START_T0"] = repr(time.time())
    done = subprocess.run([sys.executable, __file__, "--child", *cli], env=env, cwd=tree,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _get(url: str, timeout: float = 2) -> dict:
    import urllib.request
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def first_requests(base: str) -> list[dict]:
    """One chat request of each method the server lists, greedy and not streamed, then sampled and
    streamed: what each first answer reports it waited for compiling (`dart.compile_s`) and its
    wall seconds."""
    import urllib.request
    model = _get(base + "/v1/models")["data"][0]
    out = []
    for method in model["methods"]:
        for stream, temperature in ((False, 0.0), (True, 0.8)):
            body = {"model": model["id"], "messages": [{"role": "user", "content": "Name three colours."}],
                    "max_tokens": 24, "method": method, "temperature": temperature, "stream": stream, "seed": 1}
            request = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            began = time.time()
            with urllib.request.urlopen(request, timeout=900) as r:
                text = r.read().decode()
            if stream:  # the last chunk with a finish reason carries the answer's figures
                chunks = [json.loads(line[6:]) for line in text.splitlines()
                          if line.startswith("data: {")]
                dart = next(c["dart"] for c in reversed(chunks) if c.get("choices") and c["choices"][0]["finish_reason"])
            else:
                dart = json.loads(text)["dart"]
            out.append({"method": method, "stream": stream, "temperature": temperature,
                        "wall_s": round(time.time() - began, 2), "compile_s": dart["compile_s"]})
    return out


def serve_ready(tree: Path, xdg: Path, numba: Path, warmup: str, timeout: float, requests: bool = False) -> dict:
    """Seconds from starting `python -m dart_jax.serve --warmup WARMUP` until GET /v1/models answers
    (`ready_s`), and until /health says the warm-up ended (`warm_s`, where /health reports it); with
    `requests`, what the first requests of every method waited for afterwards (`first_requests`)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XDG_CACHE_HOME=str(xdg), NUMBA_CACHE_DIR=str(numba),
               PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = xdg / "serve.log"
    base = f"http://127.0.0.1:{port}"
    began = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dart_jax.serve", "--port", str(port), "--no-ui",
                                 "--warmup", warmup], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    result: dict = {"ready_s": None, "warm_s": None}
    try:
        while time.time() - began < timeout and proc.poll() is None:
            try:
                _get(base + "/v1/models", timeout=30)
                result["ready_s"] = time.time() - began
                result["load_ready"] = os.getloadavg()[0]
                break
            except OSError:
                pass
            time.sleep(0.5)
        while result["ready_s"] is not None and time.time() - began < timeout and proc.poll() is None:
            try:  # a server compiling on every core may take seconds to answer
                warmup_state = _get(base + "/health", timeout=60).get("warmup")
            except OSError:
                continue
            if warmup_state is None or warmup_state.get("done"):
                result["warm_s"] = time.time() - began
                result["load_warm"] = os.getloadavg()[0]
                result["health"] = warmup_state
                break
            time.sleep(0.5)
        if requests and result["warm_s"] is not None:
            result["first_requests"] = first_requests(base)
    finally:
        proc.terminate()
        proc.wait(60)
    lines = [line for line in log.read_text(errors="replace").splitlines() if "warm-up" in line or "compil" in line]
    result["log"] = lines[-40:]
    return result


def fresh_caches(scratch: Path, n: int) -> tuple[Path, Path]:
    xdg, numba = scratch / f"xdg{n}", scratch / f"numba{n}"
    (xdg / "dart_jax").mkdir(parents=True)
    numba.mkdir()
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dart_jax" / "smollm2"
    (xdg / "dart_jax" / "smollm2").symlink_to(home)  # the demo's base model, fetched once: not a cache to make cold
    return xdg, numba


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", type=Path, help="a dart_jax checkout to run (repeatable; default this one)")
    p.add_argument("--runs", type=int, default=2, help="cold+warm pairs per tree")
    p.add_argument("--warm", type=int, default=1, help="warm runs after each cold one (the trees' warm runs in turns)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--compare-ar", action="store_true", help="run the demo with --compare-ar, as its README suggests")
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    p.add_argument("--serve", choices=["quick", "full"],
                   help="instead: seconds until `python -m dart_jax.serve --warmup X` answers GET /v1/models")
    p.add_argument("--timeout", type=float, default=900, help="--serve: give up after this many seconds")
    p.add_argument("--requests", action="store_true",
                   help="--serve: once warm, send each method's first requests and print what they compiled")
    opts = p.parse_args()
    trees = [t.resolve() for t in (opts.tree or [ROOT])]
    if opts.serve:
        with tempfile.TemporaryDirectory(prefix="cold_start") as scratch:
            n = 0
            for rep in range(opts.runs):
                for tree in trees:
                    n += 1
                    caches = fresh_caches(Path(scratch), n)
                    for mode in ("cold", "warm"):  # the warm run over the caches the cold one filled
                        load = os.getloadavg()[0]
                        result = serve_ready(tree, *caches, opts.serve, opts.timeout, requests=opts.requests)
                        ready = "not within the timeout" if result["ready_s"] is None else f"{result['ready_s']:.1f} s"
                        warm = "" if result["warm_s"] is None else f", warm-up ended at {result['warm_s']:.1f} s"
                        print(f"{tree.name} serve --warmup {opts.serve} {mode} #{rep + 1}: /v1/models answered after "
                              f"{ready}{warm} (load average {load:.1f} at start, "
                              f"{result.get('load_ready', float('nan')):.1f} when ready)")
                        for r in result.get("first_requests", []):
                            print(f"    first request {r['method']} {'streamed' if r['stream'] else 'whole'} "
                                  f"T={r['temperature']}: {r['wall_s']} s, compiling {r['compile_s']} s")
                        print("    " + "\n    ".join(result["log"]))
        return
    cli = ["--max-new-tokens", str(opts.max_new_tokens)] + (["--compare-ar"] if opts.compare_ar else [])
    runs: dict[tuple[str, str], list[dict]] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cold_start") as scratch:
        n = 0
        for rep in range(opts.runs):
            caches = {}
            for tree in trees:
                n += 1
                caches[tree] = fresh_caches(Path(scratch), n)
            # each tree's cold run, then the warm runs over the caches it filled, the trees in turns
            for mode, tree in [("cold", t) for t in trees] + [("warm", t) for _ in range(opts.warm) for t in trees]:
                xdg, numba = caches[tree]
                result = run_once(tree, xdg, numba, cli)
                result["load_avg"] = os.getloadavg()[0]
                runs.setdefault((str(tree), mode), []).append(result)
                print(f"{tree.name} {mode} #{rep + 1}: first DART token {result['first_token_s']:.1f} s "
                      f"(import {result['import_s']:.1f}, loaded {result['loaded_s']:.1f}, compiling "
                      f"{result['compile_total_s']:.1f}, CPU {result['cpu_s']:.1f} s; load average "
                      f"{result['load_avg']:.1f})", file=sys.stderr)
    print(f"load average at start {load:.1f} on {os.cpu_count()} cores")
    keys = ("import_s", "loaded_s", "first_token_s", "cpu_s", "compile_total_s")
    base = {}
    for (tree, mode), results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in keys}
        base.setdefault(mode, med)
        ratio = med["first_token_s"] / base[mode]["first_token_s"]
        print(f"{Path(tree).name:>12} {mode}: " + ", ".join(f"{k} {med[k]:.1f}" for k in keys)
              + f" (median of {len(results)}; first token ×{ratio:.2f} of the first tree)")
        last = results[-1]
        print("    compiling before the first token (last run): "
              + ", ".join(f"{k} {v:.1f}" for k, v in last["compile_s"].items() if v >= 0.2))
    if opts.json:
        opts.json.write_text(json.dumps({f"{Path(t).name} {m}": r for (t, m), r in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
