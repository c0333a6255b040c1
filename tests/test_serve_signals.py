"""Issue 50 against a live `python -m dart_jax.serve` (the embedded tiny model): with an API key
no UI stream opens without the login, and requests past --max-connections get a 503 at once;
Ctrl-C during the warm-up stops the process cleanly (no abort inside XLA), SIGHUP ends the streams
as SIGTERM does, and a second Ctrl-C ends a running request at once, the server saying what it
does."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving import ROOT, free_port, live_server

KEY = "signals-key"
NAME = "dart-jax-demo"
ABORT = ("Traceback", "terminate called", "FATAL", "Aborted", "core dumped")


@pytest.mark.extended
def test_ui_streams_need_the_login_and_one_request_past_the_limit_gets_a_503():
    with live_server("--demo", "tiny", "--api-key", KEY, "--slots", "1", "--max-length", "64", "--warmup", "none",
                     "--max-connections", "3") as (url, proc):
        with httpx.Client(timeout=60) as anonymous:
            with anonymous.stream("GET", url + "/ui/gradio_api/heartbeat/anyone") as r:
                assert r.status_code == 401 and json.loads(r.read())["error"]["code"] == "login_required"
            assert anonymous.get(url + "/ui/").status_code == 200  # the login form
        with httpx.Client(timeout=60) as user:
            assert user.post(url + "/ui/login", data={"username": "me", "password": KEY}).status_code == 200
            streams = [user.stream("GET", f"{url}/ui/gradio_api/heartbeat/me{i}") for i in range(3)]
            opened = [s.__enter__() for s in streams]
            assert [r.status_code for r in opened] == [200] * 3
            busy = httpx.get(url + "/health", timeout=60)
            assert busy.status_code == 503, busy.text
            error = busy.json()["error"]
            assert error["code"] == "server_busy" and "3 requests" in error["message"] and "--max-connections" in error["message"]
            streams[0].__exit__(None, None, None)
            deadline = time.monotonic() + 30
            while (r := httpx.get(url + "/health", timeout=60)).status_code == 503 and time.monotonic() < deadline:
                time.sleep(0.1)  # the closed stream's place frees once the server sees the disconnect
            assert r.status_code == 200
            for s in streams[1:]:
                s.__exit__(None, None, None)


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_ctrl_c_during_the_warm_up_stops_the_process_cleanly(tmp_path):
    """SIGINT while the warm-up compiles (no compilation cache: it compiles for seconds): the
    process says so and exits with 130 within seconds, without a traceback or an abort."""
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dart_jax.serve", "--demo", "tiny", "--port", str(free_port()),
                                 "--max-length", "64", "--warmup", "full", "--no-compile-cache"], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        deadline = time.monotonic() + 240
        while "warm-up 1 of" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert "warm-up 1 of" in log.read_text(), log.read_text()[-2000:]
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        exited = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert not any(word in text for word in ABORT), text[-2000:]
    assert "SIGINT before serving: ending the warm-up" in text and "dart_jax: stopped" in text, text[-2000:]
    assert "serving on" not in text
    assert exited < 20, exited


def _stream(url: str, lines: list, started: threading.Event) -> None:
    # seconds of decoding on any machine: many sampled steps over the largest offered tree, past EOS
    body = {"model": NAME, "messages": [{"role": "user", "content": "Write a poem about rivers."}], "max_tokens": 900,
            "ignore_eos": True, "stream": True, "temperature": 5.0, "seed": 7, "tree_size": 96}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                started.set()


def _ended_with_the_shutdown_error(lines: list[str]) -> None:
    assert lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "server_shutting_down" and "shutting down" in error["message"], lines[-3:]


@contextlib.contextmanager
def streaming_server(shutdown_timeout: str):
    """A live tiny-demo server with one request streaming: (its process, the stream's lines so far,
    the thread reading them)."""
    with live_server("--demo", "tiny", "--no-ui", "--slots", "1", "--max-length", "1024", "--warmup", "none",
                     "--shutdown-timeout", shutdown_timeout) as (url, proc):
        lines, started = [], threading.Event()
        reader = threading.Thread(target=_stream, args=(url, lines, started))
        reader.start()
        assert started.wait(300)
        yield proc, lines, reader


@pytest.mark.extended
def test_sighup_ends_streams_with_the_error_event_and_done_as_sigterm_does():
    with streaming_server("1") as (proc, lines, reader):
        proc.send_signal(signal.SIGHUP)
        reader.join(60)
        _ended_with_the_shutdown_error(lines)
        assert proc.wait(60) == 0
        text = Path(proc.log).read_text()
        assert "stopping (SIGHUP)" in text and "dart_jax: stopped" in text, text[-2000:]
        assert not any(word in text for word in ABORT), text[-2000:]


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_ctrl_c_says_what_it_waits_for_and_a_second_one_ends_the_request_now():
    """--shutdown-timeout 300: the first Ctrl-C says that one request runs and how to end it; the
    second ends it at once (an error event and [DONE]) and the process exits within seconds."""
    with streaming_server("300") as (proc, lines, reader):
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while "press Ctrl-C again" not in Path(proc.log).read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = Path(proc.log).read_text()
        assert "stopping (SIGINT): 1 running request gets up to 300 s to finish" in text, text[-2000:]
        assert proc.poll() is None and reader.is_alive()  # it waits for the request
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        reader.join(60)
        assert time.monotonic() - signalled < 10
        _ended_with_the_shutdown_error(lines)
        assert proc.wait(60) == 0
        assert time.monotonic() - signalled < 20
        text = Path(proc.log).read_text()
        assert "ending 1 running request with the shutdown error" in text and "dart_jax: stopped" in text, text[-2000:]
        assert not any(word in text for word in ABORT), text[-2000:]
