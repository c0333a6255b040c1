"""Start `python -m dart_jax.serve` on a free port of 127.0.0.1 for a test, and stop it after."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(*args: str, timeout: float = 240.0, env: dict | None = None):
    """Yields (base URL, process) once GET /health answers; SIGTERM at the end (the process must
    then exit by itself within 60 s). stdout/stderr are captured in the process's `log` file. The
    warm-up covers 64 tokens unless `args` say otherwise: the requests of these tests are short, and
    what a warm-up covers is tested in test_serve_ready."""
    if "--warmup-length" not in args:
        args = (*args, "--warmup-length", "64")
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"dart_jax_serve_{port}.log"
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dart_jax.serve", "--port", str(port), *args], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env=full_env)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start in {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            stop_process(proc)


def stop_process(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
