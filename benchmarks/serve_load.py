#!/usr/bin/env python
"""Load test of the HTTP server (`python -m dart_jax.serve`): many concurrent chat clients.

Starts the server itself (the embedded demo model unless --server-args names a checkpoint), or
talks to a running one (--url). Then, for every concurrency level of --clients and every method
of --methods ("dart" and/or "ar", the plain autoregressive baseline), it has that many concurrent
clients (asyncio tasks sharing one official `openai` AsyncOpenAI client) send streaming, greedy
(temperature 0) chat completions with a fixed max_tokens, cycling over a few prompts, until
--requests requests were sent or --max-seconds passed (requests in flight then finish, each cut
off after --timeout seconds). Before the first timed level, every prompt is sent once per method
(--warmup rounds), untimed.

Reported per (clients, method):
  req/s       completed requests / wall time of the level (first send to last answer)
  out tok/s   completion tokens of those requests / the same wall time (the server's usage count)
  p50/p95 lat whole-request latency (send to the last SSE chunk), in ms
  p50 TTFT    time to the first chunk that carries text, in ms
  tau         mean accepted length over every decoding step of the level's requests (the
              `dart.accept_lengths` of each answer's last chunk; 1.0 for "ar")
as a table on stdout (progress on stderr) and, with --json FILE, as JSON (see benchmarks/README.md).

Examples:
  python benchmarks/serve_load.py                                   # demo model, 1/4/16 clients, dart and ar
  python benchmarks/serve_load.py --clients 1,8 --requests 32 --json load.json
  python benchmarks/serve_load.py --server-args "--no-ui --slots 16 --ckpt fvliang/qwen4b-dart --small-ngram"
  python benchmarks/serve_load.py --url http://127.0.0.1:8000 --model dart-jax-demo --methods dart

The client shares the machine with the server when both run here: on a small CPU its own work
(parsing one SSE chunk per step) takes a little from the server, more for "ar" (one chunk per token).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import itertools
import json
import math
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The demo model was trained on short answers about speculative decoding (scripts/demo_corpus.jsonl):
# four of its questions, one paraphrase of a fifth, and two it never saw.
DEFAULT_PROMPTS = [
    "What is speculative decoding?",
    "What does DART do differently?",
    "How does the n-gram trie help?",
    "What is the key value cache?",
    "Why does the draft tree have a budget?",
    "Explain why the sky is blue.",
    "Write a shopping list for a picnic.",
]

COLUMNS = [  # (JSON key, header, format)
    ("clients", "clients", "{:d}"),
    ("method", "method", "{}"),
    ("requests", "requests", "{:d}"),
    ("errors", "errors", "{:d}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("requests_per_s", "req/s", "{:.2f}"),
    ("output_tokens_per_s", "out tok/s", "{:.1f}"),
    ("latency_p50_ms", "p50 lat ms", "{:.0f}"),
    ("latency_p95_ms", "p95 lat ms", "{:.0f}"),
    ("ttft_p50_ms", "p50 TTFT ms", "{:.0f}"),
    ("mean_accepted_length", "tau", "{:.2f}"),
]


# ---------------------------------------------------------------------------- options
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python benchmarks/serve_load.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_argument_group("server")
    where.add_argument("--url", help="use the server running at this base URL (e.g. http://127.0.0.1:8000) "
                                     "instead of starting one")
    where.add_argument("--server-args", default="--no-ui",
                       help="arguments for the `python -m dart_jax.serve` this script starts on a free port of "
                            "127.0.0.1, as one shell-quoted string (default: %(default)r: the demo model, "
                            "the server's default --slots 8)")
    where.add_argument("--server-timeout", type=float, default=600.0,
                       help="seconds to wait for the started server to answer /health (it compiles first)")
    where.add_argument("--model", help="model id to send (default: the first of GET /v1/models)")
    where.add_argument("--api-key", default=os.environ.get("DART_JAX_API_KEY") or "none",
                       help="bearer key for a server started with --api-key (default $DART_JAX_API_KEY)")
    load = ap.add_argument_group("load")
    load.add_argument("--clients", default="1,4,16", help="concurrency levels, comma-separated (default %(default)s)")
    load.add_argument("--methods", default="dart,ar", help="decoding methods, comma-separated: dart, ar "
                                                           "(default %(default)s)")
    load.add_argument("--requests", type=int, default=64,
                      help="requests per (level, method) (default %(default)s)")
    load.add_argument("--max-seconds", type=float, default=30.0,
                      help="no new request of a (level, method) after this many seconds (default %(default)s)")
    load.add_argument("--timeout", type=float, default=120.0,
                      help="a request still running after this many seconds is cut off and counted as an "
                           "error (default %(default)s)")
    load.add_argument("--warmup", type=int, default=1,
                      help="untimed rounds over all prompts per method before timing (default %(default)s)")
    load.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (default %(default)s)")
    load.add_argument("--prompts", type=Path,
                      help="JSONL file with a 'prompt' per line (the format of dart_jax/data/prompts.jsonl); "
                           "default: 7 built-in prompts, 5 about speculative decoding (the demo's topic), 2 not")
    load.add_argument("--tree-size", type=int, help="`tree_size` extra for dart requests (default: the server's)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args(argv)
    try:
        args.client_levels = [int(v) for v in args.clients.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--clients expects comma-separated integers such as 1,4,16, got {args.clients!r}")
    if not args.client_levels or min(args.client_levels) < 1 or max(args.client_levels) > 1024:
        ap.error(f"--clients expects integers in [1, 1024], got {args.clients!r}")
    args.method_list = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not args.method_list or any(m not in ("dart", "ar") for m in args.method_list):
        ap.error(f"--methods expects dart and/or ar, got {args.methods!r}")
    for name in ("requests", "max_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.warmup > 10:
        ap.error("--warmup must lie in [0, 10]")
    if not (0 < args.max_seconds <= 3600 and 0 < args.timeout <= 3600 and 0 < args.server_timeout <= 3600):
        ap.error("--max-seconds, --timeout and --server-timeout must lie in (0, 3600]")
    if args.prompts is not None:
        args.prompt_list = load_prompts(args.prompts, ap)
    else:
        args.prompt_list = list(DEFAULT_PROMPTS)
    return args


def load_prompts(path: Path, ap: argparse.ArgumentParser) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        ap.error(f"--prompts: cannot read {path}: {e}")
    prompts = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError):
                ap.error(f"--prompts: line {n} of {path} is not a JSON object with a 'prompt'")
    if not prompts:
        ap.error(f"--prompts: {path} holds no prompt")
    return prompts


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StartedServer:
    """`python -m dart_jax.serve` on a free port of 127.0.0.1; its output goes to a log file."""

    def __init__(self, server_args: list[str], timeout: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        fd, name = tempfile.mkstemp(prefix=f"serve_load_{self.port}_", suffix=".log")
        self.log = Path(name)
        cmd = [sys.executable, "-m", "dart_jax.serve", "--host", "127.0.0.1", "--port", str(self.port), *server_args]
        log(f"starting: {shlex.join(cmd)}  (log: {self.log})")
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = t0 + timeout
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.tail()}")
                if health(self.url):
                    break
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"the server did not answer /health within {timeout:g} s:\n{self.tail()}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0
        log(f"server ready at {self.url} after {self.start_s:.1f} s")

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        log(f"server stopped (exit code {self.proc.returncode})")


def health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------------------- statistics
def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's
    default); None for no values."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


# ---------------------------------------------------------------------------- one request
async def one_request(client, model: str, prompt: str, method: str, args) -> dict[str, Any]:
    """A streaming greedy chat completion; its latency, TTFT, tokens and accepted lengths."""
    extra: dict[str, Any] = {"method": method}
    if method == "dart" and args.tree_size is not None:
        extra["tree_size"] = args.tree_size
    t0 = time.perf_counter()
    ttft = tokens = finish = None
    accept: list[int] = []
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
        temperature=0.0, seed=0, stream=True, stream_options={"include_usage": True}, extra_body=extra)
    try:
        async for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                if ttft is None and choice.delta is not None and choice.delta.content:
                    ttft = time.perf_counter() - t0
                if choice.finish_reason:
                    finish = choice.finish_reason
                    accept = list(((chunk.model_extra or {}).get("dart") or {}).get("accept_lengths") or [])
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    finally:
        await stream.close()
    latency = time.perf_counter() - t0
    if finish is None:
        raise RuntimeError("the stream ended without a finish_reason")
    if tokens is None:
        raise RuntimeError("the stream carried no usage chunk")
    return {"latency": latency, "ttft": ttft, "tokens": tokens, "finish": finish, "accept": accept}


async def timed(client, model, prompt, method, args) -> dict[str, Any]:
    return await asyncio.wait_for(one_request(client, model, prompt, method, args), args.timeout)


# ---------------------------------------------------------------------------- one level
async def run_level(client, model: str, clients: int, method: str, args) -> dict[str, Any]:
    prompts = args.prompt_list
    issued = itertools.count()
    results: list[dict] = []
    errors: list[str] = []
    stopped_by = ["count"]
    start = time.perf_counter()
    deadline = start + args.max_seconds

    async def worker() -> None:
        while True:
            i = next(issued)
            if i >= args.requests:
                return
            if time.perf_counter() >= deadline:
                stopped_by[0] = "time"
                return
            try:
                results.append(await timed(client, model, prompts[i % len(prompts)], method, args))
            except asyncio.TimeoutError:
                errors.append(f"timeout after {args.timeout:g} s")
            except Exception as e:  # an HTTP error, a dropped connection: counted, the level goes on
                errors.append(f"{type(e).__name__}: {e}"[:300])

    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - start
    lat = [r["latency"] for r in results]
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in results)
    steps = [a for r in results for a in r["accept"]]
    finish: dict[str, int] = {}
    for r in results:
        finish[r["finish"]] = finish.get(r["finish"], 0) + 1
    return {
        "clients": clients,
        "method": method,
        "requests": len(results),
        "errors": len(errors),
        "stopped_by": stopped_by[0],
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 3) if wall > 0 else 0.0,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "mean_output_tokens": round(tokens / len(results), 2) if results else 0.0,
        "latency_p50_ms": ms(percentile(lat, 50)),
        "latency_p95_ms": ms(percentile(lat, 95)),
        "ttft_p50_ms": ms(percentile(ttft, 50)),
        "ttft_p95_ms": ms(percentile(ttft, 95)),
        "mean_accepted_length": round(sum(steps) / len(steps), 3) if steps else None,
        "steps": len(steps),
        "finish_reasons": finish,
        "error_messages": sorted(set(errors))[:5],
    }


# ---------------------------------------------------------------------------- the whole run
def fmt(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def table(rows: list[dict]) -> str:
    cells = [[h for _, h, _ in COLUMNS]] + [[fmt(r[k], f) for k, _, f in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def host_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"host": platform.node(), "cpu": cpu, "cpu_count": cores, "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None}


async def run(args, url: str) -> dict[str, Any]:
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient
    import httpx

    limits = httpx.Limits(max_connections=max(args.client_levels) + 4,
                          max_keepalive_connections=max(args.client_levels) + 4)
    client = AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0,
                         timeout=httpx.Timeout(args.timeout, connect=10.0),
                         http_client=DefaultAsyncHttpxClient(limits=limits))
    try:
        listing = await client.models.list()
        served = [m.model_dump() for m in listing.data]
        if not served:
            raise RuntimeError("GET /v1/models lists no model")
        model = args.model or served[0]["id"]
        info = next((m for m in served if m["id"] == model), {})
        log(f"model {model!r}: methods {info.get('methods')}, tree size {info.get('tree_size')}, "
            f"context {info.get('max_length')}")
        for method in args.method_list:
            for r in range(args.warmup):
                for prompt in args.prompt_list:
                    t0 = time.perf_counter()
                    out = await timed(client, model, prompt, method, args)
                    log(f"warm-up {method}: {out['tokens']} tokens in {time.perf_counter() - t0:.2f} s "
                        f"({prompt[:40]!r})")
        rows = []
        for clients in args.client_levels:
            for method in args.method_list:
                log(f"level: {clients} client(s), {method}, up to {args.requests} requests / {args.max_seconds:g} s")
                row = await run_level(client, model, clients, method, args)
                log(f"  {row['requests']} done ({row['errors']} errors) in {row['wall_s']:.1f} s: "
                    f"{row['requests_per_s']:.2f} req/s, {row['output_tokens_per_s']:.1f} tok/s, "
                    f"p50 {row['latency_p50_ms']} ms, TTFT p50 {row['ttft_p50_ms']} ms, "
                    f"tau {row['mean_accepted_length']}")
                for e in row["error_messages"]:
                    log(f"  error: {e}")
                rows.append(row)
        return {"model": model, "model_info": info, "rows": rows}
    finally:
        await client.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python benchmarks/serve_load.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            "client_host": host_info()}
    server = None
    try:
        if args.url:
            url = args.url.rstrip("/").removesuffix("/v1")
            if not health(url):
                print(f"error: no server answers {url}/health", file=sys.stderr)
                return 2
            meta["server"] = {"url": url, "started_by_script": False}
        else:
            server = StartedServer(shlex.split(args.server_args), args.server_timeout)
            url = server.url
            meta["server"] = {"url": url, "started_by_script": True, "args": shlex.split(args.server_args),
                              "start_s": round(server.start_s, 1)}
        t0 = time.perf_counter()
        out = asyncio.run(run(args, url))
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        meta["load_average_end"] = host_info()["load_average"]
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception as e:  # the server did not start, or a warm-up request failed
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    meta["server"].update(model=out["model"], tree_size=out["model_info"].get("tree_size"),
                          max_length=out["model_info"].get("max_length"))
    result = {
        "meta": meta,
        "config": {"clients": args.client_levels, "methods": args.method_list, "requests": args.requests,
                   "max_seconds": args.max_seconds, "timeout": args.timeout, "warmup": args.warmup,
                   "max_tokens": args.max_tokens, "temperature": 0.0, "stream": True,
                   "tree_size": args.tree_size, "prompts": args.prompt_list},
        "rows": out["rows"],
    }
    print(table(out["rows"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        log(f"wrote {args.json}")
    return 1 if any(r["errors"] for r in out["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
