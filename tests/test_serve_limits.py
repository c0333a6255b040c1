"""Issue 42 against a live `python -m dart_jax.serve` (the embedded tiny model, the chat UI on,
an API key): a huge body to the UI's login (which anyone may post to) is refused without the
server's memory growing, and SIGTERM ends the streams in flight with an error event and [DONE]
and the process soon after, also while the scheduler thread is busy compiling."""
from __future__ import annotations

import signal
import threading
import time

import httpx
import openai
import psutil
import pytest

from serving import live_server

KEY = "limits-key"
NAME = "dart-jax-demo"
MB = 1 << 20


def test_a_300_mb_body_to_the_ui_login_is_a_413_and_memory_stays_flat():
    with live_server("--demo", "tiny", "--api-key", KEY, "--slots", "1", "--max-length", "256",
                     "--warmup", "none") as (url, proc):
        server = psutil.Process(proc.pid)
        before, peak, done = server.memory_info().rss, [0], threading.Event()

        def watch():  # the server's resident memory while the body streams in
            while not done.is_set():
                peak[0] = max(peak[0], server.memory_info().rss)
                time.sleep(0.02)
        watcher = threading.Thread(target=watch)
        watcher.start()
        boundary = "dartjax"
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\nme\r\n--{boundary}\r\n"
                f"Content-Disposition: form-data; name=\"password\"\r\n\r\n").encode()

        def body():  # 300 MB, made as it is sent (the test holds one MiB of it)
            yield head
            chunk = b"x" * MB
            for _ in range(300):
                yield chunk
            yield f"\r\n--{boundary}--\r\n".encode()
        try:
            r = httpx.post(url + "/ui/login", content=body(), timeout=300,
                           headers={"content-type": f"multipart/form-data; boundary={boundary}"})
        finally:
            done.set()
            watcher.join()
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text[:300]
        grew = (max(peak[0], server.memory_info().rss) - before) / MB
        assert grew < 100, f"the server's memory grew by {grew:.0f} MB for a refused body"
        assert httpx.get(url + "/health", timeout=60).json() == {"status": "ok"}  # no counters without the key


@pytest.mark.extended
def test_sigterm_ends_streams_in_flight_with_an_error_event_and_done_and_the_process_exits():
    """--shutdown-timeout 1: the streams (both asking a draft tree size the server has not compiled
    yet, so that the scheduler thread is busy compiling when the signal comes) end with the
    shutdown error and [DONE] soon after the second, and the process exits a few seconds later."""
    timeout = 1.0
    with live_server("--demo", "tiny", "--api-key", KEY, "--slots", "2", "--max-length", "1024", "--warmup", "quick",
                     "--shutdown-timeout", str(timeout)) as (url, proc):
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        kw = dict(model=NAME, messages=[{"role": "user", "content": "Write a poem about rivers."}], max_tokens=900,
                  temperature=5.0, seed=7, stream=True, extra_body={"tree_size": 96})
        raw_lines: list[str] = []
        parsed: list = []
        started = [threading.Event(), threading.Event()]

        def raw():  # the official client's raw lines: the error event, then [DONE]
            with client.chat.completions.with_streaming_response.create(**kw) as response:
                for line in response.iter_lines():
                    if line:
                        raw_lines.append(line)
                        started[0].set()

        def typed():  # the official client's chunks: the error event is raised as an APIError
            try:
                for chunk in client.chat.completions.create(**kw):
                    parsed.append(chunk)
                    started[1].set()
            except openai.APIError as e:
                parsed.append(e)
        readers = [threading.Thread(target=raw), threading.Thread(target=typed)]
        for t in readers:
            t.start()
        for event in started:
            assert event.wait(300)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in readers:
            t.join(300)
        ended = time.monotonic() - signalled
        assert raw_lines[-1] == "data: [DONE]", raw_lines[-3:]
        assert '"code": "server_shutting_down"' in raw_lines[-2] and "shutting down" in raw_lines[-2], raw_lines[-3:]
        assert isinstance(parsed[-1], openai.APIError) and "shutting down" in parsed[-1].message, parsed[-1:]
        # the cut comes at --shutdown-timeout; uvicorn's deadline (2 s later) would cut the connections bare
        assert ended < timeout + 2, ended
        assert proc.wait(30) == 0
        exited = time.monotonic() - signalled
        log = proc.log.read_text()
        assert "Traceback" not in log and "dart_jax: stopped" in log, log[-2000:]
        assert exited < timeout + 15, exited
