"""Issue 27, the server's side: bad text and huge bodies get OpenAI-shaped 4xx errors before any
tokenising, the API key guards the UI and the API's description too (and takes `bearer` in any
case), tree sizes are bounded, a base without a chat template still serves, and a shutdown ends
running streams with an error event and [DONE].

The web layer is driven in process over a stand-in scheduler (it never calls JAX: requests that
must be refused never reach it); the scheduler's own bound and interrupt run on the embedded tiny
model without decoding a step."""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from dart_jax.api.model import DEMO_DIR, DartModel
from dart_jax.serve import __main__ as serve_cli
from dart_jax.serve.app import body_limit, check_bearer, create_app
from dart_jax.serve.scheduler import TREE_SIZES, Event, Job, Scheduler, thread_sink

from serving import free_port

KEY = "s3cret-key"
NAME = "dart-jax-demo"
MAX_LENGTH = 384


@pytest.fixture(scope="module")
def model():
    """The embedded tiny model (the scheduler's tests build its pools)."""
    return DartModel.demo("tiny", keep=16)


class TextModel:
    """What the web layer uses of a DartModel, over the tiny demo's real tokenizer, encoding as
    DartModel.encode does (chat template, then the tokenizer)."""

    def __init__(self):
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(str(DEMO_DIR / "base"))

    def encode(self, prompt, chat=True, enable_thinking=None):
        if not isinstance(prompt, str) or chat:
            items = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
            prompt = self.tokenizer.apply_chat_template(items, tokenize=False, add_generation_prompt=True, **switch)
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @property
    def has_thinking_switch(self):
        return "enable_thinking" in str(self.tokenizer.chat_template)


@pytest.fixture(scope="module")
def text_model():
    return TextModel()


class StandIn:
    """What the web layer uses of a Scheduler. A job's events come from a thread: `steps` pieces of
    token ids, one every `pause` seconds, then 'length' (or, after `interrupt`, 'shutdown')."""

    def __init__(self, model, steps: int = 3, pause: float = 0.0):
        self.model, self.max_length, self.slots = model, MAX_LENGTH, 2
        self.methods = {"dart": "DART", "ar": "plain"}
        self.default_tree_size, self.tree_sizes = 16, [8, 16]
        self.steps, self.pause, self.jobs, self.encoded = steps, pause, [], 0
        self._interrupted = threading.Event()

    def submit(self, ids, settings, sink, *, method="dart", tree_size=None, stop_at_eos=True):
        job = Job(len(self.jobs) + 1, method, list(ids), settings, tree_size or 16, sink, stop_at_eos=stop_at_eos)
        self.jobs.append(job)
        threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return job

    def _run(self, job):
        for i in range(self.steps):
            if self._interrupted.wait(self.pause):
                job.finish_reason = "shutdown"
                job.sink(Event([], 0, True, "shutdown", serve_cli.SHUTDOWN_MESSAGE))
                return
            job.token_ids.append(5 + i)
            job.sink(Event([5 + i], 1))
        job.finish_reason = "length"
        job.sink(Event([], 1, True, "length"))

    def interrupt(self, message):
        self._interrupted.set()

    def cancel(self, job):
        pass

    def load(self):
        return {"open": 0, "finished": {}}

    def health(self):
        return None


def client_for(text_model, api_key=KEY, **kw) -> tuple[TestClient, StandIn]:
    scheduler = StandIn(text_model, **kw)
    return TestClient(create_app(scheduler, model_name=NAME, api_key=api_key), raise_server_exceptions=False), scheduler


def openai_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_text_that_is_not_unicode_is_a_400_naming_the_field(text_model):
    client, scheduler = client_for(text_model)
    chat = {"model": NAME, "max_tokens": 2}
    lone = '{"model": "%s", "messages": [{"role": "user", "content": "caf\\ud800e"}]}' % NAME
    r = client.post("/v1/chat/completions", content=lone, headers={**AUTH, "content-type": "application/json"})
    err = openai_error(r, 400)
    assert err["param"] == "messages" and "U+D800" in err["message"]
    parts = {**chat, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc9c"}]}]}
    r = client.post("/v1/chat/completions", content=json.dumps(parts), headers={**AUTH, "content-type": "application/json"})
    assert "not valid Unicode" in openai_error(r, 400)["message"]
    for prompt in ("x\ud83dy", ["\udfff"]):
        body = json.dumps({"model": NAME, "prompt": prompt})
        r = client.post("/v1/completions", content=body, headers={**AUTH, "content-type": "application/json"})
        assert openai_error(r, 400)["param"] == "prompt"
    body = json.dumps({**chat, "messages": [{"role": "user", "content": "hi"}], "stop": ["\ud800"]})
    r = client.post("/v1/chat/completions", content=body, headers={**AUTH, "content-type": "application/json"})
    assert openai_error(r, 400)["param"] == "stop"
    bad_bytes = b'{"model": "%s", "prompt": "caf\xe9 \x9c"}' % NAME.encode()
    r = client.post("/v1/completions", content=bad_bytes, headers={**AUTH, "content-type": "application/json"})
    openai_error(r, 400)
    assert scheduler.jobs == []


def test_a_body_over_the_limit_is_a_413_before_it_is_parsed_or_tokenised(text_model, monkeypatch):
    client, scheduler = client_for(text_model)
    calls = []
    monkeypatch.setattr(type(text_model), "encode", lambda self, *a, **k: calls.append(1) or [1, 2])
    limit = body_limit(MAX_LENGTH)
    assert limit >= 1 << 20
    huge = json.dumps({"model": NAME, "prompt": "word " * (limit // 5 + 10)}).encode()
    assert len(huge) > limit
    r = client.post("/v1/completions", content=huge, headers={**AUTH, "content-type": "application/json"})
    assert openai_error(r, 413)["code"] == "request_too_large"

    def chunked():  # no Content-Length: counted as it arrives
        for i in range(0, len(huge), 1 << 16):
            yield huge[i:i + (1 << 16)]
    r = client.post("/v1/chat/completions", content=chunked(), headers={**AUTH, "content-type": "application/json"})
    assert openai_error(r, 413)["code"] == "request_too_large"
    assert calls == [] and scheduler.jobs == []
    # a body under the limit goes through
    r = client.post("/v1/completions", json={"model": NAME, "prompt": "hello", "max_tokens": 3}, headers=AUTH)
    assert r.status_code == 200 and calls == [1], r.text


def test_the_key_guards_docs_and_openapi_and_bearer_is_case_insensitive(text_model):
    client, _ = client_for(text_model)
    for path in ("/docs", "/openapi.json", "/v1/models"):
        assert openai_error(client.get(path), 401)["code"] == "invalid_api_key"
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert client.get(path, headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200, (path, scheme)
        assert client.get(path, headers={"Authorization": f"Bearer {KEY}x"}).status_code == 401
    assert "/v1/chat/completions" in client.get("/openapi.json", headers=AUTH).json()["paths"]
    assert check_bearer(f"  bEaReR   {KEY} ", KEY) and not check_bearer(f"Basic {KEY}", KEY) and not check_bearer(KEY, KEY)
    open_client, _ = client_for(text_model, api_key=None)
    assert open_client.get("/docs").status_code == 200 and open_client.get("/openapi.json").status_code == 200


def test_the_key_guards_the_ui_and_its_gradio_endpoints(text_model):
    from dart_jax.serve.ui import mount

    scheduler = StandIn(text_model)
    app = mount(create_app(scheduler, model_name=NAME, api_key=KEY), scheduler, title="t", api_key=KEY)
    client = TestClient(app, raise_server_exceptions=False)
    # without logging in: no config (the page's components and endpoints), no prediction, no queue
    config = client.get("/ui/config")
    assert config.status_code in (401, 403), config.text[:300]
    for path in ("/ui/gradio_api/queue/join", "/ui/gradio_api/run/predict", "/ui/gradio_api/call/respond"):
        r = client.post(path, json={"data": ["hello", [], "dart", False, "ar", 0, 1, 0, 8, 16], "fn_index": 0,
                                    "session_hash": "x"})
        assert r.status_code in (401, 403, 404), (path, r.status_code, r.text[:300])
    assert client.post("/ui/login", data={"username": "me", "password": "wrong"}).status_code in (400, 401)
    assert client.post("/ui/login", data={"username": "me", "password": KEY}).status_code == 200
    assert client.get("/ui/config").status_code == 200
    assert scheduler.jobs == []


def test_without_a_key_the_ui_needs_no_login(text_model):
    from dart_jax.serve.ui import mount

    scheduler = StandIn(text_model)
    client = TestClient(mount(create_app(scheduler, model_name=NAME), scheduler, title="t"))
    assert client.get("/ui/config").status_code == 200


def test_tree_sizes_are_bounded_to_a_few_offered_ones(model):
    """Only the offered sizes are served; any other is refused naming them (issue 50: 3 ran as 7,
    61 as 60, while the README promised a 400)."""
    scheduler = Scheduler(model, slots=1, max_length=64)
    try:
        assert scheduler.default_tree_size == 16 and scheduler.tree_sizes == sorted({16, *TREE_SIZES})
        ids = model.encode("hi", chat=False)
        from dart_jax.decoding.settings import GenerationSettings
        settings = GenerationSettings(max_new_tokens=4, max_length=64)
        served = []
        for n in range(1, 257):
            try:
                served.append(scheduler.check(ids, settings, "dart", n))
            except ValueError as e:
                assert f"tree_size {n} is not offered" in str(e) and "8, 16, 32, 60, 96" in str(e), str(e)
        assert served == scheduler.tree_sizes
        assert scheduler.check(ids, settings, "dart", None) == 16
        for n in (3, 40, 77, 200):
            with pytest.raises(ValueError, match="not offered"):
                scheduler.submit(ids, settings, lambda e: None, tree_size=n)
        for n in scheduler.tree_sizes:
            scheduler.submit(ids, settings, lambda e: None, tree_size=n)
        scheduler._drain(block=False)  # admits them (no step runs: nothing compiles)
        assert {key for key in scheduler._pools if key[0] == "dart"} == {("dart", s) for s in scheduler.tree_sizes}
    finally:
        scheduler._fail_all(None)
        for pool in scheduler._pools.values():
            pool.close()


def test_interrupt_ends_every_open_job_with_a_shutdown_error_and_refuses_new_ones(model):
    scheduler = Scheduler(model, slots=1, max_length=64)
    try:
        from dart_jax.decoding.settings import GenerationSettings
        settings = GenerationSettings(max_new_tokens=4, max_length=64)
        ids = model.encode("hi", chat=False)
        queues = []
        for _ in range(2):  # one takes the slot, one waits
            q, sink = thread_sink()
            scheduler.submit(ids, settings, sink)
            queues.append(q)
        scheduler._drain(block=False)
        scheduler.interrupt("going down")
        scheduler._drain(block=False)
        for q in queues:
            event = q.get_nowait()
            assert event.done and event.finish_reason == "shutdown" and event.error == "going down"
        with pytest.raises(RuntimeError, match="shutting down"):
            scheduler.submit(ids, settings, lambda e: None)
        assert scheduler.load()["open"] == 0
    finally:
        for pool in scheduler._pools.values():
            pool.close()


@pytest.mark.extended
def test_a_job_that_ends_inside_a_device_call_keeps_every_step(model):
    """An engine with device_steps moves a job by several steps per call: the scheduler streams
    each step and finishes the job at its last one, with the tokens the host's steps give."""
    from dart_jax.decoding.settings import GenerationSettings
    device_model = DartModel.demo("tiny", keep=16, device_steps=4)
    ids = model.encode("hi", chat=False)
    runs = []
    for m in (model, device_model):
        scheduler = Scheduler(m, slots=2, max_length=64)
        events = {n: [] for n in (9, 14)}
        try:
            for n, sink in events.items():  # budgets that end inside a device call
                scheduler.submit(ids, GenerationSettings(max_new_tokens=n, max_length=64), sink.append)
            scheduler._drain(block=False)
            while any(p.active for p in scheduler._pools.values()):
                scheduler._step_pools()
        finally:
            for pool in scheduler._pools.values():
                pool.close()
        runs.append({n: ([t for e in evs for t in e.ids], [e.done for e in evs], evs[-1].finish_reason)
                     for n, evs in events.items()})
    assert runs[0] == runs[1]
    for n, (tokens, done, reason) in runs[1].items():
        assert len(tokens) == n and done[-1] and not any(done[:-1]) and reason == "length"


def test_the_server_starts_for_a_base_without_a_chat_template(model, monkeypatch):
    monkeypatch.setattr(model.tokenizer, "chat_template", None)
    with pytest.raises(ValueError, match="no chat template"):
        model.encode(serve_cli.DEMO_PROMPT)
    assert serve_cli.warmup_ids(model) == model.encode(serve_cli.DEMO_PROMPT, chat=False)


def test_shutdown_ends_running_streams_with_an_error_event_and_done(text_model):
    """A real uvicorn server (in a thread) stopped while two answers stream: each stream ends with
    an OpenAI error event and [DONE] before the graceful deadline, and a plain request gets a 503."""
    import uvicorn

    scheduler = StandIn(text_model, steps=10_000, pause=0.02)
    app = create_app(scheduler, model_name=NAME)
    port = free_port()
    server = serve_cli._Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                              timeout_graceful_shutdown=2.0))
    server.scheduler = scheduler
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    lines: dict[int, list[str]] = {0: [], 1: []}
    plain: list[httpx.Response] = []

    def stream(i):
        body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line:
                    lines[i].append(line)

    def complete():
        plain.append(httpx.post(url + "/v1/completions", json={"model": NAME, "prompt": "hi"}, timeout=30))
    readers = [threading.Thread(target=stream, args=(i,)) for i in (0, 1)] + [threading.Thread(target=complete)]
    for t in readers:
        t.start()
    while (len(lines[0]) < 3 or len(lines[1]) < 3 or len(scheduler.jobs) < 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    server.should_exit = True  # what SIGTERM does
    for t in readers:
        t.join(30)
    thread.join(30)
    assert time.monotonic() - started < 5
    for got in lines.values():
        assert got[-1] == "data: [DONE]", got[-3:]
        error = json.loads(got[-2].removeprefix("data: "))["error"]
        assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    assert plain and openai_error(plain[0], 503)["code"] == "server_shutting_down"


def test_shutdown_cut_runs_before_uvicorn_cancels(text_model):
    """The cut is timed inside the graceful deadline, also for a deadline of 0."""
    import uvicorn

    for timeout in (0.0, 0.4):
        scheduler = StandIn(text_model)
        server = serve_cli._Server(uvicorn.Config(create_app(scheduler, model_name=NAME), timeout_graceful_shutdown=timeout))
        server.scheduler = scheduler
        server.servers, server.server_state.tasks = [], set()

        async def run():
            server.lifespan = type("L", (), {"shutdown": staticmethod(lambda: asyncio.sleep(0))})()
            hold = asyncio.create_task(asyncio.sleep(10))
            server.server_state.tasks.add(hold)
            hold.add_done_callback(server.server_state.tasks.discard)
            await server.shutdown()
            return hold.cancelled()
        assert asyncio.run(run())
        assert scheduler._interrupted.is_set()


# ---------------------------------------------------------------- issue 42: one request cannot take the server down

INT32_LIMIT = "2147483647"  # 2**31 - 1, written out: the largest top_k / token count the device's int32 holds


def test_numbers_beyond_their_device_type_are_a_400_naming_the_limit(text_model):
    client, scheduler = client_for(text_model)
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [({"top_k": 2**31}, "top_k", INT32_LIMIT), ({"top_k": 3_000_000_000}, "top_k", INT32_LIMIT),
             ({"max_tokens": 2**31}, "max_tokens", INT32_LIMIT),
             ({"max_completion_tokens": 2**40}, "max_completion_tokens", INT32_LIMIT),
             ({"temperature": 1e308}, "temperature", "10"), ({"temperature": 10.5}, "temperature", "10"),
             ({"top_p": 1e308}, "top_p", "1"), ({"seed": 2**63}, "seed", "9223372036854775807"),
             ({"tree_size": 2**40}, "tree_size", "")]
    for change, param, limit in cases:
        r = client.post("/v1/chat/completions", json={**chat, **change}, headers=AUTH)
        err = openai_error(r, 400)
        assert err["param"] == param and limit in err["message"], (change, err)
    # JSON numbers too large for a double are infinity, which no field takes
    r = client.post("/v1/chat/completions", content=json.dumps(chat)[:-1] + ', "temperature": 1e400}',
                    headers={**AUTH, "content-type": "application/json"})
    assert openai_error(r, 400)["param"] == "temperature"
    r = client.post("/v1/completions", json={"model": NAME, "prompt": "hi", "top_k": 2**31}, headers=AUTH)
    assert INT32_LIMIT in openai_error(r, 400)["message"]
    assert scheduler.jobs == []
    # the limits themselves are accepted
    r = client.post("/v1/chat/completions", json={**chat, "top_k": 2**31 - 1, "temperature": 10}, headers=AUTH)
    assert r.status_code == 200, r.text


def test_the_scheduler_bounds_what_the_ui_sends_too(model):
    """The UI builds its settings itself (no HTTP schema on the way): the scheduler's check refuses them."""
    from dart_jax.decoding.settings import GenerationSettings
    scheduler = Scheduler(model, slots=1, max_length=64)
    try:
        ids = model.encode("hi", chat=False)
        for kw, limit in (({"top_k": 2**31}, INT32_LIMIT), ({"max_new_tokens": 2**31}, INT32_LIMIT),
                          ({"temperature": 1e308}, "10")):
            with pytest.raises(ValueError, match=limit):
                scheduler.submit(ids, GenerationSettings(max_length=64, **kw), lambda e: None)
        assert scheduler.load()["open"] == 0
    finally:
        for pool in scheduler._pools.values():
            pool.close()


def _run_to_end(scheduler: Scheduler) -> None:
    scheduler._drain(block=False)
    while any(p.active for p in scheduler._pools.values()):
        scheduler._step_pools()
        scheduler._drain(block=False)


def _tokens(events: list) -> list[int]:
    return [t for e in events for t in e.ids]


@pytest.mark.extended  # a second look (the default run's 10 minutes): .ci/run runs it after
def test_an_exception_in_one_jobs_admission_fails_that_job_alone(model):
    """A job whose admission into the pool raises (injected here) ends with an error event; the job
    already running in the same pool finishes with the greedy answer, and the next job is served."""
    from dart_jax.decoding.settings import GenerationSettings
    settings = GenerationSettings(max_new_tokens=24, max_length=64)
    prompt, poison = "Tell me about verification.", "hello"
    want = model.generate(prompt, max_new_tokens=24, max_length=64).token_ids
    scheduler = Scheduler(model, slots=2, max_length=64)
    pool = scheduler._pools[("dart", scheduler.default_tree_size)]
    poison_ids = model.encode(poison)
    admit = pool._admit

    def failing_admit(free):
        if any(list(r.prompt_ids) == poison_ids for r in pool.waiting):
            raise OverflowError("injected: Python integer out of bounds for int32")
        return admit(free)
    pool._admit = failing_admit
    try:
        good, bad, later = [], [], []
        scheduler.submit(model.encode(prompt), settings, good.append)
        scheduler._drain(block=False)
        scheduler._step_pools()  # the good job joins and takes its first token
        assert len(good) == 1 and not good[0].done
        scheduler.submit(poison_ids, settings, bad.append)
        _run_to_end(scheduler)
        assert len(bad) == 1 and bad[0].done and bad[0].finish_reason == "error"
        assert "OverflowError" in bad[0].error and "injected" in bad[0].error
        assert good[-1].done and good[-1].error is None and _tokens(good) == want
        scheduler.submit(model.encode(prompt), settings, later.append)
        _run_to_end(scheduler)
        assert _tokens(later) == want and scheduler.load()["open"] == 0
        assert scheduler.finished["error"] == 1
    finally:
        for p in scheduler._pools.values():
            p.close()


def test_an_exception_in_a_pools_step_spares_the_other_pools_and_the_pool_is_made_again(model):
    """A step that raises while it advances every busy job of a pool (injected) ends those jobs;
    a job of another pool (plain decoding) finishes with its greedy answer, and a later job of the
    failed method gets a fresh pool and the right answer."""
    from dart_jax.decoding.settings import GenerationSettings
    settings = GenerationSettings(max_new_tokens=20, max_length=64)
    prompt = "What is speculative decoding?"
    ids = model.encode(prompt)
    want = model.generate(prompt, max_new_tokens=20, max_length=64).token_ids
    scheduler = Scheduler(model, slots=2, max_length=64)
    key = ("dart", scheduler.default_tree_size)
    broken = scheduler._pools[key]
    broken._advance = lambda: (_ for _ in ()).throw(RuntimeError("injected device failure"))
    try:
        dart, plain, later = [], [], []
        scheduler.submit(ids, settings, dart.append)
        scheduler.submit(ids, settings, plain.append, method="ar")
        _run_to_end(scheduler)
        assert dart[-1].done and dart[-1].finish_reason == "error" and "injected device failure" in dart[-1].error
        assert plain[-1].done and plain[-1].error is None and _tokens(plain) == want
        assert scheduler._pools.get(key) is not broken
        scheduler.submit(ids, settings, later.append)
        _run_to_end(scheduler)
        assert later[-1].error is None and _tokens(later) == want
        assert scheduler.load()["open"] == 0 and scheduler.health() == "the scheduler is not running."
    finally:
        for p in scheduler._pools.values():
            p.close()


def test_a_dead_scheduler_is_unhealthy_and_refuses_requests_at_once(model):
    """Should the scheduler thread end by an error anyway (injected outside any step), /health says
    503 and a request gets a 503 naming the failure instead of waiting forever."""
    scheduler = Scheduler(model, slots=1, max_length=64)

    def broken(block):
        raise RuntimeError("injected scheduler bug")
    scheduler._drain = broken
    scheduler.start()
    scheduler._thread.join(30)
    assert not scheduler._thread.is_alive()
    client = TestClient(create_app(scheduler, model_name=NAME, api_key=KEY), raise_server_exceptions=False)
    r = client.get("/health", headers=AUTH)
    assert r.status_code == 503 and r.json()["status"] == "unhealthy"
    assert "injected scheduler bug" in r.json()["error"]
    r = client.post("/v1/chat/completions", headers=AUTH,
                    json={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    err = openai_error(r, 503)
    assert "injected scheduler bug" in err["message"] and "restart" in err["message"]


def test_interrupt_reaches_a_job_while_the_scheduler_thread_is_busy(model):
    """The server stops while the scheduler thread is inside a long step (a compilation, held here
    until released): the job hears of the shutdown at once, not when the step ends."""
    from dart_jax.decoding.settings import GenerationSettings
    scheduler = Scheduler(model, slots=1, max_length=64)
    pool = scheduler._pools[("dart", scheduler.default_tree_size)]
    inside, release = threading.Event(), threading.Event()
    step = pool.step

    def held_step():
        inside.set()
        release.wait()
        return step()
    pool.step = held_step
    scheduler.start()
    try:
        q, sink = thread_sink()
        scheduler.submit(model.encode("hi", chat=False), GenerationSettings(max_new_tokens=8, max_length=64), sink)
        assert inside.wait(60)
        scheduler.interrupt("going down")
        event = q.get(timeout=5)  # the thread is still held inside its step
        assert not release.is_set() and event.done and event.finish_reason == "shutdown"
        assert event.error == "going down" and scheduler.load()["open"] == 0
    finally:
        release.set()
        scheduler.stop()
    assert scheduler.finished["shutdown"] == 1


# ---------------------------------------------------------------- issue 42: one body limit, nothing shown without the key

def _ui_client(text_model, api_key=KEY):
    from dart_jax.serve.ui import mount

    scheduler = StandIn(text_model)
    app = mount(create_app(scheduler, model_name=NAME, api_key=api_key), scheduler, title=f"dart_jax · {NAME}",
                api_key=api_key)
    return TestClient(app, raise_server_exceptions=False), scheduler


def test_every_route_that_takes_a_body_has_the_one_limit(text_model):
    """The UI's login (a multipart form, read before any key is checked) and any other route: a
    body declared or sent past the limit is a 413, counted as it arrives."""
    client, _ = _ui_client(text_model)
    limit = body_limit(MAX_LENGTH)
    boundary = "dartjaxboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\nme\r\n--{boundary}\r\n"
            f"Content-Disposition: form-data; name=\"password\"\r\n\r\n").encode()
    form = {"content-type": f"multipart/form-data; boundary={boundary}"}

    def streamed(size):  # no Content-Length: chunked, counted as it comes
        yield head
        for _ in range(size // (1 << 16)):
            yield b"x" * (1 << 16)
        yield f"\r\n--{boundary}--\r\n".encode()
    for path in ("/ui/login", "/v1/chat/completions"):  # routes that read the body
        r = client.post(path, content=streamed(4 * limit), headers={**form, **AUTH})
        assert openai_error(r, 413)["code"] == "request_too_large", path
    for path in ("/ui/login", "/ui/gradio_api/upload", "/no/such/route", "/health"):  # a declared length
        r = client.post(path, content=b"x" * (limit + 1), headers=form)
        assert openai_error(r, 413)["code"] == "request_too_large", path
    # a body within the limit reaches the route: the login still works
    assert client.post("/ui/login", data={"username": "me", "password": KEY}).status_code == 200


def test_without_the_key_nothing_tells_the_model_or_the_load(text_model):
    client, _ = _ui_client(text_model)
    for path in ("/health", "/", "/ui/manifest.json", "/ui/", "/ui"):
        r = client.get(path)
        assert r.status_code < 500 and NAME not in r.text, (path, r.text[:300])
    assert client.get("/ui/manifest.json").json()["name"] == "dart_jax"
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/health", headers=AUTH).json() == {"status": "ok", "jobs": {"open": 0, "finished": {}}}
    api_only = TestClient(create_app(StandIn(text_model), model_name=NAME, api_key=KEY))
    assert NAME not in api_only.get("/").text and api_only.get("/", headers=AUTH).json()["model"] == NAME
    # without a key set, everything is open: the counters and the name show
    open_client, _ = _ui_client(text_model, api_key=None)
    assert "jobs" in open_client.get("/health").json()
    assert NAME in open_client.get("/ui/manifest.json").json()["name"]


# ---------------------------------------------------------------- issue 50: what the server cannot honour, strict types

# each field that would change the answer, with a value that asks for something (→ a 400 naming
# the field) and its default (→ served): written out here, not read from the server's table
NOT_HONOURED = [("logit_bias", {"50256": -100}, {}), ("presence_penalty", 0.5, 0), ("frequency_penalty", -1.0, 0.0),
                ("repetition_penalty", 1.2, 1.0), ("min_tokens", 4, 0), ("guided_json", {"type": "object"}, None),
                ("top_logprobs", 2, None), ("tool_choice", "auto", "none"), ("functions", [{"name": "f"}], None),
                ("function_call", {"name": "f"}, "none"), ("parallel_tool_calls", False, True),
                ("modalities", ["audio"], ["text"]), ("prediction", {"type": "content", "content": "x"}, None),
                ("reasoning_effort", "low", None),
                # OpenAI's newer fields, and vLLM's sampling, prompt and chat template options
                ("audio", {"voice": "alloy", "format": "wav"}, None), ("verbosity", "low", "medium"),
                ("web_search_options", {}, None), ("use_beam_search", True, False), ("length_penalty", 0.5, 1.0),
                ("allowed_token_ids", [1, 2], None), ("bad_words", ["x"], []), ("logits_processors", ["p"], None),
                ("structured_outputs", {"json": {"type": "object"}}, None), ("include_stop_str_in_output", True, False),
                ("skip_special_tokens", False, True), ("add_special_tokens", True, False),
                ("truncate_prompt_tokens", 5, None), ("prompt_logprobs", 1, None), ("echo", True, False),
                ("add_generation_prompt", False, True), ("continue_final_message", True, False),
                ("chat_template", "{{ messages }}", None), ("documents", [{"text": "d"}], [])]


def test_fields_that_would_change_the_answer_are_refused_naming_them_and_their_defaults_pass(text_model):
    client, scheduler = client_for(text_model)
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for field, asked, default in NOT_HONOURED:
        err = openai_error(client.post("/v1/chat/completions", json={**chat, field: asked}, headers=AUTH), 400)
        assert err["param"] == field and field in err["message"] and "drop the field" in err["message"], err
        assert scheduler.jobs == [], field
        r = client.post("/v1/chat/completions", json={**chat, field: default}, headers=AUTH)
        assert r.status_code == 200, (field, default, r.text)
        scheduler.jobs.clear()
    # False is not the number 0
    assert openai_error(client.post("/v1/chat/completions", json={**chat, "presence_penalty": False}, headers=AUTH),
                        400)["param"] == "presence_penalty"
    calls = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    err = openai_error(client.post("/v1/chat/completions", headers=AUTH,
                                   json={**chat, "messages": [chat["messages"][0], calls, chat["messages"][0]]}), 400)
    assert err["param"] == "messages" and "tool_calls" in err["message"]
    old_form = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}
    err = openai_error(client.post("/v1/chat/completions", headers=AUTH,
                                   json={**chat, "messages": [chat["messages"][0], old_form, chat["messages"][0]]}), 400)
    assert err["param"] == "messages" and "function_call" in err["message"]
    completion = {"model": NAME, "prompt": "hi", "max_tokens": 2}
    for field, asked in (("logit_bias", {"5": 1}), ("presence_penalty", 1), ("echo", "no"), ("min_tokens", 1),
                         ("prompt_embeds", "AAAA"), ("use_beam_search", True), ("add_special_tokens", True),
                         ("truncate_prompt_tokens", 1)):
        r = client.post("/v1/completions", json={**completion, field: asked}, headers=AUTH)
        assert openai_error(r, 400)["param"] == field, field
    assert scheduler.jobs == []


def test_chat_template_kwargs_take_qwen3s_thinking_switch_alone(text_model):
    """vLLM's chat_template_kwargs reach the chat template for enable_thinking (the prompt the
    scheduler gets is the template's with the switch); any other key, a switch that is not a
    boolean, or thinking on a template without the switch, is a 400 naming the field."""
    client, scheduler = client_for(text_model)
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for kwargs in ({"enable_thinking": True}, {"enable_thinking": "no"}, {"tools": []}, ["enable_thinking"]):
        err = openai_error(client.post("/v1/chat/completions", json={**chat, "chat_template_kwargs": kwargs},
                                       headers=AUTH), 400)
        assert err["param"] == "chat_template_kwargs", (kwargs, err)
    assert scheduler.jobs == []  # the demo's template has no switch: off is what it does anyway
    for kwargs in ({"enable_thinking": False}, {}, None):
        assert client.post("/v1/chat/completions", json={**chat, "chat_template_kwargs": kwargs},
                           headers=AUTH).status_code == 200, kwargs
    switched = TextModel()
    switched.tokenizer.chat_template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                                        "{% if enable_thinking is defined and not enable_thinking %}[no thinking]"
                                        "{% endif %}")
    client, scheduler = client_for(switched)
    for thinking, text in ((False, "hi[no thinking]"), (True, "hi"), (None, "hi")):
        body = {**chat, **({} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}})}
        assert client.post("/v1/chat/completions", json=body, headers=AUTH).status_code == 200
        assert scheduler.jobs[-1].prompt_ids == switched.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_types_are_strict_on_every_field(text_model):
    client, scheduler = client_for(text_model)
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [({"n": True}, "n"), ({"n": "1"}, "n"), ({"stream": "yes"}, "stream"), ({"stream": 1}, "stream"),
             ({"temperature": True}, "temperature"), ({"temperature": "0.5"}, "temperature"), ({"top_p": "1"}, "top_p"),
             ({"tree_size": True}, "tree_size"), ({"tree_size": "16"}, "tree_size"),
             ({"stream": True, "stream_options": {"include_usage": "maybe"}}, "stream_options"),
             ({"ignore_eos": "yes"}, "ignore_eos"), ({"stop_token_ids": ["5"]}, "stop_token_ids"),
             ({"stop_token_ids": [True]}, "stop_token_ids")]
    for change, param in cases:
        assert openai_error(client.post("/v1/chat/completions", json={**chat, **change}, headers=AUTH),
                            400)["param"] == param, change
    assert scheduler.jobs == []
    # what the types take is still served: an integer temperature, a boolean include_usage
    r = client.post("/v1/chat/completions", headers=AUTH, json={**chat, "temperature": 1, "n": 1, "stream": True,
                                                                "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and '"usage"' in r.text, r.text[-300:]


def test_a_json_body_without_the_json_content_type_is_refused_naming_the_header(text_model):
    client, scheduler = client_for(text_model)
    body = json.dumps({"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
        headers = {**AUTH, **({"content-type": content_type} if content_type else {})}
        message = openai_error(client.post("/v1/chat/completions", content=body, headers=headers), 400)["message"]
        assert "Content-Type: application/json" in message and (content_type or "no Content-Type") in message, message
    assert scheduler.jobs == []
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = client.post("/v1/chat/completions", content=body, headers={**AUTH, "content-type": content_type})
        assert r.status_code == 200, (content_type, r.text)


def test_the_cheap_vllm_fields_reach_the_scheduler(text_model):
    """max_completion_tokens on /v1/completions too (it once ran 8 tokens for 2), ignore_eos (the
    job decodes past EOS); stop_token_ids ids outside the vocabulary are refused."""
    client, scheduler = client_for(text_model, steps=6)
    r = client.post("/v1/completions", headers=AUTH,
                    json={"model": NAME, "prompt": "hi", "max_completion_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200, r.text
    job = scheduler.jobs[-1]
    assert job.settings.max_new_tokens == 2 and job.stop_at_eos is False
    r = client.post("/v1/chat/completions", headers=AUTH,
                    json={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert scheduler.jobs[-1].settings.max_new_tokens == 3 and scheduler.jobs[-1].stop_at_eos is True


def test_the_connection_limit_answers_a_clear_503_and_frees_its_place():
    from dart_jax.serve.app import ConnectionLimit

    release, inside = asyncio.Event(), []

    async def slow(scope, receive, send):  # a request held open (a stream) until released
        inside.append(1)
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    async def run():
        limited = ConnectionLimit(slow, limit=2)
        transport = httpx.ASGITransport(app=limited)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            held = [asyncio.create_task(client.get("/")) for _ in range(2)]
            while len(inside) < 2:
                await asyncio.sleep(0.01)
            refused = await client.get("/")
            release.set()
            done = [await t for t in held]
            after = await client.get("/")
        return refused, done, after
    refused, done, after = asyncio.run(run())
    err = openai_error(refused, 503)
    assert err["code"] == "server_busy" and "--max-connections" in err["message"] and "2 requests" in err["message"]
    assert refused.headers["retry-after"] == "1"
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200


def test_every_ui_route_but_the_login_form_and_static_files_needs_the_login(text_model):
    """Every route Gradio adds (read from its app, path parameters filled in) answers 401 without a
    login, except the page (the login form then), the login and the static files; Gradio guards
    only some itself (its heartbeat streamed to anyone)."""
    from fastapi.routing import APIRoute
    from starlette.routing import Mount

    client, scheduler = _ui_client(text_model)
    gradio_app = next(r for r in client.app.routes if isinstance(r, Mount) and r.path == "/ui").app.app
    public = {"/", "/login", "/login/", "/manifest.json", "/favicon.ico", "/robots.txt", "/theme.css",
              "/gradio_api/theme.css"}
    def api_routes(routes):  # FastAPI keeps an included router (Gradio's /gradio_api) as one entry
        for route in routes:
            if hasattr(route, "original_router"):
                yield from api_routes(route.original_router.routes)
            elif isinstance(route, APIRoute):
                yield route
    checked = 0
    for route in api_routes(gradio_app.routes):
        path = re.sub(r"\{[^}]*\}", "x", route.path)
        static = path.startswith(("/assets/", "/static/", "/svelte/", "/pwa_icon"))
        for method in route.methods - {"HEAD"}:
            r = client.request(method, "/ui" + path, json={})
            if path in public or static:
                assert r.status_code != 401, (method, path)
            else:
                assert r.status_code == 401 and r.json()["error"]["code"] == "login_required", (method, path, r.text[:200])
                checked += 1
    assert checked > 40, checked  # the heartbeat, queue, upload, file, stream, monitoring, ... routes
    assert client.post("/ui/login", data={"username": "me", "password": KEY}).status_code == 200
    with client.stream("GET", "/ui/gradio_api/heartbeat/me") as r:
        assert r.status_code == 200 and next(r.iter_lines()) == "data: ALIVE"
    assert scheduler.jobs == []


def test_the_ui_mounts_at_the_smallest_max_length(text_model):
    """--max-length 16 (and 17), the documented minimum, once died in the answer-length slider."""
    from dart_jax.serve.ui import mount

    for length in (16, 17):
        scheduler = StandIn(text_model)
        scheduler.max_length = length
        client = TestClient(mount(create_app(scheduler, model_name=NAME), scheduler, title="t"))
        sliders = [c["props"] for c in client.get("/ui/config").json()["components"]
                   if c.get("props", {}).get("elem_id") == "dj-max-new"]
        assert sliders and sliders[0]["minimum"] < sliders[0]["maximum"], sliders


def test_serve_options_refuse_what_cannot_work_before_jax_loads(capsys, monkeypatch):
    from dart_jax.serve.options import parse_args

    for argv, words in ((["--shutdown-timeout", "nan"], "finite"), (["--shutdown-timeout", "inf"], "finite"),
                        (["--shutdown-timeout", "-1"], ">= 0"), (["--max-length", "15"], ">= 16"),
                        (["--model-name", ""], "model id is empty"), (["--model-name", "  "], "model id is empty"),
                        (["--max-connections", "0"], ">= 1")):
        with pytest.raises(SystemExit) as exit_:
            parse_args(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and argv[0] in err and words in err, (argv, err)
    assert parse_args(["--max-length", "16", "--shutdown-timeout", "0"]).max_length == 16
    monkeypatch.setenv("DART_JAX_API_KEY", "key-from-the-environment")
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert "key-from-the-environment" not in help_text  # --help shows every other default
    entries = re.split(r"\n  (?=-)", help_text)  # one per option
    for option, default in (("--warmup", "full"), ("--beam-width", "20"), ("--topk", "25"),
                            ("--max-connections", "256"), ("--shutdown-timeout", "10.0")):
        entry = " ".join(next(e for e in entries if e.startswith(option + " ")).split())
        assert f"(default: {default})" in entry, (option, entry)


def test_the_ui_takes_a_null_tree_size_and_refuses_bad_values_in_one_log_line(model, caplog, capfd):
    """Through Gradio's own API, as any client may post: a null tree size (a cleared dropdown) is
    the server's default, no longer int(None); each refused value is shown to the user and logged
    in one line, without the traceback Gradio's checks printed."""
    from dart_jax.serve.ui import mount

    scheduler = Scheduler(model, slots=2, max_length=64).start()
    try:
        with TestClient(mount(create_app(scheduler, model_name=NAME), scheduler, title="t")) as client:
            def send(change: dict) -> str:
                data = ["hello", [], "dart", False, "ar", 0, 1, 0, 8, None]
                for index, value in change.items():
                    data[index] = value
                event = client.post("/ui/gradio_api/call/respond", json={"data": data}).json()["event_id"]
                lines = client.get(f"/ui/gradio_api/call/respond/{event}").text.splitlines()
                return json.loads(next(line for line in reversed(lines) if line.startswith("data: "))[6:])[-1]
            stats = send({})
            assert "DART" in stats and "8 tokens" in stats and "error" not in stats, stats
            capfd.readouterr()
            caplog.clear()
            refused = {5: 99, 6: 0, 7: 2.5, 8: None, 9: 3, 2: "magic", 3: "yes", 0: 5}
            for index, value in refused.items():
                assert send({index: value}).startswith("error: "), (index, value)
            records = [r for r in caplog.records if r.name == "dart_jax.serve"]
            assert len(records) == len(refused) and all("refused" in r.getMessage() for r in records)
            assert "Traceback" not in capfd.readouterr().err
    finally:
        scheduler.stop()


def test_a_ui_call_with_the_wrong_number_of_values_is_refused_naming_them(text_model, caplog, capfd):
    """Through Gradio's own API, as any client may post: too few values once reached Gradio's check
    (a traceback in the log, its components' reprs to the client), too many were silently dropped.
    Each is refused in one log line, naming the values the UI's form sends. (Its values with the
    conversation state first, null, are Gradio's other form of a call: served.)"""
    client, scheduler = _ui_client(text_model, api_key=None)
    # the Send form's values as the browser's form lists them (method "dart", then the settings)
    form = ["Message", "Method", "Side by side", "Compare with", "Temperature (0 = greedy)", "Top-p",
            "Top-k (0 = off)", "Max new tokens", "Draft tree size (DART)"]
    values = ["hello", "dart", False, "ar", 0, 1, 0, 8, None]
    with client:
        def call(endpoint: str, data) -> dict:
            event = client.post(f"/ui/gradio_api/call/{endpoint}", json={"data": data}).json()["event_id"]
            lines = client.get(f"/ui/gradio_api/call/{endpoint}/{event}").text.splitlines()
            assert "event: error" in lines, lines
            return json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        capfd.readouterr()
        caplog.clear()
        for data, got in ((values[:1], 1), ([], 0), ([None, *values, 5], 11), (values * 2, 18)):
            error = call("respond", data)["error"]
            assert error == f"the UI's /respond takes 9 values, one per input in this order: {', '.join(form)}; " \
                            f"got {got}.", error
        assert call("regenerate", [[]])["error"] == f"the UI's /regenerate takes 8 values, one per input in this " \
                                                    f"order: {', '.join(form[1:])}; got 1."
        assert call("stop", [1, 2])["error"] == "the UI's /stop takes no values; got 2."
        assert call("clear", ["x"])["error"] == "the UI's /clear takes no values; got 1."
        records = [r.getMessage() for r in caplog.records if r.name == "dart_jax.serve"]
        assert len(records) == 7 and all(m.startswith("the chat UI refused a request: the UI's /") for m in records)
        assert "Traceback" not in capfd.readouterr().err
    assert scheduler.jobs == []
